use crate::common::*;
use lmi_api::lmi::format;
use lmi_api::{FinishReason, GenerationSpec, TokenOut};

fn spec() -> GenerationSpec {
    GenerationSpec::default()
}

#[test]
// The seed's exact digits: float32 values as Python prints them.
#[allow(clippy::excessive_precision)]
fn seed_001_jsonlines_lines_exact() {
    // Seed 001's streaming example: the same tokens must print the same bytes.
    let t1 = tok(304, "Deep ", -0.052432529628276825);
    let t2 = tok(11157, " Learning", -1.2865009307861328);
    let t3 = tok(278, " is", -0.007458459585905075);
    assert_eq!(
        format::jsonlines_token(&t1),
        "{\"token\": {\"id\": 304, \"text\": \"Deep \", \"log_prob\": -0.052432529628276825}}\n"
    );
    assert_eq!(
        format::jsonlines_token(&t2),
        "{\"token\": {\"id\": 11157, \"text\": \" Learning\", \"log_prob\": -1.2865009307861328}}\n"
    );
    assert_eq!(
        format::jsonlines_token(&t3),
        "{\"token\": {\"id\": 278, \"text\": \" is\", \"log_prob\": -0.007458459585905075}}\n"
    );

    let last = tok(5972, " field.", -0.6950479745864868);
    let mut o = out(
        "What is Deep Learning?",
        6,
        seq(
            "Deep Learning is a really cool field.",
            FinishReason::Length,
            vec![t1, last],
        ),
    );
    o.best.generated_tokens = 100;
    let s = GenerationSpec {
        details: true,
        ..spec()
    };
    assert_eq!(
        format::jsonlines_last(&o, &s),
        "{\"token\": {\"id\": 5972, \"text\": \" field.\", \"log_prob\": -0.6950479745864868}, \"generated_text\": \"Deep Learning is a really cool field.\", \"details\": {\"finish_reason\": \"length\", \"generated_tokens\": 100, \"inputs\": \"What is Deep Learning?\"}}\n"
    );
    // Without details the last line still carries generated_text.
    assert_eq!(
        format::jsonlines_last(&o, &spec()),
        "{\"token\": {\"id\": 5972, \"text\": \" field.\", \"log_prob\": -0.6950479745864868}, \"generated_text\": \"Deep Learning is a really cool field.\"}\n"
    );
}

#[test]
// The seed's exact digits: float32 values as Python prints them.
#[allow(clippy::excessive_precision)]
fn seed_001_token_object() {
    let t = tok(763, " In", -3.977081060409546);
    assert_eq!(
        format::jsonlines_token(&t),
        "{\"token\": {\"id\": 763, \"text\": \" In\", \"log_prob\": -3.977081060409546}}\n"
    );
}

#[test]
fn special_token_only_when_true_and_null_logprob() {
    let t = TokenOut::new(2, "</s>", None, true);
    assert_eq!(
        format::jsonlines_token(&t),
        "{\"token\": {\"id\": 2, \"text\": \"</s>\", \"log_prob\": null, \"special_token\": true}}\n"
    );
}

#[test]
fn sse_framing() {
    let t = tok(304, "Deep ", -0.5);
    assert_eq!(
        format::sse_token(&t),
        "data: {\"token\": {\"id\": 304, \"text\": \"Deep \", \"log_prob\": -0.5}}\n\n"
    );
    let o = hello();
    assert_eq!(
        format::sse_last(&o, &spec()),
        "data: {\"token\": {\"id\": 4558, \"text\": \" world\", \"log_prob\": -1.5}, \"generated_text\": \"Hello world\"}\n\n"
    );
}

#[test]
fn json_plain_and_details() {
    let o = hello();
    assert_eq!(
        format::json(&o, &spec()),
        "{\"generated_text\": \"Hello world\"}"
    );
    let s = GenerationSpec {
        details: true,
        ..spec()
    };
    assert_eq!(
        format::json(&o, &s),
        "{\"generated_text\": \"Hello world\", \"details\": {\"finish_reason\": \"length\", \"generated_tokens\": 3, \"inputs\": \"This is a wonderful day\", \"tokens\": [{\"id\": 244, \"text\": \"He\", \"log_prob\": -0.5}, {\"id\": 30, \"text\": \"llo\", \"log_prob\": -0.25}, {\"id\": 4558, \"text\": \" world\", \"log_prob\": -1.5}]}}"
    );
}

#[test]
fn json_return_full_text() {
    let s = GenerationSpec {
        return_full_text: true,
        ..spec()
    };
    assert_eq!(
        format::json(&hello(), &s),
        "{\"generated_text\": \"This is a wonderful dayHello world\"}"
    );
    let line = format::jsonlines_last(&hello(), &s);
    assert!(
        line.contains("\"generated_text\": \"This is a wonderful dayHello world\""),
        "{line}"
    );
}

