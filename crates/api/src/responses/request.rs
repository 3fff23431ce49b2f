//! `POST /v1/responses` request: read field by field, then turned into the chat request that
//! `/v1/chat/completions` builds (same sampling, tools, constraints), so the server runs both
//! the same way. The fields the response object echoes are kept in [`ResponseEcho`].

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::fields::{Fields, Res, type_name};
use crate::openai::{ChatRequest, parse_chat_request};

/// The request fields a response object repeats back (OpenAI's shape).
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseEcho {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: f64,
    pub top_p: f64,
    /// The tools as the client sent them (Responses shape).
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    /// `text` (`{"format": {...}}`), default `{"format": {"type": "text"}}`.
    pub text: Value,
    pub reasoning: Value,
    pub metadata: Value,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub user: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The chat request this one is run as. Its `messages` are this turn's input only; the
    /// server puts `instructions` and the stored conversation (`previous_response_id`) before them.
    pub chat: ChatRequest,
    pub echo: ResponseEcho,
    /// Unknown top-level fields (sorted), ignored.
    pub unknown_fields: Vec<String>,
}

const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "stream",
    "stream_options",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "include",
    "truncation",
    "background",
    "service_tier",
    "top_logprobs",
    "max_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
    "seed",
    "top_k",
];

fn verr(param: &str, msg: impl std::fmt::Display) -> ApiError {
    ApiError::validation(format!("{param} {msg}")).with_param(param)
}

/// Images and files wait for the vision work: refused with a 4xx that says so.
fn no_media(param: &str, kind: &str) -> ApiError {
    ApiError::not_supported(format!(
        "{param}: {kind} input is not supported by this server yet (the served model reads text only): send input_text"
    ))
    .with_param(param)
}

/// A message's content: a string, or parts of `input_text` / `output_text` (and `refusal`).
fn content(v: &Value, param: &str) -> Res<String> {
    match content_parts(v, param, false)? {
        Value::String(s) => Ok(s),
        _ => Err(no_media(param, "image")),
    }
}

/// A message's content as chat content: its text (parts joined with "\n"), or, when `media`
/// (the served model reads images) and some part is an `input_image`, the parts in order as
/// chat `text` and `image_url` parts.
fn content_parts(v: &Value, param: &str, media: bool) -> Res<Value> {
    match v {
        Value::String(s) => Ok(Value::String(s.clone())),
        Value::Array(parts) => {
            let mut text = Vec::new();
            let mut chat_parts = Vec::new();
            let mut images = 0;
            for (j, p) in parts.iter().enumerate() {
                let pp = format!("{param}[{j}]");
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                let mut push_text = |t: &str| {
                    text.push(t.to_string());
                    chat_parts.push(json!({"type": "text", "text": t}));
                };
                match kind {
                    "input_text" | "output_text" | "text" => match p.get("text") {
                        Some(Value::String(t)) => push_text(t),
                        _ => return Err(verr(&format!("{pp}.text"), "must be a string")),
                    },
                    "refusal" => match p.get("refusal") {
                        Some(Value::String(t)) => push_text(t),
                        _ => return Err(verr(&format!("{pp}.refusal"), "must be a string")),
                    },
                    "input_image" if media => match p.get("image_url") {
                        Some(Value::String(url)) => {
                            images += 1;
                            chat_parts
                                .push(json!({"type": "image_url", "image_url": {"url": url}}));
                        }
                        _ => {
                            return Err(verr(
                                &format!("{pp}.image_url"),
                                "must be a URL string (a data: URL, or http(s) where the server fetches); files are not stored by this server",
                            ));
                        }
                    },
                    "input_image" => return Err(no_media(&pp, "image")),
                    "input_file" => return Err(no_media(&pp, "file")),
                    "input_audio" => return Err(no_media(&pp, "audio")),
                    other => {
                        return Err(verr(
                            &format!("{pp}.type"),
                            format!("must be \"input_text\" or \"output_text\", got {other:?}"),
                        ));
                    }
                }
            }
            Ok(if images > 0 {
                Value::Array(chat_parts)
            } else {
                Value::String(text.join("\n"))
            })
        }
        other => Err(ApiError::invalid_body(format!(
            "{param} must be a string or an array of content parts, got {}",
            type_name(other)
        ))
        .with_param(param)),
    }
}

