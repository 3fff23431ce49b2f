//! FP8 block-wise checkpoints of the DeepSeek-style models (DeepSeek-V3, GLM-4.7-Flash,
//! GLM-4.5, MiniMax-M2) as their published FP8 repositories lay them out
//! (`tests/fixtures/fp8_moe/generate.py`): F8_E4M3 projections with per-block
//! `weight_scale_inv` (or compressed-tensors' per-channel `weight_scale`, as GLM-4.5-FP8;
//! MLA's kv_b_proj among them, split per head after dequantization; the
//! routed experts one tensor per expert), norms, router, correction bias, embeddings and
//! lm_head unquantized. Dequantized at load, they must compute what transformers computes
//! with `FineGrainedFP8Config(dequantize=True)` (`CompressedTensorsConfig`): prompt logits of six prompts within f32
//! tolerance (bf16 looser), and 32 greedy tokens of all six decoded together.

mod hf_fixture;

use std::path::{Path, PathBuf};

use hf_fixture::{
    BF16_TOL, F32_TOL, argmax, blocks, chunk, hybrid_refs as refs, rel_diff, with_config,
};
use lmi_engine::engine::EngineOptions;
use lmi_engine::{DType, Engine, LogitsWanted};

/// `glm4_moe_ct`: GLM-4.5 as zai-org publishes its FP8 (compressed-tensors FP8_DYNAMIC,
/// per-channel f16 `weight_scale`); the others FP8 with per-block `weight_scale_inv`.
const MODELS: [&str; 5] = [
    "deepseek_v3_moe",
    "glm4_moe_lite",
    "glm4_moe",
    "minimax_m2",
    "glm4_moe_ct",
];

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("fp8_moe", name)
}

fn opts(dtype: DType) -> EngineOptions {
    EngineOptions {
        dtype: Some(dtype),
        kv_blocks: Some(96),
        ..Default::default()
    }
}

fn load(dir: &Path, dtype: DType) -> Engine<lmi_engine::cpu::CpuBackend> {
    lmi_engine::load_cpu(dir, &opts(dtype)).unwrap()
}

#[test]
fn prompt_logits_match_transformers_dequantized_fp8() {
    for name in MODELS {
        let dir = fixture(name);
        let r = refs(&dir);
        // The FP8 model is not the unquantized one it was made from: what passes here has
        // read the FP8 values and their scales, not something close to the source.
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let (group, model) = json["source"].as_str().unwrap().split_once('/').unwrap();
        let source = refs(&hf_fixture::fixture(group, model));
        assert_eq!(source.prompts, r.prompts);
        let moved = rel_diff(&source.prompt_logits[0][0], &r.prompt_logits[0][0]);
        eprintln!("{name}: FP8 moved transformers' first logits row by {moved:.2e} (relative)");
        assert!(
            moved > 100.0 * F32_TOL,
            "{name}: FP8 moved the logits by only {moved}"
        );
        for (dtype, tol) in [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL)] {
            let mut e = load(&dir, dtype);
            let mut diffs: Vec<f32> = Vec::new();
            for (p, theirs) in r.prompts.iter().zip(&r.prompt_logits) {
                let out = e
                    .forward_logits(&[chunk(p, 0, &blocks(0, p.len()), LogitsWanted::All)])
                    .unwrap();
                diffs.extend((0..p.len()).map(|t| rel_diff(out.row(t), &theirs[t])));
            }
            diffs.sort_by(f32::total_cmp);
            let (median, worst) = (diffs[diffs.len() / 2], diffs[diffs.len() - 1]);
            eprintln!("{name} {dtype}: within {worst:.2e} of transformers (median {median:.2e})");
            match dtype {
                DType::F32 => assert!(worst < tol, "{name} f32: prompt logits differ by {worst}"),
                _ => assert!(median < tol, "{name} bf16: median difference {median}"),
            }
        }
    }
}

/// One prefill step of all six prompts, then one token per sequence per step: every step's
/// logits within f32 tolerance of transformers' and the 32 tokens equal to its greedy ones.
#[test]
fn greedy_tokens_match_transformers_decoding_all_six_together() {
    for name in MODELS {
        let dir = fixture(name);
        let r = refs(&dir);
        let mut e = load(&dir, DType::F32);
        let tables: Vec<Vec<u32>> = (0..r.prompts.len())
            .map(|i| blocks(16 * i as u32, 16 * 16))
            .collect();
        let chunks: Vec<_> = r
            .prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| chunk(p, 0, t, LogitsWanted::Last))
            .collect();
        let out = e.forward_logits(&chunks).unwrap();
        let mut next: Vec<u32> = (0..chunks.len()).map(|i| argmax(out.row(i))).collect();
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); chunks.len()];
        let mut worst = 0f32;
        for step in 0..32 {
            let chunks: Vec<_> = (0..next.len())
                .map(|i| {
                    tokens[i].push(next[i]);
                    chunk(
                        &[next[i]],
                        r.prompts[i].len() + step,
                        &tables[i],
                        LogitsWanted::Last,
                    )
                })
                .collect();
            let out = e.forward_logits(&chunks).unwrap();
            for (i, n) in next.iter_mut().enumerate() {
                let pos = r.prompts[i].len() + step;
                let d = rel_diff(out.row(i), &r.full_logits[i][pos]);
                assert!(
                    d < F32_TOL,
                    "{name} prompt {i} step {step}: logits differ by {d}"
                );
                worst = worst.max(d);
                *n = argmax(out.row(i));
            }
        }
        eprintln!("{name}: 6 x 32 greedy tokens equal, decode logits within {worst:.2e}");
        assert_eq!(tokens, r.greedies, "{name}: greedy tokens differ");
    }
}

