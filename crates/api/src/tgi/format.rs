//! TGI response bodies and SSE events (`router/src/lib.rs` field order, compact serde JSON).

use crate::error::compact;
use crate::output::{GenerationOut, SequenceOut, TokenOut, finite};
use crate::spec::GenerationSpec;
use serde::Serialize;

#[derive(Serialize)]
struct Token<'a> {
    id: u32,
    text: &'a str,
    logprob: Option<f32>,
    special: bool,
}

impl<'a> From<&'a TokenOut> for Token<'a> {
    fn from(t: &'a TokenOut) -> Self {
        Self {
            id: t.id,
            text: &t.text,
            logprob: finite(t.logprob),
            special: t.special,
        }
    }
}

#[derive(Serialize)]
struct PrefillToken<'a> {
    id: u32,
    text: &'a str,
    logprob: Option<f32>,
}

impl<'a> From<&'a TokenOut> for PrefillToken<'a> {
    fn from(t: &'a TokenOut) -> Self {
        Self {
            id: t.id,
            text: &t.text,
            logprob: finite(t.logprob),
        }
    }
}

#[derive(Serialize)]
struct BestOfSequence<'a> {
    generated_text: String,
    finish_reason: &'static str,
    generated_tokens: usize,
    seed: Option<u64>,
    prefill: Vec<PrefillToken<'a>>,
    tokens: Vec<Token<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    top_tokens: Vec<Vec<Token<'a>>>,
}

#[derive(Serialize)]
struct Details<'a> {
    finish_reason: &'static str,
    generated_tokens: usize,
    seed: Option<u64>,
    prefill: Vec<PrefillToken<'a>>,
    tokens: Vec<Token<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    best_of_sequences: Option<Vec<BestOfSequence<'a>>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    top_tokens: Vec<Vec<Token<'a>>>,
}

#[derive(Serialize)]
struct GenerateResponse<'a> {
    generated_text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details<'a>>,
}

fn text(out: &GenerationOut, seq: &SequenceOut, spec: &GenerationSpec) -> String {
    if spec.return_full_text {
        format!("{}{}", out.inputs, seq.text)
    } else {
        seq.text.clone()
    }
}

fn tokens(t: &[TokenOut]) -> Vec<Token<'_>> {
    t.iter().map(Token::from).collect()
}

fn top_tokens<'a>(seq: &'a SequenceOut, spec: &GenerationSpec) -> Vec<Vec<Token<'a>>> {
    if spec.top_n_tokens == 0 {
        Vec::new()
    } else {
        seq.top_tokens.iter().map(|p| tokens(p)).collect()
    }
}

fn prefill<'a>(out: &'a GenerationOut, spec: &GenerationSpec) -> Vec<PrefillToken<'a>> {
    // Filled only with decoder_input_details; otherwise TGI sends [].
    if spec.decoder_input_details {
        out.prefill.iter().map(PrefillToken::from).collect()
    } else {
        Vec::new()
    }
}

fn response<'a>(out: &'a GenerationOut, spec: &GenerationSpec) -> GenerateResponse<'a> {
    let best = &out.best;
    let details = (spec.details || spec.decoder_input_details).then(|| Details {
        finish_reason: best.finish_reason.as_tgi(),
        generated_tokens: best.generated_tokens,
        seed: best.seed,
        prefill: prefill(out, spec),
        tokens: tokens(&best.tokens),
        best_of_sequences: (!out.others.is_empty()).then(|| {
            out.others
                .iter()
                .map(|s| BestOfSequence {
                    generated_text: text(out, s, spec),
                    finish_reason: s.finish_reason.as_tgi(),
                    generated_tokens: s.generated_tokens,
                    seed: s.seed,
                    prefill: prefill(out, spec),
                    tokens: tokens(&s.tokens),
                    top_tokens: top_tokens(s, spec),
                })
                .collect()
        }),
        top_tokens: top_tokens(best, spec),
    });
    GenerateResponse {
        generated_text: text(out, best, spec),
        details,
    }
}

/// `POST /generate` body: `{"generated_text", "details"?}`.
pub fn generate_response(out: &GenerationOut, spec: &GenerationSpec) -> String {
    compact(&response(out, spec))
}

/// `POST /` (non-streaming) body: an array of one GenerateResponse.
pub fn compat_response(out: &GenerationOut, spec: &GenerationSpec) -> String {
    compact(&[response(out, spec)])
}

#[derive(Serialize)]
struct StreamDetails {
    finish_reason: &'static str,
    generated_tokens: usize,
    seed: Option<u64>,
    input_length: usize,
}

#[derive(Serialize)]
struct StreamResponse<'a> {
    index: u32,
    token: Token<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    top_tokens: Vec<Token<'a>>,
    generated_text: Option<String>,
    details: Option<StreamDetails>,
}

/// One StreamResponse JSON. `index` is 1-based; `top` are this position's alternatives (sent only
/// when top_n_tokens > 0); `last` is the finished result on the final event, None before it.
pub fn stream_response(
    index: u32,
    token: &TokenOut,
    top: &[TokenOut],
    last: Option<&GenerationOut>,
    spec: &GenerationSpec,
) -> String {
    let top_tokens = if spec.top_n_tokens > 0 {
        tokens(top)
    } else {
        Vec::new()
    };
    compact(&StreamResponse {
        index,
        token: token.into(),
        top_tokens,
        generated_text: last.map(|o| text(o, &o.best, spec)),
        details: last.filter(|_| spec.details).map(|o| StreamDetails {
            finish_reason: o.best.finish_reason.as_tgi(),
            generated_tokens: o.best.generated_tokens,
            seed: o.best.seed,
            input_length: o.prompt_tokens,
        }),
    })
}

/// The SSE event for [`stream_response`]: `data: {json}\n\n`. TGI routes never send `[DONE]`.
pub fn stream_event(
    index: u32,
    token: &TokenOut,
    top: &[TokenOut],
    last: Option<&GenerationOut>,
    spec: &GenerationSpec,
) -> String {
    crate::sse::data(&stream_response(index, token, top, last, spec))
}

/// One token of a `/tokenize` answer (`start`/`stop` are character offsets in the input).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenSpan {
    pub id: u32,
    pub text: String,
    pub start: usize,
    pub stop: usize,
}

/// `POST /tokenize` body: `[{"id","text","start","stop"}, ...]`.
pub fn tokenize_response(spans: &[TokenSpan]) -> String {
    compact(&spans)
}
