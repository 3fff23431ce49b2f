//! gpt-oss's harmony format, read as it streams. A reply is a run of messages
//! `<|start|>{role}[ to={recipient}]<|channel|>{channel}[ to={recipient}][ <|constrain|>json]<|message|>{body}`
//! each ended by `<|end|>`, or by `<|call|>` (a tool call, `to=functions.NAME`, its body the
//! arguments) or `<|return|>` (the final answer). The generation prompt ends with
//! `<|start|>assistant`, so a reply starts inside its first header.
//!
//! [`HarmonyParser`] splits the text (special tokens kept) into headers and bodies;
//! [`HarmonyReasoning`] maps them onto reasoning and answer for
//! [`crate::ReasoningStream`]: the `analysis` channel (and calls to built-in tools, which the
//! client cannot run) is reasoning; `final` and `commentary` without a recipient (preambles)
//! are the answer; a function call goes on to the tool reader as one message in canonical
//! form, which `ToolCallFormat::Harmony` reads.

use crate::markers;
use crate::reasoning::ReasoningPiece;

pub const START: &str = "<|start|>";
pub const CHANNEL: &str = "<|channel|>";
pub const MESSAGE: &str = "<|message|>";
pub const END: &str = "<|end|>";
pub const CALL: &str = "<|call|>";
pub const RETURN: &str = "<|return|>";
pub const CONSTRAIN: &str = "<|constrain|>";

/// The generation prompt's last words: the reply's first header is open.
pub const ASSISTANT_PROMPT: &str = "<|start|>assistant";

/// A header longer than this without `<|message|>` is not one: the reply is plain text (a
/// constrained reply, or a model that ignored the format), released as such.
pub const MAX_HEADER: usize = 256;

/// Recipients that are the client's functions.
const FUNCTIONS: &str = "functions.";

/// A message's header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    pub channel: String,
    /// `to=...`, in the role part or the channel part.
    pub recipient: Option<String>,
    /// `<|constrain|>json` (or a bare `json` after the channel): the body's type.
    pub constrain: Option<String>,
}

impl Header {
    /// The text between a message's start (after `<|start|>`, or the prompt's
    /// `<|start|>assistant`) and its `<|message|>`.
    pub fn parse(text: &str) -> Header {
        let (role, channel) = text.split_once(CHANNEL).unwrap_or((text, ""));
        let mut h = Header::default();
        let recipient = |w: &str| w.strip_prefix("to=").map(str::to_string);
        for w in role.split_whitespace() {
            if let Some(r) = recipient(w) {
                h.recipient = Some(r);
            }
        }
        let spaced = channel.replace(CONSTRAIN, &format!(" {CONSTRAIN} "));
        let mut words = spaced.split_whitespace();
        while let Some(w) = words.next() {
            if let Some(r) = recipient(w) {
                h.recipient = Some(r);
            } else if w == CONSTRAIN {
                h.constrain = words.next().map(str::to_string);
            } else if h.channel.is_empty() {
                h.channel = w.to_string();
            } else if h.constrain.is_none() {
                h.constrain = Some(w.to_string());
            }
        }
        h
    }

    /// The client function this message calls (`to=functions.NAME`).
    pub fn function(&self) -> Option<&str> {
        self.recipient
            .as_deref()
            .and_then(|r| r.strip_prefix(FUNCTIONS))
            .filter(|n| !n.is_empty())
    }

    /// Reasoning: the `analysis` channel, and calls to built-in tools (`browser.*`, `python`).
    pub fn is_reasoning(&self) -> bool {
        match &self.recipient {
            Some(_) => self.function().is_none(),
            None => self.channel == "analysis",
        }
    }

    /// A function call as one message, the form the tool reader reads.
    pub fn call_text(&self, body: &str) -> String {
        let r = self.recipient.as_deref().unwrap_or_default();
        format!("{CHANNEL}{} to={r}{MESSAGE}{body}{CALL}", self.channel)
    }
}

