//! Golden tests for every wire format, error body and validation message of `lmi-api`.

mod common;
mod embed;
mod errors;
mod invocation;
mod lmi_format;
mod lmi_request;
mod openai_format;
mod openai_request;
mod openapi;
mod rerank;
mod tgi_format;
mod tgi_request;
