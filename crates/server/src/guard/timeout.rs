//! option.request_timeout: a request that is not done within the limit ends. Before the
//! response has started the handler is dropped and the client gets the schema's 408; once a
//! stream has started, its body ends with the schema's in-stream error. Either way the
//! scheduler stream is dropped with the handler or the body, which cancels the request and
//! frees its KV blocks.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use lmi_api::{ApiError, Schema};
use tokio::time::Instant;

use super::wire::{Shape, shape_of};
use crate::app::AppState;

pub async fn layer(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(limit) = s.config.access.request_timeout else {
        return next.run(req).await;
    };
    let path = req.uri().path().to_string();
    let deadline = Instant::now() + limit;
    let res = match tokio::time::timeout_at(deadline, next.run(req)).await {
        Ok(res) => res,
        Err(_) => {
            s.metrics.request_timed_out();
            return super::wire::error_response(&path, &ApiError::timeout(limit));
        }
    };
    let content_type = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(tail) = stream_error(&path, content_type, limit) else {
        return res;
    };
    let (parts, body) = res.into_parts();
    Response::from_parts(parts, Body::from_stream(bounded(body, deadline, tail, s)))
}

/// The schema's in-stream error for a streaming response at `path`; None when the response
/// is not a stream.
fn stream_error(path: &str, content_type: &str, limit: Duration) -> Option<String> {
    let sse = content_type.starts_with("text/event-stream");
    let lines = content_type.starts_with("application/jsonlines");
    if !sse && !lines {
        return None;
    }
    let e = ApiError::timeout(limit);
    Some(match shape_of(path) {
        Shape::Api(Schema::OpenAi) => e.openai_stream_events(),
        Shape::Api(Schema::Responses) => e.responses_stream_event(None),
        Shape::Api(Schema::Anthropic) => e.anthropic_stream_event(),
        Shape::Api(Schema::Lmi | Schema::LmiDynamicBatch) if sse => {
            lmi_api::lmi::format::sse_error(&e.lmi_message())
        }
        Shape::Api(Schema::Lmi | Schema::LmiDynamicBatch) => {
            lmi_api::lmi::format::error_line(&e.lmi_message())
        }
        Shape::Api(Schema::Tgi) | Shape::Management => e.tgi_stream_event(),
    })
}

/// `body` until `deadline`, then `tail` and the end (the inner body is dropped).
fn bounded(
    body: Body,
    deadline: Instant,
    tail: String,
    s: Arc<AppState>,
) -> impl futures_util::Stream<Item = Result<Bytes, axum::Error>> + Send {
    let inner = body.into_data_stream();
    futures_util::stream::unfold(Some((inner, tail, s)), move |st| async move {
        let (mut inner, tail, s) = st?;
        match tokio::time::timeout_at(deadline, inner.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some((inner, tail, s)))),
            Ok(None) => None,
            Err(_) => {
                drop(inner);
                s.metrics.request_timed_out();
                Some((Ok(Bytes::from(tail)), None))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stream_ends_in_its_schema() {
        let d = Duration::from_secs(1);
        let openai = stream_error("/v1/chat/completions", "text/event-stream", d).unwrap();
        assert!(openai.ends_with("data: [DONE]\n\n"), "{openai}");
        let tgi = stream_error("/generate_stream", "text/event-stream", d).unwrap();
        assert!(tgi.contains("\"error_type\":\"timeout\""), "{tgi}");
        let lmi = stream_error("/invocations", "application/jsonlines", d).unwrap();
        assert!(
            lmi.ends_with('\n') && lmi.contains("option.request_timeout"),
            "{lmi}"
        );
        assert!(stream_error("/generate", "application/json", d).is_none());
    }
}
