//! Continuous batching on a tiny random model: concurrent = alone, cancellation, preemption,
//! prefix cache, n > 1, rejection, and a whole pool after every test.

mod common;

use common::*;
use lmi_engine::sampling::derive_seed;
use lmi_scheduler::{FinishReason, SubmitError};

fn requests() -> Vec<lmi_scheduler::GenerateRequest> {
    (0..12)
        .map(|i| {
            let seed = if i % 2 == 0 {
                None
            } else {
                Some(100 + i as u64)
            };
            request(prompt(5 + i * 7, i as u32), 10 + i * 2, seed)
        })
        .collect()
}

fn solo_outputs(dir: &std::path::Path) -> Vec<Output> {
    requests()
        .into_iter()
        .map(|r| {
            let h = spawn(dir, 64, cfg(1, 4096));
            let out = collect(h.submit(r).unwrap());
            wait_pool_whole(&h, 0);
            out
        })
        .collect()
}

#[test]
fn concurrent_requests_match_each_alone_and_preemption_changes_nothing() {
    let dir = tiny_model();
    let solo = solo_outputs(dir.path());
    for s in &solo {
        assert!(s.error.is_none());
        assert_eq!(s.seqs.len(), 1);
    }
    // Everything at once, a small token budget (chunked prefill), batches of 8.
    let h = spawn(dir.path(), 128, cfg(8, 24));
    let streams: Vec<_> = requests()
        .into_iter()
        .map(|r| h.submit(r).unwrap())
        .collect();
    let together: Vec<Output> = streams.into_iter().map(collect).collect();
    for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
        assert_eq!(a.tokens(), b.tokens(), "request {i}");
        assert_eq!(a.seqs[0].text, b.seqs[0].text);
        assert_eq!(b.seqs[0].finished.as_ref().unwrap().text, b.seqs[0].text);
    }
    wait_pool_whole(&h, 0);

    // A pool far too small: 14 blocks for 12 requests needing up to 6 blocks each.
    let h = spawn(dir.path(), 14, cfg(12, 4096));
    let streams: Vec<_> = requests()
        .into_iter()
        .map(|r| h.submit(r).unwrap())
        .collect();
    let squeezed: Vec<Output> = streams.into_iter().map(collect).collect();
    for (i, (a, b)) in solo.iter().zip(&squeezed).enumerate() {
        assert!(b.error.is_none(), "request {i}: {:?}", b.error);
        assert_eq!(a.tokens(), b.tokens(), "request {i} after preemption");
    }
    assert!(
        h.metrics().snapshot().preemptions > 0,
        "the small pool must have forced preemption"
    );
    wait_pool_whole(&h, 0);
}

#[test]
fn dropping_the_stream_frees_its_blocks() {
    let dir = tiny_model();
    let h = spawn(dir.path(), 64, cfg(8, 4096));
    let mut s = h.submit(request(prompt(40, 1), 400, None)).unwrap();
    let other = h.submit(request(prompt(20, 2), 30, None)).unwrap();
    for _ in 0..3 {
        s.blocking_recv().unwrap();
    }
    assert!(h.metrics().snapshot().kv_blocks_used > 0);
    drop(s);
    let o = collect(other);
    assert_eq!(o.seqs[0].tokens.len(), 30);
    wait_pool_whole(&h, 0);
}

#[test]
fn prefix_cache_hit_skips_the_cached_prefill_and_changes_nothing() {
    let dir = tiny_model();
    let shared = prompt(40, 9);
    let mut b_prompt = shared[..35].to_vec();
    b_prompt.extend(prompt(9, 10));
    // Cold run of B alone.
    let (cold, cold_computed) = {
        let h = spawn(dir.path(), 64, cfg(4, 4096));
        let o = collect(h.submit(request(b_prompt.clone(), 12, Some(5))).unwrap());
        (o, h.metrics().snapshot().computed_tokens)
    };
    // The whole prompt, then one token per decode step (the last sampled token never runs).
    assert_eq!(cold_computed, (b_prompt.len() + 11) as u64);
    let h = spawn(dir.path(), 64, cfg(4, 4096));
    let a = collect(h.submit(request(shared.clone(), 12, None)).unwrap());
    assert_eq!(a.seqs[0].finished.as_ref().unwrap().cached_prompt_tokens, 0);
    let before = h.metrics().snapshot();
    let warm = collect(h.submit(request(b_prompt.clone(), 12, Some(5))).unwrap());
    let after = h.metrics().snapshot();
    assert_eq!(
        warm.tokens(),
        cold.tokens(),
        "a prefix-cache hit must not change the output"
    );
    let fin = warm.seqs[0].finished.as_ref().unwrap();
    assert_eq!(
        fin.cached_prompt_tokens, 32,
        "two full blocks of the shared 35 tokens"
    );
    // Tokens actually computed: only the 12 uncached prompt tokens, then the decode steps.
    assert_eq!(
        after.computed_tokens - before.computed_tokens,
        (b_prompt.len() - 32 + 11) as u64
    );
    assert_eq!(
        after.prompt_tokens - before.prompt_tokens,
        b_prompt.len() as u64
    );
    assert_eq!(after.prefix_cached_tokens - before.prefix_cached_tokens, 32);
    wait_pool_whole(&h, 0);
}

