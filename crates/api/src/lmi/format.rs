//! LMI rolling-batch output formatters (`json`, `jsonlines`, `sse`, `tgi_compat`) and the
//! dynamic-batch shapes. Python separators and float32-widened logprobs reproduce LMI's bytes.

use crate::output::{GenerationOut, SequenceOut, TokenOut, widen};
use crate::pyjson;
use crate::spec::GenerationSpec;
use serde::Serialize;

fn is_false(b: &bool) -> bool {
    !*b
}

/// LMI token: `{"id","text","log_prob"}` plus `"special_token": true` only when true.
#[derive(Serialize)]
struct LmiToken<'a> {
    id: u32,
    text: &'a str,
    log_prob: Option<f64>,
    #[serde(skip_serializing_if = "is_false")]
    special_token: bool,
}

impl<'a> From<&'a TokenOut> for LmiToken<'a> {
    fn from(t: &'a TokenOut) -> Self {
        Self {
            id: t.id,
            text: &t.text,
            log_prob: widen(t.logprob),
            special_token: t.special,
        }
    }
}

/// TGI-named token for `tgi_compat`: `special` is always written (TGI's clients require it,
/// although LMI itself omits it when false).
#[derive(Serialize)]
struct CompatToken<'a> {
    id: u32,
    text: &'a str,
    logprob: Option<f64>,
    special: bool,
}

impl<'a> From<&'a TokenOut> for CompatToken<'a> {
    fn from(t: &'a TokenOut) -> Self {
        Self {
            id: t.id,
            text: &t.text,
            logprob: widen(t.logprob),
            special: t.special,
        }
    }
}

#[derive(Serialize)]
struct BestOf<T> {
    finish_reason: &'static str,
    generated_tokens: usize,
    tokens: Vec<T>,
    generated_text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefill: Option<Vec<T>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_tokens: Option<Vec<Vec<T>>>,
}

#[derive(Serialize)]
struct Details<'a, T> {
    finish_reason: &'static str,
    generated_tokens: usize,
    inputs: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<Vec<T>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefill: Option<Vec<T>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_tokens: Option<Vec<Vec<T>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    best_of_sequences: Option<Vec<BestOf<T>>>,
}

#[derive(Serialize)]
struct Json<'a, T> {
    generated_text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a, T>>,
}

fn full_text(out: &GenerationOut, seq: &SequenceOut, spec: &GenerationSpec) -> String {
    if spec.return_full_text {
        format!("{}{}", out.inputs, seq.text)
    } else {
        seq.text.clone()
    }
}

fn conv<'a, T: From<&'a TokenOut>>(tokens: &'a [TokenOut]) -> Vec<T> {
    tokens.iter().map(T::from).collect()
}

fn top<'a, T: From<&'a TokenOut>>(
    seq: &'a SequenceOut,
    spec: &GenerationSpec,
) -> Option<Vec<Vec<T>>> {
    (spec.top_n_tokens > 0).then(|| seq.top_tokens.iter().map(|p| conv(p)).collect())
}

/// `details` for non-streaming output (with tokens) or for the last stream line (without).
fn details<'a, T: From<&'a TokenOut>>(
    out: &'a GenerationOut,
    spec: &GenerationSpec,
    with_tokens: bool,
    prefill_always: bool,
) -> Details<'a, T> {
    let best = &out.best;
    let multi = !out.others.is_empty();
    Details {
        finish_reason: best.finish_reason.as_lmi(),
        generated_tokens: best.generated_tokens,
        inputs: &out.inputs,
        tokens: with_tokens.then(|| conv(&best.tokens)),
        prefill: (spec.decoder_input_details || prefill_always).then(|| conv(&out.prefill)),
        top_tokens: if with_tokens { top(best, spec) } else { None },
        best_of_sequences: (with_tokens && multi).then(|| {
            out.others
                .iter()
                .map(|s| BestOf {
                    finish_reason: s.finish_reason.as_lmi(),
                    generated_tokens: s.generated_tokens,
                    tokens: conv(&s.tokens),
                    generated_text: full_text(out, s, spec),
                    prefill: spec.decoder_input_details.then(|| conv(&out.prefill)),
                    top_tokens: top(s, spec),
                })
                .collect()
        }),
    }
}

/// `application/json` body: `{"generated_text": ..., "details"?: {...}}`. `details` appears when
/// asked for, and always when other sequences exist (n/best_of > 1).
pub fn json(out: &GenerationOut, spec: &GenerationSpec) -> String {
    let with_details = spec.details || !out.others.is_empty();
    pyjson::to_string(&Json::<LmiToken> {
        generated_text: full_text(out, &out.best, spec),
        details: with_details.then(|| details(out, spec, true, false)),
    })
}

/// `tgi_compat` non-streaming body: the json object in a one-element array, TGI token names,
/// `prefill` always present (TGI's client requires it).
pub fn tgi_compat_json(out: &GenerationOut, spec: &GenerationSpec) -> String {
    let with_details = spec.details || !out.others.is_empty();
    let body = Json::<CompatToken> {
        generated_text: full_text(out, &out.best, spec),
        details: with_details.then(|| details(out, spec, true, true)),
    };
    pyjson::to_string(&[body])
}

