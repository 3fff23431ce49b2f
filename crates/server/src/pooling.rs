//! Embedding and scoring requests, whatever route they come by (OpenAI, TEI, Cohere/Jina,
//! vLLM, LMI): inputs tokenized (the model's prompt, pair encodings, truncation), submitted to
//! the scheduler as pooling requests, their outputs gathered in order. The routes only parse
//! and format (`routes/embed.rs`, `routes/rerank.rs`).

use std::collections::VecDeque;

use lmi_api::error::{ApiError, ErrorKind};
use lmi_checkpoint::pooling::{PairInput, PoolerInfo, Task};
use lmi_scheduler::{Event, Handle, Pooled, PoolingRequest, RequestStream, SubmitError};

use crate::app::{AppState, LoadedModel};

mod inputs;

use inputs::{InputLimit, Which, tokenize};

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

/// The routes a model of `task` serves, for messages that send a client to the right one.
pub fn routes_for(task: Task) -> &'static str {
    match task {
        Task::Generate => {
            "text generation: /v1/chat/completions, /v1/completions, /generate and /invocations"
        }
        Task::Embed => "embeddings: /v1/embeddings, /embed and /invocations with {\"inputs\": ...}",
        Task::Score => {
            "scores: /rerank, /v1/rerank, /score, /predict and /invocations with \
             {\"query\", \"texts\"}"
        }
    }
}

/// The kind of model a task makes, in a sentence.
fn model_kind(task: Task) -> &'static str {
    match task {
        Task::Generate => "a text-generation model",
        Task::Embed => "an embedding model",
        Task::Score => "a scoring (reranking or classification) model",
    }
}

/// The model's pooler, or the 400 that says which routes this (generative) model serves.
pub fn pooler(state: &AppState) -> Result<&PoolerInfo, ApiError> {
    let model = state.model().ok_or_else(ApiError::unhealthy)?;
    model
        .handle
        .limits()
        .pooler
        .as_ref()
        .filter(|p| p.task != Task::Generate)
        .ok_or_else(|| {
            ApiError::not_supported(format!(
                "{:?} is {}: it serves {}. Embeddings and scores need an embedding or \
                 reranking model (one saved by sentence-transformers, a sequence classifier, \
                 or option.task=text-embedding / rerank)",
                state.model_name,
                model_kind(Task::Generate),
                routes_for(Task::Generate)
            ))
        })
}

/// For the generation routes: Ok for a generative model, else the 400 that names the routes
/// this embedding or scoring model serves. (While the model loads: Ok; the route answers 503.)
pub fn require_generative(state: &AppState) -> Result<(), ApiError> {
    match state
        .model()
        .and_then(|m| m.handle.limits().pooler.as_ref())
    {
        Some(p) if p.task != Task::Generate => Err(ApiError::not_supported(format!(
            "{:?} is {}: it serves {}, not text generation",
            state.model_name,
            model_kind(p.task),
            routes_for(p.task)
        ))),
        _ => Ok(()),
    }
}

/// The 413 for a request with more inputs than option.max_client_batch_size.
pub fn too_many_inputs(count: usize, max: usize) -> ApiError {
    ApiError::new(
        ErrorKind::BatchSizeExceeded,
        format!(
            "{count} inputs in one request exceed the server's limit of {max} \
             (option.max_client_batch_size): split them into several requests"
        ),
    )
}

/// Embeddings of `inputs`, in order.
pub async fn embed(
    state: &AppState,
    inputs: Vec<PoolInput>,
    opts: &EmbedOptions,
) -> Result<Vec<Embedding>, ApiError> {
    let (model, p) = pooling_model(state, Task::Embed)?;
    check_count(state, inputs.len(), "inputs")?;
    let normalize = opts.normalize.unwrap_or(p.normalize);
    let dimensions = match opts.dimensions {
        Some(d) => Some(check_dimensions(p, d)?),
        None => None,
    };
    let prompt = match &opts.prompt_name {
        Some(name) => Some(named_prompt(p, name)?.to_string()),
        None => p.prompt(None).map(str::to_string),
    };
    let limit = InputLimit::of(model, p);
    let vocab = model.handle.limits().vocab_size;
    let (truncation, n) = (opts.truncation, inputs.len());
    let reqs = tokenize(model, move |tok| {
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let at = Which(i, n);
                let tokens = match input {
                    PoolInput::Text(t) => {
                        if t.is_empty() {
                            return Err(ApiError::validation(format!(
                                "{at} is empty: send some text"
                            )));
                        }
                        let text = format!("{}{t}", prompt.as_deref().unwrap_or(""));
                        limit.encode(tok, &text, truncation, at)?
                    }
                    PoolInput::Ids(ids) => limit.cut_ids(ids, vocab, truncation, at)?,
                };
                Ok(PoolingRequest {
                    tokens,
                    segment_b: None,
                })
            })
            .collect()
    })
    .await?;
    let out = run(&model.handle, reqs).await?;
    Ok(out
        .into_iter()
        .map(|r| Embedding {
            values: finish_embedding(r.values, dimensions, normalize),
            prompt_tokens: r.prompt_tokens,
        })
        .collect())
}

