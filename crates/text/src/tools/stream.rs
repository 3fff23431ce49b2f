//! Splitting model output, as it streams, into content and tool calls.
//!
//! Content is passed on as soon as it cannot be the start of a call; from a call marker on,
//! text is held until the call is complete. Decisions depend only on the text seen so far,
//! never on how it was split into deltas, so streaming gives what parsing the whole output
//! gives ([`super::parse_tool_calls`] is this parser fed once).
//!
//! Content is the output with the calls cut out, trimmed: leading whitespace is dropped and
//! trailing whitespace is held until more content follows.

use super::call_json::{ParsedToolCall, call_from_object, calls_from_json, json_end};
use super::format::ToolCallFormat;

/// A piece of streamed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolStreamPiece {
    Content(String),
    Call(ParsedToolCall),
}

/// Incremental tool call parser for one generation.
#[derive(Debug, Clone)]
pub struct ToolStreamParser {
    format: ToolCallFormat,
    /// Text not yet passed on: a possible marker prefix, or a call being read.
    buf: String,
    state: State,
    /// Whitespace after the last content, sent only if more content follows.
    held_ws: String,
    content_started: bool,
    /// Only whitespace seen so far (Llama 3 calls may start with a bare `{`).
    at_start: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Content; `buf` may hold the start of a marker.
    Text,
    /// `buf` starts with the format's marker.
    Marker,
    /// Llama 3: `buf` starts at the calls of one turn (after the tag or at a bare `{`);
    /// `first` until one call has been read.
    LlamaCalls { first: bool },
}

/// What the text at the start of a call region turned out to be.
enum Step {
    /// More text is needed to decide.
    Wait,
    /// The first `len` bytes are these calls (possibly none: `<tool_call>[]</tool_call>`).
    Calls(usize, Vec<ParsedToolCall>),
    /// The first `len` bytes are ordinary text.
    Text(usize),
    /// The first `len` bytes are a message whose text is this (harmony without a recipient).
    Content(usize, String),
}

impl ToolStreamParser {
    pub fn new(format: ToolCallFormat) -> Self {
        Self {
            format,
            buf: String::new(),
            state: State::Text,
            held_ws: String::new(),
            content_started: false,
            at_start: true,
        }
    }

