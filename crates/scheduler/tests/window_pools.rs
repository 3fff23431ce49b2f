//! A model with sliding-window layers through the scheduler, its local layers' K/V in pools
//! of their own (`EngineOptions::window_pools`): the same tokens and logprobs as with one
//! table, the window pool holding only the windows while the global one holds every
//! context, and a repeated prompt served from the prefix cache of both pools.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use common::{cfg, prompt, request};
use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use lmi_engine::DType;
use lmi_engine::engine::EngineOptions;
use lmi_engine::engine::StepShape;
use lmi_scheduler::{
    BeamParams, EarlyStopping, GenerateRequest, NgramLookup, Scheduler, SchedulerConfig,
    SpeculativeConfig,
};
use lmi_text::Tokenizer;

/// A tiny model of `spec` with its config edited.
fn tiny_model(spec: &TinySpec, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    let path = dir.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&path, c.to_string()).unwrap();
    dir
}

/// Qwen2 with `use_sliding_window`: layer 0 global, layer 1 local over 8 keys.
fn windowed_model() -> tempfile::TempDir {
    tiny_model(&TinySpec::qwen2(), |c| {
        c["use_sliding_window"] = true.into();
        c["sliding_window"] = 8.into();
        c["max_window_layers"] = 1.into();
    })
}

/// Mistral's window on every layer (8 keys): no global layer at all.
fn all_local_model() -> tempfile::TempDir {
    tiny_model(&TinySpec::llama(), |c| {
        c["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        c["model_type"] = "mistral".into();
        c["sliding_window"] = 8.into();
    })
}

fn scheduler(dir: &Path, window_pools: bool) -> Scheduler {
    scheduler_with(dir, window_pools, cfg(4, 64))
}

fn scheduler_with(dir: &Path, window_pools: bool, config: SchedulerConfig) -> Scheduler {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(64),
        max_step: StepShape {
            seqs: 4,
            tokens: 64,
            context: None,
        },
        window_pools,
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts).unwrap();
    Scheduler::new(Box::new(engine), Tokenizer::from_dir(dir).unwrap(), config)
}

/// Each request's sequences (by index): their tokens and logprobs.
type Run = Vec<Vec<(Vec<u32>, Vec<f32>)>>;

/// Runs `prompts` (80 greedy tokens each) to the end; the most window blocks held at once,
/// and the most global ones.
fn run(s: &mut Scheduler, prompts: &[Vec<u32>], first_id: u64) -> (Run, (usize, usize)) {
    let reqs = prompts
        .iter()
        .map(|p| request(p.clone(), 80, None))
        .collect();
    run_requests(s, reqs, first_id)
}

fn run_requests(
    s: &mut Scheduler,
    reqs: Vec<GenerateRequest>,
    first_id: u64,
) -> (Run, (usize, usize)) {
    let rxs: Vec<_> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let (tx, rx) = tokio::sync::mpsc::channel(4096);
            s.add(first_id + i as u64, r, tx).unwrap();
            rx
        })
        .collect();
    let (mut most, mut most_global) = (0, 0);
    for _ in 0..2000 {
        if !s.has_work() {
            break;
        }
        s.step();
        most = most.max(s.window_pool().map_or(0, |p| p.num_used()));
        most_global = most_global.max(s.pool().num_used());
    }
    assert!(!s.has_work(), "requests did not finish");
    let out = rxs
        .into_iter()
        .map(|mut rx| common::drain_tokens(&mut rx))
        .collect();
    (out, (most, most_global))
}

