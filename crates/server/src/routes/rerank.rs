//! Scoring routes: `POST /rerank` (TEI's shape for `texts`, Cohere's / Jina's / vLLM's for
//! `documents`), `/v1/rerank`, `/v2/rerank`, vLLM's `/score` and `/v1/score`, and TEI's
//! `/predict`. A reranker's score is the sigmoid of its logit unless the request asks for raw
//! scores; on an embedding model the rerank and score routes answer the cosine of the two
//! vectors, as vLLM does.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use lmi_api::rerank::{self, PredictInput, format};
use lmi_api::{ApiError, Schema};
use lmi_checkpoint::pooling::{PoolerInfo, Task};
use serde_json::Value;

use super::chat_call::unix_time;
use super::embed::{answer, pooler_for, service, truncation, vllm_truncation};
use crate::app::{AppState, new_request_id};
use crate::pooling::{self, EmbedOptions, PoolInput, ScoreOptions, Truncation};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/rerank", post(rerank_any))
        .route("/v1/rerank", post(rerank_v1))
        .route("/v2/rerank", post(rerank_v2))
        .route("/score", post(score))
        .route("/v1/score", post(score_v1))
        .route("/predict", post(predict))
}

const RANKERS: &[Task] = &[Task::Score, Task::Embed];

/// Raw values per pair (one per label), and the prompt tokens, in one call to the service
/// (so the input limit counts every pair).
pub(super) async fn score_pairs(
    state: &Arc<AppState>,
    pairs: &[(String, String)],
    truncation: Truncation,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let opts = ScoreOptions {
        truncation,
        instruction: None,
    };
    let out = pooling::classify_pairs(state, pairs.to_vec(), &opts)
        .await
        .map_err(service)?;
    let tokens = out.iter().map(|s| s.prompt_tokens).sum();
    Ok((out.into_iter().map(|s| s.values).collect(), tokens))
}

/// One score per pair: a reranker's single value (after the sigmoid when `activate`), or on
/// an embedding model the cosine of the two texts' vectors.
async fn pair_scores(
    state: &Arc<AppState>,
    info: &PoolerInfo,
    pairs: &[(String, String)],
    truncation: Truncation,
    activate: bool,
) -> Result<(Vec<f32>, usize), ApiError> {
    if info.task == Task::Embed {
        // Each distinct text once (a query against N documents is N + 1 inputs).
        let mut texts: Vec<&str> = Vec::new();
        let index: Vec<(usize, usize)> = pairs
            .iter()
            .map(|(a, b)| (intern(&mut texts, a), intern(&mut texts, b)))
            .collect();
        let inputs = texts
            .iter()
            .map(|t| PoolInput::Text(t.to_string()))
            .collect();
        let opts = EmbedOptions {
            truncation,
            prompt_name: None,
            normalize: None,
            dimensions: None,
        };
        let out = pooling::embed(state, inputs, &opts)
            .await
            .map_err(service)?;
        let tokens = out.iter().map(|e| e.prompt_tokens).sum();
        let vector = |i: usize| out.get(i).map(|e| e.values.as_slice()).unwrap_or(&[]);
        let scores = index
            .iter()
            .map(|&(a, b)| lmi_api::embed::format::cosine(vector(a), vector(b)))
            .collect();
        return Ok((scores, tokens));
    }
    let (rows, tokens) = score_pairs(state, pairs, truncation).await?;
    let scores = rows
        .iter()
        .map(|values| match values.as_slice() {
            [v] if activate => Ok(rerank::sigmoid(*v)),
            [v] => Ok(*v),
            _ => Err(ApiError::validation(format!(
                "this model gives {} scores per input (a classifier): reranking needs a model \
                 with one; use POST /predict",
                values.len()
            ))),
        })
        .collect::<Result<Vec<f32>, ApiError>>()?;
    if scores.iter().any(|s| s.is_nan()) {
        return Err(ApiError::generation("the model's score is NaN"));
    }
    Ok((scores, tokens))
}

/// `t`'s index in `texts`, added if new.
fn intern<'a>(texts: &mut Vec<&'a str>, t: &'a str) -> usize {
    match texts.iter().position(|x| *x == t) {
        Some(i) => i,
        None => {
            texts.push(t);
            texts.len() - 1
        }
    }
}

fn with_query(query: &str, docs: impl Iterator<Item = String>) -> Vec<(String, String)> {
    docs.map(|d| (query.to_string(), d)).collect()
}

async fn rerank_any(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    match lmi_api::parse_json(&body) {
        Ok(v) if rerank::is_tei_rerank(&v) => answer(tei_rerank(&state, &v).await, Schema::Tgi),
        Ok(v) => answer(
            cohere_rerank(&state, &v, "/rerank", "1").await,
            Schema::Responses,
        ),
        Err(e) => answer(Err(e), Schema::Tgi),
    }
}

async fn rerank_v1(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let r = match lmi_api::parse_json(&body) {
        Ok(v) => cohere_rerank(&state, &v, "/v1/rerank", "1").await,
        Err(e) => Err(e),
    };
    answer(r, Schema::Responses)
}

async fn rerank_v2(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let r = match lmi_api::parse_json(&body) {
        Ok(v) => cohere_rerank(&state, &v, "/v2/rerank", "2").await,
        Err(e) => Err(e),
    };
    answer(r, Schema::Responses)
}