/// `input`: a string (one user message) or a list of items, as chat messages (JSON). Function
/// calls join the assistant message before them; their outputs become tool messages.
fn input_messages(v: &Value, media: bool) -> Res<Vec<Value>> {
    let items = match v {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) if items.is_empty() => {
            return Err(verr("input", "must not be empty"));
        }
        Value::Array(items) => items,
        other => {
            return Err(ApiError::invalid_body(format!(
                "input must be a string or an array of input items, got {}",
                type_name(other)
            ))
            .with_param("input"));
        }
    };
    let mut msgs: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let Some(o) = item.as_object() else {
            return Err(ApiError::invalid_body(format!(
                "{param} must be an object, got {}",
                type_name(item)
            ))
            .with_param(param));
        };
        let f = Fields::new(o, &param);
        let kind = f.str("type")?;
        match kind {
            None | Some("message") => {
                let role = f
                    .str("role")?
                    .ok_or_else(|| verr(&param, "needs a \"role\""))?;
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(verr(
                        &format!("{param}.role"),
                        format!(
                            "must be \"user\", \"assistant\", \"system\" or \"developer\", got {role:?}"
                        ),
                    ));
                }
                let text = match f.get("content") {
                    Some(c) => content_parts(c, &format!("{param}.content"), media)?,
                    None => return Err(verr(&param, "needs \"content\"")),
                };
                msgs.push(json!({"role": role, "content": text}));
            }
            Some("function_call") => {
                let call_id = f
                    .str("call_id")?
                    .ok_or_else(|| verr(&param, "needs a \"call_id\""))?;
                let name = f
                    .str("name")?
                    .ok_or_else(|| verr(&param, "needs a \"name\""))?;
                let arguments = f.str("arguments")?.unwrap_or("{}");
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}});
                // Several calls of one turn are one assistant message.
                match msgs.last_mut() {
                    Some(m) if m["role"] == "assistant" => match m.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => m["tool_calls"] = json!([call]),
                    },
                    _ => msgs
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            Some("function_call_output") => {
                let call_id = f
                    .str("call_id")?
                    .ok_or_else(|| verr(&param, "needs a \"call_id\""))?;
                let output = match f.get("output") {
                    Some(c) => content(c, &format!("{param}.output"))?,
                    None => return Err(verr(&param, "needs an \"output\"")),
                };
                msgs.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // A reasoning item of an earlier turn: the model has no reasoning to continue.
            Some("reasoning") => {}
            Some("input_image") => return Err(no_media(&param, "image")),
            Some(other) => {
                return Err(verr(
                    &format!("{param}.type"),
                    format!(
                        "must be \"message\", \"function_call\" or \"function_call_output\", got {other:?}"
                    ),
                ));
            }
        }
    }
    Ok(msgs)
}

/// Responses function tools (`{"type": "function", "name", "parameters", ...}`) as chat tools.
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
            Some("function") => {}
            other => {
                return Err(verr(
                    &format!("{param}.type"),
                    format!(
                        "must be \"function\" (this server runs no hosted tools), got {}",
                        other.map_or("nothing".into(), |s| format!("{s:?}"))
                    ),
                ));
            }
        }
        let mut func = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = o.get(key).filter(|v| !v.is_null()) {
                func.insert(key.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": func}));
    }
    Ok(Value::Array(out))
}

fn chat_tool_choice(v: &Value) -> Res<Value> {
    match v {
        Value::String(_) => Ok(v.clone()),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(verr("tool_choice", "of type \"function\" needs a \"name\"")),
            },
            other => Err(verr(
                "tool_choice.type",
                format!(
                    "must be \"function\", got {}",
                    other.map_or("nothing".into(), |s| format!("{s:?}"))
                ),
            )),
        },
        other => Err(ApiError::invalid_body(format!(
            "tool_choice must be a string or an object, got {}",
            type_name(other)
        ))
        .with_param("tool_choice")),
    }
}

