//! OpenAI's Responses API: `POST /v1/responses` (run as a chat request: the same template,
//! tools, constraints and scheduler), `GET` / `DELETE /v1/responses/{id}` over the in-memory
//! store (`responses_store.rs`). Errors are OpenAI's `{"error": {...}}`; a failed stream ends
//! with an `error` event.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use lmi_api::reply::{ReplyPart, StopKind};
use lmi_api::responses::{
    self, ResponseMeta, ResponsesRequest, ResponsesStream, ResponsesUsage, output_items,
    response_object,
};
use lmi_api::{ApiError, Schema};

use super::chat_call::{ChatCall, takes_media, unix_time};
use super::respond::{self, Frame};
use crate::app::{AppState, new_request_id};
use crate::chat_job::ChatJob;
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

async fn create(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let media = takes_media(&state);
    match lmi_api::parse_json(&body)
        .and_then(|v| responses::parse_responses_request_with(&v, media))
    {
        Ok(req) => run(&state, req).await.into_response(),
        Err(e) => respond::error(&e, SCHEMA),
    }
}

async fn run(state: &Arc<AppState>, req: ResponsesRequest) -> Result<Response, Response> {
    let call = ChatCall::start(state, ROUTE, SCHEMA, &req.unknown_fields)?;
    let model = call.model;
    let ResponsesRequest { mut chat, echo, .. } = req;
    // The conversation: the stored one this continues, then this turn's input.
    let mut conversation = match &echo.previous_response_id {
        Some(id) => match state.responses.get(id) {
            Some(s) => s.conversation,
            None => {
                let e = not_found(state, id).with_param("previous_response_id");
                return Err(call.reject(&e));
            }
        },
        None => Vec::new(),
    };
    let call = call.fetch_media(&mut chat.messages).await?;
    conversation.append(&mut chat.messages);
    chat.messages = echo
        .instructions
        .iter()
        .map(|i| lmi_api::openai::ChatMessage::new(lmi_api::openai::Role::System, i.clone()))
        .chain(conversation.iter().cloned())
        .collect();
    let (call, ChatJob { job, tools }) = call.prepare(&chat)?;
    let meta = ResponseMeta {
        id: format!("resp_{}", new_request_id().replace('-', "")),
        created_at: unix_time(),
        model: chat
            .model
            .clone()
            .unwrap_or_else(|| state.model_name.clone()),
    };
    let store = echo.store;
    if job.spec.stream {
        let mut reader =
            ReplyReader::new(tools.as_ref(), model.tool_format, job.reasoning, &job.spec);
        let mut stream = ResponsesStream::new(meta.clone(), echo);
        let mut parts: Vec<ReplyPart> = Vec::new();
        let st = state.clone();
        return Ok(call.stream(&job, move |f| match f {
            Frame::Start => stream.start(),
            Frame::Token(t, _) => {
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
                let stop = StopKind::of(reader.finish_reason(), stream.called());
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
        }));
    }
    let out = call.run(&job).await?;
    let (parts, reasoning_tokens) =
        reply::read_whole(tools.as_ref(), model.tool_format, job.reasoning, &out.best);
    let items = output_items(&meta, &parts);
    let usage = ResponsesUsage {
        input_tokens: out.prompt_tokens,
        cached_tokens: 0,
        output_tokens: out.completion_tokens(),
        reasoning_tokens,
    };
    let stop = reply::stop_kind(out.best.finish_reason, &parts);
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
    Ok(respond::ok_json(body))
}
