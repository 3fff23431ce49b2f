//! Speculative decoding changes speed, never output: with any draft (right, partly wrong,
//! garbage) and with prompt lookup, every request's tokens and logprobs equal those it gets
//! without speculation, greedy or sampled, alone or batched, with or without preemption.

mod common;

use common::*;
use lmi_scheduler::{DraftSource, NgramLookup, SchedulerConfig, SpeculativeConfig};

fn spec_cfg(max_batch: usize, ngram: Option<NgramLookup>) -> SchedulerConfig {
    SchedulerConfig {
        speculative: SpeculativeConfig {
            ngram,
            ..SpeculativeConfig::default()
        },
        ..cfg(max_batch, 4096)
    }
}

/// A prompt that repeats itself, so prompt lookup finds matches.
fn repetitive(seed: u32) -> Vec<u32> {
    let unit = prompt(12, seed);
    unit.iter().cycle().take(40).copied().collect()
}

fn requests() -> Vec<lmi_scheduler::GenerateRequest> {
    (0..6)
        .map(|i| {
            let p = if i % 2 == 0 {
                repetitive(i)
            } else {
                prompt(9 + i as usize, i)
            };
            request(p, 40, (i % 3 == 2).then_some(100 + i as u64))
        })
        .collect()
}

fn run_solo(
    dir: &std::path::Path,
    cfg: SchedulerConfig,
    reqs: Vec<lmi_scheduler::GenerateRequest>,
) -> Vec<Output> {
    reqs.into_iter()
        .map(|r| {
            let h = spawn(dir, 64, cfg.clone());
            let o = collect(h.submit(r).unwrap());
            wait_pool_whole(&h, 0);
            h.shutdown();
            o
        })
        .collect()
}

