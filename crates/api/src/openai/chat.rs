//! `POST /v1/chat/completions` request.

use crate::constraint::Constraint;
use crate::error::ApiError;
use crate::fields::{Fields, Res};
use crate::openai::message::{ChatMessage, Role};
use crate::openai::reasoning::{REASONING_FIELDS, ReasoningControls, read_reasoning};
use crate::openai::sampling::{COMMON_FIELDS, read_common, read_max_tokens};
use crate::openai::tools::{ToolSpec, read_tools};
use crate::spec::GenerationSpec;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// `max_new_tokens` defaults to "the rest of the context" (usize::MAX, not explicit): the
    /// server clamps it with [`GenerationSpec::fit_context`].
    pub spec: GenerationSpec,
    /// `logprobs: true`: return per-token logprobs (with `top_logprobs` alternatives).
    pub logprobs: bool,
    pub top_logprobs: u32,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `tools` / `tool_choice` / `parallel_tool_calls`; a forced call is already in
    /// `spec.constraint`.
    pub tools: Option<ToolSpec>,
    /// `chat_template_kwargs` and the thinking budget.
    pub reasoning: ReasoningControls,
    /// Unknown top-level fields (sorted), ignored.
    pub unknown_fields: Vec<String>,
}

const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "tool_prompt",
];

pub fn parse_chat_request(body: &Value) -> Res<ChatRequest> {
    let f = Fields::body(body)?;
    let messages = match f.get("messages") {
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::validation("messages must not be empty").with_param("messages"));
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, m)| {
                serde_json::from_value::<ChatMessage>(m.clone()).map_err(|e| {
                    ApiError::invalid_body(format!("messages[{i}] is not a valid message: {e}"))
                        .with_param(format!("messages[{i}]"))
                })
            })
            .collect::<Res<Vec<_>>>()?,
        Some(v) => return Err(f.type_err("messages", "an array of messages", v)),
        None => return Err(ApiError::invalid_body("messages is required").with_param("messages")),
    };
    for (i, m) in messages.iter().enumerate() {
        check_message(i, m)?;
    }
    let mut spec = GenerationSpec::default();
    let include_usage = read_common(&f, &mut spec)?;
    read_max_tokens(&f, &mut spec, usize::MAX)?;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top_logprobs = f
        .int_in("top_logprobs", 0, 20, "an integer in [0, 20]")?
        .unwrap_or(0) as u32;
    if top_logprobs > 0 && !logprobs {
        return Err(
            ApiError::validation("top_logprobs requires logprobs to be true")
                .with_param("top_logprobs"),
        );
    }
    if logprobs {
        spec.logprobs = Some(top_logprobs);
        spec.top_n_tokens = top_logprobs;
        spec.details = true;
    }
    spec.token_logprobs = logprobs;
    let tools = read_tools(&f)?;
    if let Some(forced) = tools.as_ref().and_then(ToolSpec::forced_schema) {
        if spec.constraint.is_some() {
            return Err(ApiError::validation(
                "a required or named tool_choice already fixes the output's format: drop response_format",
            )
            .with_param("tool_choice"));
        }
        spec.constraint = Some(Constraint::JsonSchema(forced));
    }
    let reasoning = read_reasoning(&f)?;
    let known: Vec<&str> = COMMON_FIELDS
        .iter()
        .chain(CHAT_FIELDS)
        .chain(REASONING_FIELDS)
        .copied()
        .collect();
    Ok(ChatRequest {
        model: f.str("model")?.map(str::to_string),
        messages,
        spec,
        logprobs,
        top_logprobs,
        include_usage,
        tools,
        reasoning,
        unknown_fields: f.unknown(&known),
    })
}

/// A message needs `content`, except an assistant turn that carries `tool_calls` (its content
/// may be absent or null, as OpenAI sends it). OpenAI and TGI refuse the rest; without this a
/// `{"role": "user"}` turn would render as an empty message and generate.
fn check_message(i: usize, m: &ChatMessage) -> Res<()> {
    let has_calls = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
    if m.content.is_none() && !(m.role == Role::Assistant && has_calls) {
        let hint = if m.role == Role::Assistant {
            " (or `tool_calls`)"
        } else {
            ""
        };
        return Err(ApiError::validation(format!(
            "messages[{i}].content is required for {} message{hint}",
            match m.role {
                Role::System => "a system",
                Role::User => "a user",
                Role::Assistant => "an assistant",
                Role::Tool => "a tool",
            }
        ))
        .with_param(format!("messages[{i}].content")));
    }
    Ok(())
}
