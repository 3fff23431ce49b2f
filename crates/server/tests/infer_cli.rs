//! `lmi infer` end to end: the seed-000 example files under tests/infer/ run on the default
//! model (SmolLM2-135M-Instruct, with max_generate_length lowered in a temporary copy), every
//! error case of the seed's list, and the default model's derived chat template against its
//! Jinja template.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lmi_text::{ChatTemplate, JinjaChatTemplate, Message, Tokenizer, derive_json_template};
use serde_json::{Value, json};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/infer")
}

fn example(name: &str) -> Value {
    let path = examples_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The example with a small max_generate_length, to keep CI fast.
fn short(mut v: Value, max_len: u64) -> Value {
    v["max_generate_length"] = json!(max_len);
    v
}

fn model_dir() -> PathBuf {
    lmi_store::resolve_model(None, false).expect("the default model")
}

fn lmi(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmi"))
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running lmi")
}

/// Runs `lmi infer` on `input` (written to a temp dir) with `--output`; Ok(responses file) or
/// Err(stderr). A failed run must not leave the output file behind.
fn infer_in(input: &Value, cwd: &Path) -> Result<Value, String> {
    let tmp = tempfile::tempdir().unwrap();
    let in_path = tmp.path().join("input.json");
    let out_path = tmp.path().join("out.json");
    std::fs::write(&in_path, serde_json::to_string_pretty(input).unwrap()).unwrap();
    let out = lmi(
        &[
            "infer",
            "--input",
            in_path.to_str().unwrap(),
            "--output",
            out_path.to_str().unwrap(),
        ],
        cwd,
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        let text = std::fs::read_to_string(&out_path).expect("the output file");
        assert!(
            stderr.contains("generated tokens/s"),
            "no summary line: {stderr}"
        );
        Ok(serde_json::from_str(&text).expect("the output is JSON"))
    } else {
        assert!(
            !out_path.exists(),
            "a failed run left {}",
            out_path.display()
        );
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["input.json"], "a failed run left files behind");
        Err(stderr)
    }
}

fn infer(input: &Value) -> Result<Value, String> {
    infer_in(input, &examples_dir())
}

fn expect_error(input: &Value, cwd: &Path, needles: &[&str]) {
    let err = match infer_in(input, cwd) {
        Ok(v) => panic!("expected a failure for {input}, got {v}"),
        Err(e) => e,
    };
    for n in needles {
        assert!(err.contains(n), "error for {input} lacks {n:?}:\n{err}");
    }
}

/// The prompt token count the model's own Jinja template gives (HF apply_chat_template with
/// add_generation_prompt, tokenized without extra special tokens).
fn jinja_prompt_tokens(messages: &Value) -> usize {
    let dir = model_dir();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let jinja = JinjaChatTemplate::new(
        tok.chat_template().unwrap(),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    let msgs: Vec<Message> = serde_json::from_value(messages.clone()).unwrap();
    tok.encode(&jinja.render(&msgs, true, false).unwrap(), false)
        .unwrap()
        .len()
}

fn check_response(r: &Value, max_len: usize) {
    let generated = r["generated_tokens"].as_u64().unwrap() as usize;
    assert!((1..=max_len).contains(&generated), "{r}");
    let reason = r["finish_reason"].as_str().unwrap();
    assert!(
        ["length", "eos_token", "stop_sequence"].contains(&reason),
        "{r}"
    );
    if reason == "length" {
        assert_eq!(generated, max_len, "{r}");
    }
    assert!(r["output_text"].is_string(), "{r}");
    let t = &r["timings"];
    for k in [
        "queue_ms",
        "time_to_first_token_ms",
        "total_ms",
        "tokens_per_second",
    ] {
        assert!(t[k].as_f64().is_some_and(|x| x >= 0.0), "timings.{k}: {r}");
    }
    assert!(
        t["total_ms"].as_f64() >= t["time_to_first_token_ms"].as_f64(),
        "{r}"
    );
}

fn responses(out: &Value) -> &Vec<Value> {
    out["responses"].as_array().expect("responses array")
}

#[test]
fn text_single_example() {
    let input = short(example("text_single.json"), 8);
    let out = infer(&input).unwrap();
    let rs = responses(&out);
    assert_eq!(rs.len(), 1);
    check_response(&rs[0], 8);
    assert_eq!(
        rs[0]["prompt_tokens"],
        jinja_prompt_tokens(&input["requests"][0]["messages"])
    );
    assert_eq!(rs[0]["reused_prompt_tokens"], 0);
    assert_eq!(out["summary"]["requests"], 1);
    assert_eq!(
        out["summary"]["generated_tokens"],
        rs[0]["generated_tokens"]
    );
}

#[test]
fn stdout_without_output_flag_and_greedy_matches_generate() {
    // Greedy, one user message (the template's default system prompt is injected): the same
    // tokens as `lmi generate --chat`, which runs the engine directly without the scheduler.
    let tmp = tempfile::tempdir().unwrap();
    let input = json!({
        "temperature": 0.0, "max_generate_length": 8,
        "requests": [{"messages": [{"role": "user", "content": "What is the capital of France?"}]}]
    });
    let path = tmp.path().join("in.json");
    std::fs::write(&path, input.to_string()).unwrap();
    let out = lmi(&["infer", "--input", path.to_str().unwrap()], tmp.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("stdout is the responses JSON");
    let text = v["responses"][0]["output_text"]
        .as_str()
        .unwrap()
        .to_owned();
    let generated = lmi(
        &[
            "generate",
            "--chat",
            "--max-new-tokens",
            "8",
            "--prompt",
            "What is the capital of France?",
        ],
        tmp.path(),
    );
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&generated.stdout).trim_end(),
        text.trim_end()
    );
}