/// `text.format` as chat's `response_format`.
fn response_format(text: &Map<String, Value>) -> Res<Option<Value>> {
    let f = Fields::new(text, "text");
    f.str("verbosity")?;
    let Some(format) = f.object("format")? else {
        return Ok(None);
    };
    let ff = Fields::new(format, "text.format");
    match ff.str("type")? {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = ff
                .object("schema")?
                .ok_or_else(|| verr("text.format", "of type \"json_schema\" needs a \"schema\""))?;
            let mut inner =
                json!({"name": ff.str("name")?.unwrap_or("response"), "schema": schema});
            if let Some(s) = ff.bool("strict")? {
                inner["strict"] = json!(s);
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": inner})))
        }
        other => Err(verr(
            "text.format.type",
            format!(
                "must be \"text\", \"json_object\" or \"json_schema\", got {}",
                other.map_or("nothing".into(), |s| format!("{s:?}"))
            ),
        )),
    }
}

/// Chat's parameter names in an error, in this API's names.
fn fix_names(s: &str) -> String {
    s.replace("tools[", "\u{0}")
        .replace(".function", "")
        .replace('\u{0}', "tools[")
        .replace("response_format.json_schema", "text.format")
        .replace("response_format", "text.format")
        .replace("max_tokens", "max_output_tokens")
        .replace("reasoning_effort", "reasoning.effort")
        .replace("messages", "input")
}

fn rename(mut e: ApiError) -> ApiError {
    e.message = fix_names(&e.message);
    e.param = e.param.as_deref().map(fix_names);
    e
}

pub fn parse_responses_request(body: &Value) -> Res<ResponsesRequest> {
    parse_responses_request_with(body, false)
}

