//! Qwen3-VL served end to end: the tiny random model of tests/fixtures/qwen3_vl (made by HF
//! transformers 5.25, whose greedy tokens it records) through `/v1/chat/completions` with
//! `image_url` data URLs, TGI's markdown images and an `lmi infer` batch file, with the prefill
//! cut into chunks: the prompt lengths and the 32 greedy tokens transformers gives.

mod common;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use common::*;
use serde_json::{Value, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_vl")
}

fn png_url(name: &str) -> String {
    let bytes = std::fs::read(fixtures().join("media").join(name)).unwrap();
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn reference() -> Value {
    let path = fixtures().join("qwen3_vl/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn prompt(r: &Value, id: u64) -> Value {
    r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"].as_u64() == Some(id))
        .cloned()
        .unwrap()
}

/// The fixture's user turn with each image as a data URL in an OpenAI `image_url` part.
fn openai_messages(p: &Value) -> Value {
    let content: Vec<Value> = p["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(
            |part| match (part[0].as_str().unwrap(), part[1].as_str().unwrap()) {
                ("image", file) => {
                    json!({"type": "image_url", "image_url": {"url": png_url(file)}})
                }
                (_, text) => json!({"type": "text", "text": text}),
            },
        )
        .collect();
    json!([{"role": "user", "content": content}])
}

fn greedy(p: &Value) -> Vec<u64> {
    serde_json::from_value(p["greedy_tokens"].clone()).unwrap()
}

/// The prefill in chunks of at most 24 tokens, so an item's prompt is cut around it (never
/// inside it) and DeepStack's rows land in several steps.
fn start_qwen3_vl() -> Server {
    let model = fixtures().join("qwen3_vl");
    let mut s = start(
        &model,
        &[
            "--dtype",
            "f32",
            "-o",
            "option.max_rolling_batch_prefill_tokens=24",
        ],
    );
    wait_ready(&mut s, "qwen3_vl");
    s
}

#[test]
fn images_through_chat_and_tgi_give_transformers_tokens() {
    let r = reference();
    let s = start_qwen3_vl();
    let models = get(s.port, "/v1/models").json();
    assert_eq!(
        models["data"][0]["input_modalities"],
        json!(["text", "image"])
    );
    for id in [1, 2, 5] {
        let p = prompt(&r, id);
        let body = json!({"messages": openai_messages(&p), "max_tokens": 32, "temperature": 0,
            "logprobs": true});
        let reply = post(s.port, "/v1/chat/completions", &body.to_string());
        assert_eq!(reply.status, 200, "{}", reply.body);
        let reply = reply.json();
        assert_eq!(
            reply["usage"]["prompt_tokens"], p["num_tokens"],
            "prompt {id}"
        );
        assert_eq!(
            reply["choices"][0]["message"]["content"], p["greedy_text"],
            "prompt {id}"
        );
    }

    // TGI: the rendered prompt with markdown images where the template put them; the
    // details carry the token ids.
    for id in [1, 2] {
        let p = prompt(&r, id);
        let marker = "<|vision_start|><|image_pad|><|vision_end|>";
        let mut inputs = p["text"].as_str().unwrap().to_string();
        for part in p["content"].as_array().unwrap() {
            if part[0] == "image" {
                let md = format!("![]({})", png_url(part[1].as_str().unwrap()));
                inputs = inputs.replacen(marker, &md, 1);
            }
        }
        let body = json!({"inputs": inputs, "parameters": {"max_new_tokens": 32, "details": true}});
        let g = post(s.port, "/generate", &body.to_string());
        assert_eq!(g.status, 200, "{}", g.body);
        let ids: Vec<u64> = g.json()["details"]["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, greedy(&p), "prompt {id}");
    }
}

fn mp4_url() -> String {
    let bytes = std::fs::read(fixtures().join("../qwen_vl/media/video.mp4")).unwrap();
    format!(
        "data:video/mp4;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// An MP4 (8 frames at 4 fps) through chat: the server samples it as Qwen3VLVideoProcessor
/// does (frames 0, 2, 5, 7), sizes it, and writes its two temporal patches after their
/// timestamps: the prompt transformers' processor makes from the same clip has as many tokens.
#[test]
fn a_video_through_chat_takes_the_processors_layout() {
    let r = reference();
    let want = &r["video_rules"]["mp4_prompt"];
    let s = start_qwen3_vl();
    let messages = json!([{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": mp4_url()}},
        {"type": "text", "text": "What happens?"}]}]);
    let body = json!({"messages": messages, "max_tokens": 4, "temperature": 0});
    let reply = post(s.port, "/v1/chat/completions", &body.to_string());
    assert_eq!(reply.status, 200, "{}", reply.body);
    let n = want["input_ids"].as_array().unwrap().len();
    assert_eq!(reply.json()["usage"]["prompt_tokens"], n);
}

/// `lmi infer` on a seed-000 batch file with an image and an MP4 video (paths relative to the
/// working directory): the image request gives transformers' greedy text.
#[test]
fn lmi_infer_reads_an_image_and_a_video() {
    let r = reference();
    let tmp = tempfile::tempdir().unwrap();
    let user = |items: Value| json!([{"role": "user", "content": items}]);
    let input = json!({
        "batch_size": 2,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 1,
        "max_generate_length": 32,
        "requests": [
            {"messages": user(json!([{"type": "image", "image": "media/block.png"},
                                     {"type": "text", "text": "Describe this image."}]))},
            {"messages": user(json!([{"type": "video", "video": "../qwen_vl/media/video.mp4"},
                                     {"type": "text", "text": "What happens?"}]))},
        ]
    });
    let in_path = tmp.path().join("input.json");
    let out_path = tmp.path().join("out.json");
    std::fs::write(&in_path, input.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lmi"))
        .args(["infer", "--dtype", "f32", "--model"])
        .arg(fixtures().join("qwen3_vl"))
        .arg("--input")
        .arg(&in_path)
        .arg("--output")
        .arg(&out_path)
        .current_dir(fixtures())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out: Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    let responses = out["responses"].as_array().unwrap();
    assert_eq!(responses[0]["output_text"], prompt(&r, 1)["greedy_text"]);
    assert_eq!(responses[1]["generated_tokens"], 32, "{}", responses[1]);
}

/// Qwen3.5 with its vision tower (a Gated DeltaNet hybrid: each sequence's recurrent state in
/// a slot beside its KV blocks) through chat: transformers' prompt lengths and greedy text,
/// the prefill in chunks around the images.
#[test]
fn qwen3_5_images_through_chat_give_transformers_tokens() {
    let path = fixtures().join("qwen3_5/reference.json");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut s = start(
        &fixtures().join("qwen3_5"),
        &[
            "--dtype",
            "f32",
            "-o",
            "option.max_rolling_batch_prefill_tokens=24",
        ],
    );
    wait_ready(&mut s, "qwen3_5");
    for id in [1, 2, 5] {
        let p = prompt(&r, id);
        let body = json!({"messages": openai_messages(&p), "max_tokens": 32, "temperature": 0});
        let reply = post(s.port, "/v1/chat/completions", &body.to_string());
        assert_eq!(reply.status, 200, "{}", reply.body);
        let reply = reply.json();
        assert_eq!(
            reply["usage"]["prompt_tokens"], p["num_tokens"],
            "prompt {id}"
        );
        assert_eq!(
            reply["choices"][0]["message"]["content"], p["greedy_text"],
            "prompt {id}"
        );
    }
}
