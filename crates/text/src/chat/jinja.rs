//! HuggingFace Jinja chat templates rendered with minijinja, configured like transformers'
//! `apply_chat_template` (trim_blocks, lstrip_blocks, Python string methods,
//! `raise_exception`, `strftime_now`, Python's `tojson`, `tools`).

use std::collections::BTreeMap;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use super::message::{Content, ContentPart, Message};
use super::strftime::strftime_now;
use super::tojson::tojson;
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
        env.add_filter("tojson", tojson);
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

    /// True when the template reads a `tools` variable, i.e. renders tool definitions itself.
    pub fn supports_tools(&self) -> bool {
        mentions_identifier(&self.source, "tools")
    }

    /// [`Self::render_with_tools`] without tools.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt, enable_thinking)
    }

    /// Renders with the variables transformers passes: `messages`, `tools` (the OpenAI tool
    /// objects as given, or none), `add_generation_prompt`, `bos_token`, `eos_token`,
    /// `enable_thinking`.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        enable_thinking: bool,
    ) -> Result<String> {
        let kwargs = serde_json::Map::from_iter([(
            "enable_thinking".to_owned(),
            serde_json::Value::Bool(enable_thinking),
        )]);
        self.render_with_kwargs(messages, tools, add_generation_prompt, &kwargs)
    }

    /// Renders with the variables transformers passes (`messages`, `tools`,
    /// `add_generation_prompt`, `bos_token`, `eos_token`) and a request's
    /// `chat_template_kwargs` (`enable_thinking` and whatever else the template reads), which
    /// are defined only when given, as `apply_chat_template(**kwargs)` does. A kwarg cannot
    /// replace the five variables above.
    pub fn render_with_kwargs(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let messages: Value = messages.iter().map(message_value).collect();
        // transformers passes `tools=None` when there are none, so `tools is defined` holds.
        let tools = tools.map_or(Value::from(()), |t| t.iter().map(json_value).collect());
        let mut vars: BTreeMap<String, Value> = kwargs
            .iter()
            .map(|(k, v)| (k.clone(), json_value(v)))
            .collect();
        vars.extend([
            ("messages".to_owned(), messages),
            ("tools".to_owned(), tools),
            (
                "add_generation_prompt".to_owned(),
                Value::from(add_generation_prompt),
            ),
            ("bos_token".to_owned(), Value::from(self.bos_token.clone())),
            ("eos_token".to_owned(), Value::from(self.eos_token.clone())),
        ]);
        let ctx = Value::from_object(vars);
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&e))?;
        template.render(ctx).map_err(|e| template_error(&e))
    }
}

/// Content strings stay strings; part lists become HF-style dicts
/// (`{"type": "text", "text": ..}`, `{"type": "image", "image": ..}`). Tool fields are
/// present only when the message has them, since templates test them with `is defined`.
fn message_value(m: &Message) -> Value {
    let content = match &m.content {
        Content::Text(t) => Value::from(t.clone()),
        Content::Parts(parts) => parts.iter().map(part_value).collect(),
    };
    let mut map = BTreeMap::from([
        ("role".to_owned(), Value::from(m.role.clone())),
        ("content".to_owned(), content),
    ]);
    if let Some(calls) = &m.tool_calls {
        let calls = calls.iter().map(|c| json_value(&decoded_arguments(c)));
        map.insert("tool_calls".to_owned(), calls.collect());
    }
    if let Some(id) = &m.tool_call_id {
        map.insert("tool_call_id".to_owned(), Value::from(id.clone()));
    }
    if let Some(name) = &m.name {
        map.insert("name".to_owned(), Value::from(name.clone()));
    }
    if let Some(r) = &m.reasoning_content {
        map.insert("reasoning_content".to_owned(), Value::from(r.clone()));
        map.insert("thinking".to_owned(), Value::from(r.clone()));
    }
    Value::from_object(map)
}

/// OpenAI sends `function.arguments` as a JSON string; HF templates expect a mapping (they
/// iterate it or pipe it to `tojson`), so a string holding a JSON object is decoded.
fn decoded_arguments(call: &serde_json::Value) -> serde_json::Value {
    let mut call = call.clone();
    if let Some(args) = call.pointer_mut("/function/arguments")
        && let Some(text) = args.as_str()
        && let Ok(decoded @ serde_json::Value::Object(_)) = serde_json::from_str(text)
    {
        *args = decoded;
    }
    call
}

/// A JSON value as a template value (minijinja's `serde` feature is not enabled).
pub(super) fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.clone()),
        J::Array(items) => items.iter().map(json_value).collect(),
        // In the request's order (minijinja's `preserve_order`), as Python's dicts keep it:
        // a tool's parameters are listed to the model as the caller wrote them.
        J::Object(map) => Value::from_object(
            map.iter()
                .map(|(k, v)| (Value::from(k.clone()), json_value(v)))
                .collect::<indexmap::IndexMap<Value, Value>>(),
        ),
    }
}

/// `name` occurs in `source` as a whole identifier (not as part of `tools_in_user_message`).
fn mentions_identifier(source: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    source.match_indices(name).any(|(at, _)| {
        let before = source[..at].chars().next_back();
        let after = source[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
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
