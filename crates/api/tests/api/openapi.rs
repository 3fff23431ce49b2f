//! The OpenAPI document against the code: every formatter's output and every error body
//! validates against the schema the document names for it, every `$ref` resolves, and every
//! request example parses.

use crate::common::*;
use lmi_api::openai::format::{self as oai, OpenAiMeta, Usage};
use lmi_api::openapi::{check, component, openapi};
use lmi_api::tgi::format::{self as tgi, TokenSpan};
use lmi_api::{ApiError, FinishReason, GenerationOut, GenerationSpec, Schema, lmi};
use serde_json::Value;

fn doc() -> Value {
    openapi("0.0.0")
}

/// Validates the JSON text `body` against component `name`.
fn conforms(name: &str, body: &str) {
    let d = doc();
    let schema = component(&d, name).unwrap_or_else(|| panic!("no schema {name}"));
    let v: Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body}"));
    if let Err(e) = check::validate(&d, schema, &v) {
        panic!("{name}: {e}\n{body}");
    }
}

/// The JSON payloads of `data: ...` events (not `[DONE]`).
fn events(sse: &str) -> Vec<String> {
    sse.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: ").or_else(|| e.strip_prefix("data:")))
        .filter(|d| *d != "[DONE]")
        .map(str::to_string)
        .collect()
}

/// Outputs and specs covering the optional parts: details, prefill, top tokens, best_of.
fn cases() -> Vec<(GenerationOut, GenerationSpec)> {
    let plain = GenerationSpec::default();
    let detailed = GenerationSpec {
        details: true,
        decoder_input_details: true,
        top_n_tokens: 2,
        logprobs: Some(2),
        seed: Some(7),
        ..GenerationSpec::default()
    };
    let multi = GenerationSpec {
        details: true,
        n: 2,
        best_of: 2,
        ..GenerationSpec::default()
    };
    // /v1/completions with echo and logprobs: the prompt's logprobs come first.
    let echoed = GenerationSpec {
        return_full_text: true,
        logprobs: Some(2),
        top_n_tokens: 2,
        prompt_logprobs: Some(2),
        ..GenerationSpec::default()
    };
    let mut rich = hello();
    rich.prefill = vec![tok(1, "<s>", 0.0), tok(4, "This", -3.5)];
    rich.prefill[0].logprob = None;
    rich.best.top_tokens = vec![vec![tok(244, "He", -0.5), tok(9, "Hi", -1.0)]; 3];
    rich.best.seed = Some(7);
    let mut two = hello();
    two.others.push(seq(
        "Bye",
        FinishReason::EosToken,
        vec![tok(77, "Bye", -2.0)],
    ));
    let mut scored = rich.clone();
    scored.prefill_top = vec![vec![], vec![tok(4, "This", -3.5), tok(5, "That", -4.0)]];
    vec![
        (hello(), plain),
        (rich, detailed),
        (two, multi),
        (scored, echoed),
    ]
}

fn meta() -> OpenAiMeta {
    OpenAiMeta {
        id: "chatcmpl-1".into(),
        created: 1_700_000_000,
        model: "smol".into(),
        system_fingerprint: None,
    }
}

#[test]
fn every_ref_resolves() {
    fn walk(d: &Value, v: &Value) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    let name = r.trim_start_matches("#/components/schemas/");
                    assert!(component(d, name).is_some(), "dangling {r}");
                }
                m.values().for_each(|x| walk(d, x));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(d, x)),
            _ => {}
        }
    }
    let d = doc();
    walk(&d, &d);
}

#[test]
fn lmi_formatters_conform() {
    for (o, spec) in cases() {
        conforms("LmiResponse", &lmi::format::json(&o, &spec));
        let compat: Value = serde_json::from_str(&lmi::format::tgi_compat_json(&o, &spec)).unwrap();
        conforms("LmiCompatResponses", &compat.to_string());
        conforms(
            "LmiStreamLine",
            &lmi::format::jsonlines_token(&o.best.tokens[0]),
        );
        conforms("LmiStreamLine", &lmi::format::jsonlines_last(&o, &spec));
        for e in events(&lmi::format::sse_last(&o, &spec)) {
            conforms("LmiStreamLine", &e);
        }
    }
    conforms("LmiStreamLine", &lmi::format::error_line("boom"));
    conforms(
        "DynamicBatchResponse",
        &lmi::format::dynamic_batch_json(&["a", "b"]),
    );
}