    pub fn push(&mut self, delta: &str) -> Vec<ToolStreamPiece> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        self.advance(false, &mut out);
        out
    }

    /// End of output: whatever is still held (an unfinished or malformed call) is content.
    pub fn finish(mut self) -> Vec<ToolStreamPiece> {
        let mut out = Vec::new();
        self.advance(true, &mut out);
        out
    }

    fn advance(&mut self, eof: bool, out: &mut Vec<ToolStreamPiece>) {
        loop {
            let step = match self.state {
                State::Text => {
                    if !self.scan_text(eof, out) {
                        return;
                    }
                    continue;
                }
                State::Marker => self.marker_step(eof),
                State::LlamaCalls { first } => self.llama_step(first, eof),
            };
            match step {
                Step::Wait if eof => {
                    let rest = std::mem::take(&mut self.buf);
                    self.content(&rest, out);
                    self.state = State::Text;
                }
                Step::Wait => return,
                Step::Calls(len, calls) => {
                    self.buf.drain(..len);
                    out.extend(calls.into_iter().map(ToolStreamPiece::Call));
                    self.state = match self.format {
                        ToolCallFormat::Llama3Json => State::LlamaCalls { first: false },
                        _ => State::Text,
                    };
                }
                Step::Text(len) => {
                    let text: String = self.buf.drain(..len).collect();
                    self.content(&text, out);
                    self.state = State::Text;
                }
                Step::Content(len, text) => {
                    self.buf.drain(..len);
                    self.content(&text, out);
                    self.state = State::Text;
                }
            }
        }
    }

    /// Passes on content up to a marker (then returns true) or up to a possible marker
    /// prefix at the end (then returns false: more text is needed).
    fn scan_text(&mut self, eof: bool, out: &mut Vec<ToolStreamPiece>) -> bool {
        if self.at_start && self.format == ToolCallFormat::Llama3Json {
            let trimmed = self.buf.trim_start();
            if trimmed.is_empty() {
                // Leading whitespace is never content.
                self.buf.clear();
                return false;
            }
            self.at_start = false;
            if trimmed.starts_with('{') {
                self.buf.drain(..self.buf.len() - trimmed.len());
                self.state = State::LlamaCalls { first: true };
                return true;
            }
        }
        let markers = self.format.markers();
        if let Some((at, _)) = crate::markers::first(&self.buf, markers) {
            let text: String = self.buf.drain(..at).collect();
            self.content(&text, out);
            self.at_start = false;
            self.state = match self.format {
                ToolCallFormat::Llama3Json => State::LlamaCalls { first: true },
                _ => State::Marker,
            };
            return true;
        }
        let keep = if eof {
            0
        } else {
            crate::markers::held_back(&self.buf, markers)
        };
        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
        if !text.trim().is_empty() {
            self.at_start = false;
        }
        self.content(&text, out);
        false
    }

    fn marker_step(&self, eof: bool) -> Step {
        match self.format {
            ToolCallFormat::Hermes | ToolCallFormat::SmolLm => tagged_step(&self.buf, eof),
            ToolCallFormat::Mistral => mistral_step(&self.buf),
            ToolCallFormat::Harmony => harmony_step(&self.buf, eof),
            // Llama's marker leads to LlamaCalls, never here.
            ToolCallFormat::Llama3Json => Step::Text(self.buf.len()),
        }
    }

    /// Llama 3: JSON call objects separated by whitespace or `;`, after the optional tag.
    fn llama_step(&mut self, first: bool, eof: bool) -> Step {
        let marker = "<|python_tag|>";
        let head = if first && self.buf.starts_with(marker) {
            marker.len()
        } else {
            0
        };
        let rest = &self.buf[head..];
        let body = if first {
            rest.trim_start()
        } else {
            rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';')
        };
        let skipped = rest.len() - body.len();
        if !first && skipped > 0 {
            // Separators between calls belong to the calls, whatever follows.
            self.buf.drain(..skipped);
            return self.llama_step(first, eof);
        }
        let start = head + skipped;
        if body.is_empty() {
            return if first || !eof {
                Step::Wait
            } else {
                Step::Text(0)
            };
        }
        if !body.starts_with('{') {
            return Step::Text(start);
        }
        match json_end(body) {
            None => Step::Wait,
            Some(end) => match call_from_object(&body[..end]) {
                Ok(call) => Step::Calls(start + end, vec![call]),
                Err(_) => Step::Text(start + end),
            },
        }
    }

    /// Content goes out trimmed: see the module comment.
    fn content(&mut self, text: &str, out: &mut Vec<ToolStreamPiece>) {
        let text = if self.content_started {
            text
        } else {
            text.trim_start()
        };
        let body = text.trim_end();
        if body.is_empty() {
            self.held_ws.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.held_ws);
        piece.push_str(body);
        self.held_ws.push_str(&text[body.len()..]);
        self.content_started = true;
        match out.last_mut() {
            Some(ToolStreamPiece::Content(last)) => last.push_str(&piece),
            _ => out.push(ToolStreamPiece::Content(piece)),
        }
    }
}

/// Hermes and SmolLM2: `<tool_call>` JSON `</tool_call>`, the JSON one call or a list.
/// A block left open at the end still counts if what follows the tag is complete.
fn tagged_step(buf: &str, eof: bool) -> Step {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let inner = &buf[OPEN.len()..];
    match inner.find(CLOSE) {
        Some(at) => {
            let len = OPEN.len() + at + CLOSE.len();
            match calls_from_json(&inner[..at]) {
                Some(calls) => Step::Calls(len, calls),
                None => Step::Text(len),
            }
        }
        None if eof => match calls_from_json(inner) {
            Some(calls) => Step::Calls(buf.len(), calls),
            None => Step::Text(buf.len()),
        },
        None => Step::Wait,
    }
}

/// Mistral: `[TOOL_CALLS]` then a JSON list (or one object) of calls, or the newer
/// `[TOOL_CALLS]name[ARGS]{..}` / `[TOOL_CALLS]name{..}`.
fn mistral_step(buf: &str) -> Step {
    const MARKER: &str = "[TOOL_CALLS]";
    const ARGS: &str = "[ARGS]";
    let rest = &buf[MARKER.len()..];
    let body = rest.trim_start();
    let start = MARKER.len() + rest.len() - body.len();
    let Some(first) = body.chars().next() else {
        return Step::Wait;
    };
    if first == '[' || first == '{' {
        return match json_end(body) {
            None => Step::Wait,
            Some(end) => match calls_from_json(&body[..end]) {
                Some(calls) => Step::Calls(start + end, calls),
                None => Step::Text(start + end),
            },
        };
    }
    let is_name = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.');
    let name_len = body.find(|c: char| !is_name(c)).unwrap_or(body.len());
    if name_len == 0 {
        return Step::Text(MARKER.len());
    }
    let after_name = &body[name_len..];
    let args = match after_name.strip_prefix(ARGS) {
        Some(args) => args,
        None if ARGS.starts_with(after_name) && !after_name.is_empty() => return Step::Wait,
        None => after_name,
    };
    let args_body = args.trim_start();
    let args_start = start + body.len() - args_body.len();
    match args_body.chars().next() {
        None => Step::Wait,
        Some('{') => match json_end(args_body) {
            None => Step::Wait,
            Some(end) => {
                let object = format!(
                    "{{\"name\": {}, \"arguments\": {}}}",
                    serde_json::Value::from(&body[..name_len]),
                    &args_body[..end]
                );
                match call_from_object(&object) {
                    Ok(call) => Step::Calls(args_start + end, vec![call]),
                    Err(_) => Step::Text(MARKER.len()),
                }
            }
        },
        Some(_) => Step::Text(MARKER.len()),
    }
}

