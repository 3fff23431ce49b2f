//! Body parsing and key dispatch for the LMI routes (`/invocations`, `/predictions/*`,
//! `/v1/chat/completions` on LMI), in LMI's order: `prompt`, then `inputs`, then `messages`.

use crate::error::ApiError;
use crate::fields::{Res, type_name};
use crate::lmi::{LmiConfig, LmiRequest, parse_lmi_request};
use crate::openai::{
    ChatRequest, CompletionRequest, OpenAiConfig, parse_chat_request, parse_completion_request,
};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    /// `inputs`: LMI rolling batch (string) or dynamic batch (list).
    Lmi(LmiRequest),
    /// `messages`: chat.
    Chat(ChatRequest),
    /// `prompt`: OpenAI completions.
    Completion(CompletionRequest),
}

/// Bytes → JSON, with an error saying where the syntax broke.
pub fn parse_json(bytes: &[u8]) -> Res<Value> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid_json(format!("request body is not valid JSON: {e}")))
}

pub fn parse_invocation(body: &Value, lmi: &LmiConfig, openai: &OpenAiConfig) -> Res<Invocation> {
    let map = body.as_object().ok_or_else(|| {
        ApiError::invalid_body(format!(
            "invalid payload. must be a JSON object, got {}",
            type_name(body)
        ))
    })?;
    if map.contains_key("prompt") {
        parse_completion_request(body, openai).map(Invocation::Completion)
    } else if map.contains_key("inputs") {
        parse_lmi_request(body, lmi).map(Invocation::Lmi)
    } else if map.contains_key("messages") {
        parse_chat_request(body).map(Invocation::Chat)
    } else {
        Err(ApiError::invalid_body(
            "invalid payload. must contain prompt, inputs, or messages",
        ))
    }
}

/// [`parse_json`] then [`parse_invocation`].
pub fn parse_invocation_bytes(
    bytes: &[u8],
    lmi: &LmiConfig,
    openai: &OpenAiConfig,
) -> Res<Invocation> {
    parse_invocation(&parse_json(bytes)?, lmi, openai)
}
