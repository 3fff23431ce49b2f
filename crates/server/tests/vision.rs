//! A vision-language model served end to end: the tiny random Qwen2.5-VL of
//! tests/fixtures/qwen_vl (made by HF transformers, whose greedy tokens it records) through
//! `/v1/chat/completions` with `image_url` data URLs and TGI's markdown images, the encoder
//! and prefix caches, and every refusal of bad media as a 4xx while the server keeps serving.

mod common;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use common::*;
use serde_json::{Value, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen_vl")
}

fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn media(name: &str) -> String {
    let path = fixtures().join("media").join(name);
    let mime = match path.extension().and_then(|e| e.to_str()) {
        Some("png") => "image/png",
        Some("jpg") => "image/jpeg",
        Some("webp") => "image/webp",
        _ => "image/gif",
    };
    data_url(mime, &std::fs::read(&path).unwrap())
}

fn reference() -> Value {
    let path = fixtures().join("qwen2_5_vl/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn prompt(r: &Value, id: u64) -> &Value {
    r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"].as_u64() == Some(id) || p["id"].as_str() == Some(&id.to_string()))
        .unwrap()
}

/// The fixture's messages with each media file as a data URL in an OpenAI `image_url` part.
fn openai_messages(p: &Value) -> Value {
    let mut msgs = p["messages"].clone();
    for m in msgs.as_array_mut().unwrap() {
        for part in m["content"].as_array_mut().unwrap() {
            if let Some(file) = part["image"].as_str() {
                let name = Path::new(file).file_name().unwrap().to_str().unwrap();
                *part = json!({"type": "image_url", "image_url": {"url": media(name)}});
            }
        }
    }
    msgs
}

fn start_vl(extra: &[&str]) -> Server {
    let model = fixtures().join("qwen2_5_vl");
    let mut args = vec!["--dtype", "f32"];
    args.extend_from_slice(extra);
    let mut s = start(&model, &args);
    wait_ready(&mut s, "qwen2_5_vl");
    s
}

fn chat(port: u16, messages: Value, max_tokens: usize) -> Value {
    let body = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0});
    let r = post(port, "/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn metric_value(port: u16, name: &str) -> f64 {
    metric(&get(port, "/metrics").body, name).unwrap_or(0.0)
}

