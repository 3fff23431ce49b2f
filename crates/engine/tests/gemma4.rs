//! Gemma 4 (text) on the CPU against HF transformers: tiny random checkpoints in the shapes
//! of gemma-4-E2B (per-layer embeddings, K/V shared by the last layers, double-wide MLPs) and
//! gemma-4-26B-A4B (K = V on the global layers, experts beside the MLP), both with local and
//! global layers of different head widths and soft-capped logits, and what transformers
//! computed with them on six prompts (`tests/fixtures/gemma4/generate.py`).
//! - Prompt logits within f32 tolerance at every position of every prompt (and bf16, looser);
//!   32 greedy tokens of all six decoded together equal to transformers'.
//! - Chunked prefill cutting every prompt beside the others, a prefix-cache hit, and the local
//!   layers in window pools: the same bits as each prompt alone and whole.
//! - The config: both spellings of the global layers' geometry, the K/V pools' widths.

mod hf_fixture;

use std::path::{Path, PathBuf};

use hf_fixture::{
    BF16_TOL, F32_TOL, argmax, blocks, check_chunked_prefill, check_greedy_together, chunk,
    hybrid_refs as refs, plain_step, prompt_logits, rel_diff, run_on_window_pools, with_config,
};
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{DType, Engine, KvWindow, LogitsWanted, ModelConfig};

const VARIANTS: [&str; 2] = ["e2b", "a4b"];
/// bf16 against transformers in f32, the median position of the mixture of experts (as
/// hybrid.rs's): a bf16-rounded router input flips a token between close experts, which moves
/// its logits far more than rounding does (measured 5.0e-2); a wrong weight moves every
/// position by the logits' own size.
const BF16_MEDIAN_TOL: f32 = 1e-1;
/// Q8_0 weights served as stored against transformers in f32, the median position: these
/// random models amplify weight rounding (the MoE's sharp routers flip experts; as
/// hybrid.rs's, measured 4.4e-2 e2b, 1.3e-1 a4b with its experts in
/// Q8_0 as well); a wrong weight or name moves every position
/// by the logits' own size.
const Q8_MEDIAN_TOL: f32 = 2e-1;
/// Q8_0 as stored against the same Q8_0 weights read into f32 (8-bit activations in the
/// products, bf16 K/V), the median position (measured 6.0e-3 e2b, 1.8e-2 a4b, whose sharp
/// routers turn a few activations' rounding into expert flips).
const Q8_KERNEL_TOL: f32 = 5e-2;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("gemma4", name)
}

fn load(dir: &Path, dtype: DType) -> Engine<lmi_engine::cpu::CpuBackend> {
    hf_fixture::load(dir, dtype)
}

fn config(name: &str) -> ModelConfig {
    ModelConfig::from_file(&fixture(name).join("config.json")).unwrap()
}

#[test]
fn the_configs_read_gemma4s_layers() {
    let c = config("e2b");
    let g = c.gemma4.as_ref().unwrap();
    let w = c.sliding_window.as_ref().unwrap();
    assert_eq!(w.size, 8);
    assert_eq!(w.local, [true, true, true, false, true, true, false]);
    assert_eq!((c.head_dim, c.num_kv_heads), (16, 1));
    assert_eq!(
        (g.global_head_dim, g.global_kv_heads, g.k_eq_v),
        (32, 1, false)
    );
    // The last three layers read layers 2 (local) and 3 (global).
    assert_eq!(g.kv_source, [0, 1, 2, 3, 2, 2, 3]);
    assert_eq!((g.ple_dim, g.ple_vocab, g.double_wide_mlp), (8, 320, true));
    assert_eq!(g.final_logit_softcapping, Some(30.0));
    assert_eq!((w.rope_theta, c.rope_theta), (Some(10_000.0), 1_000_000.0));
    assert_eq!(c.attention_scale(), 1.0);
    // Proportional RoPE: 4 of the 16 pairs turn, at frequencies over the whole 32.
    let f = g.global_inv_freq(c.rope_theta);
    assert_eq!(f.len(), 16);
    assert_eq!(f[1], 1.0 / 1_000_000f64.powf(2.0 / 32.0));
    assert!(f[3] > 0.0 && f[4..].iter().all(|&x| x == 0.0));
    // Four layers keep K/V: three local of 1 × 16, one global of 1 × 32.
    assert_eq!(c.num_attention_layers(), 4);
    assert_eq!(c.kv_pool_geometry(), [(1, 16), (1, 16), (1, 16), (1, 32)]);
    assert_eq!(c.kv_elems_per_token(), 2 * (3 * 16 + 32));

    let c = config("a4b");
    let g = c.gemma4.as_ref().unwrap();
    assert_eq!(
        (g.global_head_dim, g.global_kv_heads, g.k_eq_v),
        (32, 1, true)
    );
    assert_eq!(g.ple_dim, 0);
    assert_eq!(g.kv_source, (0..6).collect::<Vec<_>>());
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.num_experts, m.top_k, m.expert_intermediate_size),
        (8, 2, 32)
    );
    assert_eq!(
        c.kv_pool_geometry(),
        [(2, 16), (2, 16), (2, 16), (2, 16), (2, 16), (1, 32)]
    );
}

