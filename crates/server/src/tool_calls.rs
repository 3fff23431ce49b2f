//! Reading an assistant reply for tool calls. With `tool_choice` `auto` the model's own format
//! (from the chat template, or option.tool_call_parser) is parsed; with `required` or a named
//! function the reply was generated under the call schema, so it is the calls' JSON.

use lmi_api::openai::format::{ToolDelta, chat_chunk_tool_delta};
use lmi_api::openai::{ChatTurn, OpenAiMeta, ToolCallOut, ToolSpec};
use lmi_api::{FinishReason, GenerationSpec, SequenceOut, TokenOut, sse};
use lmi_text::tools::{
    ParsedToolCall, ToolCallFormat, ToolStreamParser, ToolStreamPiece, parse_forced_calls,
    parse_tool_calls,
};

/// `call_` and 24 hex digits, as OpenAI's ids look.
fn call_id() -> String {
    let id = crate::app::new_request_id().replace('-', "");
    format!("call_{}", &id[..24.min(id.len())])
}

fn out(c: ParsedToolCall) -> ToolCallOut {
    ToolCallOut {
        id: call_id(),
        name: c.name,
        arguments: c.arguments,
    }
}

/// Formats whose call marker is a special token (Mistral's `[TOOL_CALLS]`, harmony's
/// `<|channel|>`): the reply is decoded with special tokens so the parser sees the marker, as
/// vLLM does.
pub fn reads_special_tokens(format: ToolCallFormat) -> bool {
    matches!(format, ToolCallFormat::Mistral | ToolCallFormat::Harmony)
}

/// Whether a reply's special tokens reach its readers: where a reader needs them (a call
/// format whose marker is one, harmony's reasoning) and the client did not ask them dropped.
pub fn keeps_special_tokens(
    format: ToolCallFormat,
    reasoning: Option<crate::reasoning::ReplyReasoning>,
    spec: &GenerationSpec,
) -> bool {
    let reads =
        reads_special_tokens(format) || reasoning.is_some_and(|r| r.format.reads_special_tokens());
    reads && !spec.skip_special_tokens
}

/// A generated token's text as the readers get it: a special token's only when they keep
/// them ([`keeps_special_tokens`]), and never the EOS that ended the reply.
pub fn token_text(token: &TokenOut, keep_special: bool, finish: Option<FinishReason>) -> &str {
    let keep = keep_special && finish != Some(FinishReason::EosToken);
    if token.special && !keep {
        ""
    } else {
        &token.text
    }
}

/// Whether a forced call's reply is the bare JSON of [`ToolSpec::forced_schema`] (read whole
/// at the end); harmony forces its own message form instead ([`harmony_forced_grammar`]),
/// read by the format's parser.
fn forced_json(tools: &ToolSpec, format: ToolCallFormat) -> bool {
    tools.forced() && format != ToolCallFormat::Harmony
}

/// A forced call in gpt-oss's own form, as a Lark grammar: the analysis the model may write
/// first, then one commentary message to an allowed function (`required`: any of them;
/// harmony has one call a turn), its body the arguments matching that function's schema,
/// compact as the plain forced grammar makes them. The `<|call|>` that follows ends the reply.
pub fn harmony_forced_grammar(tools: &ToolSpec) -> Option<String> {
    use lmi_api::openai::ToolChoice;
    let allowed: Vec<_> = match &tools.choice {
        ToolChoice::Function(name) => tools.tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Required => tools.tools.iter().collect(),
        ToolChoice::None | ToolChoice::Auto => return None,
    };
    let lark = crate::reasoning::lark_string;
    let mut rules = String::new();
    let mut calls = Vec::new();
    for (i, t) in allowed.iter().enumerate() {
        let mut schema = t.parameters.clone();
        if let Some(o) = schema.as_object_mut() {
            o.entry("x-guidance")
                .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
        }
        let header = lark(&format!("commentary to=functions.{} ", t.name));
        rules.push_str(&format!(
            "call_{i}: <|channel|> {header} <|constrain|> \"json\" <|message|> args_{i}\n\
             args_{i}: %json {schema}\n"
        ));
        calls.push(format!("call_{i}"));
    }
    Some(format!(
        "start: analysis? call\n\
         analysis: <|channel|> \"analysis\" <|message|> THOUGHT <|end|> <|start|> \"assistant\"\n\
         THOUGHT: /(?s:.*)/\n\
         call: {}\n{rules}",
        calls.join(" | ")
    ))
}

