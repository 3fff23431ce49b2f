//! End to end: the built `lmi` binary serving a tiny generated model on a free port, checked
//! over plain HTTP/1.1: readiness, ops routes, request ids, body limit, SIGTERM.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use lmi_checkpoint::testing::{TinySpec, write_tiny_model};

#[test]
fn serves_ops_routes_and_exits_cleanly_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-llama");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let mut server = start(
        &model,
        &["--payload-limit", "10000", "--kv-cache-bytes", "16M"],
    );
    let port = server.port;

    let ping = wait_ready(&mut server, "tiny-llama");
    assert_eq!(ping.body, r#"{"tiny-llama":{"status":"Healthy"}}"#);

    let health = get(port, "/health");
    assert_eq!((health.status, health.body.as_str()), (200, ""));
    assert_eq!(get(port, "/").status, 200);

    let info = get(port, "/info");
    assert_eq!(info.status, 200);
    let info = info.json();
    assert_eq!(info["model_id"], model.to_str().unwrap());
    assert_eq!(info["max_total_tokens"], 512); // the tiny model's max_position_embeddings
    assert_eq!(info["max_input_tokens"], 511);
    assert_eq!(info["router"], "text-generation-router");
    assert_eq!(info["model_dtype"], "bf16");
    assert_eq!(info["model_device_type"], "cpu");
    assert_eq!(info["max_batch_size"], 32);

    let models = get(port, "/v1/models").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny-llama");

    let m = get(port, "/metrics");
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    let total = metric(&m.body, "lmi_kv_cache_blocks_total").expect("lmi_kv_cache_blocks_total");
    assert!(total > 0.0, "{total}");
    assert_eq!(metric(&m.body, "lmi_kv_cache_blocks_used"), Some(0.0));
    assert_eq!(metric(&m.body, "lmi_model_ready"), Some(1.0));
    for name in [
        "tgi_queue_size",
        "tgi_batch_current_size",
        "tgi_request_count",
    ] {
        assert!(
            metric(&m.body, name).is_some(),
            "{name} missing:\n{}",
            m.body
        );
    }

    let doc = get(port, "/api-doc/openapi.json").json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["paths"]["/generate"].is_object());

    let echoed = request(port, "GET", "/ping", b"", &[("x-request-id", "my-id-42")]).unwrap();
    assert_eq!(echoed.header("x-request-id"), Some("my-id-42"));
    let fresh = get(port, "/health");
    let id = fresh
        .header("x-request-id")
        .expect("a generated x-request-id");
    assert_eq!(id.len(), 36, "{id}");

    let big = vec![b' '; 20_000];
    let r = request(port, "POST", "/generate", &big, &[]).unwrap();
    assert_eq!(r.status, 413, "{}", r.body);

    let r = get(port, "/no/such/route");
    assert_eq!((r.status, r.body.as_str()), (404, ""));

    // Generation through the TGI route, with the request id echoed and the metrics counting it.
    let body = br#"{"inputs":"abc","parameters":{"max_new_tokens":4}}"#;
    let r = request(
        port,
        "POST",
        "/generate",
        body,
        &[("x-request-id", "gen-1")],
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-request-id"), Some("gen-1"));
    assert!(r.json()["generated_text"].is_string(), "{}", r.body);
    let m = get(port, "/metrics");
    assert!(
        metric(&m.body, "tgi_request_success").unwrap_or(0.0) >= 1.0,
        "{}",
        m.body
    );

    check_reported_logprobs(port);

    let status = sigterm_and_wait(&mut server);
    assert_eq!(status.code(), Some(0), "{status}");
}

