//! Embedding requests (OpenAI, TEI, LMI) and their answers, against the peers' published
//! shapes: the openai SDK's base64 decoding, TEI's list of lists, LMI's list of vectors.

use lmi_api::embed::{
    self, EmbedInput, EncodingFormat, Served, Truncate, format, parse_embeddings_request,
    parse_lmi_embed, parse_similarity_request, parse_tei_embed,
};
use lmi_api::{ErrorKind, Schema};
use serde_json::{Value, json};

fn text(s: &str) -> EmbedInput {
    EmbedInput::Text(s.into())
}

#[test]
fn openai_input_forms() {
    let cases = [
        (json!("hello"), vec![text("hello")]),
        (json!(["a", "b"]), vec![text("a"), text("b")]),
        (json!([1, 2, 3]), vec![EmbedInput::Ids(vec![1, 2, 3])]),
        (
            json!([[1, 2], [3]]),
            vec![EmbedInput::Ids(vec![1, 2]), EmbedInput::Ids(vec![3])],
        ),
        // TEI also takes strings and ids in one list.
        (json!(["a", [7]]), vec![text("a"), EmbedInput::Ids(vec![7])]),
    ];
    for (input, want) in cases {
        let r = parse_embeddings_request(&json!({"input": input, "model": "m"})).unwrap();
        assert_eq!(r.inputs, want, "{input}");
        assert_eq!(r.encoding_format, EncodingFormat::Float);
        assert_eq!(r.model.as_deref(), Some("m"));
    }
    let r = parse_embeddings_request(&json!({"input": "x", "encoding_format": "base64",
        "dimensions": 8, "user": "u", "extra": 1}))
    .unwrap();
    assert_eq!(r.encoding_format, EncodingFormat::Base64);
    assert_eq!(r.dimensions, Some(8));
    assert_eq!(r.unknown, vec!["extra".to_string()]);
}

/// Each bad body is a 4xx whose message names the field and what to send.
#[test]
fn openai_bad_inputs() {
    let cases: [(Value, ErrorKind, &str); 10] = [
        (json!({}), ErrorKind::InvalidBody, "`input` is required"),
        (
            json!({"input": ""}),
            ErrorKind::EmptyInput,
            "`input` is an empty string",
        ),
        (
            json!({"input": []}),
            ErrorKind::EmptyInput,
            "`input` cannot be an empty list",
        ),
        (
            json!({"input": ["a", ""]}),
            ErrorKind::EmptyInput,
            "`input[1]` is an empty string",
        ),
        (
            json!({"input": [[]]}),
            ErrorKind::EmptyInput,
            "`input[0]` is an empty list of token ids",
        ),
        (
            json!({"input": 5}),
            ErrorKind::InvalidBody,
            "input must be a string, a list of strings",
        ),
        (
            json!({"input": [1, -2]}),
            ErrorKind::InvalidBody,
            "input[1] must be a token id",
        ),
        (
            json!({"input": ["a", {}]}),
            ErrorKind::InvalidBody,
            "input[1] must be a string or a list of token ids",
        ),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            ErrorKind::Validation,
            "encoding_format must be \"float\" or \"base64\"",
        ),
        (
            json!({"input": "a", "dimensions": 0}),
            ErrorKind::Validation,
            "dimensions must be a positive integer",
        ),
    ];
    for (body, kind, msg) in cases {
        let e = parse_embeddings_request(&body).unwrap_err();
        assert_eq!(e.kind, kind, "{body}: {e}");
        assert!(e.message.contains(msg), "{body}: {e}");
        // OpenAI's own body and a 400, as the openai SDK expects.
        assert_eq!(e.status(Schema::Responses), 400, "{body}");
        let b: Value = serde_json::from_str(&e.body(Schema::Responses)).unwrap();
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(b["error"]["message"].as_str().unwrap().contains(msg));
    }
    assert!(parse_embeddings_request(&json!("input")).is_err());
}

#[test]
fn tei_embed_fields() {
    let r = parse_tei_embed(&json!({"inputs": "x"})).unwrap();
    assert_eq!(r.inputs, vec![text("x")]);
    assert!(r.normalize, "TEI normalizes by default");
    assert_eq!(r.truncate, Truncate::Refuse);
    let r = parse_tei_embed(
        &json!({"inputs": ["x"], "normalize": false, "truncate": true,
        "truncation_direction": "Left", "prompt_name": "query", "dimensions": 4}),
    )
    .unwrap();
    assert!(!r.normalize);
    assert_eq!(r.truncate, Truncate::Left);
    assert_eq!(r.prompt_name.as_deref(), Some("query"));
    assert_eq!(r.dimensions, Some(4));
    let r =
        parse_tei_embed(&json!({"inputs": "x", "truncate": true, "truncation_direction": "right"}))
            .unwrap();
    assert_eq!(r.truncate, Truncate::Right);

    // TEI's codes: 400 `empty` for an empty batch, 422 `validation` for a wrong value.
    let e = parse_tei_embed(&json!({"inputs": []})).unwrap_err();
    assert_eq!(e.status(Schema::Tgi), 400);
    assert_eq!(
        e.body(Schema::Tgi),
        r#"{"error":"Input validation error: `inputs` cannot be an empty list: send at least one text","error_type":"empty"}"#
    );
    let e = parse_tei_embed(&json!({"inputs": "x", "truncation_direction": "up"})).unwrap_err();
    assert_eq!((e.status(Schema::Tgi), e.error_type()), (422, "validation"));
    let e = parse_tei_embed(&json!({"inputs": "x", "normalize": "yes"})).unwrap_err();
    assert_eq!(e.status(Schema::Tgi), 422);
    assert!(e.message.contains("normalize must be a boolean"), "{e}");
}

