//! Scoring requests (TEI, Cohere / Jina / vLLM, LMI) and their answers.

use lmi_api::embed::Truncate;
use lmi_api::rerank::{
    self, PredictInput, format, is_tei_rerank, parse_lmi_score, parse_predict, parse_rerank,
    parse_score, parse_tei_rerank,
};
use lmi_api::{ErrorKind, Schema};
use serde_json::{Value, json};

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn tei_rerank_request() {
    let body = json!({"query": "q", "texts": ["a", "b"], "raw_scores": true, "return_text": true,
        "truncate": true, "truncation_direction": "Left"});
    assert!(is_tei_rerank(&body));
    let r = parse_tei_rerank(&body).unwrap();
    assert_eq!((r.query.as_str(), r.texts.len()), ("q", 2));
    assert!(r.raw_scores && r.return_text);
    assert_eq!(r.truncate, Truncate::Left);
    let r = parse_tei_rerank(&json!({"query": "q", "texts": ["a"]})).unwrap();
    assert!(!r.raw_scores && !r.return_text);
    assert_eq!(r.truncate, Truncate::Refuse);

    let e = parse_tei_rerank(&json!({"query": "q", "texts": []})).unwrap_err();
    assert_eq!((e.status(Schema::Tgi), e.error_type()), (400, "empty"));
    assert!(e.message.contains("`texts` cannot be empty"), "{e}");
    let e = parse_tei_rerank(&json!({"query": "", "texts": ["a"]})).unwrap_err();
    assert_eq!(e.kind, ErrorKind::EmptyInput);
    let e = parse_tei_rerank(&json!({"query": "q", "texts": ["a", 1]})).unwrap_err();
    assert_eq!(e.status(Schema::Tgi), 422);
    assert!(e.message.contains("texts[1] must be a string"), "{e}");
}

#[test]
fn cohere_rerank_request() {
    let body = json!({"model": "m", "query": "q", "top_n": 2, "return_documents": false,
        "documents": ["a", {"text": "b", "title": "t"}], "max_chunks_per_doc": 10});
    assert!(!is_tei_rerank(&body));
    let r = parse_rerank(&body).unwrap();
    assert_eq!(r.documents.len(), 2);
    assert_eq!(r.documents[1].text, "b");
    assert_eq!(r.documents[1].object.as_ref().unwrap()["title"], "t");
    assert_eq!(r.top_n, Some(2));
    assert!(!r.return_documents);
    assert!(r.activation);
    assert!(r.unknown.is_empty(), "{:?}", r.unknown);
    // Defaults: every result, documents returned (Jina, vLLM); vLLM's 0 means all.
    let r = parse_rerank(&json!({"query": "q", "documents": ["a"], "top_n": 0,
        "use_activation": false}))
    .unwrap();
    assert_eq!(r.top_n, None);
    assert!(r.return_documents && !r.activation);

    let cases: [(Value, &str); 5] = [
        (
            json!({"query": "q", "documents": []}),
            "`documents` cannot be empty",
        ),
        (json!({"query": "q"}), "`documents` is required"),
        (
            json!({"query": "q", "documents": [{"title": "x"}]}),
            "documents[0] is an object without `text`",
        ),
        (
            json!({"query": "q", "documents": ["a"], "top_n": -1}),
            "top_n must be a positive integer",
        ),
        (
            json!({"query": "q", "documents": ["a"], "rank_fields": ["title"]}),
            "`rank_fields`",
        ),
    ];
    for (body, msg) in cases {
        let e = parse_rerank(&body).unwrap_err();
        assert!(e.message.contains(msg), "{body}: {e}");
        // vLLM's and OpenAI's error body, 400.
        assert_eq!(e.status(Schema::Responses), 400, "{body}");
        let b: Value = serde_json::from_str(&e.body(Schema::Responses)).unwrap();
        assert!(b["error"]["message"].is_string());
    }
}

#[test]
fn score_request_shapes() {
    let r = parse_score(&json!({"text_1": "q", "text_2": "d"})).unwrap();
    assert_eq!(r.pairs, pairs(&[("q", "d")]));
    let r = parse_score(&json!({"text_1": "q", "text_2": ["a", "b"]})).unwrap();
    assert_eq!(r.pairs, pairs(&[("q", "a"), ("q", "b")]));
    let r =
        parse_score(&json!({"text_1": ["q1", "q2"], "text_2": ["a", "b"], "model": "m"})).unwrap();
    assert_eq!(r.pairs, pairs(&[("q1", "a"), ("q2", "b")]));
    // Newer vLLM names.
    let r = parse_score(&json!({"queries": ["q"], "documents": ["a", "b"]})).unwrap();
    assert_eq!(r.pairs.len(), 2);
    let e = parse_score(&json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})).unwrap_err();
    assert!(
        e.message
            .contains("`text_1` has 2 texts and `text_2` has 3"),
        "{e}"
    );
    assert_eq!(e.status(Schema::Responses), 400);
    let e = parse_score(&json!({"text_1": "q"})).unwrap_err();
    assert!(
        e.message.contains("`text_1` and `text_2` are required"),
        "{e}"
    );
    let e = parse_score(&json!({"text_1": [], "text_2": "d"})).unwrap_err();
    assert_eq!(e.kind, ErrorKind::EmptyInput);
}

