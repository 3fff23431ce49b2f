use crate::common::*;
use lmi_api::tgi::format;
use lmi_api::tgi::{InfoIn, TokenSpan, info::info};
use lmi_api::{FinishReason, GenerationSpec, TokenOut};

#[test]
fn stream_events_match_tgi_wire_example() {
    // tgi.md §4 wire example (TGI >= 2.1).
    let spec = GenerationSpec {
        details: true,
        ..GenerationSpec::default()
    };
    let t1 = tok(363, " for", -1.53);
    let t2 = TokenOut::new(2, "</s>", Some(-0.2), true);
    let o = out(
        "x",
        3,
        seq(" for", FinishReason::EosToken, vec![t1.clone(), t2.clone()]),
    );
    let stream = format!(
        "{}{}",
        format::stream_event(1, &t1, &[], None, &spec),
        format::stream_event(2, &t2, &[], Some(&o), &spec)
    );
    assert_eq!(
        stream,
        "data: {\"index\":1,\"token\":{\"id\":363,\"text\":\" for\",\"logprob\":-1.53,\"special\":false},\"generated_text\":null,\"details\":null}\n\n\
         data: {\"index\":2,\"token\":{\"id\":2,\"text\":\"</s>\",\"logprob\":-0.2,\"special\":true},\"generated_text\":\" for\",\"details\":{\"finish_reason\":\"eos_token\",\"generated_tokens\":2,\"seed\":null,\"input_length\":3}}\n\n"
    );
    assert!(!stream.contains("[DONE]"));
}

#[test]
fn stream_without_details_and_with_top_tokens() {
    let spec = GenerationSpec {
        top_n_tokens: 1,
        return_full_text: true,
        ..GenerationSpec::default()
    };
    let t = tok(5, "a", -0.5);
    let o = out("P:", 1, seq("a", FinishReason::Length, vec![t.clone()]));
    assert_eq!(
        format::stream_response(1, &t, &[tok(5, "a", -0.5)], Some(&o), &spec),
        r#"{"index":1,"token":{"id":5,"text":"a","logprob":-0.5,"special":false},"top_tokens":[{"id":5,"text":"a","logprob":-0.5,"special":false}],"generated_text":"P:a","details":null}"#
    );
}

#[test]
fn generate_response_shapes() {
    let o = hello();
    let plain = GenerationSpec::default();
    assert_eq!(
        format::generate_response(&o, &plain),
        r#"{"generated_text":"Hello world"}"#
    );
    assert_eq!(
        format::compat_response(&o, &plain),
        r#"[{"generated_text":"Hello world"}]"#
    );

    let mut o = hello();
    o.best.seed = Some(7);
    o.best.tokens.truncate(1);
    o.best.generated_tokens = 1;
    o.best.text = "He".into();
    o.prefill = vec![TokenOut::new(1, "<s>", None, true), tok(4, "This", -3.5)];
    let details = GenerationSpec {
        details: true,
        ..GenerationSpec::default()
    };
    assert_eq!(
        format::generate_response(&o, &details),
        r#"{"generated_text":"He","details":{"finish_reason":"length","generated_tokens":1,"seed":7,"prefill":[],"tokens":[{"id":244,"text":"He","logprob":-0.5,"special":false}]}}"#
    );
    let dec = GenerationSpec {
        decoder_input_details: true,
        ..GenerationSpec::default()
    };
    assert_eq!(
        format::generate_response(&o, &dec),
        r#"{"generated_text":"He","details":{"finish_reason":"length","generated_tokens":1,"seed":7,"prefill":[{"id":1,"text":"<s>","logprob":null},{"id":4,"text":"This","logprob":-3.5}],"tokens":[{"id":244,"text":"He","logprob":-0.5,"special":false}]}}"#
    );
}

#[test]
fn best_of_sequences_and_top_tokens() {
    let mut o = out(
        "x",
        1,
        seq("a", FinishReason::StopSequence, vec![tok(5, "a", -0.5)]),
    );
    o.best.top_tokens = vec![vec![tok(5, "a", -0.5)]];
    let mut other = seq("b", FinishReason::Length, vec![tok(6, "b", -1.0)]);
    other.seed = Some(3);
    o.others.push(other);
    let spec = GenerationSpec {
        details: true,
        top_n_tokens: 1,
        ..GenerationSpec::default()
    };
    assert_eq!(
        format::generate_response(&o, &spec),
        r#"{"generated_text":"a","details":{"finish_reason":"stop_sequence","generated_tokens":1,"seed":null,"prefill":[],"tokens":[{"id":5,"text":"a","logprob":-0.5,"special":false}],"best_of_sequences":[{"generated_text":"b","finish_reason":"length","generated_tokens":1,"seed":3,"prefill":[],"tokens":[{"id":6,"text":"b","logprob":-1.0,"special":false}]}],"top_tokens":[[{"id":5,"text":"a","logprob":-0.5,"special":false}]]}}"#
    );
}

#[test]
fn nan_logprob_is_null() {
    let t = TokenOut::new(1, "a", Some(f32::NAN), false);
    let o = out("x", 1, seq("a", FinishReason::Length, vec![t.clone()]));
    assert!(
        format::stream_response(1, &t, &[], Some(&o), &GenerationSpec::default())
            .contains("\"logprob\":null")
    );
}

#[test]
fn tokenize_and_info() {
    let spans = vec![
        TokenSpan {
            id: 1,
            text: "Hello".into(),
            start: 0,
            stop: 5,
        },
        TokenSpan {
            id: 2,
            text: " world".into(),
            start: 5,
            stop: 11,
        },
    ];
    assert_eq!(
        format::tokenize_response(&spans),
        r#"[{"id":1,"text":"Hello","start":0,"stop":5},{"id":2,"text":" world","start":5,"stop":11}]"#
    );
    let i = InfoIn::new("HuggingFaceTB/SmolLM2-135M-Instruct", 8191, 8192, "0.1.0");
    assert_eq!(
        info(&i),
        r#"{"model_id":"HuggingFaceTB/SmolLM2-135M-Instruct","model_sha":null,"model_pipeline_tag":"text-generation","max_concurrent_requests":128,"max_best_of":2,"max_stop_sequences":4,"max_input_tokens":8191,"max_total_tokens":8192,"validation_workers":2,"max_client_batch_size":4,"router":"text-generation-router","version":"0.1.0","sha":null,"docker_label":null}"#
    );
}
