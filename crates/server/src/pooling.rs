//! Embedding and scoring requests, whatever route they come by (OpenAI, TEI, Cohere/Jina,
//! vLLM, LMI): inputs tokenized (the model's prompt, pair encodings, truncation), submitted to
//! the scheduler as pooling requests, their outputs gathered in order. The routes only parse
//! and format (`routes/embed.rs`, `routes/rerank.rs`).
#![allow(dead_code)] // The routes that call this land with issue 52's route commit.

use lmi_api::error::ApiError;
use lmi_checkpoint::pooling::PoolerInfo;

use crate::app::AppState;

/// One input: text, or token ids (OpenAI's `input` may be ids).
#[derive(Debug, Clone, PartialEq)]
pub enum PoolInput {
    Text(String),
    Ids(Vec<u32>),
}

/// What to do with an input longer than the model's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// A 4xx that names the limit (TEI's `truncate: false`).
    Refuse,
    /// Keep the first tokens (the special tokens stay).
    Right,
    /// Keep the last tokens (TEI's `truncation_direction: "Left"`).
    Left,
}

#[derive(Debug, Clone)]
pub struct EmbedOptions {
    pub truncation: Truncation,
    /// A prompt of the model's `config_sentence_transformers.json` prepended to each text
    /// (None: its default prompt, if any).
    pub prompt_name: Option<String>,
    /// L2-normalize (None: as the model's pipeline does, `PoolerInfo::normalize`).
    pub normalize: Option<bool>,
    /// Matryoshka truncation to this many dimensions, then renormalized; a 400 where the
    /// model does not declare it or the number exceeds its dimensions.
    pub dimensions: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub values: Vec<f32>,
    pub prompt_tokens: usize,
}

#[derive(Debug, Clone)]
pub struct ScoreOptions {
    pub truncation: Truncation,
    /// Qwen3-Reranker's instruction (None: the model's default).
    pub instruction: Option<String>,
}

/// A scoring model's raw outputs for one input or pair: one value per label (a reranker's
/// single logit, or Qwen3-Reranker's `logit(yes) − logit(no)`); routes apply the sigmoid or
/// softmax their schema asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub values: Vec<f32>,
    pub prompt_tokens: usize,
}

/// The model's pooler, or the 400 that says which routes this (generative) model serves.
pub fn pooler(state: &AppState) -> Result<&PoolerInfo, ApiError> {
    let _ = state;
    Err(ApiError::not_supported("pooling is not wired yet"))
}

/// Embeddings of `inputs`, in order.
pub async fn embed(
    state: &AppState,
    inputs: Vec<PoolInput>,
    opts: &EmbedOptions,
) -> Result<Vec<Embedding>, ApiError> {
    let _ = (state, inputs, opts);
    Err(ApiError::not_supported("embeddings are not wired yet"))
}

/// Scores of (`query`, document) for each of `documents`, in order (cross-encoders and
/// Qwen3-Reranker).
pub async fn score_pairs(
    state: &AppState,
    query: &str,
    documents: &[String],
    opts: &ScoreOptions,
) -> Result<Vec<Scored>, ApiError> {
    let _ = (state, query, documents, opts);
    Err(ApiError::not_supported("scoring is not wired yet"))
}

/// A sequence classifier's raw outputs for each input (TEI's `/predict`).
pub async fn classify(
    state: &AppState,
    inputs: Vec<PoolInput>,
    opts: &ScoreOptions,
) -> Result<Vec<Scored>, ApiError> {
    let _ = (state, inputs, opts);
    Err(ApiError::not_supported("classification is not wired yet"))
}
