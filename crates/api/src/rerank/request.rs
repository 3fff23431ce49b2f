//! Scoring request bodies: TEI's `/rerank` and `/predict`, the Cohere / Jina / vLLM rerank
//! body (`/v1/rerank`, `/v2/rerank`, and `/rerank` with `documents`), vLLM's `/score`, and the
//! pair forms LMI's (DJL's) cross-encoder handler reads on `/invocations`.

use serde_json::{Map, Value};

use crate::embed::Truncate;
use crate::error::ApiError;
use crate::fields::{Fields, Res, type_name};

/// TEI's `POST /rerank` (`texts`).
#[derive(Debug, Clone, PartialEq)]
pub struct TeiRerankRequest {
    pub query: String,
    pub texts: Vec<String>,
    pub truncate: Truncate,
    pub raw_scores: bool,
    pub return_text: bool,
}

/// A document to rank: its text, and the object it came in when it was one (Cohere returns
/// such a document with all its fields).
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub text: String,
    pub object: Option<Map<String, Value>>,
}

/// The Cohere (v1, v2), Jina and vLLM rerank body.
#[derive(Debug, Clone, PartialEq)]
pub struct RerankRequest {
    pub query: String,
    pub documents: Vec<Document>,
    /// The best `top_n` results (None, or vLLM's 0: all).
    pub top_n: Option<usize>,
    /// Default true (Jina, vLLM); Cohere v1 clients send false to leave them out.
    pub return_documents: bool,
    pub model: Option<String>,
    /// vLLM's `use_activation` (default true): the sigmoid of a single logit.
    pub activation: bool,
    /// vLLM's `truncate_prompt_tokens` (-1: the model's limit). Absent, long documents are
    /// truncated to the model's limit, as Cohere does.
    pub truncate_prompt_tokens: Option<i64>,
    pub unknown: Vec<String>,
}

/// vLLM's `POST /score`: the pairs to score, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreRequest {
    pub pairs: Vec<(String, String)>,
    pub model: Option<String>,
    pub activation: bool,
    /// Absent: an input over the model's limit is refused, as vLLM does.
    pub truncate_prompt_tokens: Option<i64>,
    pub unknown: Vec<String>,
}

/// One `/predict` input: a text, or a pair for a cross-encoder.
#[derive(Debug, Clone, PartialEq)]
pub enum PredictInput {
    Single(String),
    Pair(String, String),
}

/// TEI's `POST /predict`.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictRequest {
    pub inputs: Vec<PredictInput>,
    /// The body sent a batch (`[[...], ...]`): the answer is a list per input.
    pub batch: bool,
    pub truncate: Truncate,
    pub raw_scores: bool,
}

/// LMI's cross-encoder body: `{"query", "texts"}`, a pair object (`{"text", "text_pair"}` or
/// `{"key", "value"}`), or a list of pair objects.
#[derive(Debug, Clone, PartialEq)]
pub struct LmiScoreRequest {
    pub pairs: Vec<(String, String)>,
    /// A list answer (`query` + `texts`, or a list of pairs) rather than one pair's scores.
    pub batch: bool,
}

/// A rerank body in TEI's shape (`texts`) rather than Cohere's (`documents`); `/rerank`
/// answers each in its own shape.
pub fn is_tei_rerank(body: &Value) -> bool {
    body.get("texts").is_some() && body.get("documents").is_none()
}

fn query(f: &Fields<'_>) -> Res<String> {
    match f.str("query")? {
        Some("") => Err(ApiError::empty_input(
            "`query` is an empty string: send the query to rank against",
        )
        .with_param("query")),
        Some(q) => Ok(q.to_string()),
        None => Err(
            ApiError::invalid_body("`query` is required: the text to rank against")
                .with_param("query"),
        ),
    }
}

