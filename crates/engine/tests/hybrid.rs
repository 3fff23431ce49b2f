//! Gated DeltaNet hybrids (Qwen3.5 dense and MoE, Qwen3-Next) on the CPU against HF
//! transformers: tiny random checkpoints and what transformers computed with them on six
//! prompts (`tests/fixtures/hybrid/generate.py`).
//! - Prompt logits within f32 tolerance at every position of every prompt (and in bf16,
//!   looser); 32 greedy tokens equal to transformers', one token a step, the recurrent state
//!   carried in its slot from step to step.
//! - The six decoded together in shared steps, and prefilled in chunks that cut every prompt:
//!   the same bits as alone and whole.
//! - A prefix snapshot: a sequence resumed from the state copied out of another's prefill
//!   (and its K/V blocks) gives the cold run's logits exactly.
//! - The GGUF files llama.cpp's converter writes for them (`qwen35`, `qwen35moe`,
//!   `qwen3next`): imported as `lmi serve` imports a GGUF, the same logits in f32 for every
//!   prompt; requantized to Q8_0 by `lmi quantize`'s code and served as stored, within Q8_0's
//!   error.

mod hf_fixture;

use std::path::{Path, PathBuf};

use hf_fixture::{
    BF16_TOL, Cpu, F32_TOL, HybridRefs as Refs, argmax, blocks, check_chunked_prefill,
    check_greedy_together, chunk, hybrid_refs as refs, rel_diff,
};
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{ChunkState, DType, Engine, LogitsWanted, SeqChunk};

const ARCHITECTURES: [&str; 3] = ["qwen3_5", "qwen3_5_moe", "qwen3_next"];
const SLOTS: usize = 16;
/// bf16 against transformers in f32, the median position of a mixture of experts.
const BF16_MOE_TOL: f32 = 1e-1;
/// Q8_0 weights served as stored against transformers in f32, the median position. These
/// random models amplify weight rounding (bf16 alone moves qwen3_5's median to 3e-2): the
/// Q8_0 weights read into f32 and computed in f32 are already at medians of 7e-2 (qwen3_5),
/// 1.6e-1 (qwen3_5_moe) and 1.2e-1 (qwen3_next), expert flips included; a wrong weight or
/// head order moves every position by the logits' own size (1).
const Q8_TOL: f32 = 2e-1;
/// Q8_0 as stored against the same Q8_0 weights read into f32 (12-bit activations in the
/// products, bf16 K/V and float matrices), the median position; measured 0.8-1.4e-2.
const Q8_KERNEL_TOL: f32 = 3e-2;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("hybrid", name)
}

fn load(dir: &Path, dtype: DType) -> Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype: Some(dtype),
        kv_blocks: Some(96),
        state_slots: Some(SLOTS),
        ..Default::default()
    };
    lmi_engine::load_cpu(dir, &opts).unwrap()
}

/// Each prompt's logits at every position, prefilled alone from slot 0.
fn prompt_logits(e: &mut Engine<lmi_engine::cpu::CpuBackend>, p: &[u32]) -> Vec<Vec<f32>> {
    let out = e
        .forward_logits_states(
            &[chunk(p, 0, &blocks(0, p.len()), LogitsWanted::All)],
            &[ChunkState::in_slot(0)],
        )
        .unwrap();
    (0..p.len()).map(|t| out.row(t).to_vec()).collect()
}

#[test]
fn prompt_logits_match_transformers_in_f32_and_bf16() {
    for name in ARCHITECTURES {
        // bf16 rounding upstream flips a token's pick between close experts, which then moves
        // its logits by far more (the MoE fixtures' four sparse layers compound it: seen
        // medians 6e-2); a wrong weight moves every position by the logits' own size.
        let bf16_tol = if name == "qwen3_5" {
            BF16_TOL
        } else {
            BF16_MOE_TOL
        };
        hf_fixture::check_prompt_logits(name, &fixture(name), load, prompt_logits, bf16_tol);
    }
}

