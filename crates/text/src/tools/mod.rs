//! OpenAI tool calling at the text level: which format a model writes calls in, prompting
//! templates that have no tool support, and finding calls in output (whole or streamed).

mod call_json;
mod format;
mod parse;
mod prompt;
mod stream;

pub use call_json::{ParsedToolCall, parse_forced_calls};
pub use format::ToolCallFormat;
pub use parse::parse_tool_calls;
pub use prompt::{prepare_messages, tools_system_prompt};
pub use stream::{ToolStreamParser, ToolStreamPiece};
