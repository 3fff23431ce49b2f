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

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// One or more prompts; choices come back per prompt, `n` each.
    pub prompts: Vec<String>,
    pub spec: GenerationSpec,
    /// `echo`: the prompt is prepended (also set as `spec.return_full_text`).
    pub echo: bool,
    /// `logprobs` (0..=5): alternatives per token, None = no logprobs.
    pub logprobs: Option<u32>,
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
            return Err(
                ApiError::not_supported("prompt as token ids is not supported; send text")
                    .with_param("prompt"),
            );
        }
        Some(_) => f.strings("prompt")?.unwrap_or_default(),
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
    read_max_tokens(&f, &mut spec, DEFAULT_COMPLETION_MAX_TOKENS)?;
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
    let echo = f.bool("echo")?.unwrap_or(false);
    spec.return_full_text = echo;
    let logprobs = f
        .int_in("logprobs", 0, 5, "an integer in [0, 5]")?
        .map(|v| v as u32);
    if let Some(k) = logprobs {
        spec.logprobs = Some(k);
        spec.top_n_tokens = k;
        spec.details = true;
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
        include_usage,
        unknown_fields: f.unknown(&known),
    })
}
