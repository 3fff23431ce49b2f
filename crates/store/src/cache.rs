//! The local model cache: its root, the lock every writer takes, and GGUF imports kept in it.

use std::fs::File;
use std::path::{Path, PathBuf};

use lmi_checkpoint::DType;
use lmi_checkpoint::gguf::convert::convert_gguf_with;
use sha2::{Digest, Sha256};

use crate::error::{Result, StoreError};

/// Written last into a converted directory: its presence means the directory is complete.
const COMPLETE_MARKER: &str = ".lmi-complete";

/// `$LMI_MODEL_CACHE`, else `$XDG_CACHE_HOME/lmi/models`, else `~/.cache/lmi/models`.
pub fn cache_root() -> Result<PathBuf> {
    let nonempty = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = nonempty("LMI_MODEL_CACHE") {
        return Ok(p);
    }
    if let Some(p) = nonempty("XDG_CACHE_HOME") {
        return Ok(p.join("lmi").join("models"));
    }
    if let Some(home) = nonempty("HOME") {
        return Ok(home.join(".cache").join("lmi").join("models"));
    }
    Err(StoreError::Provision(
        "cannot find a model cache directory: set LMI_MODEL_CACHE (or HOME / XDG_CACHE_HOME)"
            .into(),
    ))
}

pub(crate) fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETE_MARKER).is_file()
}

/// Converts `gguf` into the cache directory `dir` under the cache lock, then writes the marker.
pub(crate) fn convert_cached(gguf: &Path, dir: &Path, weights: bool, progress: bool) -> Result<()> {
    let root = dir
        .parent()
        .ok_or_else(|| StoreError::Provision(format!("{} has no parent", dir.display())))?;
    let _lock = CacheLock::acquire(root)?;
    if is_complete(dir) {
        return Ok(());
    }
    if dir.exists() {
        // Left by a process that died between the rename and the marker.
        std::fs::remove_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
    }
    if progress {
        eprintln!("converting {} to {}", gguf.display(), dir.display());
    }
    convert_gguf_with(gguf, dir, DType::F32, weights, progress)?;
    let marker = dir.join(COMPLETE_MARKER);
    std::fs::write(&marker, b"").map_err(|e| StoreError::io(&marker, e))
}

/// First 16 hex digits of sha256(canonical path, size, mtime): a re-written file converts anew.
pub(crate) fn gguf_cache_key(path: &Path) -> Result<String> {
    let canonical = path.canonicalize().map_err(|e| StoreError::io(path, e))?;
    let meta = std::fs::metadata(&canonical).map_err(|e| StoreError::io(path, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(canonical.to_string_lossy().as_bytes());
    h.update(meta.len().to_le_bytes());
    h.update(mtime.to_le_bytes());
    let digest = h.finalize();
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// A uniquely named temp file or directory, removed on drop (a no-op after it was renamed).
pub(crate) struct TempPath(pub(crate) PathBuf);

/// A name no other writer uses at the same time: the process, and a counter for its threads
/// (two resolvers in one process share a pid).
pub(crate) fn unique_suffix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("tmp-{}-{n}", std::process::id())
}

impl TempPath {
    fn unique(parent: &Path, tag: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(parent).map_err(|e| StoreError::io(parent, e))?;
        Ok(parent.join(format!(".{tag}.{}", unique_suffix())))
    }

    pub(crate) fn dir_in(parent: &Path, tag: &str) -> Result<Self> {
        let p = Self::unique(parent, tag)?;
        std::fs::create_dir(&p).map_err(|e| StoreError::io(&p, e))?;
        Ok(TempPath(p))
    }

    pub(crate) fn file_in(parent: &Path, tag: &str) -> Result<Self> {
        Ok(TempPath(Self::unique(parent, tag)?))
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// An exclusive lock on a file (`<root>/.lock` for the cache), released on drop.
pub(crate) struct CacheLock(File);

impl CacheLock {
    pub(crate) fn acquire(root: &Path) -> Result<Self> {
        Self::at(&root.join(".lock"))
    }

    /// An exclusive lock on the file `path` (created, with its folder, when missing). flock:
    /// the same lock Python's `filelock` takes, so huggingface_hub waits for us and we for it.
    pub(crate) fn at(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
        }
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| StoreError::io(path, e))?;
        file.lock().map_err(|e| StoreError::io(path, e))?;
        Ok(CacheLock(file))
    }
}

impl Drop for CacheLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_depends_on_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.gguf");
        let b = dir.path().join("b.gguf");
        std::fs::write(&a, b"x").unwrap();
        std::fs::write(&b, b"x").unwrap();
        let ka = gguf_cache_key(&a).unwrap();
        assert_eq!(ka.len(), 16);
        assert_eq!(ka, gguf_cache_key(&a).unwrap());
        assert_ne!(ka, gguf_cache_key(&b).unwrap());
    }
}
