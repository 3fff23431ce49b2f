//! Rewriting a conversation with tools for a chat template that knows nothing of them.

use serde_json::Value;
use serde_json::value::RawValue;

use super::call_json::compact_json;
use super::format::ToolCallFormat;
use crate::chat::{Content, Message};

/// Prepares `messages` for rendering. A template that supports tools gets them unchanged
/// (it renders `tools` and the tool fields itself). Otherwise the tools and the call format
/// go into the system message, assistant tool calls become assistant text in `format`, and
/// tool results become user turns wrapped in `<tool_response>`, so a template that only
/// knows system/user/assistant renders the conversation. With no `tools`, only the
/// messages are rewritten.
pub fn prepare_messages(
    format: ToolCallFormat,
    messages: &[Message],
    tools: &[Value],
    template_supports_tools: bool,
) -> Vec<Message> {
    if template_supports_tools {
        return messages.to_vec();
    }
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let mut last_was_tool = false;
    for m in messages {
        let is_tool = m.role == "tool";
        if is_tool {
            let response = format!("<tool_response>\n{}\n</tool_response>", m.content.text());
            match out.last_mut() {
                // Consecutive results share one user turn, so templates that insist on
                // alternating roles still accept the conversation.
                Some(prev) if last_was_tool => {
                    let text = format!("{}\n{response}", prev.content.text());
                    prev.content = Content::Text(text);
                }
                _ => out.push(Message::new("user", response)),
            }
        } else if m.role == "assistant" && m.tool_calls.is_some() {
            let calls = calls_text(format, m.tool_calls.as_deref().unwrap_or_default());
            let content = m.content.text();
            let text = match (content.trim().is_empty(), calls.is_empty()) {
                (true, _) => calls,
                (false, true) => content,
                (false, false) => format!("{content}\n{calls}"),
            };
            out.push(Message::new("assistant", text));
        } else {
            out.push(m.clone());
        }
        last_was_tool = is_tool;
    }
    if !tools.is_empty() {
        let prompt = tools_system_prompt(format, tools);
        match out.first_mut() {
            // The caller's instructions first, then the tools, as Qwen's template orders them.
            Some(first) if first.role == "system" => {
                let existing = first.content.text();
                let text = if existing.trim().is_empty() {
                    prompt
                } else {
                    format!("{existing}\n\n{prompt}")
                };
                *first = Message::new("system", text);
            }
            _ => out.insert(0, Message::new("system", prompt)),
        }
    }
    out
}

/// The system prompt text that describes `tools` and how to call them in `format`. Kept
/// short: the default model has 135M parameters.
pub fn tools_system_prompt(format: ToolCallFormat, tools: &[Value]) -> String {
    let listed: Vec<String> = tools
        .iter()
        // The function object carries all the model needs; the `type` wrapper is noise.
        .map(|t| t.get("function").unwrap_or(t).to_string())
        .collect();
    let how = match format {
        ToolCallFormat::SmolLm => {
            "To call functions, reply with only a list of calls inside <tool_call></tool_call>, \
             for example:\n<tool_call>[{\"name\": \"function_name\", \"arguments\": \
             {\"argument\": \"value\"}}]</tool_call>"
        }
        ToolCallFormat::Hermes => {
            "To call a function, write one block like this for each call:\n<tool_call>\n\
             {\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>"
        }
        ToolCallFormat::Llama3Json => {
            "To call a function, reply with only a JSON object like this one, separating \
             several calls with \";\":\n{\"name\": \"function_name\", \"parameters\": \
             {\"argument\": \"value\"}}"
        }
        ToolCallFormat::Mistral => {
            "To call functions, reply with only [TOOL_CALLS] and a JSON list of calls, for \
             example:\n[TOOL_CALLS][{\"name\": \"function_name\", \"arguments\": \
             {\"argument\": \"value\"}}]"
        }
        ToolCallFormat::Harmony => {
            "To call a function, write a message like this one:\n<|channel|>commentary \
             to=functions.function_name <|constrain|>json<|message|>{\"argument\": \
             \"value\"}<|call|>"
        }
    };
    format!(
        "You can call these functions, described in JSON:\n<tools>\n{}\n</tools>\n\n{how}\n\
         If no function fits the request, answer in plain text.",
        listed.join("\n")
    )
}

/// Earlier assistant tool calls as the model would have written them.
fn calls_text(format: ToolCallFormat, calls: &[Value]) -> String {
    let args_key = match format {
        ToolCallFormat::Llama3Json => "parameters",
        _ => "arguments",
    };
    let objects: Vec<String> = calls
        .iter()
        .filter_map(call_parts)
        .map(|(name, args)| {
            format!(
                "{{\"name\": {}, \"{args_key}\": {args}}}",
                Value::from(name)
            )
        })
        .collect();
    if objects.is_empty() {
        return String::new();
    }
    match format {
        ToolCallFormat::Hermes => objects
            .iter()
            .map(|o| format!("<tool_call>\n{o}\n</tool_call>"))
            .collect::<Vec<_>>()
            .join("\n"),
        ToolCallFormat::SmolLm => format!("<tool_call>[{}]</tool_call>", objects.join(", ")),
        ToolCallFormat::Llama3Json => objects.join("; "),
        ToolCallFormat::Mistral => format!("[TOOL_CALLS][{}]", objects.join(", ")),
        ToolCallFormat::Harmony => calls
            .iter()
            .filter_map(call_parts)
            .map(|(name, args)| {
                format!(
                    "<|channel|>commentary to=functions.{name} <|constrain|>json\
                     <|message|>{args}<|call|>"
                )
            })
            .collect(),
    }
}

