//! Multi-head latent attention (DeepSeek-V3 with and without q's low-rank projection,
//! GLM-4.7-Flash) on the CPU against HF transformers: tiny random checkpoints and what
//! transformers computed with them on six prompts (`tests/fixtures/mla/generate.py`).
//! - Prompt logits within f32 tolerance at every position of every prompt (and in bf16,
//!   looser); 32 greedy tokens equal to transformers', decoded one token a step for all six
//!   prompts together.
//! - Prefilled in chunks that cut every prompt, beside other sequences: the same bits as
//!   alone and whole; a prefix-cache hit (the first block computed by another sequence)
//!   gives the cold run's logits exactly.
//! - The KV cache holds `kv_lora_rank + qk_rope_head_dim` values a token and layer.

mod hf_fixture;

use std::path::{Path, PathBuf};

use hf_fixture::{
    BF16_TOL, F32_TOL, HybridRefs as Refs, argmax, blocks, check_chunked_prefill,
    check_greedy_together, check_prefix_hit, hybrid_refs as refs, plain_step, prompt_logits,
    rel_diff,
};
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{DType, Engine};

const MODELS: [&str; 4] = [
    "deepseek_v3",
    "deepseek_v3_noq",
    "deepseek_v3_moe",
    "glm4_moe_lite",
];
const KV_BLOCKS: usize = 96;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("mla", name)
}

fn load(dir: &Path, dtype: DType) -> Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype: Some(dtype),
        kv_blocks: Some(KV_BLOCKS),
        ..Default::default()
    };
    lmi_engine::load_cpu(dir, &opts).unwrap()
}

#[test]
fn prompt_logits_match_transformers_in_f32_and_bf16() {
    for name in MODELS {
        hf_fixture::check_prompt_logits(name, &fixture(name), load, prompt_logits, BF16_TOL);
    }
}

/// Greedy decoding of every prompt at once: one prefill step of all six, then one decode
/// token per sequence per step; every step's logits within f32 tolerance of transformers'
/// and the tokens equal to its greedy ones.
#[test]
fn greedy_tokens_match_transformers_decoding_all_six_together() {
    for name in MODELS {
        let table = |i: usize| blocks(16 * i as u32, 16 * 16);
        check_greedy_together(name, &fixture(name), load, table, plain_step);
    }
}

/// Prefill in chunks of 5 tokens (every prompt cut), beside other sequences: the same bits
/// as each prompt prefilled alone and whole.
#[test]
fn chunked_prefill_beside_others_gives_the_same_bits() {
    for name in MODELS {
        let (dir, table) = (fixture(name), |i: usize| blocks(16 * i as u32, 64));
        check_chunked_prefill(name, &dir, load, prompt_logits, table, plain_step);
    }
}

/// A prefix-cache hit: another sequence with the same first 16 tokens wrote block 0; the
/// prompt resumes at 16 on it and gets the cold run's logits, bit for bit.
#[test]
fn a_prefix_cache_hit_equals_the_cold_run() {
    for name in MODELS {
        check_prefix_hit(name, &fixture(name), load);
    }
}

/// The cache holds the latent and the rotary key part a token and layer, as config.json
/// gives them: 3 layers × (32 + 16) values, 4 bytes each in f32 and 2 in bf16; not the
/// 2 × 4 heads × (24 + 16) of expanded keys and values.
#[test]
fn the_kv_cache_holds_the_latent_and_the_rotary_key_per_token() {
    for name in MODELS {
        let dir = fixture(name);
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let field = |k: &str| c[k].as_u64().unwrap() as usize;
        let per_token =
            field("num_hidden_layers") * (field("kv_lora_rank") + field("qk_rope_head_dim"));
        assert_eq!(per_token, 3 * 48);
        for (dtype, elem) in [(DType::F32, 4), (DType::BF16, 2)] {
            let e = load(&dir, dtype);
            let tokens = KV_BLOCKS * lmi_engine::BLOCK_SIZE;
            assert_eq!(e.kv_bytes(), tokens * per_token * elem, "{name} {dtype}");
            let block = lmi_engine::kv::KvCacheConfig::block_bytes(e.model_config(), elem);
            assert_eq!(block, lmi_engine::BLOCK_SIZE * per_token * elem);
        }
    }
}

/// The fixtures exercise what they stand for: read as rotate-half (`rope_interleave`
/// false), or without YaRN's softmax scale (`mscale_all_dim` 0), the same weights give
/// logits far outside the tolerance.
#[test]
fn interleaved_rope_and_yarn_scale_are_live_in_the_fixtures() {
    let dir = fixture("deepseek_v3");
    let r = refs(&dir);
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 2] = [
        ("rope_interleave", |c| c["rope_interleave"] = false.into()),
        ("mscale_all_dim", |c| {
            c["rope_scaling"]["mscale_all_dim"] = 0.0.into()
        }),
    ];
    for (what, edit) in edits {
        let tmp = hf_fixture::with_config(&dir, edit);
        let mut e = load(tmp.path(), DType::F32);
        let ours = prompt_logits(&mut e, &r.prompts[0]);
        let worst = ours
            .iter()
            .zip(&r.prompt_logits[0])
            .map(|(a, b)| rel_diff(a, b))
            .fold(0f32, f32::max);
        assert!(
            worst > 100.0 * F32_TOL,
            "{what}: only {worst} from transformers"
        );
    }
}