#[test]
fn tgi_formatters_conform() {
    for (o, spec) in cases() {
        conforms("GenerateResponse", &tgi::generate_response(&o, &spec));
        conforms("GenerateResponses", &tgi::compat_response(&o, &spec));
        let t = &o.best.tokens;
        let first = tgi::stream_event(1, &t[0], &t[..1], None, &spec);
        let last = tgi::stream_event(3, &t[2], &[], Some(&o), &spec);
        for e in events(&first).into_iter().chain(events(&last)) {
            conforms("StreamResponse", &e);
        }
    }
    let spans = [TokenSpan {
        id: 1,
        text: "Hi".into(),
        start: 0,
        stop: 2,
    }];
    conforms("TokenizeResponse", &tgi::tokenize_response(&spans));
    let mut info = lmi_api::tgi::info::InfoIn::new("m", 7, 8, "0.1.0");
    conforms("Info", &lmi_api::tgi::info::info(&info));
    // With every optional field the server fills.
    info.model_dtype = Some("bf16".into());
    info.model_device_type = Some("cpu".into());
    info.max_batch_size = Some(32);
    info.max_batch_prefill_tokens = Some(4096);
    info.max_top_n_tokens = Some(5);
    info.grammar_support = Some(true);
    info.max_grammar_bytes = Some(1 << 16);
    conforms("Info", &lmi_api::tgi::info::info(&info));
}

#[test]
fn openai_formatters_conform() {
    let m = meta();
    for (o, spec) in cases() {
        conforms("ChatCompletion", &oai::chat_completion(&m, &o, &spec));
        conforms(
            "TextCompletion",
            &oai::text_completion(&m, std::slice::from_ref(&o), &spec),
        );
        for usage in [false, true] {
            conforms("ChatCompletionChunk", &oai::chat_chunk_role(&m, 0, usage));
            let t = &o.best.tokens[0];
            let top = o.best.top_tokens.first().cloned().unwrap_or_default();
            conforms(
                "ChatCompletionChunk",
                &oai::chat_chunk_token(&m, 0, t, &top, Some(FinishReason::Length), &spec, usage),
            );
            conforms(
                "ChatCompletionChunk",
                &oai::chat_chunk_finish(&m, 1, FinishReason::StopSequence, usage),
            );
            conforms(
                "TextCompletion",
                &oai::completion_chunk(&m, 0, "x", None, usage),
            );
            let run = oai::TokenRun {
                tokens: &o.prefill,
                top: &o.prefill_top,
                offset: 0,
            };
            conforms(
                "TextCompletion",
                &oai::completion_chunk_with_logprobs(
                    &m,
                    0,
                    "x",
                    &[run],
                    spec.logprobs,
                    None,
                    usage,
                ),
            );
        }
    }
    conforms(
        "ChatCompletionChunk",
        &oai::chat_chunk_usage(&m, Usage::new(3, 4)),
    );
    conforms(
        "TextCompletion",
        &oai::completion_chunk_usage(&m, Usage::new(3, 4)),
    );
    conforms("ModelList", &oai::models_list(&["smol"], "lmi", 0));
}

#[test]
fn error_bodies_conform() {
    let errors = [
        ApiError::validation("bad"),
        ApiError::invalid_json("eof"),
        ApiError::generation("oom"),
        ApiError::overloaded(),
        ApiError::unauthorized(),
        ApiError::timeout(std::time::Duration::from_secs(1)),
    ];
    for e in &errors {
        conforms("ErrorResponse", &e.body(Schema::Tgi));
        conforms("ErrorResponse", &e.body(Schema::OpenAi));
        conforms("LmiError", &e.body(Schema::Lmi));
        conforms("LmiError", &e.body(Schema::LmiDynamicBatch));
        for ev in events(&e.openai_stream_events()) {
            conforms("OpenAiStreamError", &ev);
        }
    }
    conforms(
        "LmiError",
        &lmi_api::lmi_server_error_body(404, "ModelNotFoundException", "no"),
    );
    conforms(
        "ManagementError",
        &lmi_api::lmi_server_error_body(401, "UnauthorizedException", "no"),
    );
}