/// What the parser finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarmonyEvent {
    /// Text outside any message.
    Text(String),
    Open(Header),
    Body(String),
    /// The open message ended (its terminator, or "" at the end of the reply).
    Close(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Outside,
    /// In a header; `marked`: opened by a marker here (not by the prompt).
    Header {
        marked: bool,
    },
    Body,
}

/// Splits harmony text into messages as it streams. Markers are whole special tokens, but a
/// marker split across deltas is still found (text that may begin one is held back).
#[derive(Debug, Clone)]
pub struct HarmonyParser {
    state: State,
    held: String,
}

const BODY_ENDS: [&str; 4] = [END, CALL, RETURN, START];

impl HarmonyParser {
    /// `in_header`: the prompt opened the first header ([`ASSISTANT_PROMPT`]).
    pub fn new(in_header: bool) -> Self {
        Self {
            state: if in_header {
                State::Header { marked: false }
            } else {
                State::Outside
            },
            held: String::new(),
        }
    }

    pub fn in_header(&self) -> bool {
        matches!(self.state, State::Header { .. })
    }

    pub fn push(&mut self, delta: &str) -> Vec<HarmonyEvent> {
        self.held.push_str(delta);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Outside => {
                    if let Some((at, marker)) = markers::first(&self.held, &[START, CHANNEL]) {
                        self.take(at, HarmonyEvent::Text, &mut out);
                        if marker == START {
                            self.held.drain(..START.len());
                        }
                        self.state = State::Header { marked: true };
                    } else {
                        let keep = markers::held_back(&self.held, &[START, CHANNEL]);
                        self.take(self.held.len() - keep, HarmonyEvent::Text, &mut out);
                        return out;
                    }
                }
                State::Header { .. } => match self.held.find(MESSAGE) {
                    Some(at) => {
                        out.push(HarmonyEvent::Open(Header::parse(&self.held[..at])));
                        self.held.drain(..at + MESSAGE.len());
                        self.state = State::Body;
                    }
                    None if self.held.len() > MAX_HEADER => {
                        self.state = State::Outside;
                        let all = self.held.len();
                        self.take(all, HarmonyEvent::Text, &mut out);
                        return out;
                    }
                    None => return out,
                },
                State::Body => {
                    if let Some((at, end)) = markers::first(&self.held, &BODY_ENDS) {
                        self.take(at, HarmonyEvent::Body, &mut out);
                        // A new message without an end closes this one; its marker is kept.
                        if end == START {
                            out.push(HarmonyEvent::Close(""));
                        } else {
                            self.held.drain(..end.len());
                            out.push(HarmonyEvent::Close(end));
                        }
                        self.state = State::Outside;
                    } else {
                        let keep = markers::held_back(&self.held, &BODY_ENDS);
                        self.take(self.held.len() - keep, HarmonyEvent::Body, &mut out);
                        return out;
                    }
                }
            }
        }
    }

    /// The end of the reply: an open body is closed; a header cut short is dropped, unless
    /// nothing marked it as one (then the reply was plain text).
    pub fn finish(&mut self) -> Vec<HarmonyEvent> {
        let mut out = Vec::new();
        match self.state {
            State::Outside => self.take(self.held.len(), HarmonyEvent::Text, &mut out),
            State::Header { marked } => {
                if !marked && !self.held.contains(CHANNEL) {
                    self.take(self.held.len(), HarmonyEvent::Text, &mut out);
                }
                self.held.clear();
            }
            State::Body => {
                self.take(self.held.len(), HarmonyEvent::Body, &mut out);
                out.push(HarmonyEvent::Close(""));
            }
        }
        self.state = State::Outside;
        out
    }

    /// The first `len` bytes held, as a `Text` or `Body` event (none when empty).
    fn take(&mut self, len: usize, event: fn(String) -> HarmonyEvent, out: &mut Vec<HarmonyEvent>) {
        let t: String = self.held.drain(..len).collect();
        if !t.is_empty() {
            out.push(event(t));
        }
    }
}

