//! Checkpoint formats, with nothing that computes a model: `config.json` and its per-family
//! fields, HF safetensors (single or sharded), GGUF (reader, writer, tensor names, hparams,
//! tokenizer import and llama.cpp's pre-tokenizer table, conversion to an HF directory),
//! ggml's quantized block types, PEFT LoRA adapters, and host tensors. `lmi convert` and
//! `lmi quantize` need only this; the engine loads through it.

pub mod config;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod peft;
pub mod pooling;
pub mod quant;
#[doc(hidden)]
pub mod testing;
pub mod weights;

pub use config::{Architecture, ModelConfig};
pub use dtype::DType;
pub use error::{CheckpointError, Result};
