//! DeepSeek-style sigmoid-routed mixtures with full attention (GLM-4.5 `Glm4MoeForCausalLM`,
//! MiniMax-M2 `MiniMaxM2ForCausalLM`) on the CPU against HF transformers: tiny random
//! checkpoints and what transformers computed with them on six prompts
//! (`tests/fixtures/sigmoid_moe/generate.py`).
//! - Prompt logits within f32 tolerance at every position of every prompt (and the median
//!   position in bf16); the correction bias, group limit, routed scaling, shared expert,
//!   partial RoPE, q/k/v biases and q/k norms all move them by far more than that.
//! - 32 greedy tokens of all six decoded together in shared steps, equal to transformers'.
//! - Prefill in chunks that cut every prompt, beside the others: the same bits as whole.
//! - A prefix-cache hit (a shared first block) gives the cold run's logits exactly.

mod hf_fixture;

use std::path::{Path, PathBuf};

use hf_fixture::{
    F32_TOL, argmax, check_chunked_prefill, check_greedy_together, check_prefix_hit,
    hybrid_refs as refs, plain_step, prompt_logits, rel_diff,
};
use lmi_engine::engine::StepEngine;
use lmi_engine::{DType, Engine};

const ARCHITECTURES: [&str; 2] = ["glm4_moe", "minimax_m2"];
/// bf16 against transformers in f32, the median position: a rounded router score flips a
/// token between close experts and moves its logits by far more than bf16 itself.
const BF16_MOE_TOL: f32 = 1e-1;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("sigmoid_moe", name)
}

fn load(dir: &Path, dtype: DType) -> Engine<lmi_engine::cpu::CpuBackend> {
    hf_fixture::load(dir, dtype)
}

#[test]
fn prompt_logits_match_transformers_in_f32_and_bf16() {
    for name in ARCHITECTURES {
        hf_fixture::check_prompt_logits(name, &fixture(name), load, prompt_logits, BF16_MOE_TOL);
    }
}

/// Blocks of 16 tokens per sequence in the tests below.
const BLOCKS_EACH: u32 = 6;

/// Sequence `i`'s block table in the tests below.
fn table(i: usize) -> Vec<u32> {
    let i = i as u32;
    (BLOCKS_EACH * i..BLOCKS_EACH * (i + 1)).collect()
}

/// Greedy decoding of every prompt at once: one prefill step of all six, then one token per
/// sequence per step; every step's logits within f32 tolerance of transformers' and the
/// tokens its greedy ones.
#[test]
fn greedy_tokens_match_transformers_decoding_all_six_together() {
    for name in ARCHITECTURES {
        check_greedy_together(name, &fixture(name), load, table, plain_step);
    }
}

/// Prefill in chunks of 5 tokens (every prompt cut), all six in each step: the same bits as
/// each prompt prefilled alone and whole.
#[test]
fn chunked_prefill_beside_others_gives_the_same_bits() {
    for name in ARCHITECTURES {
        let (dir, table) = (fixture(name), table);
        check_chunked_prefill(name, &dir, load, prompt_logits, table, plain_step);
    }
}

/// A prefix-cache hit: a sequence whose first 16 tokens are another's reads that one's first
/// K/V block and prefills only the rest; its logits are the cold run's, bit for bit.
#[test]
fn a_prefix_cache_hit_equals_the_cold_run() {
    for name in ARCHITECTURES {
        check_prefix_hit(name, &fixture(name), load);
    }
}

/// The fixture exercises each setting: with the group limit lifted, the routed scaling or the
/// renormalizing dropped, or the whole head rotated, the logits move far outside the f32
/// tolerance (so the match above is not one that would hold without them).
#[test]
fn every_routing_setting_moves_the_logits() {
    let dir = fixture("glm4_moe");
    let r = refs(&dir);
    let p = &r.prompts[5];
    let edits: [(&str, serde_json::Value); 4] = [
        ("topk_group", 4.into()),
        ("routed_scaling_factor", 1.0.into()),
        ("norm_topk_prob", false.into()),
        ("partial_rotary_factor", 1.0.into()),
    ];
    for (field, value) in edits {
        let tmp = hf_fixture::with_config(&dir, |c| c[field] = value.clone());
        let mut e = load(tmp.path(), DType::F32);
        let ours = prompt_logits(&mut e, p);
        let worst = ours
            .iter()
            .zip(&r.prompt_logits[5])
            .map(|(a, b)| rel_diff(a, b))
            .fold(0f32, f32::max);
        assert!(
            worst > 100.0 * F32_TOL,
            "{field} = {value}: moved only {worst}"
        );
    }
}