/// A GGUF imported as `lmi serve` imports one: its config and tokenizer converted into a
/// directory, the weights read from the file (as stored when `dtype` is None).
fn load_gguf(
    gguf: &Path,
    dtype: Option<DType>,
) -> (tempfile::TempDir, Engine<lmi_engine::cpu::CpuBackend>) {
    let opts = EngineOptions {
        dtype,
        kv_blocks: Some(KV_BLOCKS),
        ..Default::default()
    };
    hf_fixture::load_gguf_with(gguf, opts)
}

/// The config imported from llama.cpp's file (`deepseek2`) is the fixture's: latent
/// attention, YaRN and its softmax scale, experts and their routing. What a GGUF does not
/// carry is set aside: the token ids (the converter's tokenizer has its own), the MTP layer
/// count (the converter drops them), GLM's architecture name (read as DeepSeek-V3's).
#[test]
fn gguf_configs_are_the_hf_configs() {
    use lmi_checkpoint::config::{Architecture, ModelConfig};
    for name in MODELS {
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
        let mut theirs = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        assert_eq!(ours.architecture, Architecture::DeepseekV3);
        assert_eq!(ours.mla.as_ref().unwrap().nextn_layers, 0);
        ours.architecture = theirs.architecture;
        ours.bos_token_id = theirs.bos_token_id;
        ours.eos_token_ids = theirs.eos_token_ids.clone();
        ours.torch_dtype = theirs.torch_dtype.clone();
        theirs.mla.as_mut().unwrap().nextn_layers = 0;
        assert_eq!(ours, theirs, "{name}");
    }
}

/// Every prompt followed by its greedy tokens, one forward each: the logits at every
/// position.
fn sequence_logits(e: &mut Engine<lmi_engine::cpu::CpuBackend>, r: &Refs) -> Vec<Vec<Vec<f32>>> {
    (0..r.prompts.len())
        .map(|i| {
            let seq: Vec<u32> = r.prompts[i].iter().chain(&r.greedies[i]).copied().collect();
            hf_fixture::sequence_logits(e, &seq)
        })
        .collect()
}

/// llama.cpp's files (`convert_gguf.py`: kv_b_proj split per head into `attn_k_b`
/// transposed and `attn_v_b`, the experts stacked) give transformers' logits at every
/// position of every prompt and its greedy tokens, in f32; served as stored (bf16 matrices),
/// within bf16's error.
#[test]
fn llama_cpp_gguf_files_match_transformers() {
    for name in MODELS {
        let dir = fixture(name);
        let r = refs(&dir);
        let gguf = dir.join("model.f32.gguf");
        let (_dir, mut e) = load_gguf(&gguf, Some(DType::F32));
        let ours = sequence_logits(&mut e, &r);
        let mut d: Vec<f32> = ours
            .iter()
            .zip(&r.full_logits)
            .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| rel_diff(x, y)))
            .collect();
        d.sort_by(f32::total_cmp);
        let worst = d[d.len() - 1];
        eprintln!(
            "{name} f32 GGUF: within {worst:.2e} of transformers' ({} positions)",
            d.len()
        );
        assert!(worst < F32_TOL, "{name} f32 GGUF: logits differ by {worst}");
        for (i, (logits, greedy)) in ours.iter().zip(&r.greedies).enumerate() {
            let first = r.prompts[i].len() - 1;
            let picks: Vec<u32> = logits[first..logits.len() - 1]
                .iter()
                .map(|l| argmax(l))
                .collect();
            assert_eq!(&picks, greedy, "{name} f32 GGUF prompt {i}: greedy tokens");
        }
        // Requantized to Q8_0 by `lmi quantize`'s code and served as stored: the median
        // position close to the same Q8_0 weights read into f32 (the blocks handled right),
        // and within Q8_0's error of transformers'.
        let tmp = tempfile::tempdir().unwrap();
        let q8 = tmp.path().join("q8_0.gguf");
        lmi_checkpoint::gguf::writer::requantize(&gguf, &q8, lmi_checkpoint::quant::QType::Q8_0)
            .unwrap();
        let file = lmi_checkpoint::gguf::GgufFile::open(&q8).unwrap();
        let kind = |n: &str| file.tensor(n).unwrap().ggml_type.name();
        assert_eq!(kind("blk.0.attn_kv_a_mqa.weight"), "Q8_0", "{name}");
        assert_eq!(kind("blk.0.attn_output.weight"), "Q8_0", "{name}");
        // The absorbed values' heads, held per head in their blocks (the keys' 24 columns
        // are no whole block: they stay f32).
        assert_eq!(kind("blk.0.attn_v_b.weight"), "Q8_0", "{name}");
        let (_dir, mut e) = load_gguf(&q8, Some(DType::F32));
        let q8_in_f32 = sequence_logits(&mut e, &r);
        let (_dir, mut e) = load_gguf(&q8, None);
        let format = e.weights_format().to_string();
        assert!(format.contains("q8_0"), "{name}: weights held as {format}");
        let stored = sequence_logits(&mut e, &r);
        let median = |a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]| {
            let mut d: Vec<f32> = a
                .iter()
                .zip(b)
                .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| rel_diff(p, q)))
                .collect();
            d.sort_by(f32::total_cmp);
            d[d.len() / 2]
        };
        let (vs_f32, vs_hf) = (median(&stored, &q8_in_f32), median(&stored, &r.full_logits));
        eprintln!(
            "{name} Q8_0 as stored ({format}): median {vs_hf:.2e} from transformers', \
             {vs_f32:.2e} from its weights in f32"
        );
        assert!(
            vs_f32 < Q8_KERNEL_TOL,
            "{name} Q8_0: {vs_f32} from its weights in f32"
        );
        assert!(vs_hf < Q8_TOL, "{name} Q8_0: {vs_hf} from transformers'");
    }
}

