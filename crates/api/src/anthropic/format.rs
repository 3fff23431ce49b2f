//! Anthropic message objects and their event stream: `message_start`, per content block
//! `content_block_start`, `content_block_delta` (`text_delta` / `input_json_delta`) and
//! `content_block_stop`, then `message_delta` (with `stop_reason` and the output usage) and
//! `message_stop`.

use serde_json::{Value, json};

use crate::openai::ToolCallOut;
use crate::reply::{ReplyPart, StopKind};
use crate::sse;

/// Identity of one message.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageMeta {
    /// `msg_<hex>`.
    pub id: String,
    pub model: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MessagesUsage {
    pub input_tokens: usize,
    pub cached_tokens: usize,
    pub output_tokens: usize,
}

impl MessagesUsage {
    fn json(&self) -> Value {
        json!({
            "input_tokens": self.input_tokens - self.cached_tokens.min(self.input_tokens),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
        })
    }
}

fn stop_reason(stop: StopKind) -> &'static str {
    match stop {
        StopKind::EndTurn => "end_turn",
        StopKind::StopSequence => "stop_sequence",
        StopKind::MaxTokens => "max_tokens",
        StopKind::ToolUse => "tool_use",
    }
}

/// A tool call's id as Anthropic writes them (`toolu_...`).
fn tool_use_id(c: &ToolCallOut) -> String {
    format!("toolu_{}", c.id.strip_prefix("call_").unwrap_or(&c.id))
}

/// A call's arguments as the `input` object (`{}` when they are not an object).
fn input(c: &ToolCallOut) -> Value {
    match serde_json::from_str::<Value>(&c.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

fn tool_use_block(c: &ToolCallOut) -> Value {
    json!({"type": "tool_use", "id": tool_use_id(c), "name": c.name, "input": input(c)})
}

/// A `thinking` block: the served model's reasoning, unsigned (no signature to verify: an
/// earlier turn's thinking is dropped when a conversation continues).
fn thinking_block(t: &str) -> Value {
    json!({"type": "thinking", "thinking": t, "signature": ""})
}

/// The content blocks of a finished reply.
pub fn content_blocks(parts: &[ReplyPart]) -> Vec<Value> {
    parts
        .iter()
        .filter_map(|p| match p {
            ReplyPart::Text(t) | ReplyPart::Reasoning(t) if t.trim().is_empty() => None,
            ReplyPart::Reasoning(t) => Some(thinking_block(t)),
            ReplyPart::Text(t) => Some(json!({"type": "text", "text": t})),
            ReplyPart::ToolCall(c) => Some(tool_use_block(c)),
        })
        .collect()
}

/// The message object; `stop` None: the start of a stream (no content, no stop reason).
pub fn message(
    meta: &MessageMeta,
    content: Vec<Value>,
    stop: Option<StopKind>,
    stop_sequence: Option<&str>,
    usage: MessagesUsage,
) -> Value {
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": stop.map(stop_reason),
        "stop_sequence": stop_sequence,
        "usage": usage.json(),
    })
}

/// `/v1/messages/count_tokens`: `{"input_tokens": n}`.
pub fn token_count(input_tokens: usize) -> Value {
    json!({"input_tokens": input_tokens})
}

/// One streamed message: each call renders the events for what the reply released.
pub struct MessagesStream {
    meta: MessageMeta,
    /// Index of the next block.
    blocks: usize,
    /// A text block is open (index `blocks - 1`).
    text_open: bool,
    /// A thinking block is open (index `blocks - 1`).
    thinking_open: bool,
    called: bool,
}

fn event(kind: &str, mut body: Value) -> String {
    body["type"] = json!(kind);
    sse::event(kind, &crate::error::compact(&body))
}

impl MessagesStream {
    pub fn new(meta: MessageMeta) -> Self {
        Self {
            meta,
            blocks: 0,
            text_open: false,
            thinking_open: false,
            called: false,
        }
    }

    /// `message_start` (with the prompt's usage).
    pub fn start(&mut self, usage: MessagesUsage) -> String {
        let m = message(&self.meta, Vec::new(), None, None, usage);
        event("message_start", json!({"message": m}))
    }

    pub fn part(&mut self, part: &ReplyPart) -> String {
        match part {
            ReplyPart::Reasoning(t) => self.thinking(t),
            ReplyPart::Text(t) => self.text(t),
            ReplyPart::ToolCall(c) => self.call(c),
        }
    }

