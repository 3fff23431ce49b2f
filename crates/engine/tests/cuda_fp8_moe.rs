//! The FP8 block-wise checkpoints of the DeepSeek-style models (`tests/fixtures/fp8_moe/`;
//! `hf_fp8_moe.rs` holds the CPU's checks) on the CUDA engine: dequantized on the host at
//! load as on the CPU, uploaded in bf16. Every position of the six prompts, each prefilled
//! alone, against transformers' f32 logits (its `dequantize=True` FP8 model) and the CPU
//! engine in bf16, on the emulator in both thread orders and on the driver's device (a GPU,
//! or the fake driver).

mod cuda_common;
mod hf_fixture;

use std::path::Path;
use std::sync::Arc;

use hf_fixture::{BF16_TOL, blocks, chunk, hybrid_refs, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::{Backend, DType, Engine, LogitsWanted};

/// `glm4_moe_ct`: GLM-4.5 as zai-org publishes its FP8 (compressed-tensors FP8_DYNAMIC,
/// per-channel f16 `weight_scale`); the others FP8 with per-block `weight_scale_inv`.
const MODELS: [&str; 5] = [
    "deepseek_v3_moe",
    "glm4_moe_lite",
    "glm4_moe",
    "minimax_m2",
    "glm4_moe_ct",
];

fn options() -> EngineOptions {
    EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(96),
        ..Default::default()
    }
}

fn prompt_logits<B: Backend>(e: &mut Engine<B>, p: &[u32]) -> Vec<Vec<f32>> {
    let out = e
        .forward_logits(&[chunk(p, 0, &blocks(0, p.len()), LogitsWanted::All)])
        .unwrap();
    (0..p.len()).map(|t| out.row(t).to_vec()).collect()
}

fn median(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let mut d: Vec<f32> = a.iter().zip(b).map(|(a, b)| rel_diff(a, b)).collect();
    d.sort_by(f32::total_cmp);
    d[d.len() / 2]
}

fn check<D: Device>(dev: &Arc<D>) {
    for name in MODELS {
        let dir = hf_fixture::fixture("fp8_moe", name);
        let r = hybrid_refs(&dir);
        let backend = CudaBackend::with_graphs(dev.clone(), false).unwrap();
        let mut g = Engine::load(backend, Path::new(&dir), &options()).unwrap();
        let mut c = lmi_engine::load_cpu(&dir, &options()).unwrap();
        let (mut ours, mut cpu) = (Vec::new(), Vec::new());
        for p in &r.prompts {
            ours.extend(prompt_logits(&mut g, p));
            cpu.extend(prompt_logits(&mut c, p));
        }
        let theirs = r.prompt_logits.concat();
        let (vs_hf, cpu_vs_hf, vs_cpu) = (
            median(&ours, &theirs),
            median(&cpu, &theirs),
            median(&ours, &cpu),
        );
        eprintln!(
            "{name} FP8 on {}: medians CUDA vs transformers {vs_hf:.2e}, CPU bf16 vs \
             transformers {cpu_vs_hf:.2e}, CUDA vs CPU bf16 {vs_cpu:.2e}",
            dev.info().name
        );
        // A routing flip between close experts moves a token by far more than rounding: the
        // medians are judged, as cuda_mla.rs judges the unquantized mixtures.
        assert!(
            vs_cpu < BF16_TOL,
            "{name}: CUDA vs the CPU in bf16: {vs_cpu}"
        );
        assert!(
            vs_hf < BF16_TOL && vs_hf <= 1.25 * cpu_vs_hf + 1e-3,
            "{name}: CUDA vs transformers {vs_hf}, the CPU in bf16 {cpu_vs_hf}"
        );
    }
}

#[test]
fn fp8_mixtures_match_transformers_and_the_cpu_on_the_cuda_engine() {
    on_every_raw_device!(check);
}