/// The text a parser reads from a finished sequence: its text without the EOS token's text,
/// which is there when special tokens are kept.
pub fn reply_text(s: &SequenceOut) -> &str {
    match s.tokens.last() {
        Some(t) if t.special && s.finish_reason == FinishReason::EosToken => {
            s.text.strip_suffix(t.text.as_str()).unwrap_or(&s.text)
        }
        _ => &s.text,
    }
}

/// A finished reply, read whole.
pub fn read_turn(tools: &ToolSpec, format: ToolCallFormat, text: &str) -> ChatTurn {
    if forced_json(tools, format) {
        return match parse_forced_calls(text) {
            Ok(calls) => ChatTurn {
                content: String::new(),
                tool_calls: calls.into_iter().map(out).collect(),
                reasoning: None,
            },
            // Cut short by max_tokens: what was written stays, as text.
            Err(_) => ChatTurn {
                content: text.to_string(),
                tool_calls: Vec::new(),
                reasoning: None,
            },
        };
    }
    let (content, calls) = parse_tool_calls(format, text);
    ChatTurn {
        content,
        tool_calls: calls.into_iter().map(out).collect(),
        reasoning: None,
    }
}

/// What a streamed reply releases.
pub enum Piece {
    Content(String),
    Call(ToolCallOut),
    Reasoning(String),
}

/// A reply read as it streams.
pub enum StreamReader {
    Parsed(ToolStreamParser),
    /// A forced call: its JSON is complete only at the end.
    Forced(String),
    /// No tools: the answer goes out as it comes.
    Plain,
}

impl StreamReader {
    pub fn new(tools: Option<&ToolSpec>, format: ToolCallFormat) -> Self {
        match tools {
            None => StreamReader::Plain,
            Some(t) if forced_json(t, format) => StreamReader::Forced(String::new()),
            Some(_) => StreamReader::Parsed(ToolStreamParser::new(format)),
        }
    }

    fn pieces(p: Vec<ToolStreamPiece>) -> Vec<Piece> {
        p.into_iter()
            .map(|p| match p {
                ToolStreamPiece::Content(t) => Piece::Content(t),
                ToolStreamPiece::Call(c) => Piece::Call(out(c)),
            })
            .collect()
    }

    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        match self {
            StreamReader::Plain => vec![Piece::Content(delta.to_string())],
            StreamReader::Parsed(p) => Self::pieces(p.push(delta)),
            StreamReader::Forced(buf) => {
                buf.push_str(delta);
                Vec::new()
            }
        }
    }

    pub fn finish(self) -> Vec<Piece> {
        match self {
            StreamReader::Plain => Vec::new(),
            StreamReader::Parsed(p) => Self::pieces(p.finish()),
            StreamReader::Forced(buf) => match parse_forced_calls(&buf) {
                Ok(calls) => calls.into_iter().map(|c| Piece::Call(out(c))).collect(),
                Err(_) if buf.is_empty() => Vec::new(),
                Err(_) => vec![Piece::Content(buf)],
            },
        }
    }
}

/// A streamed chat whose replies are read for reasoning and/or tool calls: each choice's
/// tokens go through its reasoning splitter (reasoning goes out as `reasoning_content`
/// deltas) and the answer through its reader; what the reader releases becomes OpenAI chunks
/// (content deltas, one `tool_calls` delta per call). Tokens held back are reported, with
/// their logprobs, on the next chunk of their choice.
pub struct ToolStream {
    meta: OpenAiMeta,
    spec: GenerationSpec,
    include_usage: bool,
    tools: Option<ToolSpec>,
    format: ToolCallFormat,
    reasoning: Option<crate::reasoning::ReplyReasoning>,
    keep_special: bool,
    choices: Vec<ChoiceStream>,
}

#[derive(Default)]
struct ChoiceStream {
    reader: Option<StreamReader>,
    thinking: Option<lmi_text::ReasoningStream>,
    pending: Vec<(TokenOut, Vec<TokenOut>)>,
    calls: usize,
}

impl ToolStream {
    pub fn new(
        meta: OpenAiMeta,
        spec: GenerationSpec,
        include_usage: bool,
        tools: Option<ToolSpec>,
        format: ToolCallFormat,
        reasoning: Option<crate::reasoning::ReplyReasoning>,
        n: usize,
    ) -> Self {
        let mut s = Self {
            keep_special: keeps_special_tokens(format, reasoning, &spec),
            meta,
            spec,
            include_usage,
            tools,
            format,
            reasoning,
            choices: Vec::new(),
        };
        s.grow(n);
        s
    }

    fn grow(&mut self, n: usize) {
        while self.choices.len() < n {
            self.choices.push(ChoiceStream {
                reader: Some(StreamReader::new(self.tools.as_ref(), self.format)),
                thinking: self.reasoning.map(|r| r.stream()),
                ..ChoiceStream::default()
            });
        }
    }

