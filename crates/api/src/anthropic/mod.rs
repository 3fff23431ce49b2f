//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): the request,
//! run as a chat request, and the message objects and events it answers with.

pub mod format;
pub mod request;

pub use format::{
    MessageMeta, MessagesStream, MessagesUsage, content_blocks, message, token_count,
};
pub use request::{MessagesRequest, parse_messages_request, parse_messages_request_with};
