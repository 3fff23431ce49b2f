//! Pooling requests (embeddings) through the scheduler on a real engine: the Qwen3-Embedding-
//! shaped fixture (tests/fixtures/embed/qwen3_embedding, last-token pooling on a decoder).
//! The scheduler's vectors equal the engine's own step output bit for bit, alone and in a busy
//! batch beside generation; they match sentence-transformers' vectors; the blocks come back;
//! a dropped stream cancels; an input no step can hold is refused at submit.

mod common;

use std::path::PathBuf;

use common::*;
use lmi_engine::DType;
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{LogitsWanted, SeqChunk, StepBatch, step::PoolRequest};
use lmi_scheduler::{Event, Handle, Pooled, PoolingRequest, RequestStream, SubmitError};
use lmi_text::Tokenizer;

fn fixture() -> PathBuf {
    embed_fixture("qwen3_embedding")
}

fn embed_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/embed")
        .join(name)
}

fn opts(blocks: usize) -> EngineOptions {
    EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(blocks),
        ..Default::default()
    }
}

fn spawn_embedder(blocks: usize, cfg: lmi_scheduler::SchedulerConfig) -> Handle {
    let dir = fixture();
    let engine = lmi_engine::load_cpu(&dir, &opts(blocks)).unwrap();
    assert!(
        engine.pooler().is_some(),
        "the fixture is an embedding model"
    );
    Handle::spawn(Box::new(engine), Tokenizer::from_dir(&dir).unwrap(), cfg)
}

/// The reference inputs (token ids as sentence-transformers fed them) and their vectors.
fn reference() -> Vec<(Vec<u32>, Vec<f32>)> {
    let text = std::fs::read_to_string(fixture().join("reference.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    r["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let ids = floats(&i["ids"]).into_iter().map(|x| x as u32).collect();
            let emb = floats(&i["embedding"])
                .into_iter()
                .map(|x| x as f32)
                .collect();
            (ids, emb)
        })
        .collect()
}

/// The engine's own output for `tokens` run alone in one step, without the scheduler.
fn direct(engine: &mut dyn StepEngine, tokens: &[u32]) -> Vec<f32> {
    direct_pair(engine, tokens, None)
}

fn direct_pair(engine: &mut dyn StepEngine, tokens: &[u32], segment_b: Option<usize>) -> Vec<f32> {
    let chunks = [SeqChunk {
        tokens: tokens.to_vec(),
        start_pos: 0,
        block_table: (0..tokens.len().div_ceil(lmi_engine::BLOCK_SIZE) as u32).collect(),
        window_table: vec![],
        logits: LogitsWanted::None,
        adapter: None,
    }];
    let pools = [PoolRequest {
        chunk: 0,
        segment_b,
    }];
    let out = engine
        .step(&StepBatch {
            chunks: &chunks,
            samples: &[],
            prompt_logprobs: &[],
            media: &[],
            rope_deltas: &[],
            states: &[],
            pools: &pools,
            mtp: &[],
        })
        .unwrap();
    assert_eq!(out.pooled.len(), 1);
    out.pooled.into_iter().next().unwrap()
}

fn pooling(tokens: &[u32]) -> PoolingRequest {
    PoolingRequest {
        tokens: tokens.to_vec(),
        segment_b: None,
    }
}

