use std::path::PathBuf;

/// Every failure reading or writing a checkpoint. Messages name the file, tensor or field at
/// fault.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid model config {path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("unsupported architecture {name:?}: supported are {supported}")]
    UnknownArchitecture { name: String, supported: String },
    #[error("missing tensor {name:?} in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    #[error("tensor {name:?} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch {
        name: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor {name:?} has unsupported dtype {dtype}: supported are F32, F16, BF16")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("safetensors error in {path}: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    #[error("GGUF error: {0}")]
    Gguf(String),
    #[error("LoRA adapter {path}: {msg}")]
    Adapter { path: PathBuf, msg: String },
}

pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

impl CheckpointError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.into(),
            source,
        }
    }
}
