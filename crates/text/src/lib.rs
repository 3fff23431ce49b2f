//! Text handling for the server: tokenizer, incremental detokenizer, chat templates
//! (the JSON format of TensorRT Edge-LLM, and HuggingFace Jinja templates) and tool calls.

pub mod chat;
mod detokenizer;
mod error;
pub mod harmony;
mod markers;
pub mod qwen3_reranker;
pub mod reasoning;
mod tokenizer;
pub mod tools;

pub use chat::{
    ChatTemplate, Content, ContentPart, ContentTypeFormat, JinjaChatTemplate, JsonChatTemplate,
    Message, RoleFormat, derive_json_template,
};
pub use detokenizer::IncrementalDetokenizer;
pub use error::{Result, TextError};
pub use reasoning::{ReasoningFormat, ReasoningPiece, ReasoningStream, split_reasoning};
pub use tokenizer::{Tokenizer, Truncate, TruncationSide};
pub use tools::{
    ParsedToolCall, ToolCallFormat, ToolStreamParser, ToolStreamPiece, parse_forced_calls,
    parse_tool_calls, prepare_messages, tools_system_prompt,
};