/// The config imported from llama.cpp's GGUF (`glm4moe`, `minimax-m2` metadata) is the
/// fixture's, the token ids aside (the converter's tokenizer has its own).
#[test]
fn gguf_configs_are_the_hf_configs() {
    use lmi_checkpoint::config::ModelConfig;
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("model");
        lmi_checkpoint::gguf::convert::convert_gguf_with(
            &dir.join("model.f32.gguf"),
            &out,
            DType::F32,
            false,
            false,
        )
        .unwrap();
        let mut ours = ModelConfig::from_file(&out.join("config.json")).unwrap();
        let theirs = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        ours.bos_token_id = theirs.bos_token_id;
        ours.eos_token_ids = theirs.eos_token_ids.clone();
        ours.torch_dtype = theirs.torch_dtype.clone();
        assert_eq!(ours, theirs, "{name}");
    }
}

/// Each prompt and its greedy tokens, one forward each: the logits at every position.
fn sequence_logits(
    e: &mut Engine<lmi_engine::cpu::CpuBackend>,
    r: &hf_fixture::HybridRefs,
) -> Vec<Vec<Vec<f32>>> {
    (0..r.prompts.len())
        .map(|i| {
            let seq: Vec<u32> = r.prompts[i].iter().chain(&r.greedies[i]).copied().collect();
            hf_fixture::sequence_logits(e, &seq)
        })
        .collect()
}

/// Each position's [`rel_diff`] of `ours` from `theirs`, sorted ascending.
fn diffs(ours: &[Vec<Vec<f32>>], theirs: &[Vec<Vec<f32>>]) -> Vec<f32> {
    let mut d: Vec<f32> = ours
        .iter()
        .zip(theirs)
        .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| rel_diff(x, y)))
        .collect();
    d.sort_by(f32::total_cmp);
    d
}

/// Q8_0 served as stored against the same Q8_0 weights read into f32 (12-bit activations in
/// the products), the median position; measured 3.1-3.3e-3.
const Q8_KERNEL_TOL: f32 = 1e-2;

/// llama.cpp's files give transformers' logits at every position of every prompt and its
/// greedy tokens in f32, and its greedy tokens; requantized to Q8_0 (`lmi quantize`'s code)
/// and served as stored, the median position close to those Q8_0 weights read into f32.
#[test]
fn llama_cpp_gguf_files_match_transformers() {
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let r = refs(&dir);
        let gguf = dir.join("model.f32.gguf");
        let (_tmp, mut e) = hf_fixture::load_gguf(&gguf, Some(DType::F32));
        let ours = sequence_logits(&mut e, &r);
        let d = diffs(&ours, &r.full_logits);
        let worst = d[d.len() - 1];
        eprintln!("{name} f32 GGUF: within {worst:.2e} of transformers");
        assert!(worst < F32_TOL, "{name} f32 GGUF: logits differ by {worst}");
        for (i, (logits, greedy)) in ours.iter().zip(&r.greedies).enumerate() {
            let first = r.prompts[i].len() - 1;
            let picks: Vec<u32> = logits[first..logits.len() - 1]
                .iter()
                .map(|l| argmax(l))
                .collect();
            assert_eq!(&picks, greedy, "{name} f32 GGUF prompt {i}: greedy tokens");
        }

        let tmp = tempfile::tempdir().unwrap();
        let q8 = tmp.path().join("q8_0.gguf");
        lmi_checkpoint::gguf::writer::requantize(&gguf, &q8, lmi_checkpoint::quant::QType::Q8_0)
            .unwrap();
        let (_d1, mut e) = hf_fixture::load_gguf(&q8, Some(DType::F32));
        let q8_in_f32 = sequence_logits(&mut e, &r);
        let (_d2, mut e) = hf_fixture::load_gguf(&q8, None);
        let format = e.weights_format().to_string();
        assert!(format.contains("q8_0"), "{name}: weights held as {format}");
        let stored = sequence_logits(&mut e, &r);
        let vs_f32 = diffs(&stored, &q8_in_f32);
        let median = vs_f32[vs_f32.len() / 2];
        eprintln!("{name} Q8_0 as stored ({format}): median {median:.2e} from its weights in f32");
        assert!(median < Q8_KERNEL_TOL, "{name} Q8_0: median {median}");
    }
}

