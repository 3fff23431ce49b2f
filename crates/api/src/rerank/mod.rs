//! Scoring routes' wire formats: TEI's `/rerank` and `/predict`, the Cohere / Jina / vLLM
//! rerank (`/v1/rerank`, `/v2/rerank`, `/rerank` with `documents`), vLLM's `/score`, and LMI's
//! cross-encoder answer on `/invocations`.
//!
//! A scoring model gives raw values per input (one logit, or one per label); the activation
//! each schema applies (sigmoid for one value, softmax over labels) is here, with the
//! formatters.

pub mod format;
pub mod request;

pub use request::{
    Document, LmiScoreRequest, PredictInput, PredictRequest, RerankRequest, ScoreRequest,
    TeiRerankRequest, is_tei_rerank, parse_lmi_score, parse_predict, parse_rerank, parse_score,
    parse_tei_rerank,
};

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// A scoring model's probabilities from its raw values: the sigmoid of a single logit
/// (CrossEncoder's default for one label, TEI's and vLLM's), a softmax over several labels.
pub fn activate(values: &[f32]) -> Vec<f32> {
    if values.len() == 1 {
        return vec![sigmoid(values[0])];
    }
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = values.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// Indices of `scores` from the highest score down; equal scores keep their input order.
pub fn ranking(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order
}
