//! Gemma 4 through the scheduler (`tests/fixtures/gemma4`): its local layers' K/V in window
//! pools, its global layers' in pools of their own width, its sharing layers in none.
//! Transformers' greedy tokens for the six prompts sharing steps and cut by a small prefill
//! budget, the same tokens and logprobs as with one table, only the windows held, and the
//! prompts again from both pools' prefix caches with the same output.

mod common;

use std::path::{Path, PathBuf};

use common::{cfg, request};
use lmi_engine::DType;
use lmi_engine::engine::{EngineOptions, StepShape};
use lmi_scheduler::{GenerateRequest, Scheduler, SchedulerConfig};
use lmi_text::Tokenizer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/gemma4/{name}"))
}

/// The fixture's model beside a byte-level tokenizer naming its 320 ids.
fn model(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(name).join(f), tmp.path().join(f)).unwrap();
    }
    lmi_checkpoint::testing::write_tiny_tokenizer_for(tmp.path(), 320).unwrap();
    tmp
}

fn reference(name: &str) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(name).join("reference.json")).unwrap(),
    )
    .unwrap();
    let lists = |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(json[k].clone()).unwrap() };
    (lists("prompts"), lists("greedies"))
}

fn scheduler(dir: &Path, window_pools: bool, config: SchedulerConfig) -> Scheduler {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(96),
        max_step: StepShape {
            seqs: 6,
            tokens: 64,
            context: None,
        },
        window_pools,
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts).unwrap();
    Scheduler::new(Box::new(engine), Tokenizer::from_dir(dir).unwrap(), config)
}

type Run = Vec<Vec<(Vec<u32>, Vec<f32>)>>;

/// Runs the requests to the end; the most window blocks held at once.
fn run(s: &mut Scheduler, reqs: Vec<GenerateRequest>, first_id: u64) -> (Run, usize) {
    let rxs: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let (tx, rx) = tokio::sync::mpsc::channel(4096);
            s.add(first_id + i as u64, r, tx).unwrap();
            rx
        })
        .collect();
    let mut most = 0;
    for _ in 0..5000 {
        if !s.has_work() {
            break;
        }
        s.step();
        most = most.max(s.window_pool().map_or(0, |p| p.num_used()));
    }
    assert!(!s.has_work(), "requests did not finish");
    let out = rxs
        .into_iter()
        .map(|mut rx| common::drain_tokens(&mut rx))
        .collect();
    (out, most)
}

fn greedy(prompts: &[Vec<u32>]) -> Vec<GenerateRequest> {
    prompts
        .iter()
        .map(|p| request(p.clone(), 32, None))
        .collect()
}

#[test]
fn greedy_tokens_match_transformers_through_window_pools_and_the_prefix_cache() {
    for name in ["e2b", "a4b"] {
        let dir = model(name);
        let (prompts, want) = reference(name);
        let (plain, _) = run(
            &mut scheduler(dir.path(), false, cfg(6, 512)),
            greedy(&prompts),
            1,
        );
        let mut s = scheduler(dir.path(), true, cfg(6, 7));
        assert!(s.window_pool().is_some(), "{name}: no window pool");
        let (cut, most) = run(&mut s, greedy(&prompts), 1);
        let tokens: Vec<Vec<u32>> = cut.iter().map(|r| r[0].0.clone()).collect();
        assert_eq!(
            tokens, want,
            "{name}: greedy tokens differ from transformers'"
        );
        assert_eq!(
            cut, plain,
            "{name}: window pools or the budget changed the output"
        );
        // Six sequences of up to 72 tokens (5 blocks each) hold at most their windows.
        assert!(most <= 6 * 4, "{name}: {most} window blocks held at once");
        assert_eq!(s.window_pool().map(|p| p.num_used()), Some(0));
        s.window_pool().unwrap().check_invariants().unwrap();

        let before = s.metrics().snapshot().prefix_cached_tokens;
        let (again, _) = run(&mut s, greedy(&prompts), 10);
        let cached = s.metrics().snapshot().prefix_cached_tokens - before;
        assert!(
            cached >= 16 * 3,
            "{name}: only {cached} prompt tokens came from the cache"
        );
        assert_eq!(again, cut, "{name}: prefix-cache hits changed the output");
    }
}
