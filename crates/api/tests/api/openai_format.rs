use crate::common::*;
use lmi_api::openai::format::{self, OpenAiMeta, Usage};
use lmi_api::sse;
use lmi_api::{FinishReason, GenerationSpec, TokenOut};

fn meta() -> OpenAiMeta {
    OpenAiMeta {
        id: "chatcmpl-1".into(),
        created: 1700000000,
        model: "smol".into(),
        system_fingerprint: None,
    }
}

#[test]
fn chat_completion_body() {
    let o = out(
        "prompt",
        5,
        seq(
            "Hello world",
            FinishReason::EosToken,
            vec![tok(1, "Hello", -0.5), tok(2, " world", -0.25)],
        ),
    );
    assert_eq!(
        format::chat_completion(&meta(), &o, &GenerationSpec::default()),
        r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"smol","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#
    );
}

#[test]
fn chat_completion_logprobs_and_n() {
    let mut o = out(
        "p",
        1,
        seq("a", FinishReason::Length, vec![tok(1, "a", -0.5)]),
    );
    o.best.top_tokens = vec![vec![tok(1, "a", -0.5), tok(2, "b", -1.0)]];
    o.others.push(seq(
        "c",
        FinishReason::StopSequence,
        vec![tok(3, "c", -2.0)],
    ));
    let spec = GenerationSpec {
        logprobs: Some(1),
        n: 2,
        ..GenerationSpec::default()
    };
    let v = json(&format::chat_completion(&meta(), &o, &spec));
    assert_eq!(
        v["choices"][0]["logprobs"],
        json(
            r#"{"content":[{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[{"token":"a","logprob":-0.5,"bytes":[97]}]}]}"#
        )
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["choices"][1]["finish_reason"], "stop");
    assert_eq!(
        v["usage"],
        json(r#"{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}"#)
    );
}

#[test]
fn chat_stream_sequence() {
    let m = OpenAiMeta {
        system_fingerprint: Some("0.1.0-native".into()),
        ..meta()
    };
    let spec = GenerationSpec::default();
    let mut s = String::new();
    s += &sse::data(&format::chat_chunk_role(&m, 0, true));
    s += &sse::data(&format::chat_chunk_token(
        &m,
        0,
        &tok(1, "Hi", -0.5),
        &[],
        None,
        &spec,
        true,
    ));
    s += &sse::data(&format::chat_chunk_token(
        &m,
        0,
        &TokenOut::new(2, "</s>", Some(-0.1), true),
        &[],
        Some(FinishReason::EosToken),
        &spec,
        true,
    ));
    s += &sse::data(&format::chat_chunk_usage(&m, Usage::new(3, 2)));
    s += sse::DONE;
    let head = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"smol","system_fingerprint":"0.1.0-native","#;
    let want = format!(
        "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n\
         data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n\
         data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":\"stop\"}}],\"usage\":null}}\n\n\
         data: {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}}}\n\n\
         data: [DONE]\n\n"
    );
    assert_eq!(s, want);
}

#[test]
fn chat_chunk_without_usage_and_finish_only() {
    let c = format::chat_chunk_finish(&meta(), 1, FinishReason::Length, false);
    assert_eq!(
        c,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"smol","choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"length"}]}"#
    );
}

/// `echo` with `logprobs`: the prompt's tokens first (the first with null logprob and
/// alternatives, offsets from 0), then the generated ones (offsets after the prompt text).
#[test]
fn text_completion_echoes_the_prompt_logprobs() {
    let m = OpenAiMeta {
        id: "cmpl-1".into(),
        ..meta()
    };
    let mut a = out(
        "Say hi",
        2,
        seq("!", FinishReason::Length, vec![tok(3, "!", -0.25)]),
    );
    a.prefill = vec![TokenOut::new(1, "Say", None, false), tok(2, " hi", -1.5)];
    a.prefill_top = vec![vec![], vec![tok(9, " yes", -0.5), tok(2, " hi", -1.5)]];
    a.best.top_tokens = vec![vec![tok(3, "!", -0.25)]];
    let spec = GenerationSpec {
        return_full_text: true,
        logprobs: Some(1),
        prompt_logprobs: Some(1),
        ..GenerationSpec::default()
    };
    assert_eq!(
        format::text_completion(&m, std::slice::from_ref(&a), &spec),
        r#"{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"smol","choices":[{"index":0,"text":"Say hi!","logprobs":{"tokens":["Say"," hi","!"],"token_logprobs":[null,-1.5,-0.25],"top_logprobs":[null,{" yes":-0.5},{"!":-0.25}],"text_offset":[0,3,6]},"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}"#
    );
    // Without echo the prompt's logprobs are not listed.
    let spec = GenerationSpec {
        return_full_text: false,
        ..spec
    };
    assert_eq!(
        format::text_completion(&m, std::slice::from_ref(&a), &spec),
        r#"{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"smol","choices":[{"index":0,"text":"!","logprobs":{"tokens":["!"],"token_logprobs":[-0.25],"top_logprobs":[{"!":-0.25}],"text_offset":[0]},"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}"#
    );
    // A stream's echo chunk carries the prompt's logprobs.
    let run = format::TokenRun {
        tokens: &a.prefill,
        top: &a.prefill_top,
        offset: 0,
    };
    assert_eq!(
        format::completion_chunk_with_logprobs(&m, 1, "Say hi", &[run], Some(2), None, false),
        r#"{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"smol","choices":[{"index":1,"text":"Say hi","logprobs":{"tokens":["Say"," hi"],"token_logprobs":[null,-1.5],"top_logprobs":[null,{" yes":-0.5," hi":-1.5}],"text_offset":[0,3]},"finish_reason":null}]}"#
    );
}

#[test]
fn text_completion_body_and_chunks() {
    let m = OpenAiMeta {
        id: "cmpl-1".into(),
        ..meta()
    };
    let a = out(
        "Say",
        1,
        seq(" hi", FinishReason::Length, vec![tok(1, " hi", -0.5)]),
    );
    let b = out(
        "Go",
        1,
        seq("!", FinishReason::EosToken, vec![tok(2, "!", -0.25)]),
    );
    let spec = GenerationSpec {
        return_full_text: true,
        logprobs: Some(0),
        ..GenerationSpec::default()
    };
    assert_eq!(
        format::text_completion(&m, &[a, b], &spec),
        r#"{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"smol","choices":[{"index":0,"text":"Say hi","logprobs":{"tokens":[" hi"],"token_logprobs":[-0.5],"top_logprobs":[{}],"text_offset":[3]},"finish_reason":"length"},{"index":1,"text":"Go!","logprobs":{"tokens":["!"],"token_logprobs":[-0.25],"top_logprobs":[{}],"text_offset":[2]},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}"#
    );
    assert_eq!(
        format::completion_chunk(&m, 0, " hi", None, false),
        r#"{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"smol","choices":[{"index":0,"text":" hi","logprobs":null,"finish_reason":null}]}"#
    );
    assert_eq!(
        format::completion_chunk_usage(&m, Usage::new(1, 1)),
        r#"{"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"smol","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#
    );
}

#[test]
fn models_list_body() {
    assert_eq!(
        format::models_list(&["smol"], "lmi", 0),
        r#"{"object":"list","data":[{"id":"smol","object":"model","created":0,"owned_by":"lmi"}]}"#
    );
}

#[test]
fn finish_reason_strings() {
    assert_eq!(FinishReason::EosToken.as_openai(), "stop");
    assert_eq!(FinishReason::StopSequence.as_openai(), "stop");
    assert_eq!(FinishReason::Length.as_openai(), "length");
    assert_eq!(FinishReason::StopSequence.as_lmi(), "stop_sequence");
    assert_eq!(FinishReason::EosToken.as_tgi(), "eos_token");
}
