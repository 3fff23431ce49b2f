//! LMI's routes: POST /invocations and /predictions/{model}. The body decides the schema
//! (`prompt` → completions, `inputs` → LMI rolling batch or, with a list, dynamic batch,
//! `messages` → chat); errors are LMI's `{"error", "code": 424}`. On an embedding or scoring
//! model the body is LMI's embedding or cross-encoder request (`routes/embed.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use lmi_api::lmi::{self, LmiConfig, LmiRequest};
use lmi_api::{ApiError, Invocation, Schema, tgi};

use super::respond::{self, Frame, JSONLINES, SSE};
use crate::app::AppState;
use crate::generation::{self, Prompt};

/// SageMaker inference components name the adapter in this header; it wins over the body.
const ADAPTER_HEADER: &str = "x-amzn-sagemaker-adapter-identifier";

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/invocations", post(invocations))
        .route("/predictions/{model}", post(predictions))
}

async fn invocations(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    dispatch(state, headers, q, body, "/invocations").await
}

async fn predictions(
    State(state): State<Arc<AppState>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    if model != state.model_name {
        return respond::body(
            404,
            respond::JSON,
            lmi_api::lmi_server_error_body(
                404,
                "ModelNotFoundException",
                &format!(
                    "Model not found: {model} (this server serves {})",
                    state.model_name
                ),
            ),
        );
    }
    dispatch(state, headers, q, body, "/predictions").await
}

async fn dispatch(
    state: Arc<AppState>,
    headers: HeaderMap,
    query: HashMap<String, String>,
    body: Bytes,
    route: &'static str,
) -> Response {
    // An embedding or scoring model answers LMI's embedding and cross-encoder bodies.
    if state.model().is_some()
        && let Ok(info) = crate::pooling::pooler(&state)
    {
        return super::embed::lmi(&state, info, &body, route).await;
    }
    let cfg = LmiConfig {
        tgi_compat: state.config.tgi_compat,
    };
    let inv = match lmi_api::parse_invocation_bytes(&body, &cfg, &state.openai_config()) {
        Ok(i) => i,
        Err(e) => return respond::reject(state.metrics.track(route), &e, Schema::Lmi),
    };
    match inv {
        Invocation::Chat(req) => super::openai::chat(state, req, route, Schema::Lmi).await,
        Invocation::Completion(req) => {
            super::openai::completions(state, req, route, Schema::Lmi).await
        }
        Invocation::Lmi(mut req) => {
            let forced = headers
                .get(ADAPTER_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .or_else(|| query.get("adapter").cloned());
            if let Some(a) = forced {
                req.adapters = vec![Some(a); req.adapters.len()];
            }
            if !req.report.unknown.is_empty() {
                tracing::info!(unknown = ?req.report.unknown, "ignoring unknown parameters");
            }
            if req.is_batch() {
                dynamic_batch(state, req, route).await
            } else {
                rolling(state, req, route).await
            }
        }
    }
}

/// The output format: the request's `output_formatter`, else option.output_formatter, else
/// json / jsonlines (sse under tgi_compat) by streaming.
fn formatter(state: &AppState, req: &LmiRequest) -> String {
    req.report
        .output_formatter
        .clone()
        .or_else(|| state.config.output_formatter.clone())
        .unwrap_or_else(|| {
            if !req.spec.stream {
                "json".into()
            } else if state.config.tgi_compat {
                "sse".into()
            } else {
                "jsonlines".into()
            }
        })
}

async fn rolling(state: Arc<AppState>, req: LmiRequest, route: &'static str) -> Response {
    let tracker = state.metrics.track(route);
    let schema = Schema::Lmi;
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    let format = formatter(&state, &req);
    let Some((prompt, mut spec)) = req.items().into_iter().next() else {
        let e = ApiError::validation("`inputs` cannot be empty").with_param("inputs");
        return respond::error(&e, schema);
    };
    let tgi_compat = state.config.tgi_compat;
    let streaming = spec.stream || format == "jsonlines" || format == "sse";
    // A json reply lists tokens (with their logprobs) only with details or several sequences.
    spec.token_logprobs = streaming || tgi_compat || spec.details || spec.n > 1;
    let job = match generation::prepare(model, Prompt::Text(prompt), spec) {
        Ok(j) => j,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    if !streaming {
        return match generation::run(model, &job, tracker).await {
            Ok(out) if tgi_compat => {
                respond::ok_json(lmi::format::tgi_compat_json(&out, &job.spec))
            }
            Ok(out) => respond::ok_json(lmi::format::json(&out, &job.spec)),
            Err(e) => respond::error(&e, schema),
        };
    }
    let spec = job.spec.clone();
    let sse = format == "sse" || tgi_compat;
    let content_type = if sse { SSE } else { JSONLINES };
    let mut index = 0u32;
    respond::stream(
        content_type,
        model,
        &job,
        tracker,
        schema,
        move |f| match f {
            Frame::Start | Frame::End(_) => String::new(),
            Frame::Token(t, acc) => {
                index += 1;
                let last = t.finish.map(|r| acc.snapshot(r));
                match (tgi_compat, sse, last) {
                    (true, _, last) => {
                        tgi::format::stream_event(index, &t.token, &t.top, last.as_ref(), &spec)
                    }
                    (false, true, Some(out)) => lmi::format::sse_last(&out, &spec),
                    (false, true, None) => lmi::format::sse_token(&t.token),
                    (false, false, Some(out)) => lmi::format::jsonlines_last(&out, &spec),
                    (false, false, None) => lmi::format::jsonlines_token(&t.token),
                }
            }
            Frame::Error(e) if sse => lmi::format::sse_error(&e.lmi_message()),
            Frame::Error(e) => lmi::format::error_line(&e.lmi_message()),
        },
    )
}

/// LMI's dynamic-batch schema: a list of inputs, a list of `{"generated_text"}` in order. The
/// inputs run concurrently through the rolling batch.
async fn dynamic_batch(state: Arc<AppState>, req: LmiRequest, route: &'static str) -> Response {
    let schema = Schema::LmiDynamicBatch;
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::error(&e, schema),
    };
    if req.spec.stream {
        let e = ApiError::validation(
            "streaming is not available for a list of inputs: send one input per request",
        )
        .with_param("stream");
        return respond::error(&e, schema);
    }
    if let Err(e) = crate::guard::limits::check_prompts(&state, req.prompts().len()) {
        return respond::error(&e, schema);
    }
    let jobs: Result<Vec<_>, ApiError> = req
        .items()
        .into_iter()
        .map(|(p, mut s)| {
            // The reply is each input's generated_text only.
            s.token_logprobs = false;
            generation::prepare(model, Prompt::Text(p), s)
        })
        .collect();
    let jobs = match jobs {
        Ok(j) => j,
        Err(e) => return respond::error(&e, schema),
    };
    let _batch = state.dynamic_batcher().admit(jobs.len()).await;
    let runs = jobs
        .iter()
        .map(|j| generation::run(model, j, state.metrics.track(route)));
    let mut outs = Vec::with_capacity(jobs.len());
    for r in futures_util::future::join_all(runs).await {
        match r {
            Ok(o) => outs.push(o),
            Err(e) => return respond::error(&e, schema),
        }
    }
    respond::ok_json(lmi::format::dynamic_batch_json(
        &lmi::format::dynamic_batch_texts(&outs, &req.spec),
    ))
}
