//! Prompts for `lmi infer`: the model's JSON chat template (seed 003), derived from its Jinja
//! template when `processed_chat_template.json` is absent, and the token count of the system
//! part that `save_system_prompt_kv_cache` pins.

use std::path::Path;

use anyhow::Context;
use lmi_text::{ChatTemplate, JsonChatTemplate, Message, Tokenizer, derive_json_template};

use crate::reasoning::ReplyReasoning;

/// Where the template came from, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateSource {
    /// `processed_chat_template.json` in the model directory.
    JsonFile,
    /// Derived at run time from the Jinja template (as Edge-LLM's export step does).
    DerivedFromJinja,
    /// The Jinja template itself (derivation failed).
    Jinja,
    /// The model has no chat template: messages are concatenated raw.
    None,
}

/// How `lmi infer` turns a request's messages into prompt text.
pub struct PromptBuilder {
    template: Option<ChatTemplate>,
    pub source: TemplateSource,
    apply_chat_template: bool,
    enable_thinking: bool,
}

/// One rendered request.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Leading prompt tokens that are the system prompt (0 when there is none).
    pub system_tokens: usize,
    /// How the reply is read for reasoning: templated prompts of a model whose template
    /// reasons (`<think>` tags, gpt-oss's harmony channels).
    pub reasoning: Option<ReplyReasoning>,
}

/// The model's chat template as seed 003 wants it: `processed_chat_template.json` when the
/// directory has one, else derived from the Jinja template; `warn` receives why a derivation
/// failed (the Jinja template is then used as is).
pub fn load_template(
    dir: &Path,
    tokenizer: &Tokenizer,
    warn: &mut dyn FnMut(String),
) -> anyhow::Result<(Option<ChatTemplate>, TemplateSource)> {
    let template = ChatTemplate::from_model_dir(dir)
        .with_context(|| format!("loading the chat template of {}", dir.display()))?;
    Ok(match template {
        None => (None, TemplateSource::None),
        Some(t @ ChatTemplate::Json(_)) => (Some(t), TemplateSource::JsonFile),
        Some(ChatTemplate::Jinja(j)) => {
            match derive_json_template(j.source(), tokenizer.bos_token(), tokenizer.eos_token()) {
                Ok(json) => (
                    Some(ChatTemplate::Json(json)),
                    TemplateSource::DerivedFromJinja,
                ),
                Err(e) => {
                    warn(format!(
                        "cannot derive processed_chat_template.json from the model's Jinja template ({e}); rendering the Jinja template directly"
                    ));
                    (Some(ChatTemplate::Jinja(j)), TemplateSource::Jinja)
                }
            }
        }
    })
}

impl PromptBuilder {
    pub fn new(
        template: Option<ChatTemplate>,
        source: TemplateSource,
        apply_chat_template: bool,
        enable_thinking: bool,
    ) -> Self {
        PromptBuilder {
            template,
            source,
            apply_chat_template,
            enable_thinking,
        }
    }

    /// Whether templated rendering falls back to raw text because the model has no template.
    pub fn lacks_template(&self) -> bool {
        self.apply_chat_template && self.template.is_none()
    }

    /// The prompt text of a conversation.
    pub fn render(&self, messages: &[Message]) -> anyhow::Result<String> {
        let text = match (&self.template, self.apply_chat_template) {
            (Some(t), true) => t.render(messages, true, self.enable_thinking)?,
            (Some(t), false) => t.render_raw(messages)?,
            (None, _) => lmi_text::chat::render_raw_text(messages)?,
        };
        Ok(text)
    }

