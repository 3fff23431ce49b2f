//! Wire types, validation and output formatters for the LMI, TGI and OpenAI schemas.
//!
//! Pure: no I/O, no async, no engine knowledge. Requests parse into a neutral
//! [`GenerationSpec`]; the server runs it and hands back neutral [`GenerationOut`] /
//! [`TokenOut`] values that the formatters turn into each schema's exact bytes.
//!
//! Map:
//! - requests: [`responses::parse_responses_request`] (OpenAI Responses API) and
//!   [`anthropic::parse_messages_request`] (Anthropic Messages API), both run as chat requests;
//!   [`parse_invocation`] (LMI routes, dispatch on `prompt`/`inputs`/`messages`),
//!   [`lmi::parse_lmi_request`], [`tgi::parse_tgi_request`] (+ [`tgi::validate_input_length`]
//!   after tokenizing), [`openai::parse_chat_request`], [`openai::parse_completion_request`].
//! - responses: [`lmi::format`], [`tgi::format`], [`tgi::info`], [`openai::format`], [`sse`].
//! - embeddings and scores: [`embed`] (OpenAI `/v1/embeddings`, TEI `/embed`, `/similarity`,
//!   LMI's embedding answer) and [`rerank`] (TEI `/rerank`, `/predict`, Cohere / Jina / vLLM
//!   rerank, vLLM `/score`, LMI's cross-encoder answer).
//! - errors: [`ApiError`] with `status(Schema)` and `body(Schema)` / per-schema stream variants.
//! - [`openapi::openapi`] for `/api-doc/openapi.json`.
#![recursion_limit = "256"] // the OpenAPI document's json! literals

pub mod anthropic;
pub mod constraint;
pub mod embed;
pub mod error;
mod fields;
pub mod invocation;
pub mod lmi;
pub mod openai;
pub mod openapi;
pub mod output;
mod pyjson;
pub mod reply;
pub mod rerank;
pub mod responses;
pub mod spec;
pub mod sse;
pub mod tgi;

pub use constraint::Constraint;
pub use error::{ApiError, ErrorKind, Schema, lmi_server_error_body};
pub use invocation::{Invocation, parse_invocation, parse_invocation_bytes, parse_json};
pub use output::{FinishReason, GenerationOut, SequenceOut, TokenOut, TopTokens};
pub use spec::{BeamSpec, Draft, EarlyStop, GenerationSpec};
