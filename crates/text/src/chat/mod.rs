//! Chat templates: the JSON format of seed 003 and HuggingFace Jinja templates.

mod derive;
mod jinja;
mod json_template;
mod message;
mod strftime;
mod tojson;

use std::path::Path;

pub use derive::derive_json_template;
pub use jinja::JinjaChatTemplate;
pub use json_template::{
    ContentTypeFormat, JsonChatTemplate, RoleFormat, render_raw as render_raw_text,
};
pub use message::{Content, ContentPart, Message};
pub use strftime::strftime;

use crate::error::{Result, TextError};

/// File name TensorRT Edge-LLM's export writes (next to the LLM, i.e. in `<out>/llm/`).
pub const JSON_TEMPLATE_FILE: &str = "processed_chat_template.json";

/// The chat template of a model, whichever format it came in.
#[derive(Debug, Clone)]
pub enum ChatTemplate {
    Json(JsonChatTemplate),
    Jinja(JinjaChatTemplate),
}

impl ChatTemplate {
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt, enable_thinking)
    }

    /// Renders with OpenAI tool definitions (`{"type": "function", "function": {..}}`). Only
    /// a template for which [`Self::supports_tools`] holds shows them; for the others, rewrite
    /// the conversation first with [`crate::tools::prepare_messages`].
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        match self {
            ChatTemplate::Json(t) => t.render(messages, add_generation_prompt, enable_thinking),
            ChatTemplate::Jinja(t) => {
                t.render_with_tools(messages, tools, add_generation_prompt, enable_thinking)
            }
        }
    }

    /// [`Self::render_with_tools`] with a request's `chat_template_kwargs`: a Jinja template
    /// sees each of them as a variable (see [`JinjaChatTemplate::render_with_kwargs`]); a
    /// JSON template (seed 003) reads `enable_thinking` (a boolean, false when absent) to pick
    /// `generation_prompt_thinking`, as `lmi infer` does.
    pub fn render_with_kwargs(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        match self {
            ChatTemplate::Json(t) => {
                let thinking = kwargs
                    .get("enable_thinking")
                    .and_then(serde_json::Value::as_bool)
                    .unwrap_or(false);
                t.render(messages, add_generation_prompt, thinking)
            }
            ChatTemplate::Jinja(t) => {
                t.render_with_kwargs(messages, tools, add_generation_prompt, kwargs)
            }
        }
    }

    /// The reasoning format the template implies (see
    /// [`crate::ReasoningFormat::detect`]): a JSON template with a thinking prompt, or a Jinja
    /// template that writes `</think>`.
    pub fn reasoning_format(&self) -> Option<crate::ReasoningFormat> {
        match self {
            ChatTemplate::Json(t) => {
                let prompts = [
                    Some(&t.generation_prompt),
                    t.generation_prompt_thinking.as_ref(),
                ];
                prompts
                    .into_iter()
                    .flatten()
                    .find_map(|p| crate::ReasoningFormat::detect(p))
            }
            ChatTemplate::Jinja(t) => crate::ReasoningFormat::detect(t.source()),
        }
    }

    /// Whether the template renders tool definitions itself (a Jinja template reading
    /// `tools`). The JSON format of seed 003 has no place for them.
    pub fn supports_tools(&self) -> bool {
        match self {
            ChatTemplate::Json(_) => false,
            ChatTemplate::Jinja(t) => t.supports_tools(),
        }
    }

    /// The Jinja source; `None` for a JSON template.
    pub fn jinja_source(&self) -> Option<&str> {
        match self {
            ChatTemplate::Json(_) => None,
            ChatTemplate::Jinja(t) => Some(t.source()),
        }
    }

    /// `apply_chat_template = false`. A JSON template still supplies media placeholders;
    /// a Jinja template has none, so media parts are an error there.
    pub fn render_raw(&self, messages: &[Message]) -> Result<String> {
        match self {
            ChatTemplate::Json(t) => t.render_raw(messages),
            ChatTemplate::Jinja(_) => render_raw_text(messages),
        }
    }

    /// Looks in a model directory for, in order: `processed_chat_template.json` (also under
    /// `llm/`), tokenizer_config.json's `chat_template`, `chat_template.jinja`, and
    /// `chat_template.json` (where HF processors keep it). `Ok(None)` when there is none.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Option<Self>> {
        let dir = dir.as_ref();
        for path in [
            dir.join(JSON_TEMPLATE_FILE),
            dir.join("llm").join(JSON_TEMPLATE_FILE),
        ] {
            if path.is_file() {
                return JsonChatTemplate::from_file(&path).map(|t| Some(ChatTemplate::Json(t)));
            }
        }
        let config = crate::tokenizer::read_optional_json(&dir.join("tokenizer_config.json"))?;
        let token = |key: &str| {
            config
                .as_ref()
                .and_then(|c| c.get(key))
                .and_then(crate::tokenizer::token_string)
        };
        let (bos, eos) = (token("bos_token"), token("eos_token"));
        let mut source = config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .and_then(crate::tokenizer::pick_chat_template);
        if source.is_none() {
            let path = dir.join("chat_template.jinja");
            if path.is_file() {
                source = Some(
                    std::fs::read_to_string(&path).map_err(|source| TextError::Io {
                        path: path.clone(),
                        source,
                    })?,
                );
            }
        }
        if source.is_none() {
            source = crate::tokenizer::read_optional_json(&dir.join("chat_template.json"))?
                .as_ref()
                .and_then(|c| c.get("chat_template"))
                .and_then(crate::tokenizer::pick_chat_template);
        }
        source
            .map(|s| JinjaChatTemplate::new(s, bos.as_deref(), eos.as_deref()))
            .transpose()
            .map(|t| t.map(ChatTemplate::Jinja))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kwargs(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn template_kwargs_reach_jinja_and_json_templates() {
        let src = "{% if enable_thinking is defined %}[{{ enable_thinking }}]{% endif %}\
                   {{ note | default('') }}{{ messages | length }}";
        let t = ChatTemplate::Jinja(JinjaChatTemplate::new(src, None, None).unwrap());
        let msgs: Vec<Message> =
            serde_json::from_value(serde_json::json!([{"role": "user", "content": "hi"}])).unwrap();
        let render = |k| t.render_with_kwargs(&msgs, None, true, &kwargs(k)).unwrap();
        // Undefined unless sent, as transformers does.
        assert_eq!(render(serde_json::json!({})), "1");
        assert_eq!(
            render(serde_json::json!({"enable_thinking": false, "note": "n"})),
            "[False]n1"
        );
        // A kwarg cannot replace the conversation.
        assert_eq!(render(serde_json::json!({"messages": []})), "1");
        assert_eq!(t.reasoning_format(), None);

        let json = ChatTemplate::Json(JsonChatTemplate {
            roles: [("user".to_string(), RoleFormat::default())].into(),
            generation_prompt: "A:<think>\n\n</think>\n\n".into(),
            generation_prompt_thinking: Some("A:".into()),
            ..Default::default()
        });
        let render = |k| {
            json.render_with_kwargs(&msgs, None, true, &kwargs(k))
                .unwrap()
        };
        assert_eq!(render(serde_json::json!({})), "hiA:<think>\n\n</think>\n\n");
        assert_eq!(render(serde_json::json!({"enable_thinking": true})), "hiA:");
        assert_eq!(
            json.reasoning_format(),
            Some(crate::ReasoningFormat::ThinkTags)
        );
    }

    #[test]
    fn templates_are_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::ChatTemplate>();
    }
}