/// Harmony messages as reasoning and answer (see the module comment).
#[derive(Debug, Clone)]
pub struct HarmonyReasoning {
    parser: HarmonyParser,
    open: Option<Header>,
    /// The body of an open function call, released whole when it ends.
    call: String,
    entered: bool,
}

impl HarmonyReasoning {
    pub fn new(in_header: bool) -> Self {
        Self {
            parser: HarmonyParser::new(in_header),
            open: None,
            call: String::new(),
            entered: false,
        }
    }

    /// Whether any reasoning message was opened.
    pub fn entered(&self) -> bool {
        self.entered
    }

    /// Inside the body of a reasoning message.
    pub fn in_reasoning(&self) -> bool {
        self.open.as_ref().is_some_and(Header::is_reasoning)
    }

    /// Inside a header (whose channel is not known yet).
    pub fn in_header(&self) -> bool {
        self.parser.in_header()
    }

    pub fn push(&mut self, delta: &str) -> Vec<ReasoningPiece> {
        let events = self.parser.push(delta);
        self.map(events)
    }

    pub fn finish(&mut self) -> Vec<ReasoningPiece> {
        let events = self.parser.finish();
        self.map(events)
    }

    fn map(&mut self, events: Vec<HarmonyEvent>) -> Vec<ReasoningPiece> {
        let mut out = Vec::new();
        for e in events {
            match e {
                // Whitespace between messages is not part of the answer.
                HarmonyEvent::Text(t) if t.trim().is_empty() => {}
                HarmonyEvent::Text(t) => out.push(ReasoningPiece::Content(t)),
                HarmonyEvent::Open(h) => {
                    self.entered |= h.is_reasoning();
                    self.open = Some(h);
                }
                HarmonyEvent::Body(t) => match &self.open {
                    Some(h) if h.function().is_some() => self.call.push_str(&t),
                    Some(h) if h.is_reasoning() => out.push(ReasoningPiece::Reasoning(t)),
                    _ => out.push(ReasoningPiece::Content(t)),
                },
                HarmonyEvent::Close(_) => {
                    if let Some(h) = self.open.take()
                        && h.function().is_some()
                    {
                        let body = std::mem::take(&mut self.call);
                        out.push(ReasoningPiece::Content(h.call_text(&body)));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(channel: &str, recipient: Option<&str>, constrain: Option<&str>) -> Header {
        Header {
            channel: channel.into(),
            recipient: recipient.map(Into::into),
            constrain: constrain.map(Into::into),
        }
    }

    #[test]
    fn headers_in_both_placements() {
        assert_eq!(
            Header::parse("<|channel|>analysis"),
            header("analysis", None, None)
        );
        // The template's placement: recipient in the role part, a bare type after the channel.
        assert_eq!(
            Header::parse("assistant to=functions.get_weather<|channel|>commentary json"),
            header("commentary", Some("functions.get_weather"), Some("json"))
        );
        // The model's usual one: recipient and constraint after the channel.
        let h = Header::parse("<|channel|>commentary to=functions.f <|constrain|>json");
        assert_eq!(h, header("commentary", Some("functions.f"), Some("json")));
        assert_eq!(h.function(), Some("f"));
        assert!(!h.is_reasoning());
        let h = Header::parse("<|channel|>analysis to=browser.search");
        assert!(h.is_reasoning() && h.function().is_none());
        assert!(!Header::parse("<|channel|>commentary").is_reasoning());
    }

    fn events(deltas: &[&str], in_header: bool) -> Vec<HarmonyEvent> {
        let mut p = HarmonyParser::new(in_header);
        let mut out: Vec<HarmonyEvent> = deltas.iter().flat_map(|d| p.push(d)).collect();
        out.extend(p.finish());
        // Deltas of one kind in a row are joined: the split must not matter.
        let mut joined: Vec<HarmonyEvent> = Vec::new();
        for e in out {
            match (joined.last_mut(), e) {
                (Some(HarmonyEvent::Body(a)), HarmonyEvent::Body(b))
                | (Some(HarmonyEvent::Text(a)), HarmonyEvent::Text(b)) => a.push_str(&b),
                (_, e) => joined.push(e),
            }
        }
        joined
    }

    #[test]
    fn messages_whatever_the_deltas() {
        let reply = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant\
                     <|channel|>commentary to=functions.get_weather <|constrain|>json\
                     <|message|>{\"city\":\"Paris\"}<|call|>";
        let want = vec![
            HarmonyEvent::Open(header("analysis", None, None)),
            HarmonyEvent::Body("Need weather.".into()),
            HarmonyEvent::Close(END),
            HarmonyEvent::Open(header(
                "commentary",
                Some("functions.get_weather"),
                Some("json"),
            )),
            HarmonyEvent::Body("{\"city\":\"Paris\"}".into()),
            HarmonyEvent::Close(CALL),
        ];
        assert_eq!(events(&[reply], true), want);
        // Every split point, markers cut in two included.
        for cut in 1..reply.len() {
            if reply.is_char_boundary(cut) {
                assert_eq!(events(&[&reply[..cut], &reply[cut..]], true), want, "{cut}");
            }
        }
    }

    #[test]
    fn plain_text_and_cut_replies() {
        // No markers at all (a reply constrained to JSON): all of it is text.
        assert_eq!(
            events(&["{\"a\": 1}"], true),
            vec![HarmonyEvent::Text("{\"a\": 1}".into())]
        );
        let long = "x".repeat(MAX_HEADER + 1);
        assert_eq!(events(&[&long], true), vec![HarmonyEvent::Text(long)]);
        // Cut inside a header: nothing; inside a body: the body, closed.
        assert_eq!(events(&["<|channel|>anal"], true), vec![]);
        assert_eq!(
            events(&["<|channel|>final<|message|>Hel"], true),
            vec![
                HarmonyEvent::Open(header("final", None, None)),
                HarmonyEvent::Body("Hel".into()),
                HarmonyEvent::Close(""),
            ]
        );
        // A `<|` in a body that is no marker is body text.
        assert_eq!(
            events(
                &["<|channel|>final<|message|>a <|b", "|> c<|return|>"],
                true
            ),
            vec![
                HarmonyEvent::Open(header("final", None, None)),
                HarmonyEvent::Body("a <|b|> c".into()),
                HarmonyEvent::Close(RETURN),
            ]
        );
    }

    fn pieces(deltas: &[&str]) -> Vec<ReasoningPiece> {
        let mut h = HarmonyReasoning::new(true);
        let mut out: Vec<ReasoningPiece> = deltas.iter().flat_map(|d| h.push(d)).collect();
        out.extend(h.finish());
        out
    }

    #[test]
    fn reasoning_answer_and_calls() {
        let r = |t: &str| ReasoningPiece::Reasoning(t.into());
        let c = |t: &str| ReasoningPiece::Content(t.into());
        // Analysis then final, token by token: `reasoning::tests::harmony_channels_token_by_token`.
        // A call is released whole, in canonical form, when it ends (or the reply does: the
        // `<|call|>` that stopped generation is not in the text).
        let call = "<|channel|>commentary to=functions.f<|message|>{\"a\":1}<|call|>";
        assert_eq!(
            pieces(&[
                "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f",
                "<|channel|>commentary json<|message|>{\"a\"",
                ":1}",
            ]),
            vec![r("x"), c(call)]
        );
        // A built-in tool's call is reasoning.
        assert_eq!(
            pieces(&["<|channel|>analysis to=browser.search<|message|>{\"q\":1}<|call|>"]),
            vec![r("{\"q\":1}")]
        );
    }
}
