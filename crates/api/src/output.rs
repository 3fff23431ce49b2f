//! Neutral results the server hands to the formatters.

/// One token as generated (or as in the prompt, for prefill).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOut {
    pub id: u32,
    /// Incrementally detokenized text of this token (may be "" for partial UTF-8).
    pub text: String,
    /// Natural log probability; None where unknown (the first prompt token).
    pub logprob: Option<f32>,
    pub special: bool,
}

impl TokenOut {
    pub fn new(id: u32, text: impl Into<String>, logprob: Option<f32>, special: bool) -> Self {
        Self {
            id,
            text: text.into(),
            logprob,
            special,
        }
    }
}

/// Alternatives at one position, best first.
pub type TopTokens = Vec<TokenOut>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Length,
    EosToken,
    StopSequence,
}

impl FinishReason {
    /// LMI and TGI spelling.
    pub fn as_lmi(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::EosToken => "eos_token",
            Self::StopSequence => "stop_sequence",
        }
    }
    /// TGI routes use the same strings as LMI.
    pub fn as_tgi(self) -> &'static str {
        self.as_lmi()
    }
    /// OpenAI spelling: EOS and stop sequences are both "stop".
    pub fn as_openai(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::EosToken | Self::StopSequence => "stop",
        }
    }
}

/// One finished sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceOut {
    /// Generated text only (never includes the prompt; formatters prepend it for return_full_text).
    pub text: String,
    pub finish_reason: FinishReason,
    pub generated_tokens: usize,
    pub tokens: Vec<TokenOut>,
    /// One entry per generated position when top_n_tokens/logprobs were asked, else empty.
    pub top_tokens: Vec<TopTokens>,
    pub seed: Option<u64>,
    /// Speculative decoding: draft tokens kept in, and left out of, the output.
    pub accepted_draft_tokens: usize,
    pub rejected_draft_tokens: usize,
}

/// The finished result of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationOut {
    /// The prompt text (after chat templating, if any).
    pub inputs: String,
    pub prompt_tokens: usize,
    /// Prompt tokens with their logprobs (first one None) when decoder_input_details.
    pub prefill: Vec<TokenOut>,
    /// Alternatives at each prompt position (beside `prefill`) when prompt logprobs were
    /// asked with a top-k; else empty.
    pub prefill_top: Vec<TopTokens>,
    pub best: SequenceOut,
    /// The other sequences (best_of_sequences, or choices 1.. for n > 1), in order.
    pub others: Vec<SequenceOut>,
}

impl GenerationOut {
    /// Tokens generated over all sequences (OpenAI usage.completion_tokens).
    pub fn completion_tokens(&self) -> usize {
        self.best.generated_tokens
            + self
                .others
                .iter()
                .map(|s| s.generated_tokens)
                .sum::<usize>()
    }
    /// All sequences, best first.
    pub fn sequences(&self) -> impl Iterator<Item = &SequenceOut> {
        std::iter::once(&self.best).chain(self.others.iter())
    }
}

/// f32 logprob widened to f64 the way Python prints a float32 (LMI), NaN as null.
pub(crate) fn widen(lp: Option<f32>) -> Option<f64> {
    lp.filter(|v| !v.is_nan()).map(f64::from)
}

/// f32 logprob with NaN as null (TGI, OpenAI).
pub(crate) fn finite(lp: Option<f32>) -> Option<f32> {
    lp.filter(|v| !v.is_nan())
}
