//! HuggingFace TGI schema.

pub mod format;
pub mod info;
pub mod request;

pub use format::TokenSpan;
pub use info::InfoIn;
pub use request::{TgiLimits, TgiRequest, TgiRoute, parse_tgi_request, validate_input_length};