/// Name and arguments JSON of an OpenAI tool call (`{"function": {"name", "arguments"}}`,
/// `arguments` a JSON string); a bare `{"name", "arguments"}` is read too.
fn call_parts(call: &Value) -> Option<(&str, String)> {
    let function = call.get("function").unwrap_or(call);
    let name = function.get("name")?.as_str()?;
    let args = match function.get("arguments") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => match serde_json::from_str::<&RawValue>(s) {
            Ok(raw) => compact_json(raw.get()),
            // Not JSON: keep it, as a JSON string, rather than drop what the client sent.
            Err(_) => Value::from(s.as_str()).to_string(),
        },
        Some(other) => other.to_string(),
    };
    Some((name, args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(v: Value) -> Vec<Message> {
        serde_json::from_value(v).unwrap()
    }

    fn texts(m: &[Message]) -> Vec<(String, String)> {
        m.iter()
            .map(|m| (m.role.clone(), m.content.text()))
            .collect()
    }

    fn pair(role: &str, text: &str) -> (String, String) {
        (role.to_owned(), text.to_owned())
    }

    #[test]
    fn templates_with_tool_support_get_messages_unchanged() {
        let m = messages(json!([{"role": "tool", "tool_call_id": "1", "content": "x"}]));
        let tools = [json!({"type": "function", "function": {"name": "f"}})];
        assert_eq!(
            prepare_messages(ToolCallFormat::Hermes, &m, &tools, true),
            m
        );
    }

    #[test]
    fn tools_go_after_an_existing_system_prompt_or_into_a_new_one() {
        let tools = [json!({"type": "function", "function": {"name": "f", "parameters": {}}})];
        let prompt = tools_system_prompt(ToolCallFormat::SmolLm, &tools);
        assert!(
            prompt.contains("<tools>\n{\"name\":\"f\",\"parameters\":{}}\n</tools>"),
            "{prompt}"
        );
        let m = messages(
            json!([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "hi"}]),
        );
        let out = prepare_messages(ToolCallFormat::SmolLm, &m, &tools, false);
        assert_eq!(
            texts(&out),
            [
                pair("system", &format!("Be kind.\n\n{prompt}")),
                pair("user", "hi")
            ]
        );
        let out = prepare_messages(ToolCallFormat::SmolLm, &m[1..], &tools, false);
        assert_eq!(texts(&out), [pair("system", &prompt), pair("user", "hi")]);
    }

    #[test]
    fn each_format_explains_its_own_syntax() {
        for (format, example) in [
            (ToolCallFormat::SmolLm, "<tool_call>[{\"name\""),
            (ToolCallFormat::Hermes, "<tool_call>\n{\"name\""),
            (ToolCallFormat::Llama3Json, "\"parameters\": {"),
            (ToolCallFormat::Mistral, "[TOOL_CALLS][{\"name\""),
            (ToolCallFormat::Harmony, "to=functions.function_name"),
        ] {
            let prompt = tools_system_prompt(format, &[json!({"name": "f"})]);
            assert!(prompt.contains(example), "{format}: {prompt}");
        }
    }

    #[test]
    fn history_is_rewritten_without_tools() {
        let m = messages(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "a", "arguments": "{\"x\": 1}"}},
                {"id": "2", "type": "function", "function": {"name": "b", "arguments": "oops"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "r1"},
            {"role": "tool", "tool_call_id": "2", "content": "r2"},
            {"role": "assistant", "content": "done"}
        ]));
        let out = prepare_messages(ToolCallFormat::Hermes, &m, &[], false);
        assert_eq!(
            texts(&out),
            [
                pair("user", "q"),
                pair(
                    "assistant",
                    "Checking.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\":1}}\n</tool_call>\n\
                     <tool_call>\n{\"name\": \"b\", \"arguments\": \"oops\"}\n</tool_call>"
                ),
                pair(
                    "user",
                    "<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
                ),
                pair("assistant", "done"),
            ]
        );
        assert!(
            out.iter()
                .all(|m| m.tool_calls.is_none() && m.tool_call_id.is_none())
        );
    }

    #[test]
    fn calls_in_each_format() {
        let calls = [
            json!({"function": {"name": "a", "arguments": "{}"}}),
            json!({"function": {"name": "b", "arguments": "{\"k\": \"v\"}"}}),
        ];
        assert_eq!(
            calls_text(ToolCallFormat::SmolLm, &calls),
            r#"<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k":"v"}}]</tool_call>"#
        );
        assert_eq!(
            calls_text(ToolCallFormat::Llama3Json, &calls),
            r#"{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k":"v"}}"#
        );
        assert_eq!(
            calls_text(ToolCallFormat::Mistral, &calls),
            r#"[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k":"v"}}]"#
        );
        assert_eq!(
            calls_text(ToolCallFormat::Harmony, &calls),
            "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|call|>\
             <|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"k\":\"v\"}<|call|>"
        );
    }
}
