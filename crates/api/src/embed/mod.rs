//! Embedding routes' wire formats: OpenAI's `/v1/embeddings`, TEI's `/embed`, `/embed_sparse`
//! and `/similarity`, and LMI's `{"inputs"}` on an embedding model (`/invocations`), plus the
//! refusal that names the routes a model serves.
//!
//! Requests parse into [`EmbedInput`]s and options; the server embeds them and the formatters
//! here render each schema's body.

pub mod format;
pub mod request;

pub use request::{
    EmbedInput, EmbeddingsRequest, EncodingFormat, SimilarityRequest, TeiEmbedRequest, Truncate,
    parse_embeddings_request, parse_lmi_embed, parse_similarity_request, parse_tei_embed,
};

use crate::error::ApiError;

/// What a model is served for, as the routes see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Generation,
    Embedding,
    Scoring,
}

impl Served {
    /// The routes that answer for a model of this kind.
    pub fn routes(self) -> &'static str {
        match self {
            Served::Generation => {
                "POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, \
                 /generate, /generate_stream and /invocations"
            }
            Served::Embedding => {
                "POST /v1/embeddings, /embed, /similarity, /score, /v1/rerank and /invocations \
                 ({\"inputs\": ...})"
            }
            Served::Scoring => {
                "POST /rerank, /v1/rerank, /v2/rerank, /score, /predict and /invocations \
                 ({\"query\", \"texts\"})"
            }
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Served::Generation => "a text-generation model",
            Served::Embedding => "an embedding model",
            Served::Scoring => "a scoring (reranker / classifier) model",
        }
    }
}

/// The 400 for `route` on a model served for `served`: it names the routes that work.
pub fn wrong_task(route: &str, served: Served) -> ApiError {
    wrong_body(&format!("{route} serves {}", route_task(route)), served)
}

/// The 400 for a request (`what` it needs, e.g. "a `messages` body needs a text-generation
/// model") on a model served for `served`.
pub fn wrong_body(what: &str, served: Served) -> ApiError {
    ApiError::wrong_task(format!(
        "{what}, but this server runs {}: use {}",
        served.noun(),
        served.routes()
    ))
}

fn route_task(route: &str) -> &'static str {
    match route {
        "/v1/embeddings" | "/embed" | "/similarity" => "embedding models",
        "/predict" => "sequence classifiers",
        "/embed_sparse" => "sparse embeddings (models with a SPLADE head)",
        "/rerank" | "/v1/rerank" | "/v2/rerank" | "/score" | "/v1/score" => {
            "rerankers and embedding models"
        }
        _ => "text generation",
    }
}