/// A sequence classifier's raw outputs for each pair (TEI's `/predict` with pairs, vLLM's
/// `/score` with lists on both sides), in order.
pub async fn classify_pairs(
    state: &AppState,
    pairs: Vec<(String, String)>,
    opts: &ScoreOptions,
) -> Result<Vec<Scored>, ApiError> {
    score(state, pairs, opts, "pairs").await
}

/// A sequence classifier's raw outputs for each input (TEI's `/predict`).
pub async fn classify(
    state: &AppState,
    inputs: Vec<PoolInput>,
    opts: &ScoreOptions,
) -> Result<Vec<Scored>, ApiError> {
    let (model, p) = pooling_model(state, Task::Score)?;
    if p.pair_input == PairInput::Qwen3Reranker {
        return Err(ApiError::not_supported(
            "this reranker scores (query, document) pairs: send a query and documents to \
             /rerank",
        ));
    }
    check_count(state, inputs.len(), "inputs")?;
    let limit = InputLimit::of(model, p);
    let vocab = model.handle.limits().vocab_size;
    let (truncation, n) = (opts.truncation, inputs.len());
    let reqs = tokenize(model, move |tok| {
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let at = Which(i, n);
                let tokens = match input {
                    PoolInput::Text(t) if t.is_empty() => {
                        return Err(ApiError::validation(format!(
                            "{at} is empty: send some text"
                        )));
                    }
                    PoolInput::Text(t) => limit.encode(tok, &t, truncation, at)?,
                    PoolInput::Ids(ids) => limit.cut_ids(ids, vocab, truncation, at)?,
                };
                Ok(PoolingRequest {
                    tokens,
                    segment_b: None,
                })
            })
            .collect()
    })
    .await?;
    scored(run(&model.handle, reqs).await?)
}

/// Scores of `pairs` by a scoring model, as it joins a pair (`PoolerInfo::pair_input`).
async fn score(
    state: &AppState,
    pairs: Vec<(String, String)>,
    opts: &ScoreOptions,
    what: &str,
) -> Result<Vec<Scored>, ApiError> {
    let (model, p) = pooling_model(state, Task::Score)?;
    check_count(state, pairs.len(), what)?;
    if !matches!(p.pair_input, PairInput::Qwen3Reranker) && opts.instruction.is_some() {
        return Err(ApiError::validation(
            "`instruction` is for instruction-following rerankers (Qwen3-Reranker); this \
             model takes none",
        )
        .with_param("instruction"));
    }
    let limit = InputLimit::of(model, p);
    let pair_input = p.pair_input.clone();
    let (truncation, instruction, n) = (opts.truncation, opts.instruction.clone(), pairs.len());
    let reqs = tokenize(model, move |tok| {
        pairs
            .iter()
            .enumerate()
            .map(|(i, (a, b))| {
                let at = Which(i, n);
                match pair_input {
                    PairInput::Tokenizer => limit.encode_pair(tok, a, b, truncation, at),
                    PairInput::Qwen3Reranker => limit.encode_qwen3_reranker(
                        tok,
                        instruction.as_deref(),
                        a,
                        b,
                        truncation,
                        at,
                    ),
                }
            })
            .collect()
    })
    .await?;
    scored(run(&model.handle, reqs).await?)
}

fn scored(out: Vec<Pooled>) -> Result<Vec<Scored>, ApiError> {
    Ok(out
        .into_iter()
        .map(|r| Scored {
            values: r.values,
            prompt_tokens: r.prompt_tokens,
        })
        .collect())
}

/// The loaded model and its pooler, which must serve `task`.
fn pooling_model(state: &AppState, task: Task) -> Result<(&LoadedModel, &PoolerInfo), ApiError> {
    let p = pooler(state)?;
    let model = state.model().ok_or_else(ApiError::unhealthy)?;
    if p.task != task {
        return Err(ApiError::not_supported(format!(
            "{:?} is {}: it serves {}; {} need {}",
            state.model_name,
            model_kind(p.task),
            routes_for(p.task),
            match task {
                Task::Embed => "embeddings",
                Task::Score => "scores",
                Task::Generate => "generations",
            },
            model_kind(task)
        )));
    }
    if task == Task::Score && p.score_head.is_none() {
        return Err(ApiError::internal("the scoring model has no score head"));
    }
    Ok((model, p))
}

