//! Chat messages as they arrive in OpenAI requests and seed-000 batch files.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// One conversation turn. The tool fields follow OpenAI's chat format, so an OpenAI message
/// converts by a serde round trip.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// `null` (OpenAI assistant turns that only carry tool calls) reads as empty text.
    #[serde(default)]
    pub content: Content,
    /// Assistant turns: `{"id", "type": "function", "function": {"name", "arguments"}}`, with
    /// `arguments` a JSON-encoded string as OpenAI sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// Tool turns: the id of the call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning; templates read it as `reasoning_content` (Qwen3) or
    /// `thinking` (gpt-oss), so it is given under both names.
    #[serde(
        default,
        alias = "reasoning",
        alias = "thinking",
        skip_serializing_if = "Option::is_none"
    )]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self::with_content(role, Content::Text(content.into()))
    }

    /// A message without tool fields.
    pub fn with_content(role: impl Into<String>, content: Content) -> Self {
        Self {
            role: role.into(),
            content,
            ..Self::default()
        }
    }
}

/// A plain string, or an array of typed parts (multimodal).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

impl Content {
    /// The text parts concatenated, media parts ignored.
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// One item of an array content. Serializes in the seed-000 shape
/// (`{"type": "image", "image": "path"}`), which HF multimodal templates also read.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ContentPart {
    Text { text: String },
    Image { image: String },
    Video { video: String },
}

impl ContentPart {
    /// "text", "image" or "video": the key used in a JSON template's `content_types`.
    pub fn kind(&self) -> &'static str {
        match self {
            ContentPart::Text { .. } => "text",
            ContentPart::Image { .. } => "image",
            ContentPart::Video { .. } => "video",
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Null => Ok(Content::default()),
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(items) => items
                .iter()
                .map(part_from_value)
                .collect::<Result<Vec<_>, String>>()
                .map(Content::Parts)
                .map_err(D::Error::custom),
            other => Err(D::Error::custom(format!(
                "message content must be a string or an array of parts, got {other}"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for ContentPart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        part_from_value(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

// Hand-written so an unknown `type` is reported by name instead of serde's
// "did not match any variant".
fn part_from_value(v: &Value) -> Result<ContentPart, String> {
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or("content part needs a string field \"type\"")?;
    let field = |key: &str| -> Result<String, String> {
        v.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or(format!(
                "content part of type \"{kind}\" needs a string field \"{key}\""
            ))
    };
    // OpenAI puts the URL under {"image_url": {"url": ..}}; some clients send a bare string.
    let url_field = |key: &str| -> Result<String, String> {
        match v.get(key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Object(o)) => o
                .get("url")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or(format!("\"{key}\" needs a string field \"url\"")),
            _ => Err(format!(
                "content part of type \"{kind}\" needs a field \"{key}\" with a \"url\""
            )),
        }
    };
    match kind {
        "text" => Ok(ContentPart::Text {
            text: field("text")?,
        }),
        "image" => Ok(ContentPart::Image {
            image: field("image")?,
        }),
        "image_url" => Ok(ContentPart::Image {
            image: url_field("image_url")?,
        }),
        "video" => Ok(ContentPart::Video {
            video: field("video")?,
        }),
        "video_url" => Ok(ContentPart::Video {
            video: url_field("video_url")?,
        }),
        other => Err(format!(
            "unknown content type \"{other}\" (expected text, image, image_url, video or video_url)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_and_array_content() {
        let m: Message = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
        assert_eq!(m, Message::new("user", "hi"));
        let m: Message = serde_json::from_str(
            r#"{"role":"user","content":[
                {"type":"image","image":"a.jpeg"},
                {"type":"image_url","image_url":{"url":"http://x/b.png"}},
                {"type":"video","video":"c.mp4"},
                {"type":"text","text":"Compare."}]}"#,
        )
        .unwrap();
        assert_eq!(
            m.content,
            Content::Parts(vec![
                ContentPart::Image {
                    image: "a.jpeg".into()
                },
                ContentPart::Image {
                    image: "http://x/b.png".into()
                },
                ContentPart::Video {
                    video: "c.mp4".into()
                },
                ContentPart::Text {
                    text: "Compare.".into()
                },
            ])
        );
        assert_eq!(m.content.text(), "Compare.");
    }

    #[test]
    fn null_content_is_empty_text() {
        let m: Message = serde_json::from_str(r#"{"role":"assistant","content":null}"#).unwrap();
        assert_eq!(m.content, Content::Text(String::new()));
    }

    #[test]
    fn unknown_content_type_is_named() {
        let err = serde_json::from_str::<Message>(
            r#"{"role":"user","content":[{"type":"audio","audio":"a.wav"}]}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("unknown content type \"audio\""),
            "{err}"
        );
    }

    #[test]
    fn missing_field_is_named() {
        let err =
            serde_json::from_str::<Message>(r#"{"role":"user","content":[{"type":"image"}]}"#)
                .unwrap_err();
        assert!(err.to_string().contains("\"image\""), "{err}");
        assert!(serde_json::from_str::<Message>(r#"{"content":"x"}"#).is_err());
    }

    #[test]
    fn openai_tool_fields_round_trip() {
        let assistant = serde_json::json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]
        });
        let m: Message = serde_json::from_value(assistant).unwrap();
        assert_eq!(m.content, Content::Text(String::new()));
        let calls = m.tool_calls.as_deref().unwrap();
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(m.tool_call_id, None);

        let tool = serde_json::json!({"role": "tool", "tool_call_id": "call_1",
            "name": "get_weather", "content": "18C"});
        let m: Message = serde_json::from_value(tool.clone()).unwrap();
        assert_eq!(m.tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(m.name.as_deref(), Some("get_weather"));
        assert_eq!(serde_json::to_value(&m).unwrap(), tool);
    }

    #[test]
    fn absent_tool_fields_are_not_serialized() {
        assert_eq!(
            serde_json::to_value(Message::new("user", "hi")).unwrap(),
            serde_json::json!({"role": "user", "content": "hi"})
        );
    }

    #[test]
    fn serializes_in_seed_shape() {
        let c = Content::Parts(vec![ContentPart::Image {
            image: "a.png".into(),
        }]);
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!([{"type":"image","image":"a.png"}])
        );
    }
}
