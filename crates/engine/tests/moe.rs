//! Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss) on the CPU against HF transformers: tiny
//! random checkpoints and the logits and greedy tokens transformers computed for them
//! (`tests/fixtures/moe/generate.py`).
//! - Prompt logits within f32 tolerance, every position, in f32 and (looser) in bf16.
//! - 32 greedy tokens equal to transformers', decoding one token a step.
//! - The GGUF files llama.cpp's converter writes for them (stacked experts, its metadata):
//!   imported as `lmi serve` imports a GGUF, the same logits in f32; requantized to Q8_0 by
//!   `lmi quantize`'s code and served as stored, within Q8_0's error.
//! - Batch invariance: a sequence's logits are bit-identical alone and in a step shared with
//!   other sequences, whose tokens wake other experts and change how many rows each expert's
//!   products take.

mod hf_fixture;

use std::path::PathBuf;

use hf_fixture::{
    BF16_TOL, F32_TOL, argmax, blocks, check_greedy, chunk, load, load_gguf, prompt_diffs,
    reference, rel_diff, sequence_logits,
};
use lmi_engine::{DType, LogitsWanted};

/// `qwen3_moe_mixed` has a dense layer among its sparse ones (`mlp_only_layers`); `qwen2_moe`
/// a shared expert beside the routed ones, q/k/v biases and weights not renormalized; `gpt_oss`
/// brings top-k-then-softmax routing, expert biases and clamped SwiGLU, attention sinks and
/// biases, a sliding window on alternate layers and YaRN RoPE; `gpt_oss_mxfp4` its experts in
/// MXFP4, as published.
const ARCHITECTURES: [&str; 6] = [
    "qwen3_moe",
    "qwen3_moe_mixed",
    "qwen2_moe",
    "mixtral",
    "gpt_oss",
    "gpt_oss_mxfp4",
];
/// Written by llama.cpp's converter (`convert_gguf.py`).
const GGUF_ARCHITECTURES: [&str; 3] = ["qwen3_moe", "qwen2_moe", "mixtral"];
/// Q8_0 weights (with 8-bit activations in their products and bf16 K/V, as quantized models
/// run) against transformers in f32; measured 3.4e-2. A wrong expert's rows give errors of
/// the logits' own size.
const Q8_TOL: f32 = 5e-2;
/// bf16: the median position within `BF16_TOL`, every one within `BF16_FLIP_TOL`.
const BF16_FLIP_TOL: f32 = 1e-1;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("moe", name)
}

#[test]
fn prompt_logits_match_transformers_in_f32_and_bf16() {
    for name in ARCHITECTURES {
        for (dtype, tol) in [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL)] {
            let diffs = prompt_diffs(&fixture(name), dtype);
            let (median, worst) = (diffs[diffs.len() / 2], diffs[diffs.len() - 1]);
            eprintln!(
                "{name} {dtype}: prompt logits within {worst:.2e} of transformers' (median {median:.2e})"
            );
            if dtype == DType::F32 {
                assert!(worst < tol, "{name} f32: prompt logits differ by {worst}");
            } else {
                // bf16 rounding upstream can flip a token's pick between two experts whose
                // router logits are close (gpt_oss's closest pair is 0.013 apart): that token
                // moves by more (seen: 2 of 14 positions at 3.6e-2 and 7.0e-2). A wrong expert,
                // bias or activation would move every position.
                assert!(median < tol, "{name} bf16: median difference {median}");
                assert!(
                    worst < BF16_FLIP_TOL,
                    "{name} bf16: prompt logits differ by {worst}"
                );
            }
        }
    }
}

#[test]
fn greedy_tokens_match_transformers() {
    for name in ARCHITECTURES {
        check_greedy(name, &fixture(name), F32_TOL);
    }
}

