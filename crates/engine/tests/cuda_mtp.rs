//! Multi-token-prediction drafts on the CUDA engine (bf16), on the CPU emulator in both
//! thread orders and on the driver's device: the head's logits at every row of prompt 0 +
//! its greedy tokens of the DeepSeek-V3 and GLM-4.5 MTP fixtures against the reference
//! composed from transformers' modules (`mtp.rs` holds the CPU's f32 checks) and against the
//! CPU engine in bf16, and three chained drafts from the prompt's end.

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use hf_fixture::{BF16_TOL, blocks, chunk, rel_diff};
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::sampling::SamplingParams;
use lmi_engine::{
    Backend, DType, Engine, LogitsWanted, MtpChunk, SampleRequest, SeqChunk, StepBatch,
};

const FIXTURES: [(&str, &str); 2] = [("mla", "deepseek_v3_mtp"), ("sigmoid_moe", "glm4_moe_mtp")];

/// The median row's bound where bf16 routing flips experts (cuda_sigmoid_moe.rs's).
const ROUTED_MEDIAN_TOL: f32 = 1e-1;

fn options() -> EngineOptions {
    EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(64),
        mtp_draft: true,
        ..Default::default()
    }
}

fn batch<'a>(
    c: &'a [SeqChunk],
    samples: &'a [SampleRequest<'a>],
    m: &'a [MtpChunk],
) -> StepBatch<'a> {
    StepBatch {
        chunks: c,
        samples,
        prompt_logprobs: &[],
        media: &[],
        rope_deltas: &[],
        states: &[],
        pools: &[],
        mtp: m,
    }
}

/// The head's logits at rows 0 .. len(s) - 1 of `s`, read in one step.
fn head_logits<B: Backend>(e: &mut Engine<B>, s: &[u32]) -> Vec<f32> {
    let n = s.len();
    let c = [chunk(&s[..n - 1], 0, &blocks(0, n), LogitsWanted::None)];
    let m = [MtpChunk {
        next: Some(s[n - 1]),
        ..Default::default()
    }];
    e.step_with(&batch(&c, &[], &m), true).unwrap().1
}

fn check<D: Device>(dev: &Arc<D>) {
    for (group, name) in FIXTURES {
        let dir = hf_fixture::fixture(group, name);
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let ids = |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(r[k].clone()).unwrap() };
        let (prompt, greedy) = (&ids("prompts")[0], &ids("greedies")[0]);
        let s: Vec<u32> = prompt.iter().chain(greedy).copied().collect();
        let st = std::fs::read(dir.join("reference.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&st).unwrap();
        let want: Vec<f32> = st
            .tensor("mtp_logits_0")
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();

        let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        let mut g = Engine::load(backend, &dir, &options()).unwrap();
        assert!(g.mtp(), "{name}: the head is loaded on CUDA");
        let mut c = lmi_engine::load_cpu(&dir, &options()).unwrap();
        let (ours, cpu) = (head_logits(&mut g, &s), head_logits(&mut c, &s));
        let vocab = 320;
        let median = |other: &[f32]| {
            let mut d: Vec<f32> = ours
                .chunks(vocab)
                .zip(other.chunks(vocab))
                .map(|(a, b)| rel_diff(a, b))
                .collect();
            d.sort_by(f32::total_cmp);
            d[d.len() / 2]
        };
        let (to_ref, to_cpu) = (median(&want), median(&cpu));
        eprintln!(
            "{name}: CUDA head within {to_ref:.2e} of the reference, {to_cpu:.2e} of the CPU"
        );
        // GLM's routing in bf16 flips close experts (its target alone is 3.5e-2 from
        // transformers on CUDA at the median, cuda_sigmoid_moe.rs, which allows 1e-1); the
        // head reads those states and routes again: 6.2e-2 here, the CPU in bf16 2.1e-2.
        let tol = match name {
            "glm4_moe_mtp" => ROUTED_MEDIAN_TOL,
            _ => BF16_TOL,
        };
        assert!(to_ref < tol && to_cpu < tol, "{name}: {to_ref} / {to_cpu}");

        // Three chained drafts from the prompt's end.
        let params = SamplingParams::default();
        let c = [chunk(
            prompt,
            0,
            &blocks(8, prompt.len() + 40),
            LogitsWanted::Last,
        )];
        let samples = SampleRequest::at_each_last_token(&c, &params);
        let m = [MtpChunk {
            propose: 3,
            ..Default::default()
        }];
        let out = g.step(&batch(&c, &samples, &m)).unwrap();
        assert_eq!(out.drafts.len(), 1);
        assert_eq!(out.drafts[0].len(), 3, "{name}: three drafts");
    }
}

#[test]
fn the_mtp_head_on_cuda_matches_the_reference() {
    on_every_raw_device!(check);
}
