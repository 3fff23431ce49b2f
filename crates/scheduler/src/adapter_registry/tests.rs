use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lmi_checkpoint::testing::{PeftSpec, TinySpec, write_peft_adapter, write_tiny_model};
use lmi_engine::ModelConfig;

use super::*;

struct Fixture {
    _root: tempfile::TempDir,
    model: PathBuf,
    config: ModelConfig,
    registry: Arc<AdapterRegistry>,
    metrics: AdapterMetrics,
}

fn fixture(max_cpu_loras: usize) -> Fixture {
    let root = tempfile::tempdir().unwrap();
    let model = root.path().join("model");
    write_tiny_model(&model, &TinySpec::llama()).unwrap();
    let config = ModelConfig::from_file(&model.join("config.json")).unwrap();
    let metrics = AdapterMetrics::register(&prometheus::Registry::new()).unwrap();
    let registry = AdapterRegistry::new(
        true,
        config.clone(),
        16,
        AllowedDirs::new([model.as_path()]),
        max_cpu_loras,
        metrics.clone(),
    );
    Fixture {
        model,
        config,
        registry,
        metrics,
        _root: root,
    }
}

impl Fixture {
    fn adapter(&self, name: &str, spec: &PeftSpec) -> PathBuf {
        let dir = self.model.join("adapters").join(name);
        write_peft_adapter(&dir, &self.config, spec).unwrap();
        dir
    }

    fn register(&self, name: &str, src: &Path, preload: bool) -> Result<AdapterId, RegistryError> {
        let how = Registration {
            preload,
            pin: false,
            trusted: false,
        };
        self.registry.register(name, src, how)
    }
}