#[test]
fn request_examples_parse() {
    let d = doc();
    let example = |name: &str| component(&d, name).unwrap()["example"].clone();
    let chat = example("ChatRequest");
    assert!(lmi_api::openai::parse_chat_request(&chat).is_ok());
    let cfg = lmi_api::openai::OpenAiConfig::default();
    assert!(lmi_api::openai::parse_completion_request(&example("CompletionRequest"), &cfg).is_ok());
    let lmi = example("LmiRequest");
    assert!(
        lmi_api::parse_invocation(&lmi, &lmi::LmiConfig::default(), &cfg).is_ok(),
        "{lmi}"
    );
}

/// The payloads of named events (`event: x\ndata: {...}`).
fn named_events(sse: &str) -> Vec<String> {
    sse.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(str::to_string)
        .collect()
}

#[test]
fn responses_and_messages_conform() {
    use lmi_api::anthropic::{self, MessageMeta, MessagesStream, MessagesUsage};
    use lmi_api::openai::ToolCallOut;
    use lmi_api::reply::{ReplyPart, StopKind};
    use lmi_api::responses::{self, ResponseMeta, ResponsesStream, ResponsesUsage};

    let d = doc();
    let example = |name: &str| component(&d, name).unwrap()["example"].clone();
    let req = responses::parse_responses_request(&example("ResponsesRequest")).unwrap();
    assert!(anthropic::parse_messages_request(&example("MessagesRequest"), false).is_ok());
    assert!(anthropic::parse_messages_request(&example("CountTokensRequest"), true).is_ok());

    let call = ToolCallOut {
        id: "call_1".into(),
        name: "f".into(),
        arguments: r#"{"a":1}"#.into(),
    };
    // A model with a reasoning parser: its reasoning first, as a part of its own (streamed
    // in deltas; a whole reply has it in one).
    let parts = [
        ReplyPart::Reasoning("Hm, ".into()),
        ReplyPart::Reasoning("a call.".into()),
        ReplyPart::Text("Hi".into()),
        ReplyPart::ToolCall(call.clone()),
    ];
    let whole = [
        ReplyPart::Reasoning("Hm, a call.".into()),
        ReplyPart::Text("Hi".into()),
        ReplyPart::ToolCall(call),
    ];
    let meta = ResponseMeta {
        id: "resp_1".into(),
        created_at: 1,
        model: "m".into(),
    };
    let usage = ResponsesUsage {
        input_tokens: 3,
        cached_tokens: 0,
        output_tokens: 2,
        reasoning_tokens: 1,
    };
    for stop in [StopKind::ToolUse, StopKind::MaxTokens, StopKind::EndTurn] {
        let items = responses::output_items(&meta, &whole);
        assert_eq!(items[0]["content"][0]["text"], "Hm, a call.");
        let r = responses::response_object(&meta, &req.echo, &items, Some(stop), Some(usage));
        conforms("Response", &r.to_string());
        let mut s = ResponsesStream::new(meta.clone(), req.echo.clone());
        let mut out = s.start();
        for p in &parts {
            out.push_str(&s.part(p));
        }
        out.push_str(&s.finish(stop, usage).0);
        for ev in named_events(&out) {
            conforms("ResponsesStreamEvent", &ev);
        }
    }
    conforms("ResponseDeleted", &responses::deleted("resp_1").to_string());

    let mmeta = MessageMeta {
        id: "msg_1".into(),
        model: "m".into(),
    };
    let musage = MessagesUsage {
        input_tokens: 3,
        cached_tokens: 1,
        output_tokens: 2,
    };
    let m = anthropic::message(
        &mmeta,
        anthropic::content_blocks(&whole),
        Some(StopKind::StopSequence),
        Some("\n"),
        musage,
    );
    conforms("Message", &m.to_string());
    assert_eq!(m["content"][0]["thinking"], "Hm, a call.");
    let mut s = MessagesStream::new(mmeta);
    let mut out = s.start(musage);
    for p in &parts {
        out.push_str(&s.part(p));
    }
    out.push_str(&s.finish(StopKind::ToolUse, None, 2));
    for ev in named_events(&out) {
        conforms("MessagesStreamEvent", &ev);
    }
    conforms("TokenCount", &anthropic::token_count(7).to_string());

    for e in [
        ApiError::validation("bad").with_param("input"),
        ApiError::invalid_json("eof"),
        ApiError::generation("oom"),
        ApiError::overloaded(),
        ApiError::unauthorized(),
        ApiError::not_found("no such response"),
        ApiError::timeout(std::time::Duration::from_secs(1)),
    ] {
        conforms("ResponsesError", &e.body(Schema::Responses));
        conforms("AnthropicError", &e.body(Schema::Anthropic));
        for ev in named_events(&e.responses_stream_event(Some(3))) {
            conforms("ResponsesStreamError", &ev);
        }
        for ev in named_events(&e.anthropic_stream_event()) {
            conforms("AnthropicError", &ev);
        }
        let status = e.status(Schema::Responses);
        assert_eq!(status, e.status(Schema::Anthropic));
        if e.kind == lmi_api::ErrorKind::Validation || e.kind == lmi_api::ErrorKind::InvalidJson {
            assert_eq!(status, 400);
        }
    }
}

