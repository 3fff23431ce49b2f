//! Models fetched from a Hub (the stand-in in support/fake_hub.rs, on loopback): the files a
//! model needs, in huggingface_hub's cache layout, resumed, verified, once across processes,
//! offline, and the errors that say what to do.

mod support;

use std::path::Path;

use lmi_store::hub::{self, HubConfig, HubRef, RepoCache, Token};
use lmi_store::{Fetch, s3::S3Config};
use support::fake_hub::{FakeHub, Repo, blob_id, sha256_hex};

const REPO: &str = "test-org/tiny-model";

fn shard(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn model_repo() -> Repo {
    let index = br#"{"metadata": {"total_size": 1}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
    Repo::new(&[
        ("config.json", br#"{"architectures": ["LlamaForCausalLM"]}"#),
        ("generation_config.json", b"{}"),
        ("tokenizer.json", b"{\"version\": \"1.0\"}"),
        ("README.md", b"# tiny"),
        ("model.safetensors.index.json", index),
        ("model-00001-of-00002.safetensors", &shard(1, 300_000)),
        ("model-00002-of-00002.safetensors", &shard(2, 200_000)),
        ("consolidated.safetensors", &shard(3, 5_000)),
        ("pytorch_model.bin", &shard(4, 5_000)),
        ("original/consolidated.00.pth", &shard(5, 5_000)),
    ])
}

fn config(hub: &FakeHub, cache: &Path) -> HubConfig {
    HubConfig {
        endpoint: hub.url.clone(),
        token: None,
        cache: cache.to_path_buf(),
        offline: false,
    }
}

fn fetch(cfg: HubConfig) -> Fetch {
    Fetch {
        progress: false,
        revision: None,
        hub: cfg,
        s3: S3Config::from_vars(|_| None),
    }
}

fn hub_ref(repo: &str) -> HubRef {
    HubRef {
        repo: repo.into(),
        revision: None,
        quant: None,
    }
}

const WANTED: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

#[test]
fn fetches_what_a_model_needs_into_the_standard_cache() {
    let hub = FakeHub::start();
    let repo = model_repo();
    hub.add(REPO, repo.clone());
    let cache = tempfile::tempdir().unwrap();
    let r = lmi_store::resolve_with(Some(REPO), &fetch(config(&hub, cache.path()))).unwrap();
    let commit = repo.commit();
    let rc = RepoCache::new(cache.path(), REPO);
    assert_eq!(r.dir, rc.snapshot(commit));
    assert_eq!(r.origin.kind, "hub");
    assert_eq!(r.origin.commit.as_deref(), Some(commit));
    let wanted_bytes: usize = WANTED.iter().map(|f| repo.bytes(f).len()).sum();
    assert_eq!(r.origin.bytes, Some(wanted_bytes as u64));
    // Exactly the files the model needs, linked to blobs named as huggingface_hub names them.
    for f in WANTED {
        let bytes = &repo.bytes(f);
        let link = r.dir.join(f);
        assert_eq!(&std::fs::read(&link).unwrap(), bytes, "{f}");
        let etag = if bytes.len() > support::fake_hub::LFS_THRESHOLD {
            sha256_hex(bytes)
        } else {
            blob_id(bytes)
        };
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../blobs").join(&etag)
        );
    }
    let stats = hub.stats();
    let fetched: Vec<&str> = stats.gets.keys().map(String::as_str).collect();
    let mut wanted = WANTED.to_vec();
    wanted.sort();
    assert_eq!(
        fetched, wanted,
        "no pickles, no original/, no unlisted shard, no README"
    );
    assert!(stats.gets.values().all(|&n| n == 1));
    assert_eq!(
        std::fs::read_to_string(rc.root().join("refs/main")).unwrap(),
        commit
    );

    // Again: one API call, no file fetched.
    hub.reset_stats();
    let again = lmi_store::resolve_with(Some(REPO), &fetch(config(&hub, cache.path()))).unwrap();
    assert_eq!(again.dir, r.dir);
    let stats = hub.stats();
    assert_eq!((stats.api_calls, stats.gets.len()), (1, 0), "{stats:?}");
}

#[test]
fn offline_and_unreachable_use_a_complete_cached_snapshot() {
    let mut hub = FakeHub::start();
    hub.add(REPO, model_repo());
    let cache = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let online = lmi_store::resolve_with(Some(REPO), &fetch(config(&hub, cache.path()))).unwrap();
    hub.reset_stats();
    let offline = |dir: &Path| {
        let mut c = config(&hub, dir);
        c.offline = true;
        lmi_store::resolve_with(Some(REPO), &fetch(c))
    };
    assert_eq!(offline(cache.path()).unwrap().dir, online.dir);
    assert_eq!(hub.stats().requests.len(), 0, "offline asks nothing");
    let e = offline(empty.path()).unwrap_err().to_string();
    assert!(e.contains("HF_HUB_OFFLINE") && e.contains(REPO), "{e}");
    // A shard gone from the cache: not complete.
    let broken = tempfile::tempdir().unwrap();
    lmi_store::resolve_with(Some(REPO), &fetch(config(&hub, broken.path()))).unwrap();
    let rc = RepoCache::new(broken.path(), REPO);
    std::fs::remove_file(rc.blob(&sha256_hex(
        model_repo().bytes("model-00002-of-00002.safetensors"),
    )))
    .unwrap();
    assert!(offline(broken.path()).is_err());

    // The Hub gone: the complete snapshot, with a warning; none: an error that says so.
    let url = hub.url.clone();
    hub.stop();
    let gone = |dir: &Path| {
        let mut c = config(&hub, dir);
        c.endpoint = url.clone();
        lmi_store::resolve_with(Some(REPO), &fetch(c))
    };
    assert_eq!(gone(cache.path()).unwrap().dir, online.dir);
    let e = gone(empty.path()).unwrap_err().to_string();
    assert!(
        e.contains("cannot reach") && e.contains("no complete snapshot"),
        "{e}"
    );
}

#[test]
fn a_cut_transfer_resumes_and_corrupt_bytes_are_fetched_again() {
    let hub = FakeHub::start();
    let repo = model_repo();
    hub.add(REPO, repo.clone());
    let big = "model-00001-of-00002.safetensors";
    let size = repo.bytes(big).len();
    hub.shared.faults.lock().unwrap().cut = Some((big.into(), size / 2));
    hub.shared.faults.lock().unwrap().corrupt = Some("model-00002-of-00002.safetensors".into());
    let cache = tempfile::tempdir().unwrap();
    let r = lmi_store::resolve_with(Some(REPO), &fetch(config(&hub, cache.path()))).unwrap();
    for f in WANTED {
        assert_eq!(
            &std::fs::read(r.dir.join(f)).unwrap(),
            &repo.bytes(f),
            "{f}"
        );
    }
    let stats = hub.stats();
    assert_eq!(stats.gets[big], 2, "resumed once");
    assert_eq!(stats.bytes[big], size, "no byte fetched twice");
    assert!(
        stats.requests.iter().any(|r| r.contains("lfs/")),
        "LFS files come from the second port"
    );
    assert_eq!(
        stats.gets["model-00002-of-00002.safetensors"], 2,
        "fetched again after the hash check"
    );
    let blobs = RepoCache::new(cache.path(), REPO).root().join("blobs");
    let leftovers: Vec<_> = std::fs::read_dir(blobs)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incomplete"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn processes_sharing_a_cache_download_each_file_once() {
    let hub = FakeHub::start();
    hub.add(REPO, model_repo());
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&hub, cache.path());
    let dirs: Vec<_> = std::thread::scope(|s| {
        let a = s.spawn(|| {
            lmi_store::resolve_with(Some(REPO), &fetch(cfg.clone()))
                .unwrap()
                .dir
        });
        let b = s.spawn(|| {
            lmi_store::resolve_with(Some(REPO), &fetch(cfg.clone()))
                .unwrap()
                .dir
        });
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    assert_eq!(dirs[0], dirs[1]);
    let stats = hub.stats();
    assert!(stats.gets.values().all(|&n| n == 1), "{:?}", stats.gets);
}

#[test]
fn errors_say_what_to_do() {
    let hub = FakeHub::start();
    let mut gated = model_repo();
    gated.gated_token = Some("hf_good_token_1234".into());
    hub.add("org/gated", gated);
    let mut tagged = model_repo();
    let commit = tagged.commit().to_string();
    tagged.refs.insert("refs/pr/1".into(), commit.clone());
    hub.add(REPO, tagged);
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&hub, cache.path());
    let err = |spec: &str, cfg: &HubConfig| {
        lmi_store::resolve_with(Some(spec), &fetch(cfg.clone()))
            .unwrap_err()
            .to_string()
    };

    let e = err("org/gated", &cfg);
    assert!(
        e.contains("gated") && e.contains("licence") && e.contains("HF_TOKEN"),
        "{e}"
    );
    let mut with_token = cfg.clone();
    with_token.token = Some(Token::new("hf_good_token_1234", "HF_TOKEN"));
    lmi_store::resolve_with(Some("org/gated"), &fetch(with_token.clone())).unwrap();
    let stats = hub.stats();
    assert!(stats.requests.iter().any(|r| r.starts_with("LFS")));
    assert_eq!(
        stats.lfs_with_token, 0,
        "the token stays with the Hub's host"
    );

    let e = err("org/missing", &cfg);
    assert!(e.contains("no repository org/missing"), "{e}");
    let e = err(&format!("{REPO}@v9"), &cfg);
    assert!(e.contains("no revision \"v9\""), "{e}");
    // A revision named like a PR, and by its commit.
    let mut f = fetch(cfg.clone());
    f.revision = Some("refs/pr/1".into());
    let r = lmi_store::resolve_with(Some(REPO), &f).unwrap();
    assert_eq!(r.origin.commit.as_deref(), Some(commit.as_str()));
    let rc = RepoCache::new(cache.path(), REPO);
    assert_eq!(rc.commit_of("refs/pr/1").as_deref(), Some(commit.as_str()));
    lmi_store::resolve_with(Some(&format!("{REPO}@{commit}")), &fetch(cfg.clone())).unwrap();

    // A quantized checkpoint that does not load: refused before its weights are fetched.
    hub.reset_stats();
    let bnb = br#"{"architectures": ["Qwen3ForCausalLM"], "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true}}"#;
    hub.add(
        "org/m-bnb-4bit",
        Repo::new(&[("config.json", bnb), ("model.safetensors", &shard(9, 3000))]),
    );
    let e = err("org/m-bnb-4bit", &cfg);
    assert!(
        e.contains("org/m-bnb-4bit") && e.contains("quantized with bitsandbytes (4-bit)"),
        "{e}"
    );
    assert!(!hub.stats().gets.contains_key("model.safetensors"));

    hub.add(
        "org/pickles",
        Repo::new(&[("config.json", b"{}"), ("pytorch_model.bin", b"x")]),
    );
    let e = err("org/pickles", &cfg);
    assert!(e.contains("pickles") && e.contains("safetensors"), "{e}");
    let e = err("org/gguf-repo:Q4_K_M", &cfg);
    assert!(e.contains("no repository"), "{e}");
}

#[test]
fn a_gguf_repository_gives_one_quantization() {
    let hub = FakeHub::start();
    hub.add(
        "org/m-GGUF",
        Repo::new(&[
            ("m-Q4_K_M.gguf", &shard(1, 3000)),
            ("m-Q8_0.gguf", &shard(2, 4000)),
            ("mmproj-m-f16.gguf", &shard(3, 2000)),
            ("README.md", b"#"),
        ]),
    );
    let cache = tempfile::tempdir().unwrap();
    let cfg = config(&hub, cache.path());
    let mut r = hub_ref("org/m-GGUF");
    let snap = hub::snapshot(&cfg, &r, false).unwrap();
    assert_eq!(snap.gguf, vec![snap.dir.join("m-Q4_K_M.gguf")]);
    r.quant = Some("q8_0".into());
    let snap = hub::snapshot(&cfg, &r, false).unwrap();
    assert_eq!(snap.gguf, vec![snap.dir.join("m-Q8_0.gguf")]);
    assert_eq!(
        hub.stats().gets.keys().collect::<Vec<_>>(),
        ["m-Q4_K_M.gguf", "m-Q8_0.gguf"]
    );
    r.quant = Some("IQ2_XS".into());
    let e = hub::snapshot(&cfg, &r, false).unwrap_err().to_string();
    assert!(
        e.contains("no GGUF file for IQ2_XS") && e.contains("m-Q8_0.gguf"),
        "{e}"
    );
}

#[test]
fn an_adapter_by_name_brings_its_config_and_weights() {
    let hub = FakeHub::start();
    let adapter = Repo::new(&[
        ("adapter_config.json", br#"{"peft_type": "LORA", "r": 4}"#),
        ("adapter_model.safetensors", &shard(7, 4000)),
        ("README.md", b"#"),
        ("training_args.bin", b"pickle"),
    ]);
    let commit = adapter.commit().to_string();
    hub.add("org/lora", adapter);
    hub.add(REPO, model_repo());
    let cache = tempfile::tempdir().unwrap();
    let f = fetch(config(&hub, cache.path()));
    let dir = lmi_store::resolve_adapter(&format!("org/lora@{commit}"), &f).unwrap();
    assert_eq!(
        dir,
        RepoCache::new(cache.path(), "org/lora").snapshot(&commit)
    );
    assert!(
        dir.join("adapter_config.json").is_file()
            && dir.join("adapter_model.safetensors").is_file()
    );
    let fetched: Vec<String> = hub.stats().gets.keys().cloned().collect();
    assert_eq!(
        fetched,
        ["adapter_config.json", "adapter_model.safetensors"]
    );
    let e = lmi_store::resolve_adapter(REPO, &f)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a LoRA adapter"), "{e}");
    // A path is used as it is.
    assert_eq!(
        lmi_store::resolve_adapter(dir.to_str().unwrap(), &f).unwrap(),
        dir
    );
}

#[test]
fn a_listing_without_blob_ids_is_completed_by_head_requests() {
    // Files named only: each one's blob name, size and (for LFS) sha256 come from a HEAD, as
    // huggingface_hub reads them; the cache ends up the same, corruption still caught.
    let hub = FakeHub::start();
    let mut repo = model_repo();
    repo.names_only = true;
    hub.add(REPO, repo.clone());
    hub.shared.faults.lock().unwrap().corrupt = Some("model-00001-of-00002.safetensors".into());
    let cache = tempfile::tempdir().unwrap();
    let r = lmi_store::resolve_with(Some(REPO), &fetch(config(&hub, cache.path()))).unwrap();
    for f in WANTED {
        let bytes = repo.bytes(f);
        let etag = if bytes.len() > support::fake_hub::LFS_THRESHOLD {
            sha256_hex(bytes)
        } else {
            blob_id(bytes)
        };
        assert_eq!(std::fs::read(r.dir.join(f)).unwrap(), bytes, "{f}");
        assert_eq!(
            std::fs::read_link(r.dir.join(f)).unwrap(),
            Path::new("../../blobs").join(&etag)
        );
    }
    let stats = hub.stats();
    assert!(stats.requests.iter().any(|q| q.starts_with("HEAD")));
    assert_eq!(
        stats.gets["model-00001-of-00002.safetensors"], 2,
        "fetched again after the hash check"
    );
}
