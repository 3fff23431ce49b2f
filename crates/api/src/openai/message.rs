//! OpenAI chat messages as serde types that round-trip to OpenAI JSON, so the server can hand
//! them to its chat template code.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `developer` (newer OpenAI name) reads as system.
    #[serde(alias = "developer")]
    System,
    User,
    Assistant,
    Tool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text {
        text: String,
    },
    ImageUrl {
        image_url: ImageUrl,
    },
    /// vLLM's video part: `{"type": "video_url", "video_url": {"url": ...}}`.
    VideoUrl {
        video_url: ImageUrl,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON-encoded arguments, as OpenAI sends them.
    #[serde(default)]
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    /// Absent/null for an assistant message that only carries tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning sent back (vLLM's `reasoning_content`; `reasoning` and
    /// transformers' `thinking` are read too): the template decides what to keep.
    #[serde(
        default,
        alias = "reasoning",
        alias = "thinking",
        skip_serializing_if = "Option::is_none"
    )]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(MessageContent::Text(text.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        }
    }

    /// The text of the message: the string, or its text parts joined with "\n" (images skipped).
    pub fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(MessageContent::Text(s)) => s.clone(),
            Some(MessageContent::Parts(parts)) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    ContentPart::ImageUrl { .. } | ContentPart::VideoUrl { .. } => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// True when some part is an image or a video (the server may reject it for text-only
    /// models).
    pub fn has_image(&self) -> bool {
        matches!(&self.content, Some(MessageContent::Parts(p)) if p.iter().any(|x| matches!(x, ContentPart::ImageUrl { .. } | ContentPart::VideoUrl { .. })))
    }
}