#[test]
fn images_through_chat_and_tgi_match_transformers() {
    let r = reference();
    let s = start_vl(&[]);

    let info = get(s.port, "/info").json();
    assert_eq!(info["model_pipeline_tag"], "image-text-to-text");
    let models = get(s.port, "/v1/models").json();
    assert_eq!(
        models["data"][0]["input_modalities"],
        json!(["text", "image"])
    );

    // One image, and two different images: HF's 16 greedy tokens and its prompt length.
    for id in [1, 2] {
        let p = prompt(&r, id);
        let reply = chat(s.port, openai_messages(p), 16);
        assert_eq!(
            reply["choices"][0]["message"]["content"], p["greedy_text"],
            "prompt {id}"
        );
        assert_eq!(
            reply["usage"]["prompt_tokens"], p["num_tokens"],
            "prompt {id}"
        );
    }

    // The same prompt through the Responses API and Anthropic's Messages API.
    let p = prompt(&r, 1);
    let b64 = media("gradient.png");
    let body = json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": b64},
            {"type": "input_text", "text": "Describe this image."}]}],
        "max_output_tokens": 16, "temperature": 0});
    let resp = post(s.port, "/v1/responses", &body.to_string());
    assert_eq!(resp.status, 200, "{}", resp.body);
    let out = resp.json();
    let text = out["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "message")
        .map(|o| o["content"][0]["text"].clone())
        .unwrap();
    assert_eq!(text, p["greedy_text"], "{out}");
    let data = b64.split_once(',').unwrap().1;
    let body = json!({"model": "qwen2_5_vl", "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            {"type": "text", "text": "Describe this image."}]}]});
    let resp = post(s.port, "/v1/messages", &body.to_string());
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        resp.json()["content"][0]["text"],
        p["greedy_text"],
        "{}",
        resp.body
    );

    // The same image twice in one prompt: encoded once, then served from the encoder cache.
    let (items, hits) = (
        metric_value(s.port, "lmi_encoder_items_total"),
        metric_value(s.port, "lmi_encoder_cache_hits_total"),
    );
    let p = prompt(&r, 5);
    let reply = chat(s.port, openai_messages(p), 16);
    assert_eq!(reply["choices"][0]["message"]["content"], p["greedy_text"]);
    assert_eq!(metric_value(s.port, "lmi_encoder_items_total"), items);
    assert!(metric_value(s.port, "lmi_encoder_cache_hits_total") >= hits + 2.0);

    // A video as an MP4 data URL: 8 frames at 4 fps, kept at 2 a second (4 frames, 2 temporal
    // patches of 6x8 patches: 24 tokens where HF's PNG-frame prompt 4 had 48 for 8 frames).
    let mp4 = std::fs::read(fixtures().join("media/video.mp4")).unwrap();
    let video = json!([{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": data_url("video/mp4", &mp4)}},
        {"type": "text", "text": "What happens?"}]}]);
    let reply = chat(s.port, video, 4);
    let p4 = prompt(&r, 4);
    assert_eq!(
        reply["usage"]["prompt_tokens"].as_u64().unwrap(),
        p4["num_tokens"].as_u64().unwrap() - 48 + 24
    );

    // TGI: the rendered prompt with a markdown image where the template put the image.
    let p = prompt(&r, 1);
    let marker = "<|vision_start|><|image_pad|><|vision_end|>";
    let text = p["text"].as_str().unwrap();
    let inputs = text.replace(marker, &format!("![]({})", media("gradient.png")));
    let body = json!({"inputs": inputs, "parameters": {"max_new_tokens": 16, "details": true}});
    let g = post(s.port, "/generate", &body.to_string());
    assert_eq!(g.status, 200, "{}", g.body);
    let ids: Vec<u64> = g.json()["details"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    let want: Vec<u64> = serde_json::from_value(p["greedy_tokens"].clone()).unwrap();
    assert_eq!(ids, want);
}

/// A PNG of `w` x `h` filled from `seed`.
fn png(w: u32, h: u32, seed: u8) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x as u8).wrapping_mul(seed),
            (y as u8).wrapping_add(seed),
            seed,
        ])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn image_message(urls: &[String]) -> Value {
    let mut content: Vec<Value> = urls
        .iter()
        .map(|u| json!({"type": "image_url", "image_url": {"url": u}}))
        .collect();
    content.push(json!({"type": "text", "text": "What is this?"}));
    json!([{"role": "user", "content": content}])
}

#[test]
fn the_prefix_cache_reuses_an_identical_image_and_never_a_different_one() {
    let s = start_vl(&[]);
    // Two images of the same size: the same placeholder tokens, different pixels.
    let (a, b) = (
        data_url("image/png", &png(112, 112, 3)),
        data_url("image/png", &png(112, 112, 7)),
    );
    let cached = || metric_value(s.port, "lmi_prefix_cache_hit_tokens_total");
    let first = chat(s.port, image_message(std::slice::from_ref(&a)), 4);
    let before = cached();
    let again = chat(s.port, image_message(std::slice::from_ref(&a)), 4);
    let reused = cached() - before;
    // The prompt's full blocks, the image's among them, come from the cache.
    let prompt_tokens = first["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(
        reused >= prompt_tokens - 16.0,
        "reused {reused} of {prompt_tokens}"
    );
    assert_eq!(again["choices"], first["choices"]);
    let before = cached();
    chat(s.port, image_message(&[b]), 4);
    // Only the text before the image (the system turn) may be shared.
    let reused = cached() - before;
    assert!(reused < 32.0, "a different image reused {reused} tokens");
}