#[test]
fn multi_turn_example() {
    let input = short(example("multi_turn.json"), 8);
    let out = infer(&input).unwrap();
    let rs = responses(&out);
    assert_eq!(rs.len(), 1);
    check_response(&rs[0], 8);
    assert_eq!(
        rs[0]["prompt_tokens"],
        jinja_prompt_tokens(&input["requests"][0]["messages"])
    );
}

#[test]
fn multimodal_example_needs_a_vision_encoder() {
    // The image files exist (fixtures beside the example); the model is text-only.
    expect_error(
        &short(example("multimodal.json"), 8),
        &examples_dir(),
        &[
            "request 0, message 1",
            "image items need a vision encoder",
            "SmolLM2-135M-Instruct",
        ],
    );
}

#[test]
fn batch_example() {
    let input = short(example("batch.json"), 8);
    expect_error(
        &input,
        &examples_dir(),
        &["request 1, message 1", "image items need a vision encoder"],
    );

    // The same batch with the image item dropped runs, both requests together, in order.
    let mut text_only = input.clone();
    text_only["requests"][1]["messages"][1]["content"] =
        json!([{"type": "text", "text": "Explain this diagram."}]);
    let out = infer(&text_only).unwrap();
    let rs = responses(&out);
    assert_eq!(rs.len(), 2);
    for (i, r) in rs.iter().enumerate() {
        check_response(r, 8);
        let msgs = json!([
            text_only["requests"][i]["messages"][0],
            {"role": "user", "content": if i == 0 { "What is machine learning?" } else { "Explain this diagram." }}
        ]);
        assert_eq!(
            r["prompt_tokens"],
            jinja_prompt_tokens(&msgs),
            "request {i}"
        );
    }
}

