//! Embedding routes: OpenAI `POST /v1/embeddings`, TEI `POST /embed`, `/embed_sparse`,
//! `/similarity`, TEI's `POST /` on an embedding or scoring model, and LMI's `/invocations` on
//! one. Each parses with `lmi_api::embed` / `lmi_api::rerank`, embeds or scores through the
//! pooling service (`crate::pooling`) and answers in its peer's shape; a model served for
//! another task is a 400 naming the routes it serves.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use lmi_api::embed::{self, EmbedInput, Served, Truncate, format};
use lmi_api::rerank;
use lmi_api::{ApiError, ErrorKind, Schema};
use lmi_checkpoint::pooling::{PoolerInfo, Task};
use serde_json::Value;

use super::respond;
use crate::app::AppState;
use crate::pooling::{self, EmbedOptions, Embedding, PoolInput, Truncation};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/embed", post(tei_embed))
        .route("/embed_sparse", post(tei_embed_sparse))
        .route("/similarity", post(tei_similarity))
}

/// The answer: the body, or the error in `schema`'s shape.
pub(super) fn answer(r: Result<String, ApiError>, schema: Schema) -> Response {
    match r {
        Ok(body) => respond::ok_json(body),
        Err(e) => respond::error(&e, schema),
    }
}

pub(super) fn served(task: Task) -> Served {
    match task {
        Task::Generate => Served::Generation,
        Task::Embed => Served::Embedding,
        Task::Score => Served::Scoring,
    }
}

/// The model's pooler when it is served for one of `tasks`; 503 while loading; otherwise the
/// 400 that names the routes the model serves.
pub(super) fn pooler_for<'a>(
    state: &'a Arc<AppState>,
    route: &str,
    tasks: &[Task],
) -> Result<&'a PoolerInfo, ApiError> {
    state.model().ok_or_else(ApiError::unhealthy)?;
    // Loaded, the pooler is refused only for a generative model.
    let info = pooling::pooler(state).map_err(|_| embed::wrong_task(route, Served::Generation))?;
    if !tasks.contains(&info.task) {
        return Err(embed::wrong_task(route, served(info.task)));
    }
    Ok(info)
}

/// A pooling service error as the routes answer it: more inputs than the limit is 413 on
/// every embedding and scoring route (TEI's batch-size code), whatever kind the service gave.
pub(super) fn service(e: ApiError) -> ApiError {
    match e.kind {
        ErrorKind::BatchSizeExceeded => ApiError {
            kind: ErrorKind::TooManyInputs,
            ..e
        },
        _ => e,
    }
}

pub(super) fn truncation(t: Truncate) -> Truncation {
    match t {
        Truncate::Refuse => Truncation::Refuse,
        Truncate::Right => Truncation::Right,
        Truncate::Left => Truncation::Left,
    }
}

/// vLLM's `truncate_prompt_tokens`: -1 (or the model's limit or more) cuts at the model's
/// limit; a smaller count is refused (inputs are cut at the limit only).
pub(super) fn vllm_truncation(
    t: Option<i64>,
    default: Truncation,
    info: &PoolerInfo,
) -> Result<Truncation, ApiError> {
    match t {
        None => Ok(default),
        Some(-1) => Ok(Truncation::Right),
        Some(n) if usize::try_from(n).is_ok_and(|n| n >= info.max_input_tokens) => {
            Ok(Truncation::Right)
        }
        Some(n) => Err(ApiError::validation(format!(
            "truncate_prompt_tokens {n} is below the model's limit of {} tokens, which is \
             where inputs are cut: send -1",
            info.max_input_tokens
        ))
        .with_param("truncate_prompt_tokens")),
    }
}

fn pool_inputs(inputs: Vec<EmbedInput>) -> Vec<PoolInput> {
    inputs
        .into_iter()
        .map(|i| match i {
            EmbedInput::Text(t) => PoolInput::Text(t),
            EmbedInput::Ids(ids) => PoolInput::Ids(ids),
        })
        .collect()
}

fn split(out: Vec<Embedding>) -> (Vec<Vec<f32>>, usize) {
    let tokens = out.iter().map(|e| e.prompt_tokens).sum();
    (out.into_iter().map(|e| e.values).collect(), tokens)
}

async fn openai_embeddings(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(openai_reply(&state, &body).await, Schema::Responses)
}

async fn openai_reply(state: &Arc<AppState>, body: &[u8]) -> Result<String, ApiError> {
    let req = embed::parse_embeddings_request(&lmi_api::parse_json(body)?)?;
    let info = pooler_for(state, "/v1/embeddings", &[Task::Embed])?;
    if !req.unknown.is_empty() {
        tracing::info!(unknown = ?req.unknown, "ignoring unknown fields");
    }
    let opts = EmbedOptions {
        truncation: vllm_truncation(req.truncate_prompt_tokens, Truncation::Refuse, info)?,
        prompt_name: None,
        normalize: None,
        dimensions: req.dimensions,
    };
    let (vectors, tokens) = split(
        pooling::embed(state, pool_inputs(req.inputs), &opts)
            .await
            .map_err(service)?,
    );
    let model = req.model.as_deref().unwrap_or(&state.model_name);
    Ok(format::openai_embeddings(
        &vectors,
        req.encoding_format,
        model,
        tokens,
    ))
}