/// The published 26B-A4B and 31B configs set `use_bidirectional_attention: "vision"` (an
/// image's tokens see each other; text stays causal): the model loads and its text logits are
/// the fixture's. "all" (an encoder's attention) is refused, naming the field.
#[test]
fn vision_bidirectional_attention_loads_all_is_refused() {
    let dir = fixture("a4b");
    let tmp = with_config(&dir, |c| {
        c["text_config"]["use_bidirectional_attention"] = "vision".into();
    });
    let mut e = load(tmp.path(), DType::F32);
    let mut plain = load(&dir, DType::F32);
    let p = [5u32, 17, 42, 99, 7];
    assert_eq!(prompt_logits(&mut e, &p), prompt_logits(&mut plain, &p));
    let tmp = with_config(&dir, |c| {
        c["text_config"]["use_bidirectional_attention"] = "all".into();
    });
    let e = ModelConfig::from_file(&tmp.path().join("config.json")).unwrap_err();
    assert!(e.to_string().contains("use_bidirectional_attention"), "{e}");
}

/// transformers 5.25 writes the global layers' geometry as `per_layer_config` (the published
/// configs as `global_head_dim` / `num_global_key_value_heads`): both read alike.
#[test]
fn per_layer_config_reads_as_the_published_fields() {
    for name in VARIANTS {
        let dir = fixture(name);
        let want = config(name);
        let tmp = with_config(&dir, |c| {
            let tc = c["text_config"].as_object_mut().unwrap();
            let d = tc.remove("global_head_dim").unwrap();
            let kv = tc.remove("num_global_key_value_heads").unwrap();
            let mut over = serde_json::json!({ "head_dim": d });
            if !kv.is_null() {
                over["num_key_value_heads"] = kv;
            }
            let types = tc["layer_types"].as_array().unwrap().clone();
            let per_layer: serde_json::Map<String, serde_json::Value> = types
                .iter()
                .enumerate()
                .filter(|(_, t)| t.as_str() == Some("full_attention"))
                .map(|(i, _)| (i.to_string(), over.clone()))
                .collect();
            tc.insert("per_layer_config".into(), per_layer.into());
        });
        let got = ModelConfig::from_file(&tmp.path().join("config.json")).unwrap();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn prompt_logits_match_transformers_in_f32_and_bf16() {
    for name in VARIANTS {
        let bf16_tol = if name == "e2b" {
            BF16_TOL
        } else {
            BF16_MEDIAN_TOL
        };
        hf_fixture::check_prompt_logits(name, &fixture(name), load, prompt_logits, bf16_tol);
    }
}

/// `--dtype int8` holds every matrix per-channel int8, the mixture's experts among them
/// (transformers' stacks of them load as floats, then each expert is quantized).
#[test]
fn int8_holds_the_experts_in_int8() {
    let dir = fixture("a4b");
    let (f32s, int8) = (load(&dir, DType::F32), load(&dir, DType::I8));
    assert_eq!(int8.weights_format(), "int8");
    let held = int8.resident_weight_bytes() as f64 / f32s.resident_weight_bytes() as f64;
    eprintln!("a4b in int8 holds {held:.3} of f32's bytes");
    assert!(held < 0.32, "{held}");
}

/// The six prompts prefilled in one step, then one token each per step: every step's logits
/// within f32 tolerance of transformers' and the tokens its greedy ones.
#[test]
fn greedy_tokens_match_transformers_decoding_all_six_together() {
    for name in VARIANTS {
        let table = |i: usize| blocks(8 * i as u32 + 1, 8 * 16);
        check_greedy_together(name, &fixture(name), load, table, plain_step);
    }
}

/// Prefill in chunks of 5 tokens beside the other prompts (every prompt cut): the same bits as
/// each prompt prefilled alone and whole (batch invariance).
#[test]
fn chunked_prefill_beside_others_gives_the_same_bits() {
    for name in VARIANTS {
        let (dir, table) = (fixture(name), |i: usize| blocks(4 * i as u32 + 7, 64));
        check_chunked_prefill(name, &dir, load, prompt_logits, table, plain_step);
    }
}

/// A prefix-cache hit: a second sequence with the first 32 tokens of the longest prompt
/// reuses its two K/V blocks (every pool's, the shared layers' readers included) and
/// prefills only the rest: the cold run's logits, bit for bit; and so from copies of them.
#[test]
fn a_prefix_cache_hit_gives_the_cold_runs_bits() {
    for name in VARIANTS {
        let dir = fixture(name);
        let r = refs(&dir);
        let p = &r.prompts[5];
        assert!(p.len() > 32);
        let mut e = load(&dir, DType::F32);
        let cold = prompt_logits(&mut e, p);
        let mut e = load(&dir, DType::F32);
        // Another sequence holding p's first 32 tokens, then something else, fills blocks 10, 11.
        let mut first: Vec<u32> = p[..32].to_vec();
        first.extend([5, 6, 7]);
        e.forward_logits(&[chunk(&first, 0, &[10, 11, 12], LogitsWanted::Last)])
            .unwrap();
        let table = [10, 11, 30];
        let out = e
            .forward_logits(&[chunk(&p[32..], 32, &table, LogitsWanted::All)])
            .unwrap();
        for (t, want) in cold.iter().enumerate().skip(32) {
            assert_eq!(out.row(t - 32), &want[..], "{name}: position {t}");
        }
        // The same from copies of the two blocks (copy-on-write: each pool at its own width).
        e.copy_blocks(&[(10, 20), (11, 21)]).unwrap();
        let out = e
            .forward_logits(&[chunk(&p[32..], 32, &[20, 21, 40], LogitsWanted::All)])
            .unwrap();
        for (t, want) in cold.iter().enumerate().skip(32) {
            assert_eq!(out.row(t - 32), &want[..], "{name}: copied, position {t}");
        }
    }
}

/// The local layers' K/V in window pools (blocks given back as the window leaves them and
/// handed out again): every position's logits the bits of the engine with one table.
#[test]
fn local_layers_in_window_pools_give_the_same_bits() {
    for name in VARIANTS {
        let dir = fixture(name);
        let r = refs(&dir);
        let seq: Vec<u32> = r.prompts[4].iter().chain(&r.greedies[4]).copied().collect();
        let alone = load(&dir, DType::F32)
            .forward_logits(&[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
            .unwrap();
        let mut e = hf_fixture::load_windowed(&dir);
        let w = e.kv_window().expect("window pools for the local layers");
        assert_eq!(w, KvWindow { blocks: 8, size: 8 });
        run_on_window_pools(&mut e, w, &seq, &alone, &[5, 11]);
    }
}

/// The fixtures decide what is new: without the window, the soft-capping or the per-layer
/// inputs' own table the logits leave transformers'.
#[test]
fn without_gemma4s_pieces_the_logits_differ() {
    let dir = fixture("e2b");
    let r = refs(&dir);
    let seq: Vec<u32> = r.prompts[5].iter().chain(&r.greedies[5]).copied().collect();
    let want = &r.full_logits[5];
    let last = seq.len() - 1;
    let ours = hf_fixture::sequence_logits(&mut load(&dir, DType::F32), &seq);
    assert!(rel_diff(&ours[last], &want[last]) < F32_TOL);
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 3] = [
        ("window", |c| {
            c["text_config"]["sliding_window"] = 512.into()
        }),
        ("soft-capping", |c| {
            c["text_config"]["final_logit_softcapping"] = serde_json::Value::Null
        }),
        ("shared K/V", |c| {
            c["text_config"]["num_kv_shared_layers"] = 0.into()
        }),
    ];
    for (what, edit) in edits {
        let tmp = with_config(&dir, edit);
        let opts = EngineOptions {
            dtype: Some(DType::F32),
            kv_blocks: Some(64),
            ..Default::default()
        };
        match lmi_engine::load_cpu(tmp.path(), &opts) {
            Ok(mut e) => {
                let got = hf_fixture::sequence_logits(&mut e, &seq);
                let d = rel_diff(&got[last], &want[last]);
                assert!(d > 1e-3, "without the {what} nothing changed ({d})");
            }
            // Without sharing, the last layers' K projections are missing: refused by name.
            Err(e) => assert!(e.to_string().contains("k_proj"), "{what}: {e}"),
        }
    }
}

/// A checkpoint with a vision tower beside the language model (as every published Gemma 4
/// has) reads the tower (gemma4_vision.rs serves images through it): one missing a tower
/// tensor is refused at load, naming it.
#[test]
fn a_checkpoint_with_an_incomplete_vision_tower_is_refused_naming_the_tensor() {
    let dir = fixture("a4b");
    let tmp = with_config(&dir, |c| {
        c["vision_config"] = serde_json::json!({"model_type": "gemma4_vision", "hidden_size": 16});
    });
    std::fs::copy(
        dir.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let c = ModelConfig::from_file(&tmp.path().join("config.json")).unwrap();
    assert!(c.vision.is_some());
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(64),
        ..Default::default()
    };
    let err = lmi_engine::load_cpu(tmp.path(), &opts)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("model.vision_tower."), "{err}");
}

/// The KV budget buys blocks by each pool's width: 2 · (3 · 16 + 32) f32 per token across
/// the four pools that keep K/V (the three that share keep none).
#[test]
fn the_kv_budget_counts_each_pools_width() {
    let per_block = 2 * (3 * 16 + 32) * 16 * 4;
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_cache_bytes: 100 * per_block + 7,
        window_pools: false,
        ..Default::default()
    };
    let e = lmi_engine::load_cpu(&fixture("e2b"), &opts).unwrap();
    assert_eq!(e.num_blocks(), 100);
}

/// The fixture's model with its weights read from llama.cpp's GGUF of it (`convert_gguf.py`):
/// in f32 (`dtype`), or as stored (None).
fn load_gguf(dir: &Path, gguf: &Path, dtype: Option<DType>) -> Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype,
        gguf: Some(gguf.to_path_buf()),
        kv_blocks: Some(64),
        ..Default::default()
    };
    lmi_engine::load_cpu(dir, &opts).unwrap()
}

