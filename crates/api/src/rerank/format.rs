//! Scoring response bodies.

use serde::Serialize;
use serde_json::{Map, Value};

use super::ranking;
use super::request::Document;
use crate::error::compact;

#[derive(Serialize)]
struct Rank<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    score: f32,
}

/// TEI's `/rerank` answer: `[{"index", "text"?, "score"}]`, highest score first; `texts` given
/// (`return_text`) puts each text in.
pub fn tei_rerank(scores: &[f32], texts: Option<&[String]>) -> String {
    let ranks: Vec<Rank<'_>> = ranking(scores)
        .into_iter()
        .map(|index| Rank {
            index,
            text: texts.and_then(|t| t.get(index)).map(String::as_str),
            score: scores[index],
        })
        .collect();
    compact(&ranks)
}

/// What the Cohere / Jina / vLLM rerank answer carries besides the results.
pub struct RerankMeta<'a> {
    pub id: &'a str,
    pub model: &'a str,
    pub prompt_tokens: usize,
    /// Cohere's `meta.api_version.version`: "1" on `/v1/rerank` and `/rerank`, "2" on
    /// `/v2/rerank`.
    pub api_version: &'a str,
}

#[derive(Serialize)]
struct RerankResult {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<Value>,
}

#[derive(Serialize)]
struct RerankUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct ApiVersion<'a> {
    version: &'a str,
}

#[derive(Serialize)]
struct Tokens {
    input_tokens: usize,
    output_tokens: usize,
}

#[derive(Serialize)]
struct CohereMeta<'a> {
    api_version: ApiVersion<'a>,
    tokens: Tokens,
}

#[derive(Serialize)]
struct RerankBody<'a> {
    id: &'a str,
    model: &'a str,
    results: Vec<RerankResult>,
    usage: RerankUsage,
    meta: CohereMeta<'a>,
}

/// `{"id", "model", "results": [{"index", "relevance_score", "document"?}], "usage", "meta"}`,
/// highest score first, the best `top_n`: what the cohere SDK (`Client.rerank`,
/// `ClientV2.rerank`), Jina's and vLLM's clients read. A document sent as an object comes back
/// as sent; a string comes back as `{"text"}`.
pub fn rerank(
    scores: &[f32],
    documents: Option<&[Document]>,
    top_n: Option<usize>,
    meta: &RerankMeta<'_>,
) -> String {
    let results = ranking(scores)
        .into_iter()
        .take(top_n.unwrap_or(usize::MAX))
        .map(|index| RerankResult {
            index,
            relevance_score: scores[index],
            document: documents.and_then(|d| d.get(index)).map(document_json),
        })
        .collect();
    compact(&RerankBody {
        id: meta.id,
        model: meta.model,
        results,
        usage: RerankUsage {
            prompt_tokens: meta.prompt_tokens,
            total_tokens: meta.prompt_tokens,
        },
        meta: CohereMeta {
            api_version: ApiVersion {
                version: meta.api_version,
            },
            tokens: Tokens {
                input_tokens: meta.prompt_tokens,
                output_tokens: 0,
            },
        },
    })
}

fn document_json(d: &Document) -> Value {
    match &d.object {
        Some(m) => Value::Object(m.clone()),
        None => {
            let mut m = Map::new();
            m.insert("text".into(), Value::String(d.text.clone()));
            Value::Object(m)
        }
    }
}

#[derive(Serialize)]
struct ScoreData {
    index: usize,
    object: &'static str,
    score: f32,
}

#[derive(Serialize)]
struct ScoreUsage {
    prompt_tokens: usize,
    total_tokens: usize,
    completion_tokens: usize,
}

#[derive(Serialize)]
struct ScoreBody<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    data: Vec<ScoreData>,
    usage: ScoreUsage,
}

/// vLLM's `/score` answer: `{"id", "object": "list", "created", "model", "data": [{"index",
/// "object": "score", "score"}], "usage"}`, in the pairs' order.
pub fn score(scores: &[f32], id: &str, created: u64, model: &str, prompt_tokens: usize) -> String {
    compact(&ScoreBody {
        id,
        object: "list",
        created,
        model,
        data: scores
            .iter()
            .enumerate()
            .map(|(index, &score)| ScoreData {
                index,
                object: "score",
                score,
            })
            .collect(),
        usage: ScoreUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
            completion_tokens: 0,
        },
    })
}

#[derive(Serialize)]
struct Prediction<'a> {
    score: f32,
    label: &'a str,
}

/// TEI's `/predict` answer: per input `[{"score", "label"}]`, highest score first; a single
/// input's list alone, a batch's lists in a list. `labels` are the model's `id2label`, in
/// order (`LABEL_i` where it has none).
pub fn predict(rows: &[Vec<f32>], labels: &[String], batch: bool) -> String {
    let fallback: Vec<String> = (0..rows.iter().map(Vec::len).max().unwrap_or(0))
        .map(|i| format!("LABEL_{i}"))
        .collect();
    let per_input: Vec<Vec<Prediction<'_>>> = rows
        .iter()
        .map(|row| {
            ranking(row)
                .into_iter()
                .map(|i| Prediction {
                    score: row[i],
                    label: labels.get(i).unwrap_or(&fallback[i]),
                })
                .collect()
        })
        .collect();
    match (batch, per_input.first()) {
        (false, Some(one)) => compact(one),
        _ => compact(&per_input),
    }
}

/// LMI's (DJL's) cross-encoder answer: each pair's values (one per label, after the sigmoid);
/// a batch is a list of them.
pub fn lmi_scores(rows: &[Vec<f32>], batch: bool) -> String {
    match (batch, rows.first()) {
        (false, Some(one)) => compact(one),
        _ => compact(&rows),
    }
}
