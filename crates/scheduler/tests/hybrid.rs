//! Gated DeltaNet hybrids (Qwen3.5 dense and MoE, Qwen3-Next) through the scheduler, their
//! recurrent state in the KV manager's slots: transformers' greedy tokens with the six prompts
//! sharing steps and cut by a small prefill budget; prefix-cache hits that resume from state
//! snapshots with the cold run's tokens and logprobs exactly; forks (n = 2, beams) that copy
//! the state; speculative decoding that rolls the state back; preemption under a small cache.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

use common::{cfg, request, run_to_end};
use lmi_engine::DType;
use lmi_engine::engine::{EngineOptions, StepShape};
use lmi_scheduler::{
    BeamParams, EarlyStopping, Event, GenerateRequest, Scheduler, SchedulerConfig,
};
use lmi_text::Tokenizer;

const ARCHITECTURES: [&str; 3] = ["qwen3_5", "qwen3_5_moe", "qwen3_next"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/hybrid/{name}"))
}

/// The fixture's model beside a byte-level tokenizer that also names ids 260..320 (the
/// fixtures' vocabulary is 320).
fn model(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(name).join(f), tmp.path().join(f)).unwrap();
    }
    lmi_checkpoint::testing::write_tiny_tokenizer_for(tmp.path(), 320).unwrap();
    tmp
}

/// The fixture's prompts and transformers' greedy continuations.
fn reference(name: &str) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(name).join("reference.json")).unwrap(),
    )
    .unwrap();
    let lists = |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(json[k].clone()).unwrap() };
    (lists("prompts"), lists("greedies"))
}

fn scheduler(dir: &Path, blocks: usize, config: SchedulerConfig) -> Scheduler {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(blocks),
        max_step: StepShape {
            seqs: 6,
            tokens: 64,
            context: None,
        },
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts).unwrap();
    Scheduler::new(Box::new(engine), Tokenizer::from_dir(dir).unwrap(), config)
}

fn greedy(prompts: &[Vec<u32>]) -> Vec<GenerateRequest> {
    prompts
        .iter()
        .map(|p| request(p.clone(), 32, None))
        .collect()
}

/// The six prompts at once with a prefill budget of 7 tokens a step (every prompt cut,
/// several sequences per step, decode beside prefill): transformers' greedy tokens, and the
/// same tokens and logprobs as with a budget that takes each prompt whole.
#[test]
fn greedy_tokens_match_transformers_with_chunked_prefill() {
    for name in ARCHITECTURES {
        let dir = model(name);
        let (prompts, want) = reference(name);
        let whole = run_to_end(
            &mut scheduler(dir.path(), 96, cfg(6, 512)),
            greedy(&prompts),
            1,
        );
        let mut s = scheduler(dir.path(), 96, cfg(6, 7));
        let cut = run_to_end(&mut s, greedy(&prompts), 1);
        let tokens: Vec<Vec<u32>> = cut.iter().map(|r| r[0].0.clone()).collect();
        assert_eq!(
            tokens, want,
            "{name}: greedy tokens differ from transformers'"
        );
        assert_eq!(
            cut, whole,
            "{name}: the prefill budget changed tokens or logprobs"
        );
        let m = s.metrics().snapshot();
        assert_eq!((m.state_slots_used, m.state_slots_total), (0, 16));
    }
}

/// The same prompts again: each resumes from the snapshot at its last full block (its K/V
/// and state), with the cold run's tokens and logprobs exactly. Then a prompt that shares
/// only its first 32 tokens with an earlier one: computed whole (no snapshot there yet), it
/// leaves one where it branched off, so a third prompt with that prefix starts at 32.
#[test]
fn prefix_hits_resume_from_state_snapshots_exactly() {
    for name in ARCHITECTURES {
        let dir = model(name);
        let (prompts, _) = reference(name);
        let mut s = scheduler(dir.path(), 96, cfg(6, 512));
        let cold = run_to_end(&mut s, greedy(&prompts), 1);
        let before = s.metrics().snapshot().prefix_cached_tokens;
        let again = run_to_end(&mut s, greedy(&prompts), 10);
        let cached = s.metrics().snapshot().prefix_cached_tokens - before;
        // Prompts of 21, 33 and 40 tokens hit 16, 32 and 32 (at least one token is computed).
        assert_eq!(cached, 16 + 32 + 32, "{name}");
        assert_eq!(
            again, cold,
            "{name}: a prefix hit changed tokens or logprobs"
        );

        let shared = &prompts[5][..32];
        let branch = |tail: u32| -> Vec<u32> {
            let mut p = shared.to_vec();
            p.extend((0..9).map(|i| (tail * 31 + i * 7) % 250 + 3));
            p
        };
        let fresh = run_to_end(
            &mut scheduler(dir.path(), 96, cfg(6, 512)),
            greedy(&[branch(3)]),
            1,
        );
        let counted = |s: &Scheduler| s.metrics().snapshot().prefix_cached_tokens;
        let before = counted(&s);
        run_to_end(&mut s, greedy(&[branch(1)]), 20);
        // prompts[5] cached 32 tokens of K/V, its state only at 32 (its last full block).
        assert_eq!(counted(&s) - before, 32, "{name}");
        let before = counted(&s);
        let hit = run_to_end(&mut s, greedy(&[branch(3)]), 21);
        assert_eq!(counted(&s) - before, 32, "{name}");
        assert_eq!(
            hit, fresh,
            "{name}: the branch's hit changed tokens or logprobs"
        );
        let m = s.metrics().snapshot();
        assert!(m.state_snapshots > 0 && m.state_slots_used == 0, "{m:?}");
    }
}

