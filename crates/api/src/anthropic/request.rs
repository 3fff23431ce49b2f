//! `POST /v1/messages` (and `/v1/messages/count_tokens`) request: read field by field with
//! Anthropic's rules (`max_tokens` required, `temperature` in [0, 1]), then turned into the chat
//! request `/v1/chat/completions` builds, so both run the same way.

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::fields::{Fields, Res, type_name};
use crate::openai::{ChatRequest, parse_chat_request};

#[derive(Debug, Clone, PartialEq)]
pub struct MessagesRequest {
    /// The chat request this one runs as (system prompt first).
    pub chat: ChatRequest,
    /// The stop sequences, to name the one that ended a reply.
    pub stop_sequences: Vec<String>,
    /// `thinking` was asked for (`enabled`; its `budget_tokens` go to the chat request).
    pub thinking: bool,
    /// Unknown top-level fields (sorted), ignored.
    pub unknown_fields: Vec<String>,
}

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "stream",
    "metadata",
    "thinking",
    "service_tier",
    "container",
    "mcp_servers",
];

fn verr(param: &str, msg: impl std::fmt::Display) -> ApiError {
    ApiError::validation(format!("{param} {msg}")).with_param(param)
}

fn no_media(param: &str, kind: &str) -> ApiError {
    ApiError::not_supported(format!(
        "{param}: {kind} blocks are not supported by this server yet (the served model reads text only): send text blocks"
    ))
    .with_param(param)
}

fn text_of_block(b: &Value, param: &str) -> Res<String> {
    match b.get("text") {
        Some(Value::String(t)) => Ok(t.clone()),
        _ => Err(verr(&format!("{param}.text"), "must be a string")),
    }
}

/// `system`: a string or text blocks.
fn system_text(v: &Value) -> Res<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let param = format!("system[{i}]");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => text_of_block(b, &param),
                    _ => Err(verr(&format!("{param}.type"), "must be \"text\"")),
                }
            })
            .collect::<Res<Vec<_>>>()
            .map(|t| t.join("\n")),
        other => Err(ApiError::invalid_body(format!(
            "system must be a string or an array of text blocks, got {}",
            type_name(other)
        ))
        .with_param("system")),
    }
}

/// A `tool_result`'s content: a string or text blocks.
fn result_text(v: Option<&Value>, param: &str) -> Res<String> {
    match v {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut out = Vec::new();
            for (k, b) in blocks.iter().enumerate() {
                let bp = format!("{param}[{k}]");
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => out.push(text_of_block(b, &bp)?),
                    Some("image") => return Err(no_media(&bp, "image")),
                    _ => return Err(verr(&format!("{bp}.type"), "must be \"text\"")),
                }
            }
            Ok(out.join("\n"))
        }
        Some(other) => Err(ApiError::invalid_body(format!(
            "{param} must be a string or an array of text blocks, got {}",
            type_name(other)
        ))
        .with_param(param)),
    }
}

