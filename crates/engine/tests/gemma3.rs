//! Gemma 3 (text) on the CPU against HF transformers: tiny random checkpoints and the logits
//! and greedy tokens transformers computed for them (`tests/fixtures/gemma3/generate.py`).
//! - Prompt logits within f32 tolerance, every position, in f32 and (looser) in bf16.
//! - 32 greedy tokens equal to transformers', one token a step: the sequence runs far past the
//!   local layers' window of 8 keys, so the window, the two RoPE bases (and the global one's
//!   linear scaling) decide them.
//! - The GGUF file llama.cpp's converter writes (its names, norms stored as 1 + w, its metadata):
//!   imported as `lmi serve` imports a GGUF, the same logits in f32; requantized to Q8_0 by
//!   `lmi quantize`'s code and served as stored, within Q8_0's error.
//! - Batch invariance: a sequence's logits are bit-identical alone and beside others.

mod hf_fixture;

use std::path::PathBuf;

use hf_fixture::{
    BF16_TOL, F32_TOL, argmax, blocks, check_greedy, chunk, load, load_gguf, load_windowed,
    prompt_diffs, reference, rel_diff, rows_equal, run_on_window_pools, sequence_logits,
    with_config,
};
use lmi_engine::engine::StepEngine;
use lmi_engine::{DType, KvWindow, LogitsWanted, NO_BLOCK};

/// `gemma3_linear` scales the global layers' RoPE linearly (gemma-3-4b and larger).
const VARIANTS: [&str; 2] = ["gemma3", "gemma3_linear"];
/// Q8_0 weights with 8-bit activations in their products and bf16 K/V: every position within
/// `Q8_TOL` (measured 4.6e-2 at worst), the median within `Q8_MEDIAN_TOL`. Without the 1 of
/// the stored norms, or with llama's norm names, the logits are of another model.
const Q8_TOL: f32 = 1e-1;
const Q8_MEDIAN_TOL: f32 = 3e-2;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("gemma3", name)
}

#[test]
fn the_config_reads_gemma3s_layers_and_bases() {
    let c = lmi_engine::ModelConfig::from_file(&fixture("gemma3").join("config.json")).unwrap();
    let w = c.sliding_window.as_ref().unwrap();
    assert_eq!(w.size, 8);
    assert_eq!(w.local, [true, true, true, true, true, false, true]);
    assert_eq!((w.rope_theta, c.rope_theta), (Some(10_000.0), 1_000_000.0));
    assert_eq!(c.activation, lmi_checkpoint::config::Activation::GeluTanh);
    assert_eq!(c.attn_scalar, 16.0);
    let c =
        lmi_engine::ModelConfig::from_file(&fixture("gemma3_linear").join("config.json")).unwrap();
    assert_eq!(c.rope_linear_factor, Some(8.0));
    // Local layers keep their base unscaled; global ones are divided by the factor.
    assert_eq!(
        c.rope_inv_freq_local().unwrap()[1],
        1.0 / 10_000f64.powf(2.0 / 16.0)
    );
    assert_eq!(
        c.rope_inv_freq()[1],
        1.0 / 1_000_000f64.powf(2.0 / 16.0) / 8.0
    );
}

#[test]
fn prompt_logits_match_transformers_in_f32_and_bf16() {
    for name in VARIANTS {
        for (dtype, tol) in [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL)] {
            let worst = prompt_diffs(&fixture(name), dtype).pop().unwrap_or(0.0);
            eprintln!("{name} {dtype}: prompt logits within {worst:.2e} of transformers'");
            assert!(
                worst < tol,
                "{name} {dtype}: prompt logits differ by {worst}"
            );
        }
    }
}

#[test]
fn greedy_tokens_match_transformers_past_the_window() {
    for name in VARIANTS {
        check_greedy(name, &fixture(name), F32_TOL);
    }
}

