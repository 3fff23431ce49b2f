/// Every failure the engine reports: its own (a step it cannot run, a backend's refusal) and
/// the checkpoint's it loads from, whose messages pass through unchanged.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Checkpoint(#[from] lmi_checkpoint::CheckpointError),
    #[error("invalid batch: {0}")]
    Batch(String),
    #[error("backend error: {0}")]
    Backend(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
