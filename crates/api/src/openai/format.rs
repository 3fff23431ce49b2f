//! OpenAI response bodies and stream chunks (chat.completion, chat.completion.chunk,
//! text_completion, /v1/models). Streams end with `data: [DONE]` ([`crate::sse::DONE`]).

use crate::error::compact;
use crate::output::{FinishReason, GenerationOut, SequenceOut, TokenOut, TopTokens, finite};
use crate::spec::GenerationSpec;
use serde::Serialize;
use serde_json::{Map, Value};

/// Per-response identity the server chooses.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiMeta {
    /// e.g. "chatcmpl-<uuid>" / "cmpl-<uuid>".
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub system_fingerprint: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// Present when the request carried a `prediction` or the reply was read for reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionDetails>,
}

/// OpenAI's `usage.completion_tokens_details`: for predicted outputs, draft tokens that were
/// (and were not) kept in the output; for reasoning models, the tokens of the reasoning
/// (counted in `completion_tokens` too, as OpenAI and vLLM count them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CompletionDetails {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_prediction_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected_prediction_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<usize>,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens_details: None,
        }
    }

    /// Adds the prediction counts when the request had a draft.
    pub fn with_predictions(
        mut self,
        spec: &GenerationSpec,
        accepted: usize,
        rejected: usize,
    ) -> Self {
        if spec.draft.is_some() {
            let d = self.completion_tokens_details.get_or_insert_default();
            d.accepted_prediction_tokens = Some(accepted);
            d.rejected_prediction_tokens = Some(rejected);
        }
        self
    }

    /// Adds the reasoning token count when the reply was read for reasoning.
    pub fn with_reasoning(mut self, reasoning_tokens: Option<usize>) -> Self {
        if let Some(n) = reasoning_tokens {
            self.completion_tokens_details
                .get_or_insert_default()
                .reasoning_tokens = Some(n);
        }
        self
    }

    /// [`Usage::of`] with the prediction counts of `outs` when the request had a draft.
    pub fn of_request(outs: &[&GenerationOut], spec: &GenerationSpec) -> Self {
        let seqs = || outs.iter().flat_map(|o| o.sequences());
        Self::of(outs).with_predictions(
            spec,
            seqs().map(|s| s.accepted_draft_tokens).sum(),
            seqs().map(|s| s.rejected_draft_tokens).sum(),
        )
    }
    /// Usage of finished results (all prompts, all sequences).
    pub fn of(outs: &[&GenerationOut]) -> Self {
        Self::new(
            outs.iter().map(|o| o.prompt_tokens).sum(),
            outs.iter().map(|o| o.completion_tokens()).sum(),
        )
    }
}

#[derive(Serialize)]
struct TopLogprob<'a> {
    token: &'a str,
    logprob: f32,
    bytes: Vec<u8>,
}

#[derive(Serialize)]
struct TokenLogprob<'a> {
    token: &'a str,
    logprob: f32,
    bytes: Vec<u8>,
    top_logprobs: Vec<TopLogprob<'a>>,
}

#[derive(Serialize)]
struct ChatLogprobs<'a> {
    content: Vec<TokenLogprob<'a>>,
}

fn lp(t: &TokenOut) -> f32 {
    // OpenAI's logprob is not nullable; an unknown one reads as certain.
    finite(t.logprob).unwrap_or(0.0)
}

