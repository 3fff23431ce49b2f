//! `lmi serve --device cuda` on the fake CUDA driver (crates/cuda-emu/fake/): the whole server
//! with the CUDA engine's real host code (NVRTC's CUBINs, the driver and cuBLAS calls, graphs)
//! serving the default model (bf16 on the device) through every route, slowly but for real.
//! Its greedy tokens must be the CPU engine's (bf16 too) for at least 3 of 4 prompts over 8
//! tokens: the two sum in different orders, so a near-tie may part them.
//!
//! A vision-language model (the tiny Qwen2.5-VL of tests/fixtures/qwen_vl) is served there too:
//! M-RoPE, the tower's kernels and the encoder's rows in the embeddings through the real host
//! code, an image through chat.
//!
//! NVRTC compiles the kernels: without it the tests say so and pass, unless
//! `LMI_REQUIRE_NVRTC=1` (CI).

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
];

fn greedy_ids(port: u16, prompt: &str) -> Vec<u64> {
    let body = json!({"inputs": prompt, "parameters": {"max_new_tokens": 8, "do_sample": false, "details": true}});
    let r = post(port, "/generate", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let details = &r.json()["details"];
    assert_eq!(details["generated_tokens"], 8, "{}", r.body);
    details["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t["id"].as_u64().expect("token id"))
        .collect()
}

/// The fake driver's directory, or None (after saying why) where NVRTC is missing.
fn fake_driver() -> Option<std::path::PathBuf> {
    if let Err(e) = lmi_cuda_emu::fake::nvrtc_available() {
        assert!(
            !std::env::var("LMI_REQUIRE_NVRTC").is_ok_and(|v| v == "1"),
            "LMI_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: {e}"
        );
        eprintln!("skipped: NVRTC compiles the kernels the fake driver runs, and {e}");
        return None;
    }
    Some(
        lmi_cuda_emu::fake::driver_dir()
            .expect("the fake driver (not the sanitized build)")
            .to_path_buf(),
    )
}

#[test]
fn the_default_model_served_on_the_fake_driver_matches_the_cpu_engine() {
    let Some(fake) = fake_driver() else { return };
    // The imported directory (f32 weights), rounded to bf16 at load by both engines.
    let model = lmi_store::resolve_model(None, false).expect("the default model");
    let name = model
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a model name")
        .to_string();
    let env = [
        ("LMI_CUDA_LIB_DIR", fake.to_str().expect("UTF-8 path")),
        // A small device: its memory is host memory (the KV cache is poisoned at allocation).
        ("LMI_FAKE_CUDA_MEMORY_MB", "2048"),
    ];
    // A small largest step: the load-time warm-up runs one, and captures a graph for batches
    // of 1, 2 and 4 with block tables of 16 blocks (256 tokens).
    let small = [
        "-o",
        "option.max_rolling_batch_size=4",
        "-o",
        "option.max_rolling_batch_prefill_tokens=64",
        "-o",
        "option.max_model_len=256",
    ];
    let mut args = vec!["--device", "cuda"];
    args.extend(small);
    let mut cuda = start_with_env(&model, &args, &env);
    let mut cpu = start(&model, &["--device", "cpu", "--dtype", "bf16"]);
    // Kernels compile at start unless the disk cache has them (half a minute on two cores).
    wait_ready_within(&mut cuda, &name, Duration::from_secs(300));
    wait_ready(&mut cpu, &name);

    let info = get(cuda.port, "/info").json();
    assert_eq!(info["model_device_type"], "cuda", "{info}");
    let m = get(cuda.port, "/metrics").body;
    let graphs = |state: &str| {
        m.lines()
            .find(|l| l.starts_with(&format!("lmi_cuda_graphs{{state=\"{state}\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(
        (graphs("captured"), graphs("failed")),
        (Some(3.0), Some(0.0)),
        "{m}"
    );

    let mut agree = 0;
    for p in PROMPTS {
        let (g, c) = (greedy_ids(cuda.port, p), greedy_ids(cpu.port, p));
        eprintln!("{p:?}: cuda {g:?} / cpu {c:?}");
        agree += usize::from(g == c);
    }
    assert!(
        agree >= 3,
        "{agree} of 4 prompts agree over 8 greedy tokens"
    );

    // Every route family, on the device.
    let port = cuda.port;
    let r = post(
        port,
        "/invocations",
        r#"{"inputs": "The capital of France is", "parameters": {"max_new_tokens": 4}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["generated_text"].is_string(), "{}", r.body);
    let r = post(
        port,
        "/invocations",
        r#"{"inputs": "Hello", "parameters": {"max_new_tokens": 3}, "stream": true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body.lines().filter(|l| l.contains("\"token\"")).count(),
        3,
        "{}",
        r.body
    );
    let r = post(
        port,
        "/generate_stream",
        r#"{"inputs": "Hello", "parameters": {"max_new_tokens": 3}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body.matches("data:").count(), 3, "{}", r.body);
    let r = post(
        port,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 4, "logprobs": true, "top_logprobs": 2}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let chat: Value = r.json();
    assert_eq!(chat["usage"]["completion_tokens"], 4, "{chat}");
    assert_eq!(
        chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "{chat}"
    );
    let r = post(
        port,
        "/v1/completions",
        r#"{"prompt": "1, 2, 3,", "max_tokens": 4, "n": 2, "seed": 7, "temperature": 0.8}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"].as_array().map(Vec::len),
        Some(2),
        "{}",
        r.body
    );

    assert_eq!(sigterm_and_wait(&mut cuda).code(), Some(0));
    assert_eq!(sigterm_and_wait(&mut cpu).code(), Some(0));
}

/// The chat completion of one image and a question, greedy.
fn image_chat(port: u16, image: &str, max_tokens: usize) -> Value {
    let body = json!({
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image}},
            {"type": "text", "text": "What is in this picture?"}
        ]}],
        "max_tokens": max_tokens,
        "temperature": 0
    });
    let r = post(port, "/v1/chat/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

#[test]
fn a_vision_language_model_reads_images_on_the_fake_driver() {
    use base64::Engine as _;
    let Some(fake) = fake_driver() else { return };
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen_vl/qwen2_5_vl");
    let png = std::fs::read(model.join("../media/gradient.png")).expect("the fixture image");
    let image = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    );
    let env = [
        ("LMI_CUDA_LIB_DIR", fake.to_str().expect("UTF-8 path")),
        ("LMI_FAKE_CUDA_MEMORY_MB", "1024"),
    ];
    let args = [
        "--device",
        "cuda",
        "-o",
        "option.max_rolling_batch_size=2",
        "-o",
        "option.max_rolling_batch_prefill_tokens=512",
        "-o",
        "option.max_model_len=512",
    ];
    let mut cuda = start_with_env(&model, &args, &env);
    let mut cpu = start(&model, &["--device", "cpu", "--dtype", "bf16"]);
    wait_ready_within(&mut cuda, "qwen2_5_vl", Duration::from_secs(300));
    wait_ready(&mut cpu, "qwen2_5_vl");

    let (g, c) = (
        image_chat(cuda.port, &image, 8),
        image_chat(cpu.port, &image, 8),
    );
    // The image's placeholders expand alike; the device decodes all 8 tokens.
    assert_eq!(
        g["usage"]["prompt_tokens"], c["usage"]["prompt_tokens"],
        "{g} / {c}"
    );
    assert_eq!(g["usage"]["completion_tokens"], 8, "{g}");
    // The same image again: the prefix cache or the encoder cache, never the tower again.
    image_chat(cuda.port, &image, 2);
    wait_metric(cuda.port, "lmi_media_items_total", 2.0);
    wait_metric(cuda.port, "lmi_encoder_items_total", 1.0);

    assert_eq!(sigterm_and_wait(&mut cuda).code(), Some(0));
    assert_eq!(sigterm_and_wait(&mut cpu).code(), Some(0));
}