#[test]
fn outputs_do_not_depend_on_batch_size() {
    // Each request samples with its own seed (its index) and a counter-based RNG.
    let mut input = json!({
        "temperature": 1.0, "top_p": 0.8, "top_k": 50, "max_generate_length": 6,
        "requests": [
            {"messages": [{"role": "user", "content": "Name a colour."}]},
            {"messages": [{"role": "user", "content": "Write a word that rhymes with cat."}]},
            {"messages": [{"role": "user", "content": "Name a colour."}]}
        ]
    });
    input["batch_size"] = json!(1);
    let one = infer(&input).unwrap();
    input["batch_size"] = json!(3);
    let three = infer(&input).unwrap();
    let texts = |v: &Value| {
        responses(v)
            .iter()
            .map(|r| r["output_text"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&one), texts(&three));
}

#[test]
fn raw_example() {
    let input = short(example("raw.json"), 8);
    let out = infer(&input).unwrap();
    let rs = responses(&out);
    check_response(&rs[0], 8);
    let tok = Tokenizer::from_dir(model_dir()).unwrap();
    let expected = tok
        .encode("What is the capital of France?", true)
        .unwrap()
        .len();
    assert_eq!(rs[0]["prompt_tokens"], expected);
}

#[test]
fn system_prompt_kv_cache_example() {
    let input = short(example("system_prompt_kv_cache.json"), 8);
    let out = infer(&input).unwrap();
    check_response(&responses(&out)[0], 8);

    // Two requests sharing a long system prompt, one at a time: the second reuses the first's
    // pinned system-prompt blocks.
    let system = "You are a helpful assistant with extensive knowledge of geography, history, \
                  science and literature. Answer briefly and precisely, in one sentence, and \
                  say so when you do not know the answer.";
    let req = |q: &str| {
        json!({
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "save_system_prompt_kv_cache": true
        })
    };
    let input = json!({
        "batch_size": 1, "max_generate_length": 4,
        "requests": [req("What is the capital of France?"), req("What is the capital of Peru?")]
    });
    let out = infer(&input).unwrap();
    let rs = responses(&out);
    let tok = Tokenizer::from_dir(model_dir()).unwrap();
    let sys_tokens = tok
        .encode(&format!("<|im_start|>system\n{system}<|im_end|>\n"), false)
        .unwrap()
        .len();
    assert!(
        sys_tokens >= 32,
        "the test's system prompt is too short: {sys_tokens} tokens"
    );
    assert_eq!(rs[0]["reused_prompt_tokens"], 0);
    let reused = rs[1]["reused_prompt_tokens"].as_u64().unwrap() as usize;
    assert!(reused >= 32, "{}", rs[1]);
    // Whole 16-token blocks of what the two prompts share (the system prompt and the user
    // turn's opening) are reused, nothing else.
    let ids = |i: usize| {
        let msgs: Vec<Message> =
            serde_json::from_value(input["requests"][i]["messages"].clone()).unwrap();
        let jinja = JinjaChatTemplate::new(
            tok.chat_template().unwrap(),
            tok.bos_token(),
            tok.eos_token(),
        )
        .unwrap();
        tok.encode(&jinja.render(&msgs, true, false).unwrap(), false)
            .unwrap()
    };
    let (a, b) = (ids(0), ids(1));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared >= sys_tokens);
    assert_eq!(reused, shared / 16 * 16, "{}", rs[1]);
    assert_eq!(rs[1]["prompt_tokens"], b.len());
    assert_eq!(out["summary"]["reused_prompt_tokens"], reused);
}