/// n = 2 greedy samples (the second forked off the first's prefill, its state copied) both
/// give transformers' tokens; beam search's beams come back with logprobs equal to scoring
/// their tokens cold (a beam forked with a wrong state would not).
#[test]
fn forks_copy_the_state() {
    for name in ARCHITECTURES {
        let dir = model(name);
        let (prompts, want) = reference(name);
        let mut s = scheduler(dir.path(), 96, cfg(6, 512));
        let mut two = request(prompts[4].clone(), 32, None);
        two.n = 2;
        let out = run_to_end(&mut s, vec![two], 1);
        assert_eq!(out[0].len(), 2);
        for (tokens, _) in &out[0] {
            assert_eq!(tokens, &want[4], "{name}: a fork's tokens differ");
        }

        let mut beams = request(prompts[3].clone(), 12, None);
        beams.beam = Some(BeamParams {
            width: 3,
            num_return: 3,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::Never,
        });
        let out = run_to_end(&mut s, vec![beams], 10);
        assert_eq!(out[0].len(), 3, "{name}");
        for (k, (tokens, logprobs)) in out[0].iter().enumerate() {
            // Score prompt + beam cold, in a scheduler of its own (no prefix cache).
            let mut full = prompts[3].clone();
            full.extend(tokens);
            let mut score = request(full.clone(), 1, None);
            score.prompt_logprobs = Some(0);
            let scored = prompt_logprobs(&mut scheduler(dir.path(), 96, cfg(6, 512)), score);
            let cold = &scored[prompts[3].len()..];
            for (j, (a, b)) in logprobs.iter().zip(cold).enumerate() {
                assert!(
                    (a - b).abs() < 1e-4,
                    "{name} beam {k} token {j}: {a} vs {b}"
                );
            }
        }
    }
}

/// The prompt logprobs of `r` (one per prompt token after the first).
fn prompt_logprobs(s: &mut Scheduler, r: GenerateRequest) -> Vec<f32> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    s.add(1, r, tx).unwrap();
    while s.has_work() {
        s.step();
    }
    while let Ok(e) = rx.try_recv() {
        if let Event::Prefill(p) = e {
            return p.iter().map(|t| t.logprob.unwrap_or(0.0)).collect();
        }
    }
    panic!("no prompt logprobs")
}

/// Client drafts (transformers' continuation with two tokens changed) are verified in steps
/// of several tokens: accepted up to each wrong token, the state rolled back to before the
/// draft and the kept tokens computed again. The output is the plain run's.
#[test]
fn speculative_decoding_rolls_the_state_back() {
    for name in ARCHITECTURES {
        let dir = model(name);
        let (prompts, want) = reference(name);
        let reqs = |drafts: bool| -> Vec<GenerateRequest> {
            prompts
                .iter()
                .zip(&want)
                .map(|(p, w)| {
                    let mut r = request(p.clone(), 32, None);
                    if drafts {
                        r.draft = w.clone();
                        r.draft[5] = (r.draft[5] + 1) % 320;
                        r.draft[20] = (r.draft[20] + 1) % 320;
                    }
                    r
                })
                .collect()
        };
        let plain = run_to_end(&mut scheduler(dir.path(), 96, cfg(6, 512)), reqs(false), 1);
        let mut s = scheduler(dir.path(), 96, cfg(6, 512));
        let got = run_to_end(&mut s, reqs(true), 1);
        let m = s.metrics();
        let proposed: u64 = m.spec_proposed.iter().map(|a| a.load(Relaxed)).sum();
        let accepted: u64 = m.spec_accepted.iter().map(|a| a.load(Relaxed)).sum();
        eprintln!("{name}: {accepted} of {proposed} draft tokens accepted");
        assert!(
            accepted > 0 && accepted < proposed,
            "{name}: {accepted} of {proposed}"
        );
        assert_eq!(got, plain, "{name}: speculation changed the output");
        let tokens: Vec<Vec<u32>> = got.iter().map(|r| r[0].0.clone()).collect();
        assert_eq!(tokens, want, "{name}");
        assert_eq!(m.snapshot().state_slots_used, 0);
    }
}

/// A cache of 12 blocks for six sequences of up to 72 tokens: sequences are preempted (their
/// state slot given back) and recomputed, with the tokens of a roomy run.
#[test]
fn preempted_sequences_recompute_their_state() {
    let name = "qwen3_5";
    let dir = model(name);
    let (prompts, want) = reference(name);
    let mut s = scheduler(dir.path(), 12, cfg(6, 512));
    let got = run_to_end(&mut s, greedy(&prompts), 1);
    let tokens: Vec<Vec<u32>> = got.iter().map(|r| r[0].0.clone()).collect();
    assert_eq!(tokens, want);
    let m = s.metrics().snapshot();
    assert!(m.preemptions > 0, "no preemption: {m:?}");
    assert_eq!(m.state_slots_used, 0);
}
