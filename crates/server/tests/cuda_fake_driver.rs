//! `lmi serve --device cuda` on the fake CUDA driver (crates/cuda-emu/fake/): the whole server
//! with the CUDA engine's real host code (NVRTC's CUBINs, the driver and cuBLAS calls, graphs)
//! serving the default model (bf16 on the device) through every route, slowly but for real.
//! Its greedy tokens must be the CPU engine's (bf16 too) for at least 3 of 4 prompts over 8
//! tokens: the two sum in different orders, so a near-tie may part them.
//!
//! NVRTC compiles the kernels: without it the test says so and passes, unless
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

#[test]
fn the_default_model_served_on_the_fake_driver_matches_the_cpu_engine() {
    if let Err(e) = lmi_cuda_emu::fake::nvrtc_available() {
        assert!(
            !std::env::var("LMI_REQUIRE_NVRTC").is_ok_and(|v| v == "1"),
            "LMI_REQUIRE_NVRTC=1 but NVRTC cannot be loaded: {e}"
        );
        eprintln!("skipped: NVRTC compiles the kernels the fake driver runs, and {e}");
        return;
    }
    let fake = lmi_cuda_emu::fake::driver_dir().expect("the fake driver (not the sanitized build)");
    // The imported directory (f32 weights), rounded to bf16 at load by both engines.
    let model = lmi_engine::model_store::resolve_model(None, false).expect("the default model");
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
