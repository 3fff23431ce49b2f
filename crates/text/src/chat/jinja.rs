//! HuggingFace Jinja chat templates rendered with minijinja, configured like transformers'
//! `apply_chat_template` (trim_blocks, lstrip_blocks, Python string methods,
//! `raise_exception`, `strftime_now`).

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use super::message::{Content, ContentPart, Message};
use super::strftime::strftime_now;
use crate::error::{Result, TextError};

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled Jinja chat template plus the special tokens it may reference.
#[derive(Debug, Clone)]
pub struct JinjaChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

/// Carries a `raise_exception` message through minijinja so it can become
/// [`TextError::TemplateRaised`] rather than a generic template error.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl JinjaChatTemplate {
    /// Compiles the template now, so a broken template fails at model load, not per request.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<Self> {
        let source = source.into();
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks on; templates are written
        // for that whitespace behaviour.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_error(&e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| template_error(&e))?;
        Ok(Self {
            env,
            source,
            bos_token: bos_token.unwrap_or_default().to_owned(),
            eos_token: eos_token.unwrap_or_default().to_owned(),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders with the variables transformers passes: `messages`, `add_generation_prompt`,
    /// `bos_token`, `eos_token`, `enable_thinking`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        let messages: Value = messages.iter().map(message_value).collect();
        let ctx = Value::from_object(BTreeMap::from([
            ("messages".to_owned(), messages),
            (
                "add_generation_prompt".to_owned(),
                Value::from(add_generation_prompt),
            ),
            ("bos_token".to_owned(), Value::from(self.bos_token.clone())),
            ("eos_token".to_owned(), Value::from(self.eos_token.clone())),
            ("enable_thinking".to_owned(), Value::from(enable_thinking)),
        ]));
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&e))?;
        template.render(ctx).map_err(|e| template_error(&e))
    }
}

/// Content strings stay strings; part lists become HF-style dicts
/// (`{"type": "text", "text": ..}`, `{"type": "image", "image": ..}`).
fn message_value(m: &Message) -> Value {
    let content = match &m.content {
        Content::Text(t) => Value::from(t.clone()),
        Content::Parts(parts) => parts.iter().map(part_value).collect(),
    };
    Value::from_object(BTreeMap::from([
        ("role".to_owned(), Value::from(m.role.clone())),
        ("content".to_owned(), content),
    ]))
}

fn part_value(p: &ContentPart) -> Value {
    let (key, val) = match p {
        ContentPart::Text { text } => ("text", text),
        ContentPart::Image { image } => ("image", image),
        ContentPart::Video { video } => ("video", video),
    };
    Value::from_object(BTreeMap::from([
        ("type".to_owned(), Value::from(p.kind())),
        (key.to_owned(), Value::from(val.clone())),
    ]))
}

fn template_error(e: &Error) -> TextError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(raised) = err.downcast_ref::<Raised>() {
            return TextError::TemplateRaised(raised.0.clone());
        }
        source = err.source();
    }
    TextError::Template(e.to_string())
}