fn required_list<'a>(f: &Fields<'a>, key: &str, what: &str) -> Res<&'a [Value]> {
    match f.get(key) {
        Some(Value::Array(items)) if items.is_empty() => Err(ApiError::empty_input(format!(
            "`{key}` cannot be empty: send at least one {what}"
        ))
        .with_param(key)),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(f.type_err(key, &format!("a list of {what}s"), other)),
        None => Err(
            ApiError::invalid_body(format!("`{key}` is required: a list of {what}s"))
                .with_param(key),
        ),
    }
}

fn strings(f: &Fields<'_>, key: &str, items: &[Value]) -> Res<Vec<String>> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.clone()),
            other => Err(f.type_err(&format!("{key}[{i}]"), "a string", other)),
        })
        .collect()
}

/// TEI's `truncate` / `truncation_direction` (refuse by default).
fn tei_truncate(f: &Fields<'_>) -> Res<Truncate> {
    let left = match f.str("truncation_direction")? {
        None => false,
        Some(d) if d.eq_ignore_ascii_case("right") => false,
        Some(d) if d.eq_ignore_ascii_case("left") => true,
        Some(d) => {
            return Err(f.range_err(
                "truncation_direction",
                format!("must be \"Left\" or \"Right\", got {d:?}"),
            ));
        }
    };
    Ok(match f.bool("truncate")? {
        Some(true) if left => Truncate::Left,
        Some(true) => Truncate::Right,
        _ => Truncate::Refuse,
    })
}

/// vLLM's `use_activation`, with its older names `activation` and `softmax`.
fn activation(f: &Fields<'_>) -> Res<bool> {
    for key in ["use_activation", "activation", "softmax"] {
        if let Some(b) = f.bool(key)? {
            return Ok(b);
        }
    }
    Ok(true)
}

fn truncate_prompt_tokens(f: &Fields<'_>) -> Res<Option<i64>> {
    match f.i64("truncate_prompt_tokens")? {
        Some(t) if t < -1 || t == 0 => Err(f.range_err(
            "truncate_prompt_tokens",
            format!("must be -1 (the model's limit) or a positive integer, got {t}"),
        )),
        t => Ok(t),
    }
}

pub fn parse_tei_rerank(body: &Value) -> Res<TeiRerankRequest> {
    let f = Fields::body(body)?;
    let query = query(&f)?;
    let items = required_list(&f, "texts", "text")?;
    Ok(TeiRerankRequest {
        query,
        texts: strings(&f, "texts", items)?,
        truncate: tei_truncate(&f)?,
        raw_scores: f.bool("raw_scores")?.unwrap_or(false),
        return_text: f.bool("return_text")?.unwrap_or(false),
    })
}

pub fn parse_rerank(body: &Value) -> Res<RerankRequest> {
    let f = Fields::body(body)?;
    let query = query(&f)?;
    let items = required_list(&f, "documents", "document")?;
    let documents = items
        .iter()
        .enumerate()
        .map(|(i, v)| document(&f, i, v))
        .collect::<Res<Vec<_>>>()?;
    let top_n = match f.i64("top_n")? {
        Some(n) if n < 0 => {
            return Err(f.range_err(
                "top_n",
                format!("must be a positive integer (or 0 for all), got {n}"),
            ));
        }
        Some(0) | None => None,
        Some(n) => Some(n as usize),
    };
    if let Some(fields) = f.strings("rank_fields")?
        && fields.iter().any(|k| k != "text")
    {
        return Err(ApiError::not_supported(format!(
            "`rank_fields` {fields:?} is not supported: documents are ranked by their `text`; \
             put what to rank there"
        ))
        .with_param("rank_fields"));
    }
    Ok(RerankRequest {
        query,
        documents,
        top_n,
        return_documents: f.bool("return_documents")?.unwrap_or(true),
        model: f.str("model")?.map(str::to_string),
        activation: activation(&f)?,
        truncate_prompt_tokens: truncate_prompt_tokens(&f)?,
        unknown: f.unknown(&[
            "query",
            "documents",
            "top_n",
            "return_documents",
            "model",
            "rank_fields",
            "max_chunks_per_doc",
            "max_tokens_per_doc",
            "use_activation",
            "activation",
            "softmax",
            "truncate_prompt_tokens",
            "priority",
        ]),
    })
}

