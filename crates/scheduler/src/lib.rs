//! The rolling-batch scheduler: one thread owns the engine and the KV manager and runs
//! continuous batching over a paged KV cache with a prefix cache (see `scheduler.rs`).
//! Callers submit through a [`Handle`] and read [`Event`]s from a [`RequestStream`].
//! LoRA adapters are cached in two tiers: the engine's slots (`adapters.rs`, on the scheduler
//! thread) and host memory ([`adapter_registry`], where adapters are registered by name).

pub mod adapter_registry;
mod adapters;
pub mod block_pool;
pub mod constraint;
mod entry;
mod error;
mod event;
mod handle;
mod kv_manager;
mod metrics;
mod pooling;
mod prefix_hash;
mod prompt;
mod request;
mod request_state;
mod scheduler;
mod sequence;
mod state_pool;
mod step_plan;
mod stop;
mod strategy;

pub use error::SubmitError;
pub use event::{Event, FinishReason, Finished, Pooled, PromptToken, Timings, TokenEvent};
pub use handle::{Handle, Limits, RequestStream};
pub use metrics::{MetricsSnapshot, SchedulerMetrics};
pub use prompt::{MediaHash, MediaSpan, PlacedMedia, Prompt, Span};
pub use request::{
    AdapterId, AdapterRef, AdapterWeights, BeamParams, EarlyStopping, GenerateRequest,
    PoolingRequest, StoppingParams,
};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use sequence::RequestId;
pub use stop::StopMatcher;
pub use strategy::speculation::{DraftSource, NgramLookup, SpeculativeConfig};