#[test]
fn similarity_request() {
    let r = parse_similarity_request(&json!({"inputs": {"source_sentence": "a",
        "sentences": ["b", "c"]}, "parameters": {"truncate": true, "prompt_name": "q"}}))
    .unwrap();
    assert_eq!((r.source.as_str(), r.sentences.len()), ("a", 2));
    assert_eq!(r.truncate, Truncate::Right);
    assert_eq!(r.prompt_name.as_deref(), Some("q"));
    for (body, msg) in [
        (
            json!({"inputs": {"sentences": ["b"]}}),
            "source_sentence` is required",
        ),
        (
            json!({"inputs": {"source_sentence": "a", "sentences": []}}),
            "`inputs.sentences` cannot be empty",
        ),
        (json!({"inputs": "a"}), "inputs must be an object"),
    ] {
        let e = parse_similarity_request(&body).unwrap_err();
        assert!(e.message.contains(msg), "{body}: {e}");
    }
}

#[test]
fn lmi_embedding_body() {
    assert_eq!(parse_lmi_embed(&json!({"inputs": "a"})).unwrap(), vec!["a"]);
    assert_eq!(
        parse_lmi_embed(&json!({"inputs": ["a", "b"], "parameters": {}})).unwrap(),
        vec!["a", "b"]
    );
    let e = parse_lmi_embed(&json!({"inputs": 3})).unwrap_err();
    // LMI's handler message, in LMI's body.
    assert!(
        e.message
            .contains("'inputs' must be a string or list of strings, got number")
    );
    assert_eq!(e.status(Schema::Lmi), 424);
    assert_eq!(
        parse_lmi_embed(&json!({"inputs": []}))
            .unwrap_err()
            .status(Schema::Lmi),
        400
    );
    assert!(parse_lmi_embed(&json!({"inputs": [""]})).is_err());
    assert!(parse_lmi_embed(&json!({"prompt": "a"})).is_err());
}

/// What the openai SDK does with `encoding_format: "base64"`: `np.frombuffer(b64decode(s),
/// dtype="float32")`. The expected string is the bytes of [1.0, -2.0, 0.5] written by hand
/// (IEEE-754 little endian: 00 00 80 3f, 00 00 00 c0, 00 00 00 3f).
#[test]
fn base64_is_little_endian_f32() {
    assert_eq!(format::base64_f32(&[1.0, -2.0, 0.5]), "AACAPwAAAMAAAAA/");
    let body: Value = serde_json::from_str(&format::openai_embeddings(
        &[vec![1.0, -2.0, 0.5]],
        EncodingFormat::Base64,
        "m",
        3,
    ))
    .unwrap();
    assert_eq!(body["data"][0]["embedding"], "AACAPwAAAMAAAAA/");
}

#[test]
fn openai_and_tei_bodies() {
    let v = vec![vec![0.5f32, -0.25], vec![1.0, 0.0]];
    assert_eq!(
        format::openai_embeddings(&v, EncodingFormat::Float, "bge", 7),
        r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-0.25]},{"object":"embedding","index":1,"embedding":[1.0,0.0]}],"model":"bge","usage":{"prompt_tokens":7,"total_tokens":7}}"#
    );
    assert_eq!(format::vectors(&v), "[[0.5,-0.25],[1.0,0.0]]");
    assert_eq!(format::vectors(&v[..1]), "[[0.5,-0.25]]");
    assert_eq!(format::similarities(&[0.5, 1.0]), "[0.5,1.0]");
}

#[test]
fn cosine_similarity() {
    assert!((format::cosine(&[1.0, 0.0], &[0.0, 2.0])).abs() < 1e-7);
    assert!((format::cosine(&[1.0, 1.0], &[2.0, 2.0]) - 1.0).abs() < 1e-6);
    assert!((format::cosine(&[3.0, 4.0], &[4.0, 3.0]) - 24.0 / 25.0).abs() < 1e-6);
    assert_eq!(format::cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
}

/// A route this model does not serve: 400 in every schema, naming the routes that work.
#[test]
fn wrong_task_names_the_routes() {
    let e = embed::wrong_task("/v1/embeddings", Served::Generation);
    assert!(
        e.message.contains("/v1/embeddings serves embedding models"),
        "{e}"
    );
    assert!(e.message.contains("text-generation model"), "{e}");
    assert!(e.message.contains("/v1/chat/completions"), "{e}");
    let e = embed::wrong_task("/predict", Served::Embedding);
    assert!(e.message.contains("/v1/embeddings, /embed"), "{e}");
    let e = embed::wrong_task("/embed", Served::Scoring);
    assert!(e.message.contains("/rerank, /v1/rerank"), "{e}");
    for schema in [Schema::Tgi, Schema::Responses, Schema::Lmi, Schema::OpenAi] {
        assert_eq!(e.status(schema), 400, "{schema:?}");
    }
}

#[test]
fn too_many_inputs_is_413_naming_the_limit() {
    let e = lmi_api::ApiError::too_many_inputs(10_000, 32, "option.max_client_batch_size");
    for schema in [Schema::Tgi, Schema::Responses, Schema::Lmi] {
        assert_eq!(e.status(schema), 413, "{schema:?}");
    }
    assert!(e.message.contains("10000 inputs"), "{e}");
    assert!(
        e.message
            .contains("limit of 32 (option.max_client_batch_size)"),
        "{e}"
    );
    assert_eq!(e.error_type(), "validation");
}
