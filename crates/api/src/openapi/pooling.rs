//! The embedding and scoring routes' components and paths: OpenAI `/v1/embeddings`, TEI
//! (`/embed`, `/embed_sparse`, `/similarity`, `/rerank`, `/predict`), Cohere / Jina / vLLM rerank
//! (`/v1/rerank`, `/v2/rerank`, `/rerank` with `documents`) and vLLM's `/score`. On a model
//! served for another task each answers 400 naming the routes it serves.

use serde_json::{Map, Value, json};

use super::reference as r;

const JSON: &str = "application/json";

fn texts() -> Value {
    json!({"type": "array", "items": {"type": "string"}})
}

fn ids() -> Value {
    json!({"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}})
}

fn embed_input(desc: &str) -> Value {
    json!({"description": desc, "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "items": {"oneOf": [{"type": "string", "minLength": 1}, ids()]}},
        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}}
    ]})
}

fn truncation() -> Value {
    json!({"type": "string", "enum": ["Left", "Right", "left", "right"], "default": "Right"})
}

fn tei_truncate() -> Value {
    json!({"type": "boolean", "nullable": true, "default": false,
        "description": "Cut an input over the model's limit (else 422 naming the limit)"})
}

fn score_value() -> Value {
    json!({"type": "number"})
}

