//! Reading the model's reply into [`ReplyPart`]s (reasoning, text, tool calls) for the APIs that
//! give each part its own item or block: the Responses API and Anthropic's Messages API.
//!
//! For a model with a reasoning parser the reply first goes through its splitter (the chat
//! route's, `lmi_text::reasoning`): the reasoning becomes a reasoning part (a Responses
//! `reasoning` item, an Anthropic `thinking` block) and only the answer reaches the tool-call
//! reader, so calls are parsed from the answer alone.

use lmi_api::openai::{ChatMessage, FunctionCall, MessageContent, Role, ToolCall, ToolSpec};
use lmi_api::reply::{ReplyPart, StopKind};
use lmi_api::{FinishReason, GenerationSpec, SequenceOut, TokenOut};
use lmi_text::tools::ToolCallFormat;

use crate::reasoning::ReplyReasoning;
use crate::tool_calls::{self, Piece, StreamReader};

fn part(p: Piece) -> ReplyPart {
    match p {
        Piece::Content(t) => ReplyPart::Text(t),
        Piece::Call(c) => ReplyPart::ToolCall(c),
        // The tool reader never releases reasoning (only the chat stream's splitter does).
        Piece::Reasoning(t) => ReplyPart::Text(t),
    }
}

/// A finished sequence read whole: its reasoning (when `reasoning`), its text, then its calls;
/// with the count of its reasoning tokens.
pub fn read_whole(
    tools: Option<&ToolSpec>,
    format: ToolCallFormat,
    reasoning: Option<ReplyReasoning>,
    s: &SequenceOut,
) -> (Vec<ReplyPart>, usize) {
    if reasoning.is_none() && tools.is_none() {
        return (vec![ReplyPart::Text(s.text.clone())], 0);
    }
    let (turn, count) = crate::reasoning::read_reply(s, reasoning, tools, format);
    let parts = turn
        .reasoning
        .map(ReplyPart::Reasoning)
        .into_iter()
        .chain(std::iter::once(ReplyPart::Text(turn.content)))
        .chain(turn.tool_calls.into_iter().map(ReplyPart::ToolCall))
        .collect();
    (parts, count)
}

/// How a reply read whole ended, in the APIs' terms (tool use when it made calls).
pub fn stop_kind(finish: FinishReason, parts: &[ReplyPart]) -> StopKind {
    StopKind::of(
        finish,
        parts.iter().any(|p| matches!(p, ReplyPart::ToolCall(_))),
    )
}

/// A reply read as it streams, token by token.
pub struct ReplyReader {
    tools: Option<StreamReader>,
    thinking: Option<lmi_text::ReasoningStream>,
    /// Special tokens reach the readers ([`tool_calls::keeps_special_tokens`]).
    keep_special: bool,
    /// The last finish reason a token carried (EOS until one does).
    finish: FinishReason,
}

impl ReplyReader {
    pub fn new(
        tools: Option<&ToolSpec>,
        format: ToolCallFormat,
        reasoning: Option<ReplyReasoning>,
        spec: &GenerationSpec,
    ) -> Self {
        Self {
            tools: tools.map(|t| StreamReader::new(Some(t), format)),
            thinking: reasoning.map(|r| r.stream()),
            keep_special: tool_calls::keeps_special_tokens(format, reasoning, spec),
            finish: FinishReason::EosToken,
        }
    }

    /// Why the reply ended, once its last token is read.
    pub fn finish_reason(&self) -> FinishReason {
        self.finish
    }

    /// The reasoning's tokens so far (tags included; 0 without a reasoning parser).
    pub fn reasoning_tokens(&self) -> usize {
        self.thinking.as_ref().map_or(0, |t| t.reasoning_tokens())
    }

