use lmi_api::lmi::LmiConfig;
use lmi_api::openai::OpenAiConfig;
use lmi_api::{Invocation, Schema, parse_invocation_bytes};

fn parse(body: &str) -> Result<Invocation, lmi_api::ApiError> {
    parse_invocation_bytes(
        body.as_bytes(),
        &LmiConfig::default(),
        &OpenAiConfig::default(),
    )
}

#[test]
fn dispatch_by_keys() {
    assert!(matches!(
        parse(r#"{"inputs":"hi"}"#),
        Ok(Invocation::Lmi(_))
    ));
    assert!(matches!(
        parse(r#"{"messages":[{"role":"user","content":"hi"}]}"#),
        Ok(Invocation::Chat(_))
    ));
    assert!(matches!(
        parse(r#"{"prompt":"hi"}"#),
        Ok(Invocation::Completion(_))
    ));
    // LMI's order: prompt, then inputs, then messages.
    assert!(matches!(
        parse(r#"{"inputs":"hi","messages":[]}"#),
        Ok(Invocation::Lmi(_))
    ));
}

#[test]
fn dispatch_errors() {
    let e = parse(r#"{"foo":1}"#).unwrap_err();
    assert_eq!(
        e.message,
        "invalid payload. must contain prompt, inputs, or messages"
    );
    assert_eq!(e.status(Schema::Lmi), 424);
    let e = parse("{not json").unwrap_err();
    assert!(
        e.message.starts_with("request body is not valid JSON: "),
        "{}",
        e.message
    );
    assert_eq!(e.status(Schema::Lmi), 424);
    let e = parse("[1]").unwrap_err();
    assert_eq!(
        e.message,
        "invalid payload. must be a JSON object, got array"
    );
}

#[test]
fn openapi_document_lists_routes() {
    let doc = lmi_api::openapi::openapi("0.1.0");
    for path in [
        "/invocations",
        "/generate",
        "/generate_stream",
        "/",
        "/tokenize",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/info",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path}");
    }
    assert_eq!(doc["info"]["version"], "0.1.0");
    assert!(
        doc["components"]["schemas"]["GenerateParameters"]["properties"]["max_new_tokens"]
            .is_object()
    );
}
