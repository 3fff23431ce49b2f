//! Reasoning ("thinking") in a reply, kept apart from the answer. One place for every route:
//! [`split_reasoning`] reads a finished reply whole; [`ReasoningStream`] is fed text deltas as
//! they are generated and releases reasoning and answer deltas in order.
//!
//! Formats: think tags (`<think>` ... `</think>`, as Qwen3, QwQ and DeepSeek-R1 write them),
//! and gpt-oss's harmony channels ([`crate::harmony`]), which are read with special tokens kept.

use crate::harmony::{self, HarmonyReasoning};
use crate::markers;

/// How a model marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>reasoning</think>answer`; the prompt may already have opened `<think>`.
    ThinkTags,
    /// gpt-oss: `analysis` messages are the reasoning, `final` ones the answer.
    Harmony,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

impl ReasoningFormat {
    /// `option.reasoning_parser` names (vLLM's names for the same format are accepted).
    pub const NAMES: &'static [&'static str] = &[
        "think",
        "qwen3",
        "deepseek_r1",
        "openai_gptoss",
        "gpt_oss",
        "harmony",
    ];

    pub fn from_name(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "think" | "qwen3" | "deepseek_r1" => Some(ReasoningFormat::ThinkTags),
            "openai_gptoss" | "gpt_oss" | "harmony" => Some(ReasoningFormat::Harmony),
            _ => None,
        }
    }

    /// The format a chat template's source implies: one that writes harmony channels is
    /// gpt-oss's; one that writes `</think>` knows think tags. `None`: the model does not
    /// reason in a way we can tell apart.
    pub fn detect(template_source: &str) -> Option<Self> {
        if template_source.contains(harmony::CHANNEL) {
            Some(ReasoningFormat::Harmony)
        } else {
            template_source
                .contains(THINK_CLOSE)
                .then_some(ReasoningFormat::ThinkTags)
        }
    }

    /// Whether replies are read with their special tokens (harmony's markers are).
    pub fn reads_special_tokens(self) -> bool {
        self == ReasoningFormat::Harmony
    }

    /// Whether a thinking budget can be enforced (by a grammar over the tags): think tags
    /// only; gpt-oss's effort is set with `reasoning_effort` instead.
    pub fn takes_budget(self) -> bool {
        self == ReasoningFormat::ThinkTags
    }

    /// What opens the reasoning.
    pub fn open_tag(self) -> &'static str {
        match self {
            ReasoningFormat::ThinkTags => THINK_OPEN,
            ReasoningFormat::Harmony => "<|channel|>analysis<|message|>",
        }
    }

    pub fn close_tag(self) -> &'static str {
        match self {
            ReasoningFormat::ThinkTags => THINK_CLOSE,
            ReasoningFormat::Harmony => harmony::END,
        }
    }

    /// What templates write after the closing tag before the answer (Qwen3 and DeepSeek-R1:
    /// a blank line); a forced close writes it too.
    pub fn after_close(self) -> &'static str {
        match self {
            ReasoningFormat::ThinkTags => "\n\n",
            ReasoningFormat::Harmony => "",
        }
    }

    /// Whether a rendered prompt leaves the model inside its reasoning (templates that end the
    /// generation prompt with `<think>`, as DeepSeek-R1's and Qwen3-Thinking's do); for
    /// harmony, whether it leaves the model inside the header of its reply's first message.
    pub fn prompt_opens(self, prompt: &str) -> bool {
        match self {
            ReasoningFormat::ThinkTags => prompt.trim_end().ends_with(THINK_OPEN),
            ReasoningFormat::Harmony => prompt.trim_end().ends_with(harmony::ASSISTANT_PROMPT),
        }
    }

    /// Whether a rendered prompt has already closed the reasoning of the turn being generated
    /// (Qwen3 with `enable_thinking: false` writes an empty `<think>\n\n</think>\n\n`): the
    /// reply is then all answer.
    pub fn prompt_closes(self, prompt: &str) -> bool {
        match self {
            ReasoningFormat::ThinkTags => prompt.trim_end().ends_with(THINK_CLOSE),
            ReasoningFormat::Harmony => false,
        }
    }
}

/// A finished reply read whole: the reasoning (`None` when the reply has none) and the answer.
/// `starts_inside`: the prompt opened the reasoning ([`ReasoningFormat::prompt_opens`]).
pub fn split_reasoning(
    format: ReasoningFormat,
    text: &str,
    starts_inside: bool,
) -> (Option<String>, String) {
    let mut s = ReasoningStream::new(format, starts_inside);
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for p in pieces {
        match p {
            ReasoningPiece::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            ReasoningPiece::Content(t) => content.push_str(&t),
        }
    }
    if s.entered() && reasoning.is_none() {
        reasoning = Some(String::new());
    }
    (reasoning, content)
}

