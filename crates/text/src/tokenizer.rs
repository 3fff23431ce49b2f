//! A HuggingFace tokenizer plus the bits of tokenizer_config.json / generation_config.json
//! the server needs (special token strings, EOS ids, chat template).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::error::{Result, TextError};

mod truncation;

pub use truncation::{Truncate, TruncationSide};

/// Cheap to clone and `Send + Sync`: HTTP handlers and the scheduler thread share one.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    hf: tokenizers::Tokenizer,
    special_ids: HashSet<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos_token: Option<bool>,
    eos_token_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.inner.bos_token)
            .field("eos_token", &self.inner.eos_token)
            .field("eos_token_ids", &self.inner.eos_token_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` (required) and, when present, `tokenizer_config.json` and
    /// `generation_config.json` from a HuggingFace model directory.
    pub fn from_dir(model_dir: impl AsRef<Path>) -> Result<Self> {
        let dir = model_dir.as_ref();
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TextError::Io {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "file not found"),
            });
        }
        let mut hf = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| TextError::Tokenizer(format!("{}: {e}", path.display())))?;
        // sentence-transformers saves its padding and truncation into tokenizer.json
        // (all-MiniLM-L6-v2's pads every input to 128 tokens): the server pads nothing and
        // truncates only where a request asks ([`Tokenizer::encode_truncated`]).
        hf.with_padding(None);
        hf.with_truncation(None)
            .map_err(|e| TextError::Tokenizer(format!("{}: {e}", path.display())))?;
        let config = read_optional_json(&dir.join("tokenizer_config.json"))?;
        let generation = read_optional_json(&dir.join("generation_config.json"))?;
        Ok(Self::assemble(hf, config.as_ref(), generation.as_ref()))
    }

    fn assemble(
        hf: tokenizers::Tokenizer,
        config: Option<&Value>,
        generation: Option<&Value>,
    ) -> Self {
        let special_ids = hf
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        let token_field = |key: &str| config.and_then(|c| c.get(key)).and_then(token_string);
        let bos_token = token_field("bos_token");
        let eos_token = token_field("eos_token");
        let add_bos_token = config
            .and_then(|c| c.get("add_bos_token"))
            .and_then(Value::as_bool);
        let chat_template = config
            .and_then(|c| c.get("chat_template"))
            .and_then(pick_chat_template);

        let mut eos_token_ids: Vec<u32> = Vec::new();
        match generation.and_then(|g| g.get("eos_token_id")) {
            Some(Value::Array(ids)) => eos_token_ids.extend(ids.iter().filter_map(as_u32)),
            Some(v) => eos_token_ids.extend(as_u32(v)),
            None => {}
        }
        if let Some(id) = eos_token.as_deref().and_then(|t| hf.token_to_id(t))
            && !eos_token_ids.contains(&id)
        {
            eos_token_ids.push(id);
        }

        Self {
            inner: Arc::new(Inner {
                hf,
                special_ids,
                bos_token,
                eos_token,
                add_bos_token,
                eos_token_ids,
                chat_template,
            }),
        }
    }

    /// Encodes text. Added tokens written in the text (e.g. `<|im_start|>`) become their ids.
    /// `add_special_tokens` runs the post-processor (BOS etc.); chat-templated prompts already
    /// carry their special tokens and should pass `false`, as HF's apply_chat_template does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .hf
            .encode(text, add_special_tokens)
            .map_err(|e| TextError::Tokenizer(format!("encode: {e}")))?;
        let mut ids = enc.get_ids().to_vec();
        self.add_bos(&mut ids, add_special_tokens);
        Ok(ids)
    }

    /// transformers honours add_bos_token even when tokenizer.json's post-processor does not
    /// add BOS; mirror it without doubling a BOS that is already there.
    fn add_bos(&self, ids: &mut Vec<u32>, add_special_tokens: bool) {
        if add_special_tokens
            && self.inner.add_bos_token == Some(true)
            && let Some(bos) = self.bos_token_id()
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
    }

    /// Decodes ids to text; with `skip_special_tokens` the special added tokens are dropped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .hf
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::Tokenizer(format!("decode: {e}")))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.hf.get_vocab_size(true)
    }

    /// Whether `id` is an added token flagged `special`.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.special_ids.contains(&id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.hf.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.hf.id_to_token(id)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.inner.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.inner.eos_token.as_deref()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token().and_then(|t| self.token_to_id(t))
    }

    /// tokenizer_config.json's `add_bos_token`, when given.
    pub fn add_bos_token(&self) -> Option<bool> {
        self.inner.add_bos_token
    }

    /// Union of generation_config.json's `eos_token_id` (int or list) and the id of
    /// tokenizer_config.json's `eos_token`; generation_config order first.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.inner.eos_token_ids.clone()
    }

    /// The Jinja chat template of tokenizer_config.json, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }
}

pub(crate) fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| TextError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TextError::Json {
            path: path.to_path_buf(),
            source,
        })
}

/// Special tokens appear either as a plain string or as a serialized AddedToken
/// (`{"content": "<s>", ...}`).
pub(crate) fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` (take "default", else the first).
pub(crate) fn pick_chat_template(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            };
            named("default")
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        }
        _ => None,
    }
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
    }

    #[test]
    fn chat_template_list_prefers_default() {
        let v = serde_json::json!([
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"}
        ]);
        assert_eq!(pick_chat_template(&v).as_deref(), Some("D"));
        let v = serde_json::json!([{"name": "rag", "template": "R"}]);
        assert_eq!(pick_chat_template(&v).as_deref(), Some("R"));
        assert_eq!(
            pick_chat_template(&serde_json::json!("S")).as_deref(),
            Some("S")
        );
    }

    #[test]
    fn special_token_as_added_token_object() {
        let v = serde_json::json!({"content": "</s>", "lstrip": false});
        assert_eq!(token_string(&v).as_deref(), Some("</s>"));
    }
}