#[test]
fn parallel_sequences_share_the_prompt_and_match_single_requests() {
    let dir = tiny_model();
    let p = prompt(21, 4); // a partial last block: copy-on-write on the first decode
    let mut r = request(p.clone(), 15, Some(77));
    r.n = 3;
    let h = spawn(dir.path(), 64, cfg(8, 4096));
    let out = collect(h.submit(r).unwrap());
    assert_eq!(out.seqs.len(), 3);
    for i in 0..3 {
        let single = collect(
            h.submit(request(p.clone(), 15, Some(derive_seed(77, i as u64))))
                .unwrap(),
        );
        assert_eq!(out.seqs[i].tokens, single.seqs[0].tokens, "sequence {i}");
    }
    assert_ne!(out.seqs[0].tokens, out.seqs[1].tokens);
    wait_pool_whole(&h, 0);
}

#[test]
fn requests_that_can_never_fit_are_rejected_at_submit() {
    let dir = tiny_model();
    let h = spawn(dir.path(), 8, cfg(4, 4096));
    let too_long = h.submit(request(prompt(500, 1), 100, None)).err().unwrap();
    assert!(
        matches!(
            too_long,
            SubmitError::TooLong {
                total: 600,
                max_len: 512,
                ..
            }
        ),
        "{too_long}"
    );
    let too_big = h.submit(request(prompt(100, 1), 100, None)).err().unwrap();
    assert!(
        matches!(
            too_big,
            SubmitError::NeverFits {
                needed: 13,
                available: 8,
                ..
            }
        ),
        "{too_big}"
    );
    assert!(too_big.to_string().contains("KV blocks"));
    let empty = h.submit(request(vec![], 1, None)).err().unwrap();
    assert_eq!(empty, SubmitError::EmptyPrompt);
    let mut bad = request(prompt(4, 1), 4, Some(1));
    bad.sampling.top_p = 1.5;
    assert!(h.submit(bad).err().unwrap().to_string().contains("top_p"));
    // The scheduler still serves.
    assert_eq!(
        collect(h.submit(request(prompt(10, 1), 5, None)).unwrap()).seqs[0]
            .tokens
            .len(),
        5
    );
    wait_pool_whole(&h, 0);
}

#[test]
fn stop_strings_stop_ids_and_lengths() {
    let dir = tiny_model();
    let h = spawn(dir.path(), 64, cfg(4, 4096));
    let p = prompt(12, 3);
    let base = collect(h.submit(request(p.clone(), 40, None)).unwrap());
    assert_eq!(base.reason(0), FinishReason::Length);
    let text = base.seqs[0].text.clone();
    // A stop string taken from the middle of the greedy output.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[10..13].iter().collect();
    let cut = text.find(&stop).unwrap();
    let mut r = request(p.clone(), 40, None);
    r.stopping.stop_strings = vec![stop.clone()];
    let o = collect(h.submit(r.clone()).unwrap());
    assert_eq!(o.reason(0), FinishReason::StopSequence);
    assert_eq!(o.seqs[0].text, text[..cut]);
    assert_eq!(o.seqs[0].finished.as_ref().unwrap().text, text[..cut]);
    r.stopping.include_stop_str_in_output = true;
    let o = collect(h.submit(r).unwrap());
    assert_eq!(o.seqs[0].text, text[..cut + stop.len()]);

    // A stop token id: the 6th greedy token.
    let stop_id = base.seqs[0].tokens[5];
    let first = base.seqs[0]
        .tokens
        .iter()
        .position(|&t| t == stop_id)
        .unwrap();
    let mut r = request(p.clone(), 40, None);
    r.stopping.stop_token_ids = vec![stop_id];
    let o = collect(h.submit(r.clone()).unwrap());
    assert_eq!(o.reason(0), FinishReason::EosToken);
    assert_eq!(o.seqs[0].tokens, base.seqs[0].tokens[..=first]);
    // min_new_tokens masks it before then.
    r.sampling.min_new_tokens = first as u32 + 1;
    let o = collect(h.submit(r).unwrap());
    assert!(o.seqs[0].tokens.len() > first + 1, "{:?}", o.seqs[0].tokens);
    assert!(!o.seqs[0].tokens[..=first].contains(&stop_id));
    wait_pool_whole(&h, 0);
}

#[test]
fn pinned_system_prompt_survives_eviction() {
    let dir = tiny_model();
    let h = spawn(dir.path(), 16, cfg(4, 4096));
    let system = prompt(32, 42);
    let mut p = system.clone();
    p.extend(prompt(5, 1));
    let mut r = request(p.clone(), 4, None);
    r.pin_prefix_tokens = 32;
    collect(h.submit(r).unwrap());
    wait_pool_whole(&h, 2);
    // Churn through the whole pool with unrelated prompts.
    for i in 0..6 {
        collect(h.submit(request(prompt(100, 100 + i), 20, None)).unwrap());
    }
    let mut q = system.clone();
    q.extend(prompt(7, 2));
    let o = collect(h.submit(request(q, 4, None)).unwrap());
    assert_eq!(
        o.seqs[0].finished.as_ref().unwrap().cached_prompt_tokens,
        32
    );
    wait_pool_whole(&h, 2);
}

#[test]
fn prompt_logprobs_are_sent_before_the_first_token() {
    let dir = tiny_model();
    let h = spawn(dir.path(), 64, cfg(4, 8));
    let mut r = request(prompt(20, 5), 3, None);
    r.prompt_logprobs = Some(2);
    let o = collect(h.submit(r).unwrap());
    let pl = o.prefill.unwrap();
    assert_eq!(pl.len(), 20);
    assert!(pl[0].logprob.is_none());
    assert!(
        pl[1..]
            .iter()
            .all(|t| t.logprob.unwrap() <= 0.0 && t.top.len() == 2)
    );
    wait_pool_whole(&h, 0);
}
