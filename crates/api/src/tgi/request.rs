//! TGI `GenerateRequest` for `/`, `/generate`, `/generate_stream` and `/tokenize`, validated with
//! TGI's rules, messages and order (`router/src/validation.rs`).

use crate::error::ApiError;
use crate::fields::{Fields, Res};
use crate::spec::{GenerationSpec, push_unique};
use serde_json::{Map, Value};

/// Router limits (TGI CLI defaults in `Default`).
#[derive(Debug, Clone, PartialEq)]
pub struct TgiLimits {
    pub max_best_of: u32,
    pub max_stop_sequences: usize,
    pub max_top_n_tokens: u32,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    /// `max_new_tokens` when the request gives none (TGI <= 2.4 used 100). It is clamped to the
    /// context left by [`GenerationSpec::fit_context`].
    pub default_max_new_tokens: usize,
    /// `POST /` with `return_full_text: null` returns the prompt too for text-generation models.
    pub compat_return_full_text: bool,
}

impl Default for TgiLimits {
    fn default() -> Self {
        Self {
            max_best_of: 2,
            max_stop_sequences: 4,
            max_top_n_tokens: 5,
            max_input_tokens: 4095,
            max_total_tokens: 4096,
            default_max_new_tokens: 100,
            compat_return_full_text: true,
        }
    }
}

/// Which TGI route the body came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TgiRoute {
    /// `POST /generate`.
    Generate,
    /// `POST /generate_stream`.
    GenerateStream,
    /// `POST /` (`stream` read from the body; non-streaming answer is an array).
    Compat,
    /// `POST /tokenize`: only `inputs` (and `truncate`) matter.
    Tokenize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TgiRequest {
    pub inputs: String,
    pub spec: GenerationSpec,
    /// Unknown parameter names (sorted), ignored.
    pub unknown_parameters: Vec<String>,
}

const KNOWN: &[&str] = &[
    "best_of",
    "temperature",
    "repetition_penalty",
    "frequency_penalty",
    "top_k",
    "top_p",
    "typical_p",
    "do_sample",
    "max_new_tokens",
    "return_full_text",
    "stop",
    "truncate",
    "watermark",
    "details",
    "decoder_input_details",
    "seed",
    "top_n_tokens",
    "grammar",
    "adapter_id",
];

fn verr(msg: impl Into<String>, param: &str) -> ApiError {
    ApiError::validation(msg).with_param(param)
}

/// Raw values after type checks, before TGI's validation.
struct Raw {
    best_of: Option<i64>,
    temperature: Option<f32>,
    repetition_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    top_k: Option<i64>,
    top_p: Option<f32>,
    typical_p: Option<f32>,
    do_sample: bool,
    max_new_tokens: Option<i64>,
    return_full_text: Option<bool>,
    stop: Vec<String>,
    truncate: Option<i64>,
    details: bool,
    decoder_input_details: bool,
    seed: Option<u64>,
    top_n_tokens: Option<i64>,
    adapter_id: Option<String>,
    grammar: Option<crate::constraint::Constraint>,
}

fn read(params: Option<&Map<String, Value>>) -> Res<Raw> {
    let empty = Map::new();
    let f = Fields::new(params.unwrap_or(&empty), "parameters");
    let non_neg = |key: &str| f.int_in(key, 0, i64::MAX, "a non-negative integer");
    f.bool("watermark")?; // accepted, no effect
    Ok(Raw {
        best_of: non_neg("best_of")?,
        temperature: f.f32("temperature")?,
        repetition_penalty: f.f32("repetition_penalty")?,
        frequency_penalty: f.f32("frequency_penalty")?,
        top_k: f.i64("top_k")?,
        top_p: f.f32("top_p")?,
        typical_p: f.f32("typical_p")?,
        // TGI quirk: an omitted `parameters` object defaults to do_sample=true.
        do_sample: f.bool("do_sample")?.unwrap_or(params.is_none()),
        max_new_tokens: non_neg("max_new_tokens")?,
        return_full_text: f.bool("return_full_text")?,
        stop: f.strings("stop")?.unwrap_or_default(),
        truncate: non_neg("truncate")?,
        details: f.bool("details")?.unwrap_or(false),
        decoder_input_details: f.bool("decoder_input_details")?.unwrap_or(false),
        seed: f.u64("seed")?,
        top_n_tokens: non_neg("top_n_tokens")?,
        adapter_id: f.str("adapter_id")?.map(str::to_string),
        grammar: match f.get("grammar") {
            Some(g) => crate::constraint::response_format(g, "parameters.grammar")?,
            None => None,
        },
    })
}