#[derive(Serialize)]
struct Line<'a, T> {
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generated_text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a, T>>,
}

/// One intermediate `application/jsonlines` line: `{"token": {...}}\n`.
pub fn jsonlines_token(token: &TokenOut) -> String {
    let line = Line::<LmiToken> {
        token: Some(token.into()),
        generated_text: None,
        details: None,
    };
    format!("{}\n", pyjson::to_string(&line))
}

/// The last jsonlines line: the last generated token plus `generated_text` and, when details
/// were asked for, `details` without the token list (`prefill` with decoder_input_details).
pub fn jsonlines_last(out: &GenerationOut, spec: &GenerationSpec) -> String {
    let line = Line::<LmiToken> {
        token: out.best.tokens.last().map(LmiToken::from),
        generated_text: Some(full_text(out, &out.best, spec)),
        details: spec.details.then(|| details(out, spec, false, false)),
    };
    format!("{}\n", pyjson::to_string(&line))
}

/// LMI `sse` framing of a jsonlines object: `data: <json>\n\n`.
fn sse_frame(line: &str) -> String {
    crate::sse::data(line.trim_end_matches('\n'))
}

/// One intermediate `text/event-stream` event (LMI `output_formatter=sse`).
pub fn sse_token(token: &TokenOut) -> String {
    sse_frame(&jsonlines_token(token))
}

/// The last `text/event-stream` event (LMI `output_formatter=sse`). No `[DONE]` follows.
pub fn sse_last(out: &GenerationOut, spec: &GenerationSpec) -> String {
    sse_frame(&jsonlines_last(out, spec))
}

/// Dynamic-batch response: one `{"generated_text"}` per input, in input order, pretty-printed
/// with indent 2 as LMI's Java side writes it.
pub fn dynamic_batch_json<S: AsRef<str>>(texts: &[S]) -> String {
    #[derive(Serialize)]
    struct Item<'a> {
        generated_text: &'a str,
    }
    let items: Vec<Item> = texts
        .iter()
        .map(|t| Item {
            generated_text: t.as_ref(),
        })
        .collect();
    serde_json::to_string_pretty(&items).unwrap_or_default()
}

/// Dynamic-batch generated texts of several results, honouring `return_full_text`.
pub fn dynamic_batch_texts(outs: &[GenerationOut], spec: &GenerationSpec) -> Vec<String> {
    outs.iter().map(|o| full_text(o, &o.best, spec)).collect()
}

/// Dynamic-batch streaming line `{"outputs": ["tok", ...]}\n` (one text per input).
pub fn dynamic_batch_stream_line<S: AsRef<str>>(outputs: &[S]) -> String {
    #[derive(Serialize)]
    struct Line<'a> {
        outputs: Vec<&'a str>,
    }
    let line = Line {
        outputs: outputs.iter().map(AsRef::as_ref).collect(),
    };
    format!("{}\n", pyjson::to_string(&line))
}

/// `tgi_compat` streaming: TGI's own StreamResponse events (see [`crate::tgi::format::stream_event`]),
/// which the HF clients parse; LMI's variant (LMI keys, `special` omitted) breaks them.
pub use crate::tgi::format::stream_event as tgi_compat_stream_event;

#[derive(Serialize)]
struct ErrorToken<'a> {
    id: i32,
    text: &'a str,
    log_prob: i32,
    special_token: bool,
    /// LMI's Token carries the message on error; the seed's example leaves it out.
    error_msg: &'a str,
}

#[derive(Serialize)]
struct ErrorDetails {
    finish_reason: &'static str,
    generated_tokens: Option<usize>,
    inputs: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<Option<()>>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<ErrorToken<'a>>,
    generated_text: &'a str,
    details: ErrorDetails,
}

/// Seed 001's in-band error result for a non-streaming request that failed during generation:
/// `{"generated_text": "", "details": {"finish_reason": "error", "generated_tokens": null,
/// "inputs": null, "tokens": null}}`. Current LMI sends [`crate::ApiError::lmi_body`] with HTTP 424
/// instead; the server picks one.
pub fn error_json() -> String {
    pyjson::to_string(&ErrorBody {
        token: None,
        generated_text: "",
        details: ErrorDetails {
            finish_reason: "error",
            generated_tokens: None,
            inputs: None,
            tokens: Some(None),
        },
    })
}

/// Seed 001's last jsonlines line for a stream that failed after the 200 went out: a token with
/// id -1 and `details.finish_reason: "error"`, so line-oriented clients see the failure.
pub fn error_line(message: &str) -> String {
    let body = ErrorBody {
        token: Some(ErrorToken {
            id: -1,
            text: "",
            log_prob: -1,
            special_token: true,
            error_msg: message,
        }),
        generated_text: "",
        details: ErrorDetails {
            finish_reason: "error",
            generated_tokens: None,
            inputs: None,
            tokens: None,
        },
    };
    format!("{}\n", pyjson::to_string(&body))
}

/// [`error_line`] framed as an SSE event (a raw line would be ignored by SSE clients).
pub fn sse_error(message: &str) -> String {
    sse_frame(&error_line(message))
}