/// One Anthropic message as chat messages: text joins one message; an assistant's `tool_use`
/// blocks are its `tool_calls`; a user's `tool_result` blocks are tool messages (before the
/// text said with them).
fn chat_messages(i: usize, m: &Value, media: bool, out: &mut Vec<Value>) -> Res<()> {
    let param = format!("messages[{i}]");
    let Some(o) = m.as_object() else {
        return Err(ApiError::invalid_body(format!(
            "{param} must be an object, got {}",
            type_name(m)
        ))
        .with_param(param));
    };
    let f = Fields::new(o, &param);
    let role = f
        .str("role")?
        .ok_or_else(|| verr(&param, "needs a \"role\""))?;
    if !matches!(role, "user" | "assistant") {
        return Err(verr(
            &format!("{param}.role"),
            format!("must be \"user\" or \"assistant\", got {role:?}"),
        ));
    }
    let blocks = match f.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        Some(v) => return Err(f.type_err("content", "a string or an array of blocks", v)),
        None => return Err(verr(&param, "needs \"content\"")),
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    // With images: the text and image blocks in order, as chat parts.
    let mut parts = Vec::new();
    let mut images = 0;
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{param}.content[{j}]");
        let Some(bo) = b.as_object() else {
            return Err(verr(
                &bp,
                format!("must be an object, got {}", type_name(b)),
            ));
        };
        let bf = Fields::new(bo, &bp);
        match bf.str("type")? {
            Some("text") => {
                let t = text_of_block(b, &bp)?;
                parts.push(json!({"type": "text", "text": t}));
                text.push(t);
            }
            Some("image") if media && role == "user" => {
                images += 1;
                let url = image_source(bf.get("source"), &format!("{bp}.source"))?;
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some("tool_use") if role == "assistant" => {
                let id = bf.str("id")?.ok_or_else(|| verr(&bp, "needs an \"id\""))?;
                let name = bf
                    .str("name")?
                    .ok_or_else(|| verr(&bp, "needs a \"name\""))?;
                let input = bf.object("input")?.cloned().unwrap_or_default();
                calls.push(json!({"id": id, "type": "function", "function": {
                    "name": name, "arguments": Value::Object(input).to_string()}}));
            }
            Some("tool_result") if role == "user" => {
                let id = bf
                    .str("tool_use_id")?
                    .ok_or_else(|| verr(&bp, "needs a \"tool_use_id\""))?;
                bf.bool("is_error")?;
                let content = result_text(bf.get("content"), &format!("{bp}.content"))?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            Some(kind @ ("tool_use" | "tool_result")) => {
                return Err(verr(
                    &format!("{bp}.type"),
                    format!(
                        "{kind:?} blocks belong in {} messages",
                        if kind == "tool_use" {
                            "assistant"
                        } else {
                            "user"
                        }
                    ),
                ));
            }
            // Earlier thinking: the served model has none to continue.
            Some("thinking" | "redacted_thinking") => {}
            Some("image") => return Err(no_media(&bp, "image")),
            Some("document") => return Err(no_media(&bp, "document")),
            other => {
                return Err(verr(
                    &format!("{bp}.type"),
                    format!(
                        "must be \"text\", \"tool_use\" or \"tool_result\", got {}",
                        other.map_or("nothing".into(), |s| format!("{s:?}"))
                    ),
                ));
            }
        }
    }
    if !calls.is_empty() {
        let content = (!text.is_empty()).then(|| text.join("\n"));
        out.push(json!({"role": role, "content": content, "tool_calls": calls}));
    } else if images > 0 {
        out.push(json!({"role": role, "content": parts}));
    } else if !text.is_empty() {
        out.push(json!({"role": role, "content": text.join("\n")}));
    }
    Ok(())
}

/// An image block's `source` as a URL: `base64` data as a `data:` URL, or a `url`.
fn image_source(v: Option<&Value>, param: &str) -> Res<String> {
    let src = v
        .and_then(Value::as_object)
        .ok_or_else(|| verr(param, "must be an object with a \"type\""))?;
    let field = |k: &str| src.get(k).and_then(Value::as_str);
    match field("type") {
        Some("base64") => {
            let (Some(mime), Some(data)) = (field("media_type"), field("data")) else {
                return Err(verr(
                    param,
                    "of type \"base64\" needs \"media_type\" and \"data\"",
                ));
            };
            Ok(format!("data:{mime};base64,{data}"))
        }
        Some("url") => field("url")
            .map(str::to_string)
            .ok_or_else(|| verr(param, "of type \"url\" needs a \"url\"")),
        _ => Err(verr(
            &format!("{param}.type"),
            "must be \"base64\" or \"url\" (files are not stored by this server)",
        )),
    }
}

fn chat_tools(v: &Value) -> Res<Value> {
    let Value::Array(items) = v else {
        return Err(ApiError::invalid_body(format!(
            "tools must be an array, got {}",
            type_name(v)
        ))
        .with_param("tools"));
    };
    let mut out = Vec::new();
    for (i, t) in items.iter().enumerate() {
        let param = format!("tools[{i}]");
        let Some(o) = t.as_object() else {
            return Err(verr(
                &param,
                format!("must be an object, got {}", type_name(t)),
            ));
        };
        match o.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(verr(
                    &format!("{param}.type"),
                    format!("must be \"custom\" (this server runs no server tools), got {other:?}"),
                ));
            }
        }
        let mut func = Map::new();
        for (from, to) in [
            ("name", "name"),
            ("description", "description"),
            ("input_schema", "parameters"),
        ] {
            if let Some(v) = o.get(from).filter(|v| !v.is_null()) {
                func.insert(to.into(), v.clone());
            }
        }
        if !func.contains_key("parameters") {
            return Err(verr(&param, "needs an \"input_schema\""));
        }
        out.push(json!({"type": "function", "function": func}));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` as chat's `tool_choice` and `parallel_tool_calls`.
fn chat_tool_choice(o: &Map<String, Value>) -> Res<(Value, bool)> {
    let f = Fields::new(o, "tool_choice");
    let parallel = !f.bool("disable_parallel_tool_use")?.unwrap_or(false);
    let choice = match f.str("type")? {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = f
                .str("name")?
                .ok_or_else(|| verr("tool_choice", "of type \"tool\" needs a \"name\""))?;
            json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(verr(
                "tool_choice.type",
                format!(
                    "must be \"auto\", \"any\", \"tool\" or \"none\", got {}",
                    other.map_or("nothing".into(), |s| format!("{s:?}"))
                ),
            ));
        }
    };
    Ok((choice, parallel))
}

/// Chat's parameter names in an error, in this API's names.
fn fix_names(s: &str) -> String {
    s.replace(".function", "")
        .replace(".parameters", ".input_schema")
        .replace("\"required\"", "\"any\"")
        .replace("stop", "stop_sequences")
}

fn rename(mut e: ApiError) -> ApiError {
    e.message = fix_names(&e.message);
    e.param = e.param.as_deref().map(fix_names);
    e
}

/// A Messages body; `count_only` reads it for `/v1/messages/count_tokens` (no `max_tokens`).
pub fn parse_messages_request(body: &Value, count_only: bool) -> Res<MessagesRequest> {
    parse_messages_request_with(body, count_only, false)
}

/// [`parse_messages_request`] for a served model that reads images (`media`): a user's image
/// blocks become chat `image_url` parts instead of a refusal.
pub fn parse_messages_request_with(
    body: &Value,
    count_only: bool,
    media: bool,
) -> Res<MessagesRequest> {
    let f = Fields::body(body)?;
    let mut chat = Map::new();
    let mut messages = Vec::new();
    if let Some(s) = f.get("system") {
        let text = system_text(s)?;
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    match f.get("messages") {
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(verr("messages", "must not be empty"));
        }
        Some(Value::Array(items)) => {
            for (i, m) in items.iter().enumerate() {
                chat_messages(i, m, media, &mut messages)?;
            }
        }
        Some(v) => return Err(f.type_err("messages", "an array of messages", v)),
        None => return Err(ApiError::invalid_body("messages is required").with_param("messages")),
    }
    if !messages.iter().any(|m| m["role"] != "system") {
        return Err(verr("messages", "hold no text: send a user message"));
    }
    chat.insert("messages".into(), Value::Array(messages));
    match f.int_in("max_tokens", 1, i64::from(u32::MAX), "a positive integer")? {
        Some(m) => {
            chat.insert("max_tokens".into(), json!(m));
        }
        None if count_only => {}
        None => {
            return Err(ApiError::invalid_body("max_tokens is required").with_param("max_tokens"));
        }
    }
    // Anthropic's temperature range; the default is 1.0 as chat's.
    if let Some(t) = f.f64("temperature")?
        && !(0.0..=1.0).contains(&t)
    {
        return Err(f.range_err("temperature", format!("must be in [0, 1], got {t}")));
    }
    for key in ["temperature", "top_p", "top_k", "stream", "model"] {
        if let Some(v) = f.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    let stop_sequences = f.strings("stop_sequences")?.unwrap_or_default();
    if f.get("stop_sequences").is_some_and(|v| !v.is_array()) {
        return Err(f.type_err(
            "stop_sequences",
            "an array of strings",
            f.get("stop_sequences").unwrap_or(&Value::Null),
        ));
    }
    if !stop_sequences.is_empty() {
        chat.insert("stop".into(), json!(stop_sequences));
    }
    if let Some(t) = f.get("tools") {
        chat.insert("tools".into(), chat_tools(t)?);
    }
    if let Some(c) = f.object("tool_choice")? {
        let (choice, parallel) = chat_tool_choice(c)?;
        chat.insert("tool_choice".into(), choice);
        chat.insert("parallel_tool_calls".into(), json!(parallel));
    }
    if let Some(m) = f.object("metadata")? {
        Fields::new(m, "metadata").str("user_id")?;
    }
    // `enabled` with `budget_tokens` is the chat route's thinking budget (for a model with a
    // reasoning parser; others have nothing to budget), `disabled` a budget of 0, no thinking.
    let thinking = match f.object("thinking")? {
        Some(t) => {
            let tf = Fields::new(t, "thinking");
            let budget = tf.int_in(
                "budget_tokens",
                0,
                i64::from(u32::MAX),
                "a non-negative integer",
            )?;
            match tf.str("type")? {
                Some("enabled") => {
                    if let Some(b) = budget {
                        chat.insert("thinking_token_budget".into(), json!(b));
                    }
                    true
                }
                Some("disabled") => {
                    chat.insert("thinking_token_budget".into(), json!(0));
                    false
                }
                None => false,
                Some(other) => {
                    return Err(verr(
                        "thinking.type",
                        format!("must be \"enabled\" or \"disabled\", got {other:?}"),
                    ));
                }
            }
        }
        None => false,
    };
    let chat_req = parse_chat_request(&Value::Object(chat)).map_err(rename)?;
    Ok(MessagesRequest {
        chat: chat_req,
        stop_sequences,
        thinking,
        unknown_fields: f.unknown(FIELDS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{Role, ToolChoice};

    #[test]
    fn blocks_become_chat_messages() {
        let r = parse_messages_request(
            &json!({
                "model": "m", "max_tokens": 32,
                "system": [{"type": "text", "text": "Be brief."}],
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {"type": "text", "text": "And now?"}]}
                ],
                "stop_sequences": ["\n\n"],
                "tools": [{"name": "w", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "thinking": {"type": "enabled", "budget_tokens": 1024}
            }),
            false,
        )
        .unwrap();
        let m = &r.chat.messages;
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::User
            ]
        );
        let call = &m[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(
            (call.id.as_str(), call.function.arguments.as_str()),
            ("toolu_1", r#"{"city":"Paris"}"#)
        );
        assert_eq!(m[2].text(), "Checking.");
        assert_eq!(r.chat.spec.max_new_tokens, 32);
        assert_eq!(r.chat.spec.stop_strings, ["\n\n"]);
        let t = r.chat.tools.as_ref().unwrap();
        assert_eq!(
            (t.choice.clone(), t.parallel),
            (ToolChoice::Required, false)
        );
        assert!(r.thinking);
    }

    #[test]
    fn count_tokens_needs_no_max_tokens() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert!(parse_messages_request(&body, true).is_ok());
        let e = parse_messages_request(&body, false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn bad_requests_name_the_field() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        for (extra, param) in [
            (json!({"messages": []}), "messages"),
            (
                json!({"messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}]}),
                "messages[0].content[0].type",
            ),
            (json!({"temperature": 1.5}), "temperature"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"stop_sequences": "x"}), "stop_sequences"),
            (
                json!({"tools": [{"name": "a b", "input_schema": {}}]}),
                "tools[0].name",
            ),
            (json!({"tools": [{"name": "a"}]}), "tools[0]"),
            (
                json!({"tools": [{"type": "bash_20250124", "name": "bash"}]}),
                "tools[0].type",
            ),
            (
                json!({"tool_choice": {"type": "sometimes"}}),
                "tool_choice.type",
            ),
            (json!({"thinking": {"type": "maybe"}}), "thinking.type"),
        ] {
            let mut body = json!({"max_tokens": 8, "messages": msgs});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let e = parse_messages_request(&body, false).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
    }
}