/// A rank-2 LoRA for SmolLM2 (hidden 576) on q_proj and o_proj of every layer, values from a
/// seeded generator, large enough to change greedy outputs.
fn write_lora(path: &Path, seed: u64) {
    let (r, h, layers) = (2usize, 576usize, 30usize);
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for l in 0..layers {
        for m in ["q_proj", "o_proj"] {
            let base = format!("base_model.model.model.layers.{l}.self_attn.{m}");
            tensors.push((
                format!("{base}.lora_A.weight"),
                vec![r, h],
                (0..r * h).map(|_| next()).collect(),
            ));
            tensors.push((
                format!("{base}.lora_B.weight"),
                vec![h, r],
                (0..r * h).map(|_| next()).collect(),
            ));
        }
    }
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for (name, shape, data) in &tensors {
        let end = offset + data.len() * 4;
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    for (_, _, data) in &tensors {
        for x in data {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn lora_example() {
    // As written, the seed's adapter paths do not exist: a clean error before anything runs.
    expect_error(
        &short(example("lora.json"), 8),
        &examples_dir(),
        &[
            "available_lora_weights",
            "/path/to/french_adapter.safetensors",
            "does not exist",
        ],
    );

    // With real adapters, both requests run in ONE batch (the seed's limitation is lifted),
    // next to a request on the base model; greedy so that outputs compare.
    let tmp = tempfile::tempdir().unwrap();
    let (fr, es) = (
        tmp.path().join("french.safetensors"),
        tmp.path().join("spanish.safetensors"),
    );
    write_lora(&fr, 1);
    write_lora(&es, 2);
    let mut input = short(example("lora.json"), 6);
    input["batch_size"] = json!(3);
    input["temperature"] = json!(0.0);
    input["available_lora_weights"] = json!({"french_adapter": fr, "spanish_adapter": es});
    let mut base = input["requests"][0].clone();
    base.as_object_mut().unwrap().remove("lora_name");
    input["requests"][1]["messages"] = input["requests"][0]["messages"].clone();
    input["requests"].as_array_mut().unwrap().push(base);
    let out = infer(&input).unwrap();
    let rs = responses(&out);
    assert_eq!(rs.len(), 3);
    for r in rs {
        check_response(r, 6);
    }
    let text = |i: usize| rs[i]["output_text"].as_str().unwrap().to_owned();
    assert_ne!(text(0), text(2), "the french adapter changed nothing");
    assert_ne!(text(1), text(2), "the spanish adapter changed nothing");
    assert_ne!(
        text(0),
        text(1),
        "two different adapters gave the same output"
    );

    // A request alone with its adapter gives what it gave inside the mixed batch.
    let mut alone = input.clone();
    alone["requests"] = json!([input["requests"][0]]);
    alone["batch_size"] = json!(1);
    let out = infer(&alone).unwrap();
    assert_eq!(responses(&out)[0]["output_text"], rs[0]["output_text"]);
}

#[test]
fn error_cases_name_request_field_and_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    std::fs::copy(examples_dir().join("diagram.png"), cwd.join("diagram.png")).unwrap();
    std::fs::write(cwd.join("clip.mp4"), b"\0\0\0\x18ftypmp42").unwrap();
    std::fs::write(cwd.join("notes.png"), b"not an image").unwrap();
    let user = json!({"role": "user", "content": "Hello"});
    let sys = json!({"role": "system", "content": "You are a helpful assistant."});
    let ok_req = json!({"messages": [sys, user]});
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            json!({"requests": [ok_req, {"messages": [sys, {"content": "Hi"}]}]}),
            vec!["request 1, message 1", "\"role\"", "missing"],
        ),
        (
            json!({"requests": [{"messages": [sys, {"role": "user"}]}]}),
            vec!["request 0, message 1", "\"content\"", "missing"],
        ),
        (
            json!({"requests": [ok_req, ok_req, {"lora_name": "x"}]}),
            vec!["request 2", "\"messages\"", "missing"],
        ),
        (
            json!({"requests": {"messages": [user]}}),
            vec!["\"requests\"", "must be an array"],
        ),
        (
            json!({"requests": [ok_req, "hello"]}),
            vec!["request 1", "must be an object"],
        ),
        (
            json!({"requests": [{"messages": [{"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]}]}]}),
            vec![
                "request 0, message 0",
                "\"content\"",
                "unknown content type \"audio\"",
            ],
        ),
        (
            json!({"available_lora_weights": {"french_adapter": "diagram.png"},
                   "requests": [ok_req, {"messages": [user], "lora_name": "german_adapter"}]}),
            vec![
                "request 1",
                "\"lora_name\"",
                "\"german_adapter\"",
                "not defined in available_lora_weights",
            ],
        ),
        (
            json!({"available_lora_weights": {"a": "/nonexistent/a.safetensors"}, "requests": [ok_req]}),
            vec!["\"a\"", "does not exist"],
        ),
        (
            json!({"requests": [{"messages": [{"role": "robot", "content": "x"}]}]}),
            vec!["request 0, message 0", "\"role\"", "robot"],
        ),
        (
            json!({"requests": [{"messages": []}]}),
            vec!["request 0", "\"messages\"", "empty"],
        ),
        (
            json!({"top_p": 1.5, "requests": [ok_req]}),
            vec!["\"top_p\"", "(0, 1]", "1.5"],
        ),
        (
            json!({"top_p": 0.0, "requests": [ok_req]}),
            vec!["\"top_p\"", "(0, 1]"],
        ),
        (
            json!({"temperature": -0.5, "requests": [ok_req]}),
            vec!["\"temperature\"", "-0.5"],
        ),
        (
            json!({"batch_size": 0, "requests": [ok_req]}),
            vec!["\"batch_size\"", "at least 1"],
        ),
        (
            json!({"max_generate_length": 0, "requests": [ok_req]}),
            vec!["\"max_generate_length\"", "at least 1"],
        ),
        (
            json!({"top_k": -3, "requests": [ok_req]}),
            vec!["\"top_k\"", "-3"],
        ),
        (
            json!({"enable_thinking": "yes", "requests": [ok_req]}),
            vec!["\"enable_thinking\"", "true or false"],
        ),
        (
            json!({"requests": [{"messages": [user], "save_system_prompt_kv_cache": 1}]}),
            vec!["request 0", "\"save_system_prompt_kv_cache\""],
        ),
        (
            json!({"requests": [ok_req, ok_req, {"messages": [sys, {"role": "user", "content": [
                {"type": "image", "image": "diagram.png"}, {"type": "text", "text": "Explain this diagram."}]}]}]}),
            vec![
                "request 2, message 1",
                "image items need a vision encoder",
                "SmolLM2-135M-Instruct",
                "has none",
            ],
        ),
        (
            json!({"requests": [{"messages": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}]}]}]}),
            vec!["request 0, message 0", "video items need a vision encoder"],
        ),
        (
            json!({"requests": [{"messages": [{"role": "user", "content": [{"type": "image", "image": "missing.jpeg"}]}]}]}),
            vec!["request 0, message 0, content item 0", "missing.jpeg"],
        ),
        (
            json!({"requests": [{"messages": [{"role": "user", "content": [{"type": "image", "image": "notes.png"}]}]}]}),
            vec!["request 0, message 0, content item 0", "not a JPEG, PNG"],
        ),
    ];
    for (input, needles) in &cases {
        expect_error(input, cwd, needles);
    }

    // Not JSON at all.
    let bad = cwd.join("bad.json");
    std::fs::write(&bad, "{\"requests\": [").unwrap();
    let out_path = cwd.join("never.json");
    let out = lmi(
        &[
            "infer",
            "--input",
            bad.to_str().unwrap(),
            "--output",
            out_path.to_str().unwrap(),
        ],
        cwd,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not valid JSON") && err.contains("bad.json"),
        "{err}"
    );
    assert!(!out_path.exists());

    // A failed run leaves an existing output file as it was.
    std::fs::write(&out_path, "previous").unwrap();
    let out = lmi(
        &[
            "infer",
            "--input",
            bad.to_str().unwrap(),
            "--output",
            out_path.to_str().unwrap(),
        ],
        cwd,
    );
    assert!(!out.status.success());
    assert_eq!(std::fs::read_to_string(&out_path).unwrap(), "previous");
}

#[test]
fn unknown_top_level_keys_are_ignored_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let input = json!({"beam_width": 4, "max_generate_length": 2,
                       "requests": [{"messages": [{"role": "user", "content": "Hi"}]}]});
    let path = tmp.path().join("in.json");
    std::fs::write(&path, input.to_string()).unwrap();
    let out = lmi(&["infer", "--input", path.to_str().unwrap()], tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning") && err.contains("beam_width"),
        "{err}"
    );
}

/// The default model ships only a Jinja template; the JSON template derived from it (what
/// `lmi infer` uses, and what `lmi convert` writes) renders the same text.
#[test]
fn derived_template_renders_like_the_jinja_template() {
    let dir = model_dir();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let src = tok
        .chat_template()
        .expect("the default model has a chat template");
    let jinja = JinjaChatTemplate::new(src, tok.bos_token(), tok.eos_token()).unwrap();
    let json_t = derive_json_template(src, tok.bos_token(), tok.eos_token()).unwrap();
    assert_eq!(
        json_t.default_system_prompt.as_deref(),
        Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    );
    let m = Message::new;
    let conversations = [
        vec![m("user", "What is the capital of France?")],
        vec![m("system", "You are terse."), m("user", "Hi!")],
        vec![
            m("system", "You are a helpful assistant."),
            m("user", "What is the capital of France?"),
            m("assistant", "The capital of France is Paris."),
            m("user", "What is the population of that city?"),
        ],
        vec![
            m("user", "Hello"),
            m("assistant", "Hi! How can I help?"),
            m("user", "Tell me a joke.\nA short one."),
        ],
    ];
    for conv in &conversations {
        for add_gen in [true, false] {
            let want = jinja.render(conv, add_gen, false).unwrap();
            assert_eq!(
                json_t.render(conv, add_gen, false).unwrap(),
                want,
                "{conv:?} add_generation_prompt={add_gen}"
            );
            // enable_thinking changes nothing for a template without a thinking prompt.
            assert_eq!(
                json_t.render(conv, add_gen, true).unwrap(),
                want,
                "{conv:?} thinking"
            );
        }
    }
    // And the model directory loads as a template at all (Jinja, since no JSON file is there).
    assert!(ChatTemplate::from_model_dir(&dir).unwrap().is_some());
}

/// Runs `lmi convert` on the default model's GGUF into `tmp/smollm2` with `flags`.
fn convert_default_model(tmp: &Path, flags: &[&str]) -> PathBuf {
    let gguf = lmi_store::default_gguf_path(false).unwrap();
    let out_dir = tmp.join("smollm2");
    let mut args = vec!["convert", gguf.to_str().unwrap(), out_dir.to_str().unwrap()];
    args.extend_from_slice(flags);
    let out = lmi(&args, tmp);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out_dir
}

/// `lmi convert` writes processed_chat_template.json beside the converted model, and
/// `lmi infer` then uses that file.
#[test]
fn convert_writes_processed_chat_template() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = convert_default_model(tmp.path(), &["--dtype", "bf16"]);
    let path = out_dir.join("processed_chat_template.json");
    let written =
        lmi_text::JsonChatTemplate::from_file(&path).expect("processed_chat_template.json");
    let tok = Tokenizer::from_dir(&out_dir).unwrap();
    let mut derived = derive_json_template(
        tok.chat_template().unwrap(),
        tok.bos_token(),
        tok.eos_token(),
    )
    .unwrap();
    derived.model_path = written.model_path.clone();
    assert_eq!(written, derived);
    assert_eq!(written.roles["user"].prefix, "<|im_start|>user\n");
    assert_eq!(written.roles["user"].suffix, "<|im_end|>\n");
    assert_eq!(written.generation_prompt, "<|im_start|>assistant\n");
    assert!(matches!(
        ChatTemplate::from_model_dir(&out_dir).unwrap(),
        Some(ChatTemplate::Json(_))
    ));

    let input = json!({"max_generate_length": 2, "requests": [{"messages": [{"role": "user", "content": "Hi"}]}]});
    let in_path = tmp.path().join("in.json");
    std::fs::write(&in_path, input.to_string()).unwrap();
    let out = lmi(
        &[
            "infer",
            "--input",
            in_path.to_str().unwrap(),
            "--model",
            out_dir.to_str().unwrap(),
        ],
        tmp.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("chat template: processed_chat_template.json"),
        "{err}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["responses"][0]["prompt_tokens"],
        jinja_prompt_tokens(&input["requests"][0]["messages"])
    );
}

/// `lmi convert --no-weights` writes config, tokenizer and the JSON chat template but no
/// safetensors (the CPU image's model cache: the GGUF is served as stored beside them).
#[test]
fn convert_without_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = convert_default_model(tmp.path(), &["--no-weights"]);
    let mut names: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "config.json",
            "generation_config.json",
            "processed_chat_template.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    );
}

