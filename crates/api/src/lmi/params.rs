//! LMI `parameters` → [`GenerationSpec`]: the common LMI parameters, the vLLM/lmi-dist extras,
//! TensorRT-LLM's controls and TGI's names. Unknown names are ignored and reported.

use crate::error::ApiError;
use crate::fields::{Fields, Res, token_id};
use crate::spec::{GenerationSpec, push_unique};
use serde_json::{Map, Value};

/// Every name this parser understands (anything else is reported as unknown).
pub const KNOWN_PARAMETERS: &[&str] = &[
    // LMI common
    "do_sample",
    "seed",
    "temperature",
    "repetition_penalty",
    "top_k",
    "top_p",
    "max_new_tokens",
    "details",
    "return_full_text",
    "stop_sequences",
    "decoder_input_details",
    // vLLM / lmi-dist
    "typical_p",
    "truncate",
    "ignore_eos_token",
    "ignore_eos",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "n",
    "best_of",
    "num_beams",
    "num_return_sequences",
    "beam_width",
    "length_penalty",
    "early_stopping",
    "use_beam_search",
    "stop_token_ids",
    "include_stop_str_in_output",
    "logprobs",
    "prompt_logprobs",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "top_n_tokens",
    "min_tokens",
    // TensorRT-LLM
    "min_length",
    "bad_sequences",
    "bad_words_list",
    "stop_words_list",
    "no_repeat_ngram_size",
    "logit_bias",
    "embedding_bias",
    "random_seed",
    "draft_input_ids",
    // vLLM guided decoding, as LMI passes it through
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_json_object",
    "guided_decoding_backend",
    // TGI
    "watermark",
    "grammar",
    "adapter_id",
    "stop",
    // LMI per-request options
    "output_formatter",
    "stream",
];

/// Accepted but without effect (beam-search knobs, TGI watermark, `parameters.stream` which LMI
/// overwrites with the top-level `stream`).
const IGNORED: &[&str] = &["watermark", "length_penalty", "early_stopping", "stream"];

/// What the parser noticed besides the spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamReport {
    /// Unknown parameter names (sorted), ignored; the server should log them.
    pub unknown: Vec<String>,
    /// Known names that were present but have no effect here.
    pub ignored: Vec<String>,
    /// `parameters.output_formatter`: LMI's per-request formatter override.
    pub output_formatter: Option<String>,
}

