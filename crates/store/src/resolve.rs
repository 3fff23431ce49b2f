//! A model argument resolved to a directory the engine loads, fetching it first when it
//! names the Hub or S3.

use std::path::{Path, PathBuf};

use crate::cache::{cache_root, convert_cached, gguf_cache_key, is_complete};
use crate::error::{Result, StoreError};
use crate::hub::{self, HubConfig};
use crate::pypi::{default_gguf_path, default_model_dir};
use crate::s3::{self, S3Config};
use crate::source::ModelSource;

/// A resolved model: the HF directory (config, tokenizer, and weights), for a GGUF the file
/// itself (whose quantized blocks the engine can use as they are), and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    pub dir: PathBuf,
    pub gguf: Option<PathBuf>,
    pub origin: Origin,
}

/// Where a model came from, for the log and `/info`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Origin {
    /// What was named: a path, `org/name`, `s3://…`, or the default model's name.
    pub name: String,
    /// `local`, `hub`, `s3` or `pypi`.
    pub kind: &'static str,
    /// The Hub commit the files are from.
    pub commit: Option<String>,
    /// Bytes of the model's files, where they were fetched.
    pub bytes: Option<u64>,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}", self.name, self.kind)?;
        if let Some(c) = &self.commit {
            write!(f, ", commit {c}")?;
        }
        if let Some(b) = self.bytes {
            write!(f, ", {:.1} MB", b as f64 / 1e6)?;
        }
        f.write_str(")")
    }
}

/// How to fetch: progress shown or not, the revision for a Hub id without one, and the Hub's
/// and S3's settings.
#[derive(Debug, Clone)]
pub struct Fetch {
    pub progress: bool,
    /// option.revision / HF_REVISION.
    pub revision: Option<String>,
    pub hub: HubConfig,
    pub s3: S3Config,
}

impl Fetch {
    /// The same settings for another model (a draft, an adapter): option.revision is the
    /// served model's, not theirs.
    pub fn without_revision(&self) -> Self {
        Fetch {
            revision: None,
            ..self.clone()
        }
    }

    /// The Hub's and S3's settings, and HF_REVISION, from the process environment.
    pub fn from_env(progress: bool) -> Self {
        Self::from_vars(|k| std::env::var(k).ok(), progress)
    }

    /// The same from any variable lookup (the server's configuration passes its own).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>, progress: bool) -> Self {
        Fetch {
            progress,
            revision: var("HF_REVISION").filter(|r| !r.trim().is_empty()),
            hub: HubConfig::from_vars(&var),
            s3: S3Config::from_vars(&var),
        }
    }
}

/// [`resolve_with`] with the environment's settings.
pub fn resolve(spec: Option<&str>, progress: bool) -> Result<ResolvedModel> {
    resolve_with(spec, &Fetch::from_env(progress))
}

/// The directory of [`resolve`] (tests and tools that need no more).
pub fn resolve_model(spec: Option<&str>, progress: bool) -> Result<PathBuf> {
    resolve(spec, progress).map(|r| r.dir)
}

/// Resolves a model argument: None → the default model; a directory with config.json →
/// itself; a `.gguf` file → its config and tokenizer imported once into our cache; an
/// `s3://` prefix or a Hub id → fetched, then as a directory or GGUF file.
pub fn resolve_with(spec: Option<&str>, fetch: &Fetch) -> Result<ResolvedModel> {
    let source = ModelSource::parse(spec, fetch.revision.as_deref())?;
    let name = source.describe();
    match &source {
        ModelSource::Default => tracing::info!("model {name} (the default model)"),
        ModelSource::Local(_) => tracing::info!("model {name} (local)"),
        _ => {}
    }
    match source {
        ModelSource::Default => Ok(ResolvedModel {
            dir: default_model_dir(fetch.progress)?,
            gguf: Some(default_gguf_path(fetch.progress)?),
            origin: Origin {
                name,
                kind: "pypi",
                ..Origin::default()
            },
        }),
        ModelSource::Local(path) => local(
            &path,
            fetch.progress,
            Origin {
                name,
                kind: "local",
                ..Origin::default()
            },
        ),
        ModelSource::Hub(r) => {
            let snap = hub::snapshot(&fetch.hub, &r, fetch.progress)?;
            let origin = Origin {
                name,
                kind: "hub",
                commit: Some(snap.commit.clone()),
                bytes: Some(snap.bytes),
            };
            tracing::info!(
                "{}@{} is {origin} in {}",
                r.repo,
                r.revision(),
                snap.dir.display()
            );
            match snap.gguf.first() {
                Some(g) => local(g, fetch.progress, origin),
                None => local(&snap.dir, fetch.progress, origin),
            }
        }
        ModelSource::S3(uri) => {
            let fetched = s3::download(&fetch.s3, &uri, fetch.progress)?;
            let origin = Origin {
                name,
                kind: "s3",
                commit: None,
                bytes: Some(fetched.bytes),
            };
            tracing::info!("{uri} is {origin} in {}", fetched.dir.display());
            local(&fetched.dir, fetch.progress, origin)
        }
    }
}

/// A LoRA adapter argument (option.adapters, a draft's adapters): an existing path as it is;
/// a Hub id (`org/name@revision`) or an `s3://` prefix fetched, to its directory.
pub fn resolve_adapter(spec: &str, fetch: &Fetch) -> Result<PathBuf> {
    match ModelSource::parse(Some(spec), None)? {
        ModelSource::Local(p) => Ok(p),
        ModelSource::Default => Err(StoreError::Source(
            "an adapter needs a path or a name".into(),
        )),
        ModelSource::Hub(r) => {
            let snap = hub::snapshot_for(&fetch.hub, &r, hub::Purpose::Adapter, fetch.progress)?;
            tracing::info!(
                "adapter {}@{} is commit {} in {}",
                r.repo,
                r.revision(),
                snap.commit,
                snap.dir.display()
            );
            Ok(snap.dir)
        }
        ModelSource::S3(uri) => Ok(s3::download(&fetch.s3, &uri, fetch.progress)?.dir),
    }
}

fn is_gguf_file(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// A directory with config.json, or a `.gguf` file (its config and tokenizer imported once;
/// the engine reads the weights from the file itself, as they are or dequantized).
fn local(path: &Path, progress: bool, origin: Origin) -> Result<ResolvedModel> {
    let spec = path.display();
    if path.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(ResolvedModel {
                dir: path.to_path_buf(),
                gguf: None,
                origin,
            });
        }
        return Err(StoreError::Provision(format!(
            "model directory {spec:?} has no config.json: expected an HF checkpoint directory (config.json, *.safetensors, tokenizer.json) or a .gguf file"
        )));
    }
    if is_gguf_file(path) {
        let dir = cache_root()?.join(format!("gguf-{}", gguf_cache_key(path)?));
        if !is_complete(&dir) {
            convert_cached(path, &dir, false, progress)?;
        }
        return Ok(ResolvedModel {
            dir,
            gguf: Some(path.to_path_buf()),
            origin,
        });
    }
    Err(StoreError::Provision(format!(
        "model {spec:?} is neither a directory with config.json nor a .gguf file"
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
        let file = dir.path().join("weights.bin");
        std::fs::write(&file, b"x").unwrap();
        let e = resolve_model(file.to_str(), false).unwrap_err().to_string();
        assert!(e.contains("neither a directory"), "{e}");
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let r = resolve(dir.path().to_str(), false).unwrap();
        assert_eq!(r.dir, dir.path());
        assert_eq!(r.origin.kind, "local");
    }
}
