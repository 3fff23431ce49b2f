//! The engine core: the model's forward pass written once against the [`Backend`] trait, the
//! step boundary the scheduler drives ([`StepEngine::step`](engine::StepEngine::step) over
//! ragged batches, [`StepBatch`], returning sampled tokens and requested logprobs, never
//! logits), batch layout, sampling, KV pool types, LoRA and vision-tower uploads.
//!
//! Nothing here knows about HTTP, request scheduling, or a particular device: the backends
//! (`lmi-engine-cpu`, `lmi-engine-cuda`) implement [`Backend`]; checkpoints are read through
//! `lmi-checkpoint`; `lmi_engine::open` is the one constructor.

pub mod backend;
pub mod batch;
pub mod encoder;
pub mod engine;
pub mod error;
pub mod kv;
pub mod lora;
pub mod model;
pub mod moe;
pub mod pooler;
pub mod sampling;
pub mod state;
pub mod step;
pub mod vision;

pub use backend::Backend;
pub use batch::{BatchLayout, ChunkMedia, LogitsWanted, NO_BLOCK, SeqChunk};
pub use engine::Engine;
pub use error::{EngineError, Result};
pub use kv::{BLOCK_SIZE, KvCacheConfig, KvWindow};
pub use lmi_checkpoint::{Architecture, DType, ModelConfig};
pub use state::{ChunkState, NO_SLOT, StateConfig};
pub use step::{
    MtpChunk, PoolRequest, PromptLogprobRequest, SampleRequest, StepBatch, StepOutput,
    TokenLogprob, TokenMask,
};