/// Harmony: `<|start|>` or `<|channel|>` opens a message; one to `functions.NAME` is a call
/// whose body is the arguments, any other gives its body as content (the raw reply, when
/// reasoning is not split off first), as does a call whose arguments are not JSON (one cut
/// short). A message left open at the end counts if what it holds is complete.
fn harmony_step(buf: &str, eof: bool) -> Step {
    use crate::harmony::{CALL, END, Header, MAX_HEADER, MESSAGE, RETURN, START};
    let Some(at) = buf.find(MESSAGE) else {
        return if eof || buf.len() > MAX_HEADER {
            Step::Text(buf.len().min(MAX_HEADER))
        } else {
            Step::Wait
        };
    };
    let header = Header::parse(buf[..at].strip_prefix(START).unwrap_or(&buf[..at]));
    let start = at + MESSAGE.len();
    let body = &buf[start..];
    let (body, len) = match crate::markers::first(body, &[CALL, END, RETURN]) {
        Some((i, m)) => (&body[..i], start + i + m.len()),
        None if eof => (body, buf.len()),
        None => return Step::Wait,
    };
    let Some(name) = header.function() else {
        return Step::Content(len, body.to_string());
    };
    // The body must be one JSON value before it is spliced into a call object.
    let args = body.trim();
    if serde_json::from_str::<&serde_json::value::RawValue>(args).is_err() {
        return Step::Content(len, body.to_string());
    }
    let object = format!(
        "{{\"name\": {}, \"arguments\": {args}}}",
        serde_json::Value::from(name)
    );
    match call_from_object(&object) {
        Ok(call) => Step::Calls(len, vec![call]),
        Err(_) => Step::Content(len, body.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_tool_calls;
    use super::*;
    use ToolCallFormat::*;

    const SAMPLES: &[(ToolCallFormat, &str)] = &[
        (
            Hermes,
            "Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n</tool_call>",
        ),
        (
            Hermes,
            "a <tool_call>{\"name\": \"f\"}</tool_call> b <tool_call>bad</tool_call> c <tool_",
        ),
        (Hermes, "No tools needed: 1 < 2 and <tool is not a tag."),
        (
            SmolLm,
            "  <tool_call>[{\"name\": \"a\", \"arguments\": {\"s\": \"</tool\"}}]</tool_call>  ",
        ),
        (
            SmolLm,
            "<tool_call>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}",
        ),
        (
            Llama3Json,
            "\n{\"name\": \"a\", \"parameters\": {\"q\": \"x;y\"}} ; {\"name\": \"b\", \"parameters\": {}} trailing",
        ),
        (Llama3Json, "{\"answer\": 42} and more"),
        (
            Llama3Json,
            "Calling.<|python_tag|>{\"name\": \"a\", \"parameters\": {}};{\"name\":",
        ),
        (
            Llama3Json,
            "<|python_tag|> not json <|python_tag|>{\"name\": \"b\"}",
        ),
        (
            Mistral,
            "ok [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}] [TOOL_CALLS]b[ARGS]{\"k\": [1]} [TOOL_CALLS]? end",
        ),
        (Mistral, "[TOOL_CALLS]name_only"),
        (
            Harmony,
            "Checking. <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Zürich\"}<|call|><|channel|>commentary to=functions.t<|message|>{}",
        ),
        (
            Harmony,
            "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Yes.<|return|>",
        ),
        (
            Harmony,
            "<|channel|>commentary to=functions.f<|message|>not json<|call|> after <|channel|>fin",
        ),
        (
            Harmony,
            "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\": 1}<|call|>",
        ),
    ];

    fn stream(format: ToolCallFormat, deltas: &[&str]) -> (String, Vec<ParsedToolCall>) {
        let mut parser = ToolStreamParser::new(format);
        let mut pieces: Vec<ToolStreamPiece> = Vec::new();
        for d in deltas {
            pieces.extend(parser.push(d));
        }
        pieces.extend(parser.finish());
        let mut content = String::new();
        let mut calls = Vec::new();
        for p in pieces {
            match p {
                ToolStreamPiece::Content(c) => {
                    assert!(!c.is_empty(), "empty content piece");
                    content.push_str(&c);
                }
                ToolStreamPiece::Call(c) => calls.push(c),
            }
        }
        (content, calls)
    }

    fn char_bounds(text: &str) -> Vec<usize> {
        (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect()
    }

    #[test]
    fn any_single_split_gives_the_whole_text_result() {
        for &(format, text) in SAMPLES {
            let whole = parse_tool_calls(format, text);
            for i in char_bounds(text) {
                let got = stream(format, &[&text[..i], &text[i..]]);
                assert_eq!(got, whole, "{format} split at {i}: {text:?}");
            }
        }
    }

    #[test]
    fn char_by_char_and_two_splits_give_the_whole_text_result() {
        for &(format, text) in SAMPLES {
            let whole = parse_tool_calls(format, text);
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let deltas: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(stream(format, &deltas), whole, "{format} by char: {text:?}");
            let bounds = char_bounds(text);
            for (n, &i) in bounds.iter().enumerate().step_by(3) {
                for &j in bounds[n..].iter().step_by(5) {
                    let got = stream(format, &[&text[..i], &text[i..j], &text[j..]]);
                    assert_eq!(got, whole, "{format} splits {i},{j}: {text:?}");
                }
            }
        }
    }

    #[test]
    fn samples_parse_as_expected() {
        let expected_calls = [2, 1, 0, 1, 0, 2, 0, 1, 1, 2, 0, 2, 0, 0, 1];
        for (&(format, text), n) in SAMPLES.iter().zip(expected_calls) {
            assert_eq!(parse_tool_calls(format, text).1.len(), n, "{text:?}");
        }
        assert_eq!(
            parse_tool_calls(Hermes, SAMPLES[1].1).0,
            "a  b <tool_call>bad</tool_call> c <tool_"
        );
        assert_eq!(
            parse_tool_calls(Llama3Json, SAMPLES[7].1).0,
            "Calling.{\"name\":"
        );
        assert_eq!(
            parse_tool_calls(Mistral, SAMPLES[9].1).0,
            "ok   [TOOL_CALLS]? end"
        );
        let (content, calls) = parse_tool_calls(Harmony, SAMPLES[11].1);
        assert_eq!(content, "Checking.");
        assert_eq!(
            calls[0],
            ParsedToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\":\"Zürich\"}".into()
            }
        );
        // The raw reply (reasoning not split off): each message's text, markup dropped.
        assert_eq!(parse_tool_calls(Harmony, SAMPLES[12].1).0, "hmYes.");
        assert_eq!(
            parse_tool_calls(Harmony, SAMPLES[13].1).0,
            "not json after <|channel|>fin"
        );
    }

    #[test]
    fn content_is_not_held_longer_than_a_marker_prefix() {
        let mut p = ToolStreamParser::new(Hermes);
        assert_eq!(p.push("Hello"), [ToolStreamPiece::Content("Hello".into())]);
        // Trailing whitespace waits for more content; "<tool" might open a call.
        assert_eq!(p.push(" wor"), [ToolStreamPiece::Content(" wor".into())]);
        assert_eq!(p.push("ld <tool"), [ToolStreamPiece::Content("ld".into())]);
        assert_eq!(
            p.push("box>"),
            [ToolStreamPiece::Content(" <toolbox>".into())]
        );
        assert_eq!(p.push("<tool_call>{\"name\": \"f\", "), []);
        assert_eq!(
            p.push("\"arguments\": {}}</tool_call> after"),
            [
                ToolStreamPiece::Call(ParsedToolCall {
                    name: "f".into(),
                    arguments: "{}".into()
                }),
                ToolStreamPiece::Content(" after".into())
            ]
        );
        assert_eq!(p.finish(), []);
    }

    #[test]
    fn unfinished_call_is_flushed_as_content() {
        let mut p = ToolStreamParser::new(SmolLm);
        assert_eq!(
            p.push("x <tool_call>[{\"name\": "),
            [ToolStreamPiece::Content("x".into())]
        );
        assert_eq!(
            p.finish(),
            [ToolStreamPiece::Content(" <tool_call>[{\"name\":".into())]
        );
    }

    #[test]
    fn llama_bare_json_waits_then_decides() {
        let mut p = ToolStreamParser::new(Llama3Json);
        assert_eq!(p.push(" {\"answer\""), []);
        assert_eq!(
            p.push(": 1} ok"),
            [ToolStreamPiece::Content("{\"answer\": 1} ok".into())]
        );
        let mut p = ToolStreamParser::new(Llama3Json);
        assert_eq!(p.push("Hi {"), [ToolStreamPiece::Content("Hi {".into())]);
    }
}