/// A document: a string, or an object with a `text` string (Cohere, Jina).
fn document(f: &Fields<'_>, i: usize, v: &Value) -> Res<Document> {
    let at = format!("documents[{i}]");
    match v {
        Value::String(s) => Ok(Document {
            text: s.clone(),
            object: None,
        }),
        Value::Object(m) => match m.get("text") {
            Some(Value::String(s)) => Ok(Document {
                text: s.clone(),
                object: Some(m.clone()),
            }),
            Some(other) => Err(f.type_err(&format!("{at}.text"), "a string", other)),
            None => Err(ApiError::invalid_body(format!(
                "{at} is an object without `text`: send the document's text as `text` (or the \
                 document as a string)"
            ))
            .with_param(at)),
        },
        other => Err(f.type_err(&at, "a string or an object with `text`", other)),
    }
}

/// The two sides of a score request under any of vLLM's names.
const SCORE_SIDES: [(&str, &str); 4] = [
    ("text_1", "text_2"),
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
];

pub fn parse_score(body: &Value) -> Res<ScoreRequest> {
    let f = Fields::body(body)?;
    let Some((k1, k2)) = SCORE_SIDES
        .into_iter()
        .find(|(a, b)| f.get(a).is_some() && f.get(b).is_some())
    else {
        return Err(ApiError::invalid_body(
            "`text_1` and `text_2` are required: a string or a list of strings each (one \
             text_1 against every text_2, or pairs in order)",
        )
        .with_param("text_1"));
    };
    let side = |key: &str| -> Res<Vec<String>> {
        let list = f.strings(key)?.unwrap_or_default();
        if list.is_empty() {
            return Err(ApiError::empty_input(format!(
                "`{key}` cannot be empty: send at least one text"
            ))
            .with_param(key));
        }
        Ok(list)
    };
    let (a, b) = (side(k1)?, side(k2)?);
    let pairs = if a.len() == 1 {
        b.into_iter().map(|d| (a[0].clone(), d)).collect()
    } else if a.len() == b.len() {
        a.into_iter().zip(b).collect()
    } else {
        return Err(ApiError::validation(format!(
            "`{k1}` has {} texts and `{k2}` has {}: send one {k1} (scored against every {k2}) \
             or as many as {k2} (scored in pairs)",
            a.len(),
            b.len()
        ))
        .with_param(k1));
    };
    Ok(ScoreRequest {
        pairs,
        model: f.str("model")?.map(str::to_string),
        activation: activation(&f)?,
        truncate_prompt_tokens: truncate_prompt_tokens(&f)?,
        unknown: f.unknown(&[
            "text_1",
            "text_2",
            "queries",
            "documents",
            "items",
            "data_1",
            "data_2",
            "model",
            "use_activation",
            "activation",
            "softmax",
            "truncate_prompt_tokens",
            "priority",
        ]),
    })
}

