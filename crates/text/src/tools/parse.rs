//! Tool calls in a complete model output.

use super::call_json::ParsedToolCall;
use super::format::ToolCallFormat;
use super::stream::{ToolStreamParser, ToolStreamPiece};

/// Splits a finished output into its content (the text outside the calls, trimmed) and its
/// tool calls. A call that is not well-formed stays in the content, so no text is lost.
pub fn parse_tool_calls(format: ToolCallFormat, text: &str) -> (String, Vec<ParsedToolCall>) {
    let mut parser = ToolStreamParser::new(format);
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            ToolStreamPiece::Content(text) => content.push_str(&text),
            ToolStreamPiece::Call(call) => calls.push(call),
        }
    }
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ToolCallFormat::*;

    fn call(name: &str, arguments: &str) -> ParsedToolCall {
        ParsedToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn parse(format: ToolCallFormat, text: &str) -> (String, Vec<ParsedToolCall>) {
        parse_tool_calls(format, text)
    }

    #[test]
    fn hermes_blocks() {
        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>\n";
        assert_eq!(
            parse(Hermes, out),
            (
                "Let me check.".into(),
                vec![
                    call("get_weather", r#"{"city":"Paris","unit":"c"}"#),
                    call("get_time", "{}")
                ]
            )
        );
    }

    #[test]
    fn smollm_list() {
        let out = "<tool_call>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {\"y\": \"two\"}}]</tool_call>";
        assert_eq!(
            parse(SmolLm, out),
            (
                String::new(),
                vec![call("a", r#"{"x":1}"#), call("b", r#"{"y":"two"}"#)]
            )
        );
        // The "no call" answer of SmolLM2's convention.
        assert_eq!(
            parse(SmolLm, "<tool_call>[]</tool_call>"),
            (String::new(), vec![])
        );
    }

    #[test]
    fn text_around_calls_is_content() {
        let out = "A <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> B ";
        assert_eq!(parse(Hermes, out), ("A  B".into(), vec![call("f", "{}")]));
    }

    #[test]
    fn malformed_or_absent_calls_leave_the_text() {
        for (format, text) in [
            (Hermes, "Just an answer, 2 < 3."),
            (
                Hermes,
                "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>",
            ),
            (Hermes, "<tool_call>{\"arguments\": {}}</tool_call>"),
            (SmolLm, "<tool_call>[{\"name\": \"f\", \"arguments\": {}}"),
            (Llama3Json, "{\"answer\": 42}"),
            (
                Llama3Json,
                "The call would be {\"name\": \"f\", \"parameters\": {}}",
            ),
            (Llama3Json, "<|python_tag|>print('hi')"),
            (Mistral, "[TOOL_CALLS] nothing here"),
            (Mistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}"),
        ] {
            assert_eq!(
                parse(format, text),
                (text.trim().to_owned(), vec![]),
                "{text}"
            );
        }
    }

    #[test]
    fn hermes_block_left_open_at_the_end_still_counts() {
        let out = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n";
        assert_eq!(
            parse(Hermes, out),
            (String::new(), vec![call("f", r#"{"a":1}"#)])
        );
    }

    #[test]
    fn one_bad_block_among_good_ones_stays_content() {
        let out = "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>oops</tool_call>";
        assert_eq!(
            parse(Hermes, out),
            ("<tool_call>oops</tool_call>".into(), vec![call("f", "{}")])
        );
    }

    #[test]
    fn llama3_json_calls() {
        assert_eq!(
            parse(
                Llama3Json,
                "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"
            ),
            (
                String::new(),
                vec![call("get_weather", r#"{"city":"Paris"}"#)]
            )
        );
        assert_eq!(
            parse(
                Llama3Json,
                "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": true}};"
            ),
            (
                String::new(),
                vec![call("a", "{}"), call("b", r#"{"k":true}"#)]
            )
        );
        assert_eq!(
            parse(
                Llama3Json,
                "Sure.<|python_tag|>{\"name\": \"a\", \"parameters\": {}} done"
            ),
            ("Sure.done".into(), vec![call("a", "{}")])
        );
    }

    #[test]
    fn mistral_calls() {
        assert_eq!(
            parse(
                Mistral,
                "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}, \"id\": \"abc123def\"}, {\"name\": \"b\", \"arguments\": {}}]"
            ),
            (
                String::new(),
                vec![call("a", r#"{"x":1}"#), call("b", "{}")]
            )
        );
        assert_eq!(
            parse(
                Mistral,
                "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time{}"
            ),
            (
                String::new(),
                vec![
                    call("get_weather", r#"{"city":"Paris"}"#),
                    call("get_time", "{}")
                ]
            )
        );
    }
}