/// PNG's chunk checksum (CRC-32, reflected 0xEDB88320).
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 == 1 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[test]
fn bad_media_is_refused_with_a_4xx_and_the_server_keeps_serving() {
    // Fetching on, for a host that is loopback: allowed by name, refused by address.
    let s = start_vl(&[
        "-o",
        "option.limit_mm_per_prompt=image=2",
        "-o",
        "option.allowed_media_domains=127.0.0.1,cdn.example.com",
    ]);
    let good = media("small.webp");
    let gradient = std::fs::read(fixtures().join("media/gradient.png")).unwrap();
    // A PNG whose header says 100000 x 100000 (a decompression bomb).
    let mut bomb = gradient.clone();
    bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32(&bomb[12..29]);
    bomb[29..33].copy_from_slice(&crc.to_be_bytes());
    let svg = b"<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>";
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "truncated",
            vec![data_url("image/png", &gradient[..gradient.len() / 2])],
            "",
        ),
        ("bomb", vec![data_url("image/png", &bomb)], "pixels"),
        ("svg", vec![data_url("image/svg+xml", svg)], "PNG"),
        (
            "private address",
            vec!["http://127.0.0.1:1/cat.png".to_string()],
            "loopback",
        ),
        (
            "host not allowed",
            vec!["https://example.org/cat.png".to_string()],
            "example.org",
        ),
        ("local file", vec!["/etc/passwd".to_string()], "data: URL"),
        (
            "too many",
            vec![good.clone(), good.clone(), good.clone()],
            "limit_mm_per_prompt",
        ),
        (
            "not base64",
            vec!["data:image/png;base64,@@@".to_string()],
            "",
        ),
    ];
    for (what, urls, says) in cases {
        let body = json!({"messages": image_message(&urls), "max_tokens": 2});
        let r = post(s.port, "/v1/chat/completions", &body.to_string());
        // A validation error: 422 on these routes, as TGI's (vLLM says 400).
        assert!(
            matches!(r.status, 400 | 422),
            "{what}: {} {}",
            r.status,
            r.body
        );
        assert!(r.body.contains(says), "{what}: {}", r.body);
    }
    // Still serving.
    let reply = chat(s.port, image_message(&[good]), 2);
    assert_eq!(reply["choices"][0]["finish_reason"], "length");
}

/// `lmi infer` on a seed-000 file with images (paths relative to the working directory) and
/// an MP4 video: the image requests give HF's greedy text.
#[test]
fn lmi_infer_reads_images_and_a_video_from_the_batch_file() {
    let r = reference();
    let tmp = tempfile::tempdir().unwrap();
    let user = |items: Value| json!([{"role": "user", "content": items}]);
    let input = json!({
        "batch_size": 4,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 1,
        "max_generate_length": 16,
        "requests": [
            {"messages": user(json!([{"type": "image", "image": "media/gradient.png"},
                                     {"type": "text", "text": "Describe this image."}]))},
            {"messages": user(json!([{"type": "image", "image": "media/noise.jpg"},
                                     {"type": "image", "image": "media/small.webp"},
                                     {"type": "text", "text": "Compare them."}]))},
            {"messages": user(json!([{"type": "video", "video": "media/video.mp4"},
                                     {"type": "text", "text": "What happens?"}]))},
        ]
    });
    let in_path = tmp.path().join("input.json");
    let out_path = tmp.path().join("out.json");
    std::fs::write(&in_path, input.to_string()).unwrap();
    let model = fixtures().join("qwen2_5_vl");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lmi"))
        .args(["infer", "--dtype", "f32", "--model"])
        .arg(&model)
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
    for (k, id) in [(0, 1), (1, 2)] {
        assert_eq!(
            responses[k]["output_text"],
            prompt(&r, id)["greedy_text"],
            "request {k}"
        );
    }
    assert_eq!(responses[2]["generated_tokens"], 16, "{}", responses[2]);
}
