use crate::common::json;
use lmi_api::openai::{
    ChatMessage, CompletionPrompt, ContentPart, MessageContent, OpenAiConfig, Role, ToolChoice,
    parse_chat_request, parse_completion_request,
};
use lmi_api::{ErrorKind, Schema};

#[test]
fn chat_request_fields() {
    let r = parse_chat_request(&json(
        r#"{"model":"anything","messages":[{"role":"system","content":"Be brief."},
        {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
        {"role":"tool","content":"42","tool_call_id":"c1"}],
        "max_completion_tokens":50,"max_tokens":10,"temperature":0,"top_p":0.5,"n":2,"stream":true,
        "stream_options":{"include_usage":true},"stop":"END","seed":7,"logprobs":true,"top_logprobs":3,
        "presence_penalty":1,"frequency_penalty":-1,"logit_bias":{"50256":-100},"ignore_eos":true,
        "tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","user":"u","weird":1}"#,
    ))
    .unwrap();
    assert_eq!(r.model.as_deref(), Some("anything"));
    assert_eq!(r.messages.len(), 4);
    assert_eq!(r.messages[1].text(), "Hi");
    assert!(r.messages[1].has_image());
    assert_eq!(r.messages[3].role, Role::Tool);
    let s = &r.spec;
    assert_eq!((s.max_new_tokens, s.max_new_tokens_explicit), (50, true));
    assert!(s.is_greedy() && s.stream && s.ignore_eos && s.details);
    assert_eq!(
        (s.top_p, s.n, s.seed, s.logprobs, s.top_n_tokens),
        (0.5, 2, Some(7), Some(3), 3)
    );
    assert_eq!((s.presence_penalty, s.frequency_penalty), (1.0, -1.0));
    assert_eq!(s.stop_strings, vec!["END"]);
    assert_eq!(s.logit_bias, vec![(50256, -100.0)]);
    assert!(r.include_usage && r.logprobs);
    assert_eq!(r.top_logprobs, 3);
    let tools = r.tools.as_ref().unwrap();
    assert_eq!(tools.tools.len(), 1);
    assert_eq!(tools.choice, ToolChoice::Auto);
    assert!(r.spec.constraint.is_none());
    assert_eq!(r.unknown_fields, vec!["weird"]);
}

#[test]
fn chat_defaults() {
    let r = parse_chat_request(&json(
        r#"{"messages":[{"role":"user","content":"hi"}],"seed":null,"stop":null}"#,
    ))
    .unwrap();
    assert_eq!(r.spec.temperature, 1.0);
    assert!(!r.spec.max_new_tokens_explicit);
    assert_eq!(r.spec.max_new_tokens, usize::MAX);
    assert_eq!(r.spec.logprobs, None);
    assert!(r.model.is_none());
}

#[test]
fn messages_serialize_back_to_openai_json() {
    let m: ChatMessage = serde_json::from_value(json(
        r#"{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"u"}}]}"#,
    ))
    .unwrap();
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"u"}}]}"#
    );
    let m = ChatMessage::new(Role::Assistant, "ok");
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"role":"assistant","content":"ok"}"#
    );
    assert_eq!(m.content, Some(MessageContent::Text("ok".into())));
    let _ = ContentPart::Text {
        text: String::new(),
    };
}

