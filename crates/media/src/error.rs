//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while reading, checking or preprocessing an image or a video.
///
/// Every variant but [`MediaError::Io`] and [`MediaError::Config`] is the client's doing (a 4xx):
/// the message says what was wrong with the input and what is accepted.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// The encoded input is larger than the limit.
    #[error("the {what} is {size} bytes, more than the limit of {limit} bytes")]
    TooManyBytes {
        what: &'static str,
        size: usize,
        limit: usize,
    },
    /// The header declares dimensions above the limits (a decompression-bomb guard).
    #[error(
        "the {what} is {width}x{height} pixels, over the limit ({max_side} pixels a side, {max_pixels} pixels in all); send a smaller one"
    )]
    TooLarge {
        what: &'static str,
        width: u32,
        height: u32,
        max_side: u32,
        max_pixels: u64,
    },
    /// The bytes are not in a format this crate decodes (SVG, TIFF, garbage, ...).
    #[error("unsupported {what} format{detail}: accepted are {accepted}")]
    UnsupportedFormat {
        what: &'static str,
        detail: String,
        accepted: &'static str,
    },
    /// The bytes start like a supported format but do not decode (truncated, corrupt).
    #[error("cannot decode the {format} {what}: {reason}")]
    Decode {
        what: &'static str,
        format: String,
        reason: String,
    },
    /// An image with a zero side, or an aspect ratio the model cannot take.
    #[error("bad image size: {0}")]
    BadSize(String),
    /// A video with too many frames, no frames, or frames of different sizes.
    #[error("bad video: {0}")]
    BadVideo(String),
    /// A `data:` URL that does not parse.
    #[error("bad data URL: {0}")]
    DataUrl(String),
    /// A media URL refused by the fetch policy (scheme, credentials, host not allowed, private IP).
    #[error("media URL refused: {0}")]
    UrlRefused(String),
    /// A preprocessor configuration that is not valid JSON or has values the code cannot use.
    #[error("preprocessor config{}: {reason}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Config {
        path: Option<PathBuf>,
        reason: String,
    },
    /// A file that could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl MediaError {
    /// Whether the error is the client's doing (bad input) rather than the server's.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, MediaError::Io { .. } | MediaError::Config { .. })
    }
}

/// Result with [`MediaError`].
pub type Result<T> = std::result::Result<T, MediaError>;