#[test]
fn json_prefill_and_top_tokens() {
    let mut o = hello();
    o.prefill = vec![TokenOut::new(4, "This", None, false), tok(10, " is", -2.0)];
    o.best.top_tokens = vec![
        vec![tok(244, "He", -0.5)],
        vec![tok(30, "llo", -0.25)],
        vec![tok(4558, " world", -1.5)],
    ];
    let s = GenerationSpec {
        details: true,
        decoder_input_details: true,
        top_n_tokens: 1,
        ..spec()
    };
    let v = json(&format::json(&o, &s));
    assert_eq!(
        v["details"]["prefill"],
        json(r#"[{"id":4,"text":"This","log_prob":null},{"id":10,"text":" is","log_prob":-2.0}]"#)
    );
    assert_eq!(
        v["details"]["top_tokens"][2],
        json(r#"[{"id":4558,"text":" world","log_prob":-1.5}]"#)
    );
    let text = format::json(&o, &s);
    // Order: finish_reason, generated_tokens, inputs, tokens, prefill, top_tokens.
    let pos = |k: &str| text.find(k).expect(k);
    assert!(pos("\"tokens\"") < pos("\"prefill\"") && pos("\"prefill\"") < pos("\"top_tokens\""));
}

#[test]
fn json_best_of_sequences_forces_details() {
    let mut o = hello();
    o.others
        .push(seq("Hi", FinishReason::EosToken, vec![tok(5, "Hi", -1.0)]));
    let text = format::json(&o, &spec());
    assert!(text.ends_with(", \"best_of_sequences\": [{\"finish_reason\": \"eos_token\", \"generated_tokens\": 1, \"tokens\": [{\"id\": 5, \"text\": \"Hi\", \"log_prob\": -1.0}], \"generated_text\": \"Hi\"}]}}"), "{text}");
}

#[test]
fn tgi_compat_json_is_array_with_tgi_names() {
    let s = GenerationSpec {
        details: true,
        ..spec()
    };
    let mut o = hello();
    o.best.tokens.truncate(1);
    o.best.generated_tokens = 1;
    o.best.text = "He".into();
    assert_eq!(
        format::tgi_compat_json(&o, &s),
        "[{\"generated_text\": \"He\", \"details\": {\"finish_reason\": \"length\", \"generated_tokens\": 1, \"inputs\": \"This is a wonderful day\", \"tokens\": [{\"id\": 244, \"text\": \"He\", \"logprob\": -0.5, \"special\": false}], \"prefill\": []}}]"
    );
}

#[test]
fn dynamic_batch_bodies() {
    // Seed 001's dynamic-batch example, byte for byte.
    assert_eq!(
        format::dynamic_batch_json(&["Deep Learning is a really cool field"]),
        "[\n  {\n    \"generated_text\": \"Deep Learning is a really cool field\"\n  }\n]"
    );
    let v = json(&format::dynamic_batch_json(&["a", "b"]));
    assert_eq!(
        v,
        json(r#"[{"generated_text":"a"},{"generated_text":"b"}]"#)
    );
    assert_eq!(
        format::dynamic_batch_stream_line(&["This"]),
        "{\"outputs\": [\"This\"]}\n"
    );
    let full = GenerationSpec {
        return_full_text: true,
        ..spec()
    };
    assert_eq!(
        format::dynamic_batch_texts(&[hello()], &full),
        vec!["This is a wonderful dayHello world".to_string()]
    );
}

#[test]
fn non_ascii_stays_utf8() {
    let t = tok(1, "é", -0.5);
    assert_eq!(
        format::jsonlines_token(&t),
        "{\"token\": {\"id\": 1, \"text\": \"é\", \"log_prob\": -0.5}}\n"
    );
}

#[test]
fn seed_error_shapes() {
    assert_eq!(
        format::error_json(),
        "{\"generated_text\": \"\", \"details\": {\"finish_reason\": \"error\", \"generated_tokens\": null, \"inputs\": null, \"tokens\": null}}"
    );
    assert_eq!(
        format::error_line("boom"),
        "{\"token\": {\"id\": -1, \"text\": \"\", \"log_prob\": -1, \"special_token\": true, \"error_msg\": \"boom\"}, \"generated_text\": \"\", \"details\": {\"finish_reason\": \"error\", \"generated_tokens\": null, \"inputs\": null}}\n"
    );
    assert!(format::sse_error("boom").starts_with("data: {\"token\": {\"id\": -1,"));
    assert!(format::sse_error("boom").ends_with("}}\n\n"));
}