/// Parse LMI parameters. `details_default` is true under `tgi_compat`.
///
/// Greedy rule (LMI RB vLLM `translate_vllm_params`): greedy when `do_sample` is false, or when
/// `do_sample` is absent and `temperature` is absent; otherwise sample at `temperature`
/// (default 1.0). An explicit `temperature: 0` is greedy too.
pub fn parse_parameters(
    params: Option<&Map<String, Value>>,
    details_default: bool,
) -> Res<(GenerationSpec, ParamReport)> {
    let empty = Map::new();
    let f = Fields::new(params.unwrap_or(&empty), "parameters");
    let mut spec = GenerationSpec {
        details: details_default,
        ..GenerationSpec::default()
    };
    let mut report = ParamReport {
        unknown: f.unknown(KNOWN_PARAMETERS),
        ignored: IGNORED
            .iter()
            .filter(|k| f.get(k).is_some())
            .map(|k| k.to_string())
            .collect(),
        output_formatter: f.str("output_formatter")?.map(str::to_string),
    };

    // Sampling.
    let do_sample = f.bool("do_sample")?;
    let temperature = f.f32("temperature")?;
    if let Some(t) = temperature
        && t < 0.0
    {
        return Err(f.range_err("temperature", format!("must be >= 0, got {t}")));
    }
    let greedy = do_sample == Some(false) || (do_sample.is_none() && temperature.is_none());
    spec.temperature = if greedy {
        0.0
    } else {
        temperature.unwrap_or(1.0)
    };
    if let Some(p) = f.f32("typical_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(f.range_err("typical_p", format!("must be in (0, 1], got {p}")));
        }
        spec.typical_p = p;
    }
    crate::spec::read_filters_and_penalties(&f, &mut spec)?;
    spec.seed = match f.first_key(&["seed", "random_seed"]) {
        Some(key) => f.u64(key)?,
        None => None,
    };

    // Lengths.
    if let Some(m) = f.int_in(
        "max_new_tokens",
        1,
        i64::from(u32::MAX),
        "a positive integer",
    )? {
        spec.max_new_tokens = m as usize;
        spec.max_new_tokens_explicit = true;
    }
    if let Some(key) = f.first_key(&["min_length", "min_tokens"])
        && let Some(m) = f.int_in(key, 0, i64::from(u32::MAX), "a non-negative integer")?
    {
        spec.min_new_tokens = m as usize;
    }
    if let Some(t) = f.int_in("truncate", 1, i64::from(u32::MAX), "a positive integer")? {
        spec.truncate = Some(t as usize);
    }

    // Sequences.
    let n = f.int_in("n", 1, 1024, "an integer >= 1")?;
    let best_of = f.int_in("best_of", 1, 1024, "an integer >= 1")?;
    // LMI: best_of without n means n = best_of (all sequences come back).
    spec.n = n.or(best_of).unwrap_or(1) as u32;
    spec.best_of = best_of.map_or(spec.n, |b| b as u32);
    if spec.best_of < spec.n {
        return Err(f.range_err(
            "best_of",
            format!("must be >= n ({}), got {}", spec.n, spec.best_of),
        ));
    }
    // Beam search: HF's num_beams (TensorRT-LLM's beam_width), or vLLM's use_beam_search
    // with best_of beams. One beam is greedy decoding.
    let what = "an integer in [1, 64]";
    let width = match f.first_key(&["num_beams", "beam_width"]) {
        Some(k) => f.int_in(k, 1, crate::spec::MAX_BEAMS, what)?,
        None => None,
    };
    let width = match (width, f.bool("use_beam_search")? == Some(true)) {
        (Some(w), _) => Some(w),
        (None, true) => Some(i64::from(spec.best_of)),
        (None, false) => None,
    };
    if let Some(w) = width.filter(|&w| w > 1) {
        let num_return = match f.int_in("num_return_sequences", 1, crate::spec::MAX_BEAMS, what)? {
            Some(k) => Some(k),
            None => n,
        };
        let b = crate::spec::read_beam(&f, w, num_return, !greedy)?;
        spec.n = b.num_return;
        spec.best_of = b.num_return;
        spec.beam = Some(b);
        report
            .ignored
            .retain(|k| k != "length_penalty" && k != "early_stopping");
    }

    if let Some(ids) = f.ids("draft_input_ids")?
        && !ids.is_empty()
    {
        spec.draft = Some(crate::spec::Draft::Tokens(ids));
    }

    // Stopping.
    if let Some(s) = f.strings("stop_sequences")? {
        push_unique(&mut spec.stop_strings, s);
    }
    // TGI `stop` is a list of strings; TensorRT-LLM's `stop` is a boolean flag with no meaning here.
    match f.get("stop") {
        Some(Value::Bool(_)) => report.ignored.push("stop".into()),
        Some(_) => push_unique(
            &mut spec.stop_strings,
            f.strings("stop")?.unwrap_or_default(),
        ),
        None => {}
    }
    if let Some(v) = f.get("stop_words_list") {
        let (words, ids) = words_or_ids(&f, "stop_words_list", v)?;
        push_unique(&mut spec.stop_strings, words);
        for seq in ids {
            match seq.as_slice() {
                [one] => spec.stop_token_ids.push(*one),
                _ => {
                    return Err(ApiError::not_supported(
                        "parameters.stop_words_list: multi-token id sequences are not supported; give the stop words as strings",
                    )
                    .with_param("parameters.stop_words_list"));
                }
            }
        }
    }
    if let Some(ids) = f.ids("stop_token_ids")? {
        spec.stop_token_ids.extend(ids);
    }
    spec.include_stop_str_in_output = f.bool("include_stop_str_in_output")?.unwrap_or(false);
    spec.ignore_eos = match f.first_key(&["ignore_eos_token", "ignore_eos"]) {
        Some(key) => f.bool(key)?.unwrap_or(false),
        None => false,
    };

    // Logit shaping.
    if let Some(n) = f.int_in(
        "no_repeat_ngram_size",
        0,
        i64::from(u32::MAX),
        "a non-negative integer",
    )? {
        spec.no_repeat_ngram_size = n as u32;
    }
    for key in ["bad_sequences", "bad_words_list"] {
        if let Some(v) = f.get(key) {
            let (words, ids) = words_or_ids(&f, key, v)?;
            push_unique(&mut spec.bad_words, words);
            spec.bad_word_ids.extend(ids);
        }
    }
    for key in ["logit_bias", "embedding_bias"] {
        if let Some(v) = f.get(key) {
            spec.logit_bias.extend(logit_bias(&f, key, v, None)?);
        }
    }

    // Output options.
    spec.details = f.bool("details")?.unwrap_or(spec.details);
    spec.decoder_input_details = f.bool("decoder_input_details")?.unwrap_or(false);
    spec.return_full_text = f.bool("return_full_text")?.unwrap_or(false);
    if let Some(t) = f.int_in("top_n_tokens", 0, 1024, "a non-negative integer")? {
        spec.top_n_tokens = t as u32;
    }
    spec.logprobs = f
        .int_in("logprobs", 0, 1024, "a non-negative integer")?
        .map(|v| v as u32);
    spec.prompt_logprobs = f
        .int_in("prompt_logprobs", 0, 1024, "a non-negative integer")?
        .map(|v| v as u32);
    spec.skip_special_tokens = f.bool("skip_special_tokens")?.unwrap_or(true);
    spec.spaces_between_special_tokens = f.bool("spaces_between_special_tokens")?.unwrap_or(true);
    spec.adapter = f
        .str("adapter_id")?
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    f.bool("watermark")?; // TGI's watermark: type-checked, then ignored
    // TGI's `grammar` or vLLM's `guided_*`, one of them.
    let grammar = match f.get("grammar") {
        Some(g) => crate::constraint::response_format(g, "parameters.grammar")?,
        None => None,
    };
    let guided = crate::constraint::guided(&f)?;
    if grammar.is_some() && guided.is_some() {
        return Err(ApiError::validation(
            "parameters.grammar and guided_* both constrain the output: send one of them",
        )
        .with_param("parameters.grammar"));
    }
    spec.constraint = grammar.or(guided);
    f.str("guided_decoding_backend")?;
    Ok((spec, report))
}

