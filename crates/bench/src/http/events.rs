//! Incremental stream parsing: a response body split into events as its bytes arrive, and
//! what each event is.

use serde_json::Value;

use super::Route;

/// Splits a response body into events as bytes arrive, without buffering the whole body.
/// SSE (`text/event-stream`): `data:` lines (one optional space after the colon) are joined with
/// `\n` and dispatched at the blank line ending the event; comments and other fields are
/// skipped. Jsonlines: every non-empty line is an event. `\r\n` line ends are accepted.
#[derive(Default)]
pub struct EventParser {
    sse: bool,
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

impl EventParser {
    pub fn new(sse: bool) -> EventParser {
        EventParser {
            sse,
            ..Default::default()
        }
    }

    /// Feeds one chunk; calls `on_event` with the payload of every event it completes.
    pub fn feed(&mut self, mut chunk: &[u8], on_event: &mut impl FnMut(&[u8])) {
        while let Some(nl) = chunk.iter().position(|&b| b == b'\n') {
            let (head, rest) = chunk.split_at(nl);
            chunk = &rest[1..];
            if self.line.is_empty() {
                self.line_done(head, on_event);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                self.line_done(&line, on_event);
                line.clear();
                self.line = line;
            }
        }
        self.line.extend_from_slice(chunk);
    }

    /// End of body: dispatches what a last line without a newline completes.
    pub fn finish(&mut self, on_event: &mut impl FnMut(&[u8])) {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line, on_event);
        }
        if self.sse {
            self.line_done(b"", on_event);
        }
    }

    fn line_done(&mut self, line: &[u8], on_event: &mut impl FnMut(&[u8])) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !self.sse {
            if !line.is_empty() {
                on_event(line);
            }
            return;
        }
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
                self.data.clear();
                self.has_data = false;
            }
            return;
        }
        if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(v);
            self.has_data = true;
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// What one stream event is.
#[derive(Debug, PartialEq, Eq)]
pub enum EventKind {
    Token,
    Error,
    Other,
}

pub fn classify(route: Route, ev: &[u8]) -> EventKind {
    let ev = ev.trim_ascii();
    if ev.starts_with(b"{\"error\"")
        || contains(ev, b"\"error_msg\"")
        || contains(ev, b"\"finish_reason\":\"error\"")
    {
        return EventKind::Error;
    }
    if ev == b"[DONE]" {
        return EventKind::Other;
    }
    match route {
        // TGI and LMI send exactly one event per token (the last one carries the summary).
        Route::GenerateStream | Route::Generate | Route::Invocations => EventKind::Token,
        // Role chunk, finish-only chunk and usage chunk carry no token.
        Route::Chat if contains(ev, b"\"delta\":{\"content\":") => EventKind::Token,
        Route::Chat => EventKind::Other,
    }
}

/// Generated tokens in a non-streamed answer: TGI/LMI `details.generated_tokens`, OpenAI
/// `usage.completion_tokens`.
pub fn tokens_in_json(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let v = if let Value::Array(a) = &v {
        a.first()?
    } else {
        &v
    };
    v.pointer("/details/generated_tokens")
        .or_else(|| v.pointer("/usage/completion_tokens"))
        .and_then(Value::as_u64)
}