/// The embedding and scoring routes: every formatter's output and error body validates against
/// the component the document names, and every request example parses.
#[test]
fn pooling_bodies_conform() {
    use lmi_api::embed::{self, EncodingFormat, format as ef};
    use lmi_api::rerank::{self, format as rf};
    let v = vec![vec![0.5f32, -0.25], vec![1.0, 0.0]];
    for enc in [EncodingFormat::Float, EncodingFormat::Base64] {
        conforms("EmbeddingList", &ef::openai_embeddings(&v, enc, "m", 3));
    }
    conforms("EmbedResponse", &ef::vectors(&v));
    conforms("SimilarityResponse", &ef::similarities(&[0.5, 0.1]));
    let texts = vec!["a".to_string(), "b".to_string()];
    conforms(
        "TeiRerankResponse",
        &rf::tei_rerank(&[0.1, 0.9], Some(&texts)),
    );
    let req = rerank::parse_rerank(&serde_json::json!({"query": "q",
        "documents": ["a", {"text": "b", "x": "y"}]}))
    .unwrap();
    let meta = rf::RerankMeta {
        id: "rerank-1",
        model: "m",
        prompt_tokens: 4,
        api_version: "1",
    };
    conforms(
        "RerankResponse",
        &rf::rerank(&[0.1, 0.9], Some(&req.documents), Some(1), &meta),
    );
    conforms(
        "RerankResponse",
        &rf::rerank(&[0.1, 0.9], None, None, &meta),
    );
    conforms("ScoreResponse", &rf::score(&[0.5], "score-1", 1, "m", 2));
    let labels = vec!["a".to_string(), "b".to_string()];
    conforms(
        "PredictResponse",
        &rf::predict(&[vec![0.3, 0.7]], &labels, false),
    );
    conforms(
        "PredictResponse",
        &rf::predict(&[vec![0.3, 0.7], vec![0.6, 0.4]], &labels, true),
    );
    conforms("LmiScores", &rf::lmi_scores(&[vec![0.5]], false));
    conforms("LmiScores", &rf::lmi_scores(&[vec![0.5], vec![0.2]], true));
    let e = ApiError::too_many_inputs(9, 4, "option.max_client_batch_size");
    conforms("ResponsesError", &e.body(Schema::Responses));
    conforms("ErrorResponse", &e.body(Schema::Tgi));
    conforms("LmiError", &e.body(Schema::Lmi));
    let e = embed::wrong_task("/embed", embed::Served::Generation);
    conforms("ErrorResponse", &e.body(Schema::Tgi));
    conforms("ResponsesError", &e.body(Schema::Responses));

    let d = doc();
    let example = |name: &str| component(&d, name).unwrap()["example"].clone();
    assert!(embed::parse_embeddings_request(&example("EmbeddingsRequest")).is_ok());
    assert!(embed::parse_tei_embed(&example("EmbedRequest")).is_ok());
    assert!(embed::parse_similarity_request(&example("SimilarityRequest")).is_ok());
    assert!(rerank::parse_tei_rerank(&example("TeiRerankRequest")).is_ok());
    assert!(rerank::parse_rerank(&example("RerankRequest")).is_ok());
    assert!(rerank::parse_score(&example("ScoreRequest")).is_ok());
    assert!(rerank::parse_predict(&example("PredictRequest")).is_ok());
}