/// Q8_0 weights served as stored against transformers in f32, the median position (these
/// random models amplify weight rounding; a wrong weight or head order moves every position
/// by the logits' own size, 1).
const Q8_TOL: f32 = 2e-1;
/// Q8_0 as stored against the same weights read into f32 (12-bit activations in the
/// products, bf16 K/V), the median position.
const Q8_KERNEL_TOL: f32 = 3e-2;

/// DeepSeek-V3's published files hold the multi-token-prediction layer after the model's
/// (`model.layers.61.*`, `num_nextn_predict_layers` 1, in a shard of its own): such a
/// checkpoint loads, the layer is not read, and the logits are the model's.
#[test]
fn multi_token_prediction_layers_are_skipped_at_load() {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = fixture("deepseek_v3");
    let r = refs(&dir);
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
    }
    // Layer 3 (num_hidden_layers 3): the MTP block's own tensors and a decoder layer's.
    let shapes: [(&str, Vec<usize>); 6] = [
        ("eh_proj.weight", vec![64, 128]),
        ("enorm.weight", vec![64]),
        ("hnorm.weight", vec![64]),
        ("shared_head.norm.weight", vec![64]),
        ("self_attn.kv_a_proj_with_mqa.weight", vec![48, 64]),
        ("mlp.gate_proj.weight", vec![96, 64]),
    ];
    let bytes: Vec<Vec<u8>> = shapes
        .iter()
        .map(|(_, s)| vec![0u8; 4 * s.iter().product::<usize>()])
        .collect();
    let views: Vec<(String, TensorView<'_>)> = shapes
        .iter()
        .zip(&bytes)
        .map(|((n, s), b)| {
            let view = TensorView::new(Dtype::F32, s.clone(), b).unwrap();
            (format!("model.layers.3.{n}"), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &tmp.path().join("model-mtp.safetensors")).unwrap();
    let main = std::fs::read(dir.join("model.safetensors")).unwrap();
    let names = safetensors::SafeTensors::deserialize(&main)
        .unwrap()
        .names()
        .len();
    let mut map = serde_json::Map::new();
    for n in safetensors::SafeTensors::deserialize(&main)
        .unwrap()
        .names()
    {
        map.insert(n.to_string(), "model.safetensors".into());
    }
    for (n, _) in &shapes {
        map.insert(
            format!("model.layers.3.{n}"),
            "model-mtp.safetensors".into(),
        );
    }
    assert_eq!(map.len(), names + shapes.len());
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        tmp.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let mut with_mtp = load(tmp.path(), DType::F32);
    let mut plain = load(&dir, DType::F32);
    let p = &r.prompts[0];
    assert_eq!(
        prompt_logits(&mut with_mtp, p),
        prompt_logits(&mut plain, p)
    );
}

/// LoRA adapters on a latent-attention model are refused when loaded, in one line.
#[test]
fn lora_adapters_are_refused_on_latent_attention() {
    let mut e = load(&fixture("deepseek_v3"), DType::F32);
    let w = lmi_checkpoint::peft::LoraWeights {
        rank: 1,
        layers: (0..3).map(|_| Default::default()).collect(),
        bytes: 0,
    };
    let err = e.load_adapter(7, &w).unwrap_err().to_string();
    assert!(err.contains("latent-attention"), "{err}");
}
