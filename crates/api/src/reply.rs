//! A finished or streamed assistant reply read into parts, for the formats that give each part
//! its own item or block (the Responses API's output items, Anthropic's content blocks). The
//! server reads the model's text into these parts: reasoning split from the answer (for a
//! model with a reasoning parser: Responses `reasoning` items, Anthropic `thinking` blocks),
//! tool calls parsed out of the answer.

use crate::openai::ToolCallOut;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyPart {
    /// The model's reasoning before its answer (streamed: a delta of it).
    Reasoning(String),
    /// Text the model said (streamed: a delta of it).
    Text(String),
    /// A function call, whole.
    ToolCall(ToolCallOut),
}

/// Why a reply ended, in the terms both APIs need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// EOS: the model finished its turn.
    EndTurn,
    /// A stop sequence matched.
    StopSequence,
    /// The token limit.
    MaxTokens,
    /// The turn ended with tool calls.
    ToolUse,
}

impl StopKind {
    pub fn of(reason: crate::FinishReason, called: bool) -> Self {
        match reason {
            crate::FinishReason::Length => Self::MaxTokens,
            _ if called => Self::ToolUse,
            crate::FinishReason::EosToken => Self::EndTurn,
            crate::FinishReason::StopSequence => Self::StopSequence,
        }
    }
}
