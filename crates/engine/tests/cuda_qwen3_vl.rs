//! Qwen3-VL on the CUDA engine, in bf16, on every device of `cuda_common` (the emulator in
//! both thread orders, then the real host code on a GPU or the fake driver). The tower runs
//! on the host (the CUDA tower has no Qwen3-VL kernels); the language model on the device:
//! interleaved M-RoPE in the rotary kernels, the tower's rows scattered into the embeddings
//! and its DeepStack features added after the first layers (`scatter_add_rows_f32`):
//! - against the CPU engine in bf16 on the same embeddings: every prompt's logits at every
//!   position, then 8 decode steps along transformers' greedy tokens;
//! - against transformers (f32): prompt logits at the reference's positions.

mod cuda_common;
mod qwen3_vl_common;
mod qwen_vl_common;

use std::sync::Arc;

use lmi_cuda::Device;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::Logits;
use lmi_engine::{DType, Engine, LogitsWanted};
use qwen_vl_common::{chunk, max_rel_diff, options};
use qwen3_vl_common::*;

const MODEL: &str = "qwen3_vl";

/// Logits within 2% of the row's largest magnitude (bf16 weights and activations, different
/// summation orders), as `cuda_qwen_vl.rs`.
fn assert_rows_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let tol = 2e-2 * want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{what}: logit {i} is {g}, the CPU's {w} (tolerance {tol})"
        );
    }
}

fn last(l: &Logits) -> &[f32] {
    l.row(l.num_rows() - 1)
}

/// bf16 through the language model against transformers in f32 (the host tower in f32):
/// relative to the row's largest logit. Measured: 0.037 at worst.
const HF_LOGITS_TOL: f32 = 0.1;

fn check<D: Device>(dev: &Arc<D>) {
    let b = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let mut gpu = Engine::load(b, &fixtures().join(MODEL), &options(DType::BF16)).unwrap();
    assert!(
        gpu.model().vision_device.is_none(),
        "Qwen3-VL's tower runs on the host"
    );
    let mut cpu: Engine<CpuBackend> =
        lmi_engine::load_cpu(&fixtures().join(MODEL), &options(DType::BF16)).unwrap();
    let (_, refs) = refs(MODEL);
    let mut worst = 0f32;
    for case in cases(MODEL) {
        let what = format!("prompt {}", case.id);
        let n = case.ids.len();
        let media = case.chunk_media(0, 0, n);
        let prompt = [chunk(case.ids.clone(), 0, LogitsWanted::All)];
        let got = gpu.forward_logits_media(&prompt, &media, &[]).unwrap();
        let want = cpu.forward_logits_media(&prompt, &media, &[]).unwrap();
        for p in 0..n {
            assert_rows_close(&format!("{what} position {p}"), got.row(p), want.row(p));
        }
        let positions: Vec<usize> =
            serde_json::from_value(case.reference["logits_positions"].clone()).unwrap();
        let hf = refs.f32(&format!("prompt.{}.logits", case.id));
        let vocab = hf.len() / positions.len();
        for (k, &p) in positions.iter().enumerate() {
            let d = max_rel_diff(got.row(p), &hf[k * vocab..(k + 1) * vocab]);
            assert!(
                d < HF_LOGITS_TOL,
                "{what}: logits at {p} differ from HF's by {d}"
            );
            worst = worst.max(d);
        }
        let delta = case.delta();
        for (k, &token) in case.greedy().iter().enumerate().take(8) {
            let step = [chunk(vec![token], n + k, LogitsWanted::Last)];
            let got = gpu.forward_logits_media(&step, &[], &[delta]).unwrap();
            let want = cpu.forward_logits_media(&step, &[], &[delta]).unwrap();
            assert_rows_close(&format!("{what} token {k}"), last(&got), last(&want));
        }
    }
    eprintln!("CUDA bf16 prompt logits against transformers (f32): {worst:.3} at worst");
}

#[test]
fn qwen3_vl_on_the_cuda_engine_matches_the_cpu_and_transformers() {
    on_every_raw_device!(check);
}