fn wait_ready(r: &AdapterRef) -> Arc<LoraWeights> {
    let t = Instant::now();
    loop {
        match r.weights.get() {
            Some(Ok(w)) => return w.clone(),
            Some(Err(e)) => panic!("load failed: {e}"),
            None => {
                assert!(t.elapsed() < Duration::from_secs(10), "load never finished");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

#[test]
fn registers_lists_resolves_and_removes() {
    let f = fixture(4);
    let src = f.adapter("a1", &PeftSpec::new(4, 1));
    let id = f.register("a1", &src, true).unwrap();
    assert_eq!(
        f.registry.list(),
        vec![AdapterItem {
            name: "a1".into(),
            src: src.canonicalize().unwrap().display().to_string(),
            preload: true,
            pin: false,
        }]
    );
    assert_eq!(f.registry.get("a1").unwrap().name, "a1");
    let r = f.registry.resolve(Some("a1")).unwrap().unwrap();
    assert_eq!(r.id, id);
    assert_eq!(
        wait_ready(&r).rank,
        4,
        "preloaded weights are ready at once"
    );
    assert_eq!(f.registry.resolve(Some(" ")).unwrap().map(|r| r.id), None);
    assert_eq!(f.metrics.registered.get(), 1);
    assert_eq!(f.metrics.host_resident.get(), 1);

    assert_eq!(
        f.register("a1", &src, true),
        Err(RegistryError::Duplicate("a1".into()))
    );
    assert_eq!(f.registry.remove("a1"), Ok(id));
    let e = f.registry.resolve(Some("a1")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Adapter a1 is not registered; no adapters are registered"
    );
    assert_eq!(
        f.registry.remove("a1"),
        Err(RegistryError::NotFound("a1".into()))
    );
    // Registered again: a new id, so nothing cached under the old one is reused.
    assert!(f.register("a1", &src, true).unwrap() > id);
}

#[test]
fn cold_adapters_load_off_thread_and_the_host_tier_keeps_the_most_recent() {
    let f = fixture(2);
    for (i, n) in ["a", "b", "c"].into_iter().enumerate() {
        let src = f.adapter(n, &PeftSpec::new(2, i as u64));
        f.register(n, &src, false).unwrap();
    }
    assert_eq!(
        f.metrics.host_resident.get(),
        0,
        "nothing read at registration"
    );
    for n in ["a", "b", "c", "a"] {
        let r = f.registry.resolve(Some(n)).unwrap().unwrap();
        wait_ready(&r);
    }
    // Wait for the loader threads to finish their bookkeeping.
    let t = Instant::now();
    while f.metrics.host_loads.get() < 4 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        f.metrics.host_loads.get(),
        4,
        "a was read again after its eviction"
    );
    assert!(f.metrics.host_evictions.get() >= 2);
    assert!(f.metrics.host_resident.get() <= 2);
}

#[test]
fn refuses_what_it_cannot_serve_by_name() {
    let f = fixture(4);
    // Outside the allowed directories, directly or through a symlink.
    let outside = f.model.parent().unwrap().join("outside");
    write_peft_adapter(&outside, &f.config, &PeftSpec::new(2, 1)).unwrap();
    let e = f.register("o", &outside, true).unwrap_err();
    assert!(
        matches!(&e, RegistryError::Invalid(m) if m.contains("outside the directories")),
        "{e}"
    );
    std::fs::create_dir_all(f.model.join("adapters")).unwrap();
    let link = f.model.join("adapters").join("link");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    assert!(matches!(
        f.register("l", &link, true),
        Err(RegistryError::Invalid(_))
    ));

    // Rank above option.max_lora_rank.
    let big = f.adapter("big", &PeftSpec::new(32, 2));
    let e = f.register("big", &big, true).unwrap_err().to_string();
    assert!(e.contains("rank 32") && e.contains("max_lora_rank"), "{e}");

    // Shapes of another model: the error names the tensor.
    let other = TinySpec {
        hidden_size: 32,
        ..TinySpec::llama()
    };
    let odir = f.model.parent().unwrap().join("other");
    write_tiny_model(&odir, &other).unwrap();
    let oc = ModelConfig::from_file(&odir.join("config.json")).unwrap();
    let mismatched = f.model.join("adapters").join("mismatched");
    write_peft_adapter(&mismatched, &oc, &PeftSpec::new(2, 3)).unwrap();
    let e = f
        .register("mismatched", &mismatched, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lora_A.weight has shape"), "{e}");

    // PEFT features this engine does not implement.
    for (key, value, word) in [
        ("use_dora", "true", "DoRA"),
        ("modules_to_save", "[\"lm_head\"]", "modules_to_save"),
        ("bias", "\"all\"", "bias"),
    ] {
        let dir = f.adapter(key, &PeftSpec::new(2, 4));
        let cfg = dir.join("adapter_config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        v[key] = serde_json::from_str(value).unwrap();
        std::fs::write(&cfg, v.to_string()).unwrap();
        let e = f.register(key, &dir, true).unwrap_err().to_string();
        assert!(
            e.contains(word) && e.contains("not supported"),
            "{key}: {e}"
        );
    }

    // The API takes PEFT directories, not bare files.
    let dir = f.adapter("file", &PeftSpec::new(2, 5));
    let e = f
        .register("file", &dir.join("adapter_model.safetensors"), true)
        .unwrap_err();
    assert!(e.to_string().contains("PEFT adapter directory"), "{e}");
    // pin without preload, and bad names.
    let how = Registration {
        preload: false,
        pin: true,
        trusted: false,
    };
    assert!(matches!(
        f.registry.register("p", &dir, how),
        Err(RegistryError::Invalid(_))
    ));
    assert!(matches!(
        f.register("a/b", &dir, true),
        Err(RegistryError::Invalid(_))
    ));
    assert_eq!(f.registry.len(), 0, "nothing refused was registered");
}

#[test]
fn a_disabled_registry_refuses_everything() {
    let f = fixture(1);
    let metrics = AdapterMetrics::register(&prometheus::Registry::new()).unwrap();
    let off = AdapterRegistry::new(
        false,
        f.config.clone(),
        16,
        AllowedDirs::default(),
        1,
        metrics,
    );
    let src = f.adapter("a", &PeftSpec::new(2, 1));
    let how = Registration {
        preload: true,
        pin: false,
        trusted: false,
    };
    assert_eq!(off.register("a", &src, how), Err(RegistryError::Disabled));
    assert_eq!(RegistryError::Disabled.to_string(), "LoRA is not enabled.");
    assert_eq!(RegistryError::Disabled.status(), 400);
    assert_eq!(RegistryError::NoFreeSlots.status(), 507);
    assert!(off.resolve(Some("a")).is_err());
}

#[test]
fn in_use_lists_adapters_that_requests_hold() {
    let f = fixture(4);
    let a = f.adapter("a1", &PeftSpec::new(4, 1));
    let b = f.adapter("b1", &PeftSpec::new(4, 2));
    f.register("a1", &a, true).unwrap();
    f.register("b1", &b, false).unwrap();
    assert_eq!(f.registry.in_use(), (vec![], vec![]));
    let ra = f.registry.resolve(Some("a1")).unwrap().unwrap();
    let ra2 = ra.clone();
    let rb = f.registry.resolve(Some("b1")).unwrap().unwrap();
    wait_ready(&rb);
    assert_eq!(
        f.registry.in_use(),
        (vec!["a1".to_string(), "b1".to_string()], vec![])
    );
    drop((ra, rb));
    assert_eq!(f.registry.in_use(), (vec!["a1".to_string()], vec![]));
    drop(ra2);
    assert_eq!(f.registry.in_use(), (vec![], vec![]));
}