/// Parse and validate a TGI body. Errors are `ErrorKind::Validation` with TGI's message (the
/// server renders "Input validation error: ..." with `error_type` "validation") or
/// `InvalidBody` for type errors.
pub fn parse_tgi_request(body: &Value, route: TgiRoute, limits: &TgiLimits) -> Res<TgiRequest> {
    let top = Fields::body(body)?;
    let inputs = match top.get("inputs") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(top.type_err("inputs", "a string", v)),
        None => return Err(ApiError::invalid_body("missing field `inputs`").with_param("inputs")),
    };
    let params = top.object("parameters")?;
    let unknown_parameters = params
        .map(|p| Fields::new(p, "parameters").unknown(KNOWN))
        .unwrap_or_default();
    let raw = read(params)?;
    let stream = match route {
        TgiRoute::GenerateStream => true,
        TgiRoute::Compat => top.bool("stream")?.unwrap_or(false),
        TgiRoute::Generate | TgiRoute::Tokenize => false,
    };

    if route == TgiRoute::Tokenize {
        let spec = GenerationSpec {
            truncate: raw.truncate.map(|t| t as usize),
            ..GenerationSpec::default()
        };
        return Ok(TgiRequest {
            inputs,
            spec,
            unknown_parameters,
        });
    }

    let best_of = raw.best_of.unwrap_or(1);
    if stream {
        // generate_stream_internal checks these before validation.
        if best_of != 1 {
            return Err(verr(
                "`best_of` != 1 is not supported when streaming tokens",
                "parameters.best_of",
            ));
        }
        if raw.decoder_input_details {
            return Err(verr(
                "`decoder_input_details` == true is not supported when streaming tokens",
                "parameters.decoder_input_details",
            ));
        }
    } else if best_of != 1 {
        // generate_internal: validate_best_of before the main validation.
        if limits.max_best_of == 1 {
            return Err(verr(
                "`best_of` != 1 is not allowed for this endpoint",
                "parameters.best_of",
            ));
        }
        if best_of == 0 || best_of > i64::from(limits.max_best_of) {
            return Err(verr(
                format!(
                    "`best_of` must be > 0 and <= {}. Given: {best_of}",
                    limits.max_best_of
                ),
                "parameters.best_of",
            ));
        }
    }

    let spec = validate(&raw, best_of, &inputs, route, stream, limits)?;
    Ok(TgiRequest {
        inputs,
        spec,
        unknown_parameters,
    })
}

