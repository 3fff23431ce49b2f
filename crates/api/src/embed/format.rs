//! Embedding response bodies: OpenAI's list object, TEI's bare lists, LMI's list of vectors.

use base64::Engine;
use serde::Serialize;

use super::request::EncodingFormat;
use crate::error::compact;

/// A vector as base64 of its little-endian f32 bytes, as the openai SDK decodes it
/// (`np.frombuffer(base64.b64decode(s), dtype="float32")`).
pub fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
struct Item<'a> {
    object: &'static str,
    index: usize,
    embedding: Vector<'a>,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct List<'a> {
    object: &'static str,
    data: Vec<Item<'a>>,
    model: &'a str,
    usage: Usage,
}

/// OpenAI's `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
/// "usage"}`; `prompt_tokens` counts every input's tokens.
pub fn openai_embeddings(
    vectors: &[Vec<f32>],
    format: EncodingFormat,
    model: &str,
    prompt_tokens: usize,
) -> String {
    let data = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| Item {
            object: "embedding",
            index,
            embedding: match format {
                EncodingFormat::Float => Vector::Float(v),
                EncodingFormat::Base64 => Vector::Base64(base64_f32(v)),
            },
        })
        .collect();
    compact(&List {
        object: "list",
        data,
        model,
        usage: Usage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    })
}

/// TEI's `/embed` answer and LMI's embedding answer: one vector per input, always a list of
/// lists (a single string input too).
pub fn vectors(vectors: &[Vec<f32>]) -> String {
    compact(&vectors)
}

/// TEI's `/similarity` answer: the source sentence's cosine similarity with each sentence.
pub fn similarities(scores: &[f32]) -> String {
    compact(&scores)
}

/// Cosine similarity; 0 where a vector is all zeros.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    (dot / (na.sqrt() * nb.sqrt())) as f32
}
