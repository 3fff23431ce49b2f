//! Text handling for the server: tokenizer, incremental detokenizer and chat templates
//! (the JSON format of TensorRT Edge-LLM, and HuggingFace Jinja templates).

pub mod chat;
mod detokenizer;
mod error;
mod tokenizer;

pub use chat::{
    ChatTemplate, Content, ContentPart, ContentTypeFormat, JinjaChatTemplate, JsonChatTemplate,
    Message, RoleFormat, derive_json_template,
};
pub use detokenizer::IncrementalDetokenizer;
pub use error::{Result, TextError};
pub use tokenizer::Tokenizer;
