//! OpenAI chat/completions schema.

pub mod chat;
pub mod completion;
pub mod format;
pub mod message;
pub mod reasoning;
mod sampling;
pub mod tools;

pub use chat::{ChatRequest, parse_chat_request};
pub use completion::{
    CompletionPrompt, CompletionRequest, DEFAULT_COMPLETION_MAX_TOKENS, OpenAiConfig,
    parse_completion_request,
};
pub use format::{
    ChatTurn, CompletionDetails, OpenAiMeta, TokenRun, ToolCallOut, ToolDelta, Usage,
};
pub use message::{
    ChatMessage, ContentPart, FunctionCall, ImageUrl, MessageContent, Role, ToolCall,
};
pub use reasoning::{ReasoningControls, ThinkingBudget};
pub use tools::{Tool, ToolChoice, ToolSpec};
