//! Reasoning controls of a chat request: `chat_template_kwargs` (passed to the chat template,
//! as vLLM and SGLang do: `enable_thinking` and any variable the template reads) and a thinking
//! budget in the spellings clients send (vLLM's `thinking_token_budget`, llama.cpp's
//! `thinking_budget_tokens`; -1 means no limit, as llama.cpp's `--reasoning-budget`).

use crate::error::ApiError;
use crate::fields::{Fields, Res};
use serde_json::{Map, Value};

/// Request fields read here.
pub(crate) const REASONING_FIELDS: &[&str] = &[
    "chat_template_kwargs",
    "thinking_token_budget",
    "thinking_budget_tokens",
];

/// How many tokens a reply may spend reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingBudget {
    /// No limit (overrides a server default).
    Unlimited,
    /// At most this many tokens between the reasoning's tags; 0: no reasoning.
    Tokens(usize),
}

impl ThinkingBudget {
    /// `option.reasoning_budget` and the request fields: -1 or more.
    pub fn from_i64(v: i64) -> Option<Self> {
        match v {
            -1 => Some(ThinkingBudget::Unlimited),
            n if n >= 0 => Some(ThinkingBudget::Tokens(n as usize)),
            _ => None,
        }
    }
}

/// The reasoning controls of one chat request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReasoningControls {
    /// `chat_template_kwargs`, as sent (empty when absent).
    pub template_kwargs: Map<String, Value>,
    /// A per-request budget; `None`: the server's default.
    pub budget: Option<ThinkingBudget>,
}

pub(crate) fn read_reasoning(f: &Fields) -> Res<ReasoningControls> {
    let template_kwargs = f
        .object("chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    if let Some(v) = template_kwargs.get("enable_thinking")
        && !v.is_boolean()
    {
        return Err(ApiError::validation(
            "chat_template_kwargs.enable_thinking must be true or false",
        )
        .with_param("chat_template_kwargs.enable_thinking"));
    }
    let mut budget: Option<(&str, ThinkingBudget)> = None;
    for key in ["thinking_token_budget", "thinking_budget_tokens"] {
        let Some(v) = f.i64(key)? else { continue };
        let b = ThinkingBudget::from_i64(v).ok_or_else(|| {
            f.range_err(
                key,
                format!("must be -1 (no limit) or a count of tokens, got {v}"),
            )
        })?;
        if let Some((first, prev)) = budget
            && prev != b
        {
            return Err(ApiError::validation(format!(
                "{first} and {key} disagree: send one thinking budget"
            ))
            .with_param(key));
        }
        budget = Some((key, b));
    }
    Ok(ReasoningControls {
        template_kwargs,
        budget: budget.map(|(_, b)| b),
    })
}
