//! Qwen3-VL served end to end: the tiny random model of tests/fixtures/qwen3_vl (made by HF
//! transformers 5.25, whose greedy tokens it records) through `/v1/chat/completions` with
//! `image_url` data URLs and TGI's markdown images, with the prefill cut into chunks: the
//! prompt lengths and the 32 greedy tokens transformers gives.

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