async fn tei_rerank(state: &Arc<AppState>, body: &Value) -> Result<String, ApiError> {
    let req = rerank::parse_tei_rerank(body)?;
    let info = pooler_for(state, "/rerank", RANKERS)?;
    let pairs = with_query(&req.query, req.texts.iter().cloned());
    let (scores, _) = pair_scores(
        state,
        info,
        &pairs,
        truncation(req.truncate),
        !req.raw_scores,
    )
    .await?;
    Ok(format::tei_rerank(
        &scores,
        req.return_text.then_some(req.texts.as_slice()),
    ))
}

async fn cohere_rerank(
    state: &Arc<AppState>,
    body: &Value,
    route: &str,
    api_version: &str,
) -> Result<String, ApiError> {
    let req = rerank::parse_rerank(body)?;
    let info = pooler_for(state, route, RANKERS)?;
    if !req.unknown.is_empty() {
        tracing::info!(unknown = ?req.unknown, "ignoring unknown fields");
    }
    // Cohere cuts long documents at the model's limit.
    let cut = vllm_truncation(req.truncate_prompt_tokens, Truncation::Right, info)?;
    let pairs = with_query(&req.query, req.documents.iter().map(|d| d.text.clone()));
    let (scores, tokens) = pair_scores(state, info, &pairs, cut, req.activation).await?;
    let id = format!("rerank-{}", new_request_id());
    Ok(format::rerank(
        &scores,
        req.return_documents.then_some(req.documents.as_slice()),
        req.top_n,
        &format::RerankMeta {
            id: &id,
            model: req.model.as_deref().unwrap_or(&state.model_name),
            prompt_tokens: tokens,
            api_version,
        },
    ))
}

async fn score(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(
        score_reply(&state, &body, "/score").await,
        Schema::Responses,
    )
}

async fn score_v1(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(
        score_reply(&state, &body, "/v1/score").await,
        Schema::Responses,
    )
}

async fn score_reply(state: &Arc<AppState>, body: &[u8], route: &str) -> Result<String, ApiError> {
    let req = rerank::parse_score(&lmi_api::parse_json(body)?)?;
    let info = pooler_for(state, route, RANKERS)?;
    if !req.unknown.is_empty() {
        tracing::info!(unknown = ?req.unknown, "ignoring unknown fields");
    }
    // vLLM refuses an input over the limit unless truncate_prompt_tokens asks to cut it.
    let cut = vllm_truncation(req.truncate_prompt_tokens, Truncation::Refuse, info)?;
    let (scores, tokens) = pair_scores(state, info, &req.pairs, cut, req.activation).await?;
    let id = format!("score-{}", new_request_id());
    let model = req.model.as_deref().unwrap_or(&state.model_name);
    Ok(format::score(&scores, &id, unix_time(), model, tokens))
}

async fn predict(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let r = match lmi_api::parse_json(&body) {
        Ok(v) => predict_reply(&state, &v).await,
        Err(e) => Err(e),
    };
    answer(r, Schema::Tgi)
}

async fn predict_reply(state: &Arc<AppState>, body: &Value) -> Result<String, ApiError> {
    let req = rerank::parse_predict(body)?;
    let info = pooler_for(state, "/predict", &[Task::Score])?;
    let cut = truncation(req.truncate);
    let opts = ScoreOptions {
        truncation: cut,
        instruction: None,
    };
    // Texts go to the classifier in one call; pairs to the cross-encoder's pair encoding.
    let singles: Vec<PoolInput> = req
        .inputs
        .iter()
        .filter_map(|i| match i {
            PredictInput::Single(t) => Some(PoolInput::Text(t.clone())),
            PredictInput::Pair(..) => None,
        })
        .collect();
    let pairs: Vec<(String, String)> = req
        .inputs
        .iter()
        .filter_map(|i| match i {
            PredictInput::Pair(a, b) => Some((a.clone(), b.clone())),
            PredictInput::Single(_) => None,
        })
        .collect();
    let mut single_rows = if singles.is_empty() {
        Vec::new()
    } else {
        pooling::classify(state, singles, &opts)
            .await
            .map_err(service)?
    }
    .into_iter()
    .map(|s| s.values);
    let mut pair_rows = if pairs.is_empty() {
        Vec::new()
    } else {
        score_pairs(state, &pairs, cut).await?.0
    }
    .into_iter();
    let mut rows = Vec::with_capacity(req.inputs.len());
    for input in &req.inputs {
        let row = match input {
            PredictInput::Single(_) => single_rows.next(),
            PredictInput::Pair(..) => pair_rows.next(),
        };
        let row = row.ok_or_else(|| ApiError::internal("the pooling service lost an input"))?;
        if row.iter().any(|v| v.is_nan()) {
            return Err(ApiError::generation("the model's score is NaN"));
        }
        rows.push(if req.raw_scores {
            row
        } else {
            rerank::activate(&row)
        });
    }
    Ok(format::predict(&rows, &info.labels, req.batch))
}

/// TEI's `POST /` on a scoring model: rerank when the body has a `query`, else predict.
pub(super) async fn tei_root(state: &Arc<AppState>, body: &Bytes) -> Response {
    match lmi_api::parse_json(body) {
        Ok(v) if v.get("query").is_some() && rerank::is_tei_rerank(&v) => {
            answer(tei_rerank(state, &v).await, Schema::Tgi)
        }
        Ok(v) if v.get("query").is_some() => answer(
            cohere_rerank(state, &v, "/rerank", "1").await,
            Schema::Responses,
        ),
        Ok(v) => answer(predict_reply(state, &v).await, Schema::Tgi),
        Err(e) => answer(Err(e), Schema::Tgi),
    }
}
