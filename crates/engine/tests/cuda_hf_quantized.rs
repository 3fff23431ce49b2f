//! Quantized HF checkpoints (tests/fixtures/quantized/) on the CUDA backend: dequantized at load
//! on the host, as on the CPU, then uploaded in bf16; the prompt's logits against what the
//! quantizers' own dequantization computes, on the CPU emulator and on the driver's
//! device (or the fake driver) when there is one.

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use hf_fixture::{BF16_TOL, reference, rel_diff, sequence_logits};
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::{DType, Engine};

fn check<D: Device>(dev: &Arc<D>) {
    for name in hf_fixture::QUANTIZED {
        let dir = hf_fixture::fixture("quantized", name);
        let r = reference(&dir);
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(16),
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), false).unwrap();
        let mut e = Engine::load(backend, &dir, &opts).unwrap();
        let ours = sequence_logits(&mut e, &r.prompt);
        let mut diffs: Vec<f32> = ours
            .iter()
            .zip(&r.prompt_logits)
            .map(|(o, t)| rel_diff(o, t))
            .collect();
        diffs.sort_by(f32::total_cmp);
        let median = diffs[diffs.len() / 2];
        eprintln!(
            "{name}: CUDA bf16 prompt logits, median difference {median:.2e} from the reference's f32"
        );
        assert!(median < BF16_TOL, "{name}: median difference {median}");
    }
}

#[test]
fn quantized_checkpoints_load_on_the_cuda_backend() {
    check(&cuda_common::emulator(lmi_cuda_emu::ThreadOrder::Forward));
    if let Some(dev) = cuda_common::driver() {
        let _turn = cuda_common::driver_turn();
        check(&dev);
    }
}
