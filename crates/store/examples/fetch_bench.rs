//! Fetching from a Hub, measured against huggingface_hub on the same stand-in Hub
//! (tests/support/fake_hub.rs) on loopback, in one run:
//! 1. a repository of `--mib` MiB (config, tokenizer, index, four shards): `lmi fetch` and
//!    Python's `snapshot_download`, wall time and peak resident memory of each process (VmHWM, polled);
//! 2. the same with the transfer of the first shard cut half way: bytes served beyond the
//!    repository's size (fetched twice);
//! 3. with `--gguf FILE`: `lmi serve --model org/name` on a warm cache, from the start to the
//!    first generated token, against `lmi serve --model <the snapshot's file>`.
//!
//! cargo build --release -p lmi-server && \
//! cargo run --release -p lmi-store --example fetch_bench -- --lmi target/release/lmi \
//!     --mib 1024 --gguf ~/.cache/lmi/models/SmolLM2-135M-Instruct.Q4_1.gguf

#[path = "../tests/support/fake_hub.rs"]
mod fake_hub;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use fake_hub::{FakeHub, Repo};

struct Run {
    secs: f64,
    max_rss_mib: f64,
}

/// Runs `cmd`, polling its peak resident memory (VmHWM: the exec'd program's own, where the
/// rusage of a child would count the pages it shared with this process before exec).
fn measure(mut cmd: Command) -> Run {
    let t = Instant::now();
    let mut child = cmd.spawn().expect("spawn");
    let status_file = format!("/proc/{}/status", child.id());
    let mut hwm_kib = 0u64;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file)
            && let Some(line) = text.lines().find(|l| l.starts_with("VmHWM:"))
            && let Some(kib) = line.split_whitespace().nth(1).and_then(|v| v.parse().ok())
        {
            hwm_kib = hwm_kib.max(kib);
        }
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(status.success(), "{cmd:?} failed");
    Run {
        secs: t.elapsed().as_secs_f64(),
        max_rss_mib: hwm_kib as f64 / 1024.0,
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Incompressible, quickly made bytes.
fn noise(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    Bytes::from(v)
}

fn lmi_fetch(lmi: &Path, hub: &FakeHub, cache: &Path, model: &str) -> Command {
    let mut c = Command::new(lmi);
    c.args(["fetch", model])
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_CACHE", cache)
        .env("RUST_LOG", "warn")
        .env_remove("HF_TOKEN")
        .stdout(std::process::Stdio::null());
    c
}

fn main() {
    let lmi = PathBuf::from(arg("--lmi").unwrap_or_else(|| "target/release/lmi".into()));
    let mib: usize = arg("--mib").and_then(|s| s.parse().ok()).unwrap_or(1024);
    let python = std::env::var("LMI_PYTHON").unwrap_or_else(|_| "python3".into());
    let hub = FakeHub::start();

    let shard = mib * (1 << 20) / 4;
    let index = r#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00004.safetensors", "b": "model-00002-of-00004.safetensors", "c": "model-00003-of-00004.safetensors", "d": "model-00004-of-00004.safetensors"}}"#;
    let mut files = vec![
        (
            "config.json".to_string(),
            Bytes::from_static(br#"{"architectures": ["LlamaForCausalLM"]}"#),
        ),
        ("tokenizer.json".to_string(), Bytes::from_static(b"{}")),
        (
            "model.safetensors.index.json".to_string(),
            Bytes::from(index),
        ),
    ];
    for i in 1..=4 {
        files.push((
            format!("model-0000{i}-of-00004.safetensors"),
            noise(shard, i as u64),
        ));
    }
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    hub.add("bench/big", Repo::from_bytes(files));
    let tmp = tempfile::tempdir().unwrap();
    println!(
        "repository: {:.0} MiB in 4 shards, fake Hub on loopback ({})",
        total as f64 / 1048576.0,
        hub.url
    );

    let ours = measure(lmi_fetch(&lmi, &hub, &tmp.path().join("a"), "bench/big"));
    let mut py = Command::new(&python);
    py.args([
        "-c",
        "import sys; from huggingface_hub import snapshot_download; snapshot_download('bench/big', cache_dir=sys.argv[1])",
        tmp.path().join("b").to_str().unwrap(),
    ])
    .env("HF_ENDPOINT", &hub.url)
    .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    .env_remove("HF_TOKEN");
    let theirs = measure(py);
    let rate = |r: &Run| total as f64 / 1048576.0 / r.secs;
    println!("| client | wall | MiB/s | peak RSS |\n|---|---|---|---|");
    println!(
        "| lmi fetch | {:.2} s | {:.0} | {:.0} MiB |",
        ours.secs,
        rate(&ours),
        ours.max_rss_mib
    );
    println!(
        "| huggingface_hub snapshot_download | {:.2} s | {:.0} | {:.0} MiB |",
        theirs.secs,
        rate(&theirs),
        theirs.max_rss_mib
    );

    hub.reset_stats();
    hub.shared.faults.lock().unwrap().cut =
        Some(("model-00001-of-00004.safetensors".into(), shard / 2));
    let cut = measure(lmi_fetch(&lmi, &hub, &tmp.path().join("c"), "bench/big"));
    let served: usize = hub.stats().bytes.values().sum();
    println!(
        "cut at half of shard 1: {:.2} s, {} bytes served for {total} ({:.2}% fetched twice)",
        cut.secs,
        served,
        (served as f64 - total as f64).max(0.0) / total as f64 * 100.0
    );

    if let Some(gguf) = arg("--gguf") {
        first_token(&lmi, &hub, tmp.path(), Path::new(&gguf));
    }
}

/// Start → first token, by path and by name on a warm cache, three times each, alternating.
fn first_token(lmi: &Path, hub: &FakeHub, tmp: &Path, gguf: &Path) {
    let name = gguf.file_name().unwrap().to_string_lossy().into_owned();
    hub.add(
        "bench/model-GGUF",
        Repo::from_bytes(vec![(name, Bytes::from(std::fs::read(gguf).unwrap()))]),
    );
    let cache = tmp.join("serve-cache");
    let warm = Command::new(lmi)
        .args(["fetch", "bench/model-GGUF"])
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_CACHE", &cache)
        .output()
        .unwrap();
    assert!(
        warm.status.success(),
        "{}",
        String::from_utf8_lossy(&warm.stderr)
    );
    let path = String::from_utf8_lossy(&warm.stdout).trim().to_string();
    let (mut by_path, mut by_name) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        by_path.push(serve_to_first_token(lmi, &path, hub, &cache));
        by_name.push(serve_to_first_token(lmi, "bench/model-GGUF", hub, &cache));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (p, n) = (median(&mut by_path), median(&mut by_name));
    println!(
        "start to first token (median of 3): by path {p:.3} s, by name on a warm cache {n:.3} s ({:+.1}%)",
        (n / p - 1.0) * 100.0
    );
}

fn serve_to_first_token(lmi: &Path, model: &str, hub: &FakeHub, cache: &Path) -> f64 {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = Instant::now();
    let mut child = Command::new(lmi)
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--model",
            model,
        ])
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_CACHE", cache)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let body = br#"{"inputs": "Hello", "parameters": {"max_new_tokens": 1}}"#;
    loop {
        assert!(t.elapsed() < Duration::from_secs(300), "not serving");
        if let Some(code) = post(port, "/generate", body)
            && code == 200
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t.elapsed().as_secs_f64();
    let _ = child.kill();
    let _ = child.wait();
    secs
}

fn post(port: u16, path: &str, body: &[u8]) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).ok()?;
    s.write_all(body).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split(' ').nth(1)?.parse().ok()
}
