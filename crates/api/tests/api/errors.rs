use lmi_api::{ApiError, ErrorKind, Schema, lmi_server_error_body};

#[test]
fn lmi_bodies() {
    let e = ApiError::generation("exception occurred during rolling batch inference");
    assert_eq!(
        e.lmi_body(),
        r#"{"error":"exception occurred during rolling batch inference","code":424}"#
    );
    assert_eq!(e.status(Schema::Lmi), 424);
    let e = ApiError::validation("inputs must not be empty");
    assert_eq!(
        e.body(Schema::Lmi),
        r#"{"error":"Input Parsing failed. Ensure that the request payload is valid. inputs must not be empty","code":424}"#
    );
    assert_eq!(ApiError::overloaded().status(Schema::Lmi), 503);
}

#[test]
fn dynamic_batch_body() {
    let e = ApiError::generation("boom");
    assert_eq!(
        e.body(Schema::LmiDynamicBatch),
        "{\n  \"code\": 424,\n  \"message\": \"invoke handler failure\",\n  \"error\": \"boom\"\n}"
    );
}

#[test]
fn lmi_server_error() {
    assert_eq!(
        lmi_server_error_body(
            503,
            "WlmCapacityException",
            "Worker queue capacity exceeded for model: x"
        ),
        "{\n  \"code\": 503,\n  \"type\": \"WlmCapacityException\",\n  \"message\": \"Worker queue capacity exceeded for model: x\"\n}"
    );
}

#[test]
fn tgi_bodies_and_statuses() {
    let cases = [
        (
            ApiError::validation("`inputs` cannot be empty"),
            422,
            r#"{"error":"Input validation error: `inputs` cannot be empty","error_type":"validation"}"#,
        ),
        (
            ApiError::generation("CUDA error"),
            424,
            r#"{"error":"Request failed during generation: CUDA error","error_type":"generation"}"#,
        ),
        (
            ApiError::overloaded(),
            429,
            r#"{"error":"Model is overloaded","error_type":"overloaded"}"#,
        ),
        (
            ApiError::incomplete(),
            500,
            r#"{"error":"Incomplete generation","error_type":"incomplete_generation"}"#,
        ),
        (
            ApiError::unhealthy(),
            503,
            r#"{"error":"unhealthy","error_type":"healthcheck"}"#,
        ),
    ];
    for (e, status, body) in cases {
        assert_eq!(e.status(Schema::Tgi), status, "{body}");
        assert_eq!(e.body(Schema::Tgi), body);
    }
    assert_eq!(ApiError::invalid_json("x").status(Schema::Tgi), 400);
    assert_eq!(
        ApiError::new(ErrorKind::Template, "t").status(Schema::OpenAi),
        422
    );
}

#[test]
fn openai_stream_error() {
    let e = ApiError::validation("`temperature` must be strictly positive");
    assert_eq!(
        e.openai_stream_events(),
        "data: {\"error\":{\"message\":\"Input validation error: `temperature` must be strictly positive\",\"http_status_code\":422}}\n\ndata: [DONE]\n\n"
    );
}

/// A refused API key is 401 in every schema, in that schema's body; the body never echoes a key.
#[test]
fn unauthorized_is_401_in_each_schema_shape() {
    let e = ApiError::unauthorized();
    for schema in [
        Schema::Lmi,
        Schema::LmiDynamicBatch,
        Schema::Tgi,
        Schema::OpenAi,
    ] {
        assert_eq!(e.status(schema), 401, "{schema:?}");
    }
    let lmi: serde_json::Value = serde_json::from_str(&e.body(Schema::Lmi)).unwrap();
    assert_eq!(lmi["code"], 401);
    assert!(
        lmi["error"]
            .as_str()
            .unwrap()
            .starts_with("a valid API key")
    );
    let tgi: serde_json::Value = serde_json::from_str(&e.body(Schema::Tgi)).unwrap();
    assert_eq!(tgi["error_type"], "authentication");
}

#[test]
fn timeout_is_408_and_names_the_option() {
    let e = ApiError::timeout(std::time::Duration::from_millis(2500));
    assert_eq!(e.status(Schema::OpenAi), 408);
    assert_eq!(e.status(Schema::Lmi), 408);
    assert!(
        e.message.contains("2.5 s (option.request_timeout)"),
        "{}",
        e.message
    );
    let events = e.openai_stream_events();
    assert!(events.contains("\"http_status_code\":408") && events.ends_with("data: [DONE]\n\n"));
}