    /// The text of the system part alone: the leading system messages, or the template's
    /// default system prompt when there are none. None when there is no system part or no
    /// template is applied.
    pub fn render_system(&self, messages: &[Message]) -> anyhow::Result<Option<String>> {
        let Some(t) = self.template.as_ref().filter(|_| self.apply_chat_template) else {
            return Ok(None);
        };
        let leading = messages.iter().take_while(|m| m.role == "system").count();
        if leading > 0 {
            return Ok(Some(t.render(
                &messages[..leading],
                false,
                self.enable_thinking,
            )?));
        }
        let default = match t {
            ChatTemplate::Json(JsonChatTemplate {
                default_system_prompt: Some(d),
                ..
            }) if !d.is_empty() => d.clone(),
            _ => return Ok(None),
        };
        let text = t.render(
            &[Message::new("system", default)],
            false,
            self.enable_thinking,
        )?;
        Ok(Some(text))
    }

    /// Renders and tokenizes a conversation. Templated text already holds its special tokens
    /// (HF's apply_chat_template tokenizes with add_special_tokens=False); raw text gets the
    /// tokenizer's own (e.g. a BOS).
    #[cfg(test)]
    pub fn build(&self, tokenizer: &Tokenizer, messages: &[Message]) -> anyhow::Result<Prompt> {
        self.build_with(tokenizer, messages, |t| Ok(t.to_string()))
    }

    /// [`Self::build`] with the rendered text rewritten before it is tokenized (Gemma 4's
    /// videos, written frame by frame).
    pub fn build_with(
        &self,
        tokenizer: &Tokenizer,
        messages: &[Message],
        rewrite: impl Fn(&str) -> anyhow::Result<String>,
    ) -> anyhow::Result<Prompt> {
        let templated = self.apply_chat_template && self.template.is_some();
        let text = self.render(messages)?;
        let ids = tokenizer.encode(&rewrite(&text)?, !templated)?;
        let reasoning = self
            .template
            .as_ref()
            .filter(|_| templated)
            .and_then(ChatTemplate::reasoning_format)
            .map(|format| ReplyReasoning {
                format,
                starts_inside: format.prompt_opens(&text),
            });
        let system_tokens = match self.render_system(messages)? {
            Some(sys) => {
                let sys_ids = tokenizer.encode(&sys, false)?;
                // Only the tokens the whole prompt shares with the system part alone: a merge
                // across the boundary would otherwise pin a block the prompt does not have.
                sys_ids.iter().zip(&ids).take_while(|(a, b)| a == b).count()
            }
            None => 0,
        };
        Ok(Prompt {
            ids,
            system_tokens,
            reasoning,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_model() -> (std::path::PathBuf, Tokenizer) {
        let dir = lmi_store::resolve_model(None, false).expect("the default model");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        (dir, tok)
    }

    fn builder(dir: &Path, tok: &Tokenizer, apply: bool) -> PromptBuilder {
        let (t, source) = load_template(dir, tok, &mut |w| panic!("{w}")).unwrap();
        assert_eq!(source, TemplateSource::DerivedFromJinja);
        PromptBuilder::new(t, source, apply, false)
    }

    #[test]
    fn system_tokens_cover_the_system_block() {
        let (dir, tok) = default_model();
        let b = builder(&dir, &tok, true);
        let msgs = [
            Message::new("system", "You are a pirate."),
            Message::new("user", "Hello"),
        ];
        let p = b.build(&tok, &msgs).unwrap();
        let sys = tok
            .encode("<|im_start|>system\nYou are a pirate.<|im_end|>\n", false)
            .unwrap();
        assert_eq!(p.system_tokens, sys.len());
        assert_eq!(&p.ids[..sys.len()], &sys[..]);

        // No system message: the template's default system prompt is the system part.
        let p = b.build(&tok, &msgs[1..]).unwrap();
        let sys = tok
            .encode(
                "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
                false,
            )
            .unwrap();
        assert_eq!(p.system_tokens, sys.len());

        // Raw concatenation has no system part, and no template tokens.
        let raw = builder(&dir, &tok, false);
        let p = raw.build(&tok, &msgs).unwrap();
        assert_eq!(p.system_tokens, 0);
        assert_eq!(p.ids, tok.encode("You are a pirate.Hello", true).unwrap());
    }
}