pub fn schemas(s: &mut Map<String, Value>) {
    let mut add = |name: &str, v: Value| {
        s.insert(name.to_string(), v);
    };
    add(
        "EmbeddingsRequest",
        json!({"type": "object", "required": ["input"],
        "description": "OpenAI embeddings. `dimensions` keeps the leading dimensions and \
            renormalizes, on a model trained for it (Matryoshka; else 400). `user` is ignored.",
        "properties": {
        "input": embed_input("Text, texts, token ids or lists of token ids"),
        "model": {"type": "string"},
        "encoding_format": {"type": "string", "enum": ["float", "base64"], "default": "float",
            "description": "base64: each vector's little-endian f32 bytes"},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": {"type": "string"},
        "truncate_prompt_tokens": {"type": "integer", "minimum": -1,
            "description": "vLLM: -1 cuts inputs to the model's limit"}},
        "example": {"input": ["What is Deep Learning?"], "model": "m"}}),
    );
    add(
        "EmbeddingList",
        json!({"type": "object", "required": ["object", "data", "model", "usage"],
        "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": {"type": "object",
            "required": ["object", "index", "embedding"], "properties": {
            "object": {"type": "string", "enum": ["embedding"]},
            "index": {"type": "integer", "minimum": 0},
            "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}},
        "model": {"type": "string"},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
            "prompt_tokens": {"type": "integer", "minimum": 0},
            "total_tokens": {"type": "integer", "minimum": 0}}}}}),
    );
    add(
        "EmbedRequest",
        json!({"type": "object", "required": ["inputs"],
        "description": "TEI embed. `normalize` defaults to true; `prompt_name` names a prompt \
            of the model's config_sentence_transformers.json.",
        "properties": {
        "inputs": embed_input("Text, texts, or token ids"),
        "normalize": {"type": "boolean", "default": true},
        "truncate": tei_truncate(),
        "truncation_direction": truncation(),
        "prompt_name": {"type": "string", "nullable": true},
        "dimensions": {"type": "integer", "minimum": 1, "nullable": true}},
        "example": {"inputs": "What is Deep Learning?"}}),
    );
    add(
        "EmbedResponse",
        json!({"type": "array", "description": "One vector per input (a single input too)",
        "items": {"type": "array", "items": {"type": "number"}}}),
    );
    add(
        "SimilarityRequest",
        json!({"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"type": "object", "required": ["source_sentence", "sentences"], "properties": {
            "source_sentence": {"type": "string", "minLength": 1},
            "sentences": {"type": "array", "minItems": 1, "items": {"type": "string"}}}},
        "parameters": {"type": "object", "nullable": true, "properties": {
            "truncate": tei_truncate(),
            "truncation_direction": truncation(),
            "prompt_name": {"type": "string", "nullable": true}}}},
        "example": {"inputs": {"source_sentence": "What is Deep Learning?",
            "sentences": ["Deep Learning is ..."]}}}),
    );
    add(
        "SimilarityResponse",
        json!({"type": "array", "description": "Cosine similarity of the source with each sentence",
        "items": {"type": "number"}}),
    );
    add(
        "TeiRerankRequest",
        json!({"type": "object", "required": ["query", "texts"],
        "description": "TEI rerank: scores are the sigmoid of the model's logit unless \
            `raw_scores`.",
        "properties": {
        "query": {"type": "string", "minLength": 1},
        "texts": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "raw_scores": {"type": "boolean", "default": false},
        "return_text": {"type": "boolean", "default": false},
        "truncate": tei_truncate(),
        "truncation_direction": truncation()},
        "example": {"query": "What is Deep Learning?", "texts": ["Deep Learning is ..."]}}),
    );
    add(
        "TeiRerankResponse",
        json!({"type": "array", "description": "Highest score first",
        "items": {"type": "object", "required": ["index", "score"], "properties": {
            "index": {"type": "integer", "minimum": 0},
            "text": {"type": "string"},
            "score": score_value()}}}),
    );
    add(
        "RerankRequest",
        json!({"type": "object", "required": ["query", "documents"],
        "description": "Cohere (v1, v2), Jina and vLLM rerank. Documents are strings or \
            objects with `text` (returned as sent). `return_documents` defaults to true; \
            `top_n` 0 or absent returns all. Inputs over the model's limit are cut to it.",
        "properties": {
        "query": {"type": "string", "minLength": 1},
        "documents": {"type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "string"},
            {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}]}},
        "top_n": {"type": "integer", "minimum": 0},
        "return_documents": {"type": "boolean", "default": true},
        "model": {"type": "string"},
        "rank_fields": {"type": "array", "items": {"type": "string", "enum": ["text"]}},
        "max_chunks_per_doc": {"type": "integer"},
        "max_tokens_per_doc": {"type": "integer"},
        "use_activation": {"type": "boolean", "default": true},
        "truncate_prompt_tokens": {"type": "integer", "minimum": -1}},
        "example": {"query": "What is Deep Learning?", "documents": ["Deep Learning is ..."], "top_n": 1}}),
    );
    add(
        "RerankResponse",
        json!({"type": "object", "required": ["id", "model", "results", "usage"],
        "description": "Highest relevance first.",
        "properties": {
        "id": {"type": "string"},
        "model": {"type": "string"},
        "results": {"type": "array", "items": {"type": "object",
            "required": ["index", "relevance_score"], "properties": {
            "index": {"type": "integer", "minimum": 0},
            "relevance_score": score_value(),
            "document": {"type": "object", "required": ["text"], "properties": {
                "text": {"type": "string"}}}}}},
        "usage": {"type": "object", "required": ["total_tokens"], "properties": {
            "prompt_tokens": {"type": "integer", "minimum": 0},
            "total_tokens": {"type": "integer", "minimum": 0}}},
        "meta": {"type": "object", "properties": {
            "api_version": {"type": "object", "properties": {"version": {"type": "string"}}},
            "tokens": {"type": "object", "properties": {
                "input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}}}}}}}),
    );
    let side = || json!({"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]});
    add(
        "ScoreRequest",
        json!({"type": "object", "required": ["text_1", "text_2"],
        "description": "vLLM score: one text_1 against every text_2, or pairs in order \
            (`queries`/`documents`, `queries`/`items` and `data_1`/`data_2` are read too). A \
            reranker's score is the sigmoid of its logit (`use_activation`); an embedding \
            model's is the cosine of the two vectors.",
        "properties": {
        "text_1": side(), "text_2": side(), "model": {"type": "string"},
        "use_activation": {"type": "boolean", "default": true},
        "truncate_prompt_tokens": {"type": "integer", "minimum": -1}},
        "example": {"text_1": "What is Deep Learning?", "text_2": ["Deep Learning is ..."]}}),
    );
    add(
        "ScoreResponse",
        json!({"type": "object", "required": ["id", "object", "created", "model", "data", "usage"],
        "properties": {
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["list"]},
        "created": {"type": "integer", "minimum": 0},
        "model": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object",
            "required": ["index", "object", "score"], "properties": {
            "index": {"type": "integer", "minimum": 0},
            "object": {"type": "string", "enum": ["score"]},
            "score": score_value()}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
            "prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"},
            "completion_tokens": {"type": "integer"}}}}}),
    );
    let pair = json!({"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}});
    add(
        "PredictRequest",
        json!({"type": "object", "required": ["inputs"],
        "description": "TEI predict: a text, a pair [text, text] (cross-encoders), or a batch \
            of [text] and [text, text]. Scores are the softmax over the labels (the sigmoid of \
            a single logit) unless `raw_scores`.",
        "properties": {
        "inputs": {"oneOf": [{"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
            {"type": "array", "minItems": 1, "items": pair}]},
        "raw_scores": {"type": "boolean", "default": false},
        "truncate": tei_truncate(),
        "truncation_direction": truncation()},
        "example": {"inputs": "I like you."}}),
    );
    let prediction = json!({"type": "array", "items": {"type": "object",
        "required": ["score", "label"], "properties": {
        "score": score_value(), "label": {"type": "string"}}}});
    add(
        "PredictResponse",
        json!({"description": "Per input, its labels by score (highest first); a batch is a \
            list of those", "oneOf": [prediction.clone(), {"type": "array", "items": prediction}]}),
    );
    add(
        "LmiScoreRequest",
        json!({"description": "LMI on a reranker: `{query, texts}`, a pair (`{text, text_pair}` \
            or `{key, value}`), or a list of pairs",
        "oneOf": [
        {"type": "object", "required": ["query", "texts"], "properties": {
            "query": {"type": "string"}, "texts": texts()}},
        {"type": "object", "required": ["text", "text_pair"], "properties": {
            "text": {"type": "string"}, "text_pair": {"type": "string"}}},
        {"type": "object", "required": ["key", "value"], "properties": {
            "key": {"type": "string"}, "value": {"type": "string"}}},
        {"type": "array", "items": {"type": "object"}}]}),
    );
    add(
        "LmiScores",
        json!({"description": "LMI on a reranker: each pair's scores (one per label, after \
            the sigmoid); a list of them for `{query, texts}` or a list of pairs",
        "oneOf": [{"type": "array", "items": {"type": "number"}},
            {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}]}),
    );
}

fn response(desc: &str, media: &str, schema: Value) -> Value {
    json!({"description": desc, "content": {media: {"schema": schema}}})
}

/// The statuses of a pooling route whose errors are `error`: 413 is JSON naming the input
/// limit, or text from the body limit; the guard layers' 401 / 408 / 414 / 431.
fn errors(error: Value, extra: &[(&str, &str)], responses: &mut Map<String, Value>) {
    let e = |desc: &str| response(desc, JSON, error.clone());
    for (code, desc) in extra {
        responses.insert((*code).into(), e(desc));
    }
    for (code, desc) in [
        ("424", "The model failed on the input"),
        ("429", "Model is overloaded (max_concurrent_requests)"),
        ("503", "Model not loaded yet, or the scheduler stopped"),
        ("401", "API key missing or wrong (option.api_key)"),
        ("408", "Over option.request_timeout"),
        ("414", "Request target over option.max_uri_bytes"),
        ("431", "Headers over option.max_header_bytes"),
    ] {
        responses.insert(code.into(), e(desc));
    }
    responses.insert(
        "413".into(),
        json!({"description": "More inputs than option.max_client_batch_size (JSON), or a body \
            over max_request_size (text)",
            "content": {JSON: {"schema": error}, "text/plain": {"schema": {"type": "string"}}}}),
    );
}

fn route(
    tag: &str,
    summary: &str,
    req: Value,
    ok: Value,
    error: Value,
    extra: &[(&str, &str)],
) -> Value {
    let mut responses = Map::new();
    responses.insert("200".into(), response("OK", JSON, ok));
    errors(error, extra, &mut responses);
    json!({"post": {"tags": [tag], "summary": summary, "responses": responses,
        "requestBody": {"required": true, "content": {JSON: {"schema": req}}},
        "security": [{}, {"bearer": []}, {"apiKey": []}]}})
}

const OPENAI_400: (&str, &str) = (
    "400",
    "Bad request: not JSON, a wrong field, an empty input, or a route this model does not serve",
);
const TEI_400: (&str, &str) = (
    "400",
    "Not JSON, an empty input, or a route this model does not serve",
);
const TEI_422: (&str, &str) = ("422", "Input validation error");

pub fn paths(p: &mut Map<String, Value>) {
    let oai = || r("ResponsesError");
    let tei = || r("ErrorResponse");
    p.insert(
        "/v1/embeddings".into(),
        route(
            "OpenAI",
            "OpenAI embeddings",
            r("EmbeddingsRequest"),
            r("EmbeddingList"),
            oai(),
            &[OPENAI_400],
        ),
    );
    p.insert(
        "/embed".into(),
        route(
            "TEI",
            "TEI embed",
            r("EmbedRequest"),
            r("EmbedResponse"),
            tei(),
            &[TEI_400, TEI_422],
        ),
    );
    p.insert(
        "/embed_sparse".into(),
        route(
            "TEI",
            "TEI sparse embeddings: 400, no model here has a sparse head yet",
            r("EmbedRequest"),
            json!({"type": "array"}),
            tei(),
            &[TEI_400, TEI_422],
        ),
    );
    p.insert(
        "/similarity".into(),
        route(
            "TEI",
            "TEI sentence similarity",
            r("SimilarityRequest"),
            r("SimilarityResponse"),
            tei(),
            &[TEI_400, TEI_422],
        ),
    );
    p.insert(
        "/predict".into(),
        route(
            "TEI",
            "TEI predict (sequence classification)",
            r("PredictRequest"),
            r("PredictResponse"),
            tei(),
            &[TEI_400, TEI_422],
        ),
    );
    p.insert(
        "/rerank".into(),
        route(
            "TEI",
            "Rerank: TEI's answer for `texts`, Cohere's / Jina's / vLLM's for `documents`",
            json!({"oneOf": [r("TeiRerankRequest"), r("RerankRequest")]}),
            json!({"oneOf": [r("TeiRerankResponse"), r("RerankResponse")]}),
            json!({"anyOf": [r("ErrorResponse"), r("ResponsesError")]}),
            &[TEI_400, TEI_422],
        ),
    );
    for (path, summary) in [
        ("/v1/rerank", "Rerank (Cohere v1, Jina, vLLM)"),
        ("/v2/rerank", "Rerank (Cohere v2, vLLM)"),
    ] {
        p.insert(
            path.into(),
            route(
                "Rerank",
                summary,
                r("RerankRequest"),
                r("RerankResponse"),
                oai(),
                &[OPENAI_400],
            ),
        );
    }
    for path in ["/score", "/v1/score"] {
        p.insert(
            path.into(),
            route(
                "Rerank",
                "Score pairs (vLLM)",
                r("ScoreRequest"),
                r("ScoreResponse"),
                oai(),
                &[OPENAI_400],
            ),
        );
    }
}