/// GLM's multi-token-prediction layer as the published checkpoints hold it, skipped with a
/// log line: in safetensors as `model.layers.{num_hidden_layers}.*` (here layer 2's tensors
/// again as layer 3, and `eh_proj`, `enorm`, `hnorm`, `shared_head.norm`), and in a GGUF as
/// llama.cpp's converter writes it (one more block, `nextn_predict_layers` 1, its
/// `blk.N.nextn.*` tensors). Both load to the logits of the files without it.
#[test]
fn glm_mtp_layers_are_skipped() {
    use lmi_checkpoint::gguf::writer::{TensorOut, write};
    use lmi_checkpoint::gguf::{GgmlType, GgufFile, GgufValue};
    use safetensors::tensor::{Dtype, TensorView};
    let dir = fixture("glm4_moe");
    let r = refs(&dir);
    let p = &r.prompts[0];
    let mut plain = load(&dir, DType::F32);
    let want = prompt_logits(&mut plain, p);

    // Safetensors: config.json says 1 MTP layer, the file holds it.
    let tmp = hf_fixture::with_config(&dir, |c| c["num_nextn_predict_layers"] = 1.into());
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec(), t.data().to_vec()))
        .collect();
    let copies: Vec<_> = owned
        .iter()
        .filter(|(n, ..)| n.starts_with("model.layers.2."))
        .map(|(n, s, d)| {
            (
                n.replacen("layers.2.", "layers.3.", 1),
                s.clone(),
                d.clone(),
            )
        })
        .collect();
    owned.extend(copies);
    owned.push((
        "model.layers.3.eh_proj.weight".into(),
        vec![64, 128],
        vec![0; 4 * 64 * 128],
    ));
    for n in ["enorm", "hnorm", "shared_head.norm"] {
        owned.push((
            format!("model.layers.3.{n}.weight"),
            vec![64],
            vec![0; 4 * 64],
        ));
    }
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &tmp.path().join("model.safetensors")).unwrap();
    let mut mtp = load(tmp.path(), DType::F32);
    assert_eq!(
        prompt_logits(&mut mtp, p),
        want,
        "safetensors with an MTP layer"
    );

    // GGUF.
    let gguf = dir.join("model.f32.gguf");
    let g = GgufFile::open(&gguf).unwrap();
    let arch = "glm4moe";
    let mut meta: Vec<(String, GgufValue)> = g
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in meta.iter_mut() {
        if k == &format!("{arch}.block_count") {
            *v = GgufValue::U32(4);
        }
        if k == &format!("{arch}.nextn_predict_layers") {
            *v = GgufValue::U32(1);
        }
    }
    let mut tensors: Vec<TensorOut> = g
        .tensors
        .iter()
        .map(|t| TensorOut {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: t.ggml_type,
            data: g.tensor_data(t).unwrap().to_vec(),
        })
        .collect();
    let copies: Vec<TensorOut> = tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.2."))
        .map(|t| TensorOut {
            name: t.name.replacen("blk.2.", "blk.3.", 1),
            dims: t.dims.clone(),
            ggml_type: t.ggml_type,
            data: t.data.clone(),
        })
        .collect();
    tensors.extend(copies);
    let f32s = |name: &str, dims: Vec<u64>| TensorOut {
        name: name.into(),
        data: vec![0; 4 * dims.iter().product::<u64>() as usize],
        dims,
        ggml_type: GgmlType::F32,
    };
    tensors.push(f32s("blk.3.nextn.eh_proj.weight", vec![128, 64]));
    for n in ["enorm", "hnorm", "shared_head_norm"] {
        tensors.push(f32s(&format!("blk.3.nextn.{n}.weight"), vec![64]));
    }
    let tmp = tempfile::tempdir().unwrap();
    let with_mtp = tmp.path().join("mtp.gguf");
    write(&with_mtp, &meta, &tensors).unwrap();
    let (_a, mut plain) = hf_fixture::load_gguf(&gguf, Some(DType::F32));
    let (_b, mut mtp) = hf_fixture::load_gguf(&with_mtp, Some(DType::F32));
    assert_eq!(mtp.model_config().num_layers, 3);
    assert_eq!(
        prompt_logits(&mut mtp, p),
        prompt_logits(&mut plain, p),
        "GGUF with an MTP block"
    );
}
