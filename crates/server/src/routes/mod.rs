//! HTTP routes. `ops` holds health, info, models, metrics and the OpenAPI document; the
//! generation routes (LMI, TGI, OpenAI) are merged in by [`generation_routes`]; `crate::router` joins them.

use std::sync::Arc;

use axum::Router;

use crate::app::AppState;

mod adapters;
mod chat;
mod chat_call;
mod embed;
mod lmi;
mod messages;
mod openai;
pub mod ops;
mod rerank;
mod respond;
mod responses;
mod tgi;

/// LMI /invocations, /predictions/{model}; TGI POST /, /generate, /generate_stream, /tokenize;
/// OpenAI /v1/chat/completions, /v1/completions, /v1/responses; Anthropic /v1/messages; LMI's adapter management API; the chat page;
/// the embedding and scoring routes (`embed`: /v1/embeddings, TEI /embed, /embed_sparse,
/// /similarity; `rerank`: /rerank, /v1/rerank, /v2/rerank, /score, /v1/score, /predict). (GET /
/// is TGI's health check, in `ops`.)
pub fn generation_routes() -> Router<Arc<AppState>> {
    Router::new()
        .merge(lmi::routes())
        .merge(tgi::routes())
        .merge(openai::routes())
        .merge(responses::routes())
        .merge(messages::routes())
        .merge(adapters::routes())
        .merge(chat::routes())
        .merge(embed::routes())
        .merge(rerank::routes())
}
