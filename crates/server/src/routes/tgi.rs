//! TGI's routes: POST / (array, or SSE with "stream": true), /generate, /generate_stream and
//! /tokenize. Errors are `{"error", "error_type"}`; streams never send [DONE]; a request over
//! `max_concurrent_requests` gets 429.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use lmi_api::tgi::{self, TgiLimits, TgiRoute};
use lmi_api::{ApiError, FinishReason, Schema};

use super::respond::{self, Frame, SSE};
use crate::app::{AppState, LoadedModel};
use crate::generation::{self, Prompt};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", post(compat))
        .route("/generate", post(generate))
        .route("/generate_stream", post(generate_stream))
        .route("/tokenize", post(tokenize))
}

pub fn limits(state: &AppState, model: &LoadedModel) -> TgiLimits {
    let c = &state.config;
    TgiLimits {
        max_best_of: c.max_best_of as u32,
        max_stop_sequences: c.max_stop_sequences,
        max_top_n_tokens: c.max_top_n_tokens as u32,
        max_input_tokens: model.max_model_len.saturating_sub(1).max(1),
        max_total_tokens: model.max_model_len,
        ..TgiLimits::default()
    }
}

async fn compat(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    // TEI answers POST / with an embedding or scoring model's own route.
    if let Some(r) = super::embed::tei_root(&s, &body).await {
        return r;
    }
    handle(s, body, TgiRoute::Compat).await
}

async fn generate(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    handle(s, body, TgiRoute::Generate).await
}

async fn generate_stream(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    handle(s, body, TgiRoute::GenerateStream).await
}

fn route_name(route: TgiRoute) -> &'static str {
    match route {
        TgiRoute::Compat => "/",
        TgiRoute::Generate => "/generate",
        TgiRoute::GenerateStream => "/generate_stream",
        TgiRoute::Tokenize => "/tokenize",
    }
}

async fn handle(state: Arc<AppState>, body: Bytes, route: TgiRoute) -> Response {
    let tracker = state.metrics.track(route_name(route));
    let schema = Schema::Tgi;
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    let parsed = (|| {
        let v = lmi_api::parse_json(&body)?;
        tgi::parse_tgi_request(&v, route, &limits(&state, model))
    })();
    let mut req = match parsed {
        Ok(r) => r,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    // Markdown images at http(s) URLs, fetched when this server fetches.
    if let Err(e) =
        crate::media::inline_remote_markdown(model.vision.as_ref(), &mut req.inputs).await
    {
        return respond::reject(tracker, &e, schema);
    }
    if !req.unknown_parameters.is_empty() {
        tracing::info!(unknown = ?req.unknown_parameters, "ignoring unknown parameters");
    }
    let lim = limits(&state, model);
    let prepared =
        generation::prepare_with(model, Prompt::Text(req.inputs), req.spec, |n, spec| {
            tgi::validate_input_length(n, spec, &lim).map(|_| ())
        });
    let job = match prepared {
        Ok(j) => j,
        Err(e) => return respond::reject(tracker, &e, schema),
    };
    let permits = job.request.num_seqs() as u32;
    let Ok(permit) = state.concurrency.clone().try_acquire_many_owned(permits) else {
        return respond::reject(tracker, &ApiError::overloaded(), schema);
    };
    if job.spec.stream {
        let spec = job.spec.clone();
        let mut index = 0u32;
        return respond::stream(SSE, model, &job, tracker, schema, move |f| {
            let _hold = &permit;
            match f {
                Frame::Start | Frame::End(_) => String::new(),
                Frame::Token(t, acc) => {
                    index += 1;
                    let last = t.finish.map(|r: FinishReason| acc.snapshot(r));
                    tgi::format::stream_event(index, &t.token, &t.top, last.as_ref(), &spec)
                }
                Frame::Error(e) => e.tgi_stream_event(),
            }
        });
    }
    let result = generation::run(model, &job, tracker).await;
    drop(permit);
    match result {
        Ok(out) => respond::ok_json(match route {
            TgiRoute::Compat => tgi::format::compat_response(&out, &job.spec),
            _ => tgi::format::generate_response(&out, &job.spec),
        }),
        Err(e) => respond::error(&e, schema),
    }
}

async fn tokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let schema = Schema::Tgi;
    let model = match generation::loaded(&state) {
        Ok(m) => m,
        Err(e) => return respond::error(&e, schema),
    };
    let result = (|| {
        let v = lmi_api::parse_json(&body)?;
        let req = tgi::parse_tgi_request(&v, TgiRoute::Tokenize, &limits(&state, model))?;
        let ids = model
            .tokenizer
            .encode(&req.inputs, true)
            .map_err(|e| ApiError::validation(e.to_string()))?;
        // Character offsets from incremental decoding: O(n), and exact for byte-level BPE.
        let mut detok = lmi_text::IncrementalDetokenizer::new(false);
        let mut pos = 0usize;
        let mut spans = Vec::with_capacity(ids.len());
        for &id in &ids {
            let delta = detok
                .push(&model.tokenizer, id)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            let start = pos;
            pos += delta.chars().count();
            spans.push(tgi::format::TokenSpan {
                id,
                text: model.tokenizer.decode(&[id], false).unwrap_or_default(),
                start,
                stop: pos,
            });
        }
        Ok::<_, ApiError>(tgi::format::tokenize_response(&spans))
    })();
    match result {
        Ok(b) => respond::ok_json(b),
        Err(e) => respond::error(&e, schema),
    }
}