/// What a [`ReasoningStream`] releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReasoningPiece {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet; the reply may open with the tag.
    Start,
    Inside,
    /// Just after the closing tag: leading whitespace of the answer is dropped.
    Closed,
    Answer,
}

/// Splits a reply as it streams. Text that may be the start of a tag is held back until it is
/// clear (a tag split across tokens), and a delta holding a tag and text around it is cut at
/// the tag. Reasoning is released verbatim; the answer without the whitespace that follows
/// the closing tag or precedes an opening one.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    format: ReasoningFormat,
    state: State,
    held: String,
    entered: bool,
    tokens: usize,
    pending_tokens: usize,
    /// The harmony reader, for [`ReasoningFormat::Harmony`] (`state` is then unused).
    harmony: Option<HarmonyReasoning>,
}

impl ReasoningStream {
    pub fn new(format: ReasoningFormat, starts_inside: bool) -> Self {
        Self {
            format,
            state: if starts_inside {
                State::Inside
            } else {
                State::Start
            },
            held: String::new(),
            entered: starts_inside,
            tokens: 0,
            pending_tokens: 0,
            harmony: (format == ReasoningFormat::Harmony)
                .then(|| HarmonyReasoning::new(starts_inside)),
        }
    }

    /// Whether the reply went into reasoning (opened by the prompt or by the reply).
    pub fn entered(&self) -> bool {
        match &self.harmony {
            Some(h) => h.entered(),
            None => self.entered,
        }
    }

    /// Generated tokens that belong to the reasoning, the tags included, when each token's
    /// text was given to [`Self::push_token`].
    pub fn reasoning_tokens(&self) -> usize {
        self.tokens
    }

    /// [`Self::push`] for one generated token's text, counting it as reasoning when it was
    /// read inside the reasoning (or opened or closed it).
    pub fn push_token(&mut self, text: &str) -> Vec<ReasoningPiece> {
        if let Some(h) = self.harmony.as_mut() {
            // An analysis message's tokens, its header and end included.
            let inside = h.in_reasoning();
            let out = h.push(text);
            if inside {
                self.tokens += 1;
            } else if h.in_reasoning() {
                self.tokens += self.pending_tokens + 1;
                self.pending_tokens = 0;
            } else if h.in_header() {
                self.pending_tokens += 1;
            } else {
                self.pending_tokens = 0;
            }
            return out;
        }
        let (before, entered) = (self.state, self.entered);
        let out = self.push(text);
        if before == State::Inside {
            self.tokens += 1;
        } else if !entered && self.entered {
            // This token opened the reasoning; those held before it were part of the tag.
            self.tokens += self.pending_tokens + 1;
            self.pending_tokens = 0;
        } else if self.state == State::Start {
            self.pending_tokens += 1;
        }
        out
    }