/// Three prompts of 80 greedy tokens through a scheduler with one table, then with window
/// pools: the same tokens and logprobs, only the windows held, and the same prompts again
/// from both pools' prefix caches.
fn same_tokens_holding_only_the_windows(dir: &Path) {
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(40 + 7 * i, i as u32)).collect();
    let mut plain = scheduler(dir, false);
    assert!(plain.window_pool().is_none());
    let (want, _) = run(&mut plain, &prompts, 1);

    let mut s = scheduler(dir, true);
    let pool = s.window_pool().expect("a window pool for the local layers");
    // Four sequences' windows and their prompts' last windows, and a step's 64 tokens:
    // 4 · 2 · (1 + 2) + 4 + 4 blocks.
    assert_eq!(pool.num_blocks(), 32);
    let (got, (most, most_global)) = run(&mut s, &prompts, 1);
    eprintln!("blocks held at most: {most} window, {most_global} global");
    assert_eq!(got, want, "window pools changed tokens or logprobs");
    assert!(got.iter().all(|r| r.len() == 1 && r[0].0.len() == 80));
    // Each sequence (up to 134 tokens, 9 blocks) holds at most its window's two blocks, the
    // one being written and its prompt's last window (two); the global tables hold them all.
    assert!(most <= 15, "{most} window blocks held at once");
    assert_eq!(s.window_pool().map(|p| p.num_used()), Some(0));
    let m = s.metrics().snapshot();
    assert_eq!((m.kv_window_blocks_used, m.kv_window_blocks_total), (0, 32));
    s.window_pool().unwrap().check_invariants().unwrap();

    // The same prompts again: served from both pools' prefix caches, the same output.
    let before = s.metrics().snapshot().prefix_cached_tokens;
    let (again, _) = run(&mut s, &prompts, 10);
    let cached = s.metrics().snapshot().prefix_cached_tokens - before;
    assert!(
        cached >= 3 * 32,
        "only {cached} prompt tokens came from the cache"
    );
    assert_eq!(again, want);
}

#[test]
fn window_pools_give_the_same_tokens_and_hold_only_the_windows() {
    same_tokens_holding_only_the_windows(windowed_model().path());
}

/// With every layer local the window pools hold all the K/V there is (the global tables only
/// number positions).
#[test]
fn every_layer_local_keeps_only_the_windows() {
    same_tokens_holding_only_the_windows(all_local_model().path());
}

/// Forks share their prompt's blocks in both pools, copying a shared partial block before
/// writing it (`copy_window_blocks` for the window pool): beams and seeded parallel samples
/// come out as with one table.
#[test]
fn beams_and_parallel_samples_share_window_blocks_as_one_table_does() {
    let dir = windowed_model();
    let requests = || {
        let mut beams = request(prompt(37, 1), 40, None);
        beams.beam = Some(BeamParams {
            width: 3,
            num_return: 2,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Never,
        });
        let mut samples = request(prompt(45, 2), 40, Some(7));
        samples.n = 3;
        samples.best_of = 3;
        vec![beams, samples]
    };
    let (want, _) = run_requests(&mut scheduler(dir.path(), false), requests(), 1);
    let mut s = scheduler(dir.path(), true);
    let (got, _) = run_requests(&mut s, requests(), 1);
    assert_eq!((got[0].len(), got[1].len()), (2, 3));
    assert_eq!(got, want, "window pools changed beams or samples");
    assert_eq!(s.window_pool().map(|p| p.num_used()), Some(0));
    s.window_pool().unwrap().check_invariants().unwrap();
}

/// Drafts grow both tables by their tokens (the tiny model keeps every token prompt lookup
/// proposes for these prompts; `kv_manager`'s tests trim rejected ones back): the same tokens
/// and logprobs as with one table.
#[test]
fn drafts_grow_both_tables() {
    let dir = windowed_model();
    let config = || SchedulerConfig {
        speculative: SpeculativeConfig {
            ngram: Some(NgramLookup::default()),
            ..Default::default()
        },
        ..cfg(4, 64)
    };
    let reqs = || {
        (0..3u32)
            .map(|k| request(prompt(13 + k as usize, k).repeat(4), 60, None))
            .collect()
    };
    let (want, _) = run_requests(&mut scheduler_with(dir.path(), false, config()), reqs(), 1);
    let mut s = scheduler_with(dir.path(), true, config());
    let (got, _) = run_requests(&mut s, reqs(), 1);
    assert_eq!(
        got, want,
        "window pools changed speculative decoding's output"
    );
    let proposed: u64 = s
        .metrics()
        .spec_proposed
        .iter()
        .map(|a| a.load(Relaxed))
        .sum();
    assert!(proposed > 50, "only {proposed} draft tokens proposed");
    assert_eq!(s.window_pool().map(|p| p.num_used()), Some(0));
    s.window_pool().unwrap().check_invariants().unwrap();
}
