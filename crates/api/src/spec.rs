//! The neutral, fully resolved generation request every schema parses into.

use crate::error::ApiError;
use serde::Serialize;

/// Every control resolved to a concrete value (defaults applied by the schema's parser).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenerationSpec {
    /// 0 means greedy (argmax); other sampling fields are then irrelevant.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// 1.0 = off.
    pub typical_p: f32,
    /// 1.0 = off (multiplicative, HF/TGI style).
    pub repetition_penalty: f32,
    /// 0.0 = off (additive, OpenAI style).
    pub presence_penalty: f32,
    /// 0.0 = off (additive, OpenAI style).
    pub frequency_penalty: f32,
    /// None: the server picks a random seed (and may report it, as TGI does).
    pub seed: Option<u64>,
    pub max_new_tokens: usize,
    /// False when `max_new_tokens` is a default: the server may then clamp it to the context
    /// left (see [`GenerationSpec::fit_context`]) instead of failing the request.
    pub max_new_tokens_explicit: bool,
    /// EOS and stop rules are suppressed until this many tokens are generated.
    pub min_new_tokens: usize,
    pub stop_strings: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub include_stop_str_in_output: bool,
    pub ignore_eos: bool,
    /// 0 = off.
    pub no_repeat_ngram_size: u32,
    /// (token id, additive logit bias).
    pub logit_bias: Vec<(u32, f32)>,
    /// Words never to generate, as text: the server tokenizes them.
    pub bad_words: Vec<String>,
    /// Words never to generate, already as token id sequences.
    pub bad_word_ids: Vec<Vec<u32>>,
    /// Sequences returned.
    pub n: u32,
    /// Sequences generated (>= n); the best `n` by mean logprob are returned.
    pub best_of: u32,
    pub details: bool,
    pub decoder_input_details: bool,
    /// Prepend the prompt text to the generated text.
    pub return_full_text: bool,
    /// Alternatives reported per generated position (0 = none).
    pub top_n_tokens: u32,
    /// vLLM/OpenAI style: number of top logprobs per generated token, None = not requested.
    pub logprobs: Option<u32>,
    /// vLLM style: number of top logprobs per prompt token, None = not requested.
    pub prompt_logprobs: Option<u32>,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    /// Keep only the last `truncate` prompt tokens.
    pub truncate: Option<usize>,
    pub adapter: Option<String>,
    pub stream: bool,
    /// What the output must match (JSON schema, regex, ...), enforced while decoding.
    pub constraint: Option<crate::constraint::Constraint>,
    /// What the client expects the output to be, for speculative decoding (speed only).
    pub draft: Option<Draft>,
    /// Beam search instead of sampling; `n` and `best_of` are then its `num_return`.
    pub beam: Option<BeamSpec>,
    /// Whether the reply reports each generated token's logprob (set by the schema's parser
    /// or route: OpenAI only when `logprobs` is asked). When it does not, and nothing else
    /// needs one (`best_of` ranking, beams, alternatives), sampling skips the log-normalizer.
    pub token_logprobs: bool,
}

/// HF `early_stopping`: `false`, `true` or `"never"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EarlyStop {
    Heuristic,
    Done,
    Never,
}

/// Beam search as HF `generate()` runs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BeamSpec {
    pub width: u32,
    pub length_penalty: f32,
    pub early_stopping: EarlyStop,
    pub num_return: u32,
}

/// Most beams per request.
pub const MAX_BEAMS: i64 = 64;

/// The beam knobs besides the width: `length_penalty` (default 1.0) and `early_stopping`
/// (default false), read from `f`. `num_return` defaults to 1 and must not exceed `width`;
/// beams are greedy, so sampling (`sampling` true) is refused.
pub(crate) fn read_beam(
    f: &crate::fields::Fields,
    width: i64,
    num_return: Option<i64>,
    sampling: bool,
) -> crate::fields::Res<BeamSpec> {
    let num_return = num_return.unwrap_or(1);
    if num_return > width {
        return Err(f.range_err(
            "num_return_sequences",
            format!("must be <= the number of beams ({width}), got {num_return}"),
        ));
    }
    if sampling {
        return Err(crate::error::ApiError::validation(
            "beam search is deterministic: drop do_sample/temperature, or use one beam",
        )
        .with_param(f.path("temperature")));
    }
    let length_penalty = f.f32("length_penalty")?.unwrap_or(1.0);
    if !length_penalty.is_finite() {
        return Err(f.range_err("length_penalty", "must be a finite number"));
    }
    let early_stopping = match f.get("early_stopping") {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => {
            EarlyStop::Heuristic
        }
        Some(serde_json::Value::Bool(true)) => EarlyStop::Done,
        Some(serde_json::Value::String(s)) if s == "never" => EarlyStop::Never,
        Some(v) => return Err(f.type_err("early_stopping", "true, false or \"never\"", v)),
    };
    Ok(BeamSpec {
        width: width as u32,
        length_penalty,
        early_stopping,
        num_return: num_return as u32,
    })
}