    /// Reasoning tokens over all choices (`usage.completion_tokens_details`), when the
    /// replies are read for reasoning.
    pub fn reasoning_tokens(&self) -> Option<usize> {
        self.reasoning?;
        Some(
            self.choices
                .iter()
                .filter_map(|c| c.thinking.as_ref())
                .map(|t| t.reasoning_tokens())
                .sum(),
        )
    }

    /// The SSE events for one generated token of choice `index` (often none while a call is
    /// being written).
    pub fn token(
        &mut self,
        index: usize,
        token: &TokenOut,
        top: &[TokenOut],
        finish: Option<FinishReason>,
    ) -> String {
        self.grow(index + 1);
        let c = &mut self.choices[index];
        c.pending.push((token.clone(), top.to_vec()));
        let text = token_text(token, self.keep_special, finish);
        // Reasoning goes out as it is; the answer goes on to the reader.
        let split = crate::reasoning::split_token(c.thinking.as_mut(), text, finish.is_some());
        let mut pieces = Vec::new();
        for p in split {
            match p {
                lmi_text::ReasoningPiece::Reasoning(t) => pieces.push(Piece::Reasoning(t)),
                lmi_text::ReasoningPiece::Content(t) => {
                    if let Some(r) = c.reader.as_mut() {
                        pieces.extend(r.push(&t));
                    }
                }
            }
        }
        if finish.is_some()
            && let Some(r) = c.reader.take()
        {
            pieces.extend(r.finish());
        }
        pieces.retain(|p| !matches!(p, Piece::Content(t) | Piece::Reasoning(t) if t.is_empty()));
        let mut out = String::new();
        let count = pieces.len();
        for (i, piece) in pieces.iter().enumerate() {
            let delta = match piece {
                Piece::Content(t) => ToolDelta::Content(t),
                Piece::Reasoning(t) => ToolDelta::Reasoning(t),
                Piece::Call(call) => {
                    c.calls += 1;
                    ToolDelta::Call(c.calls - 1, call)
                }
            };
            let last = finish.filter(|_| i + 1 == count).map(|r| (r, c.calls > 0));
            let tokens = std::mem::take(&mut c.pending);
            out.push_str(&sse::data(&chat_chunk_tool_delta(
                &self.meta,
                index,
                delta,
                &tokens,
                last,
                &self.spec,
                self.include_usage,
            )));
        }
        if count == 0
            && let Some(r) = finish
        {
            let tokens = std::mem::take(&mut c.pending);
            out.push_str(&sse::data(&chat_chunk_tool_delta(
                &self.meta,
                index,
                ToolDelta::Finish,
                &tokens,
                Some((r, c.calls > 0)),
                &self.spec,
                self.include_usage,
            )));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_api::openai::{Tool, ToolChoice};

    fn spec(choice: ToolChoice) -> ToolSpec {
        ToolSpec {
            tools: vec![Tool {
                name: "f".into(),
                parameters: serde_json::json!({"type": "object"}),
                raw: serde_json::json!({}),
            }],
            choice,
            parallel: true,
        }
    }

    #[test]
    fn forced_and_parsed_replies() {
        let t = read_turn(
            &spec(ToolChoice::Required),
            ToolCallFormat::SmolLm,
            r#"[{"name":"f","arguments":{"a":1}}]"#,
        );
        assert_eq!(t.content, "");
        assert_eq!(t.tool_calls[0].name, "f");
        assert_eq!(t.tool_calls[0].arguments, r#"{"a":1}"#);
        assert!(t.tool_calls[0].id.starts_with("call_") && t.tool_calls[0].id.len() == 29);
        // Cut short: kept as text.
        let t = read_turn(
            &spec(ToolChoice::Required),
            ToolCallFormat::SmolLm,
            r#"[{"name":"#,
        );
        assert!(t.tool_calls.is_empty() && t.content == r#"[{"name":"#);
        let t = read_turn(
            &spec(ToolChoice::Auto),
            ToolCallFormat::SmolLm,
            r#"Sure. <tool_call>[{"name": "f", "arguments": {}}]</tool_call>"#,
        );
        assert_eq!((t.content.as_str(), t.tool_calls.len()), ("Sure.", 1));

        let mut r = StreamReader::new(
            Some(&spec(ToolChoice::Function("f".into()))),
            ToolCallFormat::Hermes,
        );
        assert!(r.push(r#"{"name":"f","#).is_empty());
        assert!(r.push(r#""arguments":{}}"#).is_empty());
        match r.finish().as_slice() {
            [Piece::Call(c)] => assert_eq!(c.name, "f"),
            _ => panic!("one call expected"),
        }
    }
}