fn token_logprob<'a>(
    t: &'a TokenOut,
    top: Option<&'a Vec<TokenOut>>,
    k: usize,
) -> TokenLogprob<'a> {
    TokenLogprob {
        token: &t.text,
        logprob: lp(t),
        bytes: t.text.as_bytes().to_vec(),
        top_logprobs: top
            .map(|alts| {
                alts.iter()
                    .take(k)
                    .map(|a| TopLogprob {
                        token: &a.text,
                        logprob: lp(a),
                        bytes: a.text.as_bytes().to_vec(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn chat_logprobs<'a>(seq: &'a SequenceOut, spec: &GenerationSpec) -> Option<ChatLogprobs<'a>> {
    let k = spec.logprobs? as usize;
    Some(ChatLogprobs {
        content: seq
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| token_logprob(t, seq.top_tokens.get(i), k))
            .collect(),
    })
}

#[derive(Serialize)]
struct AssistantMessage<'a> {
    role: &'static str,
    /// null when the turn is only tool calls.
    content: Option<&'a str>,
    /// The reasoning, apart from the answer (DeepSeek's and vLLM's field).
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallJson<'a>>>,
}

/// A tool call the server found in (or forced on) a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallOut {
    /// `call_<24 hex digits>`, unique per call.
    pub id: String,
    pub name: String,
    /// The arguments object as JSON text, as OpenAI sends it.
    pub arguments: String,
}

/// An assistant reply read for tool calls and reasoning: the answer outside the calls, the
/// calls, and the reasoning (`None` when the reply had none or was not read for it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatTurn {
    pub content: String,
    pub tool_calls: Vec<ToolCallOut>,
    pub reasoning: Option<String>,
}

#[derive(Serialize)]
struct FunctionJson<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct ToolCallJson<'a> {
    /// Position in the turn's calls; only in stream deltas.
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionJson<'a>,
}

impl ToolCallOut {
    fn json(&self, index: Option<usize>) -> ToolCallJson<'_> {
        ToolCallJson {
            index,
            id: &self.id,
            kind: "function",
            function: FunctionJson {
                name: &self.name,
                arguments: &self.arguments,
            },
        }
    }
}

/// OpenAI's finish reason for a choice that may have called tools.
fn finish_with_calls(reason: FinishReason, called: bool) -> &'static str {
    if called && reason != FinishReason::Length {
        "tool_calls"
    } else {
        reason.as_openai()
    }
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: usize,
    message: AssistantMessage<'a>,
    logprobs: Option<ChatLogprobs<'a>>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct Envelope<'a, C> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_fingerprint: Option<&'a str>,
    choices: Vec<C>,
    /// Omitted on chunks unless include_usage asked for it (then null until the usage chunk).
    #[serde(skip_serializing_if = "UsageField::is_omitted")]
    usage: UsageField,
}

#[derive(Serialize)]
#[serde(untagged)]
enum UsageField {
    Omitted,
    Null(Option<()>),
    Some(Usage),
}

impl UsageField {
    fn is_omitted(&self) -> bool {
        matches!(self, Self::Omitted)
    }
}

fn envelope<'a, C>(
    meta: &'a OpenAiMeta,
    object: &'static str,
    choices: Vec<C>,
    usage: UsageField,
) -> Envelope<'a, C> {
    Envelope {
        id: &meta.id,
        object,
        created: meta.created,
        model: &meta.model,
        system_fingerprint: meta.system_fingerprint.as_deref(),
        choices,
        usage,
    }
}

/// Non-streaming `chat.completion`: one choice per sequence (best first), finish_reason
/// "stop" for EOS and stop sequences, "length" for length.
pub fn chat_completion(meta: &OpenAiMeta, out: &GenerationOut, spec: &GenerationSpec) -> String {
    chat_completion_with_tools(meta, out, spec, &[])
}

/// [`chat_completion`] where `turns[i]`, when present, is sequence `i` read for tool calls:
/// its calls go in `message.tool_calls` (content null when nothing else was said) and the
/// finish reason becomes "tool_calls" unless the length ran out.
pub fn chat_completion_with_tools(
    meta: &OpenAiMeta,
    out: &GenerationOut,
    spec: &GenerationSpec,
    turns: &[ChatTurn],
) -> String {
    chat_completion_read(meta, out, spec, turns, None)
}