/// Greedy decoding of every prompt at once: one prefill step of all six, then one decode
/// token per sequence per step, each in its own state slot; every step's logits within f32
/// tolerance of transformers' and the tokens equal to its greedy ones.
#[test]
fn greedy_tokens_match_transformers_decoding_all_six_together() {
    for name in ARCHITECTURES {
        let table = |i: usize| blocks(16 * i as u32, 16 * BLOCK_TOKENS);
        // Each sequence in its own state slot.
        let step = |e: &mut Cpu, c: &[SeqChunk], seqs: &[usize]| {
            let states: Vec<ChunkState> = seqs
                .iter()
                .map(|&i| ChunkState::in_slot(i as u32))
                .collect();
            e.forward_logits_states(c, &states).unwrap()
        };
        check_greedy_together(name, &fixture(name), load, table, step);
    }
}

/// Blocks a sequence of the tests may use (16 of 16 tokens each).
const BLOCK_TOKENS: usize = 16;

/// Prefill in chunks of 5 tokens (every prompt cut, the state carried between steps), beside
/// other sequences: the same bits as each prompt prefilled alone and whole.
#[test]
fn chunked_prefill_beside_others_gives_the_same_bits() {
    for name in ARCHITECTURES {
        let table = |i: usize| blocks(16 * i as u32, 64);
        // Slots in reverse, so that no sequence's slot is its index.
        let step = |e: &mut Cpu, c: &[SeqChunk], live: &[usize]| {
            let states: Vec<ChunkState> = live
                .iter()
                .map(|&i| ChunkState::in_slot((SLOTS - 1 - i) as u32))
                .collect();
            e.forward_logits_states(c, &states).unwrap()
        };
        check_chunked_prefill(name, &fixture(name), load, prompt_logits, table, step);
    }
}

/// A snapshot of the state after 16 tokens (taken while another sequence prefills) and its
/// first K/V block: a sequence with the same first 16 tokens resumes from copies of them
/// and gets the cold run's logits, bit for bit.
#[test]
fn a_prefix_snapshot_resumes_exactly() {
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let r = refs(&dir);
        let p = &r.prompts[5];
        assert!(p.len() > 32);
        let mut e = load(&dir, DType::F32);
        let cold = prompt_logits(&mut e, p);
        let mut e = load(&dir, DType::F32);
        // A first sequence shares 16 tokens with p, then goes elsewhere; snapshot into slot 9.
        let mut other: Vec<u32> = p[..16].to_vec();
        other.extend([5, 6, 7, 8, 9]);
        e.forward_logits_states(
            &[chunk(&other, 0, &[0, 1], LogitsWanted::Last)],
            &[ChunkState {
                slot: 1,
                snapshots: vec![(16, 9)],
            }],
        )
        .unwrap();
        // p resumes at 16: block 0 shared, its state copied from the snapshot into slot 4.
        e.copy_states(&[(9, 4)]).unwrap();
        let table = [0, 10, 11];
        let out = e
            .forward_logits_states(
                &[chunk(&p[16..], 16, &table, LogitsWanted::All)],
                &[ChunkState::in_slot(4)],
            )
            .unwrap();
        for (t, want) in cold.iter().enumerate().skip(16) {
            assert_eq!(out.row(t - 16), &want[..], "{name}: position {t}");
        }
    }
}