/// A list whose items are strings (words) or arrays of token ids; a bare string is one word.
pub(crate) fn words_or_ids(f: &Fields, key: &str, v: &Value) -> Res<(Vec<String>, Vec<Vec<u32>>)> {
    let mut words = Vec::new();
    let mut ids = Vec::new();
    match v {
        Value::String(s) => words.push(s.clone()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => words.push(s.clone()),
                    Value::Array(seq) => ids.push(
                        seq.iter()
                            .map(|t| token_id(t).ok_or_else(|| f.id_err(&format!("{key}[{i}]"), t)))
                            .collect::<Res<Vec<_>>>()?,
                    ),
                    other => {
                        return Err(f.type_err(
                            &format!("{key}[{i}]"),
                            "a string or an array of token ids",
                            other,
                        ));
                    }
                }
            }
        }
        other => return Err(f.type_err(key, "an array of strings", other)),
    }
    Ok((words, ids))
}

/// `{"<id>": bias}` (OpenAI), `[[id, bias], ...]`, or a dense per-vocabulary vector
/// (TensorRT-LLM `embedding_bias`, zeros skipped). `limit` bounds |bias| (OpenAI: 100).
pub(crate) fn logit_bias(
    f: &Fields,
    key: &str,
    v: &Value,
    limit: Option<f32>,
) -> Res<Vec<(u32, f32)>> {
    let mut out = Vec::new();
    let bad_value = |k: &str, b: &Value| f.type_err(&format!("{key}.{k}"), "a number", b);
    match v {
        Value::Object(map) => {
            for (k, b) in map {
                let id: u32 = k.trim().parse().map_err(|_| {
                    f.range_err(key, format!("keys must be token ids, got \"{k}\""))
                })?;
                let b = b.as_f64().ok_or_else(|| bad_value(k, b))? as f32;
                out.push((id, b));
            }
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            for (i, b) in items.iter().enumerate() {
                let b = b.as_f64().unwrap_or(0.0) as f32;
                if b != 0.0 {
                    out.push((i as u32, b));
                }
            }
        }
        Value::Array(items) => {
            for (i, pair) in items.iter().enumerate() {
                let parsed = pair.as_array().and_then(|p| match p.as_slice() {
                    [id, b] => Some((token_id(id)?, b.as_f64()? as f32)),
                    _ => None,
                });
                out.push(parsed.ok_or_else(|| {
                    f.type_err(&format!("{key}[{i}]"), "a [token_id, bias] pair", pair)
                })?);
            }
        }
        other => return Err(f.type_err(key, "an object mapping token ids to biases", other)),
    }
    if let Some(limit) = limit
        && let Some((id, b)) = out.iter().find(|(_, b)| b.abs() > limit)
    {
        return Err(f.range_err(
            key,
            format!("values must be in [-{limit}, {limit}], got {b} for token {id}"),
        ));
    }
    Ok(out)
}