/// [`chat_completion_with_tools`] where the replies were also read for reasoning:
/// `message.reasoning_content` from each turn, and `reasoning_tokens` (over all choices) in
/// `usage.completion_tokens_details`.
pub fn chat_completion_read(
    meta: &OpenAiMeta,
    out: &GenerationOut,
    spec: &GenerationSpec,
    turns: &[ChatTurn],
    reasoning_tokens: Option<usize>,
) -> String {
    let choices = out
        .sequences()
        .enumerate()
        .map(|(index, s)| {
            let turn = turns.get(index);
            let calls = turn.filter(|t| !t.tool_calls.is_empty());
            let content = match (turn, calls) {
                (Some(t), Some(_)) if t.content.is_empty() => None,
                (Some(t), _) => Some(t.content.as_str()),
                (None, _) => Some(s.text.as_str()),
            };
            ChatChoice {
                index,
                message: AssistantMessage {
                    role: "assistant",
                    content,
                    reasoning_content: turn.and_then(|t| t.reasoning.as_deref()),
                    tool_calls: calls.map(|t| t.tool_calls.iter().map(|c| c.json(None)).collect()),
                },
                logprobs: chat_logprobs(s, spec),
                finish_reason: finish_with_calls(s.finish_reason, calls.is_some()),
            }
        })
        .collect();
    compact(&envelope(
        meta,
        "chat.completion",
        choices,
        UsageField::Some(Usage::of_request(&[out], spec).with_reasoning(reasoning_tokens)),
    ))
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallJson<'a>>>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: usize,
    delta: Delta<'a>,
    logprobs: Option<ChatLogprobs<'a>>,
    finish_reason: Option<&'static str>,
}

fn chunk_usage(include_usage: bool) -> UsageField {
    if include_usage {
        UsageField::Null(None)
    } else {
        UsageField::Omitted
    }
}

/// First chunk of choice `index`: `delta: {"role":"assistant","content":""}`.
pub fn chat_chunk_role(meta: &OpenAiMeta, index: usize, include_usage: bool) -> String {
    let choice = ChunkChoice {
        index,
        delta: Delta {
            role: Some("assistant"),
            content: Some(""),
            reasoning_content: None,
            tool_calls: None,
        },
        logprobs: None,
        finish_reason: None,
    };
    compact(&envelope(
        meta,
        "chat.completion.chunk",
        vec![choice],
        chunk_usage(include_usage),
    ))
}

/// A token chunk of choice `index`; `finish` is set on the last token of that choice. Special
/// tokens contribute `""` when `skip_special_tokens` (TGI does the same for EOS).
pub fn chat_chunk_token(
    meta: &OpenAiMeta,
    index: usize,
    token: &TokenOut,
    top: &[TokenOut],
    finish: Option<FinishReason>,
    spec: &GenerationSpec,
    include_usage: bool,
) -> String {
    let text = if token.special && spec.skip_special_tokens {
        ""
    } else {
        token.text.as_str()
    };
    let top = top.to_vec();
    let logprobs = spec.logprobs.map(|k| ChatLogprobs {
        content: vec![token_logprob(token, Some(&top), k as usize)],
    });
    let choice = ChunkChoice {
        index,
        delta: Delta {
            role: None,
            content: Some(text),
            reasoning_content: None,
            tool_calls: None,
        },
        logprobs,
        finish_reason: finish.map(FinishReason::as_openai),
    };
    compact(&envelope(
        meta,
        "chat.completion.chunk",
        vec![choice],
        chunk_usage(include_usage),
    ))
}

/// A chunk with an empty delta that only carries the finish reason (when the last step
/// produced no text, e.g. a stop string cut from the output).
pub fn chat_chunk_finish(
    meta: &OpenAiMeta,
    index: usize,
    finish: FinishReason,
    include_usage: bool,
) -> String {
    let choice = ChunkChoice {
        index,
        delta: Delta {
            role: None,
            content: None,
            reasoning_content: None,
            tool_calls: None,
        },
        logprobs: None,
        finish_reason: Some(finish.as_openai()),
    };
    compact(&envelope(
        meta,
        "chat.completion.chunk",
        vec![choice],
        chunk_usage(include_usage),
    ))
}