#[test]
fn a_hybrid_model_names_its_state_and_refuses_steps_without_it() {
    let mut e = load(&fixture("qwen3_5"), DType::F32);
    let s = e.state_config().unwrap();
    // 3 linear layers; per slot the convolution's 3 inputs of 128 channels and 4 heads of
    // 16 × 16.
    assert_eq!(
        (s.slots, s.layers, s.slot_len),
        (SLOTS, 3, 128 * 3 + 4 * 16 * 16)
    );
    let err = e
        .forward_logits(&[chunk(&[1, 2, 3], 0, &[0], LogitsWanted::Last)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("recurrent state"), "{err}");
}

/// A GGUF imported as `lmi serve` imports one: its config and tokenizer converted into a
/// directory, the weights read from the file (as stored when `dtype` is None).
fn load_gguf(
    gguf: &Path,
    dtype: Option<DType>,
) -> (tempfile::TempDir, Engine<lmi_engine::cpu::CpuBackend>) {
    let opts = EngineOptions {
        dtype,
        kv_blocks: Some(96),
        state_slots: Some(SLOTS),
        ..Default::default()
    };
    hf_fixture::load_gguf_with(gguf, opts)
}

/// The config imported from a GGUF is the fixture's (the token ids aside: the converter's
/// tokenizer has its own bos and eos).
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
        assert_eq!(
            (ours.bos_token_id, &ours.eos_token_ids[..]),
            (Some(256), &[258][..])
        );
        ours.bos_token_id = theirs.bos_token_id;
        ours.eos_token_ids = theirs.eos_token_ids.clone();
        ours.torch_dtype = theirs.torch_dtype.clone();
        // The vision tower is not in a GGUF (llama.cpp keeps it in an mmproj file), and
        // without it M-RoPE's sections change nothing: text positions turn them alike.
        let theirs = ModelConfig {
            vision: None,
            mrope_section: None,
            mrope_interleaved: false,
            ..theirs
        };
        assert_eq!(ours, theirs, "{name}");
    }
}

