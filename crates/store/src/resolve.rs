//! A `--model` argument resolved to a directory the engine loads.

use std::path::{Path, PathBuf};

use crate::cache::{cache_root, convert_cached, gguf_cache_key, is_complete};
use crate::error::{Result, StoreError};
use crate::pypi::{default_gguf_path, default_model_dir};

/// A resolved `--model`: the HF directory (config, tokenizer, and weights converted to f32),
/// and for a GGUF the file itself, whose quantized blocks the engine can use as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    pub dir: PathBuf,
    pub gguf: Option<PathBuf>,
}

/// Like [`resolve_model`], keeping the GGUF file a model came from.
pub fn resolve(spec: Option<&str>, progress: bool) -> Result<ResolvedModel> {
    let dir = resolve_model(spec, progress)?;
    let gguf = match spec {
        None => Some(default_gguf_path(progress)?),
        Some(s) if is_gguf_file(Path::new(s)) => Some(PathBuf::from(s)),
        Some(_) => None,
    };
    Ok(ResolvedModel { dir, gguf })
}

fn is_gguf_file(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Resolves a `--model` argument: None → the default model; a directory with config.json →
/// itself; a `.gguf` file → converted once into the cache.
pub fn resolve_model(spec: Option<&str>, progress: bool) -> Result<PathBuf> {
    let Some(spec) = spec else {
        return default_model_dir(progress);
    };
    let path = Path::new(spec);
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(path.to_path_buf());
        }
        return Err(StoreError::Provision(format!(
            "model directory {spec:?} has no config.json: expected an HF checkpoint directory (config.json, *.safetensors, tokenizer.json) or a .gguf file"
        )));
    }
    if is_gguf_file(path) {
        // Config and tokenizer only: the engine reads the weights from the file itself
        // (`ResolvedModel::gguf`), as they are or dequantized.
        let dir = cache_root()?.join(format!("gguf-{}", gguf_cache_key(path)?));
        if !is_complete(&dir) {
            convert_cached(path, &dir, false, progress)?;
        }
        return Ok(dir);
    }
    Err(StoreError::Provision(format!(
        "model {spec:?} does not exist or is neither a directory with config.json nor a .gguf file"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_rejects_what_it_cannot_use() {
        let dir = tempfile::tempdir().unwrap();
        let e = resolve_model(dir.path().to_str(), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json"), "{e}");
        let e = resolve_model(Some("/nonexistent/model.bin"), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.bin"), "{e}");
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        assert_eq!(
            resolve_model(dir.path().to_str(), false).unwrap(),
            dir.path()
        );
    }
}