pub fn parse_predict(body: &Value) -> Res<PredictRequest> {
    let f = Fields::body(body)?;
    let want = "a string, a pair [string, string], or a list of [string] and [string, string]";
    let (inputs, batch) = match f.get("inputs") {
        Some(Value::String(s)) => (vec![PredictInput::Single(s.clone())], false),
        // A list that starts with a string is one input: a text or a pair (TEI's reading).
        Some(Value::Array(items)) if items.first().is_some_and(Value::is_string) => {
            (vec![predict_input(&f, "inputs", items)?], false)
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::empty_input(
                "`inputs` cannot be an empty list: send a text, a pair or a list of them",
            )
            .with_param("inputs"));
        }
        Some(Value::Array(items)) => {
            let batch = items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let at = format!("inputs[{i}]");
                    match v {
                        Value::Array(inner) => predict_input(&f, &at, inner),
                        other => Err(f.type_err(&at, "[string] or [string, string]", other)),
                    }
                })
                .collect::<Res<Vec<_>>>()?;
            (batch, true)
        }
        Some(other) => return Err(f.type_err("inputs", want, other)),
        None => {
            return Err(
                ApiError::invalid_body(format!("`inputs` is required: {want}"))
                    .with_param("inputs"),
            );
        }
    };
    if inputs
        .iter()
        .any(|i| matches!(i, PredictInput::Single(s) if s.is_empty()))
    {
        return Err(ApiError::empty_input(
            "`inputs` holds an empty string: send the text to classify",
        )
        .with_param("inputs"));
    }
    Ok(PredictRequest {
        inputs,
        batch,
        truncate: tei_truncate(&f)?,
        raw_scores: f.bool("raw_scores")?.unwrap_or(false),
    })
}

fn predict_input(f: &Fields<'_>, at: &str, items: &[Value]) -> Res<PredictInput> {
    let texts = strings(f, at, items)?;
    match <[String; 2]>::try_from(texts) {
        Ok([a, b]) => Ok(PredictInput::Pair(a, b)),
        Err(mut texts) if texts.len() == 1 => Ok(PredictInput::Single(texts.remove(0))),
        Err(texts) => Err(ApiError::validation(format!(
            "`{at}` has {} strings: send one text or a pair of two",
            texts.len()
        ))
        .with_param(at)),
    }
}

/// LMI's (DJL's) cross-encoder forms.
pub fn parse_lmi_score(body: &Value) -> Res<LmiScoreRequest> {
    match body {
        Value::Array(items) if items.is_empty() => Err(ApiError::empty_input(
            "the list of pairs is empty: send at least one {\"text\", \"text_pair\"}",
        )),
        Value::Array(items) => {
            let pairs = items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Object(m) => pair(&Fields::new(m, &format!("[{i}]"))),
                    other => Err(ApiError::invalid_body(format!(
                        "[{i}] must be an object {{\"text\", \"text_pair\"}}, got {}",
                        type_name(other)
                    ))),
                })
                .collect::<Res<Vec<_>>>()?;
            Ok(LmiScoreRequest { pairs, batch: true })
        }
        Value::Object(m) => {
            let f = Fields::new(m, "");
            if f.get("query").is_none() {
                return Ok(LmiScoreRequest {
                    pairs: vec![pair(&f)?],
                    batch: false,
                });
            }
            let q = query(&f)?;
            let items = required_list(&f, "texts", "text")?;
            let pairs = strings(&f, "texts", items)?
                .into_iter()
                .map(|t| (q.clone(), t))
                .collect();
            Ok(LmiScoreRequest { pairs, batch: true })
        }
        other => Err(ApiError::invalid_body(format!(
            "a reranker takes {{\"query\", \"texts\"}}, a pair {{\"text\", \"text_pair\"}} or a \
             list of pairs, got {}",
            type_name(other)
        ))),
    }
}

/// `{"text", "text_pair"}` or `{"key", "value"}`.
fn pair(f: &Fields<'_>) -> Res<(String, String)> {
    for (a, b) in [("text", "text_pair"), ("key", "value")] {
        if let (Some(x), Some(y)) = (f.str(a)?, f.str(b)?) {
            return Ok((x.to_string(), y.to_string()));
        }
    }
    Err(ApiError::invalid_body(format!(
        "{}a reranker takes {{\"query\", \"texts\"}}, {{\"text\", \"text_pair\"}} or {{\"key\", \
         \"value\"}}",
        if f.path("").is_empty() {
            String::new()
        } else {
            format!("{}: ", f.path("").trim_end_matches('.'))
        }
    )))
}