async fn tei_embed(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let r = match lmi_api::parse_json(&body) {
        Ok(v) => tei_embed_reply(&state, &v).await,
        Err(e) => Err(e),
    };
    answer(r, Schema::Tgi)
}

async fn tei_embed_reply(state: &Arc<AppState>, body: &Value) -> Result<String, ApiError> {
    let req = embed::parse_tei_embed(body)?;
    pooler_for(state, "/embed", &[Task::Embed])?;
    let opts = EmbedOptions {
        truncation: truncation(req.truncate),
        prompt_name: req.prompt_name,
        normalize: Some(req.normalize),
        dimensions: req.dimensions,
    };
    let (vectors, _) = split(
        pooling::embed(state, pool_inputs(req.inputs), &opts)
            .await
            .map_err(service)?,
    );
    Ok(format::vectors(&vectors))
}

async fn tei_embed_sparse(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let r = (|| {
        embed::parse_tei_embed(&lmi_api::parse_json(&body)?)?;
        pooler_for(&state, "/embed_sparse", &[Task::Embed])?;
        Err::<String, _>(ApiError::wrong_task(
            "/embed_sparse needs a sparse head (SPLADE pooling, or BGE-M3's lexical weights), \
             which this model does not have: use POST /embed for its dense vectors",
        ))
    })();
    answer(r, Schema::Tgi)
}

async fn tei_similarity(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    answer(similarity_reply(&state, &body).await, Schema::Tgi)
}

async fn similarity_reply(state: &Arc<AppState>, body: &[u8]) -> Result<String, ApiError> {
    let req = embed::parse_similarity_request(&lmi_api::parse_json(body)?)?;
    pooler_for(state, "/similarity", &[Task::Embed])?;
    let mut inputs = vec![PoolInput::Text(req.source)];
    inputs.extend(req.sentences.into_iter().map(PoolInput::Text));
    let opts = EmbedOptions {
        truncation: truncation(req.truncate),
        prompt_name: req.prompt_name,
        normalize: None,
        dimensions: None,
    };
    let (vectors, _) = split(
        pooling::embed(state, inputs, &opts)
            .await
            .map_err(service)?,
    );
    let Some((source, others)) = vectors.split_first() else {
        return Err(ApiError::internal(
            "the pooling service returned no vectors",
        ));
    };
    let scores: Vec<f32> = others.iter().map(|v| format::cosine(source, v)).collect();
    Ok(format::similarities(&scores))
}

/// TEI's `POST /` on an embedding or scoring model: the model's own route (embed; for a
/// scoring model rerank when the body has a `query`, else predict). None on a generative
/// model or while loading: TGI's generate answers.
pub(super) async fn tei_root(state: &Arc<AppState>, body: &Bytes) -> Option<Response> {
    state.model()?;
    let info = pooling::pooler(state).ok()?;
    Some(match info.task {
        Task::Generate => return None,
        Task::Embed => {
            let r = match lmi_api::parse_json(body) {
                Ok(v) => tei_embed_reply(state, &v).await,
                Err(e) => Err(e),
            };
            answer(r, Schema::Tgi)
        }
        Task::Score => super::rerank::tei_root(state, body).await,
    })
}

/// `/invocations` and `/predictions/{model}` on an embedding or scoring model, as LMI's
/// embedding handler (`{"inputs": str | [str]}` → a list of vectors) and DJL's cross-encoder
/// handler (`{"query", "texts"}` or pairs → scores after the sigmoid) answer; a generation body
/// is the 400 naming the routes the model serves. Errors are LMI's `{"error", "code"}`.
pub(super) async fn lmi(
    state: &Arc<AppState>,
    info: &PoolerInfo,
    body: &[u8],
    route: &str,
) -> Response {
    answer(lmi_reply(state, info, body, route).await, Schema::Lmi)
}

async fn lmi_reply(
    state: &Arc<AppState>,
    info: &PoolerInfo,
    body: &[u8],
    route: &str,
) -> Result<String, ApiError> {
    let v = lmi_api::parse_json(body)?;
    let generation_body = v
        .as_object()
        .is_some_and(|m| m.contains_key("prompt") || m.contains_key("messages"));
    if generation_body {
        return Err(embed::wrong_body(
            &format!("a `prompt` or `messages` body on {route} needs a text-generation model"),
            served(info.task),
        ));
    }
    match info.task {
        Task::Embed => {
            let texts = embed::parse_lmi_embed(&v)?;
            let opts = EmbedOptions {
                truncation: Truncation::Refuse,
                prompt_name: None,
                normalize: None,
                dimensions: None,
            };
            let inputs = texts.into_iter().map(PoolInput::Text).collect();
            let (vectors, _) = split(
                pooling::embed(state, inputs, &opts)
                    .await
                    .map_err(service)?,
            );
            Ok(format::vectors(&vectors))
        }
        Task::Score => {
            let req = rerank::parse_lmi_score(&v)?;
            let (rows, _) =
                super::rerank::score_pairs(state, &req.pairs, Truncation::Refuse).await?;
            let rows: Vec<Vec<f32>> = rows
                .iter()
                .map(|r| r.iter().copied().map(rerank::sigmoid).collect())
                .collect();
            Ok(rerank::format::lmi_scores(&rows, req.batch))
        }
        Task::Generate => Err(embed::wrong_task(route, Served::Generation)),
    }
}
