//! The batch input file of TensorRT Edge-LLM (seed 000), read and validated in full before
//! anything runs. Every error names the request index (0-based, as in `requests[i]`), the
//! message index where there is one, the field, and what is wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lmi_text::{Content, ContentPart, Message};
use serde_json::{Map, Value};

/// Top-level keys the seed defines; others are ignored with a warning.
const KNOWN_KEYS: &[&str] = &[
    "batch_size",
    "temperature",
    "top_p",
    "top_k",
    "max_generate_length",
    "apply_chat_template",
    "enable_thinking",
    "available_lora_weights",
    "requests",
];

const ROLES: &[&str] = &["system", "user", "assistant"];

/// The whole input file, with the seed's defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct InferInput {
    pub batch_size: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub max_generate_length: usize,
    pub apply_chat_template: bool,
    pub enable_thinking: bool,
    /// Adapter name → path, sorted by name (adapter ids are 1.. in this order).
    pub available_lora_weights: BTreeMap<String, PathBuf>,
    pub requests: Vec<InferRequest>,
    /// Things ignored on the way (unknown top-level keys), for stderr.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    pub messages: Vec<Message>,
    pub lora_name: Option<String>,
    pub save_system_prompt_kv_cache: bool,
}

/// A media item of some request, for the model-capability check.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaItem {
    pub request: usize,
    pub message: usize,
    pub item: usize,
    /// "image" or "video".
    pub kind: &'static str,
    pub path: String,
}

impl InferInput {
    /// Reads and validates `path`. Media paths are checked relative to the working directory
    /// (the seed's rule), as are LoRA paths.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the input file {}: {e}", path.display()))?;
        Self::from_json(&text)
            .map_err(|e| anyhow::anyhow!("invalid input file {}: {e}", path.display()))
    }

    pub fn from_json(text: &str) -> Result<Self, String> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| format!("the file is not valid JSON: {e}"))?;
        let Value::Object(root) = root else {
            return Err(format!(
                "the top level must be a JSON object with a \"requests\" array, got {}",
                kind_of(&root)
            ));
        };
        let warnings = root
            .keys()
            .filter(|k| !KNOWN_KEYS.contains(&k.as_str()))
            .map(|k| format!("ignoring unknown top-level field \"{k}\""))
            .collect();

        let batch_size = integer(&root, "batch_size", 1)?;
        if batch_size < 1 {
            return Err(format!(
                "field \"batch_size\" must be at least 1, got {batch_size}"
            ));
        }
        let temperature = number(&root, "temperature", 1.0)?;
        if temperature < 0.0 {
            return Err(format!(
                "field \"temperature\" must be >= 0 (0 = greedy), got {temperature}"
            ));
        }
        let top_p = number(&root, "top_p", 0.8)?;
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(format!("field \"top_p\" must be in (0, 1], got {top_p}"));
        }
        let top_k = integer(&root, "top_k", 50)?;
        let top_k =
            u32::try_from(top_k).map_err(|_| format!("field \"top_k\" is too large: {top_k}"))?;
        let max_generate_length = integer(&root, "max_generate_length", 256)?;
        if max_generate_length < 1 {
            return Err(format!(
                "field \"max_generate_length\" must be at least 1, got {max_generate_length}"
            ));
        }
        let apply_chat_template = boolean(&root, "apply_chat_template", true, "")?;
        let enable_thinking = boolean(&root, "enable_thinking", false, "")?;
        let available_lora_weights = lora_weights(&root)?;

        let requests = match root.get("requests") {
            None => {
                return Err(
                    "missing required field \"requests\" (an array of request objects)".into(),
                );
            }
            Some(Value::Array(items)) => items,
            Some(other) => {
                return Err(format!(
                    "field \"requests\" must be an array of request objects, got {}",
                    kind_of(other)
                ));
            }
        };
        if requests.is_empty() {
            return Err("field \"requests\" is empty: give at least one request".into());
        }
        let requests = requests
            .iter()
            .enumerate()
            .map(|(i, r)| request(i, r, &available_lora_weights))
            .collect::<Result<Vec<_>, _>>()?;

        Ok(InferInput {
            batch_size: batch_size as usize,
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            max_generate_length: max_generate_length as usize,
            apply_chat_template,
            enable_thinking,
            available_lora_weights,
            requests,
            warnings,
        })
    }

    /// Every image and video item, in request order.
    pub fn media_items(&self) -> Vec<MediaItem> {
        let mut out = Vec::new();
        for (r, req) in self.requests.iter().enumerate() {
            for (m, msg) in req.messages.iter().enumerate() {
                let Content::Parts(parts) = &msg.content else {
                    continue;
                };
                for (k, part) in parts.iter().enumerate() {
                    let (kind, path) = match part {
                        ContentPart::Image { image } => ("image", image),
                        ContentPart::Video { video } => ("video", video),
                        ContentPart::Text { .. } => continue,
                    };
                    out.push(MediaItem {
                        request: r,
                        message: m,
                        item: k,
                        kind,
                        path: path.clone(),
                    });
                }
            }
        }
        out
    }

    /// Checks that every media file exists and that images are in a known image format.
    pub fn check_media_files(&self) -> Result<(), String> {
        for m in self.media_items() {
            let at = format!(
                "request {}, message {}, content item {}",
                m.request, m.message, m.item
            );
            let path = Path::new(&m.path);
            let bytes = std::fs::read(path).map_err(|e| {
                format!("{at}: cannot read the {} file \"{}\": {e}", m.kind, m.path)
            })?;
            if m.kind == "image" && image_format(&bytes).is_none() {
                return Err(format!(
                    "{at}: \"{}\" is not a JPEG, PNG, GIF, WebP or BMP image",
                    m.path
                ));
            }
        }
        Ok(())
    }

    /// Checks that every LoRA path exists (file or PEFT directory).
    pub fn check_lora_paths(&self) -> Result<(), String> {
        for (name, path) in &self.available_lora_weights {
            if !path.exists() {
                return Err(format!(
                    "field \"available_lora_weights\", adapter \"{name}\": {} does not exist",
                    path.display()
                ));
            }
        }
        Ok(())
    }
}

