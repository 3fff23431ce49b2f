//! Server-sent-events framing shared by TGI, OpenAI and LMI `sse`.

/// The terminator of the OpenAI streams (never sent on TGI's own routes).
pub const DONE: &str = "data: [DONE]\n\n";

/// One SSE event: `data: <json>\n\n` (with the space axum >= 0.7 / TGI >= 2.1 write).
pub fn data(json: &str) -> String {
    format!("data: {json}\n\n")
}

/// One named SSE event: `event: <name>\ndata: <json>\n\n` (the Responses and Anthropic
/// streams name each event after its `type`).
pub fn event(name: &str, json: &str) -> String {
    format!("event: {name}\ndata: {json}\n\n")
}
