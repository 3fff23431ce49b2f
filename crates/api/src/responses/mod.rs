//! OpenAI's Responses API (`POST /v1/responses`): the request, run as a chat request, and
//! the response objects and typed events it answers with.

pub mod format;
pub mod request;

pub use format::{
    ResponseMeta, ResponsesStream, ResponsesUsage, deleted, output_items, response_object,
};
pub use request::{
    ResponseEcho, ResponsesRequest, parse_responses_request, parse_responses_request_with,
};