#[test]
fn a_sequence_is_bit_identical_alone_and_in_a_busy_batch() {
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let r = reference(&dir);
        let seq: Vec<u32> = r.prompt.iter().chain(&r.greedy).copied().collect();
        let others: Vec<Vec<u32>> = (0..3u32)
            .map(|s| (0..29u32).map(|i| (i * 37 + s * 101 + 5) % 320).collect())
            .collect();
        for dtype in [DType::F32, DType::BF16] {
            let mut e = load(&dir, dtype);
            let alone = e
                .forward_logits(&[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
                .unwrap();
            let mut e = load(&dir, dtype);
            let busy = e
                .forward_logits(&[
                    chunk(&others[0], 0, &blocks(10, 29), LogitsWanted::All),
                    chunk(&seq, 0, &blocks(20, seq.len()), LogitsWanted::All),
                    chunk(&others[1], 0, &blocks(30, 29), LogitsWanted::Last),
                ])
                .unwrap();
            for t in 0..seq.len() {
                assert_eq!(
                    busy.row(29 + t),
                    alone.row(t),
                    "{name} {dtype}: token {t} changed with the batch around it"
                );
            }
            // Decode steps: the sequence's last token alone, then beside another's.
            let table = blocks(40, seq.len() + 1);
            let mut e = load(&dir, dtype);
            e.forward_logits(&[chunk(&seq, 0, &table, LogitsWanted::None)])
                .unwrap();
            let step_alone = e
                .forward_logits(&[chunk(&[7], seq.len(), &table, LogitsWanted::Last)])
                .unwrap();
            let mut e = load(&dir, dtype);
            e.forward_logits(&[chunk(&seq, 0, &table, LogitsWanted::None)])
                .unwrap();
            let step_busy = e
                .forward_logits(&[
                    chunk(&others[2], 0, &blocks(10, 29), LogitsWanted::Last),
                    chunk(&[7], seq.len(), &table, LogitsWanted::Last),
                ])
                .unwrap();
            assert_eq!(
                step_busy.row(1),
                step_alone.row(0),
                "{name} {dtype}: a decode step changed with the batch around it"
            );
        }
    }
}

#[test]
fn lora_on_experts_is_refused_and_on_attention_accepted() {
    use lmi_checkpoint::peft::{LoraLimits, inspect};
    use lmi_checkpoint::testing::{PeftSpec, write_peft_adapter};
    let c = lmi_engine::ModelConfig::from_file(&fixture("qwen3_moe_mixed").join("config.json"))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let attention = tmp.path().join("attention");
    write_peft_adapter(&attention, &c, &PeftSpec::new(4, 1)).unwrap();
    inspect(&attention, &c, LoraLimits::default()).unwrap();
    // Layer 1 is dense (`mlp_only_layers`), layers 0 and 2 hold experts.
    let mlp = tmp.path().join("mlp");
    let spec = PeftSpec {
        targets: vec!["self_attn.q_proj", "mlp.gate_proj"],
        ..PeftSpec::new(4, 2)
    };
    write_peft_adapter(&mlp, &c, &spec).unwrap();
    let e = inspect(&mlp, &c, LoraLimits::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layers.0.mlp.gate_proj") && e.contains("mixture-of-experts"),
        "{e}"
    );
}

#[test]
fn llama_cpp_gguf_files_match_transformers() {
    for name in GGUF_ARCHITECTURES {
        let dir = fixture(name);
        let r = reference(&dir);
        let gguf = dir.join("model.f32.gguf");
        let tmp = tempfile::tempdir().unwrap();
        let q8 = tmp.path().join("q8_0.gguf");
        lmi_checkpoint::gguf::writer::requantize(&gguf, &q8, lmi_checkpoint::quant::QType::Q8_0)
            .unwrap();
        // The stacked experts are quantized; the router is kept as it is.
        let file = lmi_checkpoint::gguf::GgufFile::open(&q8).unwrap();
        let kind = |n: &str| file.tensor(n).unwrap().ggml_type.name();
        assert_eq!(kind("blk.0.ffn_gate_exps.weight"), "Q8_0");
        assert_eq!(kind("blk.0.ffn_gate_inp.weight"), "F32");
        if let Some(gate) = file.tensor("blk.0.ffn_gate_inp_shexp.weight") {
            assert_eq!(
                gate.ggml_type.name(),
                "F32",
                "{name}: the shared expert's gate"
            );
            assert_eq!(kind("blk.0.ffn_up_shexp.weight"), "Q8_0");
        }
        for (file, dtype, tol) in [(&gguf, Some(DType::F32), F32_TOL), (&q8, None, Q8_TOL)] {
            let (_dir, mut e) = load_gguf(file, dtype);
            let seq: Vec<u32> = r.prompt.iter().chain(&r.greedy).copied().collect();
            let out = e
                .forward_logits(&[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
                .unwrap();
            let mut diffs: Vec<f32> = (0..seq.len())
                .map(|t| rel_diff(out.row(t), &r.full_logits[t]))
                .collect();
            diffs.sort_by(f32::total_cmp);
            // Quantized router weights and inputs can flip a token's choice between two
            // experts whose probabilities are close, and that token's logits then move by much
            // more than the weights' error, and later tokens' through attention (seen: Mixtral's
            // positions at 0.02-0.06 with four at 0.14-0.33). So half of the positions must be
            // within the weights' error: a wrong expert's rows would move every position. f32
            // must match everywhere.
            let share = if dtype.is_none() { 0.5 } else { 1.0 };
            let at = ((diffs.len() as f32 * share).ceil() as usize).clamp(1, diffs.len()) - 1;
            eprintln!(
                "{name} {}: {:.0}% of positions within {:.2e} of transformers' (worst {:.2e})",
                file.display(),
                share * 100.0,
                diffs[at],
                diffs[diffs.len() - 1]
            );
            assert!(
                diffs[at] < tol,
                "{name} {}: logits differ by {} at {:.0}% of positions",
                file.display(),
                diffs[at],
                share * 100.0
            );
            if dtype.is_none() {
                // Experts as stored: a row's logits must be the same bits beside another
                // sequence, which wakes other experts and changes their row counts.
                let other: Vec<u32> = (0..29u32).map(|i| (i * 37 + 5) % 320).collect();
                let busy = e
                    .forward_logits(&[
                        chunk(&other, 0, &blocks(10, 29), LogitsWanted::All),
                        chunk(&seq, 0, &blocks(20, seq.len()), LogitsWanted::All),
                    ])
                    .unwrap();
                for t in 0..seq.len() {
                    assert_eq!(busy.row(29 + t), out.row(t), "{name} Q8_0: token {t}");
                }
            }
            if dtype == Some(DType::F32) {
                // Greedy: the argmax after every prefix equals transformers' next token.
                for (i, &want) in r.greedy.iter().enumerate() {
                    let t = r.prompt.len() - 1 + i;
                    assert_eq!(argmax(out.row(t)), want, "{name}: greedy token {i}");
                }
            }
        }
    }
}

/// gpt-oss as llama.cpp's converter writes it (`convert_gguf.py`): from the dense checkpoint
/// (f32 experts) and from the MXFP4 one (its experts in ggml's MXFP4 blocks). In f32 every
/// position matches transformers (MXFP4 decodes exactly). Served as stored, the dense file's
/// matrices are bf16 and its logits are those of the HF checkpoint loaded in bf16, exactly;
/// the MXFP4 file's experts stay MXFP4 (8-bit activations in their products), held to bf16's
/// median bound (a flip between two close experts moves a position by more, as in the bf16
/// test).
#[test]
fn llama_cpp_gpt_oss_gguf_files_match_transformers() {
    for name in ["gpt_oss", "gpt_oss_mxfp4"] {
        let dir = fixture(name);
        let r = reference(&dir);
        let gguf = dir.join("model.f32.gguf");
        let file = lmi_checkpoint::gguf::GgufFile::open(&gguf).unwrap();
        let experts = file.tensor("blk.0.ffn_gate_exps.weight").unwrap();
        let want = if name == "gpt_oss" { "F32" } else { "MXFP4" };
        assert_eq!(experts.ggml_type.name(), want);
        let seq = r.sequence();
        let (_tmp, mut e) = load_gguf(&gguf, Some(DType::F32));
        let got = sequence_logits(&mut e, &seq);
        let worst = (0..seq.len())
            .map(|t| rel_diff(&got[t], &r.full_logits[t]))
            .fold(0f32, f32::max);
        eprintln!("{name} f32: within {worst:.2e} of transformers'");
        assert!(worst < F32_TOL, "{name} f32: logits differ by {worst}");
        for (i, &want) in r.greedy.iter().enumerate() {
            let t = r.prompt.len() - 1 + i;
            assert_eq!(argmax(&got[t]), want, "{name}: greedy token {i}");
        }
        let (_tmp, mut e) = load_gguf(&gguf, None);
        let stored = sequence_logits(&mut e, &seq);
        if name == "gpt_oss" {
            let hf = sequence_logits(&mut load(&dir, DType::BF16), &seq);
            assert_eq!(
                stored, hf,
                "{name}: as stored differs from the HF checkpoint in bf16"
            );
        } else {
            let mut diffs: Vec<f32> = (0..seq.len())
                .map(|t| rel_diff(&stored[t], &r.full_logits[t]))
                .collect();
            diffs.sort_by(f32::total_cmp);
            let median = diffs[diffs.len() / 2];
            eprintln!(
                "{name} as stored: median {median:.2e} (worst {:.2e})",
                diffs[diffs.len() - 1]
            );
            assert!(median < BF16_TOL, "{name} as stored: median {median}");
        }
    }
}
