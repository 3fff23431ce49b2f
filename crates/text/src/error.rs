//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while tokenizing or applying a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid JSON in {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The `tokenizers` crate failed (bad tokenizer.json, encode or decode failure).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A message role that the chat template does not define.
    #[error("chat template has no role '{0}'")]
    UnknownRole(String),
    /// An image/video/audio part for which the JSON template has no placeholder format.
    #[error("chat template has no format for content type '{0}'")]
    MissingContentFormat(String),
    /// A Jinja template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
    /// The template itself rejected the conversation via `raise_exception(msg)`.
    #[error("chat template rejected the conversation: {0}")]
    TemplateRaised(String),
    /// A JSON template could not be derived from a Jinja template.
    #[error("cannot derive a JSON chat template: {0}")]
    Derive(String),
}

/// Result with [`TextError`].
pub type Result<T> = std::result::Result<T, TextError>;