/// llama.cpp's converter's files (`gemma4`): their metadata read back as the fixtures'
/// config.json (what `lmi convert` writes), and their weights giving transformers' logits at
/// every position of the six prompts and their greedy tokens in f32; requantized to Q8_0 and
/// served as stored, within Q8_0's error.
#[test]
fn llama_cpp_gguf_files_match_transformers() {
    for name in VARIANTS {
        let dir = fixture(name);
        let gguf = dir.join("model.f32.gguf");
        let file = lmi_checkpoint::gguf::GgufFile::open(&gguf).unwrap();
        let h = lmi_checkpoint::gguf::hparams::read(&file).unwrap();
        let json = lmi_checkpoint::gguf::hparams::config_json(&h, DType::F32);
        let mut ours = ModelConfig::from_json(&json.to_string()).unwrap();
        let theirs = config(name);
        assert_eq!(ours.architecture, theirs.architecture);
        ours.torch_dtype = theirs.torch_dtype.clone();
        assert_eq!(
            ours, theirs,
            "{name}: the GGUF's metadata read as another config"
        );

        let r = refs(&dir);
        let tmp = tempfile::tempdir().unwrap();
        let q8 = tmp.path().join("q8_0.gguf");
        lmi_checkpoint::gguf::writer::requantize(&gguf, &q8, lmi_checkpoint::quant::QType::Q8_0)
            .unwrap();
        let mut e = load_gguf(&dir, &gguf, Some(DType::F32));
        let mut q8_stored = load_gguf(&dir, &q8, None);
        // Held as the file's blocks, and labelled so (the serve log's "weights in ...").
        // Every matrix whose rows are whole blocks (e2b's per-layer tables, 8 and 56 wide
        // here, are not), a mixture's experts among them (once held in bf16 to fold their
        // norms and scales in): the file's blocks take about 34/128 of f32's bytes.
        let format = q8_stored.weights_format().to_string();
        match name {
            "a4b" => assert_eq!(format, "q8_0", "{name}: weights held as {format}"),
            _ => assert!(format.contains("q8_0"), "{name}: weights held as {format}"),
        }
        assert_eq!(e.weights_format(), "f32", "{name}");
        let held = q8_stored.resident_weight_bytes() as f64 / e.resident_weight_bytes() as f64;
        eprintln!("{name}: Q8_0 as stored holds {held:.3} of f32's bytes");
        assert!(held < 0.32, "{name}: Q8_0 holds {held:.3} of f32's bytes");
        let mut q8_f32 = load_gguf(&dir, &q8, Some(DType::F32));
        let (mut worst, mut q8_diffs, mut kernel_diffs) = (0f32, Vec::new(), Vec::new());
        for (i, p) in r.prompts.iter().enumerate() {
            let seq: Vec<u32> = p.iter().chain(&r.greedies[i]).copied().collect();
            let got = hf_fixture::sequence_logits(&mut e, &seq);
            let stored = hf_fixture::sequence_logits(&mut q8_stored, &seq);
            let in_f32 = hf_fixture::sequence_logits(&mut q8_f32, &seq);
            for (t, row) in got.iter().enumerate() {
                worst = worst.max(rel_diff(row, &r.full_logits[i][t]));
                q8_diffs.push(rel_diff(&stored[t], &r.full_logits[i][t]));
                kernel_diffs.push(rel_diff(&stored[t], &in_f32[t]));
                if t + 1 >= p.len() && t + 1 < seq.len() {
                    assert_eq!(
                        argmax(row),
                        seq[t + 1],
                        "{name} prompt {i}: token {}",
                        t + 1
                    );
                }
            }
        }
        let median = |v: &mut Vec<f32>| {
            v.sort_by(f32::total_cmp);
            v[v.len() / 2]
        };
        let (q8, kernel) = (median(&mut q8_diffs), median(&mut kernel_diffs));
        eprintln!(
            "{name}: f32 GGUF within {worst:.2e} of transformers; Q8_0 as stored median \
             {q8:.2e} from transformers, {kernel:.2e} from its weights in f32"
        );
        assert!(worst < F32_TOL, "{name}: GGUF logits differ by {worst}");
        assert!(q8 < Q8_MEDIAN_TOL, "{name} Q8_0: median {q8}");
        assert!(
            kernel < Q8_KERNEL_TOL,
            "{name} Q8_0 kernels: median {kernel}"
        );
    }
}