/// A scale gone (MLA's kv_b_proj, which is split per head; one routed expert's down
/// projection): its FP8 values would be read as weights. The load must refuse, naming it.
#[test]
fn a_missing_scale_is_refused_naming_the_weight() {
    for (name, drop) in [
        (
            "deepseek_v3_moe",
            "model.layers.1.self_attn.kv_b_proj.weight_scale_inv",
        ),
        (
            "glm4_moe",
            "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv",
        ),
        (
            "minimax_m2",
            "model.layers.0.block_sparse_moe.experts.5.w2.weight_scale_inv",
        ),
    ] {
        let src = fixture(name);
        let tmp = with_config(&src, |_| {});
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let kept: Vec<_> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != drop)
            .collect();
        assert!(kept.len() < st.len(), "{drop} is in the fixture");
        safetensors::serialize_to_file(kept, None, &tmp.path().join("model.safetensors")).unwrap();
        let stem = drop.split(".weight_scale").next().unwrap();
        let stem = stem.rsplit('.').next().unwrap();
        let msg = match lmi_engine::load_cpu(tmp.path(), &opts(DType::F32)) {
            Ok(_) => panic!("{name}: loaded without {drop}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            msg.contains(stem) && msg.contains("F8_E4M3"),
            "{name}: {msg}"
        );
    }
}

/// The published FP8 repositories of DeepSeek-V3 and GLM-4.5 hold the multi-token-prediction layer after the model's
/// (`model.layers.{num_hidden_layers}.*`, its projections FP8 with their scales too, in a
/// shard of its own): such a checkpoint loads, the layer is not read, and the logits are the
/// model's.
#[test]
fn fp8_multi_token_prediction_layers_are_skipped_at_load() {
    use safetensors::tensor::{Dtype, TensorView};
    for name in ["deepseek_v3_moe", "glm4_moe"] {
        let dir = fixture(name);
        let r = refs(&dir);
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let layer = config["num_hidden_layers"].as_u64().unwrap();
        let block: Vec<usize> = config["quantization_config"]["weight_block_size"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        // (name, dtype, shape): the MTP block's own tensors and a decoder layer's.
        let mut shapes: Vec<(String, Dtype, Vec<usize>)> = vec![
            ("enorm.weight".into(), Dtype::F32, vec![64]),
            ("hnorm.weight".into(), Dtype::F32, vec![64]),
            ("shared_head.norm.weight".into(), Dtype::F32, vec![64]),
        ];
        for (w, rows, cols) in [("eh_proj", 64, 128), ("self_attn.o_proj", 64, 64)] {
            shapes.push((format!("{w}.weight"), Dtype::F8_E4M3, vec![rows, cols]));
            let grid = vec![rows.div_ceil(block[0]), cols.div_ceil(block[1])];
            shapes.push((format!("{w}.weight_scale_inv"), Dtype::F32, grid));
        }
        let bytes: Vec<Vec<u8>> = shapes
            .iter()
            .map(|(_, d, s)| vec![0u8; d.bitsize() / 8 * s.iter().product::<usize>()])
            .collect();
        let views: Vec<(String, TensorView<'_>)> = shapes
            .iter()
            .zip(&bytes)
            .map(|((n, d, s), b)| {
                let view = TensorView::new(*d, s.clone(), b).unwrap();
                (format!("model.layers.{layer}.{n}"), view)
            })
            .collect();
        // As published (GLM-4.5's fixture says 0: transformers writes no MTP layer).
        let tmp = with_config(&dir, |c| c["num_nextn_predict_layers"] = 1.into());
        safetensors::serialize_to_file(views, None, &tmp.path().join("model-mtp.safetensors"))
            .unwrap();
        let main = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&main).unwrap();
        let mut map = serde_json::Map::new();
        for n in st.names() {
            map.insert(n.to_string(), "model.safetensors".into());
        }
        for (n, _, _) in &shapes {
            map.insert(
                format!("model.layers.{layer}.{n}"),
                "model-mtp.safetensors".into(),
            );
        }
        assert_eq!(map.len(), st.len() + shapes.len());
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(
            tmp.path().join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let mut with_mtp = load(tmp.path(), DType::F32);
        let mut plain = load(&dir, DType::F32);
        let p = &r.prompts[0];
        let logits = |e: &mut Engine<lmi_engine::cpu::CpuBackend>| {
            let out = e
                .forward_logits(&[chunk(p, 0, &blocks(0, p.len()), LogitsWanted::All)])
                .unwrap();
            (0..p.len())
                .map(|t| out.row(t).to_vec())
                .collect::<Vec<_>>()
        };
        assert_eq!(logits(&mut with_mtp), logits(&mut plain), "{name}");
    }
}
