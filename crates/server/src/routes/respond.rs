//! Response building shared by the generation routes: plain bodies, schema error bodies, and
//! streaming bodies driven by scheduler events.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::Stream;
use lmi_api::{ApiError, Schema};
use lmi_scheduler::RequestStream;

use crate::app::LoadedModel;
use crate::generation::{Accumulator, Job, StreamItem, StreamToken, report};
use crate::metrics::RequestTracker;

pub const JSON: &str = "application/json";
pub const JSONLINES: &str = "application/jsonlines";
pub const SSE: &str = "text/event-stream";

pub fn body(status: u16, content_type: &'static str, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub fn ok_json(s: String) -> Response {
    body(200, JSON, s)
}

pub fn error(e: &ApiError, schema: Schema) -> Response {
    body(e.status(schema), JSON, e.body(schema))
}

/// Reports a request that failed before generating and renders the schema's error.
pub fn reject(tracker: RequestTracker, e: &ApiError, schema: Schema) -> Response {
    crate::generation::fail(tracker, e);
    error(e, schema)
}

/// What a streaming formatter is asked to render.
pub enum Frame<'a> {
    /// Before the first token (OpenAI's role chunk).
    Start,
    Token(&'a StreamToken, &'a Accumulator),
    /// The stream failed after it started: the schema's in-stream error.
    Error(&'a ApiError),
    /// The request finished (every sequence): trailers such as OpenAI's usage chunk and [DONE].
    End(&'a Accumulator),
}

/// Submits `job` and streams its events, folded by an [`Accumulator`] and rendered by
/// `render`; a refused submission (queue full, bad sampling parameters) is the schema's error.
/// Dropping the body (client gone) drops the request stream, which cancels the request.
pub fn stream<F>(
    content_type: &'static str,
    model: &LoadedModel,
    job: &Job,
    tracker: RequestTracker,
    schema: Schema,
    render: F,
) -> Response
where
    F: FnMut(Frame<'_>) -> String + Send + 'static,
{
    let events = match crate::generation::submit(model, job) {
        Ok(s) => s,
        Err(e) => return reject(tracker, &e, schema),
    };
    let acc = Accumulator::new(model, job);
    let s = drive(events, acc, tracker, job.spec.max_new_tokens, render);
    let mut r = Response::new(Body::from_stream(s));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

struct State<F> {
    events: RequestStream,
    acc: Accumulator,
    tracker: Option<RequestTracker>,
    max_new_tokens: usize,
    render: F,
    started: bool,
    done: bool,
}

fn drive<F>(
    events: RequestStream,
    acc: Accumulator,
    tracker: RequestTracker,
    max_new_tokens: usize,
    render: F,
) -> impl Stream<Item = Result<String, Infallible>> + Send
where
    F: FnMut(Frame<'_>) -> String + Send + 'static,
{
    let st = State {
        events,
        acc,
        tracker: Some(tracker),
        max_new_tokens,
        render,
        started: false,
        done: false,
    };
    futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = String::new();
        if !st.started {
            st.started = true;
            out.push_str(&(st.render)(Frame::Start));
        }
        loop {
            match st.events.recv().await {
                None => {
                    out.push_str(&(st.render)(Frame::End(&st.acc)));
                    if let Some(t) = st.tracker.take() {
                        report(t, &st.acc, None, Some(st.max_new_tokens));
                    }
                    st.done = true;
                    return Some((Ok(out), st));
                }
                Some(e) => match st.acc.apply(e) {
                    None => continue,
                    Some(StreamItem::Token(t)) => {
                        out.push_str(&(st.render)(Frame::Token(&t, &st.acc)));
                        if out.is_empty() {
                            continue;
                        }
                        return Some((Ok(out), st));
                    }
                    Some(StreamItem::Error(err)) => {
                        out.push_str(&(st.render)(Frame::Error(&err)));
                        if let Some(t) = st.tracker.take() {
                            report(t, &st.acc, Some(err.error_type()), None);
                        }
                        st.done = true;
                        return Some((Ok(out), st));
                    }
                },
            }
        }
    })
}