    /// Reasoning comes first: a `thinking` block with `thinking_delta`s, closed when the
    /// answer (or a call) begins.
    fn thinking(&mut self, delta: &str) -> String {
        if delta.is_empty() || (!self.thinking_open && delta.trim().is_empty()) {
            return String::new();
        }
        let mut out = String::new();
        if !self.thinking_open {
            out.push_str(&self.close_text());
            out.push_str(&event(
                "content_block_start",
                json!({"index": self.blocks, "content_block": thinking_block("")}),
            ));
            self.blocks += 1;
            self.thinking_open = true;
        }
        out.push_str(&event(
            "content_block_delta",
            json!({"index": self.blocks - 1, "delta": {"type": "thinking_delta", "thinking": delta}}),
        ));
        out
    }

    fn close_thinking(&mut self) -> String {
        if !self.thinking_open {
            return String::new();
        }
        self.thinking_open = false;
        event("content_block_stop", json!({"index": self.blocks - 1}))
    }

    fn text(&mut self, delta: &str) -> String {
        if delta.is_empty() || (!self.text_open && delta.trim().is_empty()) {
            return String::new();
        }
        let mut out = String::new();
        if !self.text_open {
            out.push_str(&self.close_thinking());
            out.push_str(&event(
                "content_block_start",
                json!({"index": self.blocks, "content_block": {"type": "text", "text": ""}}),
            ));
            self.blocks += 1;
            self.text_open = true;
        }
        out.push_str(&event(
            "content_block_delta",
            json!({"index": self.blocks - 1, "delta": {"type": "text_delta", "text": delta}}),
        ));
        out
    }

    fn close_text(&mut self) -> String {
        if !self.text_open {
            return String::new();
        }
        self.text_open = false;
        event("content_block_stop", json!({"index": self.blocks - 1}))
    }

    fn call(&mut self, c: &ToolCallOut) -> String {
        let mut out = self.close_thinking();
        out.push_str(&self.close_text());
        let index = self.blocks;
        self.blocks += 1;
        self.called = true;
        out.push_str(&event(
            "content_block_start",
            json!({"index": index, "content_block": {"type": "tool_use", "id": tool_use_id(c),
                "name": c.name, "input": {}}}),
        ));
        out.push_str(&event(
            "content_block_delta",
            json!({"index": index, "delta": {"type": "input_json_delta",
                "partial_json": input(c).to_string()}}),
        ));
        out.push_str(&event("content_block_stop", json!({"index": index})));
        out
    }

    /// True once the reply has made a tool call.
    pub fn called(&self) -> bool {
        self.called
    }

    /// Closes the open block; `message_delta` and `message_stop`.
    pub fn finish(
        &mut self,
        stop: StopKind,
        stop_sequence: Option<&str>,
        output_tokens: usize,
    ) -> String {
        let mut out = self.close_thinking();
        out.push_str(&self.close_text());
        out.push_str(&event(
            "message_delta",
            json!({"delta": {"stop_reason": stop_reason(stop), "stop_sequence": stop_sequence},
                "usage": {"output_tokens": output_tokens}}),
        ));
        out.push_str(&event("message_stop", json!({})));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_anthropics_event_sequence() {
        let meta = MessageMeta {
            id: "msg_1".into(),
            model: "m".into(),
        };
        let mut s = MessagesStream::new(meta);
        let mut out = s.start(MessagesUsage {
            input_tokens: 5,
            cached_tokens: 0,
            output_tokens: 0,
        });
        out.push_str(&s.part(&ReplyPart::Text("Hi".into())));
        let call = ToolCallOut {
            id: "call_ab".into(),
            name: "f".into(),
            arguments: r#"{"x":1}"#.into(),
        };
        out.push_str(&s.part(&ReplyPart::ToolCall(call)));
        out.push_str(&s.finish(StopKind::ToolUse, None, 9));
        let events: Vec<(String, Value)> = out
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let mut lines = e.lines();
                let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
                let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
                (name.to_string(), serde_json::from_str(data).unwrap())
            })
            .collect();
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (n, v) in &events {
            assert_eq!(v["type"], n.as_str());
        }
        assert_eq!(events[4].1["content_block"]["id"], "toolu_ab");
        assert_eq!(events[5].1["delta"]["partial_json"], r#"{"x":1}"#);
        assert_eq!(events[5].1["index"], 1);
        assert_eq!(events[7].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 5);
    }
}
