use crate::common::json;
use lmi_api::lmi::{LmiConfig, LmiInputs, parse_lmi_request};
use lmi_api::{ApiError, ErrorKind, GenerationSpec};

fn parse(body: &str) -> Result<lmi_api::lmi::LmiRequest, ApiError> {
    parse_lmi_request(&json(body), &LmiConfig::default())
}

fn spec(body: &str) -> GenerationSpec {
    parse(body).expect("valid request").spec
}

fn err(body: &str) -> String {
    parse(body).expect_err("invalid request").message
}

#[test]
fn defaults_are_greedy_30_tokens() {
    let s = spec(r#"{"inputs":"hi"}"#);
    assert_eq!(s.max_new_tokens, 30);
    assert!(!s.max_new_tokens_explicit);
    assert!(s.is_greedy());
    assert_eq!((s.top_k, s.top_p, s.n, s.best_of), (0, 1.0, 1, 1));
    assert!(!s.details && !s.return_full_text && !s.stream && s.skip_special_tokens);
}

#[test]
fn greedy_rule() {
    // RB vLLM: do_sample false, or neither do_sample nor temperature -> greedy.
    assert!(spec(r#"{"inputs":"x","parameters":{"top_p":0.9}}"#).is_greedy());
    assert!(
        spec(r#"{"inputs":"x","parameters":{"do_sample":false,"temperature":0.7}}"#).is_greedy()
    );
    assert_eq!(
        spec(r#"{"inputs":"x","parameters":{"do_sample":true}}"#).temperature,
        1.0
    );
    assert_eq!(
        spec(r#"{"inputs":"x","parameters":{"temperature":0.7}}"#).temperature,
        0.7
    );
    assert!(spec(r#"{"inputs":"x","parameters":{"temperature":0}}"#).is_greedy());
}

#[test]
fn all_parameters_map() {
    let s = spec(
        r#"{"inputs":"x","stream":true,"parameters":{"do_sample":true,"seed":42,"temperature":0.5,
        "repetition_penalty":1.1,"top_k":50,"top_p":0.9,"max_new_tokens":64,"details":true,
        "return_full_text":true,"stop_sequences":["\n\n"],"decoder_input_details":true,"typical_p":0.95,
        "truncate":100,"ignore_eos_token":true,"min_p":0.05,"presence_penalty":0.5,"frequency_penalty":-0.5,
        "stop_token_ids":[7,8],"include_stop_str_in_output":true,"logprobs":2,"prompt_logprobs":1,
        "skip_special_tokens":false,"spaces_between_special_tokens":false,"top_n_tokens":3,"min_length":4,
        "bad_sequences":["bad"],"bad_words_list":[[1,2]],"stop_words_list":["END",[9]],
        "no_repeat_ngram_size":3,"logit_bias":{"15":-100,"16":2.5},"adapter_id":"a1","stop":["STOP"],
        "watermark":true}}"#,
    );
    assert_eq!(s.temperature, 0.5);
    assert_eq!(s.seed, Some(42));
    assert_eq!(s.repetition_penalty, 1.1);
    assert_eq!(
        (s.top_k, s.top_p, s.typical_p, s.min_p),
        (50, 0.9, 0.95, 0.05)
    );
    assert_eq!((s.presence_penalty, s.frequency_penalty), (0.5, -0.5));
    assert_eq!(
        (
            s.max_new_tokens,
            s.max_new_tokens_explicit,
            s.min_new_tokens
        ),
        (64, true, 4)
    );
    assert!(s.details && s.return_full_text && s.decoder_input_details && s.ignore_eos && s.stream);
    assert!(
        s.include_stop_str_in_output && !s.skip_special_tokens && !s.spaces_between_special_tokens
    );
    assert_eq!(s.stop_strings, vec!["\n\n", "STOP", "END"]);
    assert_eq!(s.stop_token_ids, vec![9, 7, 8]);
    assert_eq!(s.truncate, Some(100));
    assert_eq!(
        (s.logprobs, s.prompt_logprobs, s.top_n_tokens),
        (Some(2), Some(1), 3)
    );
    assert_eq!(s.bad_words, vec!["bad"]);
    assert_eq!(s.bad_word_ids, vec![vec![1, 2]]);
    assert_eq!(s.no_repeat_ngram_size, 3);
    assert_eq!(s.logit_bias, vec![(15, -100.0), (16, 2.5)]);
    assert_eq!(s.adapter.as_deref(), Some("a1"));
}

#[test]
fn embedding_bias_dense_vector() {
    let s = spec(r#"{"inputs":"x","parameters":{"embedding_bias":[0.0,1.5,0.0,-2.0]}}"#);
    assert_eq!(s.logit_bias, vec![(1, 1.5), (3, -2.0)]);
}

#[test]
fn unknown_parameters_ignored_and_reported() {
    let r = parse(r#"{"inputs":"x","parameters":{"max_new_tokens":5,"foo":1,"bar":{"x":1},"watermark":false}}"#).unwrap();
    assert_eq!(r.spec.max_new_tokens, 5);
    assert_eq!(r.report.unknown, vec!["bar", "foo"]);
    assert_eq!(r.report.ignored, vec!["watermark"]);
}

#[test]
fn nulls_accepted_everywhere() {
    let s = spec(
        r#"{"inputs":"x","stream":null,"adapters":null,"parameters":{"do_sample":null,"seed":null,"temperature":null,
        "repetition_penalty":null,"top_k":null,"top_p":null,"max_new_tokens":null,"details":null,
        "return_full_text":null,"stop_sequences":null,"decoder_input_details":null,"typical_p":null,
        "truncate":null,"ignore_eos_token":null,"min_p":null,"presence_penalty":null,"frequency_penalty":null,
        "n":null,"best_of":null,"stop_token_ids":null,"logprobs":null,"prompt_logprobs":null,"top_n_tokens":null,
        "grammar":null,"adapter_id":null,"stop":null,"logit_bias":null,"bad_words_list":null,"min_length":null}}"#,
    );
    assert_eq!(s, GenerationSpec::default());
}

#[test]
fn parameters_null_or_missing() {
    assert_eq!(
        spec(r#"{"inputs":"x","parameters":null}"#),
        GenerationSpec::default()
    );
}

#[test]
fn n_and_best_of() {
    let s = spec(r#"{"inputs":"x","parameters":{"best_of":3}}"#);
    assert_eq!((s.n, s.best_of), (3, 3));
    let s = spec(r#"{"inputs":"x","parameters":{"n":2,"best_of":4}}"#);
    assert_eq!((s.n, s.best_of), (2, 4));
}

#[test]
fn validation_messages() {
    let cases = [
        (
            r#"{"temperature":-1}"#,
            "parameters.temperature must be >= 0, got -1",
        ),
        (
            r#"{"top_p":0}"#,
            "parameters.top_p must be in (0, 1], got 0",
        ),
        (
            r#"{"top_p":1.5}"#,
            "parameters.top_p must be in (0, 1], got 1.5",
        ),
        (
            r#"{"top_k":-2}"#,
            "parameters.top_k must be >= 0 (or -1 for off), got -2",
        ),
        (
            r#"{"max_new_tokens":-5}"#,
            "parameters.max_new_tokens must be a positive integer, got -5",
        ),
        (
            r#"{"max_new_tokens":0}"#,
            "parameters.max_new_tokens must be a positive integer, got 0",
        ),
        (
            r#"{"max_new_tokens":1.5}"#,
            "parameters.max_new_tokens must be an integer, got 1.5",
        ),
        (r#"{"n":0}"#, "parameters.n must be an integer >= 1, got 0"),
        (
            r#"{"n":3,"best_of":2}"#,
            "parameters.best_of must be >= n (3), got 2",
        ),
        (
            r#"{"temperature":"hot"}"#,
            "parameters.temperature must be a number, got string",
        ),
        (
            r#"{"do_sample":"yes"}"#,
            "parameters.do_sample must be a boolean, got string",
        ),
        (
            r#"{"stop_sequences":[1]}"#,
            "parameters.stop_sequences[0] must be a string, got number",
        ),
        (
            r#"{"seed":-1}"#,
            "parameters.seed must be a non-negative integer, got -1",
        ),
        (
            r#"{"repetition_penalty":0}"#,
            "parameters.repetition_penalty must be > 0, got 0",
        ),
        (
            r#"{"presence_penalty":3}"#,
            "parameters.presence_penalty must be in [-2, 2], got 3",
        ),
        (
            r#"{"min_p":2}"#,
            "parameters.min_p must be in [0, 1], got 2",
        ),
        (
            r#"{"typical_p":0}"#,
            "parameters.typical_p must be in (0, 1], got 0",
        ),
        (
            r#"{"truncate":0}"#,
            "parameters.truncate must be a positive integer, got 0",
        ),
        (
            r#"{"grammar":{"type":"regex"}}"#,
            "parameters.grammar of type \"regex\" needs a \"value\" pattern",
        ),
        (
            r#"{"grammar":{"type":"regex","value":"a"},"guided_regex":"b"}"#,
            "parameters.grammar and guided_* both constrain the output: send one of them",
        ),
        (
            r#"{"num_beams":4,"temperature":0.5}"#,
            "beam search is deterministic: drop do_sample/temperature, or use one beam",
        ),
        (
            r#"{"logit_bias":{"abc":1}}"#,
            "parameters.logit_bias keys must be token ids, got \"abc\"",
        ),
        (
            r#"{"stop_token_ids":[-1]}"#,
            "parameters.stop_token_ids[0] must be a token id (integer 0..=4294967295), got -1",
        ),
    ];
    for (params, want) in cases {
        let e = err(&format!(r#"{{"inputs":"x","parameters":{params}}}"#));
        assert_eq!(e, want, "for {params}");
    }
    let e = parse(r#"{"inputs":"x","parameters":{"temperature":"hot"}}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("parameters.temperature"));
    assert_eq!(e.kind, ErrorKind::InvalidBody);
    assert_eq!(
        parse(r#"{"inputs":"x","parameters":{"grammar":{}}}"#)
            .unwrap_err()
            .param
            .as_deref(),
        Some("parameters.grammar")
    );
    let r = parse(r#"{"inputs":"x","parameters":{"guided_json":{"type":"object"}}}"#).unwrap();
    assert_eq!(
        r.spec.constraint,
        Some(lmi_api::Constraint::JsonSchema(
            serde_json::json!({"type":"object"})
        ))
    );
}

#[test]
fn input_errors() {
    assert_eq!(err(r#"{"inputs":""}"#), "inputs must not be empty");
    assert_eq!(err(r#"{"inputs":[]}"#), "inputs must not be an empty list");
    assert_eq!(err(r#"{"inputs":["a",""]}"#), "inputs[1] must not be empty");
    assert_eq!(
        err(r#"{"inputs":5}"#),
        "inputs must be a string or an array of strings, got number"
    );
    assert_eq!(
        err(r#"{"inputs":"x","parameters":[1]}"#),
        "parameters must be an object, got array"
    );
    assert_eq!(
        err(r#"{"inputs":"x","stream":"yes"}"#),
        "stream must be a boolean, got string"
    );
    assert_eq!(
        err(r#"{"inputs":"x","stream":true,"parameters":{"n":2}}"#),
        "parameters.n and parameters.best_of must be 1 when streaming"
    );
}

#[test]
fn batch_inputs_and_adapters() {
    let r = parse(r#"{"inputs":["a","b"],"adapters":["x",""]}"#).unwrap();
    assert!(r.is_batch());
    assert_eq!(r.inputs, LmiInputs::Batch(vec!["a".into(), "b".into()]));
    assert_eq!(r.adapters, vec![Some("x".to_string()), None]);
    let items = r.items();
    assert_eq!(items[0].0, "a");
    assert_eq!(items[0].1.adapter.as_deref(), Some("x"));
    assert_eq!(items[1].1.adapter, None);
    assert_eq!(
        err(r#"{"inputs":["a","b","c"],"adapters":["x","y"]}"#),
        "adapters has 2 entries but inputs has 3; give one adapter or one per input"
    );
    let r = parse(r#"{"inputs":"a","adapters":"my_lora"}"#).unwrap();
    assert_eq!(r.spec.adapter.as_deref(), Some("my_lora"));
}

#[test]
fn tgi_compat_defaults_details_on() {
    let cfg = LmiConfig { tgi_compat: true };
    let r = parse_lmi_request(&json(r#"{"inputs":"x"}"#), &cfg).unwrap();
    assert!(r.spec.details);
    let r = parse_lmi_request(
        &json(r#"{"inputs":"x","parameters":{"details":false}}"#),
        &cfg,
    )
    .unwrap();
    assert!(!r.spec.details);
}

#[test]
fn output_formatter_override_and_trt_stop_bool() {
    let r = parse(r#"{"inputs":"x","parameters":{"output_formatter":"sse","stop":true}}"#).unwrap();
    assert_eq!(r.report.output_formatter.as_deref(), Some("sse"));
    assert!(r.report.ignored.contains(&"stop".to_string()));
    assert!(r.spec.stop_strings.is_empty());
}

#[test]
fn draft_input_ids_become_a_draft() {
    let s = spec(r#"{"inputs":"x","parameters":{"draft_input_ids":[5,6,7]}}"#);
    assert_eq!(s.draft, Some(lmi_api::Draft::Tokens(vec![5, 6, 7])));
    assert_eq!(
        spec(r#"{"inputs":"x","parameters":{"draft_input_ids":[]}}"#).draft,
        None
    );
    assert!(
        err(r#"{"inputs":"x","parameters":{"draft_input_ids":["a"]}}"#).contains("draft_input_ids")
    );
}

#[test]
fn beams_from_lmi_trtllm_and_vllm_names() {
    use lmi_api::{BeamSpec, EarlyStop};
    let s = spec(
        r#"{"inputs":"x","parameters":{"num_beams":4,"num_return_sequences":2,"length_penalty":0.5,"early_stopping":"never"}}"#,
    );
    assert_eq!(
        s.beam,
        Some(BeamSpec {
            width: 4,
            length_penalty: 0.5,
            early_stopping: EarlyStop::Never,
            num_return: 2
        })
    );
    assert_eq!((s.n, s.best_of), (2, 2));
    let s = spec(r#"{"inputs":"x","parameters":{"beam_width":3,"early_stopping":true}}"#);
    assert_eq!(
        s.beam
            .as_ref()
            .map(|b| (b.width, b.early_stopping, b.num_return)),
        Some((3, EarlyStop::Done, 1))
    );
    let s = spec(r#"{"inputs":"x","parameters":{"use_beam_search":true,"best_of":3,"n":2}}"#);
    assert_eq!(
        s.beam.as_ref().map(|b| (b.width, b.num_return)),
        Some((3, 2))
    );
    // One beam is greedy decoding.
    assert_eq!(
        spec(r#"{"inputs":"x","parameters":{"num_beams":1}}"#).beam,
        None
    );
    assert!(
        err(r#"{"inputs":"x","parameters":{"num_beams":2,"num_return_sequences":3}}"#)
            .contains("num_return_sequences")
    );
    assert!(
        err(r#"{"inputs":"x","parameters":{"num_beams":2,"do_sample":true}}"#)
            .contains("deterministic")
    );
    assert!(
        err(r#"{"inputs":"x","parameters":{"num_beams":2,"early_stopping":"sometimes"}}"#)
            .contains("early_stopping")
    );
    assert!(err(r#"{"inputs":"x","parameters":{"num_beams":65}}"#).contains("num_beams"));
}