/// Every prompt followed by its greedy tokens, one forward each from slot 0: the logits at
/// every position.
fn sequence_logits(e: &mut Engine<lmi_engine::cpu::CpuBackend>, r: &Refs) -> Vec<Vec<Vec<f32>>> {
    (0..r.prompts.len())
        .map(|i| {
            let seq: Vec<u32> = r.prompts[i].iter().chain(&r.greedies[i]).copied().collect();
            let out = e
                .forward_logits_states(
                    &[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)],
                    &[ChunkState::in_slot(0)],
                )
                .unwrap();
            (0..seq.len()).map(|t| out.row(t).to_vec()).collect()
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

/// llama.cpp's files (`convert_gguf.py`: 1 + w norms, -exp(A_log), the squeezed conv,
/// Qwen3-Next's split projections, Qwen3.5's value heads tiled) give transformers' logits at
/// every position of every prompt and its greedy tokens in f32. Requantized to Q8_0 and
/// served as stored (the projections stay Q8_0, their rows and blocks moved), the median
/// position within Q8_0's error of transformers', and close to the same Q8_0 weights read
/// into f32 (which isolates the handling of blocks from the rounding of the weights).
#[test]
fn llama_cpp_gguf_files_match_transformers() {
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let r = refs(&dir);
        let gguf = dir.join("model.f32.gguf");
        let tmp = tempfile::tempdir().unwrap();
        let q8 = tmp.path().join("q8_0.gguf");
        lmi_checkpoint::gguf::writer::requantize(&gguf, &q8, lmi_checkpoint::quant::QType::Q8_0)
            .unwrap();
        let file = lmi_checkpoint::gguf::GgufFile::open(&q8).unwrap();
        let kind = |n: &str| file.tensor(n).unwrap().ggml_type.name();
        for t in ["attn_qkv", "attn_gate", "ssm_out"] {
            assert_eq!(kind(&format!("blk.0.{t}.weight")), "Q8_0", "{name} {t}");
        }
        assert_eq!(kind("blk.3.attn_q.weight"), "Q8_0");
        // Rows of 4 taps: no whole block.
        assert_eq!(kind("blk.0.ssm_conv1d.weight"), "F32");

        let theirs = &r.full_logits;
        let (_dir, mut e) = load_gguf(&gguf, Some(DType::F32));
        let f32_logits = sequence_logits(&mut e, &r);
        let d = diffs(&f32_logits, theirs);
        let worst = d[d.len() - 1];
        eprintln!(
            "{name} f32 GGUF: within {worst:.2e} of transformers' ({} positions)",
            d.len()
        );
        assert!(worst < F32_TOL, "{name} f32 GGUF: logits differ by {worst}");
        for (i, (logits, greedy)) in f32_logits.iter().zip(&r.greedies).enumerate() {
            let first = r.prompts[i].len() - 1;
            let picks: Vec<u32> = logits[first..logits.len() - 1]
                .iter()
                .map(|l| argmax(l))
                .collect();
            assert_eq!(&picks, greedy, "{name} f32 GGUF prompt {i}: greedy tokens");
        }

        let (_dir, mut e) = load_gguf(&q8, Some(DType::F32));
        let q8_in_f32 = sequence_logits(&mut e, &r);
        let (_dir, mut e) = load_gguf(&q8, None);
        let format = e.weights_format().to_string();
        assert!(format.contains("q8_0"), "{name}: weights held as {format}");
        let stored = sequence_logits(&mut e, &r);
        let (vs_hf, vs_f32) = (diffs(&stored, theirs), diffs(&stored, &q8_in_f32));
        let rounding = diffs(&q8_in_f32, theirs);
        let median = |d: &[f32]| d[d.len() / 2];
        eprintln!(
            "{name} Q8_0 as stored ({format}): median {:.2e} (worst {:.2e}) from transformers', \
             {:.2e} (worst {:.2e}) from its weights in f32 (those: median {:.2e} from transformers')",
            median(&vs_hf),
            vs_hf[vs_hf.len() - 1],
            median(&vs_f32),
            vs_f32[vs_f32.len() - 1],
            median(&rounding),
        );
        assert!(
            median(&vs_f32) < Q8_KERNEL_TOL,
            "{name} Q8_0: as stored differs from its weights in f32 by {} (median)",
            median(&vs_f32)
        );
        assert!(
            median(&vs_hf) < Q8_TOL,
            "{name} Q8_0: median difference {} from transformers'",
            median(&vs_hf)
        );
    }
}

/// A published file's multi-token-prediction block, as llama.cpp's converter writes it (one
/// more block past the model's, `nextn_predict_layers` 1, its `blk.N.nextn.*` tensors and a
/// full-attention layer with experts): skipped, the logits those of the file without it.
#[test]
fn a_gguf_mtp_block_is_skipped() {
    use lmi_checkpoint::gguf::writer::{TensorOut, write};
    use lmi_checkpoint::gguf::{GgmlType, GgufFile, GgufValue};
    let dir = fixture("qwen3_5_moe");
    let r = refs(&dir);
    let gguf = dir.join("model.f32.gguf");
    let g = GgufFile::open(&gguf).unwrap();
    let arch = "qwen35moe";
    let mut meta: Vec<(String, GgufValue)> = g
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in meta.iter_mut() {
        if k == &format!("{arch}.block_count") {
            *v = GgufValue::U32(5);
        }
        if k == &format!("{arch}.attention.recurrent_layers") {
            let flags = [true, true, true, false, false].map(GgufValue::Bool);
            *v = GgufValue::Array(flags.to_vec());
        }
    }
    meta.push((format!("{arch}.nextn_predict_layers"), GgufValue::U32(1)));
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
    // The MTP layer: layer 3's tensors again as block 4, and its own.
    let copies: Vec<TensorOut> = tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.3."))
        .map(|t| TensorOut {
            name: t.name.replacen("blk.3.", "blk.4.", 1),
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
    tensors.push(f32s("blk.4.nextn.eh_proj.weight", vec![128, 64]));
    for n in ["enorm", "hnorm", "shared_head_norm"] {
        tensors.push(f32s(&format!("blk.4.nextn.{n}.weight"), vec![64]));
    }
    let tmp = tempfile::tempdir().unwrap();
    let with_mtp = tmp.path().join("mtp.gguf");
    write(&with_mtp, &meta, &tensors).unwrap();
    let (_a, mut plain) = load_gguf(&gguf, Some(DType::F32));
    let (_b, mut mtp) = load_gguf(&with_mtp, Some(DType::F32));
    assert_eq!(mtp.model_config().num_layers, 4);
    assert_eq!(
        prompt_logits(&mut mtp, &r.prompts[0]),
        prompt_logits(&mut plain, &r.prompts[0])
    );
}