fn pooled(mut s: RequestStream) -> Pooled {
    let mut got = None;
    while let Some(e) = s.blocking_recv() {
        match e {
            Event::Pooled(p) => {
                assert!(got.is_none(), "one result per request");
                got = Some(p);
            }
            other => panic!("a pooling stream got {other:?}"),
        }
    }
    got.expect("a pooled result")
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn vectors_equal_the_engines_step_alone_and_in_a_busy_batch_beside_generation() {
    let refs = reference();
    let mut engine = lmi_engine::load_cpu(&fixture(), &opts(64)).unwrap();
    let want: Vec<Vec<f32>> = refs
        .iter()
        .map(|(ids, _)| direct(&mut engine, ids))
        .collect();
    for (i, ((_, st), got)) in refs.iter().zip(&want).enumerate() {
        let c = cosine(st, got);
        assert!(
            c >= 0.99999,
            "input {i}: cosine {c} to sentence-transformers"
        );
    }

    // Alone through the scheduler.
    let h = spawn_embedder(64, cfg(8, 256));
    for (i, (ids, _)) in refs.iter().enumerate() {
        let p = pooled(h.submit_pooling(pooling(ids)).unwrap());
        assert_eq!(bits(&p.values), bits(&want[i]), "input {i} alone");
        assert_eq!(p.prompt_tokens, ids.len());
        assert!(p.timings.total >= p.timings.queue);
    }
    wait_pool_whole(&h, 0);
    let m = h.metrics().snapshot();
    assert_eq!(m.pooling_requests, refs.len() as u64);
    let tokens: usize = refs.iter().map(|(ids, _)| ids.len()).sum();
    assert_eq!(m.pooling_prompt_tokens, tokens as u64);
    assert_eq!(m.prompt_tokens, 0, "pooling inputs are counted apart");

    // Busy: generation requests alone first, then everything at once with a budget and a
    // batch size that several steps must share (the longest input still fits one step).
    let gens: Vec<_> = (0..6)
        .map(|i| request(prompt(10 + 9 * i, i as u32), 12, None))
        .collect();
    let solo_gen: Vec<Output> = gens
        .iter()
        .map(|r| collect(h.submit(r.clone()).unwrap()))
        .collect();
    let longest = refs.iter().map(|(ids, _)| ids.len()).max().unwrap();
    let busy = spawn_embedder(96, cfg(6, longest + 24));
    let mut gen_streams = Vec::new();
    let mut pool_streams = Vec::new();
    for round in 0..4 {
        for (i, (ids, _)) in refs.iter().enumerate() {
            pool_streams.push((i, busy.submit_pooling(pooling(ids)).unwrap()));
            if (round * refs.len() + i).is_multiple_of(3) && gen_streams.len() < gens.len() {
                let k = gen_streams.len();
                gen_streams.push(busy.submit(gens[k].clone()).unwrap());
            }
        }
    }
    for (i, s) in pool_streams {
        let p = pooled(s);
        assert_eq!(bits(&p.values), bits(&want[i]), "input {i} in a busy batch");
    }
    assert_eq!(gen_streams.len(), gens.len());
    for (k, s) in gen_streams.into_iter().enumerate() {
        let out = collect(s);
        assert!(out.error.is_none(), "{:?}", out.error);
        assert_eq!(
            out.tokens(),
            solo_gen[k].tokens(),
            "generation {k} beside pooling"
        );
    }
    wait_pool_whole(&busy, 0);
    wait_idle(&busy);
    let m = busy.metrics().snapshot();
    assert_eq!(m.pooling_requests, 4 * refs.len() as u64);
    assert!(
        m.steps > 4,
        "the batch was shared among steps ({} steps)",
        m.steps
    );
}

#[test]
fn a_dropped_stream_cancels_a_waiting_pooling_request() {
    let refs = reference();
    // One sequence at a time, admitted in arrival order: the pooling requests wait behind
    // 32 generations of 480 steps each (about a second), which outlast the drop below even
    // when this thread is descheduled for a while on a loaded machine (one did not).
    let h = spawn_embedder(64, cfg(1, 256));
    let longs: Vec<_> = (1..=32)
        .map(|k| h.submit(request(prompt(20, k), 480, None)).unwrap())
        .collect();
    let dropped: Vec<_> = refs
        .iter()
        .map(|(ids, _)| h.submit_pooling(pooling(ids)).unwrap())
        .collect();
    let kept = h.submit_pooling(pooling(&refs[0].0)).unwrap();
    drop(dropped);
    for long in longs {
        let out = collect(long);
        assert!(out.error.is_none());
    }
    let p = pooled(kept);
    assert_eq!(p.prompt_tokens, refs[0].0.len());
    wait_pool_whole(&h, 0);
    wait_idle(&h);
    let m = h.metrics().snapshot();
    assert_eq!(m.pooling_requests, 1, "only the request still wanted ran");
}

#[test]
fn inputs_no_step_can_hold_are_refused_at_submit() {
    let h = spawn_embedder(8, cfg(4, 64));
    let refuse = |n: usize| match h.submit_pooling(pooling(&vec![5; n])) {
        Err(e @ SubmitError::InputTooLong { .. }) => e.to_string(),
        Err(e) => panic!("{n} tokens: {e}"),
        Ok(_) => panic!("{n} tokens were accepted"),
    };
    let budget = refuse(65);
    assert!(
        budget.contains("65 tokens") && budget.contains("option.max_rolling_batch_prefill_tokens"),
        "{budget}"
    );
    // 8 blocks hold 128 tokens: a budget above that meets the KV pool's limit.
    let h2 = spawn_embedder(8, cfg(4, 400));
    let kv = match h2.submit_pooling(pooling(&vec![5; 129])) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(
        kv.contains("129 tokens") && kv.contains("8 usable blocks"),
        "{kv}"
    );
    let ok = pooled(h2.submit_pooling(pooling(&vec![5; 128])).unwrap());
    assert_eq!(ok.prompt_tokens, 128);
    // Beyond the model's length (cfg's max_model_len, 512).
    let h3 = spawn_embedder(64, cfg(4, 1024));
    let len = match h3.submit_pooling(pooling(&vec![5; 513])) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    assert!(len.contains("maximum length of 512"), "{len}");
    // Empty input, unknown ids, a second segment outside the input.
    assert_eq!(
        h.submit_pooling(pooling(&[])).err(),
        Some(SubmitError::EmptyPrompt)
    );
    let vocab = h.limits().vocab_size as u32;
    assert!(matches!(
        h.submit_pooling(pooling(&[1, vocab])),
        Err(SubmitError::InvalidParams(m)) if m.contains(&vocab.to_string())
    ));
    let bad_segment = PoolingRequest {
        tokens: vec![1, 2, 3],
        segment_b: Some(3),
    };
    assert!(matches!(
        h.submit_pooling(bad_segment),
        Err(SubmitError::InvalidParams(_))
    ));
    wait_pool_whole(&h2, 0);
}

#[test]
fn a_generative_model_refuses_pooling_requests() {
    let dir = tiny_model();
    let h = spawn(dir.path(), 16, cfg(4, 64));
    match h.submit_pooling(pooling(&[1, 2, 3])) {
        Err(SubmitError::InvalidParams(m)) => assert!(m.contains("no pooler"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted"),
    }
}

/// An encoder (a BERT cross-encoder: pairs with token types) through the scheduler: each
/// pair's logit is the engine's own, bit for bit, with the inputs batched several per step.
#[test]
fn encoder_pairs_equal_the_engines_step() {
    let dir = embed_fixture("bert_cross");
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let pairs: Vec<(Vec<u32>, Option<usize>)> = r["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let types = ids(&p["type_ids"]);
            (ids(&p["ids"]), types.iter().position(|&t| t == 1))
        })
        .collect();
    let mut engine = lmi_engine::open(lmi_engine::Device::Cpu, &dir, &opts(64)).unwrap();
    let want: Vec<Vec<f32>> = pairs
        .iter()
        .map(|(t, seg)| direct_pair(engine.as_mut(), t, *seg))
        .collect();
    // The reference's logits (transformers), to a float tolerance.
    for ((p, w), (t, _)) in r["pairs"].as_array().unwrap().iter().zip(&want).zip(&pairs) {
        let logit = p["logits"][0].as_f64().unwrap();
        assert!(
            (f64::from(w[0]) - logit).abs() < 1e-4,
            "{w:?} vs {logit} ({} tokens)",
            t.len()
        );
    }
    let h = Handle::spawn(engine, Tokenizer::from_dir(&dir).unwrap(), cfg(4, 128));
    let streams: Vec<_> = (0..3)
        .flat_map(|_| pairs.iter().enumerate())
        .map(|(i, (t, seg))| {
            let req = PoolingRequest {
                tokens: t.clone(),
                segment_b: *seg,
            };
            (i, h.submit_pooling(req).unwrap())
        })
        .collect();
    for (i, s) in streams {
        assert_eq!(bits(&pooled(s).values), bits(&want[i]), "pair {i}");
    }
    wait_pool_whole(&h, 0);
    assert!(h.metrics().snapshot().steps > 3, "shared among steps");
}
