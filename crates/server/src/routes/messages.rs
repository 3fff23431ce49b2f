//! Anthropic's Messages API: `POST /v1/messages` (run as a chat request: the same template,
//! tools, constraints and scheduler) and `POST /v1/messages/count_tokens`. Errors are
//! Anthropic's `{"type": "error", "error": {...}}`; a failed stream ends with an `error` event.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lmi_api::anthropic::{
    self, MessageMeta, MessagesRequest, MessagesStream, MessagesUsage, content_blocks,
};
use lmi_api::reply::{ReplyPart, StopKind};
use lmi_api::{FinishReason, Schema};

use super::chat_call::{ChatCall, takes_media};
use super::respond::{self, Frame};
use crate::app::{AppState, new_request_id};
use crate::chat_job::ChatJob;
use crate::generation;
use crate::reply::{self, ReplyReader};

const ROUTE: &str = "/v1/messages";
const SCHEMA: Schema = Schema::Anthropic;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(ROUTE, post(create))
        .route("/v1/messages/count_tokens", post(count_tokens))
}

async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let media = takes_media(&state);
    match lmi_api::parse_json(&body)
        .and_then(|v| anthropic::parse_messages_request_with(&v, false, media))
    {
        Ok(req) => run(&state, req).await.into_response(),
        Err(e) => respond::error(&e, SCHEMA),
    }
}

/// The prompt as the model would see it (system prompt, tools, template), counted.
async fn count_tokens(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let media = takes_media(&state);
    let req = match lmi_api::parse_json(&body)
        .and_then(|v| anthropic::parse_messages_request_with(&v, true, media))
    {
        Ok(r) => r,
        Err(e) => return respond::error(&e, SCHEMA),
    };
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::error(&e, SCHEMA),
    };
    match crate::chat_job::prepare(&state, model, &req.chat) {
        Ok(p) => respond::ok_json(anthropic::token_count(p.job.prompt_ids.len()).to_string()),
        Err(e) => respond::error(&e, SCHEMA),
    }
}

/// The stop sequence that ended a reply: the one the (uncut) text ends with.
fn matched_stop<'a>(stops: &'a [String], text: &str) -> Option<&'a str> {
    stops
        .iter()
        .filter(|s| text.ends_with(s.as_str()))
        .max_by_key(|s| s.len())
        .map(String::as_str)
}

async fn run(state: &Arc<AppState>, mut req: MessagesRequest) -> Result<Response, Response> {
    let call = ChatCall::start(state, ROUTE, SCHEMA, &req.unknown_fields)?;
    let model = call.model;
    // Anthropic names the stop sequence that matched: keep it in the output to see which, and
    // cut it here (a stream holds each token's text back until it cannot start a stop
    // sequence, so the cut is only ever at the end).
    let stops = req.stop_sequences.clone();
    req.chat.spec.include_stop_str_in_output = !stops.is_empty();
    let call = call.fetch_media(&mut req.chat.messages).await?;
    let (call, ChatJob { job, tools }) = call.prepare(&req.chat)?;
    let meta = MessageMeta {
        id: format!("msg_{}", new_request_id().replace('-', "")),
        model: req
            .chat
            .model
            .clone()
            .unwrap_or_else(|| state.model_name.clone()),
    };
    if job.spec.stream {
        let mut reader =
            ReplyReader::new(tools.as_ref(), model.tool_format, job.reasoning, &job.spec);
        let mut stream = MessagesStream::new(meta);
        let mut text = String::new();
        let prompt_tokens = job.prompt_ids.len();
        return Ok(call.stream(&job, move |f| match f {
            Frame::Start => stream.start(MessagesUsage {
                input_tokens: prompt_tokens,
                cached_tokens: 0,
                output_tokens: 0,
            }),
            Frame::Token(t, _) => {
                let mut out = String::new();
                let mut parts = reader.token(&t.token, t.finish);
                if t.finish == Some(FinishReason::StopSequence) {
                    // Cut the stop sequence from the reply's last text.
                    for p in &parts {
                        if let ReplyPart::Text(s) = p {
                            text.push_str(s);
                        }
                    }
                    cut_stop(&mut parts, matched_stop(&stops, &text));
                }
                for p in &parts {
                    if let ReplyPart::Text(s) = p
                        && t.finish != Some(FinishReason::StopSequence)
                    {
                        text.push_str(s);
                    }
                    out.push_str(&stream.part(p));
                }
                out
            }
            Frame::End(acc) => {
                let stop = StopKind::of(reader.finish_reason(), stream.called());
                let seq = (stop == StopKind::StopSequence)
                    .then(|| matched_stop(&stops, &text))
                    .flatten();
                stream.finish(stop, seq, acc.generated_tokens())
            }
            Frame::Error(e) => e.anthropic_stream_event(),
        }));
    }
    let mut out = call.run(&job).await?;
    let stop_sequence = (out.best.finish_reason == FinishReason::StopSequence)
        .then(|| matched_stop(&stops, &out.best.text))
        .flatten();
    if let Some(s) = stop_sequence {
        let keep = out.best.text.len() - s.len();
        out.best.text.truncate(keep);
    }
    let (parts, _) = reply::read_whole(tools.as_ref(), model.tool_format, job.reasoning, &out.best);
    let stop = reply::stop_kind(out.best.finish_reason, &parts);
    let usage = MessagesUsage {
        input_tokens: out.prompt_tokens,
        cached_tokens: 0,
        output_tokens: out.completion_tokens(),
    };
    let body = anthropic::message(
        &meta,
        content_blocks(&parts),
        Some(stop),
        stop_sequence,
        usage,
    );
    Ok(respond::ok_json(body.to_string()))
}

/// Cuts `stop` from the end of the text parts released with the last token.
fn cut_stop(parts: &mut [ReplyPart], stop: Option<&str>) {
    let Some(stop) = stop else { return };
    let mut left = stop.len();
    for p in parts.iter_mut().rev() {
        if left == 0 {
            break;
        }
        if let ReplyPart::Text(t) = p {
            let n = left.min(t.len());
            let mut keep = t.len() - n;
            while !t.is_char_boundary(keep) {
                keep -= 1;
            }
            left -= t.len() - keep;
            t.truncate(keep);
        }
    }
}