/// Sampling skips the log-normalizer for replies that print no logprob; every reply that does
/// print one (LMI details and streams, TGI details, OpenAI `logprobs`) must get a number.
fn check_reported_logprobs(port: u16) {
    let numbers = |what: &str, v: Vec<&serde_json::Value>| {
        assert!(!v.is_empty(), "{what}: no tokens");
        for x in v {
            assert!(x.as_f64().is_some_and(|f| f <= 0.0), "{what}: logprob {x}");
        }
    };
    let lmi = post(
        port,
        "/invocations",
        r#"{"inputs":"abc","parameters":{"max_new_tokens":4,"details":true}}"#,
    )
    .json();
    let tokens = lmi["details"]["tokens"].as_array().unwrap();
    numbers(
        "LMI details",
        tokens.iter().map(|t| &t["log_prob"]).collect(),
    );
    let plain = post(
        port,
        "/invocations",
        r#"{"inputs":"abc","parameters":{"max_new_tokens":4}}"#,
    );
    assert_eq!(plain.status, 200, "{}", plain.body);
    assert!(plain.json()["generated_text"].is_string(), "{}", plain.body);
    let lines = post(
        port,
        "/invocations",
        r#"{"inputs":"abc","stream":true,"parameters":{"max_new_tokens":4}}"#,
    );
    let lines: Vec<serde_json::Value> = lines
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    numbers(
        "LMI jsonlines",
        lines.iter().map(|l| &l["token"]["log_prob"]).collect(),
    );
    let tgi = post(
        port,
        "/generate",
        r#"{"inputs":"abc","parameters":{"max_new_tokens":4,"details":true}}"#,
    )
    .json();
    let tokens = tgi["details"]["tokens"].as_array().unwrap();
    numbers(
        "TGI details",
        tokens.iter().map(|t| &t["logprob"]).collect(),
    );
    let chat = post(
        port,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"logprobs":true}"#,
    )
    .json();
    let content = chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    numbers(
        "chat logprobs",
        content.iter().map(|t| &t["logprob"]).collect(),
    );
    let plain = post(
        port,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}"#,
    )
    .json();
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");
    let completion = post(
        port,
        "/v1/completions",
        r#"{"prompt":"abc","max_tokens":4,"logprobs":1}"#,
    )
    .json();
    let lps = completion["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    numbers("completion logprobs", lps.iter().collect());
}

#[test]
fn null_engine_serves_and_cuda_without_a_driver_fails_fast() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    write_tiny_model(&model, &TinySpec::qwen2()).unwrap();

    // Without an NVIDIA driver (CI), `--device cuda` ends before binding the port, within
    // seconds, with one error line and no panic.
    if lmi_engine::check_device(lmi_engine::Device::Cuda(0)).is_err() {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_lmi"))
            .args(["serve", "--device", "cuda", "--port", "1"])
            .arg("--model")
            .arg(&model)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(started.elapsed() < Duration::from_secs(10));
        let err = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{err}");
        assert!(errors[0].contains("option.device=cuda:0"), "{err}");
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{err}"
        );
    }

    let mut server = start(
        &model,
        &["--engine", "null", "--served-model-name", "bench"],
    );
    wait_ready(&mut server, "bench");
    let info = get(server.port, "/info").json();
    assert_eq!(info["model_device_type"], "null");
    assert_eq!(
        get(server.port, "/v1/models").json()["data"][0]["id"],
        "bench"
    );
    let status = sigterm_and_wait(&mut server);
    assert_eq!(status.code(), Some(0), "{status}");
}

#[test]
fn sigterm_lets_an_in_flight_stream_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let mut server = start(&model, &[]);
    wait_ready(&mut server, "tiny");
    let body = br#"{"inputs":"abc","parameters":{"max_new_tokens":400}}"#;
    // The same request undisturbed: how many tokens it produces (the tiny model may hit EOS).
    let baseline = request(server.port, "POST", "/generate_stream", body, &[]).unwrap();
    let expected = baseline.body.matches("data:").count();
    assert!(expected > 50, "{}", baseline.body);
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST /generate_stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    // Wait for the first token: the request is in flight.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data:") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed before the first token");
        got.extend_from_slice(&buf[..n]);
    }
    let before = String::from_utf8_lossy(&got).matches("data:").count();
    eprintln!("{before} of {expected} events received when SIGTERM was sent");
    let ok = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    s.read_to_end(&mut got).unwrap();
    let text = String::from_utf8_lossy(&got);
    let events = text.matches("data:").count();
    assert_eq!(
        events, expected,
        "every token of the in-flight stream arrives"
    );
    assert!(
        text.contains("\"generated_text\":\""),
        "the last event closes the stream"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "{status}");
}
