//! The stand-in Hub held honest by the real client, and our cache by huggingface_hub's
//! reading of it: `snapshot_download` fetches from the fake Hub into a cache `lmi` then serves
//! with HF_HUB_OFFLINE; and a cache `lmi` fills is read by huggingface_hub offline, and not
//! fetched again by it online. .ci/run installs huggingface_hub (tests/clients/requirements.txt).

mod support;

use std::path::Path;
use std::process::Command;

use lmi_store::hub::{HubConfig, RepoCache};
use lmi_store::{Fetch, s3::S3Config};
use support::fake_hub::{FakeHub, Repo};

const REPO: &str = "py-org/tiny";

/// Runs `code` with huggingface_hub pointed at `endpoint`; returns its stdout.
fn python(endpoint: &str, code: &str, args: &[&str]) -> String {
    let py = std::env::var("LMI_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(py)
        .arg("-c")
        .arg(code)
        .args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python failed (the test needs `python3 -m pip install -r tests/clients/requirements.txt`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn repo() -> Repo {
    let shard: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    Repo::new(&[
        ("config.json", br#"{"architectures": ["LlamaForCausalLM"]}"#),
        ("tokenizer.json", b"{}"),
        ("model.safetensors", &shard),
        ("sub/notes.txt", b"nested"),
    ])
}

fn fetch(hub: &FakeHub, cache: &Path, offline: bool) -> Fetch {
    Fetch {
        progress: false,
        revision: None,
        hub: HubConfig {
            endpoint: hub.url.clone(),
            token: None,
            cache: cache.to_path_buf(),
            offline,
        },
        s3: S3Config::from_vars(|_| None),
    }
}

#[test]
fn huggingface_hub_and_lmi_share_one_cache() {
    let hub = FakeHub::start();
    let repo = repo();
    let commit = repo.commit().to_string();
    hub.add(REPO, repo.clone());

    // huggingface_hub fills a cache from the fake Hub; lmi serves it offline.
    let theirs = tempfile::tempdir().unwrap();
    let path = python(
        &hub.url,
        "import sys; from huggingface_hub import snapshot_download; print(snapshot_download(sys.argv[1], cache_dir=sys.argv[2]))",
        &[REPO, theirs.path().to_str().unwrap()],
    );
    let snap = RepoCache::new(theirs.path(), REPO).snapshot(&commit);
    assert_eq!(Path::new(&path), snap);
    assert_eq!(
        std::fs::read(snap.join("sub/notes.txt")).unwrap(),
        b"nested"
    );
    hub.reset_stats();
    let r = lmi_store::resolve_with(Some(REPO), &fetch(&hub, theirs.path(), true)).unwrap();
    assert_eq!(r.dir, snap);
    assert_eq!(
        std::fs::read(r.dir.join("model.safetensors")).unwrap(),
        repo.bytes("model.safetensors")
    );
    assert!(hub.stats().requests.is_empty());

    // lmi fills a cache; huggingface_hub reads it offline, and online fetches nothing again.
    let ours = tempfile::tempdir().unwrap();
    lmi_store::resolve_with(Some(REPO), &fetch(&hub, ours.path(), false)).unwrap();
    let read = python(
        &hub.url,
        "import sys, os\n\
         os.environ['HF_HUB_OFFLINE'] = '1'\n\
         from huggingface_hub import hf_hub_download\n\
         p = hf_hub_download(sys.argv[1], 'model.safetensors', cache_dir=sys.argv[2])\n\
         c = hf_hub_download(sys.argv[1], 'config.json', cache_dir=sys.argv[2])\n\
         print(p, os.path.getsize(p), open(c).read())",
        &[REPO, ours.path().to_str().unwrap()],
    );
    let snap = RepoCache::new(ours.path(), REPO).snapshot(&commit);
    assert_eq!(
        read,
        format!(
            "{} 100000 {}",
            snap.join("model.safetensors").display(),
            String::from_utf8_lossy(repo.bytes("config.json"))
        )
    );
    hub.reset_stats();
    python(
        &hub.url,
        "import sys; from huggingface_hub import hf_hub_download; print(hf_hub_download(sys.argv[1], 'model.safetensors', cache_dir=sys.argv[2]))",
        &[REPO, ours.path().to_str().unwrap()],
    );
    let stats = hub.stats();
    assert!(
        stats.gets.is_empty(),
        "huggingface_hub fetched again: {stats:?}"
    );
    assert!(!stats.requests.is_empty(), "it did ask the fake Hub (HEAD)");
}