fn request(
    i: usize,
    value: &Value,
    lora: &BTreeMap<String, PathBuf>,
) -> Result<InferRequest, String> {
    let Value::Object(obj) = value else {
        return Err(format!(
            "request {i}: must be an object with a \"messages\" array, got {}",
            kind_of(value)
        ));
    };
    let messages = match obj.get("messages") {
        None => return Err(format!("request {i}: missing required field \"messages\"")),
        Some(Value::Array(m)) => m,
        Some(other) => {
            return Err(format!(
                "request {i}: field \"messages\" must be an array of messages, got {}",
                kind_of(other)
            ));
        }
    };
    if messages.is_empty() {
        return Err(format!("request {i}: field \"messages\" is empty"));
    }
    let messages = messages
        .iter()
        .enumerate()
        .map(|(j, m)| message(i, j, m))
        .collect::<Result<Vec<_>, _>>()?;
    let lora_name = match obj.get("lora_name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => {
            if !lora.contains_key(name) {
                let known: Vec<&str> = lora.keys().map(String::as_str).collect();
                return Err(format!(
                    "request {i}: field \"lora_name\": \"{name}\" is not defined in available_lora_weights (defined: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ));
            }
            Some(name.clone())
        }
        Some(other) => {
            return Err(format!(
                "request {i}: field \"lora_name\" must be a string, got {}",
                kind_of(other)
            ));
        }
    };
    let save_system_prompt_kv_cache = boolean(
        obj,
        "save_system_prompt_kv_cache",
        false,
        &format!("request {i}: "),
    )?;
    Ok(InferRequest {
        messages,
        lora_name,
        save_system_prompt_kv_cache,
    })
}

fn message(i: usize, j: usize, value: &Value) -> Result<Message, String> {
    let at = format!("request {i}, message {j}");
    let Value::Object(obj) = value else {
        return Err(format!(
            "{at}: must be an object with \"role\" and \"content\", got {}",
            kind_of(value)
        ));
    };
    let role = match obj.get("role") {
        None => return Err(format!("{at}: missing required field \"role\"")),
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.clone(),
        Some(Value::String(r)) => {
            return Err(format!(
                "{at}: field \"role\" must be \"system\", \"user\" or \"assistant\", got \"{r}\""
            ));
        }
        Some(other) => {
            return Err(format!(
                "{at}: field \"role\" must be a string, got {}",
                kind_of(other)
            ));
        }
    };
    let content = match obj.get("content") {
        None => return Err(format!("{at}: missing required field \"content\"")),
        Some(v @ (Value::String(_) | Value::Array(_))) => {
            if let Value::Array(items) = v {
                for (k, item) in items.iter().enumerate() {
                    if !item.is_object() {
                        return Err(format!(
                            "{at}: field \"content\", item {k}: must be an object with a \"type\", got {}",
                            kind_of(item)
                        ));
                    }
                }
            }
            serde_json::from_value::<Content>(v.clone())
                .map_err(|e| format!("{at}: field \"content\": {e}"))?
        }
        Some(other) => {
            return Err(format!(
                "{at}: field \"content\" must be a string or an array of content items, got {}",
                kind_of(other)
            ));
        }
    };
    Ok(Message::with_content(role, content))
}

fn lora_weights(root: &Map<String, Value>) -> Result<BTreeMap<String, PathBuf>, String> {
    match root.get("available_lora_weights") {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(name, v)| match v {
                Value::String(p) if !p.is_empty() => Ok((name.clone(), PathBuf::from(p))),
                other => Err(format!(
                    "field \"available_lora_weights\", adapter \"{name}\": the path must be a non-empty string, got {}",
                    kind_of(other)
                )),
            })
            .collect(),
        Some(other) => Err(format!(
            "field \"available_lora_weights\" must be an object of adapter name -> path, got {}",
            kind_of(other)
        )),
    }
}

