//! Gemma 4 with its vision tower served end to end: the tiny random model of
//! tests/fixtures/gemma4/vision (HF transformers 5.25 recorded its greedy tokens for the chat
//! case, its `<|image|>` widened to boi, the image's soft tokens, eoi as `Gemma4Processor`
//! does) through `/v1/chat/completions` with an `image_url` data URL and through TGI's
//! `/generate` with a markdown image: the prompt length and the 32 greedy tokens. The same for
//! tests/fixtures/gemma4/vision_a4b (26B-A4B's layout, whose image tokens attend both ways in
//! the sliding layers), the TGI request after the chat one hitting the prefix cache inside the
//! image. Then an MP4 video through chat: the prompt as long as transformers' for that clip.

mod common;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use common::*;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gemma4")
        .join(name)
}

fn png_url() -> String {
    let bytes = std::fs::read(fixture("vision").join("image0.png")).unwrap();
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

#[test]
fn an_image_through_chat_and_tgi_gives_transformers_tokens() {
    serve("vision");
}

#[test]
fn an_image_attending_both_ways_through_chat_and_tgi_gives_transformers_tokens() {
    serve("vision_a4b");
}

fn serve(name: &str) {
    let dir = fixture(name);
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let chat = &r["chat"];
    let case = chat["prompt"].as_u64().unwrap() as usize;
    let ids = r["prompts"][case].as_array().unwrap();
    let greedy: Vec<u64> = serde_json::from_value(r["greedies"][case].clone()).unwrap();
    let mut s = start(&dir, &["--dtype", "f32"]);
    wait_ready(&mut s, name);
    let models = get(s.port, "/v1/models").json();
    assert_eq!(
        models["data"][0]["input_modalities"],
        json!(["text", "image"])
    );

    // OpenAI chat: the fixture's user turn with the image as an `image_url` part.
    let content: Vec<Value> = chat["messages"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|part| match part["type"].as_str().unwrap() {
            "image" => json!({"type": "image_url", "image_url": {"url": png_url()}}),
            _ => part.clone(),
        })
        .collect();
    let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 32,
        "temperature": 0});
    let reply = post(s.port, "/v1/chat/completions", &body.to_string());
    assert_eq!(reply.status, 200, "{}", reply.body);
    let reply = reply.json();
    assert_eq!(reply["usage"]["prompt_tokens"], ids.len());
    assert_eq!(
        reply["choices"][0]["message"]["content"],
        chat["greedy_text"]
    );

    // TGI: the rendered prompt with a markdown image where the template put `<|image|>`.
    let inputs =
        chat["text"]
            .as_str()
            .unwrap()
            .replacen("<|image|>", &format!("![]({})", png_url()), 1);
    let body = json!({"inputs": inputs, "parameters": {"max_new_tokens": 32, "details": true}});
    let g = post(s.port, "/generate", &body.to_string());
    assert_eq!(g.status, 200, "{}", g.body);
    let got: Vec<u64> = g.json()["details"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert_eq!(got, greedy);

    // A video (the Qwen-VL fixtures' MP4: 8 frames at 4 fps, 4 kept, each resized to 108x84)
    // through chat: its frames written as `Gemma4Processor` writes them, the prompt as long
    // as transformers' from the same clip.
    let mp4 = &r["video"]["mp4"];
    let bytes = std::fs::read(dir.join(mp4["file"].as_str().unwrap())).unwrap();
    let url = format!(
        "data:video/mp4;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    );
    let content: Vec<Value> = r["video"]["messages"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|part| match part["type"].as_str().unwrap() {
            "video" => json!({"type": "video_url", "video_url": {"url": url}}),
            _ => part.clone(),
        })
        .collect();
    let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 4,
        "temperature": 0});
    let reply = post(s.port, "/v1/chat/completions", &body.to_string());
    assert_eq!(reply.status, 200, "{}", reply.body);
    let want = mp4["input_ids"].as_array().unwrap().len();
    assert_eq!(reply.json()["usage"]["prompt_tokens"], want);

    // A video that is not an MP4 is refused, saying which formats are taken.
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}]}],
        "max_tokens": 1});
    let reply = post(s.port, "/v1/chat/completions", &body.to_string());
    assert_eq!(reply.status, 422, "{}", reply.body);
    assert!(reply.body.contains("MP4"), "{}", reply.body);
}

/// `lmi infer` with a seed-000 `video` item (a path relative to the working directory): the
/// frames written into the rendered text before tokenizing, the prompt as long as
/// transformers' for that clip.
#[test]
fn lmi_infer_reads_a_video() {
    let dir = fixture("vision");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let mp4 = &r["video"]["mp4"];
    let tmp = tempfile::tempdir().unwrap();
    let content: Vec<Value> = r["video"]["messages"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|part| match part["type"].as_str().unwrap() {
            "video" => json!({"type": "video", "video": mp4["file"]}),
            _ => part.clone(),
        })
        .collect();
    let input = json!({
        "batch_size": 1, "temperature": 0.0, "top_p": 1.0, "top_k": 1,
        "max_generate_length": 4,
        "requests": [{"messages": [{"role": "user", "content": content}]}]
    });
    let (in_path, out_path) = (tmp.path().join("input.json"), tmp.path().join("out.json"));
    std::fs::write(&in_path, input.to_string()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lmi"))
        .args(["infer", "--dtype", "f32", "--model"])
        .arg(&dir)
        .arg("--input")
        .arg(&in_path)
        .arg("--output")
        .arg(&out_path)
        .current_dir(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let out: Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    let resp = &out["responses"][0];
    assert_eq!(
        resp["prompt_tokens"],
        mp4["input_ids"].as_array().unwrap().len(),
        "{resp}"
    );
}
