//! The application state shared by every route, and the router with the layers every route
//! gets: request id + tracing span, request body limit (413).
//!
//! Readiness: `lmi serve` binds its port at once and loads the model in the background;
//! until [`AppState::set_loaded`] runs, `/ping` and `/health` answer 503 and generation
//! routes should answer 503 too (orchestrators see "not ready", not "connection refused").

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use lmi_engine::config::ModelConfig;
use lmi_scheduler::Handle;
use lmi_text::{ChatTemplate, Tokenizer};
use tower_http::limit::RequestBodyLimitLayer;
use tracing::Instrument;

use crate::config::ServingConfig;
use crate::metrics::ServerMetrics;

pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Everything that exists once the model is loaded.
#[allow(dead_code)] // API for the generation routes (routes/{lmi,tgi,openai}.rs)
pub struct LoadedModel {
    pub handle: Handle,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Registered LoRA adapters and the host tier of their cache.
    pub adapters: Arc<crate::adapters::AdapterRegistry>,
    pub model_config: ModelConfig,
    /// Longest prompt + output (the scheduler's max_model_len).
    pub max_model_len: usize,
    /// The directory the model was loaded from.
    pub model_dir: std::path::PathBuf,
    /// "cpu", "null", ...
    pub backend: &'static str,
    /// dtype of the weights in memory ("bf16", ...).
    pub dtype: String,
    /// Output constraints compiled against the model's vocabulary.
    pub grammars: crate::grammars::Grammars,
    /// How the model writes tool calls (option.tool_call_parser or its chat template).
    pub tool_format: lmi_text::tools::ToolCallFormat,
}

pub struct AppState {
    pub config: Arc<ServingConfig>,
    pub metrics: Arc<ServerMetrics>,
    /// The name the model answers to (`/ping` key, OpenAI `model`, `/predictions/{model}`).
    pub model_name: String,
    /// TGI's `model_id` (/info, /v1/models `owned_by`): option.model_id or the default model's name.
    pub model_id: String,
    /// `max_concurrent_requests` permits: TGI routes `try_acquire_owned` one per sequence and
    /// answer 429 "Model is overloaded" when none is left; the permit lives as long as the
    /// response (stream).
    #[allow(dead_code)] // API for the generation routes
    pub concurrency: Arc<tokio::sync::Semaphore>,
    /// Groups LMI dynamic-batch requests (batch_size, max_batch_delay).
    batcher: crate::dynamic_batch::DynamicBatcher,
    loaded: OnceLock<LoadedModel>,
}

impl AppState {
    pub fn new(
        config: Arc<ServingConfig>,
        metrics: Arc<ServerMetrics>,
        model_name: String,
        model_id: String,
    ) -> Self {
        let permits = config
            .max_concurrent_requests
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        AppState {
            concurrency: Arc::new(tokio::sync::Semaphore::new(permits)),
            batcher: crate::dynamic_batch::DynamicBatcher::new(
                config.batch_size,
                std::time::Duration::from_millis(config.max_batch_delay_ms),
            ),
            config,
            metrics,
            model_name,
            model_id,
            loaded: OnceLock::new(),
        }
    }

    pub fn dynamic_batcher(&self) -> &crate::dynamic_batch::DynamicBatcher {
        &self.batcher
    }

    /// The model, once loaded; None while loading (answer 503).
    pub fn model(&self) -> Option<&LoadedModel> {
        self.loaded.get()
    }

    pub fn is_ready(&self) -> bool {
        self.loaded.get().is_some()
    }

    /// Marks the model loaded (once; a second call is refused and returns the model back).
    pub fn set_loaded(&self, model: LoadedModel) -> Result<(), Box<LoadedModel>> {
        self.loaded.set(model).map_err(Box::new)?;
        self.metrics.set_model_ready(true);
        Ok(())
    }

    /// Takes the loaded model out (at shutdown, to stop the scheduler).
    pub fn into_model(self) -> Option<LoadedModel> {
        self.loaded.into_inner()
    }

    /// The scheduler handle, once loaded.
    pub fn handle(&self) -> Option<&Handle> {
        self.model().map(|m| &m.handle)
    }
}

/// The request id of the current request (an extension set by the request-id layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// A random, UUID-shaped id (128 bits from std's randomly keyed hasher plus a counter).
pub fn new_request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u64(salt);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        h.finish()
    };
    let v = (u128::from(half(1)) << 64) | u128::from(half(2));
    let s = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &s[..8],
        &s[8..12],
        &s[12..16],
        &s[16..20],
        &s[20..]
    )
}

/// An incoming id is echoed when it is short printable ASCII; otherwise a new one is made.
fn incoming_id(req: &Request) -> Option<String> {
    let v = req.headers().get(&REQUEST_ID_HEADER)?.to_str().ok()?;
    let ok = !v.is_empty() && v.len() <= 200 && v.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| v.to_string())
}

async fn request_id_layer(mut req: Request, next: Next) -> Response {
    let id = incoming_id(&req).unwrap_or_else(new_request_id);
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!(
        "request",
        id = %id,
        method = %req.method(),
        path = %req.uri().path()
    );
    let started = Instant::now();
    let mut res = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::debug!(
            status = res.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "response"
        )
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    res
}

/// Every route (ops + generation) with the shared layers.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_request_size;
    Router::new()
        .merge(crate::routes::ops::routes())
        .merge(crate::routes::generation_routes())
        .layer(DefaultBodyLimit::max(limit))
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(middleware::from_fn(request_id_layer))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generation routes add `POST /` next to the ops routes' `GET /` (TGI): the method
    /// routers of one path merge.
    #[tokio::test]
    async fn post_root_merges_with_get_root() {
        use axum::body::Body;
        use axum::http::{Request, StatusCode};
        use tower::ServiceExt;

        let config = crate::config::ServingConfig::load(
            &crate::config::ServeArgs::default(),
            &crate::config::EnvVars::new(),
            None,
        )
        .unwrap();
        let state = Arc::new(AppState::new(
            Arc::new(config),
            Arc::new(ServerMetrics::new()),
            "m".into(),
            "m".into(),
        ));
        assert_eq!(state.concurrency.available_permits(), 1032);
        let gen_routes: Router<Arc<AppState>> =
            Router::new().route("/", axum::routing::post(|| async { "generated" }));
        let app = Router::new()
            .merge(crate::routes::ops::routes())
            .merge(gen_routes)
            .with_state(state);
        let call = |method: &str| {
            Request::builder()
                .method(method)
                .uri("/")
                .body(Body::empty())
                .unwrap()
        };
        let res = app.clone().oneshot(call("POST")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let res = app.oneshot(call("GET")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE); // not loaded
    }

    #[test]
    fn request_ids_are_uuid_shaped_and_distinct() {
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }
}
