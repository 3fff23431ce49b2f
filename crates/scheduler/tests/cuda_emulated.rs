//! The scheduler driving the CUDA engine (on the CPU emulator): chunked prefill, decode
//! steps replayed from CUDA graphs, parallel sequences that fork and copy blocks on write,
//! prompt logprobs, the prefix cache and preemption all give each request the tokens it gets
//! alone, and the pool is whole afterwards. (The emulator is deterministic, and these contexts
//! are short enough that attention never splits its keys; a batch-dependent difference large
//! enough to change a token would show here.)

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{Output, collect, prompt, request, wait_pool_whole};
use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use lmi_cuda_emu::EmuDevice;
use lmi_engine::DType;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::{Engine, EngineOptions};
use lmi_scheduler::{GenerateRequest, Handle, SchedulerConfig};
use lmi_text::Tokenizer;

fn model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec {
        hidden_size: 128,
        intermediate_size: 160,
        num_heads: 4,
        num_kv_heads: 2,
        ..TinySpec::llama()
    };
    write_tiny_model(dir.path(), &spec).unwrap();
    dir
}

fn spawn(dir: &Path, blocks: usize, max_batch: usize, budget: usize) -> Handle {
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(blocks),
        ..Default::default()
    };
    let backend = CudaBackend::with_graphs(Arc::new(EmuDevice::new()), true).unwrap();
    let engine = Engine::load(backend, dir, &opts).unwrap();
    let cfg = SchedulerConfig {
        max_batch_size: max_batch,
        max_batch_tokens: budget,
        max_model_len: 256,
        max_waiting: 100,
        max_loras: 4,
        ..Default::default()
    };
    Handle::spawn(Box::new(engine), Tokenizer::from_dir(dir).unwrap(), cfg)
}

fn requests() -> Vec<GenerateRequest> {
    (0..6)
        .map(|i| {
            let seed = (i % 2 == 1).then_some(500 + i as u64);
            let mut r = request(prompt(6 + 9 * i, i as u32), 8 + i, seed);
            if i == 2 {
                r.n = 2;
                r.best_of = 2;
                r.sampling.temperature = 0.7;
                r.sampling.seed = 7;
            }
            if i == 4 {
                r.prompt_logprobs = Some(2);
            }
            r
        })
        .collect()
}

#[test]
fn concurrent_forked_cached_and_preempted_requests_match_each_alone() {
    let dir = model();
    let solo: Vec<Output> = requests()
        .into_iter()
        .map(|r| {
            let h = spawn(dir.path(), 64, 1, 4096);
            let out = collect(h.submit(r).unwrap());
            wait_pool_whole(&h, 0);
            h.shutdown();
            out
        })
        .collect();
    for (i, s) in solo.iter().enumerate() {
        assert!(s.error.is_none(), "request {i}: {:?}", s.error);
    }
    assert_eq!(solo[2].seqs.len(), 2, "n = 2 forks a second sequence");
    let lp = solo[4].prefill.as_ref().expect("prompt logprobs");
    assert_eq!(lp.len(), 6 + 36);
    assert!(
        lp[1..]
            .iter()
            .all(|t| t.logprob.is_some_and(|l| l <= 0.0) && t.top.len() == 2)
    );

    // Together, with a small token budget (chunked prefill); then a pool so small that
    // sequences are preempted and recomputed; then the same prompts again (prefix cache).
    for (blocks, budget) in [(64, 24), (12, 4096), (64, 4096)] {
        let h = spawn(dir.path(), blocks, 8, budget);
        for round in 0..2 {
            let streams: Vec<_> = requests()
                .into_iter()
                .map(|r| h.submit(r).unwrap())
                .collect();
            let together: Vec<Output> = streams.into_iter().map(collect).collect();
            for (i, (a, b)) in solo.iter().zip(&together).enumerate() {
                assert!(b.error.is_none(), "request {i}: {:?}", b.error);
                assert_eq!(
                    a.tokens(),
                    b.tokens(),
                    "request {i}, pool {blocks}, budget {budget}, round {round}"
                );
                if i == 4 {
                    let (x, y) = (a.prefill.as_ref().unwrap(), b.prefill.as_ref().unwrap());
                    let ids = |p: &Vec<lmi_scheduler::PromptToken>| {
                        p.iter().map(|t| t.id).collect::<Vec<_>>()
                    };
                    assert_eq!(ids(x), ids(y));
                }
            }
            wait_pool_whole(&h, 0);
        }
        h.shutdown();
    }
}
