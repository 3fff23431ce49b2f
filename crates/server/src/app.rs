//! The application state shared by every route (the router and its layers are in
//! `router.rs`).
//!
//! Readiness: `lmi serve` binds its port at once and loads the model in the background;
//! until [`AppState::set_loaded`] runs, `/ping` and `/health` answer 503 and generation
//! routes should answer 503 too (orchestrators see "not ready", not "connection refused").

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use axum::http::HeaderName;
use lmi_scheduler::Handle;
use lmi_text::{ChatTemplate, Tokenizer};

use crate::config::ServingConfig;
use crate::metrics::ServerMetrics;

pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Everything that exists once the model is loaded.
pub struct LoadedModel {
    pub handle: Handle,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// Registered LoRA adapters and the host tier of their cache.
    pub adapters: Arc<lmi_scheduler::adapter_registry::AdapterRegistry>,
    /// Longest prompt + output (the scheduler's max_model_len).
    pub max_model_len: usize,
    /// The directory the model was loaded from.
    pub model_dir: std::path::PathBuf,
    /// Where the model came from (Hub commit, bytes), for the log and /info.
    pub origin: lmi_store::Origin,
    /// "cpu", "null", ...
    pub backend: &'static str,
    /// dtype of the weights in memory ("bf16", ...).
    pub dtype: String,
    /// Output constraints compiled against the model's vocabulary.
    pub grammars: crate::grammars::Grammars,
    /// How the model writes tool calls (option.tool_call_parser or its chat template).
    pub tool_format: lmi_text::tools::ToolCallFormat,
    /// How the model marks its reasoning (option.reasoning_parser or its chat template);
    /// `None`: replies are not read for reasoning.
    pub reasoning: Option<lmi_text::ReasoningFormat>,
    /// The thinking budget of requests that name none (option.reasoning_budget).
    pub reasoning_budget: lmi_api::openai::ThinkingBudget,
    /// Most sequences (n, best_of) one request may ask for (option.max_sequences_per_request).
    pub max_sequences: usize,
    /// A vision-language model's processor and media limits (None: text only).
    pub vision: Option<crate::media::VisionSetup>,
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
    pub concurrency: Arc<tokio::sync::Semaphore>,
    /// Accepted API keys (digests); empty: the server is open.
    api_keys: crate::guard::auth::Keys,
    /// Groups LMI dynamic-batch requests (batch_size, max_batch_delay).
    batcher: crate::dynamic_batch::DynamicBatcher,
    /// Finished Responses API responses (`store`, `previous_response_id`).
    pub responses: crate::responses_store::ResponseStore,
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
            api_keys: crate::guard::auth::Keys::new(&config.access.api_keys),
            concurrency: Arc::new(tokio::sync::Semaphore::new(permits)),
            batcher: crate::dynamic_batch::DynamicBatcher::new(
                config.batch_size,
                std::time::Duration::from_millis(config.max_batch_delay_ms),
            ),
            responses: crate::responses_store::ResponseStore::new(config.responses_store),
            config,
            metrics,
            model_name,
            model_id,
            loaded: OnceLock::new(),
        }
    }

    /// The OpenAI parser's limits from the configuration.
    pub fn openai_config(&self) -> lmi_api::openai::OpenAiConfig {
        lmi_api::openai::OpenAiConfig {
            max_client_batch_size: self.config.max_client_batch_size,
        }
    }

    pub fn api_keys(&self) -> &crate::guard::auth::Keys {
        &self.api_keys
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

#[cfg(test)]
mod tests {
    use super::*;

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
