use std::path::PathBuf;

/// Why a model could not be provided: the cache, the fetch, or the checkpoint it brought.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("model provisioning failed: {0}")]
    Provision(String),
    /// A model name that cannot be fetched (Hub, S3): the message says what to do.
    #[error("{0}")]
    Source(String),
    #[error(transparent)]
    Checkpoint(#[from] lmi_checkpoint::CheckpointError),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}
