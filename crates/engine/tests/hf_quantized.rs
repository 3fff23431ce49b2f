//! Quantized HF checkpoints (tests/fixtures/quantized/generate.py): FP8 with per-block scales
//! (transformers' FineGrainedFP8 layout), and compressed-tensors' int8 and FP8 per channel and
//! int4 packed in groups of 32 (written by compressed-tensors itself), AutoAWQ's 4-bit GEMM
//! layout (packed by autoawq) and GPTQ's v1 format with act-order (packed by gptqmodel).
//! Dequantized at load, they must compute what the quantizers' own dequantization computes
//! (transformers' `dequantize=True`; autoawq's `dequantize_gemm`; gptqmodel's `dequantize_weight`):
//! prompt logits within f32 tolerance (and bf16's), and 32 greedy tokens.

mod hf_fixture;

use std::path::PathBuf;

use hf_fixture::{BF16_TOL, F32_TOL, check_greedy, prompt_diffs};
use lmi_engine::DType;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("quantized", name)
}

#[test]
fn dequantized_at_load_as_the_quantizers_dequantize() {
    for name in hf_fixture::QUANTIZED {
        for (dtype, tol) in [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL)] {
            let diffs = prompt_diffs(&fixture(name), dtype);
            let (median, worst) = (diffs[diffs.len() / 2], diffs[diffs.len() - 1]);
            eprintln!(
                "{name} {dtype}: prompt logits within {worst:.2e} of the reference's (median {median:.2e})"
            );
            if dtype == DType::F32 {
                assert!(worst < tol, "{name} f32: prompt logits differ by {worst}");
            } else {
                assert!(median < tol, "{name} bf16: median difference {median}");
            }
        }
        check_greedy(name, &fixture(name), F32_TOL);
    }
}

#[test]
fn a_quantized_weight_without_its_scale_is_not_taken_as_it_is() {
    // The scale of one projection gone: its FP8 values would be read as weights. The loader
    // must refuse rather than serve them unscaled.
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("fp8_block");
    for f in ["config.json", "reference.json", "reference.safetensors"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let drop = "model.layers.0.self_attn.q_proj.weight_scale_inv";
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != drop)
        .collect();
    safetensors::serialize_to_file(kept, None, &tmp.path().join("model.safetensors")).unwrap();
    let opts = lmi_engine::engine::EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(16),
        ..Default::default()
    };
    let e = lmi_engine::load_cpu(tmp.path(), &opts)
        .err()
        .expect("refused");
    let msg = format!("{e:#}");
    assert!(msg.contains("q_proj") && msg.contains("F8_E4M3"), "{msg}");
}