fn same(a: &[Output], b: &[Output], what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(y.error.is_none(), "{what}, request {i}: {:?}", y.error);
        assert_eq!(x.tokens(), y.tokens(), "{what}, request {i}: tokens");
        let lp = |o: &Output| {
            o.seqs
                .iter()
                .map(|s| s.logprobs.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(lp(x), lp(y), "{what}, request {i}: logprobs");
    }
}

/// Drafts of each kind for request `i` given its plain output.
fn drafts(plain: &Output) -> [Vec<u32>; 3] {
    let right = plain.seqs[0].tokens.clone();
    let mut partly = right.clone();
    for (j, t) in partly.iter_mut().enumerate() {
        if j % 5 == 3 {
            *t = (*t + 1) % 256;
        }
    }
    let garbage: Vec<u32> = (0..40).map(|j| (j * 37 + 11) % 256).collect();
    [right, partly, garbage]
}

#[test]
fn drafts_and_prompt_lookup_never_change_the_output() {
    let dir = tiny_model();
    let plain = run_solo(dir.path(), cfg(1, 4096), requests());

    // Client drafts, alone.
    for kind in 0..3 {
        let reqs = requests()
            .into_iter()
            .zip(&plain)
            .map(|(mut r, p)| {
                r.draft = drafts(p)[kind].clone();
                r
            })
            .collect();
        let out = run_solo(dir.path(), cfg(1, 4096), reqs);
        same(&plain, &out, &format!("draft kind {kind}"));
        if kind == 0 {
            for o in &out {
                let f = o.seqs[0].finished.as_ref().unwrap();
                // A right draft is kept whole but for the last token, which the target adds.
                assert!(f.accepted_draft_tokens >= 30, "{f:?}");
                assert_eq!(f.rejected_draft_tokens, 0, "{f:?}");
            }
        }
    }

    // Prompt lookup, alone and batched (with a mix of client drafts), then with a pool small
    // enough to preempt.
    let lookup = Some("1-3:6".parse::<NgramLookup>().unwrap());
    let solo = run_solo(dir.path(), spec_cfg(1, lookup), requests());
    same(&plain, &solo, "prompt lookup");
    for blocks in [64, 12] {
        let h = spawn(dir.path(), blocks, spec_cfg(6, lookup));
        let streams: Vec<_> = requests()
            .into_iter()
            .zip(&plain)
            .enumerate()
            .map(|(i, (mut r, p))| {
                if i % 3 == 1 {
                    r.draft = drafts(p)[i % 2].clone();
                }
                h.submit(r).unwrap()
            })
            .collect();
        let out: Vec<Output> = streams.into_iter().map(collect).collect();
        same(&plain, &out, &format!("batched, {blocks} blocks"));
        wait_pool_whole(&h, 0);
        let m = h.metrics().snapshot();
        assert!(m.spec_proposed[DraftSource::PromptLookup as usize] > 0);
        assert!(m.spec_accepted[DraftSource::PromptLookup as usize] > 0);
        if blocks == 12 {
            assert!(m.preemptions > 0, "the small pool was meant to preempt");
        }
        h.shutdown();
    }
}

#[test]
fn a_right_draft_takes_few_steps_and_a_full_batch_does_not_speculate() {
    let dir = tiny_model();
    let r = request(prompt(10, 1), 48, None);
    let h = spawn(dir.path(), 64, cfg(1, 4096));
    let plain = collect(h.submit(r.clone()).unwrap());
    let plain_steps = h.metrics().snapshot().steps;
    h.shutdown();

    let h = spawn(dir.path(), 64, cfg(1, 4096));
    let mut drafted = r.clone();
    drafted.draft = plain.seqs[0].tokens.clone();
    let out = collect(h.submit(drafted).unwrap());
    assert_eq!(out.tokens(), plain.tokens());
    let steps = h.metrics().snapshot().steps;
    // Drafts grow 4, 8, 15 tokens: 48 tokens take well under half the steps.
    assert!(steps * 2 < plain_steps, "{steps} steps vs {plain_steps}");
    h.shutdown();

    // 16 running sequences fill the step: nothing is drafted.
    let h = spawn(dir.path(), 256, cfg(16, 4096));
    let streams: Vec<_> = (0..16)
        .map(|i| {
            let mut r = request(prompt(10, i), 24, None);
            r.draft = plain.seqs[0].tokens.clone();
            h.submit(r).unwrap()
        })
        .collect();
    for s in streams {
        assert!(collect(s).error.is_none());
    }
    let m = h.metrics().snapshot();
    // Admission takes a few steps, during which fewer than 16 run.
    let proposed = m.spec_proposed[DraftSource::Client as usize];
    assert!(
        proposed < 16 * 8,
        "{proposed} draft tokens with a full batch"
    );
    h.shutdown();
}

#[test]
fn a_draft_model_never_changes_the_output() {
    use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
    use lmi_engine::DType;
    use lmi_engine::engine::EngineOptions;
    let dir = tiny_model();
    let plain = run_solo(dir.path(), cfg(1, 4096), requests());
    // The model itself (every greedy draft is right) and another random model (mostly wrong).
    let other = tempfile::tempdir().unwrap();
    write_tiny_model(
        other.path(),
        &TinySpec {
            seed: 99,
            ..TinySpec::llama()
        },
    )
    .unwrap();
    let load = |d: &std::path::Path, blocks: usize| {
        let opts = EngineOptions {
            dtype: Some(DType::F32),
            kv_blocks: Some(blocks),
            ..Default::default()
        };
        Box::new(lmi_engine::load_cpu(d, &opts).unwrap())
    };
    for (name, draft_dir) in [("itself", dir.path()), ("another model", other.path())] {
        for (blocks, draft_blocks) in [(64, 64), (12, 6)] {
            let h = lmi_scheduler::Handle::spawn_with_draft_model(
                load(dir.path(), blocks),
                load(draft_dir, draft_blocks),
                lmi_text::Tokenizer::from_dir(dir.path()).unwrap(),
                cfg(6, 4096),
            )
            .unwrap();
            let streams: Vec<_> = requests()
                .into_iter()
                .map(|r| h.submit(r).unwrap())
                .collect();
            let out: Vec<Output> = streams.into_iter().map(collect).collect();
            same(
                &plain,
                &out,
                &format!("draft model: {name}, {blocks} blocks"),
            );
            wait_pool_whole(&h, 0);
            let m = h.metrics().snapshot();
            let (proposed, kept) = (
                m.spec_proposed[DraftSource::Model as usize],
                m.spec_accepted[DraftSource::Model as usize],
            );
            assert!(proposed > 0, "{name}: nothing drafted");
            if name == "itself" && blocks == 64 {
                // Greedy drafts of the model itself: the greedy requests keep every one.
                assert!(
                    kept * 10 >= proposed * 5,
                    "{name}: kept {kept} of {proposed}"
                );
            }
            h.shutdown();
        }
    }
}
