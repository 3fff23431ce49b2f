//! Embedding request bodies, read field by field so that each error names the field and says
//! what to send instead.

use serde_json::Value;

use crate::error::ApiError;
use crate::fields::{Fields, Res, token_id, type_name};

/// One input to embed: text, or token ids (OpenAI's and TEI's `input` may be ids).
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    Text(String),
    Ids(Vec<u32>),
}

/// What to do with an input longer than the model's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncate {
    /// A 4xx that names the limit.
    Refuse,
    /// Keep the first tokens.
    Right,
    /// Keep the last tokens (TEI's `truncation_direction: "Left"`).
    Left,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    Float,
    /// Each vector as base64 of its little-endian f32 bytes (what the openai SDK decodes).
    Base64,
}

/// OpenAI's `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsRequest {
    pub inputs: Vec<EmbedInput>,
    pub model: Option<String>,
    pub encoding_format: EncodingFormat,
    pub dimensions: Option<usize>,
    /// vLLM's `truncate_prompt_tokens`: -1 truncates to the model's limit; a positive value is
    /// checked against that limit by the server.
    pub truncate_prompt_tokens: Option<i64>,
    /// Fields this server does not read (logged).
    pub unknown: Vec<String>,
}

/// TEI's `POST /embed` (and `/embed_sparse`, which reads the same fields but `normalize` and
/// `dimensions`).
#[derive(Debug, Clone, PartialEq)]
pub struct TeiEmbedRequest {
    pub inputs: Vec<EmbedInput>,
    pub truncate: Truncate,
    pub prompt_name: Option<String>,
    /// TEI's default is true, whatever the model's pipeline.
    pub normalize: bool,
    pub dimensions: Option<usize>,
}

/// TEI's `POST /similarity` (huggingface_hub's `sentence_similarity`).
#[derive(Debug, Clone, PartialEq)]
pub struct SimilarityRequest {
    pub source: String,
    pub sentences: Vec<String>,
    pub truncate: Truncate,
    pub prompt_name: Option<String>,
}

/// `input` / `inputs`: a string, a list of strings, a list of token ids, or a list of lists of
/// ids (TEI also takes strings and id lists mixed in one list).
fn inputs(f: &Fields<'_>, key: &str) -> Res<Vec<EmbedInput>> {
    let v = f.get(key).ok_or_else(|| {
        ApiError::invalid_body(format!(
            "`{key}` is required: a string or a list of strings (or of token ids) to embed"
        ))
        .with_param(key)
    })?;
    let want = "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let list = match v {
        Value::String(s) => return Ok(vec![text(key, s.clone())?]),
        Value::Array(items) => items,
        other => return Err(f.type_err(key, want, other)),
    };
    if list.is_empty() {
        return Err(ApiError::empty_input(format!(
            "`{key}` cannot be an empty list: send at least one text"
        ))
        .with_param(key));
    }
    // A list of numbers is one input of token ids.
    if list.iter().all(Value::is_number) {
        return Ok(vec![EmbedInput::Ids(ids(f, key, list)?)]);
    }
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            let at = format!("{key}[{i}]");
            match item {
                Value::String(s) => text(&at, s.clone()),
                Value::Array(inner) => Ok(EmbedInput::Ids(ids(f, &at, inner)?)),
                other => Err(f.type_err(&at, "a string or a list of token ids", other)),
            }
        })
        .collect()
}

fn text(at: &str, s: String) -> Res<EmbedInput> {
    if s.is_empty() {
        return Err(ApiError::empty_input(format!(
            "`{at}` is an empty string: send the text to embed"
        ))
        .with_param(at));
    }
    Ok(EmbedInput::Text(s))
}

fn ids(f: &Fields<'_>, at: &str, items: &[Value]) -> Res<Vec<u32>> {
    if items.is_empty() {
        return Err(ApiError::empty_input(format!(
            "`{at}` is an empty list of token ids: send at least one id"
        ))
        .with_param(at));
    }
    items
        .iter()
        .enumerate()
        .map(|(j, v)| token_id(v).ok_or_else(|| f.id_err(&format!("{at}[{j}]"), v)))
        .collect()
}

/// A positive `dimensions`.
fn dimensions(f: &Fields<'_>) -> Res<Option<usize>> {
    Ok(
        f.int_in("dimensions", 1, i64::from(u32::MAX), "a positive integer")?
            .map(|d| d as usize),
    )
}

/// TEI's `truncate` (bool, default false: refuse) and `truncation_direction`.
fn truncate(f: &Fields<'_>) -> Res<Truncate> {
    let left = match f.str("truncation_direction")? {
        None => false,
        Some(d) if d.eq_ignore_ascii_case("right") => false,
        Some(d) if d.eq_ignore_ascii_case("left") => true,
        Some(d) => {
            return Err(f.range_err(
                "truncation_direction",
                format!("must be \"Left\" or \"Right\", got {d:?}"),
            ));
        }
    };
    Ok(match (f.bool("truncate")?, left) {
        (Some(true), false) => Truncate::Right,
        (Some(true), true) => Truncate::Left,
        _ => Truncate::Refuse,
    })
}

