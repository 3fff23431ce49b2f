//! Response objects (`"object": "response"`) and the typed event stream of the Responses API:
//! `response.created`, `response.in_progress`, per output item `response.output_item.added`,
//! (`response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done`) or (`response.function_call_arguments.delta`,
//! `response.function_call_arguments.done`), `response.output_item.done`, and at the end
//! `response.completed` (or `response.incomplete` when `max_output_tokens` ran out).

use serde_json::{Value, json};

use super::request::ResponseEcho;
use crate::openai::ToolCallOut;
use crate::reply::{ReplyPart, StopKind};
use crate::sse;

/// Identity of one response.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    /// `resp_<hex>`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    pub model: String,
}

impl ResponseMeta {
    /// The id of output item `index` (`msg_...` / `fc_...`), unique with the response's id.
    pub(crate) fn item_id(&self, prefix: &str, index: usize) -> String {
        let tail = self.id.strip_prefix("resp_").unwrap_or(&self.id);
        format!("{prefix}_{tail}{index:02x}")
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponsesUsage {
    pub input_tokens: usize,
    pub cached_tokens: usize,
    pub output_tokens: usize,
    /// Of the output tokens, those of the reasoning (tags included).
    pub reasoning_tokens: usize,
}

impl ResponsesUsage {
    fn json(&self) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        })
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content: Vec<Value> = if status == "in_progress" {
        Vec::new()
    } else {
        vec![text_part(text)]
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "status": status, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}]})
}

fn call_item(id: &str, call: &ToolCallOut, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call.id, "name": call.name,
        "arguments": arguments, "status": status})
}

/// The output items of a finished reply: its text as one message, each call as a
/// `function_call` item, in the order they were said.
pub fn output_items(meta: &ResponseMeta, parts: &[ReplyPart]) -> Vec<Value> {
    let mut items = Vec::new();
    for p in parts {
        let index = items.len();
        match p {
            ReplyPart::Text(t) | ReplyPart::Reasoning(t) if t.trim().is_empty() => {}
            ReplyPart::Reasoning(t) => {
                items.push(reasoning_item(&meta.item_id("rs", index), t, "completed"))
            }
            ReplyPart::Text(t) => {
                items.push(message_item(&meta.item_id("msg", index), t, "completed"))
            }
            ReplyPart::ToolCall(c) => items.push(call_item(
                &meta.item_id("fc", index),
                c,
                &c.arguments,
                "completed",
            )),
        }
    }
    items
}

/// The response object. `stop` None: still in progress (stream start); `usage` is null then.
pub fn response_object(
    meta: &ResponseMeta,
    echo: &ResponseEcho,
    output: &[Value],
    stop: Option<StopKind>,
    usage: Option<ResponsesUsage>,
) -> Value {
    let (status, incomplete) = match stop {
        None => ("in_progress", Value::Null),
        Some(StopKind::MaxTokens) => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(_) => ("completed", Value::Null),
    };
    json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": echo.previous_response_id,
        "reasoning": echo.reasoning,
        "store": echo.store,
        "temperature": echo.temperature,
        "text": echo.text,
        "tool_choice": echo.tool_choice,
        "tools": echo.tools,
        "top_p": echo.top_p,
        "truncation": "disabled",
        "usage": usage.map(|u| u.json()),
        "user": echo.user,
        "metadata": echo.metadata,
    })
}

/// `{"id", "object": "response.deleted", "deleted": true}`.
pub fn deleted(id: &str) -> Value {
    json!({"id": id, "object": "response.deleted", "deleted": true})
}

/// The message item being streamed.
struct OpenText {
    index: usize,
    id: String,
    text: String,
}

/// One streamed response: each call renders the events for what the reply released, with
/// the stream's sequence numbers; the output items are kept for the final response object.
pub struct ResponsesStream {
    meta: ResponseMeta,
    echo: ResponseEcho,
    seq: u64,
    output: Vec<Value>,
    text: Option<OpenText>,
    /// The reasoning item being streamed.
    thinking: Option<OpenText>,
}

