//! What the scheduler sends back on a request's stream.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// max_new_tokens reached (or the model's length).
    Length,
    /// An EOS id or a stop token id.
    EosToken,
    /// A stop string matched.
    StopSequence,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::EosToken => "eos_token",
            FinishReason::StopSequence => "stop_sequence",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Which parallel sequence (0 .. best_of).
    pub index: u32,
    pub id: u32,
    /// Text this token adds to the output. Text that may begin a stop string is held back, so
    /// the concatenated texts always equal the final output text.
    pub text: String,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
    pub special: bool,
    /// Set on the sequence's last token (a `Finished` event follows at once).
    pub finish: Option<FinishReason>,
}

/// One prompt token with its logprob given the tokens before it (None for the first).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptToken {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timings {
    /// Submit → first scheduled.
    pub queue: Duration,
    /// Submit → first token.
    pub time_to_first_token: Duration,
    /// Submit → finished.
    pub total: Duration,
    /// Time between consecutive tokens of this sequence.
    pub inter_token: Vec<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub index: u32,
    pub reason: FinishReason,
    /// The output text, stop string cut unless include_stop_str_in_output.
    pub text: String,
    pub generated_tokens: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_prompt_tokens: usize,
    pub cumulative_logprob: f64,
    pub timings: Timings,
    /// Speculative decoding: draft tokens kept and thrown away.
    pub accepted_draft_tokens: usize,
    pub rejected_draft_tokens: usize,
}

/// The output of a pooling request ([`crate::PoolingRequest`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Pooled {
    /// The model's output vector (not normalized): an embedding, or a scoring head's raw
    /// scores.
    pub values: Vec<f32>,
    pub prompt_tokens: usize,
    pub timings: Timings,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Prompt logprobs, sent once before the first token when asked for.
    Prefill(Vec<PromptToken>),
    Token(TokenEvent),
    /// One parallel sequence finished; the stream ends after every sequence has.
    Finished(Finished),
    /// A pooling request's result; nothing follows.
    Pooled(Pooled),
    /// The request failed; nothing follows.
    Error(String),
}