/// [`parse_responses_request`] for a served model that reads images (`media`): `input_image`
/// parts become chat `image_url` parts instead of a refusal.
pub fn parse_responses_request_with(body: &Value, media: bool) -> Res<ResponsesRequest> {
    let f = Fields::body(body)?;
    let mut chat = Map::new();
    let input = f
        .get("input")
        .ok_or_else(|| ApiError::invalid_body("input is required").with_param("input"))?;
    let messages = input_messages(input, media)?;
    if messages.is_empty() {
        return Err(verr(
            "input",
            "holds no message or function call output: send some text",
        ));
    }
    chat.insert("messages".into(), Value::Array(messages));
    let instructions = f.str("instructions")?.map(str::to_string);
    let max_output_tokens = f.int_in(
        "max_output_tokens",
        1,
        i64::from(u32::MAX),
        "a positive integer",
    )?;
    if let Some(m) = max_output_tokens {
        chat.insert("max_tokens".into(), json!(m));
    }
    for key in [
        "temperature",
        "top_p",
        "stream",
        "seed",
        "top_k",
        "parallel_tool_calls",
    ] {
        if let Some(v) = f.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    let raw_tools = match f.get("tools") {
        Some(t) => {
            chat.insert("tools".into(), chat_tools(t)?);
            t.as_array().cloned().unwrap_or_default()
        }
        None => Vec::new(),
    };
    if let Some(c) = f.get("tool_choice") {
        chat.insert("tool_choice".into(), chat_tool_choice(c)?);
    }
    let text = f.object("text")?;
    if let Some(t) = text
        && let Some(rf) = response_format(t)?
    {
        chat.insert("response_format".into(), rf);
    }
    // The effort is the chat template's `reasoning_effort` (gpt-oss's reads it; others
    // ignore it); `summary` has nothing to act on.
    let reasoning = f.object("reasoning")?;
    if let Some(effort) = reasoning
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    let store = f.bool("store")?.unwrap_or(true);
    let previous_response_id = f.str("previous_response_id")?.map(str::to_string);
    let metadata = f.object("metadata")?;
    let user = f.str("user")?.map(str::to_string);
    f.str("truncation")?;
    if f.bool("background")? == Some(true) {
        return Err(verr(
            "background",
            "is not supported: send the request without it (or stream it)",
        ));
    }
    if let Some(m) = f.str("model")? {
        chat.insert("model".into(), json!(m));
    }
    let chat_req = parse_chat_request(&Value::Object(chat)).map_err(rename)?;
    let parallel_tool_calls = chat_req.tools.as_ref().is_none_or(|t| t.parallel);
    let echo = ResponseEcho {
        instructions,
        max_output_tokens: max_output_tokens.map(|m| m as u64),
        temperature: f64::from(chat_req.spec.temperature),
        top_p: f64::from(chat_req.spec.top_p),
        tools: raw_tools,
        tool_choice: f.get("tool_choice").cloned().unwrap_or(json!("auto")),
        parallel_tool_calls,
        text: text
            .map(|t| Value::Object(t.clone()))
            .unwrap_or(json!({"format": {"type": "text"}})),
        reasoning: reasoning
            .map(|r| Value::Object(r.clone()))
            .unwrap_or(json!({"effort": null, "summary": null})),
        metadata: metadata
            .map(|m| Value::Object(m.clone()))
            .unwrap_or(json!({})),
        previous_response_id,
        store,
        user,
    };
    Ok(ResponsesRequest {
        chat: chat_req,
        echo,
        unknown_fields: f.unknown(FIELDS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{Role, ToolChoice};

    #[test]
    fn items_become_chat_messages() {
        let r = parse_responses_request(&json!({
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "function_call", "call_id": "call_1", "name": "w", "arguments": "{}"},
                {"type": "function_call", "call_id": "call_2", "name": "w", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "reasoning", "id": "rs_1", "summary": []}
            ],
            "instructions": "Be brief.",
            "max_output_tokens": 20,
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "w"},
            "reasoning": {"effort": "low"},
        }))
        .unwrap();
        let m = &r.chat.messages;
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].role, m[0].text().as_str()), (Role::User, "Weather?"));
        assert_eq!(m[1].tool_calls.as_ref().unwrap().len(), 2);
        assert_eq!(m[1].tool_calls.as_ref().unwrap()[1].id, "call_2");
        assert_eq!(
            (m[2].role, m[2].tool_call_id.as_deref()),
            (Role::Tool, Some("call_1"))
        );
        assert_eq!(r.chat.spec.max_new_tokens, 20);
        assert_eq!(
            r.chat.tools.as_ref().unwrap().choice,
            ToolChoice::Function("w".into())
        );
        assert!(r.chat.spec.constraint.is_some(), "a named tool is forced");
        assert_eq!(
            r.chat.reasoning.template_kwargs["reasoning_effort"], "low",
            "the effort is the template's reasoning_effort"
        );
        assert_eq!(r.echo.instructions.as_deref(), Some("Be brief."));
        assert!(r.echo.store);
    }

    #[test]
    fn text_format_is_the_constraint() {
        let r = parse_responses_request(&json!({"input": "x", "text": {"format": {
            "type": "json_schema", "name": "p", "schema": {"type": "object"}, "strict": true}}}))
        .unwrap();
        assert_eq!(
            r.chat.spec.constraint,
            Some(crate::Constraint::JsonSchema(json!({"type": "object"})))
        );
        let r = parse_responses_request(
            &json!({"input": "x", "text": {"format": {"type": "json_object"}}}),
        )
        .unwrap();
        assert_eq!(r.chat.spec.constraint, Some(crate::Constraint::JsonObject));
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (body, param) in [
            (json!({}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": 3}), "input"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0]",
            ),
            (json!({"input": [{"type": "nope"}]}), "input[0].type"),
            (
                json!({"input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (json!({"input": "x", "temperature": 3}), "temperature"),
            (
                json!({"input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"input": "x", "tools": [{"type": "function", "name": "a b"}]}),
                "tools[0].name",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "xml"}}}),
                "text.format.type",
            ),
            (json!({"input": "x", "store": "yes"}), "store"),
        ] {
            let e = parse_responses_request(&body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
        }
    }
}
