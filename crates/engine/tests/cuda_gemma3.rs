//! Gemma 3 on the CUDA engine (bf16) against HF transformers' f32 logits for the fixtures of
//! `tests/fixtures/gemma3/` (`gemma3.rs` holds the CPU's checks), on the CPU emulator (and on
//! the driver's device when there is one): the prompt's logits, then 32 decode steps, each fed
//! transformers' greedy token, run far past the local layers' window of 8 keys and replay from
//! CUDA graphs. Each step's logits must be within bf16's tolerance and its argmax must be
//! transformers' next token (the fixtures' greedy margins are above 0.5).

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use hf_fixture::{BF16_TOL, blocks, chunk, reference, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::{DType, Engine, LogitsWanted};

fn check_gemma3<D: Device>(dev: &Arc<D>) {
    for name in ["gemma3", "gemma3_linear"] {
        let dir = hf_fixture::fixture("gemma3", name);
        let r = reference(&dir);
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(64),
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        let mut e = Engine::load(backend, &dir, &opts).unwrap();
        let table = blocks(3, r.prompt.len() + r.greedy.len());
        let out = e
            .forward_logits(&[chunk(&r.prompt, 0, &table, LogitsWanted::All)])
            .unwrap();
        let mut worst = (0..r.prompt.len())
            .map(|t| rel_diff(out.row(t), &r.prompt_logits[t]))
            .fold(0f32, f32::max);
        let mut next = lmi_engine::testing::argmax(out.row(r.prompt.len() - 1));
        for (step, &want) in r.greedy.iter().enumerate() {
            assert_eq!(next, want, "{name}: greedy token {step}");
            let pos = r.prompt.len() + step;
            let out = e
                .forward_logits(&[chunk(&[want], pos, &table, LogitsWanted::Last)])
                .unwrap();
            worst = worst.max(rel_diff(out.row(0), &r.full_logits[pos]));
            next = lmi_engine::testing::argmax(out.row(0));
        }
        eprintln!("{name}: CUDA bf16 logits within {worst:.2e} of transformers'");
        assert!(worst < BF16_TOL, "{name}: logits differ by {worst}");
        assert!(
            e.backend().graphs_captured() > 0,
            "{name}: decode steps replay from CUDA graphs"
        );
    }
}

#[test]
fn gemma3_in_bf16_matches_transformers() {
    on_every_raw_device!(check_gemma3);
}
