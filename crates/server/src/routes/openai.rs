//! OpenAI routes: POST /v1/chat/completions and /v1/completions (any `model` name is
//! accepted), streaming as SSE chunks ending with `data: [DONE]`, usage on request.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use lmi_api::openai::{self, ChatRequest, CompletionRequest, OpenAiMeta, Usage};
use lmi_api::{ApiError, Schema, sse};

use super::respond::{self, Frame, SSE};
use crate::app::{AppState, new_request_id};
use crate::generation::{self, Accumulator, Prompt};
use crate::tool_calls::{self, ToolStream};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/chat/completions", post(chat_route))
        .route("/v1/completions", post(completions_route))
}

fn meta(state: &AppState, prefix: &str, model: Option<&str>) -> OpenAiMeta {
    OpenAiMeta {
        id: format!("{prefix}-{}", new_request_id()),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: model.unwrap_or(&state.model_name).to_string(),
        system_fingerprint: None,
    }
}

async fn chat_route(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let parsed = lmi_api::parse_json(&body).and_then(|v| openai::parse_chat_request(&v));
    match parsed {
        Ok(req) => chat(state, req, "/v1/chat/completions", Schema::OpenAi).await,
        Err(e) => respond::error(&e, Schema::OpenAi),
    }
}

async fn completions_route(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let cfg = state.openai_config();
    let parsed =
        lmi_api::parse_json(&body).and_then(|v| openai::parse_completion_request(&v, &cfg));
    match parsed {
        Ok(req) => completions(state, req, "/v1/completions", Schema::OpenAi).await,
        Err(e) => respond::error(&e, Schema::OpenAi),
    }
}

/// A chat request (also LMI's `messages` bodies on /invocations).
pub async fn chat(
    state: Arc<AppState>,
    req: ChatRequest,
    route: &'static str,
    schema: Schema,
) -> Response {
    let tracker = state.metrics.track(route);
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    if !req.unknown_fields.is_empty() {
        tracing::info!(unknown = ?req.unknown_fields, "ignoring unknown fields");
    }
    let (job, tools) = match crate::chat_job::prepare(&state, model, &req) {
        Ok(c) => (c.job, c.tools),
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    let meta = meta(&state, "chatcmpl", req.model.as_deref());
    if job.spec.stream {
        let events = match generation::submit(model, &job) {
            Ok(s) => s,
            Err(e) => return respond::reject(tracker, &e, schema),
        };
        let acc = Accumulator::new(model, &job);
        let spec = job.spec.clone();
        let include_usage = req.include_usage;
        let n = job.request.n;
        let mut reader = tools.map(|t| {
            ToolStream::new(
                meta.clone(),
                spec.clone(),
                include_usage,
                t,
                model.tool_format,
                n,
            )
        });
        return respond::stream(
            SSE,
            events,
            acc,
            tracker,
            job.spec.max_new_tokens,
            move |f| match f {
                Frame::Start => (0..n)
                    .map(|i| sse::data(&openai::format::chat_chunk_role(&meta, i, include_usage)))
                    .collect(),
                Frame::Token(t, _) => match reader.as_mut() {
                    Some(r) => r.token(t.index as usize, &t.token, &t.top, t.finish),
                    None => sse::data(&openai::format::chat_chunk_token(
                        &meta,
                        t.index as usize,
                        &t.token,
                        &t.top,
                        t.finish,
                        &spec,
                        include_usage,
                    )),
                },
                Frame::End(acc) => {
                    let mut out = String::new();
                    if include_usage {
                        let (kept, left) = acc.draft_tokens();
                        let usage = Usage::new(acc.prompt_tokens(), acc.generated_tokens())
                            .with_predictions(&spec, kept, left);
                        out.push_str(&sse::data(&openai::format::chat_chunk_usage(&meta, usage)));
                    }
                    out.push_str(sse::DONE);
                    out
                }
                Frame::Error(e) => e.openai_stream_events(),
            },
        );
    }
    match generation::run(model, &job, tracker).await {
        Ok(out) => {
            let turns: Vec<_> = match &tools {
                Some(t) => out
                    .sequences()
                    .map(|s| tool_calls::read_turn(t, model.tool_format, tool_calls::reply_text(s)))
                    .collect(),
                None => Vec::new(),
            };
            respond::ok_json(openai::format::chat_completion_with_tools(
                &meta, &out, &job.spec, &turns,
            ))
        }
        Err(e) => respond::error(&e, schema),
    }
}

/// A completions request (also LMI's `prompt` bodies on /invocations).
pub async fn completions(
    state: Arc<AppState>,
    req: CompletionRequest,
    route: &'static str,
    schema: Schema,
) -> Response {
    let tracker = state.metrics.track(route);
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    let jobs: Result<Vec<_>, ApiError> = req
        .prompts
        .iter()
        .map(|p| generation::prepare(model, Prompt::Text(p.clone()), req.spec.clone()))
        .collect();
    let jobs = match jobs {
        Ok(j) => j,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    let meta = meta(&state, "cmpl", req.model.as_deref());
    if req.spec.stream {
        if jobs.len() != 1 {
            return respond::reject(
                tracker,
                &ApiError::validation(
                    "streaming completions take one prompt: send the prompts as separate requests",
                )
                .with_param("prompt"),
                schema,
            );
        }
        let job = &jobs[0];
        let events = match generation::submit(model, job) {
            Ok(s) => s,
            Err(e) => return respond::reject(tracker, &e, schema),
        };
        let acc = Accumulator::new(model, job);
        let include_usage = req.include_usage;
        let usage_spec = job.spec.clone();
        let echo = req.echo.then(|| job.prompt_text.clone());
        return respond::stream(
            SSE,
            events,
            acc,
            tracker,
            job.spec.max_new_tokens,
            move |f| match f {
                Frame::Start => match &echo {
                    Some(p) => sse::data(&openai::format::completion_chunk(
                        &meta,
                        0,
                        p,
                        None,
                        include_usage,
                    )),
                    None => String::new(),
                },
                Frame::Token(t, _) => {
                    let text = if t.token.special {
                        ""
                    } else {
                        t.token.text.as_str()
                    };
                    sse::data(&openai::format::completion_chunk(
                        &meta,
                        t.index as usize,
                        text,
                        t.finish,
                        include_usage,
                    ))
                }
                Frame::End(acc) => {
                    let mut out = String::new();
                    if include_usage {
                        let (kept, left) = acc.draft_tokens();
                        let usage = Usage::new(acc.prompt_tokens(), acc.generated_tokens())
                            .with_predictions(&usage_spec, kept, left);
                        out.push_str(&sse::data(&openai::format::completion_chunk_usage(
                            &meta, usage,
                        )));
                    }
                    out.push_str(sse::DONE);
                    out
                }
                Frame::Error(e) => e.openai_stream_events(),
            },
        );
    }
    // Every prompt runs concurrently, each reported to the metrics as a request.
    let mut first = Some(tracker);
    let runs = jobs.iter().map(|j| {
        let t = first.take().unwrap_or_else(|| state.metrics.track(route));
        generation::run(model, j, t)
    });
    let mut outs = Vec::with_capacity(jobs.len());
    for r in futures_util::future::join_all(runs).await {
        match r {
            Ok(o) => outs.push(o),
            Err(e) => return respond::error(&e, schema),
        }
    }
    respond::ok_json(openai::format::text_completion(&meta, &outs, &req.spec))
}
