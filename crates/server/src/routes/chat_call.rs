//! The steps the chat-shaped routes (`/v1/chat/completions` and LMI `messages` bodies,
//! `/v1/responses`, `/v1/messages`) take alike around their own request reading and
//! formatter: the request's metrics, the loaded model, remote media, the chat job
//! (`chat_job.rs`), then an SSE stream or a whole run. A step that fails answers with the
//! route's error `Schema` as the `Err`, so a route reads as a chain of `?`; each step takes
//! the call by value, so nothing can run after a refusal.

use std::sync::Arc;

use axum::response::Response;
use lmi_api::openai::{ChatMessage, ChatRequest};
use lmi_api::{ApiError, GenerationOut, Schema};

use super::respond::{self, Frame, SSE};
use crate::app::{AppState, LoadedModel};
use crate::chat_job::{self, ChatJob};
use crate::generation::{self, Job};
use crate::metrics::RequestTracker;

/// One chat request on its way to the scheduler.
pub struct ChatCall<'s> {
    state: &'s Arc<AppState>,
    pub model: &'s LoadedModel,
    /// Reports the request to the route's metrics, however it ends.
    tracker: RequestTracker,
    schema: Schema,
}

// The `Err` is the finished answer (a `Response`, 128 bytes), handed straight back to axum.
#[allow(clippy::result_large_err)]
impl<'s> ChatCall<'s> {
    /// Counts the request on `route`; 503 while the model loads.
    pub fn start(
        state: &'s Arc<AppState>,
        route: &'static str,
        schema: Schema,
        unknown_fields: &[String],
    ) -> Result<Self, Response> {
        let tracker = state.metrics.track(route);
        let model = match generation::loaded(state) {
            Ok(m) => m,
            Err(e) => return Err(respond::reject(tracker, &e, schema)),
        };
        if !unknown_fields.is_empty() {
            tracing::info!(unknown = ?unknown_fields, "ignoring unknown fields");
        }
        Ok(Self {
            state,
            model,
            tracker,
            schema,
        })
    }

    /// Refuses the request: reported as failed, answered with the schema's error.
    pub fn reject(self, e: &ApiError) -> Response {
        respond::reject(self.tracker, e, self.schema)
    }

    /// Fetches the messages' remote images and videos (when this server fetches any).
    pub async fn fetch_media(self, messages: &mut [ChatMessage]) -> Result<Self, Response> {
        match crate::media::inline_remote_chat(self.model.vision.as_ref(), messages).await {
            Ok(()) => Ok(self),
            Err(e) => Err(self.reject(&e)),
        }
    }

    /// Renders, tokenizes and compiles the request's constraints.
    pub fn prepare(self, req: &ChatRequest) -> Result<(Self, ChatJob), Response> {
        match chat_job::prepare(self.state, self.model, req) {
            Ok(chat) => Ok((self, chat)),
            Err(e) => Err(self.reject(&e)),
        }
    }

    /// The reply as server-sent events rendered by `render`.
    pub fn stream<F>(self, job: &Job, render: F) -> Response
    where
        F: FnMut(Frame<'_>) -> String + Send + 'static,
    {
        respond::stream(SSE, self.model, job, self.tracker, self.schema, render)
    }

    /// The whole reply (the error already rendered when it fails).
    pub async fn run(self, job: &Job) -> Result<GenerationOut, Response> {
        let schema = self.schema;
        generation::run(self.model, job, self.tracker)
            .await
            .map_err(|e| respond::error(&e, schema))
    }
}

/// Whether the served model reads images (the request parsers then take image parts).
pub fn takes_media(state: &AppState) -> bool {
    state.model().is_some_and(|m| m.vision.is_some())
}

/// Seconds since the Unix epoch, for the `created` fields.
pub fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