/// At least one input, at most option.max_client_batch_size.
fn check_count(state: &AppState, n: usize, what: &str) -> Result<(), ApiError> {
    if n == 0 {
        return Err(ApiError::validation(format!(
            "no {what}: send at least one"
        )));
    }
    let max = state.config.pooling.max_inputs;
    if n > max {
        return Err(too_many_inputs(n, max));
    }
    Ok(())
}

/// OpenAI's `dimensions`: at most the model's, and other than its own only for a Matryoshka
/// model.
fn check_dimensions(p: &PoolerInfo, d: usize) -> Result<usize, ApiError> {
    let bad = |msg: String| Err(ApiError::validation(msg).with_param("dimensions"));
    if d == 0 {
        return bad("dimensions must be at least 1".into());
    }
    if d > p.dimensions {
        return bad(format!(
            "dimensions ({d}) exceeds the model's {} dimensions",
            p.dimensions
        ));
    }
    if d < p.dimensions && !p.matryoshka {
        return bad(format!(
            "this model does not support dimensions other than its own {}: it was not trained \
             for Matryoshka truncation (config_sentence_transformers.json declares no \
             matryoshka_dims)",
            p.dimensions
        ));
    }
    Ok(d)
}

/// The text of prompt `name` of the model's `config_sentence_transformers.json`.
fn named_prompt<'a>(p: &'a PoolerInfo, name: &str) -> Result<&'a str, ApiError> {
    p.prompts
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, text)| text.as_str())
        .ok_or_else(|| {
            let names: Vec<&str> = p.prompts.iter().map(|(n, _)| n.as_str()).collect();
            let known = match names.is_empty() {
                true => "the model defines no prompts".to_string(),
                false => format!("the model's prompts are {}", names.join(", ")),
            };
            ApiError::validation(format!("prompt_name {name:?} is unknown: {known}"))
                .with_param("prompt_name")
        })
}

/// Cuts an embedding to `dimensions` and L2-normalizes it when asked (as
/// sentence-transformers' `Normalize`: divided by the norm, or left as it is when that is 0).
fn finish_embedding(mut v: Vec<f32>, dimensions: Option<usize>, normalize: bool) -> Vec<f32> {
    if let Some(d) = dimensions {
        v.truncate(d);
    }
    if normalize {
        let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        if norm > 1e-12 {
            for x in &mut v {
                *x = (f64::from(*x) / norm) as f32;
            }
        }
    }
    v
}

/// Submits `reqs` and gathers their results in order. At most twice a step's sequences are
/// queued at once (a thousand inputs would otherwise fill the scheduler's queue, which
/// bounds every client's waiting requests); dropping the future drops the streams, which
/// cancels what has not run.
async fn run(handle: &Handle, reqs: Vec<PoolingRequest>) -> Result<Vec<Pooled>, ApiError> {
    let n = reqs.len();
    let window = (2 * handle.limits().config.max_batch_size).max(1);
    let mut next = reqs.into_iter().enumerate();
    let mut pending: VecDeque<(usize, RequestStream)> = VecDeque::new();
    let mut out = Vec::with_capacity(n);
    loop {
        while pending.len() < window {
            let Some((i, r)) = next.next() else { break };
            let s = handle
                .submit_pooling(r)
                .map_err(|e| submit_error(e, Which(i, n)))?;
            pending.push_back((i, s));
        }
        let Some((i, s)) = pending.pop_front() else {
            break;
        };
        out.push(result(s, Which(i, n)).await?);
    }
    Ok(out)
}

/// The one result on a pooling request's stream.
async fn result(mut s: RequestStream, at: Which) -> Result<Pooled, ApiError> {
    match s.recv().await {
        Some(Event::Pooled(p)) => Ok(p),
        Some(Event::Error(m)) => Err(ApiError::generation(format!("{at}: {m}"))),
        Some(_) => Err(ApiError::internal(format!(
            "{at}: the scheduler sent a generation event for a pooling request"
        ))),
        None => Err(ApiError::incomplete()),
    }
}

fn submit_error(e: SubmitError, at: Which) -> ApiError {
    match e {
        SubmitError::QueueFull(_) => ApiError::overloaded(),
        SubmitError::Stopped => ApiError::unhealthy(),
        other => ApiError::validation(format!("{at}: {other}")),
    }
}

#[cfg(test)]
mod tests;
