//! `GET /info` (TGI >= 2.1 field set and order).

use crate::error::compact;
use serde::Serialize;

/// What the server knows about itself; serialized as TGI's `Info`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InfoIn {
    pub model_id: String,
    pub model_sha: Option<String>,
    pub model_pipeline_tag: Option<String>,
    /// TGI 2.0's fields, kept for clients that read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_device_type: Option<String>,
    pub max_concurrent_requests: usize,
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub validation_workers: usize,
    pub max_client_batch_size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_prefill_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_top_n_tokens: Option<usize>,
    /// Structured output (`grammar`, `response_format`, forced tool calls) is available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar_support: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_grammar_bytes: Option<usize>,
    pub router: String,
    pub version: String,
    pub sha: Option<String>,
    pub docker_label: Option<String>,
}

impl InfoIn {
    /// TGI's router defaults for everything but the model and the token limits.
    pub fn new(
        model_id: impl Into<String>,
        max_input_tokens: usize,
        max_total_tokens: usize,
        version: impl Into<String>,
    ) -> Self {
        Self {
            model_id: model_id.into(),
            model_sha: None,
            model_pipeline_tag: Some("text-generation".into()),
            model_dtype: None,
            model_device_type: None,
            max_concurrent_requests: 128,
            max_best_of: 2,
            max_stop_sequences: 4,
            max_input_tokens,
            max_total_tokens,
            validation_workers: 2,
            max_client_batch_size: 4,
            max_batch_size: None,
            max_batch_prefill_tokens: None,
            max_top_n_tokens: None,
            grammar_support: None,
            max_grammar_bytes: None,
            router: "text-generation-router".into(),
            version: version.into(),
            sha: None,
            docker_label: None,
        }
    }
}

/// `GET /info` body.
pub fn info(info: &InfoIn) -> String {
    compact(info)
}