#[test]
fn chat_validation_messages() {
    let cases = [
        (
            r#""temperature":2.5"#,
            "temperature must be in [0, 2], got 2.5",
        ),
        (r#""top_p":0"#, "top_p must be in (0, 1], got 0"),
        (r#""n":0"#, "n must be an integer in [1, 128], got 0"),
        (
            r#""presence_penalty":-3"#,
            "presence_penalty must be in [-2, 2], got -3",
        ),
        (
            r#""frequency_penalty":2.1"#,
            "frequency_penalty must be in [-2, 2], got 2.1",
        ),
        (
            r#""logit_bias":{"5":101}"#,
            "logit_bias values must be in [-100, 100], got 101 for token 5",
        ),
        (
            r#""top_logprobs":21,"logprobs":true"#,
            "top_logprobs must be an integer in [0, 20], got 21",
        ),
        (
            r#""top_logprobs":2"#,
            "top_logprobs requires logprobs to be true",
        ),
        (
            r#""max_tokens":0"#,
            "max_tokens must be a positive integer, got 0",
        ),
        (
            r#""stop":5"#,
            "stop must be a string or an array of strings, got number",
        ),
        (
            r#""response_format":{"type":"json_object","value":5}"#,
            "response_format.value must be a JSON schema object, got number",
        ),
        (
            r#""response_format":{"type":"json_object"},"guided_regex":"a""#,
            "response_format and guided_* both constrain the output: send one of them",
        ),
        (
            r#""tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_object"}"#,
            "a required or named tool_choice already fixes the output's format: drop response_format",
        ),
    ];
    for (field, want) in cases {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],{field}}}"#);
        let e = parse_chat_request(&json(&body)).expect_err(field);
        assert_eq!(e.message, want, "for {field}");
    }
    let e = parse_chat_request(&json(r#"{"messages":[]}"#)).unwrap_err();
    assert_eq!(e.message, "messages must not be empty");
    let e =
        parse_chat_request(&json(r#"{"messages":[{"role":"robot","content":"hi"}]}"#)).unwrap_err();
    assert!(
        e.message
            .starts_with("messages[0] is not a valid message: unknown variant `robot`"),
        "{}",
        e.message
    );
    assert_eq!(e.status(Schema::OpenAi), 422);
}

#[test]
fn completion_request_fields() {
    let cfg = OpenAiConfig::default();
    let r = parse_completion_request(
        &json(r#"{"model":"m","prompt":"Say","echo":true,"logprobs":2,"n":2,"best_of":3}"#),
        &cfg,
    )
    .unwrap();
    assert_eq!(r.prompts, vec![CompletionPrompt::Text("Say".into())]);
    assert_eq!(
        (r.spec.max_new_tokens, r.spec.max_new_tokens_explicit),
        (16, false)
    );
    assert!(r.echo && r.spec.return_full_text);
    assert_eq!(
        (r.logprobs, r.spec.logprobs, r.spec.n, r.spec.best_of),
        (Some(2), Some(2), 2, 3)
    );
    let r =
        parse_completion_request(&json(r#"{"prompt":["a","b"],"max_tokens":5}"#), &cfg).unwrap();
    assert_eq!(
        r.prompts,
        vec![
            CompletionPrompt::Text("a".into()),
            CompletionPrompt::Text("b".into())
        ]
    );
    assert_eq!(r.spec.max_new_tokens, 5);
    assert!(!r.prompt_only && r.spec.prompt_logprobs.is_none());
}

/// lm-eval's loglikelihood request (and vLLM's prompt scoring): token-id prompts, `echo` with
/// `logprobs`, `max_tokens` 0 or 1.
#[test]
fn completion_scores_the_prompt_with_echo_and_logprobs() {
    let cfg = OpenAiConfig::default();
    let r = parse_completion_request(
        &json(
            r#"{"prompt":[[1,2,3],[4,5]],"echo":true,"logprobs":1,"max_tokens":0,"temperature":0}"#,
        ),
        &cfg,
    )
    .unwrap();
    assert_eq!(
        r.prompts,
        vec![
            CompletionPrompt::Tokens(vec![1, 2, 3]),
            CompletionPrompt::Tokens(vec![4, 5])
        ]
    );
    // Nothing is returned, but the scheduler draws one token after the prefill.
    assert!(r.prompt_only);
    assert_eq!(r.spec.max_new_tokens, 1);
    assert_eq!(
        (r.spec.prompt_logprobs, r.spec.logprobs),
        (Some(1), Some(1))
    );
    let r = parse_completion_request(
        &json(r#"{"prompt":[7,8],"echo":true,"logprobs":3,"max_completion_tokens":0}"#),
        &cfg,
    )
    .unwrap();
    assert_eq!(r.prompts, vec![CompletionPrompt::Tokens(vec![7, 8])]);
    assert!(r.prompt_only && r.spec.prompt_logprobs == Some(3));
    let r = parse_completion_request(
        &json(r#"{"prompt":"a","echo":true,"logprobs":1,"max_tokens":1}"#),
        &cfg,
    )
    .unwrap();
    assert!(!r.prompt_only && r.spec.max_new_tokens == 1);
    assert_eq!(r.spec.prompt_logprobs, Some(1));
    // echo without logprobs scores nothing.
    let r = parse_completion_request(&json(r#"{"prompt":"a","echo":true}"#), &cfg).unwrap();
    assert_eq!(r.spec.prompt_logprobs, None);
}

#[test]
fn completion_prompt_and_max_tokens_errors_say_what_to_fix() {
    let cfg = OpenAiConfig::default();
    let err = |body: &str| parse_completion_request(&json(body), &cfg).unwrap_err();
    let e = err(r#"{"prompt":"a","max_tokens":0}"#);
    assert_eq!(
        e.message,
        "max_tokens must be a positive integer, got 0 (0 is only for scoring the prompt, with \"echo\": true)"
    );
    assert_eq!(e.status(Schema::OpenAi), 422);
    let e = err(r#"{"prompt":[1,-2]}"#);
    assert_eq!(
        e.message,
        "prompt[1] must be a token id (integer 0..=4294967295), got -2"
    );
    let e = err(r#"{"prompt":[[1],[]]}"#);
    assert_eq!(e.message, "prompt[1] must not be an empty list");
    let e = err(r#"{"prompt":[[1],[4294967296]]}"#);
    assert_eq!(e.param.as_deref(), Some("prompt[1][0]"));
    let e = err(r#"{"prompt":[1,"a"]}"#);
    assert_eq!(e.message, "prompt[0] must be a string, got number");
}

#[test]
fn completion_errors() {
    let cfg = OpenAiConfig::default();
    let e = parse_completion_request(&json(r#"{"prompt":"a","suffix":"z"}"#), &cfg).unwrap_err();
    assert_eq!(e.kind, ErrorKind::SuffixNotSupported);
    assert_eq!(
        e.openai_body(),
        r#"{"error":"Suffix is not supported and can be achieved by preprocessing the prompt.","error_type":"suffix not supported"}"#
    );
    assert_eq!(e.status(Schema::OpenAi), 422);
    let e =
        parse_completion_request(&json(r#"{"prompt":["1","2","3","4","5"]}"#), &cfg).unwrap_err();
    assert_eq!(
        e.openai_body(),
        r#"{"error":"Number of prompts exceeds the maximum allowed batch size of 4","error_type":"batch size exceeded"}"#
    );
    let e = parse_completion_request(&json(r#"{"prompt":[]}"#), &cfg).unwrap_err();
    assert_eq!(e.message, "prompt must not be an empty list");
    let e = parse_completion_request(&json(r#"{"prompt":"a","logprobs":6}"#), &cfg).unwrap_err();
    assert_eq!(e.message, "logprobs must be an integer in [0, 5], got 6");
    let e =
        parse_completion_request(&json(r#"{"prompt":"a","n":3,"best_of":2}"#), &cfg).unwrap_err();
    assert_eq!(e.message, "best_of must be >= n (3), got 2");
}

#[test]
fn structured_output_and_forced_tools_become_constraints() {
    use lmi_api::Constraint;
    let chat = |extra: &str| {
        parse_chat_request(&json(&format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
        )))
        .unwrap()
    };
    assert_eq!(
        chat(r#","response_format":{"type":"json_object"}"#)
            .spec
            .constraint,
        Some(Constraint::JsonObject)
    );
    assert_eq!(
        chat(r#","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"},"strict":true}}"#)
            .spec
            .constraint,
        Some(Constraint::JsonSchema(json(r#"{"type":"object"}"#)))
    );
    assert_eq!(
        chat(r#","guided_choice":["a","b"]"#).spec.constraint,
        Some(Constraint::Choice(vec!["a".into(), "b".into()]))
    );
    let r = chat(
        r#","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}],"tool_choice":{"type":"function","function":{"name":"f"}}"#,
    );
    match r.spec.constraint {
        Some(Constraint::JsonSchema(s)) => {
            assert_eq!(s["properties"]["name"]["const"], "f");
            assert_eq!(
                s["properties"]["arguments"]["properties"]["x"]["type"],
                "integer"
            );
        }
        other => panic!("{other:?}"),
    }
    let c = parse_completion_request(
        &json(r#"{"prompt":"x","guided_regex":"[0-9]+"}"#),
        &OpenAiConfig::default(),
    )
    .unwrap();
    assert_eq!(c.spec.constraint, Some(Constraint::Regex("[0-9]+".into())));
}

/// A message without content is refused (422, naming the message), except an assistant turn
/// carrying tool calls, whose content may be absent or null.
#[test]
fn messages_need_content_unless_they_carry_tool_calls() {
    for (body, want) in [
        (
            r#"{"messages":[{"role":"user"}]}"#,
            "messages[0].content is required for a user message",
        ),
        (
            r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null}]}"#,
            "messages[1].content is required for an assistant message (or `tool_calls`)",
        ),
        (
            r#"{"messages":[{"role":"assistant","tool_calls":[]}]}"#,
            "messages[0].content is required for an assistant message (or `tool_calls`)",
        ),
        (
            r#"{"messages":[{"role":"tool","tool_call_id":"c1"}]}"#,
            "messages[0].content is required for a tool message",
        ),
    ] {
        let e = parse_chat_request(&json(body)).expect_err(body);
        assert_eq!(e.message, want);
        assert_eq!(e.status(Schema::OpenAi), 422);
        assert_eq!(e.status(Schema::Lmi), 424);
    }
    let call = r#"{"messages":[{"role":"user","content":"weather?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"sunny"}]}"#;
    assert_eq!(parse_chat_request(&json(call)).unwrap().messages.len(), 3);
}

/// Chat without `max_tokens` runs to `max_model_len`: the default is clamped to what the
/// prompt leaves (it used to overflow `prompt + usize::MAX`).
#[test]
fn chat_default_max_tokens_is_clamped_to_the_context() {
    let mut spec = parse_chat_request(&json(r#"{"messages":[{"role":"user","content":"hi"}]}"#))
        .unwrap()
        .spec;
    assert!(!spec.max_new_tokens_explicit);
    spec.fit_context(30, 96).unwrap();
    assert_eq!(spec.max_new_tokens, 66);
    let mut explicit = parse_chat_request(&json(
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4294967295}"#,
    ))
    .unwrap()
    .spec;
    assert!(explicit.fit_context(30, 96).is_err());
}

#[test]
fn predictions_become_drafts() {
    use lmi_api::Draft;
    let chat = |extra: &str| {
        parse_chat_request(&json(&format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
        )))
    };
    let text = |extra: &str| chat(extra).unwrap().spec.draft;
    assert_eq!(
        text(r#","prediction":{"type":"content","content":"abc"}"#),
        Some(Draft::Text("abc".into()))
    );
    assert_eq!(
        text(
            r#","prediction":{"type":"content","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#
        ),
        Some(Draft::Text("ab".into()))
    );
    assert_eq!(
        text(r#","prediction":{"type":"content","content":""}"#),
        None
    );
    assert_eq!(text(""), None);
    let e = chat(r#","prediction":{"type":"file","content":"x"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("prediction.type"));
    let e =
        chat(r#","prediction":{"type":"content","content":[{"type":"image_url"}]}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("prediction.content[0]"));
    let c = parse_completion_request(
        &json(r#"{"prompt":"x","prediction":{"type":"content","content":"y"}}"#),
        &OpenAiConfig::default(),
    )
    .unwrap();
    assert_eq!(c.spec.draft, Some(Draft::Text("y".into())));
}