impl ResponsesStream {
    pub fn new(meta: ResponseMeta, echo: ResponseEcho) -> Self {
        Self {
            meta,
            echo,
            seq: 0,
            output: Vec::new(),
            text: None,
            thinking: None,
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> String {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        sse::event(kind, &crate::error::compact(&body))
    }

    /// The next sequence number (for the error event of a failed stream).
    pub fn sequence_number(&self) -> u64 {
        self.seq
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> String {
        let r = response_object(&self.meta, &self.echo, &[], None, None);
        let mut out = self.event("response.created", json!({"response": r}));
        out.push_str(&self.event("response.in_progress", json!({"response": r})));
        out
    }

    /// The events for one released part of the reply.
    pub fn part(&mut self, part: &ReplyPart) -> String {
        match part {
            ReplyPart::Reasoning(t) => self.reasoning_delta(t),
            ReplyPart::Text(t) => self.text_delta(t),
            ReplyPart::ToolCall(c) => self.call(c),
        }
    }

    /// Reasoning comes first: a `reasoning` item with `reasoning_text` deltas, closed when
    /// the answer (or a call) begins.
    fn reasoning_delta(&mut self, delta: &str) -> String {
        if delta.is_empty() || (self.thinking.is_none() && delta.trim().is_empty()) {
            return String::new();
        }
        let mut out = String::new();
        if self.thinking.is_none() {
            out.push_str(&self.close_text());
            let index = self.output.len();
            let id = self.meta.item_id("rs", index);
            self.output.push(Value::Null); // its place; filled when it is done
            out.push_str(&self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": reasoning_item(&id, "", "in_progress")}),
            ));
            self.thinking = Some(OpenText {
                index,
                id,
                text: String::new(),
            });
        }
        let Some(t) = self.thinking.as_mut() else {
            return out;
        };
        t.text.push_str(delta);
        let (id, index) = (t.id.clone(), t.index);
        out.push_str(&self.event(
            "response.reasoning_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
        out
    }

    fn close_reasoning(&mut self) -> String {
        let Some(t) = self.thinking.take() else {
            return String::new();
        };
        let mut out = self.event(
            "response.reasoning_text.done",
            json!({"item_id": t.id, "output_index": t.index, "content_index": 0, "text": t.text}),
        );
        let item = reasoning_item(&t.id, &t.text, "completed");
        out.push_str(&self.event(
            "response.output_item.done",
            json!({"output_index": t.index, "item": item}),
        ));
        self.output[t.index] = item;
        out
    }

    fn text_delta(&mut self, delta: &str) -> String {
        if delta.is_empty() || (self.text.is_none() && delta.trim().is_empty()) {
            return String::new();
        }
        let mut out = String::new();
        if self.text.is_none() {
            out.push_str(&self.close_reasoning());
            let index = self.output.len();
            let id = self.meta.item_id("msg", index);
            self.output.push(Value::Null); // its place; filled when it is done
            out.push_str(&self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": message_item(&id, "", "in_progress")}),
            ));
            out.push_str(&self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part("")}),
            ));
            self.text = Some(OpenText {
                index,
                id,
                text: String::new(),
            });
        }
        let Some(t) = self.text.as_mut() else {
            return out;
        };
        t.text.push_str(delta);
        let (id, index) = (t.id.clone(), t.index);
        out.push_str(&self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
        ));
        out
    }

    fn close_text(&mut self) -> String {
        let Some(t) = self.text.take() else {
            return String::new();
        };
        let mut out = self.event(
            "response.output_text.done",
            json!({"item_id": t.id, "output_index": t.index, "content_index": 0, "text": t.text, "logprobs": []}),
        );
        out.push_str(&self.event(
            "response.content_part.done",
            json!({"item_id": t.id, "output_index": t.index, "content_index": 0, "part": text_part(&t.text)}),
        ));
        let item = message_item(&t.id, &t.text, "completed");
        out.push_str(&self.event(
            "response.output_item.done",
            json!({"output_index": t.index, "item": item}),
        ));
        self.output[t.index] = item;
        out
    }

    fn call(&mut self, call: &ToolCallOut) -> String {
        let mut out = self.close_reasoning();
        out.push_str(&self.close_text());
        let index = self.output.len();
        let id = self.meta.item_id("fc", index);
        out.push_str(&self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": call_item(&id, call, "", "in_progress")}),
        ));
        out.push_str(&self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": call.arguments}),
        ));
        out.push_str(&self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}),
        ));
        let item = call_item(&id, call, &call.arguments, "completed");
        out.push_str(&self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
        out
    }

    /// True once the reply has made a function call.
    pub fn called(&self) -> bool {
        self.output.iter().any(|i| i["type"] == "function_call")
    }

    /// Closes the open item and sends `response.completed` (`response.incomplete` at the token
    /// limit); returns the events and the final response object.
    pub fn finish(&mut self, stop: StopKind, usage: ResponsesUsage) -> (String, Value) {
        let mut out = self.close_reasoning();
        out.push_str(&self.close_text());
        let r = response_object(
            &self.meta,
            &self.echo,
            &self.output,
            Some(stop),
            Some(usage),
        );
        let kind = if stop == StopKind::MaxTokens {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push_str(&self.event(kind, json!({"response": r})));
        (out, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "resp_abc".into(),
            created_at: 1,
            model: "m".into(),
        }
    }

    fn echo() -> ResponseEcho {
        crate::responses::parse_responses_request(&json!({"input": "x"}))
            .unwrap()
            .echo
    }

    fn events(s: &str) -> Vec<Value> {
        s.split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn a_stream_is_the_typed_event_sequence() {
        let mut s = ResponsesStream::new(meta(), echo());
        let mut out = s.start();
        out.push_str(&s.part(&ReplyPart::Text("Hel".into())));
        out.push_str(&s.part(&ReplyPart::Text("lo".into())));
        let call = ToolCallOut {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        out.push_str(&s.part(&ReplyPart::ToolCall(call)));
        let (end, r) = s.finish(
            StopKind::ToolUse,
            ResponsesUsage {
                input_tokens: 3,
                cached_tokens: 0,
                output_tokens: 4,
                reasoning_tokens: 0,
            },
        );
        out.push_str(&end);
        let ev = events(&out);
        let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in ev.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
        assert_eq!(ev[6]["text"], "Hello");
        assert_eq!(r["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(r["output"][1]["call_id"], "call_1");
        assert_eq!(r["usage"]["total_tokens"], 7);
        assert_eq!(r["status"], "completed");
        assert_ne!(r["output"][0]["id"], r["output"][1]["id"]);
    }
}
