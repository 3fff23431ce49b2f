//! Reasoning replies end to end: the built `lmi` serving tiny random models whose chat
//! templates think as Qwen3's and DeepSeek-R1's do. The default model does not think, so the
//! replies are shaped by a guided regex (the server really generates `<think>...</think>answer`
//! token by token) or left free under a thinking budget; checked over HTTP and with the
//! `openai` SDK (tests/reasoning/test_openai_sdk.py).

mod common;

use std::path::Path;

use common::*;
use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use serde_json::{Value, json};

/// Qwen3's template, reduced: `enable_thinking: false` writes an empty reasoning block into
/// the prompt; `note` is any other variable a template may read.
const QWEN3_TEMPLATE: &str = "{%- if note is defined %}{{ note }}{% endif %}\
{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endfor %}\
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}\
{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

/// Rewrites the JSON file `name` of a model directory with `f`.
fn edit_json(dir: &Path, name: &str, f: impl FnOnce(&mut Value)) {
    let path = dir.join(name);
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

/// A tiny Qwen3-architecture model whose vocabulary ends with `tokens` as added tokens (ids
/// from 260; `special` as the tokenizer marks them) and whose chat template is `template`.
fn tiny_model_with_tokens(dir: &Path, tokens: &[&str], special: bool, template: &str) {
    let spec = TinySpec {
        vocab_size: 260 + tokens.len(),
        ..TinySpec::qwen3()
    };
    write_tiny_model(dir, &spec).unwrap();
    edit_json(dir, "tokenizer.json", |tok| {
        for (i, t) in tokens.iter().enumerate() {
            let id = 260 + i;
            tok["added_tokens"]
                .as_array_mut()
                .unwrap()
                .push(json!({"id": id, "content": t,
                "single_word": false, "lstrip": false, "rstrip": false, "normalized": false,
                "special": special}));
            tok["model"]["vocab"][t] = json!(id);
        }
    });
    edit_json(dir, "tokenizer_config.json", |cfg| {
        cfg["chat_template"] = json!(template)
    });
}

/// A tiny Qwen3 model; `tag_tokens`: `<think>` and `</think>` are single (added, not special)
/// tokens 260 and 261, as in Qwen3's vocabulary; otherwise they are 7 and 8 byte tokens.
fn qwen3_model(dir: &Path, tag_tokens: bool) {
    let tags: &[&str] = if tag_tokens {
        &["<think>", "</think>"]
    } else {
        &[]
    };
    tiny_model_with_tokens(dir, tags, false, QWEN3_TEMPLATE);
}

fn chat(port: u16, body: Value) -> Value {
    let r = post(port, "/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The stream's chunks (without `[DONE]`).
fn chat_stream(port: u16, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post(port, "/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The generated tokens' texts, from `logprobs.content`.
fn token_texts(reply: &Value) -> Vec<String> {
    reply["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap().to_string())
        .collect()
}

/// Tokens up to and including the one that completes `</think>` (the reasoning's share of
/// the reply, as the server should count it).
fn tokens_through_close(texts: &[String]) -> usize {
    let mut text = String::new();
    for (i, t) in texts.iter().enumerate() {
        text.push_str(t);
        if text.contains("</think>") {
            return i + 1;
        }
    }
    panic!("no </think> in {texts:?}")
}

fn reasoning_tokens(reply: &Value) -> &Value {
    &reply["usage"]["completion_tokens_details"]["reasoning_tokens"]
}

/// Reasoning deltas, then content deltas, never interleaved; returns both joined.
fn stream_parts(chunks: &[Value]) -> (String, String) {
    let (mut reasoning, mut content) = (String::new(), String::new());
    for c in chunks {
        let Some(delta) = c["choices"].get(0).map(|ch| &ch["delta"]) else {
            continue;
        };
        if let Some(r) = delta["reasoning_content"].as_str() {
            assert!(
                content.is_empty(),
                "reasoning after the answer began: {chunks:?}"
            );
            reasoning.push_str(r);
        }
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
    }
    (reasoning, content)
}

/// A streamed reply: 3 letters of reasoning, no content, one `tool_calls` delta.
fn assert_one_call_after_three_letters_of_reasoning(chunks: &[Value]) {
    let (thought, content) = stream_parts(chunks);
    assert_eq!((thought.len(), content.as_str()), (3, ""));
    let calls = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .count();
    assert_eq!(calls, 1, "{chunks:?}");
}

fn prompt_tokens(port: u16, body: Value) -> i64 {
    chat(port, body)["usage"]["prompt_tokens"].as_i64().unwrap()
}

fn tokenize(port: u16, text: &str) -> usize {
    let r = post(port, "/tokenize", &json!({"inputs": text}).to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.json().as_array().unwrap().len()
}

#[test]
fn reasoning_apart_from_the_answer_on_a_qwen3_style_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-qwen3-think");
    qwen3_model(&model, true);
    let mut server = start(
        &model,
        &[
            "--kv-cache-bytes",
            "16M",
            "-o",
            "option.tool_call_parser=hermes",
        ],
    );
    wait_ready(&mut server, "tiny-qwen3-think");
    let port = server.port;

    // The split, and its count from the tokens the server reports.
    let body = json!({"messages": user("Is it?"), "max_tokens": 40, "temperature": 0,
        "logprobs": true, "guided_regex": "<think>[a-z]{4}</think>\n\n(yes|no)"});
    let reply = chat(port, body.clone());
    let msg = &reply["choices"][0]["message"];
    let thought = msg["reasoning_content"].as_str().unwrap();
    assert!(
        thought.len() == 4 && thought.bytes().all(|b| b.is_ascii_lowercase()),
        "{msg}"
    );
    let answer = msg["content"].as_str().unwrap();
    assert!(answer == "yes" || answer == "no", "{msg}");
    let texts = token_texts(&reply);
    assert_eq!(
        texts.concat(),
        format!("<think>{thought}</think>\n\n{answer}")
    );
    assert_eq!(
        reasoning_tokens(&reply),
        &json!(tokens_through_close(&texts))
    );

    // Streamed: the same split, reasoning first, and the same count.
    let chunks = chat_stream(port, body);
    assert_eq!(
        stream_parts(&chunks),
        (thought.to_string(), answer.to_string())
    );
    let usage = chunks.last().unwrap();
    assert_eq!(reasoning_tokens(usage), reasoning_tokens(&reply));

    // Never closed (cut by max_tokens): all of it is reasoning.
    let reply = chat(
        port,
        json!({"messages": user("Hm"), "max_tokens": 6, "temperature": 0,
            "guided_regex": "<think>[a-z]{30}</think>x"}),
    );
    let msg = &reply["choices"][0]["message"];
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    assert_eq!(msg["reasoning_content"].as_str().unwrap().len(), 5, "{msg}");
    assert_eq!(msg["content"], "");
    assert_eq!(reasoning_tokens(&reply), &json!(6));

    // A tool call after the reasoning is a call; one inside the reasoning is not.
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let call =
        r#"<tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}</tool_call>"#;
    let reply = chat(
        port,
        json!({"messages": user("Weather?"), "max_tokens": 110, "temperature": 0, "tools": tools,
            "guided_regex": format!("<think>[a-z]{{3}}</think>\n\n{call}")}),
    );
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        choice["message"]["reasoning_content"]
            .as_str()
            .unwrap()
            .len(),
        3
    );
    let reply = chat(
        port,
        json!({"messages": user("Weather?"), "max_tokens": 110, "temperature": 0, "tools": tools,
            "guided_regex": format!("<think>{call}</think>\n\nok")}),
    );
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{choice}");
    assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
    assert_eq!(choice["message"]["content"], "ok");
    assert!(
        choice["message"]["reasoning_content"]
            .as_str()
            .unwrap()
            .starts_with("<tool_call>")
    );
    let chunks = chat_stream(
        port,
        json!({"messages": user("Weather?"), "max_tokens": 110, "temperature": 0, "tools": tools,
            "guided_regex": format!("<think>[a-z]{{3}}</think>\n\n{call}")}),
    );
    assert_one_call_after_three_letters_of_reasoning(&chunks);

    // chat_template_kwargs reach the template: the prompt grows by what it writes.
    let plain = prompt_tokens(port, json!({"messages": user("Hi"), "max_tokens": 1}));
    let no_think = prompt_tokens(
        port,
        json!({"messages": user("Hi"), "max_tokens": 1,
            "chat_template_kwargs": {"enable_thinking": false}}),
    );
    assert_eq!(
        (no_think - plain) as usize,
        tokenize(port, "<think>\n\n</think>\n\n")
    );
    assert_eq!(tokenize(port, "<think>\n\n</think>\n\n"), 6);
    let noted = prompt_tokens(
        port,
        json!({"messages": user("Hi"), "max_tokens": 1,
            "chat_template_kwargs": {"note": "abc"}}),
    );
    assert_eq!(noted - plain, 3);
    // Thinking off: the reply is all answer, and a budget does not apply.
    let reply = chat(
        port,
        json!({"messages": user("Hi"), "max_tokens": 8, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": false}, "thinking_token_budget": 2,
            "guided_regex": "yes"}),
    );
    assert_eq!(reply["choices"][0]["message"]["content"], "yes");
    assert!(
        reply["choices"][0]["message"]
            .get("reasoning_content")
            .is_none()
    );

    // A budget cuts the reasoning at its count; the closing tag is forced and the answer
    // follows. Both spellings.
    for (field, budget) in [("thinking_token_budget", 5), ("thinking_budget_tokens", 2)] {
        let reply = chat(
            port,
            json!({"messages": user("Think"), "max_tokens": 40, "temperature": 0,
                "logprobs": true, field: budget}),
        );
        let texts = token_texts(&reply);
        let msg = &reply["choices"][0]["message"];
        let thought = msg["reasoning_content"].as_str().unwrap();
        // The tokens between the tags are the budget's.
        let open = texts.iter().position(|t| t == "<think>").unwrap_or(6);
        let close = tokens_through_close(&texts);
        let inner: String = texts[open + 1..close].concat();
        assert_eq!(inner.strip_suffix("</think>"), Some(thought), "{texts:?}");
        // The tag as one token, or as 8 bytes (the last token may also carry the rest of a
        // character the budget cut).
        let closing_tokens = if texts[close - 1].ends_with("</think>") {
            1
        } else {
            8
        };
        assert_eq!(close - open - 1 - closing_tokens, budget, "{texts:?}");
        assert_eq!(reasoning_tokens(&reply), &json!(close));
        assert_eq!(texts[close..close + 2].concat(), "\n\n", "{texts:?}");
        assert!(!thought.contains("</think>"));
        assert_eq!(
            msg["content"].as_str().unwrap(),
            texts[close + 2..]
                .concat()
                .trim_start()
                .trim_end_matches("<|im_end|>")
        );
    }
    // 0: no reasoning at all; a JSON schema applies to the answer.
    let reply = chat(
        port,
        json!({"messages": user("Json"), "max_tokens": 60, "temperature": 0,
            "thinking_token_budget": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema":
                {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                 "additionalProperties": false}}}}),
    );
    let msg = &reply["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], "", "{msg}");
    let answer: Value = serde_json::from_str(msg["content"].as_str().unwrap()).unwrap();
    assert!(answer["ok"].is_boolean(), "{msg}");
    // max_tokens counts reasoning and answer together.
    let reply = chat(
        port,
        json!({"messages": user("Think"), "max_tokens": 4, "temperature": 0,
            "thinking_token_budget": 10}),
    );
    assert_eq!(reply["usage"]["completion_tokens"], 4);
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
    // Bad budgets and kwargs are 4xx that name the field.
    for (body, field) in [
        (
            json!({"thinking_token_budget": -2}),
            "thinking_token_budget",
        ),
        (
            json!({"thinking_token_budget": 3, "thinking_budget_tokens": 4}),
            "thinking_budget_tokens",
        ),
        (
            json!({"chat_template_kwargs": {"enable_thinking": "no"}}),
            "chat_template_kwargs.enable_thinking",
        ),
        (json!({"chat_template_kwargs": 3}), "chat_template_kwargs"),
    ] {
        let mut b = body.clone();
        b["messages"] = user("x");
        let r = post(port, "/v1/chat/completions", &b.to_string());
        assert!(r.status == 400 || r.status == 422, "{body}: {}", r.body);
        assert!(r.body.contains(field), "{body}: {}", r.body);
    }

    // The openai SDK reads reasoning_content from a real reply, streamed and not.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let status = std::process::Command::new("python3")
        .args(["-m", "pytest", "-q", "-x", "tests/reasoning"])
        .current_dir(root)
        .env("LMI_TEST_URL", format!("http://127.0.0.1:{port}"))
        .status()
        .expect("python3 -m pytest");
    assert!(status.success(), "tests/reasoning failed");
    assert!(sigterm_and_wait(&mut server).success());
}

#[test]
fn tags_spelled_in_bytes_a_json_template_and_a_model_without_a_parser() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-qwen3-bytes");
    qwen3_model(&model, false);
    let mut server = start(&model, &["--kv-cache-bytes", "16M"]);
    wait_ready(&mut server, "tiny-qwen3-bytes");
    let body = json!({"messages": user("Is it?"), "max_tokens": 40, "temperature": 0,
        "guided_regex": "<think>[a-z]{4}</think>\n\n(yes|no)"});
    // Each tag is 7 or 8 tokens: split across tokens in the stream.
    let chunks = chat_stream(server.port, body.clone());
    let (thought, answer) = stream_parts(&chunks);
    assert_eq!(thought.len(), 4);
    assert!(answer == "yes" || answer == "no");
    assert_eq!(reasoning_tokens(chunks.last().unwrap()), &json!(7 + 4 + 8));
    let reply = chat(server.port, body.clone());
    assert_eq!(reply["choices"][0]["message"]["reasoning_content"], thought);
    assert_eq!(reply["choices"][0]["message"]["content"], answer);
    assert!(sigterm_and_wait(&mut server).success());

    // Without a parser (option.reasoning_parser=none) the reply is as before: all content.
    let mut server = start(
        &model,
        &[
            "--kv-cache-bytes",
            "16M",
            "-o",
            "option.reasoning_parser=none",
        ],
    );
    wait_ready(&mut server, "tiny-qwen3-bytes");
    let reply = chat(server.port, body);
    let msg = &reply["choices"][0]["message"];
    assert!(
        msg["content"]
            .as_str()
            .unwrap()
            .starts_with(&format!("<think>{thought}</think>\n\n")),
        "{msg}"
    );
    assert!(msg.get("reasoning_content").is_none());
    assert!(reply["usage"].get("completion_tokens_details").is_none());
    assert!(sigterm_and_wait(&mut server).success());

    // A seed-003 JSON template whose thinking prompt opens `<think>` (as DeepSeek-R1's does):
    // enable_thinking comes from chat_template_kwargs (false by default, as in `lmi infer`),
    // and option.reasoning_budget is the default budget.
    let template = json!({
        "roles": {
            "system": {"prefix": "<|im_start|>system\n", "suffix": "<|im_end|>\n"},
            "user": {"prefix": "<|im_start|>user\n", "suffix": "<|im_end|>\n"},
            "assistant": {"prefix": "<|im_start|>assistant\n", "suffix": "<|im_end|>\n"}
        },
        "generation_prompt": "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "generation_prompt_thinking": "<|im_start|>assistant\n<think>\n"
    });
    std::fs::write(
        model.join("processed_chat_template.json"),
        template.to_string(),
    )
    .unwrap();
    let mut server = start(
        &model,
        &["--kv-cache-bytes", "16M", "-o", "option.reasoning_budget=3"],
    );
    wait_ready(&mut server, "tiny-qwen3-bytes");
    let port = server.port;
    let off = chat(
        port,
        json!({"messages": user("Hi"), "max_tokens": 8, "temperature": 0, "guided_regex": "fine"}),
    );
    assert_eq!(off["choices"][0]["message"]["content"], "fine");
    assert!(
        off["choices"][0]["message"]
            .get("reasoning_content")
            .is_none()
    );
    let on_body = json!({"messages": user("Hi"), "max_tokens": 30, "temperature": 0,
        "logprobs": true, "chat_template_kwargs": {"enable_thinking": true}});
    let on = chat(port, on_body.clone());
    // "<think>\n\n</think>\n\n" (19 byte tokens) against "<think>\n" (8).
    assert_eq!(
        off["usage"]["prompt_tokens"].as_i64().unwrap()
            - on["usage"]["prompt_tokens"].as_i64().unwrap(),
        11
    );
    // Starts inside the reasoning: 3 tokens of it (bytes), then `</think>` (8) forced.
    let texts = token_texts(&on);
    assert_eq!(tokens_through_close(&texts), 3 + 8, "{texts:?}");
    assert_eq!(reasoning_tokens(&on), &json!(3 + 8));
    let msg = &on["choices"][0]["message"];
    assert_eq!(
        format!("{}</think>", msg["reasoning_content"].as_str().unwrap()),
        texts[..11].concat()
    );
    // LMI `messages` bodies take the same fields and reply the same way.
    let r = post(port, "/invocations", &on_body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["message"],
        on["choices"][0]["message"]
    );
    // A request's -1 lifts the server's budget (the reply is then whatever the model writes).
    let free = chat(
        port,
        json!({"messages": user("Hi"), "max_tokens": 12, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": true}, "thinking_token_budget": -1}),
    );
    assert_eq!(free["usage"]["completion_tokens"], 12);
    assert!(sigterm_and_wait(&mut server).success());
}

/// An SSE body's data objects, in order.
fn sse_data(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn post_ok(port: u16, path: &str, body: Value) -> Resp {
    let r = post(port, path, &body.to_string());
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    r
}

/// The `text` of `events` of type `kind`, joined, and the index of the first.
fn joined(events: &[Value], kind: &str, field: &str) -> (String, Option<usize>) {
    let first = events.iter().position(|e| e["type"] == kind);
    let text = events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| e[field].as_str().unwrap_or_default())
        .collect();
    (text, first)
}

/// The Responses and Messages APIs give the reasoning shapes of their own (a `reasoning`
/// output item, a `thinking` block), whole and streamed, with the split the chat route makes:
/// the same conversation under the server's thinking budget (`option.reasoning_budget`)
/// through all three routes must agree. Anthropic's `thinking` sets the budget (`disabled`:
/// none at all).
#[test]
fn responses_and_messages_return_the_reasoning_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-qwen3-think");
    qwen3_model(&model, true);
    let mut server = start(
        &model,
        &["--kv-cache-bytes", "16M", "-o", "option.reasoning_budget=5"],
    );
    wait_ready(&mut server, "tiny-qwen3-think");
    let port = server.port;

    let chat_split = |extra: Value| {
        let mut body = json!({"messages": user("Think"), "max_tokens": 24, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let reply = chat(port, body);
        let msg = &reply["choices"][0]["message"];
        (
            msg["reasoning_content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            msg["content"].as_str().unwrap().trim().to_string(),
            reasoning_tokens(&reply).clone(),
        )
    };
    let (thought, answer, count) = chat_split(json!({}));
    assert!(
        !thought.trim().is_empty(),
        "the budget's reasoning: {thought:?}"
    );

    // Responses, whole: a reasoning item first, then the answer, and its token count.
    let body = json!({"input": "Think", "max_output_tokens": 24, "temperature": 0});
    let r = post_ok(port, "/v1/responses", body.clone()).json();
    let out = r["output"].as_array().unwrap();
    assert_eq!(out[0]["type"], "reasoning", "{r}");
    assert_eq!(out[0]["content"][0]["text"], thought.as_str(), "{r}");
    let said: String = out
        .iter()
        .filter(|i| i["type"] == "message")
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(said.trim(), answer);
    assert_eq!(
        r["usage"]["output_tokens_details"]["reasoning_tokens"],
        count
    );

    // Responses, streamed: reasoning_text deltas, then output_text deltas.
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = sse_data(&post_ok(port, "/v1/responses", streamed).body);
    let (r_text, r_first) = joined(&events, "response.reasoning_text.delta", "delta");
    let (a_text, a_first) = joined(&events, "response.output_text.delta", "delta");
    assert_eq!(r_text, thought);
    assert_eq!(a_text.trim(), answer);
    if let (Some(r), Some(a)) = (r_first, a_first) {
        assert!(r < a, "reasoning after the answer began: {events:?}");
    }
    let done = events.last().unwrap();
    assert_eq!(done["response"]["output"][0]["type"], "reasoning", "{done}");

    // Messages, whole and streamed: a thinking block, then the text.
    let body = json!({"model": "m", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Think"}]});
    let m = post_ok(port, "/v1/messages", body.clone()).json();
    assert_eq!(m["content"][0]["type"], "thinking", "{m}");
    assert_eq!(m["content"][0]["thinking"], thought.as_str(), "{m}");
    assert_eq!(m["content"][1]["text"].as_str().unwrap().trim(), answer);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = sse_data(&post_ok(port, "/v1/messages", streamed).body);
    let deltas: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "content_block_delta")
        .map(|e| e["delta"].clone())
        .collect();
    let (t_text, t_first) = joined(&deltas, "thinking_delta", "thinking");
    let (a_text, a_first) = joined(&deltas, "text_delta", "text");
    assert_eq!(t_text, thought);
    assert_eq!(a_text.trim(), answer);
    if let (Some(t), Some(a)) = (t_first, a_first) {
        assert!(t < a, "thinking after the text began: {events:?}");
    }

    // Anthropic's thinking budget is the chat route's; `disabled` leaves no thinking block.
    let (short, short_answer, _) = chat_split(json!({"thinking_token_budget": 2}));
    let mut budgeted = body.clone();
    budgeted["thinking"] = json!({"type": "enabled", "budget_tokens": 2});
    let m = post_ok(port, "/v1/messages", budgeted).json();
    let thinking: String = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "thinking")
        .map(|b| b["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, short, "{m}");
    let text: String = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect();
    assert_eq!(text.trim(), short_answer);
    let mut off = body;
    off["thinking"] = json!({"type": "disabled"});
    let m = post_ok(port, "/v1/messages", off).json();
    assert!(
        m["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] != "thinking"),
        "{m}"
    );
}

/// gpt-oss's format, reduced: harmony's markers are special tokens 260-266, the reply ends
/// at `<|return|>` or `<|call|>`, the template writes `reasoning_effort` and the tools.
const HARMONY_MARKERS: [&str; 7] = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
];
const HARMONY_TEMPLATE: &str = "{%- if reasoning_effort is defined %}<|start|>system<|message|>Reasoning: {{ reasoning_effort }}<|end|>{% endif %}\
{%- if tools %}<|start|>developer<|message|>{% for t in tools %}{{ t.function.name }} {% endfor %}<|end|>{% endif %}\
{%- for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}<|end|>{% endfor %}\
{%- if add_generation_prompt %}<|start|>assistant{% endif %}";

fn harmony_model(dir: &Path) {
    tiny_model_with_tokens(dir, &HARMONY_MARKERS, true, HARMONY_TEMPLATE);
    edit_json(dir, "tokenizer_config.json", |cfg| {
        cfg["eos_token"] = json!("<|return|>")
    });
    edit_json(dir, "generation_config.json", |g| {
        g["eos_token_id"] = json!([264, 265])
    });
}

#[test]
fn harmony_channels_and_calls_on_a_gpt_oss_style_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-harmony");
    harmony_model(&model);
    // The reasoning parser and the tool format are read from the template.
    let mut server = start(&model, &["--kv-cache-bytes", "16M"]);
    wait_ready(&mut server, "tiny-harmony");
    let port = server.port;

    // Analysis, then the final answer: the markers are special tokens the grammar names.
    let grammar = "start: <|channel|> \"analysis\" <|message|> /[a-z]{4}/ <|end|> <|start|> \
                   \"assistant\" <|channel|> \"final\" <|message|> (\"yes\" | \"no\")";
    let body = json!({"messages": user("Is it?"), "max_tokens": 40, "temperature": 0,
        "logprobs": true, "guided_grammar": grammar});
    let reply = chat(port, body.clone());
    let msg = &reply["choices"][0]["message"];
    let thought = msg["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"));
    assert!(
        thought.len() == 4 && thought.bytes().all(|b| b.is_ascii_lowercase()),
        "{msg}"
    );
    let answer = msg["content"].as_str().unwrap();
    assert!(answer == "yes" || answer == "no", "{msg}");
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
    let texts = token_texts(&reply);
    assert_eq!(
        texts.concat(),
        format!(
            "<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant<|channel|>final\
             <|message|>{answer}"
        )
    );
    // The analysis message's tokens: `<|channel|>`, 8 bytes, `<|message|>`, 4, `<|end|>`.
    assert_eq!(reasoning_tokens(&reply), &json!(15));
    let chunks = chat_stream(port, body);
    assert_eq!(
        stream_parts(&chunks),
        (thought.to_string(), answer.to_string())
    );
    assert_eq!(reasoning_tokens(chunks.last().unwrap()), &json!(15));

    // A call to a function (the recipient in the role part, as the template writes calls)
    // is a tool call; its body is the arguments.
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let grammar = "start: <|channel|> \"analysis\" <|message|> /[a-z]{3}/ <|end|> <|start|> \
                   \"assistant to=functions.get_weather\" <|channel|> \"commentary json\" \
                   <|message|> \"{\\\"city\\\": \\\"Paris\\\"}\"";
    let body = json!({"messages": user("Weather?"), "max_tokens": 120, "temperature": 0,
        "tools": tools, "guided_grammar": grammar});
    let reply = chat(port, body.clone());
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], r#"{"city":"Paris"}"#);
    assert_eq!(
        choice["message"]["reasoning_content"]
            .as_str()
            .unwrap()
            .len(),
        3
    );
    let chunks = chat_stream(port, body.clone());
    assert_one_call_after_three_letters_of_reasoning(&chunks);
    // A forced call is written in harmony's own form (analysis allowed first), its arguments
    // held to the function's schema.
    let forced = json!({"messages": user("Weather?"), "max_tokens": 300, "temperature": 0,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
            {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
             "additionalProperties": false}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "logprobs": true});
    let mut required = forced.clone();
    let reply = chat(port, forced);
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather");
    let args = call["arguments"].as_str().unwrap();
    assert!(
        args == r#"{"unit":"c"}"# || args == r#"{"unit":"f"}"#,
        "{args}"
    );
    let texts = token_texts(&reply).concat();
    assert!(
        texts.contains(
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        ),
        "{texts}"
    );
    // `required`: one call to any of the functions.
    required["tool_choice"] = json!("required");
    required["tools"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}));
    let reply = chat(port, required);
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{choice}");
    assert!(["get_weather", "now"].contains(&calls[0]["function"]["name"].as_str().unwrap()));

    // Cut short by max_tokens: the arguments written so far are the content.
    let mut cut = body;
    cut["max_tokens"] = json!(80);
    let reply = chat(port, cut);
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{choice}");
    assert_eq!(
        choice["message"]["content"], r#"{"city": "Pari"#,
        "{choice}"
    );

    // reasoning_effort is the template's variable; a thinking budget is refused.
    let plain = prompt_tokens(port, json!({"messages": user("Hi"), "max_tokens": 1}));
    let low = prompt_tokens(
        port,
        json!({"messages": user("Hi"), "max_tokens": 1, "reasoning_effort": "low"}),
    );
    assert_eq!(
        (low - plain) as usize,
        tokenize(port, "<|start|>system<|message|>Reasoning: low<|end|>")
    );
    let r = post(
        port,
        "/v1/chat/completions",
        &json!({"messages": user("Hi"), "thinking_token_budget": 4}).to_string(),
    );
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.contains("reasoning_effort"), "{}", r.body);
}
