//! SmolLM3, OLMo 2 and OLMo 3 on the CUDA engine (bf16) against HF transformers' f32 logits for
//! the fixtures of `tests/fixtures/small_archs/` (`small_archs.rs` holds the CPU's checks), on
//! the CPU emulator in both thread orders and on the fake driver or a GPU: the longest prompt's
//! logits, then 32 decode steps fed transformers' greedy tokens (past OLMo 3's window of 8,
//! through SmolLM3's NoPE layer and OLMo's whole-projection q/k norms, `span_rms_norm`),
//! replayed from CUDA graphs. The fixtures' greedy margins (2e-3) are below bf16's rounding,
//! so the logits are compared, not the argmax.

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use hf_fixture::{BF16_TOL, blocks, chunk, hybrid_refs, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::{DType, Engine, LogitsWanted};

/// bf16 weights, activations and K/V against transformers in f32: the worst position (the
/// CPU's bf16 path measures 4.7e-2 on SmolLM3); a wrong norm, RoPE or window moves every
/// position by the logits' own size (1).
const BF16_WORST: f32 = 1e-1;

fn check_small_archs<D: Device>(dev: &Arc<D>) {
    for name in ["smollm3", "olmo2", "olmo3"] {
        let dir = hf_fixture::fixture("small_archs", name);
        let r = hybrid_refs(&dir);
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(64),
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        let mut e = Engine::load(backend, &dir, &opts).unwrap();
        let (p, greedy, full) = (&r.prompts[5], &r.greedies[5], &r.full_logits[5]);
        let table = blocks(3, p.len() + greedy.len());
        let out = e
            .forward_logits(&[chunk(p, 0, &table, LogitsWanted::All)])
            .unwrap();
        let mut diffs: Vec<f32> = (0..p.len())
            .map(|t| rel_diff(out.row(t), &full[t]))
            .collect();
        for (step, &tok) in greedy.iter().enumerate() {
            let pos = p.len() + step;
            let out = e
                .forward_logits(&[chunk(&[tok], pos, &table, LogitsWanted::Last)])
                .unwrap();
            if pos < full.len() {
                diffs.push(rel_diff(out.row(0), &full[pos]));
            }
        }
        diffs.sort_by(f32::total_cmp);
        let (median, worst) = (diffs[diffs.len() / 2], diffs[diffs.len() - 1]);
        eprintln!("{name}: CUDA bf16 within {worst:.2e} of transformers (median {median:.2e})");
        assert!(median < BF16_TOL, "{name}: median difference {median}");
        assert!(worst < BF16_WORST, "{name}: logits differ by {worst}");
        assert!(
            e.backend().graphs_captured() > 0,
            "{name}: decode steps replay from CUDA graphs"
        );
    }
}

#[test]
fn small_archs_in_bf16_match_transformers() {
    on_every_raw_device!(check_small_archs);
}