    /// What one generated token releases (the rest of the reply too on its last token).
    pub fn token(&mut self, token: &TokenOut, finish: Option<FinishReason>) -> Vec<ReplyPart> {
        if let Some(r) = finish {
            self.finish = r;
        }
        let text = tool_calls::token_text(token, self.keep_special, finish);
        let split = crate::reasoning::split_token(self.thinking.as_mut(), text, finish.is_some());
        let mut parts = Vec::new();
        for piece in split {
            match piece {
                lmi_text::ReasoningPiece::Reasoning(t) => parts.push(ReplyPart::Reasoning(t)),
                lmi_text::ReasoningPiece::Content(t) => parts.extend(self.push(&t)),
            }
        }
        if finish.is_some() {
            parts.extend(self.finish());
        }
        parts
            .retain(|p| !matches!(p, ReplyPart::Text(t) | ReplyPart::Reasoning(t) if t.is_empty()));
        parts
    }

    fn push(&mut self, text: &str) -> Vec<ReplyPart> {
        match self.tools.as_mut() {
            Some(r) => r.push(text).into_iter().map(part).collect(),
            None => vec![ReplyPart::Text(text.to_string())],
        }
    }

    fn finish(&mut self) -> Vec<ReplyPart> {
        match self.tools.take() {
            Some(r) => r.finish().into_iter().map(part).collect(),
            None => Vec::new(),
        }
    }
}

/// The reply as the assistant turn of a conversation (to continue it later).
pub fn assistant_message(parts: &[ReplyPart]) -> ChatMessage {
    let text: String = parts
        .iter()
        .filter_map(|p| match p {
            ReplyPart::Text(t) => Some(t.as_str()),
            ReplyPart::ToolCall(_) | ReplyPart::Reasoning(_) => None,
        })
        .collect();
    let calls: Vec<ToolCall> = parts
        .iter()
        .filter_map(|p| match p {
            ReplyPart::ToolCall(c) => Some(ToolCall {
                id: c.id.clone(),
                kind: "function".into(),
                function: FunctionCall {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            }),
            ReplyPart::Text(_) | ReplyPart::Reasoning(_) => None,
        })
        .collect();
    // The reasoning goes with the turn; the template keeps it or drops it (Qwen3's drop it
    // before the last user turn, gpt-oss's keep it before a tool call's result).
    let thoughts: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            ReplyPart::Reasoning(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let reasoning = (!thoughts.is_empty()).then(|| thoughts.concat());
    let text = text.trim();
    ChatMessage {
        role: Role::Assistant,
        content: (!text.is_empty() || calls.is_empty()).then(|| MessageContent::Text(text.into())),
        name: None,
        tool_calls: (!calls.is_empty()).then_some(calls),
        tool_call_id: None,
        reasoning_content: reasoning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_api::openai::{Tool, ToolCallOut, ToolChoice};

    #[test]
    fn plain_text_passes_and_calls_are_read() {
        let spec = GenerationSpec::default();
        let mut r = ReplyReader::new(None, ToolCallFormat::SmolLm, None, &spec);
        let tok = |t: &str, special| TokenOut::new(1, t.to_string(), Some(0.0), special);
        assert_eq!(
            r.token(&tok("Hi", false), None),
            [ReplyPart::Text("Hi".into())]
        );
        assert!(
            r.token(&tok("</s>", true), Some(FinishReason::EosToken))
                .is_empty()
        );

        let tools = ToolSpec {
            tools: vec![Tool {
                name: "f".into(),
                parameters: serde_json::json!({"type": "object"}),
                raw: serde_json::json!({}),
            }],
            choice: ToolChoice::Required,
            parallel: true,
        };
        let mut r = ReplyReader::new(Some(&tools), ToolCallFormat::SmolLm, None, &spec);
        assert!(r.token(&tok(r#"[{"name":"f","#, false), None).is_empty());
        let parts = r.token(
            &tok(r#""arguments":{"a":1}}]"#, false),
            Some(FinishReason::EosToken),
        );
        match parts.as_slice() {
            [ReplyPart::ToolCall(c)] => {
                assert_eq!((c.name.as_str(), c.arguments.as_str()), ("f", r#"{"a":1}"#))
            }
            other => panic!("one call expected, got {other:?}"),
        }
        let m = assistant_message(&parts);
        assert!(m.content.is_none() && m.tool_calls.as_ref().unwrap()[0].function.name == "f");
        let m = assistant_message(&[
            ReplyPart::Text("Sure.".into()),
            ReplyPart::ToolCall(ToolCallOut {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }),
        ]);
        assert_eq!(m.text(), "Sure.");
    }
}