#[test]
fn a_sequence_is_bit_identical_alone_chunked_and_in_a_busy_batch() {
    let dir = fixture("gemma3");
    let r = reference(&dir);
    let seq: Vec<u32> = r.prompt.iter().chain(&r.greedy).copied().collect();
    let other: Vec<u32> = (0..29u32).map(|i| (i * 37 + 5) % 320).collect();
    for dtype in [DType::F32, DType::BF16] {
        let mut e = load(&dir, dtype);
        let alone = e
            .forward_logits(&[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
            .unwrap();
        let mut e = load(&dir, dtype);
        let busy = e
            .forward_logits(&[
                chunk(&other, 0, &blocks(10, 29), LogitsWanted::All),
                chunk(&seq, 0, &blocks(20, seq.len()), LogitsWanted::All),
            ])
            .unwrap();
        for t in 0..seq.len() {
            assert_eq!(
                busy.row(29 + t),
                alone.row(t),
                "{dtype}: token {t} changed with the batch around it"
            );
        }
        // Prefilled in chunks that start inside and outside the window.
        let mut e = load(&dir, dtype);
        let table = blocks(40, seq.len());
        let mut start = 0;
        for len in [5, 11, 17, seq.len() - 33] {
            let out = e
                .forward_logits(&[chunk(
                    &seq[start..start + len],
                    start,
                    &table,
                    LogitsWanted::All,
                )])
                .unwrap();
            rows_equal(
                &out,
                &alone,
                start,
                &format!("{dtype}, prefilled in chunks"),
            );
            start += len;
        }
    }
}

/// The local layers' K/V in pools of their own (`KvWindow`), with each block given back as
/// the window leaves it and handed straight to the sequence's next block, as the scheduler's
/// KV manager does: every position's logits are the bits of the engine with one table.
#[test]
fn local_layers_in_window_pools_give_the_same_bits() {
    let dir = fixture("gemma3");
    let r = reference(&dir);
    let seq: Vec<u32> = r.prompt.iter().chain(&r.greedy).copied().collect();
    let alone = load(&dir, DType::F32)
        .forward_logits(&[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
        .unwrap();
    let mut e = load_windowed(&dir);
    let w = e
        .kv_window()
        .expect("window pools for Gemma 3's local layers");
    assert_eq!(w, KvWindow { blocks: 8, size: 8 });
    run_on_window_pools(&mut e, w, &seq, &alone, &[5, 11]);
    // A window table without a block where the window reaches is refused, naming it.
    let mut c = chunk(&seq[20..21], 20, &blocks(8, seq.len()), LogitsWanted::Last);
    c.window_table = vec![NO_BLOCK, 1];
    let err = e.forward_logits(&[c]).unwrap_err().to_string();
    assert!(err.contains("window table holds no block"), "{err}");
}

#[test]
fn llama_cpp_gguf_files_match_transformers() {
    for name in VARIANTS {
        let dir = fixture(name);
        let r = reference(&dir);
        let gguf = dir.join("model.f32.gguf");
        let tmp = tempfile::tempdir().unwrap();
        let q8 = tmp.path().join("q8_0.gguf");
        lmi_checkpoint::gguf::writer::requantize(&gguf, &q8, lmi_checkpoint::quant::QType::Q8_0)
            .unwrap();
        let seq: Vec<u32> = r.prompt.iter().chain(&r.greedy).copied().collect();
        for (file, dtype, tol) in [(&gguf, Some(DType::F32), F32_TOL), (&q8, None, Q8_TOL)] {
            let (_dir, mut e) = load_gguf(file, dtype);
            let out = e
                .forward_logits(&[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
                .unwrap();
            let mut diffs: Vec<f32> = (0..seq.len())
                .map(|t| rel_diff(out.row(t), &r.full_logits[t]))
                .collect();
            diffs.sort_by(f32::total_cmp);
            let (median, worst) = (diffs[diffs.len() / 2], diffs[diffs.len() - 1]);
            eprintln!(
                "{name} {}: logits within {worst:.2e} of transformers' (median {median:.2e})",
                file.display()
            );
            assert!(
                worst < tol,
                "{name} {}: logits differ by {worst}",
                file.display()
            );
            if dtype.is_none() {
                assert!(median < Q8_MEDIAN_TOL, "{name}: median difference {median}");
            }
            if dtype == Some(DType::F32) {
                for (i, &want) in r.greedy.iter().enumerate() {
                    let t = r.prompt.len() - 1 + i;
                    assert_eq!(argmax(out.row(t)), want, "{name}: greedy token {i}");
                }
            }
        }
    }
}

/// `lmi convert` writes a gemma3 GGUF as the HF checkpoint it came from: norms back to w.
#[test]
fn a_gguf_converted_to_safetensors_gives_the_same_logits() {
    let dir = fixture("gemma3");
    let r = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("model");
    lmi_checkpoint::gguf::convert::convert_gguf_with(
        &dir.join("model.f32.gguf"),
        &out_dir,
        DType::F32,
        true,
        false,
    )
    .unwrap();
    let mut e = load(&out_dir, DType::F32);
    let out = e
        .forward_logits(&[chunk(
            &r.prompt,
            0,
            &blocks(0, r.prompt.len()),
            LogitsWanted::All,
        )])
        .unwrap();
    for t in 0..r.prompt.len() {
        let d = rel_diff(out.row(t), &r.prompt_logits[t]);
        assert!(d < F32_TOL, "position {t}: {d}");
    }
}

/// The fixtures decide the window: with it widened past the sequence (every layer global but
/// for its RoPE base), the logits past position 8 leave transformers'.
#[test]
fn without_the_window_the_logits_differ() {
    let dir = fixture("gemma3");
    let r = reference(&dir);
    let tmp = with_config(&dir, |c| c["sliding_window"] = 512.into());
    let got = sequence_logits(&mut load(tmp.path(), DType::F32), &r.sequence());
    assert!(rel_diff(&got[7], &r.full_logits[7]) < F32_TOL);
    let last = got.len() - 1;
    let d = rel_diff(&got[last], &r.full_logits[last]);
    assert!(d > 1e-2, "the window changed nothing ({d})");
}

/// The multimodal checkpoints (gemma-3-4b-it and up) as the Hub has them: class
/// `Gemma3ForConditionalGeneration`, the text model's fields under `text_config` with those equal
/// to transformers' defaults left out, weights under `language_model.model.`. Their text model
/// is served.
#[test]
fn a_multimodal_checkpoints_text_model_is_served() {
    let dir = fixture("gemma3");
    let r = reference(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let mut text_config = serde_json::Map::new();
    for (k, v) in text.as_object().unwrap() {
        // tie_word_embeddings and rms_norm_eps are the defaults' values: left out.
        if !["architectures", "tie_word_embeddings", "rms_norm_eps"].contains(&k.as_str()) {
            text_config.insert(k.clone(), v.clone());
        }
    }
    let config = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text_config,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
        "mm_tokens_per_image": 256,
        "image_token_index": 262144,
    });
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name.replacen("model.", "language_model.model.", 1), view))
        .collect();
    safetensors::serialize_to_file(renamed, None, &tmp.path().join("model.safetensors")).unwrap();
    let mut e = load(tmp.path(), DType::F32);
    let out = e
        .forward_logits(&[chunk(
            &r.prompt,
            0,
            &blocks(0, r.prompt.len()),
            LogitsWanted::All,
        )])
        .unwrap();
    for t in 0..r.prompt.len() {
        let d = rel_diff(out.row(t), &r.prompt_logits[t]);
        assert!(d < F32_TOL, "position {t}: {d}");
    }
}