/// `Validation::validate`'s checks, in its order.
fn validate(
    raw: &Raw,
    best_of: i64,
    inputs: &str,
    route: TgiRoute,
    stream: bool,
    limits: &TgiLimits,
) -> Res<GenerationSpec> {
    let router_sampling = raw.do_sample
        || raw.temperature.is_some()
        || raw.top_k.is_some()
        || raw.top_p.is_some()
        || raw.typical_p.is_some();
    if best_of > 1 && !router_sampling {
        return Err(verr(
            "you must use sampling when `best_of` is > 1",
            "parameters.best_of",
        ));
    }
    let temperature = raw.temperature.unwrap_or(1.0);
    if temperature <= 0.0 {
        return Err(verr(
            "`temperature` must be strictly positive",
            "parameters.temperature",
        ));
    }
    let repetition_penalty = raw.repetition_penalty.unwrap_or(1.0);
    if repetition_penalty <= 0.0 {
        return Err(verr(
            "`repetition_penalty` must be strictly positive",
            "parameters.repetition_penalty",
        ));
    }
    let frequency_penalty = raw.frequency_penalty.unwrap_or(0.0);
    if !(-2.0..=2.0).contains(&frequency_penalty) {
        return Err(verr(
            "`frequency_penalty` must be >= -2.0 and <= 2.0",
            "parameters.frequency_penalty",
        ));
    }
    let top_p = raw.top_p.unwrap_or(1.0);
    if raw.top_p.is_some() && !(top_p > 0.0 && top_p < 1.0) {
        return Err(verr("`top_p` must be > 0.0 and < 1.0", "parameters.top_p"));
    }
    let typical_p = raw.typical_p.unwrap_or(1.0);
    if raw.typical_p.is_some() && !(typical_p > 0.0 && typical_p < 1.0) {
        return Err(verr(
            "`typical_p` must be > 0.0 and < 1.0",
            "parameters.typical_p",
        ));
    }
    let top_k = match raw.top_k {
        Some(k) if k <= 0 => {
            return Err(verr(
                "`top_k` must be strictly positive",
                "parameters.top_k",
            ));
        }
        Some(k) => u32::try_from(k).unwrap_or(u32::MAX),
        None => 0,
    };
    if raw.max_new_tokens == Some(0) {
        return Err(verr(
            "`max_new_tokens` must be strictly positive",
            "parameters.max_new_tokens",
        ));
    }
    if raw.stop.len() > limits.max_stop_sequences {
        return Err(verr(
            format!(
                "`stop` supports up to {} stop sequences. Given: {}",
                limits.max_stop_sequences,
                raw.stop.len()
            ),
            "parameters.stop",
        ));
    }
    if best_of > 1 && raw.seed.is_some() {
        return Err(verr(
            "`seed` must not be set when `best_of` > 1",
            "parameters.seed",
        ));
    }
    let top_n_tokens = raw.top_n_tokens.unwrap_or(0);
    if top_n_tokens > i64::from(limits.max_top_n_tokens) {
        return Err(verr(
            format!(
                "`top_n_tokens` must be >= 0 and <= {}. Given: {top_n_tokens}",
                limits.max_top_n_tokens
            ),
            "parameters.top_n_tokens",
        ));
    }
    if inputs.is_empty() {
        return Err(verr("`inputs` cannot be empty", "inputs"));
    }
    if let Some(t) = raw.truncate
        && (t == 0 || t as usize > limits.max_input_tokens)
    {
        return Err(verr(
            format!(
                "`truncate` must be strictly positive and less than {}. Given: {t}",
                limits.max_input_tokens
            ),
            "parameters.truncate",
        ));
    }

    // The shard samples when asked to or when any warper is not neutral.
    let sampling =
        raw.do_sample || temperature != 1.0 || top_k != 0 || top_p < 1.0 || typical_p < 1.0;
    let best_of = best_of.max(1) as u32;
    let mut spec = GenerationSpec {
        temperature: if sampling { temperature } else { 0.0 },
        top_k,
        top_p,
        typical_p,
        repetition_penalty,
        frequency_penalty,
        seed: raw.seed,
        max_new_tokens: raw
            .max_new_tokens
            .map_or(limits.default_max_new_tokens, |m| m as usize),
        max_new_tokens_explicit: raw.max_new_tokens.is_some(),
        include_stop_str_in_output: true, // TGI keeps the stop text in the output
        n: best_of,
        best_of,
        details: raw.details,
        decoder_input_details: raw.decoder_input_details,
        return_full_text: raw
            .return_full_text
            .unwrap_or(route == TgiRoute::Compat && limits.compat_return_full_text),
        top_n_tokens: top_n_tokens as u32,
        truncate: raw.truncate.map(|t| t as usize),
        adapter: raw.adapter_id.clone().filter(|a| !a.is_empty()),
        stream,
        constraint: raw.grammar.clone(),
        ..GenerationSpec::default()
    };
    push_unique(&mut spec.stop_strings, raw.stop.iter().cloned());
    Ok(spec)
}

/// Checks 14-16 of TGI's validation, once the server knows the prompt's token count: applies
/// `truncate`, then the total-length check (a default `max_new_tokens` is clamped instead), then
/// the input-length check (TGI checks it after the total, so this order is kept).
/// Returns the effective input length.
pub fn validate_input_length(
    prompt_tokens: usize,
    spec: &mut GenerationSpec,
    limits: &TgiLimits,
) -> Res<usize> {
    let input_length = spec.input_length(prompt_tokens);
    spec.fit_context(input_length, limits.max_total_tokens)?;
    if input_length > limits.max_input_tokens {
        return Err(verr(
            format!(
                "`inputs` must have less than {} tokens. Given: {input_length}",
                limits.max_input_tokens
            ),
            "inputs",
        ));
    }
    Ok(input_length)
}
