//! Fields shared by chat and completions requests (OpenAI ranges plus vLLM's extensions).

use crate::error::ApiError;
use crate::fields::{Fields, Res};
use crate::lmi::params::logit_bias;
use crate::spec::{GenerationSpec, push_unique};

pub(crate) const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "ignore_eos",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "best_of",
    "logprobs",
    "adapter_id",
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_json_object",
    "guided_decoding_backend",
    "prediction",
];

/// Common fields into `spec`; `max_tokens` handled by the caller. Returns `include_usage`.
pub(crate) fn read_common(f: &Fields, spec: &mut GenerationSpec) -> Res<bool> {
    // OpenAI: temperature in [0, 2], default 1 (sampling); 0 is greedy.
    spec.temperature = 1.0;
    if let Some(t) = f.f32("temperature")? {
        if !(0.0..=2.0).contains(&t) {
            return Err(f.range_err("temperature", format!("must be in [0, 2], got {t}")));
        }
        spec.temperature = t;
    }
    crate::spec::read_filters_and_penalties(f, spec)?;
    if let Some(n) = f.int_in("n", 1, 128, "an integer in [1, 128]")? {
        spec.n = n as u32;
        spec.best_of = n as u32;
    }
    spec.seed = f.u64("seed")?;
    if let Some(s) = f.strings("stop")? {
        push_unique(&mut spec.stop_strings, s);
    }
    if let Some(ids) = f.ids("stop_token_ids")? {
        spec.stop_token_ids = ids;
    }
    if let Some(v) = f.get("logit_bias") {
        spec.logit_bias = logit_bias(f, "logit_bias", v, Some(100.0))?;
    }
    if let Some(m) = f.int_in(
        "min_tokens",
        0,
        i64::from(u32::MAX),
        "a non-negative integer",
    )? {
        spec.min_new_tokens = m as usize;
    }
    spec.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    spec.include_stop_str_in_output = f.bool("include_stop_str_in_output")?.unwrap_or(false);
    spec.skip_special_tokens = f.bool("skip_special_tokens")?.unwrap_or(true);
    spec.spaces_between_special_tokens = f.bool("spaces_between_special_tokens")?.unwrap_or(true);
    spec.adapter = f
        .str("adapter_id")?
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    f.str("user")?;
    f.str("model")?;
    spec.stream = f.bool("stream")?.unwrap_or(false);
    read_constraint(f, spec)?;
    spec.draft = read_prediction(f)?;
    let include_usage = match f.object("stream_options")? {
        Some(o) => Fields::new(o, "stream_options")
            .bool("include_usage")?
            .unwrap_or(false),
        None => false,
    };
    Ok(include_usage)
}

/// `max_tokens` (and its newer alias `max_completion_tokens`, which wins) into `spec`.
pub(crate) fn read_max_tokens(f: &Fields, spec: &mut GenerationSpec, default: usize) -> Res<()> {
    spec.max_new_tokens = default;
    if let Some(key) = f.first_key(&["max_completion_tokens", "max_tokens"])
        && let Some(m) = f.int_in(key, 1, i64::from(u32::MAX), "a positive integer")?
    {
        spec.max_new_tokens = m as usize;
        spec.max_new_tokens_explicit = true;
    }
    Ok(())
}

/// `response_format` (OpenAI's and TGI's spellings) or vLLM's `guided_*` fields, at most one
/// of them, into `spec.constraint`.
pub(crate) fn read_constraint(f: &Fields, spec: &mut GenerationSpec) -> Res<()> {
    let format = match f.get("response_format") {
        Some(v) => crate::constraint::response_format(v, "response_format")?,
        None => None,
    };
    let guided = crate::constraint::guided(f)?;
    f.str("guided_decoding_backend")?; // vLLM picks a backend; there is one here
    if format.is_some() && guided.is_some() {
        return Err(ApiError::validation(
            "response_format and guided_* both constrain the output: send one of them",
        )
        .with_param("response_format"));
    }
    spec.constraint = format.or(guided);
    Ok(())
}

/// OpenAI predicted outputs: `prediction: {"type": "content", "content": "..." | [text parts]}`.
fn read_prediction(f: &Fields) -> Res<Option<crate::spec::Draft>> {
    let Some(p) = f.object("prediction")? else {
        return Ok(None);
    };
    let p = Fields::new(p, "prediction");
    match p.str("type")? {
        Some("content") => {}
        other => {
            return Err(ApiError::validation(format!(
                "prediction.type must be \"content\", got {}",
                other.map_or("nothing".to_string(), |t| format!("\"{t}\""))
            ))
            .with_param("prediction.type"));
        }
    }
    let text = match p.get("content") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                match part.get("text").and_then(|t| t.as_str()) {
                    Some(t) if part.get("type").and_then(|t| t.as_str()) == Some("text") => {
                        text.push_str(t)
                    }
                    _ => {
                        return Err(ApiError::validation(format!(
                            "prediction.content[{i}] must be {{\"type\": \"text\", \"text\": string}}"
                        ))
                        .with_param(format!("prediction.content[{i}]")));
                    }
                }
            }
            text
        }
        _ => {
            return Err(ApiError::validation(
                "prediction.content must be a string or a list of text parts",
            )
            .with_param("prediction.content"));
        }
    };
    Ok((!text.is_empty()).then_some(crate::spec::Draft::Text(text)))
}