/// A GGUF served as `lmi serve --model FILE.gguf` does (config.json and tokenizer.json built
/// from the file's metadata, weights from the file): transformers' prompt logits.
#[test]
fn a_gguf_served_alone_gives_transformers_logits() {
    for name in VARIANTS {
        let dir = fixture(name);
        let r = refs(&dir);
        let (_tmp, mut e) = hf_fixture::load_gguf(&dir.join("model.f32.gguf"), Some(DType::F32));
        for (p, want) in r.prompts.iter().zip(&r.prompt_logits) {
            let got = prompt_logits(&mut e, p);
            for (t, row) in got.iter().enumerate() {
                let d = rel_diff(row, &want[t]);
                assert!(d < F32_TOL, "{name}: position {t} differs by {d}");
            }
        }
    }
}

/// MXFP4 experts cannot take `per_expert_scale` in their block scales (powers of two): the
/// mixture folds its factors into the experts' values instead (`gemma4::load_moe`), and
/// gives what the same MXFP4 weights read into f32 give, within the kernels' error.
#[test]
fn mxfp4_experts_fold_their_scales_and_match_their_weights_in_f32() {
    let dir = fixture("a4b");
    let r = refs(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let fp4 = tmp.path().join("mxfp4.gguf");
    lmi_checkpoint::gguf::writer::requantize(
        &dir.join("model.f32.gguf"),
        &fp4,
        lmi_checkpoint::quant::QType::MXFP4,
    )
    .unwrap();
    let mut stored = load_gguf(&dir, &fp4, None);
    let mut in_f32 = load_gguf(&dir, &fp4, Some(DType::F32));
    let format = stored.weights_format().to_string();
    assert!(
        format.contains("mxfp4") && format.contains('+'),
        "the folded experts are held apart from the file's blocks: {format}"
    );
    let mut diffs = Vec::new();
    for p in &r.prompts {
        let (a, b) = (prompt_logits(&mut stored, p), prompt_logits(&mut in_f32, p));
        diffs.extend(a.iter().zip(&b).map(|(a, b)| rel_diff(a, b)));
    }
    diffs.sort_by(f32::total_cmp);
    let median = diffs[diffs.len() / 2];
    eprintln!("a4b MXFP4, experts folded: median {median:.2e} from its weights in f32");
    assert!(median < Q8_KERNEL_TOL, "median {median}");
}