/// What one chunk of a choice whose reply is read for tool calls carries.
pub enum ToolDelta<'a> {
    Content(&'a str),
    /// Reasoning text (`delta.reasoning_content`).
    Reasoning(&'a str),
    /// The call at position `index` of the turn, whole (name and all its arguments).
    Call(usize, &'a ToolCallOut),
    /// Nothing but the finish reason.
    Finish,
}

/// A chunk of choice `index` when tool calls are read from the reply: content as the parser
/// releases it, each call as one `tool_calls` delta. `tokens` are the generated tokens since
/// the previous chunk, for `logprobs`; `finish` is set on the choice's last chunk, with
/// `called` telling whether the choice made calls.
#[allow(clippy::too_many_arguments)]
pub fn chat_chunk_tool_delta(
    meta: &OpenAiMeta,
    index: usize,
    delta: ToolDelta<'_>,
    tokens: &[(TokenOut, Vec<TokenOut>)],
    finish: Option<(FinishReason, bool)>,
    spec: &GenerationSpec,
    include_usage: bool,
) -> String {
    let (content, reasoning_content, tool_calls) = match delta {
        ToolDelta::Content(t) => (Some(t), None, None),
        ToolDelta::Reasoning(t) => (None, Some(t), None),
        ToolDelta::Call(i, c) => (None, None, Some(vec![c.json(Some(i))])),
        ToolDelta::Finish => (None, None, None),
    };
    let logprobs = spec
        .logprobs
        .filter(|_| !tokens.is_empty())
        .map(|k| ChatLogprobs {
            content: tokens
                .iter()
                .map(|(t, top)| token_logprob(t, Some(top), k as usize))
                .collect(),
        });
    let choice = ChunkChoice {
        index,
        delta: Delta {
            role: None,
            content,
            reasoning_content,
            tool_calls,
        },
        logprobs,
        finish_reason: finish.map(|(r, called)| finish_with_calls(r, called)),
    };
    compact(&envelope(
        meta,
        "chat.completion.chunk",
        vec![choice],
        chunk_usage(include_usage),
    ))
}

/// The extra usage chunk sent after the last choice chunk when include_usage: `choices: []`.
pub fn chat_chunk_usage(meta: &OpenAiMeta, usage: Usage) -> String {
    compact(&envelope::<ChunkChoice>(
        meta,
        "chat.completion.chunk",
        Vec::new(),
        UsageField::Some(usage),
    ))
}

#[derive(Serialize)]
struct CompletionLogprobs<'a> {
    tokens: Vec<&'a str>,
    /// null for the first prompt token (nothing precedes it). Widened to f64 as the
    /// alternatives are, so that a token's logprob and the same token among its alternatives
    /// print the same (lm-eval compares them to tell a greedy continuation).
    token_logprobs: Vec<Option<f64>>,
    top_logprobs: Vec<Option<Map<String, Value>>>,
    text_offset: Vec<usize>,
}

/// Tokens for a completion choice's `logprobs`: the tokens, their alternatives by position
/// (a missing entry reads as none), and the text offset of the first token.
#[derive(Debug, Clone, Copy)]
pub struct TokenRun<'a> {
    pub tokens: &'a [TokenOut],
    pub top: &'a [TopTokens],
    pub offset: usize,
}

/// OpenAI's legacy `logprobs` over `runs` in order (echoed prompt, then generated tokens); a
/// token without a logprob (the prompt's first) has null for its logprob and alternatives.
fn completion_logprobs<'a>(runs: &[TokenRun<'a>], k: usize) -> CompletionLogprobs<'a> {
    let mut out = CompletionLogprobs {
        tokens: Vec::new(),
        token_logprobs: Vec::new(),
        top_logprobs: Vec::new(),
        text_offset: Vec::new(),
    };
    for run in runs {
        let mut offset = run.offset;
        for (i, t) in run.tokens.iter().enumerate() {
            out.tokens.push(&t.text);
            out.text_offset.push(offset);
            offset += t.text.len();
            let logprob = finite(t.logprob).map(f64::from);
            out.token_logprobs.push(logprob);
            out.top_logprobs.push(logprob.map(|_| {
                run.top
                    .get(i)
                    .map(|alts| {
                        alts.iter()
                            .take(k)
                            .map(|a| (a.text.clone(), Value::from(f64::from(lp(a)))))
                            .collect()
                    })
                    .unwrap_or_default()
            }));
        }
    }
    out
}

