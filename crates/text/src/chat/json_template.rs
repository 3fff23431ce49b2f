//! The JSON chat template of TensorRT Edge-LLM (`processed_chat_template.json`, seed 003).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::message::{Content, ContentPart, Message};
use crate::error::{Result, TextError};

/// Text written before and after a message of one role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleFormat {
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub suffix: String,
}

/// The placeholder text that stands for one media item (image, video, audio).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentTypeFormat {
    pub format: String,
}

/// `processed_chat_template.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonChatTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_path: Option<String>,
    pub roles: BTreeMap<String, RoleFormat>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub content_types: BTreeMap<String, ContentTypeFormat>,
    #[serde(default)]
    pub generation_prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_prompt_thinking: Option<String>,
    /// Absent or "" means: no system message unless the request brings one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_system_prompt: Option<String>,
}

impl JsonChatTemplate {
    pub fn from_json(text: &str) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TextError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text).map_err(|source| TextError::Json {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Formats a conversation. System prompt priority (seed 003): an explicit system message,
    /// else `default_system_prompt`, else none. Each message is `prefix + content + suffix`;
    /// media parts become their `content_types` format. With `add_generation_prompt` the
    /// thinking prompt is used when `enable_thinking` and the template has one.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        let mut out = String::new();
        let has_system = messages.iter().any(|m| m.role == "system");
        if !has_system
            && let Some(default) = self.default_system_prompt.as_deref()
            && !default.is_empty()
        {
            let role = self.role("system")?;
            out.push_str(&role.prefix);
            out.push_str(default);
            out.push_str(&role.suffix);
        }
        for m in messages {
            let role = self.role(&m.role)?;
            out.push_str(&role.prefix);
            self.push_content(&mut out, &m.content)?;
            out.push_str(&role.suffix);
        }
        if add_generation_prompt {
            match self.generation_prompt_thinking.as_deref() {
                Some(thinking) if enable_thinking => out.push_str(thinking),
                _ => out.push_str(&self.generation_prompt),
            }
        }
        Ok(out)
    }

    /// `apply_chat_template = false`: message contents concatenated with no role markers,
    /// no default system prompt and no generation prompt. Media parts still become their
    /// placeholders, since the seed describes raw mode as "concatenation of text and images".
    /// Messages are joined with "" because the seed says they are "concatenated directly".
    pub fn render_raw(&self, messages: &[Message]) -> Result<String> {
        let mut out = String::new();
        for m in messages {
            self.push_content(&mut out, &m.content)?;
        }
        Ok(out)
    }

    fn role(&self, name: &str) -> Result<&RoleFormat> {
        self.roles
            .get(name)
            .ok_or_else(|| TextError::UnknownRole(name.to_owned()))
    }

    fn push_content(&self, out: &mut String, content: &Content) -> Result<()> {
        match content {
            Content::Text(t) => out.push_str(t),
            Content::Parts(parts) => {
                for part in parts {
                    match part {
                        ContentPart::Text { text } => out.push_str(text),
                        media => out.push_str(self.media_format(media.kind())?),
                    }
                }
            }
        }
        Ok(())
    }

    fn media_format(&self, kind: &str) -> Result<&str> {
        self.content_types
            .get(kind)
            .map(|f| f.format.as_str())
            .ok_or_else(|| TextError::MissingContentFormat(kind.to_owned()))
    }
}

/// Raw concatenation without any template (see [`JsonChatTemplate::render_raw`]); media parts
/// are an error because there is no placeholder to write for them.
pub fn render_raw(messages: &[Message]) -> Result<String> {
    JsonChatTemplate::default().render_raw(messages)
}
