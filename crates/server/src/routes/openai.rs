//! OpenAI routes: POST /v1/chat/completions and /v1/completions (any `model` name is
//! accepted), streaming as SSE chunks ending with `data: [DONE]`, usage on request.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use lmi_api::openai::{
    self, ChatRequest, CompletionPrompt, CompletionRequest, OpenAiMeta, TokenRun, Usage,
};
use lmi_api::{ApiError, FinishReason, GenerationOut, GenerationSpec, Schema, sse};

use super::chat_call::{ChatCall, unix_time};
use super::respond::{self, Frame, SSE};
use crate::app::{AppState, new_request_id};
use crate::chat_job::ChatJob;
use crate::generation::{self, Prompt};
use crate::tool_calls::ToolStream;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/chat/completions", post(chat_route))
        .route("/v1/completions", post(completions_route))
}

fn meta(state: &AppState, prefix: &str, model: Option<&str>) -> OpenAiMeta {
    OpenAiMeta {
        id: format!("{prefix}-{}", new_request_id()),
        created: unix_time(),
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
    chat_reply(&state, req, route, schema).await.into_response()
}

async fn chat_reply(
    state: &Arc<AppState>,
    mut req: ChatRequest,
    route: &'static str,
    schema: Schema,
) -> Result<Response, Response> {
    let call = ChatCall::start(state, route, schema, &req.unknown_fields)?;
    let model = call.model;
    let call = call.fetch_media(&mut req.messages).await?;
    let (call, ChatJob { job, tools }) = call.prepare(&req)?;
    let meta = meta(state, "chatcmpl", req.model.as_deref());
    if job.spec.stream {
        let spec = job.spec.clone();
        let include_usage = req.include_usage;
        let n = job.request.n;
        // Replies read for tool calls or reasoning; the others go out token by token.
        let mut reader = (tools.is_some() || job.reasoning.is_some()).then(|| {
            ToolStream::new(
                meta.clone(),
                spec.clone(),
                include_usage,
                tools,
                model.tool_format,
                job.reasoning,
                n,
            )
        });
        return Ok(call.stream(&job, move |f| match f {
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
                        .with_predictions(&spec, kept, left)
                        .with_reasoning(reader.as_ref().and_then(|r| r.reasoning_tokens()));
                    out.push_str(&sse::data(&openai::format::chat_chunk_usage(&meta, usage)));
                }
                out.push_str(sse::DONE);
                out
            }
            Frame::Error(e) => e.openai_stream_events(),
        }));
    }
    let out = call.run(&job).await?;
    if tools.is_none() && job.reasoning.is_none() {
        return Ok(respond::ok_json(openai::format::chat_completion(
            &meta, &out, &job.spec,
        )));
    }
    let read: Vec<_> = out
        .sequences()
        .map(|s| crate::reasoning::read_reply(s, job.reasoning, tools.as_ref(), model.tool_format))
        .collect();
    let counted = job
        .reasoning
        .map(|_| read.iter().map(|(_, n)| n).sum::<usize>());
    let turns: Vec<_> = read.into_iter().map(|(t, _)| t).collect();
    Ok(respond::ok_json(openai::format::chat_completion_read(
        &meta, &out, &job.spec, &turns, counted,
    )))
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
        .map(|p| {
            let prompt = match p {
                CompletionPrompt::Text(t) => Prompt::Text(t.clone()),
                CompletionPrompt::Tokens(ids) => Prompt::Tokens(ids.clone()),
            };
            generation::prepare(model, prompt, req.spec.clone())
        })
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
        let mut chunks = CompletionChunks {
            meta,
            include_usage: req.include_usage,
            spec: job.spec.clone(),
            echo: req.echo.then(|| job.prompt_text.clone()),
            prompt_only: req.prompt_only,
            offsets: Vec::new(),
        };
        return respond::stream(SSE, model, job, tracker, schema, move |f| chunks.render(f));
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
            Ok(mut o) => {
                if req.prompt_only {
                    drop_generated(&mut o);
                }
                outs.push(o)
            }
            Err(e) => return respond::error(&e, schema),
        }
    }
    respond::ok_json(openai::format::text_completion(&meta, &outs, &req.spec))
}

/// `max_tokens: 0`: the token the scheduler drew after the prefill is not part of the answer.
fn drop_generated(out: &mut GenerationOut) {
    for s in std::iter::once(&mut out.best).chain(out.others.iter_mut()) {
        s.text.clear();
        s.tokens.clear();
        s.top_tokens.clear();
        s.generated_tokens = 0;
        s.finish_reason = FinishReason::Length;
    }
}

/// Renders a completions stream: with `echo`, each choice starts with the prompt (and its
/// logprobs, as vLLM sends them in the first chunk); token chunks carry their logprobs.
struct CompletionChunks {
    meta: OpenAiMeta,
    include_usage: bool,
    spec: GenerationSpec,
    echo: Option<String>,
    prompt_only: bool,
    /// Text offset of each choice's next token; a choice is echoed once it has one.
    offsets: Vec<Option<usize>>,
}

impl CompletionChunks {
    fn render(&mut self, f: Frame<'_>) -> String {
        let k = self.spec.logprobs;
        match f {
            Frame::Start => String::new(),
            Frame::Token(t, acc) => {
                let i = t.index as usize;
                if self.offsets.len() <= i {
                    self.offsets.resize(i + 1, None);
                }
                let mut out = String::new();
                let offset = match self.offsets[i] {
                    Some(o) => o,
                    None => {
                        let prompt = self.echo.as_deref().unwrap_or("");
                        if self.echo.is_some() {
                            let (tokens, top) = acc.prefill();
                            let run = TokenRun {
                                tokens,
                                top,
                                offset: 0,
                            };
                            out.push_str(&sse::data(
                                &openai::format::completion_chunk_with_logprobs(
                                    &self.meta,
                                    i,
                                    prompt,
                                    &[run],
                                    k.filter(|_| !tokens.is_empty()),
                                    None,
                                    self.include_usage,
                                ),
                            ));
                        }
                        prompt.len()
                    }
                };
                let keep = !self.prompt_only && !t.token.special;
                let text = if keep { t.token.text.as_str() } else { "" };
                self.offsets[i] = Some(offset + text.len());
                let tokens = std::slice::from_ref(&t.token);
                let top = std::slice::from_ref(&t.top);
                let runs = [TokenRun {
                    tokens,
                    top,
                    offset,
                }];
                let runs: &[TokenRun] = if self.prompt_only { &[] } else { &runs };
                out.push_str(&sse::data(&openai::format::completion_chunk_with_logprobs(
                    &self.meta,
                    i,
                    text,
                    runs,
                    k.filter(|_| !self.prompt_only),
                    t.finish,
                    self.include_usage,
                )));
                out
            }
            Frame::End(acc) => {
                let mut out = String::new();
                if self.include_usage {
                    let (kept, left) = acc.draft_tokens();
                    let generated = if self.prompt_only {
                        0
                    } else {
                        acc.generated_tokens()
                    };
                    let usage = Usage::new(acc.prompt_tokens(), generated)
                        .with_predictions(&self.spec, kept, left);
                    out.push_str(&sse::data(&openai::format::completion_chunk_usage(
                        &self.meta, usage,
                    )));
                }
                out.push_str(sse::DONE);
                out
            }
            Frame::Error(e) => e.openai_stream_events(),
        }
    }
}
