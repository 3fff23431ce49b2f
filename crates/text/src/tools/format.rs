//! Which convention the model uses to write tool calls.

use std::fmt;
use std::str::FromStr;

use crate::chat::ChatTemplate;

/// How a model writes tool calls in its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallFormat {
    /// Hermes / Qwen 2.5 / Qwen 3: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`,
    /// one block per call.
    Hermes,
    /// SmolLM2's convention: `<tool_call>[{"name": .., "arguments": {..}}, ..]</tool_call>`.
    SmolLm,
    /// Llama 3.1+ JSON tool calls: optional `<|python_tag|>`, then
    /// `{"name": .., "parameters": {..}}`, several separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]` (also the newer
    /// `[TOOL_CALLS]name[ARGS]{..}`).
    Mistral,
    /// gpt-oss's harmony: a `commentary` message to `functions.NAME` whose body is the
    /// arguments, ended by `<|call|>` (see [`crate::harmony`]).
    Harmony,
}

impl ToolCallFormat {
    pub const ALL: [ToolCallFormat; 5] = [
        ToolCallFormat::Hermes,
        ToolCallFormat::SmolLm,
        ToolCallFormat::Llama3Json,
        ToolCallFormat::Mistral,
        ToolCallFormat::Harmony,
    ];

    /// vLLM's `--tool-call-parser` names (`hermes`, `llama3_json`, `mistral`, `openai` for
    /// gpt-oss, also read as `harmony`) plus `smollm`.
    pub fn from_name(name: &str) -> Result<Self, String> {
        if name.trim() == "harmony" {
            return Ok(ToolCallFormat::Harmony);
        }
        Self::ALL
            .into_iter()
            .find(|f| f.name() == name.trim())
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown tool call parser \"{name}\" (expected one of: {})",
                    names.join(", ")
                )
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::SmolLm => "smollm",
            ToolCallFormat::Llama3Json => "llama3_json",
            ToolCallFormat::Mistral => "mistral",
            ToolCallFormat::Harmony => "openai",
        }
    }

    /// Guesses the format from what the chat template writes for tool calls. A template
    /// that shows no tool syntax (SmolLM2's plain ChatML, a JSON template, none) gets
    /// [`ToolCallFormat::SmolLm`], the format our own tool prompt teaches.
    pub fn detect(template: Option<&ChatTemplate>) -> Self {
        let Some(source) = template.and_then(ChatTemplate::jinja_source) else {
            return ToolCallFormat::SmolLm;
        };
        if source.contains(crate::harmony::CHANNEL) {
            ToolCallFormat::Harmony
        } else if source.contains("<tool_call>") {
            ToolCallFormat::Hermes
        } else if source.contains("[TOOL_CALLS]") {
            ToolCallFormat::Mistral
        } else if source.contains("<|python_tag|>") || source.contains("\"parameters\"") {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::SmolLm
        }
    }

    /// The texts that may open a call (harmony: a message's start, or its channel when the
    /// role was in the prompt).
    pub(crate) fn markers(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Hermes | ToolCallFormat::SmolLm => &["<tool_call>"],
            ToolCallFormat::Llama3Json => &["<|python_tag|>"],
            ToolCallFormat::Mistral => &["[TOOL_CALLS]"],
            ToolCallFormat::Harmony => &[crate::harmony::START, crate::harmony::CHANNEL],
        }
    }
}

impl FromStr for ToolCallFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::from_name(s)
    }
}

impl fmt::Display for ToolCallFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{JinjaChatTemplate, JsonChatTemplate};

    fn jinja(src: &str) -> ChatTemplate {
        ChatTemplate::Jinja(JinjaChatTemplate::new(src, None, None).unwrap())
    }

    #[test]
    fn names_round_trip_and_unknown_lists_choices() {
        for f in ToolCallFormat::ALL {
            assert_eq!(ToolCallFormat::from_name(f.name()), Ok(f));
        }
        let err = ToolCallFormat::from_name("pythonic").unwrap_err();
        assert!(
            err.contains("\"pythonic\"")
                && err.contains("hermes, smollm, llama3_json, mistral, openai"),
            "{err}"
        );
    }

    #[test]
    fn detects_from_template_source() {
        let hermes = "{% for m in messages %}{% if m.tool_calls %}<tool_call>\n{{ m.tool_calls[0] | tojson }}\n</tool_call>{% endif %}{% endfor %}";
        assert_eq!(
            ToolCallFormat::detect(Some(&jinja(hermes))),
            ToolCallFormat::Hermes
        );
        let mistral = "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}{% endif %}{% endfor %}";
        assert_eq!(
            ToolCallFormat::detect(Some(&jinja(mistral))),
            ToolCallFormat::Mistral
        );
        let llama = r#"{% if tools %}Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.{% endif %}"#;
        assert_eq!(
            ToolCallFormat::detect(Some(&jinja(llama))),
            ToolCallFormat::Llama3Json
        );
        let python_tag = "{% for m in messages %}<|python_tag|>{{ m.content }}{% endfor %}";
        assert_eq!(
            ToolCallFormat::detect(Some(&jinja(python_tag))),
            ToolCallFormat::Llama3Json
        );
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
        assert_eq!(
            ToolCallFormat::detect(Some(&jinja(chatml))),
            ToolCallFormat::SmolLm
        );
        let json = ChatTemplate::Json(JsonChatTemplate::default());
        assert_eq!(ToolCallFormat::detect(Some(&json)), ToolCallFormat::SmolLm);
        assert_eq!(ToolCallFormat::detect(None), ToolCallFormat::SmolLm);
    }
}