fn integer(obj: &Map<String, Value>, key: &str, default: u64) -> Result<u64, String> {
    match obj.get(key) {
        None => Ok(default),
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("field \"{key}\" must be a non-negative integer, got {n}")),
        Some(other) => Err(format!(
            "field \"{key}\" must be an integer, got {}",
            kind_of(other)
        )),
    }
}

fn number(obj: &Map<String, Value>, key: &str, default: f64) -> Result<f64, String> {
    match obj.get(key) {
        None => Ok(default),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("field \"{key}\" must be a finite number, got {n}")),
        Some(other) => Err(format!(
            "field \"{key}\" must be a number, got {}",
            kind_of(other)
        )),
    }
}

fn boolean(obj: &Map<String, Value>, key: &str, default: bool, at: &str) -> Result<bool, String> {
    match obj.get(key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "{at}field \"{key}\" must be true or false, got {}",
            kind_of(other)
        )),
    }
}

fn kind_of(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// The image format of a file, by its magic bytes.
pub fn image_format(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("jpeg")
    } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("png")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("webp")
    } else if bytes.starts_with(b"BM") {
        Some("bmp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        InferInput::from_json(json).unwrap_err()
    }

    #[test]
    fn defaults_are_the_seeds() {
        let i = InferInput::from_json(
            r#"{"requests":[{"messages":[{"role":"user","content":"hi"}]}]}"#,
        )
        .unwrap();
        assert_eq!(i.batch_size, 1);
        assert_eq!(i.temperature, 1.0);
        assert_eq!(i.top_p, 0.8);
        assert_eq!(i.top_k, 50);
        assert_eq!(i.max_generate_length, 256);
        assert!(i.apply_chat_template);
        assert!(!i.enable_thinking);
        assert!(i.available_lora_weights.is_empty());
        assert_eq!(i.requests[0].lora_name, None);
        assert!(!i.requests[0].save_system_prompt_kv_cache);
        assert!(i.warnings.is_empty());
    }

    #[test]
    fn unknown_top_level_keys_warn() {
        let i = InferInput::from_json(
            r#"{"beam_width":2,"requests":[{"messages":[{"role":"user","content":"hi"}]}]}"#,
        )
        .unwrap();
        assert_eq!(i.warnings.len(), 1);
        assert!(i.warnings[0].contains("beam_width"));
    }

    #[test]
    fn errors_name_request_field_and_problem() {
        let e = err(
            r#"{"requests":[{"messages":[{"role":"user","content":"a"}]},{"messages":[{"content":"b"}]}]}"#,
        );
        assert!(
            e.contains("request 1, message 0") && e.contains("\"role\""),
            "{e}"
        );
        let e = err(r#"{"requests":[{"messages":[{"role":"user"}]}]}"#);
        assert!(
            e.contains("request 0, message 0") && e.contains("\"content\""),
            "{e}"
        );
        let e = err(r#"{"requests":[{"lora_name":"x"}]}"#);
        assert!(e.contains("request 0") && e.contains("\"messages\""), "{e}");
        let e = err(r#"{"requests":{"messages":[]}}"#);
        assert!(e.contains("\"requests\" must be an array"), "{e}");
        let e = err(r#"{"requests":[3]}"#);
        assert!(e.contains("request 0: must be an object"), "{e}");
        let e = err(
            r#"{"requests":[{"messages":[{"role":"user","content":[{"type":"audio","audio":"a.wav"}]}]}]}"#,
        );
        assert!(
            e.contains("request 0, message 0") && e.contains("unknown content type \"audio\""),
            "{e}"
        );
        let e = err(
            r#"{"available_lora_weights":{"a":"/x"},"requests":[{"messages":[{"role":"user","content":"x"}],"lora_name":"b"}]}"#,
        );
        assert!(
            e.contains("request 0") && e.contains("\"lora_name\"") && e.contains("\"b\""),
            "{e}"
        );
        assert!(err(r#"{"top_p":0,"requests":[]}"#).contains("top_p"));
        assert!(err(r#"{"temperature":-1,"requests":[]}"#).contains("temperature"));
        assert!(err(r#"{"batch_size":0,"requests":[]}"#).contains("batch_size"));
        assert!(err(r#"{"max_generate_length":0,"requests":[]}"#).contains("max_generate_length"));
        assert!(err("{").contains("not valid JSON"));
    }

    #[test]
    fn image_magic() {
        assert_eq!(image_format(b"\x89PNG\r\n\x1a\n...."), Some("png"));
        assert_eq!(image_format(&[0xFF, 0xD8, 0xFF, 0xE0]), Some("jpeg"));
        assert_eq!(image_format(b"hello"), None);
    }
}
