//! Reasoning controls of a chat request: `chat_template_kwargs` (passed to the chat template,
//! as vLLM and SGLang do: `enable_thinking` and any variable the template reads) and a thinking
//! budget in the spellings clients send (vLLM's `thinking_token_budget`, llama.cpp's
//! `thinking_budget_tokens`; -1 means no limit, as llama.cpp's `--reasoning-budget`), and
//! OpenAI's `reasoning_effort`, given to the template as the variable of that name (gpt-oss's
//! template writes it into the system message, as vLLM does for it).

use crate::error::ApiError;
use crate::fields::{Fields, Res};
use serde_json::{Map, Value};

/// Request fields read here.
pub(crate) const REASONING_FIELDS: &[&str] = &[
    "chat_template_kwargs",
    "thinking_token_budget",
    "thinking_budget_tokens",
    "reasoning_effort",
];

/// `reasoning_effort` values (OpenAI's).
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high"];

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
    let mut template_kwargs = f
        .object("chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    if let Some(effort) = f.str("reasoning_effort")? {
        if !EFFORTS.contains(&effort) {
            return Err(f.range_err(
                "reasoning_effort",
                format!("must be one of {}, got \"{effort}\"", EFFORTS.join(", ")),
            ));
        }
        match template_kwargs.get("reasoning_effort") {
            Some(v) if v != effort => {
                return Err(ApiError::validation(
                    "reasoning_effort and chat_template_kwargs.reasoning_effort disagree: \
                     send one",
                )
                .with_param("reasoning_effort"));
            }
            _ => {
                template_kwargs.insert("reasoning_effort".into(), effort.into());
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Res<ReasoningControls> {
        let map = body.as_object().cloned().unwrap_or_default();
        read_reasoning(&Fields::new(&map, ""))
    }

    #[test]
    fn reasoning_effort_becomes_the_template_variable() {
        let r = read(json!({"reasoning_effort": "high"})).unwrap();
        assert_eq!(r.template_kwargs["reasoning_effort"], "high");
        let r = read(json!({"reasoning_effort": "low",
            "chat_template_kwargs": {"reasoning_effort": "low", "x": 1}}))
        .unwrap();
        assert_eq!(r.template_kwargs.len(), 2);
        let e = read(json!({"reasoning_effort": "max"})).unwrap_err();
        assert!(
            e.message.contains("none, minimal, low, medium, high"),
            "{}",
            e.message
        );
        let e = read(json!({"reasoning_effort": "low",
            "chat_template_kwargs": {"reasoning_effort": "high"}}))
        .unwrap_err();
        assert!(e.message.contains("disagree"), "{}", e.message);
    }
}