#[derive(Serialize)]
struct CompletionChoice<'a> {
    index: usize,
    text: String,
    logprobs: Option<CompletionLogprobs<'a>>,
    finish_reason: Option<&'static str>,
}

/// Non-streaming `text_completion` for all prompts: choice index = prompt index * n + sequence.
pub fn text_completion(meta: &OpenAiMeta, outs: &[GenerationOut], spec: &GenerationSpec) -> String {
    let n = spec.n.max(1) as usize;
    let mut choices = Vec::new();
    for (p, out) in outs.iter().enumerate() {
        for (i, s) in out.sequences().enumerate() {
            let (text, offset0) = if spec.return_full_text {
                (format!("{}{}", out.inputs, s.text), out.inputs.len())
            } else {
                (s.text.clone(), 0)
            };
            let generated = TokenRun {
                tokens: &s.tokens,
                top: &s.top_tokens,
                offset: offset0,
            };
            let runs = match echoed_prompt(out, spec) {
                Some(prompt) => vec![prompt, generated],
                None => vec![generated],
            };
            choices.push(CompletionChoice {
                index: p * n + i,
                text,
                logprobs: spec
                    .logprobs
                    .map(|k| completion_logprobs(&runs, k as usize)),
                finish_reason: Some(s.finish_reason.as_openai()),
            });
        }
    }
    let refs: Vec<&GenerationOut> = outs.iter().collect();
    compact(&envelope(
        meta,
        "text_completion",
        choices,
        UsageField::Some(Usage::of_request(&refs, spec)),
    ))
}

/// The prompt's tokens as an echo lists them in `logprobs` (offsets from 0), when the
/// request echoes the prompt and its logprobs were computed.
pub fn echoed_prompt<'a>(out: &'a GenerationOut, spec: &GenerationSpec) -> Option<TokenRun<'a>> {
    (spec.return_full_text && !out.prefill.is_empty()).then_some(TokenRun {
        tokens: &out.prefill,
        top: &out.prefill_top,
        offset: 0,
    })
}

/// One streamed completion chunk for choice `index` (text may be "" on a finish-only chunk).
pub fn completion_chunk(
    meta: &OpenAiMeta,
    index: usize,
    text: &str,
    finish: Option<FinishReason>,
    include_usage: bool,
) -> String {
    completion_chunk_with_logprobs(meta, index, text, &[], None, finish, include_usage)
}

/// [`completion_chunk`] with `logprobs` over `runs` (top `k` alternatives) when `k` is set:
/// a stream's echo chunk carries the prompt's, each token chunk its token's.
pub fn completion_chunk_with_logprobs(
    meta: &OpenAiMeta,
    index: usize,
    text: &str,
    runs: &[TokenRun<'_>],
    k: Option<u32>,
    finish: Option<FinishReason>,
    include_usage: bool,
) -> String {
    let choice = CompletionChoice {
        index,
        text: text.to_string(),
        logprobs: k.map(|k| completion_logprobs(runs, k as usize)),
        finish_reason: finish.map(FinishReason::as_openai),
    };
    compact(&envelope(
        meta,
        "text_completion",
        vec![choice],
        chunk_usage(include_usage),
    ))
}

/// The usage chunk of a completions stream (`choices: []`).
pub fn completion_chunk_usage(meta: &OpenAiMeta, usage: Usage) -> String {
    compact(&envelope::<CompletionChoice>(
        meta,
        "text_completion",
        Vec::new(),
        UsageField::Some(usage),
    ))
}

/// `GET /v1/models`: `{"object":"list","data":[{"id","object":"model","created","owned_by"}]}`.
pub fn models_list<S: AsRef<str>>(ids: &[S], owned_by: &str, created: u64) -> String {
    #[derive(Serialize)]
    struct Model<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        owned_by: &'a str,
    }
    #[derive(Serialize)]
    struct List<'a> {
        object: &'static str,
        data: Vec<Model<'a>>,
    }
    compact(&List {
        object: "list",
        data: ids
            .iter()
            .map(|id| Model {
                id: id.as_ref(),
                object: "model",
                created,
                owned_by,
            })
            .collect(),
    })
}
