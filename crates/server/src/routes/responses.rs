//! OpenAI's Responses API: `POST /v1/responses` (run as a chat request: the same template,
//! tools, constraints and scheduler), `GET` / `DELETE /v1/responses/{id}` over the in-memory
//! store (`responses_store.rs`). Errors are OpenAI's `{"error": {...}}`; a failed stream ends
//! with an `error` event.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use lmi_api::reply::{ReplyPart, StopKind};
use lmi_api::responses::{
    self, ResponseMeta, ResponsesRequest, ResponsesStream, ResponsesUsage, output_items,
    response_object,
};
use lmi_api::{ApiError, FinishReason, Schema};

use super::respond::{self, Frame, SSE};
use crate::app::{AppState, new_request_id};
use crate::generation::{self, Accumulator};
use crate::reply::{self, ReplyReader};
use crate::responses_store::Stored;

const ROUTE: &str = "/v1/responses";
const SCHEMA: Schema = Schema::Responses;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(ROUTE, post(create))
        .route("/v1/responses/{id}", get(retrieve).delete(delete))
}

fn not_found(state: &AppState, id: &str) -> ApiError {
    let why = if state.responses.enabled() {
        "it was never stored (`store: false`), was deleted, or was dropped as the least recently used"
    } else {
        "this server keeps no responses (option.responses_store=0)"
    };
    ApiError::not_found(format!("Response with id '{id}' not found: {why}"))
}

async fn retrieve(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(s) => respond::ok_json(s.response.to_string()),
        None => respond::error(&not_found(&state, &id), SCHEMA),
    }
}

async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.responses.remove(&id) {
        respond::ok_json(responses::deleted(&id).to_string())
    } else {
        respond::error(&not_found(&state, &id), SCHEMA)
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let media = crate::routes::messages::takes_media(&state);
    match lmi_api::parse_json(&body)
        .and_then(|v| responses::parse_responses_request_with(&v, media))
    {
        Ok(req) => run(state, req).await,
        Err(e) => respond::error(&e, SCHEMA),
    }
}

async fn run(state: Arc<AppState>, req: ResponsesRequest) -> Response {
    let tracker = state.metrics.track(ROUTE);
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::reject(tracker, &e, SCHEMA),
    };
    if !req.unknown_fields.is_empty() {
        tracing::info!(unknown = ?req.unknown_fields, "ignoring unknown fields");
    }
    let ResponsesRequest { mut chat, echo, .. } = req;
    // The conversation: the stored one this continues, then this turn's input.
    let mut conversation = match &echo.previous_response_id {
        Some(id) => match state.responses.get(id) {
            Some(s) => s.conversation,
            None => {
                let e = not_found(&state, id).with_param("previous_response_id");
                return respond::reject(tracker, &e, SCHEMA);
            }
        },
        None => Vec::new(),
    };
    if let Err(e) =
        crate::media::inline_remote_chat(model.vision.as_ref(), &mut chat.messages).await
    {
        return respond::reject(tracker, &e, SCHEMA);
    }
    conversation.append(&mut chat.messages);
    chat.messages = echo
        .instructions
        .iter()
        .map(|i| lmi_api::openai::ChatMessage::new(lmi_api::openai::Role::System, i.clone()))
        .chain(conversation.iter().cloned())
        .collect();
    let prepared = match crate::chat_job::prepare(&state, model, &chat) {
        Ok(p) => p,
        Err(e) => return respond::reject(tracker, &e, SCHEMA),
    };
    let (job, tools) = (prepared.job, prepared.tools);
    let meta = ResponseMeta {
        id: format!("resp_{}", new_request_id().replace('-', "")),
        created_at: now(),
        model: chat
            .model
            .clone()
            .unwrap_or_else(|| state.model_name.clone()),
    };
    let store = echo.store;
    if job.spec.stream {
        let events = match generation::submit(model, &job) {
            Ok(s) => s,
            Err(e) => return respond::reject(tracker, &e, SCHEMA),
        };
        let acc = Accumulator::new(model, &job);
        let mut reader =
            ReplyReader::new(tools.as_ref(), model.tool_format, job.reasoning, &job.spec);
        let mut stream = ResponsesStream::new(meta.clone(), echo);
        let mut parts: Vec<ReplyPart> = Vec::new();
        let mut finish = FinishReason::EosToken;
        let st = state.clone();
        return respond::stream(
            SSE,
            events,
            acc,
            tracker,
            job.spec.max_new_tokens,
            move |f| match f {
                Frame::Start => stream.start(),
                Frame::Token(t, _) => {
                    if let Some(r) = t.finish {
                        finish = r;
                    }
                    let mut out = String::new();
                    for p in reader.token(&t.token, t.finish) {
                        out.push_str(&stream.part(&p));
                        parts.push(p);
                    }
                    out
                }
                Frame::End(acc) => {
                    let usage = ResponsesUsage {
                        input_tokens: acc.prompt_tokens(),
                        cached_tokens: 0,
                        output_tokens: acc.generated_tokens(),
                        reasoning_tokens: reader.reasoning_tokens(),
                    };
                    let stop = StopKind::of(finish, stream.called());
                    let (out, response) = stream.finish(stop, usage);
                    if store {
                        let mut conversation = std::mem::take(&mut conversation);
                        conversation.push(reply::assistant_message(&parts));
                        st.responses.put(
                            meta.id.clone(),
                            Stored {
                                response,
                                conversation,
                            },
                        );
                    }
                    out
                }
                Frame::Error(e) => e.responses_stream_event(Some(stream.sequence_number())),
            },
        );
    }
    let out = match generation::run(model, &job, tracker).await {
        Ok(o) => o,
        Err(e) => return respond::error(&e, SCHEMA),
    };
    let (parts, reasoning_tokens) =
        reply::read_whole(tools.as_ref(), model.tool_format, job.reasoning, &out.best);
    let items = output_items(&meta, &parts);
    let called = parts.iter().any(|p| matches!(p, ReplyPart::ToolCall(_)));
    let usage = ResponsesUsage {
        input_tokens: out.prompt_tokens,
        cached_tokens: 0,
        output_tokens: out.completion_tokens(),
        reasoning_tokens,
    };
    let stop = StopKind::of(out.best.finish_reason, called);
    let response = response_object(&meta, &echo, &items, Some(stop), Some(usage));
    let body = response.to_string();
    if store {
        conversation.push(reply::assistant_message(&parts));
        state.responses.put(
            meta.id,
            Stored {
                response,
                conversation,
            },
        );
    }
    respond::ok_json(body)
}