/// A model directory with seed 003's Qwen3 template as processed_chat_template.json (the
/// default model's files linked in; its tokenizer knows <|im_start|> and <|im_end|>):
/// enable_thinking switches the generation prompt, and an explicit system message replaces
/// default_system_prompt.
#[test]
fn json_template_file_thinking_and_system_priority() {
    let src = model_dir();
    let tmp = tempfile::tempdir().unwrap();
    let qwen3 = r#"{
  "roles": {
    "system": {"prefix": "<|im_start|>system\n", "suffix": "<|im_end|>\n"},
    "user": {"prefix": "<|im_start|>user\n", "suffix": "<|im_end|>\n"},
    "assistant": {"prefix": "<|im_start|>assistant\n", "suffix": "<|im_end|>\n"}
  },
  "generation_prompt": "<|im_start|>assistant\n<think>\n\n</think>\n\n",
  "generation_prompt_thinking": "<|im_start|>assistant\n",
  "default_system_prompt": "You are a helpful assistant"
}"#;
    let dir = default_model_with_template(tmp.path(), qwen3);
    let tok = Tokenizer::from_dir(&src).unwrap();
    let count = |text: &str| tok.encode(text, false).unwrap().len();
    let user = json!({"role": "user", "content": "Hi"});
    let sys = json!({"role": "system", "content": "Be brief."});
    for thinking in [false, true] {
        let input = json!({
            "max_generate_length": 1, "enable_thinking": thinking,
            "requests": [{"messages": [user]}, {"messages": [sys, user]}]
        });
        let in_path = tmp.path().join("in.json");
        std::fs::write(&in_path, input.to_string()).unwrap();
        let out = lmi(
            &[
                "infer",
                "--input",
                in_path.to_str().unwrap(),
                "--model",
                dir.to_str().unwrap(),
            ],
            tmp.path(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            err.contains("chat template: processed_chat_template.json"),
            "{err}"
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let gen_prompt = if thinking {
            "<|im_start|>assistant\n"
        } else {
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        };
        let want = [
            format!(
                "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n{gen_prompt}"
            ),
            format!(
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n{gen_prompt}"
            ),
        ];
        for (i, w) in want.iter().enumerate() {
            assert_eq!(
                v["responses"][i]["prompt_tokens"],
                count(w),
                "thinking={thinking}, request {i}"
            );
        }
    }
}

/// The default model's files linked into `parent/model`, with `template` as its
/// processed_chat_template.json.
fn default_model_with_template(parent: &Path, template: &str) -> PathBuf {
    let src = model_dir();
    let dir = parent.join("model");
    std::fs::create_dir(&dir).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::os::unix::fs::symlink(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("processed_chat_template.json"), template).unwrap();
    dir
}

/// A template that reasons in `<think>` tags: with enable_thinking its generation prompt opens
/// the block, so the reply (the default model never closes it) is all reasoning, reported
/// apart from the empty answer as the server's `reasoning_content` is; without, the prompt
/// closes an empty block and the reply is all answer, with no reasoning field.
#[test]
fn a_reasoning_reply_is_split_from_the_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let template = r#"{
  "roles": {
    "user": {"prefix": "<|im_start|>user\n", "suffix": "<|im_end|>\n"},
    "assistant": {"prefix": "<|im_start|>assistant\n", "suffix": "<|im_end|>\n"}
  },
  "generation_prompt": "<|im_start|>assistant\n<think>\n\n</think>\n\n",
  "generation_prompt_thinking": "<|im_start|>assistant\n<think>\n"
}"#;
    let dir = default_model_with_template(tmp.path(), template);
    for thinking in [true, false] {
        let input = json!({
            "max_generate_length": 8, "enable_thinking": thinking, "temperature": 0.0,
            "requests": [{"messages": [{"role": "user", "content": "What is 2 + 2?"}]}]
        });
        let in_path = tmp.path().join("in.json");
        std::fs::write(&in_path, input.to_string()).unwrap();
        let args = [
            "infer",
            "--input",
            in_path.to_str().unwrap(),
            "--model",
            dir.to_str().unwrap(),
        ];
        let out = lmi(&args, tmp.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let r = &v["responses"][0];
        if thinking {
            let reasoning = r["reasoning_text"]
                .as_str()
                .unwrap_or_else(|| panic!("{r}"));
            assert!(!reasoning.trim().is_empty(), "{r}");
            assert_eq!(r["output_text"], "", "{r}");
        } else {
            assert!(r.get("reasoning_text").is_none(), "{r}");
            assert!(!r["output_text"].as_str().unwrap().trim().is_empty(), "{r}");
        }
    }
}