#[test]
fn predict_request_follows_tei_reading() {
    let r = parse_predict(&json!({"inputs": "I like you."})).unwrap();
    assert_eq!(r.inputs, vec![PredictInput::Single("I like you.".into())]);
    assert!(!r.batch);
    // A list that starts with a string is one pair, not a batch of two.
    let r = parse_predict(&json!({"inputs": ["a", "b"]})).unwrap();
    assert_eq!(r.inputs, vec![PredictInput::Pair("a".into(), "b".into())]);
    assert!(!r.batch);
    let r = parse_predict(&json!({"inputs": [["a"], ["b", "c"]], "raw_scores": true})).unwrap();
    assert_eq!(
        r.inputs,
        vec![
            PredictInput::Single("a".into()),
            PredictInput::Pair("b".into(), "c".into())
        ]
    );
    assert!(r.batch && r.raw_scores);
    let e = parse_predict(&json!({"inputs": ["a", "b", "c"]})).unwrap_err();
    assert!(e.message.contains("has 3 strings"), "{e}");
    assert_eq!(e.status(Schema::Tgi), 422);
    assert_eq!(
        parse_predict(&json!({"inputs": []}))
            .unwrap_err()
            .status(Schema::Tgi),
        400
    );
    assert!(parse_predict(&json!({"inputs": [["a"], "b"]})).is_err());
}

#[test]
fn lmi_pair_forms() {
    let r = parse_lmi_score(&json!({"query": "q", "texts": ["a", "b"]})).unwrap();
    assert_eq!(r.pairs, pairs(&[("q", "a"), ("q", "b")]));
    assert!(r.batch);
    let r = parse_lmi_score(&json!({"text": "q", "text_pair": "a"})).unwrap();
    assert_eq!((r.pairs, r.batch), (pairs(&[("q", "a")]), false));
    let r = parse_lmi_score(&json!([{"key": "q", "value": "a"}, {"text": "p", "text_pair": "b"}]))
        .unwrap();
    assert_eq!(r.pairs, pairs(&[("q", "a"), ("p", "b")]));
    assert!(r.batch);
    let e = parse_lmi_score(&json!({"inputs": "x"})).unwrap_err();
    assert!(e.message.contains("{\"query\", \"texts\"}"), "{e}");
    assert!(parse_lmi_score(&json!([])).is_err());
    assert!(parse_lmi_score(&json!([1])).is_err());
}

/// Sigmoid and softmax values computed by hand: sigmoid(0) = 0.5, sigmoid(2) = 1/(1+e^-2) =
/// 0.880797; softmax([0, ln 3]) = [0.25, 0.75].
#[test]
fn activations() {
    assert_eq!(rerank::activate(&[0.0]), vec![0.5]);
    assert!((rerank::activate(&[2.0])[0] - 0.880_797).abs() < 1e-6);
    let p = rerank::activate(&[0.0, 3f32.ln()]);
    assert!(
        (p[0] - 0.25).abs() < 1e-6 && (p[1] - 0.75).abs() < 1e-6,
        "{p:?}"
    );
    assert_eq!(rerank::ranking(&[0.1, 0.9, 0.5, 0.9]), vec![1, 3, 2, 0]);
}

#[test]
fn tei_rerank_body_is_sorted() {
    assert_eq!(
        format::tei_rerank(&[0.25, 0.75], None),
        r#"[{"index":1,"score":0.75},{"index":0,"score":0.25}]"#
    );
    let texts = vec!["a".to_string(), "b".to_string()];
    assert_eq!(
        format::tei_rerank(&[0.25, 0.75], Some(&texts)),
        r#"[{"index":1,"text":"b","score":0.75},{"index":0,"text":"a","score":0.25}]"#
    );
}

#[test]
fn cohere_rerank_body() {
    let req =
        parse_rerank(&json!({"query": "q", "documents": ["a", {"text": "b", "id": "7"}, "c"]}))
            .unwrap();
    let meta = format::RerankMeta {
        id: "rerank-1",
        model: "bge",
        prompt_tokens: 12,
        api_version: "2",
    };
    let body: Value = serde_json::from_str(&format::rerank(
        &[0.5, 0.75, 0.25],
        Some(&req.documents),
        Some(2),
        &meta,
    ))
    .unwrap();
    assert_eq!(
        body,
        json!({"id": "rerank-1", "model": "bge",
            "results": [
                {"index": 1, "relevance_score": 0.75, "document": {"text": "b", "id": "7"}},
                {"index": 0, "relevance_score": 0.5, "document": {"text": "a"}}],
            "usage": {"prompt_tokens": 12, "total_tokens": 12},
            "meta": {"api_version": {"version": "2"}, "tokens": {"input_tokens": 12, "output_tokens": 0}}})
    );
    let body: Value =
        serde_json::from_str(&format::rerank(&[0.5, 0.75, 0.25], None, None, &meta)).unwrap();
    assert_eq!(body["results"].as_array().unwrap().len(), 3);
    assert!(body["results"][0].get("document").is_none());
}

#[test]
fn score_predict_and_lmi_bodies() {
    assert_eq!(
        format::score(&[0.5, 0.25], "score-1", 1700000000, "m", 9),
        r#"{"id":"score-1","object":"list","created":1700000000,"model":"m","data":[{"index":0,"object":"score","score":0.5},{"index":1,"object":"score","score":0.25}],"usage":{"prompt_tokens":9,"total_tokens":9,"completion_tokens":0}}"#
    );
    let labels = vec!["neg".to_string(), "pos".to_string(), "mid".to_string()];
    let rows = vec![vec![0.25f32, 0.5, 0.25]];
    assert_eq!(
        format::predict(&rows, &labels, false),
        r#"[{"score":0.5,"label":"pos"},{"score":0.25,"label":"neg"},{"score":0.25,"label":"mid"}]"#
    );
    assert_eq!(
        format::predict(&[vec![0.5]], &[], true),
        r#"[[{"score":0.5,"label":"LABEL_0"}]]"#
    );
    assert_eq!(format::lmi_scores(&[vec![0.5]], false), "[0.5]");
    assert_eq!(
        format::lmi_scores(&[vec![0.5], vec![0.25]], true),
        "[[0.5],[0.25]]"
    );
}
