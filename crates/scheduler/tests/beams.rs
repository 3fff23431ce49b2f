//! Beam search: equal to an exhaustive search where the width allows it, width 1 equal to
//! greedy, stop strings and length limits end hypotheses, and the KV pool comes back whole
//! (also when beams are preempted).

mod common;

use std::collections::HashMap;

use common::*;
use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use lmi_scheduler::{BeamParams, EarlyStopping, FinishReason, GenerateRequest};

const V: usize = 12;
const STOP: u32 = 3;

fn small_vocab_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec {
        vocab_size: V,
        ..TinySpec::llama()
    };
    write_tiny_model(dir.path(), &spec).unwrap();
    dir
}

fn beam(width: usize, num_return: usize, lp: f32, early: EarlyStopping) -> BeamParams {
    BeamParams {
        width,
        length_penalty: lp,
        early_stopping: early,
        num_return,
    }
}

fn prompt_small(seed: u32) -> Vec<u32> {
    prompt(7, seed).into_iter().map(|t| t % V as u32).collect()
}

/// log p(next | prompt + prefix) for every token, read from a greedy draw's top list.
fn next_logprobs(h: &lmi_scheduler::Handle, prompt: &[u32], prefix: &[u32]) -> Vec<f64> {
    let mut toks = prompt.to_vec();
    toks.extend_from_slice(prefix);
    let mut r = request(toks, 1, None);
    r.sampling.top_logprobs = V as u32;
    let mut s = h.submit(r).unwrap();
    let mut lp = vec![f64::NEG_INFINITY; V];
    while let Some(e) = s.blocking_recv() {
        if let lmi_scheduler::Event::Token(t) = e {
            for (id, l) in t.top {
                lp[id as usize] = f64::from(l);
            }
        }
    }
    lp
}

#[test]
fn full_width_beams_equal_an_exhaustive_search() {
    let dir = small_vocab_model();
    let h = spawn(dir.path(), 256, cfg(16, 4096));
    for seed in 0..3 {
        let p = prompt_small(seed);
        // Every output of at most 2 tokens: [STOP] alone, or [a, b] with a != STOP.
        let first = next_logprobs(&h, &p, &[]);
        let mut all: Vec<(Vec<u32>, f64)> = vec![(vec![STOP], first[STOP as usize])];
        for a in (0..V as u32).filter(|&a| a != STOP) {
            let second = next_logprobs(&h, &p, &[a]);
            for b in 0..V as u32 {
                all.push((vec![a, b], first[a as usize] + second[b as usize]));
            }
        }
        for lp in [1.0f32, 0.5, 2.0] {
            let score = |(t, cum): &(Vec<u32>, f64)| cum / (t.len() as f64).powf(f64::from(lp));
            let mut want = all.clone();
            want.sort_by(|x, y| score(y).total_cmp(&score(x)));
            let mut r = request(p.clone(), 2, None);
            r.stopping.stop_token_ids = vec![STOP];
            r.beam = Some(beam(V, 5, lp, EarlyStopping::Never));
            let out = collect(h.submit(r).unwrap());
            assert!(out.error.is_none(), "{:?}", out.error);
            assert_eq!(out.seqs.len(), 5);
            for (k, s) in out.seqs.iter().enumerate() {
                assert_eq!(s.tokens, want[k].0, "seed {seed}, lp {lp}, rank {k}");
                let f = s.finished.as_ref().unwrap();
                assert!(
                    (f.cumulative_logprob - want[k].1).abs() < 1e-4,
                    "seed {seed}, lp {lp}, rank {k}: {} vs {}",
                    f.cumulative_logprob,
                    want[k].1
                );
                let reason = if s.tokens.last() == Some(&STOP) {
                    FinishReason::EosToken
                } else {
                    FinishReason::Length
                };
                assert_eq!(f.reason, reason);
            }
        }
    }
    wait_pool_whole(&h, 0);
    h.shutdown();
}

#[test]
fn width_one_is_greedy_and_pools_come_back_whole() {
    let dir = tiny_model();
    let greedy = |r: &GenerateRequest, blocks: usize| {
        let h = spawn(dir.path(), blocks, cfg(8, 4096));
        let o = collect(h.submit(r.clone()).unwrap());
        wait_pool_whole(&h, 0);
        h.shutdown();
        o
    };
    for seed in 0..3 {
        let r = request(prompt(9, seed), 24, None);
        let plain = greedy(&r, 64);
        let mut b = r.clone();
        b.beam = Some(beam(1, 1, 1.0, EarlyStopping::Heuristic));
        let beamed = greedy(&b, 64);
        assert_eq!(plain.tokens(), beamed.tokens(), "seed {seed}");
    }

    // Several beam requests and plain ones together, in a pool small enough to preempt, give
    // what each gives alone.
    let reqs: Vec<GenerateRequest> = (0..4)
        .map(|i| {
            let mut r = request(prompt(20 + i, i as u32), 20, None);
            if i % 2 == 0 {
                r.beam = Some(beam(3, 2, 1.0, EarlyStopping::Heuristic));
            }
            r
        })
        .collect();
    let alone: Vec<Output> = reqs.iter().map(|r| greedy(r, 64)).collect();
    let h = spawn(dir.path(), 14, cfg(8, 4096));
    let streams: Vec<_> = reqs.iter().map(|r| h.submit(r.clone()).unwrap()).collect();
    let together: Vec<Output> = streams.into_iter().map(collect).collect();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert!(b.error.is_none(), "{i}: {:?}", b.error);
        assert_eq!(a.tokens(), b.tokens(), "request {i}");
    }
    assert!(h.metrics().snapshot().preemptions > 0, "meant to preempt");
    wait_pool_whole(&h, 0);
    h.shutdown();
}

#[test]
fn stop_strings_and_lengths_end_hypotheses() {
    let dir = tiny_model();
    let h = spawn(dir.path(), 128, cfg(8, 4096));
    let p = prompt(11, 5);
    let mut r = request(p.clone(), 16, None);
    r.beam = Some(beam(4, 4, 1.0, EarlyStopping::Never));
    let free = collect(h.submit(r.clone()).unwrap());
    assert_eq!(free.seqs.len(), 4);
    // The most frequent byte of the unconstrained beams becomes a stop string.
    let mut counts: HashMap<char, usize> = HashMap::new();
    for s in &free.seqs {
        assert!(s.tokens.len() <= 16);
        for c in s.text.chars() {
            *counts.entry(c).or_default() += 1;
        }
    }
    let (&stop, _) = counts.iter().max_by_key(|(c, n)| (**n, **c)).unwrap();
    r.stopping.stop_strings = vec![stop.to_string()];
    let out = collect(h.submit(r).unwrap());
    assert!(out.error.is_none(), "{:?}", out.error);
    let mut stopped = 0;
    for s in &out.seqs {
        let f = s.finished.as_ref().unwrap();
        assert!(
            !s.text.contains(stop),
            "{:?} contains the stop string",
            s.text
        );
        assert_eq!(f.text, s.text);
        assert!(s.tokens.len() <= 16);
        match f.reason {
            FinishReason::StopSequence => stopped += 1,
            FinishReason::Length => assert_eq!(s.tokens.len(), 16),
            FinishReason::EosToken => {}
        }
    }
    assert!(stopped > 0, "no beam hit the stop string {stop:?}");
    wait_pool_whole(&h, 0);
    h.shutdown();
}
