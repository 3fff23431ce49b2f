//! Reading `{"name": .., "arguments": {..}}` objects out of model output.

use serde::Deserialize;
use serde_json::value::RawValue;

/// One tool call found in model output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    pub name: String,
    /// The arguments object as compact JSON text, keys in the order the model wrote them
    /// (what OpenAI's `function.arguments` carries).
    pub arguments: String,
}

/// Borrowed so the arguments keep the model's key order (serde_json's map would sort them).
#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    /// Llama 3.1's name for the arguments.
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

/// The output of a grammar that forced a tool call: a JSON array of
/// `{"name", "arguments"}` objects, or one such object.
pub fn parse_forced_calls(json: &str) -> Result<Vec<ParsedToolCall>, String> {
    let text = json.trim();
    if text.starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(text)
            .map_err(|e| format!("tool calls are not valid JSON: {e}"))?;
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                call_from_object(item.get()).map_err(|e| format!("tool call {i}: {e}"))
            })
            .collect()
    } else {
        call_from_object(text).map(|call| vec![call])
    }
}

/// Like [`parse_forced_calls`], for free-form output where a failure means "not a call".
pub(crate) fn calls_from_json(text: &str) -> Option<Vec<ParsedToolCall>> {
    parse_forced_calls(text).ok()
}

/// One `{"name": "..", "arguments": {..}}` object. Also accepts `parameters` for the
/// arguments, arguments given as a string holding a JSON object, and no arguments at all.
pub(crate) fn call_from_object(text: &str) -> Result<ParsedToolCall, String> {
    let text = text.trim();
    // serde would also read a struct from an array; a call must be an object.
    if !text.starts_with('{') {
        return Err("a tool call must be a JSON object".to_owned());
    }
    let raw: RawCall = serde_json::from_str(text).map_err(|e| {
        format!("a tool call needs a string \"name\" and an object \"arguments\": {e}")
    })?;
    if raw.name.is_empty() {
        return Err("the tool call's \"name\" is empty".to_owned());
    }
    let arguments = match raw.arguments.or(raw.parameters) {
        None => "{}".to_owned(),
        Some(args) => arguments_text(args.get())?,
    };
    Ok(ParsedToolCall {
        name: raw.name,
        arguments,
    })
}

fn arguments_text(raw: &str) -> Result<String, String> {
    match raw.as_bytes().first() {
        Some(b'{') => Ok(compact_json(raw)),
        Some(b'n') => Ok("{}".to_owned()),
        // Some models write the arguments JSON-encoded, as OpenAI's API carries them.
        Some(b'"') => {
            let inner: String = serde_json::from_str(raw).map_err(|e| e.to_string())?;
            let inner = inner.trim();
            match serde_json::from_str::<&RawValue>(inner) {
                Ok(v) if v.get().starts_with('{') => Ok(compact_json(v.get())),
                _ if inner.is_empty() => Ok("{}".to_owned()),
                _ => Err("the tool call's \"arguments\" string is not a JSON object".to_owned()),
            }
        }
        _ => Err("the tool call's \"arguments\" must be an object".to_owned()),
    }
}

/// Valid JSON text without the whitespace between tokens.
pub(crate) fn compact_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

/// Where the JSON object or array that `text` starts with ends (byte index just past its
/// closing bracket), judged by bracket depth outside strings; `None` while it is still open.
/// Whether it is valid JSON is for the caller to check.
pub(crate) fn json_end(text: &str) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ if depth == 0 => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> ParsedToolCall {
        ParsedToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn forced_array_or_object() {
        assert_eq!(
            parse_forced_calls(
                r#"[{"name": "get_weather", "arguments": {"unit": "c", "city": "Paris"}},
                    {"name": "now", "arguments": {}}]"#
            ),
            Ok(vec![
                call("get_weather", r#"{"unit":"c","city":"Paris"}"#),
                call("now", "{}")
            ])
        );
        assert_eq!(
            parse_forced_calls(r#" {"name":"f","parameters":{"x": [1, 2, "a b"]}} "#),
            Ok(vec![call("f", r#"{"x":[1,2,"a b"]}"#)])
        );
        assert_eq!(parse_forced_calls("[]"), Ok(vec![]));
    }

    #[test]
    fn arguments_variants() {
        assert_eq!(
            call_from_object(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#),
            Ok(call("f", r#"{"a":1}"#))
        );
        assert_eq!(call_from_object(r#"{"name": "f"}"#), Ok(call("f", "{}")));
        assert_eq!(
            call_from_object(r#"{"name": "f", "arguments": null}"#),
            Ok(call("f", "{}"))
        );
        // `arguments` wins over `parameters`; unknown keys (Mistral's "id") are ignored.
        assert_eq!(
            call_from_object(
                r#"{"id": "x", "name": "f", "arguments": {"a": 1}, "parameters": {}}"#
            ),
            Ok(call("f", r#"{"a":1}"#))
        );
    }

    #[test]
    fn malformed_calls_say_why() {
        let err = parse_forced_calls(r#"{"arguments": {}}"#).unwrap_err();
        assert!(err.contains("\"name\""), "{err}");
        let err = parse_forced_calls(r#"[{"name": "f", "arguments": [1]}]"#).unwrap_err();
        assert!(
            err.starts_with("tool call 0:") && err.contains("object"),
            "{err}"
        );
        assert!(parse_forced_calls(r#"{"name": "", "arguments": {}}"#).is_err());
        assert!(parse_forced_calls(r#"["f", {}]"#).is_err());
        assert!(parse_forced_calls(r#"{"name": "f", "arguments": {"#).is_err());
        assert!(parse_forced_calls(r#"{"name": "f", "arguments": "not json"}"#).is_err());
    }

    #[test]
    fn compact_keeps_string_whitespace() {
        assert_eq!(
            compact_json("{ \"a b\" : [ 1 , \"x\\\" y\" ] }"),
            r#"{"a b":[1,"x\" y"]}"#
        );
    }

    #[test]
    fn json_end_follows_nesting_and_strings() {
        assert_eq!(json_end(r#"{"a": "}", "b": [1, {}]} tail"#), Some(24));
        assert_eq!(json_end(r#"[{"a": "\"]"}]x"#), Some(14));
        assert_eq!(json_end(r#"{"a": {"b": 1}"#), None);
        assert_eq!(json_end("{\"a\": \"\\"), None);
    }
}
