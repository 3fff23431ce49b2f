//! End to end: `lmi serve --model org/name` against the stand-in Hub (the store's
//! tests/support/fake_hub.rs) on loopback: the model is fetched into the Hub cache and
//! generates exactly what the same files served by path do; /info names the commit; a
//! second start offline serves from the cache; drafts and adapters (at start and through the
//! management API) by name; `lmi fetch`, and two of them on one cache; a name that cannot be
//! fetched ends the process with one line and a non-zero status.

mod common;

#[path = "../../store/tests/support/fake_hub.rs"]
mod fake_hub;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use fake_hub::{FakeHub, Repo};
use lmi_checkpoint::testing::{PeftSpec, TinySpec, write_peft_adapter, write_tiny_model};

fn generate(port: u16) -> String {
    let body = br#"{"inputs": "a b c", "parameters": {"max_new_tokens": 12, "do_sample": false}}"#;
    let r = request(port, "POST", "/generate", body, &[]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["generated_text"].as_str().unwrap().to_string()
}

/// `lmi ARGS` with the stand-in Hub as its Hub and `cache` as its cache, no token.
fn lmi(args: &[&str], hub: &FakeHub, cache: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_lmi"));
    c.args(args)
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_CACHE", cache)
        .env_remove("HF_TOKEN");
    c
}

fn repo_of(dir: &Path) -> Repo {
    let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    Repo::new(&refs)
}

#[test]
fn serves_a_model_named_on_the_hub() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny-llama");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let by_path = {
        let mut s = start(&model, &["--kv-cache-bytes", "16M"]);
        wait_ready(&mut s, "tiny-llama");
        let text = generate(s.port);
        sigterm_and_wait(&mut s);
        text
    };

    let hub = FakeHub::start();
    let repo = repo_of(&model);
    let commit = repo.commit().to_string();
    hub.add("test-org/tiny-llama", repo);
    let cache = tmp.path().join("hf-cache");
    let cache_s = cache.to_str().unwrap();
    let env = [("HF_ENDPOINT", hub.url.as_str()), ("HF_HUB_CACHE", cache_s)];
    let mut s = start_with_env(
        Path::new("test-org/tiny-llama"),
        &["--kv-cache-bytes", "16M"],
        &env,
    );
    wait_ready(&mut s, "test-org/tiny-llama");
    assert_eq!(generate(s.port), by_path);
    let info = get(s.port, "/info").json();
    assert_eq!(info["model_id"], "test-org/tiny-llama");
    assert_eq!(info["model_sha"], commit.as_str());
    sigterm_and_wait(&mut s);
    assert!(
        cache
            .join("models--test-org--tiny-llama/snapshots")
            .join(&commit)
            .join("config.json")
            .is_file()
    );

    // A draft model by name (the same tiny model drafting for itself): fetched too.
    let mut s = start_with_env(
        &model,
        &[
            "--kv-cache-bytes",
            "16M",
            "-o",
            "option.speculative_draft_model=test-org/tiny-llama",
        ],
        &env,
    );
    wait_ready(&mut s, "tiny-llama");
    assert_eq!(generate(s.port), by_path);
    sigterm_and_wait(&mut s);

    // Offline, from the cache the first start filled.
    hub.reset_stats();
    let offline = [
        ("HF_ENDPOINT", hub.url.as_str()),
        ("HF_HUB_CACHE", cache_s),
        ("HF_HUB_OFFLINE", "1"),
    ];
    let mut s = start_with_env(
        Path::new("test-org/tiny-llama"),
        &["--kv-cache-bytes", "16M"],
        &offline,
    );
    wait_ready(&mut s, "test-org/tiny-llama");
    assert_eq!(generate(s.port), by_path);
    sigterm_and_wait(&mut s);
    assert!(hub.stats().requests.is_empty());
}

#[test]
fn lmi_fetch_fills_the_cache_and_prints_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let hub = FakeHub::start();
    let repo = repo_of(&model);
    let commit = repo.commit().to_string();
    hub.add("test-org/tiny", repo);
    let cache = tmp.path().join("hf");
    let out = lmi(
        &["fetch", "test-org/tiny", "--revision", &commit],
        &hub,
        &cache,
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let snapshot = cache.join("models--test-org--tiny/snapshots").join(&commit);
    assert_eq!(Path::new(&dir), snapshot);
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        std::fs::read(model.join("model.safetensors")).unwrap()
    );
}

#[test]
fn two_processes_on_one_cache_fetch_each_file_once() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let hub = FakeHub::start();
    hub.add("test-org/tiny", repo_of(&model));
    let cache = tmp.path().join("hf");
    let spawn = || {
        lmi(&["fetch", "test-org/tiny"], &hub, &cache)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
    let stats = hub.stats();
    assert!(
        stats.gets.values().all(|&n| n == 1),
        "a file fetched twice: {:?}",
        stats.gets
    );
    assert!(stats.gets.contains_key("model.safetensors"));
}

#[test]
fn adapters_by_name_at_start_and_through_the_management_api() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let c = lmi_checkpoint::ModelConfig::from_file(&model.join("config.json")).unwrap();
    let hub = FakeHub::start();
    for (name, seed) in [("lora-a", 1), ("lora-b", 2)] {
        let dir = tmp.path().join(name);
        write_peft_adapter(&dir, &c, &PeftSpec::new(4, seed)).unwrap();
        hub.add(&format!("test-org/{name}"), repo_of(&dir));
    }
    let cache = tmp.path().join("hf");
    let env = [
        ("HF_ENDPOINT", hub.url.as_str()),
        ("HF_HUB_CACHE", cache.to_str().unwrap()),
    ];
    let mut s = start_with_env(
        &model,
        &[
            "--kv-cache-bytes",
            "16M",
            "-o",
            "option.adapters=a=test-org/lora-a",
        ],
        &env,
    );
    wait_ready(&mut s, "tiny");
    let r = post(s.port, "/adapters?name=b&src=test-org/lora-b", "");
    assert_eq!(r.status, 200, "{}", r.body);
    let names: Vec<String> = get(s.port, "/adapters").json()["adapters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["a", "b"]);
    for a in ["a", "b"] {
        let body = format!(
            r#"{{"inputs": "a b", "adapters": "{a}", "parameters": {{"max_new_tokens": 4}}}}"#
        );
        let r = post(s.port, "/invocations", &body);
        assert_eq!(r.status, 200, "{a}: {}", r.body);
    }
    // A name that is not there: the fetch's own error, as a 400.
    let r = post(s.port, "/adapters?name=c&src=test-org/missing", "");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("no repository test-org/missing"),
        "{}",
        r.body
    );
    sigterm_and_wait(&mut s);
}

#[test]
fn a_model_that_cannot_be_fetched_ends_the_process() {
    let hub = FakeHub::start();
    let cache = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let serve = |model: &str| {
        let args = [
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--model",
            model,
        ];
        lmi(&args, &hub, cache.path()).output().unwrap()
    };
    let out = serve("test-org/missing");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no repository test-org/missing"),
        "{stderr}"
    );
    let t = Instant::now();
    let out = serve("s3://bucket/model.tar.gz");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prefix") && stderr.contains("archive"),
        "{stderr}"
    );
    assert!(t.elapsed() < Duration::from_secs(30));
}