pub fn parse_embeddings_request(body: &Value) -> Res<EmbeddingsRequest> {
    let f = Fields::body(body)?;
    let inputs = inputs(&f, "input")?;
    let encoding_format = match f.str("encoding_format")? {
        None | Some("float") => EncodingFormat::Float,
        Some("base64") => EncodingFormat::Base64,
        Some(other) => {
            return Err(f.range_err(
                "encoding_format",
                format!("must be \"float\" or \"base64\", got {other:?}"),
            ));
        }
    };
    let truncate_prompt_tokens = match f.i64("truncate_prompt_tokens")? {
        Some(t) if t < -1 || t == 0 => {
            return Err(f.range_err(
                "truncate_prompt_tokens",
                format!("must be -1 (the model's limit) or a positive integer, got {t}"),
            ));
        }
        t => t,
    };
    Ok(EmbeddingsRequest {
        inputs,
        model: f.str("model")?.map(str::to_string),
        encoding_format,
        dimensions: dimensions(&f)?,
        truncate_prompt_tokens,
        unknown: f.unknown(&[
            "input",
            "model",
            "encoding_format",
            "dimensions",
            "user",
            "truncate_prompt_tokens",
        ]),
    })
}

pub fn parse_tei_embed(body: &Value) -> Res<TeiEmbedRequest> {
    let f = Fields::body(body)?;
    Ok(TeiEmbedRequest {
        inputs: inputs(&f, "inputs")?,
        truncate: truncate(&f)?,
        prompt_name: f.str("prompt_name")?.map(str::to_string),
        normalize: f.bool("normalize")?.unwrap_or(true),
        dimensions: dimensions(&f)?,
    })
}

pub fn parse_similarity_request(body: &Value) -> Res<SimilarityRequest> {
    let f = Fields::body(body)?;
    let inputs = f.object("inputs")?.ok_or_else(|| {
        ApiError::invalid_body(
            "`inputs` is required: {\"source_sentence\": string, \"sentences\": [string]}",
        )
        .with_param("inputs")
    })?;
    let i = Fields::new(inputs, "inputs");
    let source = match i.str("source_sentence")? {
        Some("") => {
            return Err(ApiError::empty_input(
                "`inputs.source_sentence` is an empty string: send the sentence to compare",
            )
            .with_param("inputs.source_sentence"));
        }
        Some(s) => s.to_string(),
        None => {
            return Err(ApiError::invalid_body(
                "`inputs.source_sentence` is required: the sentence the others are compared with",
            )
            .with_param("inputs.source_sentence"));
        }
    };
    let sentences = match i.get("sentences") {
        Some(Value::Array(_)) => i.strings("sentences")?.unwrap_or_default(),
        Some(other) => return Err(i.type_err("sentences", "a list of strings", other)),
        None => Vec::new(),
    };
    if sentences.is_empty() {
        return Err(ApiError::empty_input(
            "`inputs.sentences` cannot be empty: send the sentences to compare with the source",
        )
        .with_param("inputs.sentences"));
    }
    let (truncate, prompt_name) = match f.object("parameters")? {
        Some(p) => {
            let p = Fields::new(p, "parameters");
            (truncate(&p)?, p.str("prompt_name")?.map(str::to_string))
        }
        None => (Truncate::Refuse, None),
    };
    Ok(SimilarityRequest {
        source,
        sentences,
        truncate,
        prompt_name,
    })
}

/// LMI's `{"inputs": str | [str]}` on an embedding model, as its embedding handler reads it.
pub fn parse_lmi_embed(body: &Value) -> Res<Vec<String>> {
    let f = Fields::body(body)?;
    let texts = match f.get("inputs") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(f.type_err(&format!("inputs[{i}]"), "a string", other)),
            })
            .collect::<Res<Vec<_>>>()?,
        Some(other) => {
            return Err(ApiError::invalid_body(format!(
                "'inputs' must be a string or list of strings, got {}",
                type_name(other)
            ))
            .with_param("inputs"));
        }
        None => {
            return Err(ApiError::invalid_body(
                "'inputs' is required on an embedding model: a string or a list of strings",
            )
            .with_param("inputs"));
        }
    };
    if texts.is_empty() {
        return Err(ApiError::empty_input(
            "'inputs' cannot be an empty list: send at least one text",
        )
        .with_param("inputs"));
    }
    if let Some(i) = texts.iter().position(String::is_empty) {
        return Err(ApiError::empty_input(format!(
            "'inputs[{i}]' is an empty string: send the text to embed"
        ))
        .with_param("inputs"));
    }
    Ok(texts)
}
