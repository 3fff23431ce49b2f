//! End to end: the embedding and scoring routes of the built `lmi` binary. On a generative
//! model each answers a 400 in its own error shape naming the routes the model serves, and a
//! bad body the 4xx its peer gives; on the bert_mean fixture (tests/fixtures/embed/, vectors by
//! sentence-transformers) the vectors match and the limits are named.

mod common;

use common::*;
use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use serde_json::{Value, json};

fn post_json(port: u16, path: &str, body: &Value) -> Resp {
    post(port, path, &body.to_string())
}

/// The message of an error body in TEI's (`{"error": str}`), OpenAI's (`{"error": {"message"}}`)
/// or LMI's (`{"error": str, "code"}`) shape.
fn message(r: &Resp) -> String {
    let v = r.json();
    match &v["error"] {
        Value::String(s) => s.clone(),
        e => e["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error message in {}", r.body))
            .to_string(),
    }
}

#[test]
fn pooling_routes_on_a_generative_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-llama");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let mut server = start(&model, &["--kv-cache-bytes", "16M"]);
    wait_ready(&mut server, "tiny-llama");
    let port = server.port;

    // A valid body: 400 naming the routes this model serves, in the route's shape.
    let openai_shaped = [
        ("/v1/embeddings", json!({"input": "hi"})),
        ("/v1/rerank", json!({"query": "q", "documents": ["a"]})),
        (
            "/v2/rerank",
            json!({"query": "q", "documents": [{"text": "a"}]}),
        ),
        ("/score", json!({"text_1": "q", "text_2": ["a", "b"]})),
        ("/v1/score", json!({"text_1": "q", "text_2": "a"})),
        ("/rerank", json!({"query": "q", "documents": ["a"]})),
    ];
    for (path, body) in &openai_shaped {
        let r = post_json(port, path, body);
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["type"], "invalid_request_error", "{path}: {}", r.body);
        let m = e["message"].as_str().unwrap();
        assert!(
            m.contains("text-generation model") && m.contains("/v1/chat/completions"),
            "{path}: {m}"
        );
    }
    let tei_shaped = [
        ("/embed", json!({"inputs": ["a", "b"]})),
        ("/embed_sparse", json!({"inputs": "a"})),
        (
            "/similarity",
            json!({"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
        ),
        ("/rerank", json!({"query": "q", "texts": ["a"]})),
        ("/predict", json!({"inputs": ["a", "b"]})),
    ];
    for (path, body) in &tei_shaped {
        let r = post_json(port, path, body);
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert_eq!(r.json()["error_type"], "validation", "{path}: {}", r.body);
        assert!(message(&r).contains("/generate"), "{path}: {}", r.body);
    }

    // Bad bodies are read first: each gets its peer's 4xx and a message naming the field.
    let bad = [
        (
            "/v1/embeddings",
            json!({"input": ""}),
            400,
            "`input` is an empty string",
        ),
        (
            "/v1/embeddings",
            json!({"input": []}),
            400,
            "cannot be an empty list",
        ),
        (
            "/v1/embeddings",
            json!({"input": 3}),
            400,
            "input must be a string",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "dimensions": -1}),
            400,
            "dimensions",
        ),
        (
            "/embed",
            json!({"inputs": []}),
            400,
            "`inputs` cannot be an empty list",
        ),
        (
            "/embed",
            json!({"inputs": "a", "normalize": 1}),
            422,
            "normalize must be a boolean",
        ),
        (
            "/rerank",
            json!({"query": "q", "texts": []}),
            400,
            "`texts` cannot be empty",
        ),
        (
            "/v1/rerank",
            json!({"query": "q", "documents": [3]}),
            400,
            "documents[0]",
        ),
        (
            "/score",
            json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
            400,
            "`text_1` has 2 texts",
        ),
        (
            "/predict",
            json!({"inputs": ["a", "b", "c"]}),
            422,
            "has 3 strings",
        ),
    ];
    for (path, body, status, says) in &bad {
        let r = post_json(port, path, body);
        assert_eq!(r.status, *status, "{path} {body}: {}", r.body);
        assert!(message(&r).contains(says), "{path} {body}: {}", r.body);
    }
    for path in ["/v1/embeddings", "/embed"] {
        let r = request(port, "POST", path, b"{\"input\": \"caf\xe9\"}", &[]).unwrap();
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert!(message(&r).contains("not valid JSON"), "{path}: {}", r.body);
    }
    // The generative model still answers LMI's and TGI's bodies as before.
    let r = post_json(port, "/invocations", &json!({"query": "q", "texts": ["a"]}));
    assert_eq!(r.status, 424, "{}", r.body);
    let r = post_json(
        port,
        "/invocations",
        &json!({"inputs": "Hello", "parameters": {"max_new_tokens": 2}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post_json(
        port,
        "/",
        &json!({"inputs": "Hello", "parameters": {"max_new_tokens": 2}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(sigterm_and_wait(&mut server).code(), Some(0));
}

/// Refusals made before the handler (here the API key) have the route's shape too.
#[test]
fn guard_refusals_keep_each_routes_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-llama");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let mut server = start(&model, &["--kv-cache-bytes", "16M", "--api-key", "k"]);
    wait_ready(&mut server, "tiny-llama");
    let r = post_json(server.port, "/v1/embeddings", &json!({"input": "hi"}));
    assert_eq!(r.status, 401);
    assert_eq!(
        r.json()["error"]["type"],
        "authentication_error",
        "{}",
        r.body
    );
    let r = post_json(server.port, "/embed", &json!({"inputs": "hi"}));
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error_type"], "authentication", "{}", r.body);
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/embed")
        .join(name)
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Needs the encoder engine and the pooling service (issue 52's other parts).
#[test]
fn embedding_routes_on_bert_mean() {
    let dir = fixture("bert_mean");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let inputs = reference["inputs"].as_array().unwrap();
    let limit = reference["max_seq_length"].as_u64().unwrap();
    let mut server = start(
        &dir,
        &["--dtype", "fp32", "-o", "option.max_client_batch_size=16"],
    );
    wait_ready(&mut server, "bert_mean");
    let port = server.port;

    // TGI's /info names the Hub's tag for an embedding model and its input limit.
    let info = get(port, "/info").json();
    assert_eq!(info["model_pipeline_tag"], "feature-extraction", "{info}");
    assert_eq!(info["max_client_batch_size"], 16, "{info}");

    let texts: Vec<&str> = inputs.iter().map(|i| i["text"].as_str().unwrap()).collect();
    let r = post_json(
        port,
        "/v1/embeddings",
        &json!({"input": texts, "truncate_prompt_tokens": -1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body = r.json();
    let ids: usize = inputs
        .iter()
        .map(|i| i["ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(body["usage"]["prompt_tokens"], ids);
    for (d, i) in body["data"].as_array().unwrap().iter().zip(inputs) {
        let c = cosine(&floats(&d["embedding"]), &floats(&i["embedding"]));
        assert!(c >= 0.99999, "{}: cosine {c}", i["text"]);
    }
    let r = post_json(port, "/invocations", &json!({"inputs": texts[0]}));
    assert_eq!(r.status, 200, "{}", r.body);
    let c = cosine(&floats(&r.json()[0]), &floats(&inputs[0]["embedding"]));
    assert!(c >= 0.99999, "cosine {c}");

    // The limits, each named: the input length, the number of inputs, the dimensions.
    let long = inputs
        .iter()
        .max_by_key(|i| i["ids"].as_array().unwrap().len())
        .unwrap();
    let r = post_json(port, "/embed", &json!({"inputs": long["text"]}));
    assert!((400..500).contains(&r.status), "{}", r.body);
    assert!(message(&r).contains(&limit.to_string()), "{}", r.body);
    let many = vec!["hello"; 10_000];
    let r = post_json(port, "/v1/embeddings", &json!({"input": many}));
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(message(&r).contains("16"), "{}", r.body);
    let width = inputs[0]["embedding"].as_array().unwrap().len();
    let r = post_json(
        port,
        "/v1/embeddings",
        &json!({"input": "hi", "dimensions": width + 1}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(message(&r).contains("dimensions"), "{}", r.body);
    // A generation body is the 400 naming this model's routes.
    let r = post_json(port, "/invocations", &json!({"prompt": "hi"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(message(&r).contains("/v1/embeddings"), "{}", r.body);
}
