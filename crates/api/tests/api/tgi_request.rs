use crate::common::json;
use lmi_api::tgi::{TgiLimits, TgiRoute, parse_tgi_request, validate_input_length};
use lmi_api::{ApiError, ErrorKind, Schema};

fn parse(body: &str, route: TgiRoute) -> Result<lmi_api::tgi::TgiRequest, ApiError> {
    parse_tgi_request(&json(body), route, &TgiLimits::default())
}

fn err(params: &str) -> String {
    let e = parse(
        &format!(r#"{{"inputs":"x","parameters":{params}}}"#),
        TgiRoute::Generate,
    )
    .expect_err(params);
    assert_eq!(e.kind, ErrorKind::Validation, "{params}");
    e.message
}

#[test]
fn validation_messages_exact() {
    let cases = [
        (
            r#"{"best_of":2}"#,
            "you must use sampling when `best_of` is > 1",
        ),
        (
            r#"{"temperature":0}"#,
            "`temperature` must be strictly positive",
        ),
        (
            r#"{"temperature":-0.5}"#,
            "`temperature` must be strictly positive",
        ),
        (
            r#"{"repetition_penalty":0}"#,
            "`repetition_penalty` must be strictly positive",
        ),
        (
            r#"{"frequency_penalty":2.5}"#,
            "`frequency_penalty` must be >= -2.0 and <= 2.0",
        ),
        (r#"{"top_p":1.0}"#, "`top_p` must be > 0.0 and < 1.0"),
        (r#"{"top_p":0}"#, "`top_p` must be > 0.0 and < 1.0"),
        (
            r#"{"typical_p":1.0}"#,
            "`typical_p` must be > 0.0 and < 1.0",
        ),
        (r#"{"top_k":0}"#, "`top_k` must be strictly positive"),
        (
            r#"{"max_new_tokens":0}"#,
            "`max_new_tokens` must be strictly positive",
        ),
        (
            r#"{"stop":["a","b","c","d","e"]}"#,
            "`stop` supports up to 4 stop sequences. Given: 5",
        ),
        (
            r#"{"best_of":2,"do_sample":true,"seed":1}"#,
            "`seed` must not be set when `best_of` > 1",
        ),
        (
            r#"{"top_n_tokens":6}"#,
            "`top_n_tokens` must be >= 0 and <= 5. Given: 6",
        ),
        (
            r#"{"truncate":0}"#,
            "`truncate` must be strictly positive and less than 4095. Given: 0",
        ),
        (
            r#"{"truncate":5000}"#,
            "`truncate` must be strictly positive and less than 4095. Given: 5000",
        ),
        (
            r#"{"best_of":3,"do_sample":true}"#,
            "`best_of` must be > 0 and <= 2. Given: 3",
        ),
        (
            r#"{"grammar":{"type":"xml","value":{}}}"#,
            "parameters.grammar type \"xml\" is not one of \"text\", \"json_object\", \"json_schema\", \"json\", \"regex\"",
        ),
    ];
    for (params, want) in cases {
        assert_eq!(err(params), want, "for {params}");
    }
}

#[test]
fn validation_order_follows_tgi() {
    // temperature (2) is reported before top_p (5) and before empty inputs (12).
    let e = parse(
        r#"{"inputs":"","parameters":{"temperature":0,"top_p":2}}"#,
        TgiRoute::Generate,
    )
    .unwrap_err();
    assert_eq!(e.message, "`temperature` must be strictly positive");
    let e = parse(
        r#"{"inputs":"","parameters":{"top_p":2}}"#,
        TgiRoute::Generate,
    )
    .unwrap_err();
    assert_eq!(e.message, "`top_p` must be > 0.0 and < 1.0");
    let e = parse(r#"{"inputs":"","parameters":{}}"#, TgiRoute::Generate).unwrap_err();
    assert_eq!(e.message, "`inputs` cannot be empty");
}

#[test]
fn validation_body_and_status() {
    let e = parse(
        r#"{"inputs":"x","parameters":{"temperature":0}}"#,
        TgiRoute::Generate,
    )
    .unwrap_err();
    assert_eq!(e.status(Schema::Tgi), 422);
    assert_eq!(
        e.tgi_body(),
        r#"{"error":"Input validation error: `temperature` must be strictly positive","error_type":"validation"}"#
    );
    assert_eq!(
        e.tgi_stream_event(),
        "data: {\"error\":\"Input validation error: `temperature` must be strictly positive\",\"error_type\":\"validation\"}\n\n"
    );
}

#[test]
fn streaming_rules() {
    let e = parse(
        r#"{"inputs":"x","parameters":{"best_of":2,"do_sample":true}}"#,
        TgiRoute::GenerateStream,
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "`best_of` != 1 is not supported when streaming tokens"
    );
    let e = parse(
        r#"{"inputs":"x","stream":true,"parameters":{"decoder_input_details":true}}"#,
        TgiRoute::Compat,
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "`decoder_input_details` == true is not supported when streaming tokens"
    );
    assert!(
        parse(r#"{"inputs":"x","stream":true}"#, TgiRoute::Compat)
            .unwrap()
            .spec
            .stream
    );
    assert!(
        !parse(r#"{"inputs":"x","stream":true}"#, TgiRoute::Generate)
            .unwrap()
            .spec
            .stream
    );
}

#[test]
fn best_of_disabled() {
    let limits = TgiLimits {
        max_best_of: 1,
        ..TgiLimits::default()
    };
    let e = parse_tgi_request(
        &json(r#"{"inputs":"x","parameters":{"best_of":2,"do_sample":true}}"#),
        TgiRoute::Generate,
        &limits,
    )
    .unwrap_err();
    assert_eq!(e.message, "`best_of` != 1 is not allowed for this endpoint");
}

#[test]
fn spec_mapping_and_defaults() {
    // No parameters object: TGI defaults do_sample to true.
    let s = parse(r#"{"inputs":"x"}"#, TgiRoute::Generate).unwrap().spec;
    assert_eq!(s.temperature, 1.0);
    assert_eq!((s.max_new_tokens, s.max_new_tokens_explicit), (100, false));
    assert!(!s.return_full_text);
    // parameters present without do_sample: greedy.
    let s = parse(
        r#"{"inputs":"x","parameters":{"max_new_tokens":20}}"#,
        TgiRoute::Generate,
    )
    .unwrap()
    .spec;
    assert!(s.is_greedy());
    assert_eq!((s.max_new_tokens, s.max_new_tokens_explicit), (20, true));
    // Any warper turns sampling on.
    let s = parse(
        r#"{"inputs":"x","parameters":{"top_k":10}}"#,
        TgiRoute::Generate,
    )
    .unwrap()
    .spec;
    assert_eq!((s.temperature, s.top_k), (1.0, 10));
    let s = parse(
        r#"{"inputs":"x","parameters":{"do_sample":true,"temperature":0.5,"best_of":2,"stop":["\n"],"details":true,
        "decoder_input_details":true,"top_n_tokens":2,"truncate":10,"adapter_id":"lora","watermark":true}}"#,
        TgiRoute::Generate,
    )
    .unwrap()
    .spec;
    assert_eq!(
        (s.temperature, s.n, s.best_of, s.top_n_tokens),
        (0.5, 2, 2, 2)
    );
    assert_eq!(s.stop_strings, vec!["\n"]);
    assert!(s.details && s.decoder_input_details && s.include_stop_str_in_output);
    assert_eq!((s.truncate, s.adapter.as_deref()), (Some(10), Some("lora")));
    // POST / returns the prompt too unless told otherwise.
    assert!(
        parse(r#"{"inputs":"x"}"#, TgiRoute::Compat)
            .unwrap()
            .spec
            .return_full_text
    );
    assert!(
        !parse(
            r#"{"inputs":"x","parameters":{"return_full_text":false}}"#,
            TgiRoute::Compat
        )
        .unwrap()
        .spec
        .return_full_text
    );
}

#[test]
fn text_generation_client_body_with_nulls() {
    // The body `text_generation.Client.generate` sends (tgi.md §5.1).
    let body = r#"{"inputs":"Hello","parameters":{"do_sample":false,"max_new_tokens":20,"repetition_penalty":null,
        "frequency_penalty":null,"return_full_text":false,"stop":[],"seed":null,"temperature":null,"top_k":null,
        "top_p":null,"truncate":null,"typical_p":null,"best_of":null,"watermark":false,"details":true,
        "decoder_input_details":false,"top_n_tokens":null,"grammar":null},"stream":false}"#;
    let r = parse(body, TgiRoute::Compat).unwrap();
    assert!(r.spec.is_greedy() && r.spec.details && !r.spec.return_full_text);
    assert_eq!(r.spec.max_new_tokens, 20);
    assert!(r.unknown_parameters.is_empty());
}

#[test]
fn unknown_parameters_reported() {
    let r = parse(
        r#"{"inputs":"x","parameters":{"foo":1,"model":"tgi"}}"#,
        TgiRoute::Generate,
    )
    .unwrap();
    assert_eq!(r.unknown_parameters, vec!["foo", "model"]);
}

#[test]
fn type_errors() {
    let e = parse(
        r#"{"inputs":"x","parameters":{"temperature":"a"}}"#,
        TgiRoute::Generate,
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "parameters.temperature must be a number, got string"
    );
    assert_eq!(e.status(Schema::Tgi), 422);
    let e = parse(r#"{"parameters":{}}"#, TgiRoute::Generate).unwrap_err();
    assert_eq!(e.message, "missing field `inputs`");
    let e = parse(
        r#"{"inputs":"x","parameters":{"max_new_tokens":-1}}"#,
        TgiRoute::Generate,
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "parameters.max_new_tokens must be a non-negative integer, got -1"
    );
}

#[test]
fn tokenize_only_needs_inputs() {
    let r = parse(
        r#"{"inputs":"x","parameters":{"temperature":0,"truncate":3}}"#,
        TgiRoute::Tokenize,
    )
    .unwrap();
    assert_eq!(r.spec.truncate, Some(3));
}

#[test]
fn input_length_checks() {
    let limits = TgiLimits {
        max_input_tokens: 10,
        max_total_tokens: 20,
        ..TgiLimits::default()
    };
    let mut s = parse_tgi_request(
        &json(r#"{"inputs":"x","parameters":{"max_new_tokens":15}}"#),
        TgiRoute::Generate,
        &limits,
    )
    .unwrap()
    .spec;
    let e = validate_input_length(8, &mut s, &limits).unwrap_err();
    assert_eq!(
        e.message,
        "`inputs` tokens + `max_new_tokens` must be <= 20. Given: 8 `inputs` tokens and 15 `max_new_tokens`"
    );
    s.max_new_tokens = 5;
    let e = validate_input_length(12, &mut s, &limits).unwrap_err();
    assert_eq!(
        e.message,
        "`inputs` must have less than 10 tokens. Given: 12"
    );
    // A default max_new_tokens is clamped to what is left instead.
    let mut s = parse_tgi_request(&json(r#"{"inputs":"x"}"#), TgiRoute::Generate, &limits)
        .unwrap()
        .spec;
    assert_eq!(validate_input_length(8, &mut s, &limits).unwrap(), 8);
    assert_eq!(s.max_new_tokens, 12);
    // truncate keeps the last tokens.
    let mut s = parse_tgi_request(
        &json(r#"{"inputs":"x","parameters":{"truncate":4,"max_new_tokens":5}}"#),
        TgiRoute::Generate,
        &limits,
    )
    .unwrap()
    .spec;
    assert_eq!(validate_input_length(50, &mut s, &limits).unwrap(), 4);
}