    pub fn push(&mut self, delta: &str) -> Vec<ReasoningPiece> {
        if let Some(h) = self.harmony.as_mut() {
            return h.push(delta);
        }
        self.held.push_str(delta);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    let open = self.format.open_tag();
                    if let Some(rest) = t.strip_prefix(open) {
                        self.held = rest.to_string();
                        self.state = State::Inside;
                        self.entered = true;
                    } else if t.is_empty() || open.starts_with(t) {
                        return out;
                    } else {
                        self.state = State::Answer;
                        self.held = t.to_string();
                    }
                }
                State::Inside => {
                    let close = self.format.close_tag();
                    if let Some(at) = self.held.find(close) {
                        let reasoning: String = self.held[..at].to_string();
                        self.held.drain(..at + close.len());
                        if !reasoning.is_empty() {
                            out.push(ReasoningPiece::Reasoning(reasoning));
                        }
                        self.state = State::Closed;
                    } else {
                        let keep = markers::held_back(&self.held, &[close]);
                        let cut = self.held.len() - keep;
                        if cut > 0 {
                            out.push(ReasoningPiece::Reasoning(self.held[..cut].to_string()));
                            self.held.drain(..cut);
                        }
                        return out;
                    }
                }
                State::Closed => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = t.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    if !self.held.is_empty() {
                        out.push(ReasoningPiece::Content(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the reply: what was held back goes out as what it turned out to be (an
    /// unclosed reasoning stays reasoning; a lone partial tag at the start is answer text).
    pub fn finish(&mut self) -> Vec<ReasoningPiece> {
        if let Some(h) = self.harmony.as_mut() {
            return h.finish();
        }
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Inside if !held.is_empty() => vec![ReasoningPiece::Reasoning(held)],
            State::Start | State::Answer if !held.trim().is_empty() => {
                self.state = State::Answer;
                vec![ReasoningPiece::Content(held.trim_start().to_string())]
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(deltas: &[&str], inside: bool) -> (Vec<ReasoningPiece>, usize) {
        let mut s = ReasoningStream::new(ReasoningFormat::ThinkTags, inside);
        let mut out: Vec<ReasoningPiece> = deltas.iter().flat_map(|d| s.push_token(d)).collect();
        out.extend(s.finish());
        (out, s.reasoning_tokens())
    }

    fn r(t: &str) -> ReasoningPiece {
        ReasoningPiece::Reasoning(t.into())
    }
    fn c(t: &str) -> ReasoningPiece {
        ReasoningPiece::Content(t.into())
    }

    #[test]
    fn whole_replies() {
        let f = ReasoningFormat::ThinkTags;
        let split = |t, inside| split_reasoning(f, t, inside);
        assert_eq!(
            split("<think>\nhm\n</think>\n\nYes.", false),
            (Some("\nhm\n".into()), "Yes.".into())
        );
        assert_eq!(split("Yes.", false), (None, "Yes.".into()));
        // Opened by the prompt; never closed.
        assert_eq!(split("hm, so", true), (Some("hm, so".into()), "".into()));
        assert_eq!(split("a</think>b", true), (Some("a".into()), "b".into()));
        assert_eq!(
            split("<think></think>b", false),
            (Some("".into()), "b".into())
        );
        // A `<` that is not a tag is answer text.
        assert_eq!(split("<b>x</b>", false), (None, "<b>x</b>".into()));
        assert_eq!(split("<thi", false), (None, "<thi".into()));
    }

    #[test]
    fn tags_split_across_deltas_or_sharing_one() {
        let (p, n) = stream(&["<th", "ink>", "a", "b</", "thi", "nk>", "\n\nok"], false);
        assert_eq!(p, vec![r("a"), r("b"), c("ok")]);
        assert_eq!(n, 6, "everything up to and including the closing tag");
        let (p, n) = stream(&["<think>x</think>\n\nyes", " no"], false);
        assert_eq!(p, vec![r("x"), c("yes"), c(" no")]);
        assert_eq!(n, 1);
        // A `<` inside reasoning that is not the closing tag is released once it is clear.
        let (p, _) = stream(&["<think>a <", " b</think>c"], false);
        assert_eq!(p, vec![r("a "), r("< b"), c("c")]);
        let (p, n) = stream(&["thinking", " more"], true);
        assert_eq!(p, vec![r("thinking"), r(" more")]);
        assert_eq!(n, 2);
        let (p, n) = stream(&["Hello", " there"], false);
        assert_eq!(p, vec![c("Hello"), c(" there")]);
        assert_eq!(n, 0);
    }

    #[test]
    fn harmony_channels_token_by_token() {
        let f = ReasoningFormat::Harmony;
        let prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
        assert!(f.prompt_opens(prompt) && !f.prompt_closes(prompt));
        let mut s = ReasoningStream::new(f, true);
        let tokens = [
            "<|channel|>",
            "analysis",
            "<|message|>",
            "Greet",
            ".",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "final",
            "<|message|>",
            "Hello",
        ];
        let mut out: Vec<ReasoningPiece> = tokens.iter().flat_map(|t| s.push_token(t)).collect();
        out.extend(s.finish());
        assert_eq!(out, vec![r("Greet"), r("."), c("Hello")]);
        assert_eq!(
            s.reasoning_tokens(),
            6,
            "the analysis message, header to end"
        );
        let whole = split_reasoning(f, &tokens.concat(), true);
        assert_eq!(whole, (Some("Greet.".into()), "Hello".into()));
        // No analysis message: no reasoning.
        let whole = split_reasoning(f, "<|channel|>final<|message|>Hi", true);
        assert_eq!(whole, (None, "Hi".into()));
    }

    #[test]
    fn formats_from_names_and_templates() {
        assert_eq!(
            ReasoningFormat::from_name("deepseek_r1"),
            Some(ReasoningFormat::ThinkTags)
        );
        assert_eq!(ReasoningFormat::from_name("nope"), None);
        assert!(ReasoningFormat::detect("{{ '<think>\\n\\n</think>\\n\\n' }}").is_some());
        assert!(ReasoningFormat::detect("{{ messages }}").is_none());
        let f = ReasoningFormat::ThinkTags;
        assert!(f.prompt_opens("<|im_start|>assistant\n<think>\n"));
        assert!(!f.prompt_opens("<|im_start|>assistant\n"));
        assert!(f.prompt_closes("assistant\n<think>\n\n</think>\n\n"));
        assert_eq!(
            ReasoningFormat::from_name("openai_gptoss"),
            Some(ReasoningFormat::Harmony)
        );
        let harmony = "{{- '<|start|>assistant<|channel|>analysis<|message|>' }}</think>";
        assert_eq!(
            ReasoningFormat::detect(harmony),
            Some(ReasoningFormat::Harmony)
        );
    }
}
