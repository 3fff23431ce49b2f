//! SmolLM3, OLMo 2 and OLMo 3 on the CUDA engine (bf16) against HF transformers' f32 logits for
//! the fixtures of `tests/fixtures/small_archs/` (`small_archs.rs` holds the CPU's checks), on
//! the CPU emulator in both thread orders and on the fake driver or a GPU: the longest prompt's
//! logits, then 32 decode steps fed transformers' greedy tokens (past OLMo 3's window of 8,
//! through SmolLM3's NoPE layer and OLMo's whole-projection q/k norms, `span_rms_norm`),
//! replayed from CUDA graphs. The fixtures' greedy margins (2e-3) are below bf16's rounding,
//! so the logits are compared, not the argmax. And OLMo 3's local layers in window pools: the
//! bits of the engine with one table.

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use hf_fixture::{BF16_TOL, WindowRing, blocks, chunk, hybrid_refs, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::{EngineOptions, StepEngine, StepShape};
use lmi_engine::{DType, Engine, KvWindow, LogitsWanted, SeqChunk};

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

/// OLMo 3's local layers with their K/V in window pools of their own, blocks handed back as
/// the window leaves them and straight to the sequence's next block, decode replayed from
/// graphs: every position's logits the bits of the engine with one table.
fn check_olmo3_window_pools<D: Device>(dev: &Arc<D>) {
    let dir = hf_fixture::fixture("small_archs", "olmo3");
    let r = hybrid_refs(&dir);
    let seq: Vec<u32> = r.prompts[5].iter().chain(&r.greedies[5]).copied().collect();
    let load = |window_pools: bool| {
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(64),
            max_step: StepShape {
                seqs: 1,
                tokens: 16,
                context: None,
            },
            window_pools,
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        Engine::load(backend, &dir, &opts).unwrap()
    };
    let (mut plain, mut windowed) = (load(false), load(true));
    let w = windowed.kv_window().expect("window pools for OLMo 3");
    assert_eq!(w, KvWindow { blocks: 8, size: 8 });
    // Global ids beyond the window pool's: a local layer on the wrong table reads outside it.
    let table = blocks(40, seq.len());
    let mut ring = WindowRing::new(w);
    let mut start = 0;
    while start < seq.len() {
        let len = if start == 0 { 16 } else { 1 };
        let c = chunk(&seq[start..start + len], start, &table, LogitsWanted::All);
        let want = plain.forward_logits(std::slice::from_ref(&c)).unwrap();
        let got = windowed
            .forward_logits(&[SeqChunk {
                window_table: ring.table_for(start, len),
                ..c
            }])
            .unwrap();
        assert_eq!(
            got.data, want.data,
            "position {start}: window pools changed logits"
        );
        start += len;
    }
    assert!(ring.reused, "no block left the window");
}

#[test]
fn olmo3_window_pools_give_the_same_bits() {
    on_every_raw_device!(check_olmo3_window_pools);
}
