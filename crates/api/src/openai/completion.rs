//! `POST /v1/completions` request (legacy OpenAI completions).

use crate::error::{ApiError, ErrorKind};
use crate::fields::{Fields, Res};
use crate::openai::sampling::{COMMON_FIELDS, read_common, read_max_tokens};
use crate::spec::GenerationSpec;
use serde_json::Value;

/// OpenAI's default `max_tokens` for completions.
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// Most prompts in one completions request (TGI `max_client_batch_size`).
    pub max_client_batch_size: usize,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            max_client_batch_size: 4,
        }
    }
}

/// One prompt: text, or token ids as OpenAI and vLLM also take them (lm-eval sends its own
/// tokenization, so the context length it counts is the server's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionPrompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// One or more prompts; choices come back per prompt, `n` each.
    pub prompts: Vec<CompletionPrompt>,
    pub spec: GenerationSpec,
    /// `echo`: the prompt is prepended (also set as `spec.return_full_text`); with `logprobs`
    /// the prompt's tokens and logprobs come first in each choice's `logprobs`.
    pub echo: bool,
    /// `logprobs` (0..=5): alternatives per token, None = no logprobs.
    pub logprobs: Option<u32>,
    /// `max_tokens: 0` with `echo`: the prompt is scored and nothing is generated. The
    /// scheduler always samples after a prefill, so one token is drawn and dropped.
    pub prompt_only: bool,
    pub include_usage: bool,
    pub unknown_fields: Vec<String>,
}

pub fn parse_completion_request(body: &Value, cfg: &OpenAiConfig) -> Res<CompletionRequest> {
    let f = Fields::body(body)?;
    let prompts = match f.get("prompt") {
        None => return Err(ApiError::invalid_body("prompt is required").with_param("prompt")),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(
                ApiError::validation("prompt must not be an empty list").with_param("prompt")
            );
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![CompletionPrompt::Tokens(token_ids(&f, "prompt", items)?)]
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let ids = v.as_array().map(Vec::as_slice).unwrap_or_default();
                token_ids(&f, &format!("prompt[{i}]"), ids).map(CompletionPrompt::Tokens)
            })
            .collect::<Res<Vec<_>>>()?,
        Some(_) => f
            .strings("prompt")?
            .unwrap_or_default()
            .into_iter()
            .map(CompletionPrompt::Text)
            .collect(),
    };
    if prompts.len() > cfg.max_client_batch_size {
        return Err(ApiError::new(
            ErrorKind::BatchSizeExceeded,
            format!(
                "Number of prompts exceeds the maximum allowed batch size of {}",
                cfg.max_client_batch_size
            ),
        )
        .with_param("prompt"));
    }
    if f.get("suffix").is_some() {
        return Err(ApiError::new(
            ErrorKind::SuffixNotSupported,
            "Suffix is not supported and can be achieved by preprocessing the prompt.",
        )
        .with_param("suffix"));
    }
    let mut spec = GenerationSpec::default();
    let include_usage = read_common(&f, &mut spec)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    let prompt_only = zero_max_tokens(&f, echo)?;
    if prompt_only {
        spec.max_new_tokens = 1;
        spec.max_new_tokens_explicit = true;
    } else {
        read_max_tokens(&f, &mut spec, DEFAULT_COMPLETION_MAX_TOKENS)?;
    }
    if let Some(b) = f.int_in("best_of", 1, 128, "an integer in [1, 128]")? {
        if (b as u32) < spec.n {
            return Err(f.range_err("best_of", format!("must be >= n ({}), got {b}", spec.n)));
        }
        spec.best_of = b as u32;
    }
    // vLLM's use_beam_search: best_of beams, the best n returned. Beams are greedy: an
    // explicit temperature above 0 is refused, the default one is dropped.
    if f.bool("use_beam_search")? == Some(true) && spec.best_of > 1 {
        let sampling = f.f32("temperature")?.is_some_and(|t| t > 0.0);
        let b = crate::spec::read_beam(
            &f,
            i64::from(spec.best_of),
            Some(i64::from(spec.n)),
            sampling,
        )?;
        spec.temperature = 0.0;
        spec.best_of = spec.n;
        spec.beam = Some(b);
    }
    spec.return_full_text = echo;
    let logprobs = f
        .int_in("logprobs", 0, 5, "an integer in [0, 5]")?
        .map(|v| v as u32);
    spec.token_logprobs = logprobs.is_some();
    if let Some(k) = logprobs {
        spec.logprobs = Some(k);
        spec.top_n_tokens = k;
        spec.details = true;
        if echo {
            // The prompt's tokens are scored too (LMI's decoder_input_details, with top-k).
            spec.prompt_logprobs = Some(k);
        }
    }
    let known: Vec<&str> = COMMON_FIELDS
        .iter()
        .chain(&[
            "prompt",
            "echo",
            "suffix",
            "use_beam_search",
            "length_penalty",
            "early_stopping",
        ])
        .copied()
        .collect();
    Ok(CompletionRequest {
        model: f.str("model")?.map(str::to_string),
        prompts,
        spec,
        echo,
        logprobs,
        prompt_only,
        include_usage,
        unknown_fields: f.unknown(&known),
    })
}

/// Whether `max_tokens` (or `max_completion_tokens`) is 0, which only `echo` allows: it
/// scores the prompt (evaluation harnesses ask for its logprobs this way).
fn zero_max_tokens(f: &Fields, echo: bool) -> Res<bool> {
    let Some(key) = f.first_key(&["max_completion_tokens", "max_tokens"]) else {
        return Ok(false);
    };
    if f.get(key).and_then(Value::as_i64) != Some(0) {
        return Ok(false);
    }
    if !echo {
        return Err(f.range_err(
            key,
            "must be a positive integer, got 0 (0 is only for scoring the prompt, with \"echo\": true)",
        ));
    }
    Ok(true)
}

/// A prompt of token ids, each a u32.
fn token_ids(f: &Fields, key: &str, items: &[Value]) -> Res<Vec<u32>> {
    if items.is_empty() {
        return Err(
            ApiError::validation(format!("{key} must not be an empty list")).with_param(key),
        );
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| f.id_err(&format!("{key}[{i}]"), v))
        })
        .collect()
}