/// A client's draft of the output: OpenAI's predicted output (text) or TensorRT-LLM's
/// `draft_input_ids`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Draft {
    Text(String),
    Tokens(Vec<u32>),
}

impl Default for GenerationSpec {
    /// Neutral defaults: greedy, everything off, 30 new tokens (LMI's default).
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_new_tokens: 30,
            max_new_tokens_explicit: false,
            min_new_tokens: 0,
            stop_strings: Vec::new(),
            stop_token_ids: Vec::new(),
            include_stop_str_in_output: false,
            ignore_eos: false,
            no_repeat_ngram_size: 0,
            logit_bias: Vec::new(),
            bad_words: Vec::new(),
            bad_word_ids: Vec::new(),
            n: 1,
            best_of: 1,
            details: false,
            decoder_input_details: false,
            return_full_text: false,
            top_n_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            truncate: None,
            adapter: None,
            stream: false,
            constraint: None,
            draft: None,
            beam: None,
            token_logprobs: true,
        }
    }
}

impl GenerationSpec {
    /// Whether sampling must give each token's logprob: the reply reports it, or `best_of`
    /// ranks sequences by it, or beams score by it.
    pub fn needs_token_logprobs(&self) -> bool {
        self.token_logprobs || self.best_of > self.n || self.beam.is_some() || self.top_n_tokens > 0
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Prompt length after `truncate` (left truncation keeps the last tokens).
    pub fn input_length(&self, prompt_tokens: usize) -> usize {
        match self.truncate {
            Some(t) => prompt_tokens.min(t),
            None => prompt_tokens,
        }
    }

    /// Make `max_new_tokens` fit the context: a default is clamped to what is left (at least 1),
    /// an explicit value that does not fit is TGI's validation error.
    pub fn fit_context(
        &mut self,
        input_length: usize,
        max_total_tokens: usize,
    ) -> Result<(), ApiError> {
        if input_length.saturating_add(self.max_new_tokens) <= max_total_tokens {
            return Ok(());
        }
        if !self.max_new_tokens_explicit && input_length < max_total_tokens {
            self.max_new_tokens = max_total_tokens - input_length;
            return Ok(());
        }
        Err(ApiError::validation(format!(
            "`inputs` tokens + `max_new_tokens` must be <= {max_total_tokens}. Given: {input_length} `inputs` tokens and {} `max_new_tokens`",
            self.max_new_tokens
        ))
        .with_param("max_new_tokens"))
    }
}

/// Merge stop strings keeping first-seen order and dropping duplicates and empty strings.
pub(crate) fn push_unique(into: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for s in items {
        if !s.is_empty() && !into.contains(&s) {
            into.push(s);
        }
    }
}

/// `top_k`, `top_p`, `min_p` and the repetition / presence / frequency penalties, read and
/// range-checked the same way for the LMI and OpenAI schemas.
pub(crate) fn read_filters_and_penalties(
    f: &crate::fields::Fields<'_>,
    spec: &mut GenerationSpec,
) -> crate::fields::Res<()> {
    if let Some(k) = f.i64("top_k")? {
        if k < -1 {
            return Err(f.range_err("top_k", format!("must be >= 0 (or -1 for off), got {k}")));
        }
        spec.top_k = u32::try_from(k.max(0)).unwrap_or(u32::MAX);
    }
    if let Some(p) = f.f32("top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(f.range_err("top_p", format!("must be in (0, 1], got {p}")));
        }
        spec.top_p = p;
    }
    if let Some(p) = f.f32("min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(f.range_err("min_p", format!("must be in [0, 1], got {p}")));
        }
        spec.min_p = p;
    }
    if let Some(p) = f.f32("repetition_penalty")? {
        if p <= 0.0 {
            return Err(f.range_err("repetition_penalty", format!("must be > 0, got {p}")));
        }
        spec.repetition_penalty = p;
    }
    for key in ["presence_penalty", "frequency_penalty"] {
        if let Some(p) = f.f32(key)? {
            if !(-2.0..=2.0).contains(&p) {
                return Err(f.range_err(key, format!("must be in [-2, 2], got {p}")));
            }
            if key == "presence_penalty" {
                spec.presence_penalty = p
            } else {
                spec.frequency_penalty = p
            }
        }
    }
    Ok(())
}
