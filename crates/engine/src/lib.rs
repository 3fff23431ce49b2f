//! The inference engine: Llama-family model written once against the [`Backend`] trait,
//! the CPU backend, weights loading, GGUF import, the default model, and sampling.
//!
//! Nothing here knows about HTTP or request scheduling: the scheduler crate drives
//! [`StepEngine::step`](engine::StepEngine::step) over ragged batches ([`StepBatch`]) and gets
//! back sampled tokens and requested logprobs, never logits.

pub mod backend;
pub mod batch;
pub mod config;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod kv;
pub mod lora;
pub mod model;
pub mod model_store;
pub mod moe;
pub mod open;
pub mod quant;
pub mod sampling;
pub mod step;
#[doc(hidden)]
pub mod testing;
pub mod vision;
pub mod warmup;
pub mod weights;

pub use backend::Backend;
pub use batch::{BatchLayout, ChunkMedia, LogitsWanted, NO_BLOCK, SeqChunk};
pub use config::{Architecture, ModelConfig};
pub use dtype::DType;
pub use engine::Engine;
pub use error::{EngineError, Result};
pub use kv::{BLOCK_SIZE, KvCacheConfig, KvWindow};
pub use open::{Device, check_device, open};
pub use step::{
    PromptLogprobRequest, SampleRequest, StepBatch, StepOutput, TokenLogprob, TokenMask,
};
