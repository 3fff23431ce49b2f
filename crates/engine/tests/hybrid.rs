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

mod hf_fixture;

use std::path::{Path, PathBuf};

use hf_fixture::{BF16_TOL, F32_TOL, argmax, blocks, chunk, rel_diff};
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{ChunkState, DType, Engine, LogitsWanted};

const ARCHITECTURES: [&str; 3] = ["qwen3_5", "qwen3_5_moe", "qwen3_next"];
const SLOTS: usize = 16;
/// bf16 against transformers in f32, the median position of a mixture of experts.
const BF16_MOE_TOL: f32 = 1e-1;

fn fixture(name: &str) -> PathBuf {
    hf_fixture::fixture("hybrid", name)
}

/// Six prompts, their greedy continuations and transformers' logits.
struct Refs {
    prompts: Vec<Vec<u32>>,
    greedies: Vec<Vec<u32>>,
    prompt_logits: Vec<Vec<Vec<f32>>>,
    full_logits: Vec<Vec<Vec<f32>>>,
}

fn refs(dir: &Path) -> Refs {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let lists = |k: &str| -> Vec<Vec<u32>> {
        json[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect()
            })
            .collect()
    };
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let rows = |k: &str| -> Vec<Vec<f32>> {
        let t = st.tensor(k).unwrap();
        let vocab = t.shape()[1];
        let v: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        v.chunks(vocab).map(<[f32]>::to_vec).collect()
    };
    let prompts = lists("prompts");
    let n = prompts.len();
    Refs {
        greedies: lists("greedies"),
        prompt_logits: (0..n)
            .map(|i| rows(&format!("prompt_logits_{i}")))
            .collect(),
        full_logits: (0..n).map(|i| rows(&format!("full_logits_{i}"))).collect(),
        prompts,
    }
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
        let dir = fixture(name);
        let r = refs(&dir);
        for (dtype, tol) in [(DType::F32, F32_TOL), (DType::BF16, BF16_TOL)] {
            let mut e = load(&dir, dtype);
            let mut diffs: Vec<f32> = Vec::new();
            for (p, theirs) in r.prompts.iter().zip(&r.prompt_logits) {
                let ours = prompt_logits(&mut e, p);
                diffs.extend(ours.iter().zip(theirs).map(|(a, b)| rel_diff(a, b)));
            }
            diffs.sort_by(f32::total_cmp);
            let (median, worst) = (diffs[diffs.len() / 2], diffs[diffs.len() - 1]);
            eprintln!("{name} {dtype}: within {worst:.2e} of transformers (median {median:.2e})");
            if dtype == DType::F32 {
                assert!(worst < tol, "{name} f32: prompt logits differ by {worst}");
            } else {
                // bf16 rounding upstream flips a token's pick between close experts, which
                // then moves its logits by far more (the MoE fixtures' four sparse layers
                // compound it: seen medians 6e-2); a wrong weight moves every position by
                // the logits' own size.
                let bound = if name == "qwen3_5" { tol } else { BF16_MOE_TOL };
                assert!(median < bound, "{name} bf16: median difference {median}");
            }
        }
    }
}

/// Greedy decoding of every prompt at once: one prefill step of all six, then one decode
/// token per sequence per step, each in its own state slot; every step's logits within f32
/// tolerance of transformers' and the tokens equal to its greedy ones.
#[test]
fn greedy_tokens_match_transformers_decoding_all_six_together() {
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let r = refs(&dir);
        let mut e = load(&dir, DType::F32);
        let tables: Vec<Vec<u32>> = (0..r.prompts.len())
            .map(|i| blocks(16 * i as u32, 16 * BLOCK_TOKENS))
            .collect();
        let states: Vec<ChunkState> = (0..r.prompts.len() as u32)
            .map(ChunkState::in_slot)
            .collect();
        let chunks: Vec<_> = r
            .prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| chunk(p, 0, t, LogitsWanted::Last))
            .collect();
        let out = e.forward_logits_states(&chunks, &states).unwrap();
        let mut next: Vec<u32> = (0..chunks.len()).map(|i| argmax(out.row(i))).collect();
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); chunks.len()];
        for step in 0..32 {
            let chunks: Vec<_> = (0..next.len())
                .map(|i| {
                    tokens[i].push(next[i]);
                    let pos = r.prompts[i].len() + step;
                    chunk(&[next[i]], pos, &tables[i], LogitsWanted::Last)
                })
                .collect();
            let out = e.forward_logits_states(&chunks, &states).unwrap();
            for (i, n) in next.iter_mut().enumerate() {
                let pos = r.prompts[i].len() + step;
                let d = rel_diff(out.row(i), &r.full_logits[i][pos]);
                assert!(
                    d < F32_TOL,
                    "{name} prompt {i} step {step}: logits differ by {d}"
                );
                *n = argmax(out.row(i));
            }
        }
        assert_eq!(tokens, r.greedies, "{name}: greedy tokens differ");
    }
}

/// Blocks a sequence of the tests may use (16 of 16 tokens each).
const BLOCK_TOKENS: usize = 16;

/// Prefill in chunks of 5 tokens (every prompt cut, the state carried between steps), beside
/// other sequences: the same bits as each prompt prefilled alone and whole.
#[test]
fn chunked_prefill_beside_others_gives_the_same_bits() {
    for name in ARCHITECTURES {
        let dir = fixture(name);
        let r = refs(&dir);
        let mut e = load(&dir, DType::F32);
        let whole: Vec<Vec<Vec<f32>>> =
            r.prompts.iter().map(|p| prompt_logits(&mut e, p)).collect();
        let mut e = load(&dir, DType::F32);
        let n = r.prompts.len();
        let tables: Vec<Vec<u32>> = (0..n).map(|i| blocks(16 * i as u32, 64)).collect();
        let mut cut: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
        let longest = r.prompts.iter().map(Vec::len).max().unwrap();
        for start in (0..longest).step_by(5) {
            let live: Vec<usize> = (0..n).filter(|&i| start < r.prompts[i].len()).collect();
            let chunks: Vec<_> = live
                .iter()
                .map(|&i| {
                    let p = &r.prompts[i];
                    let end = (start + 5).min(p.len());
                    chunk(&p[start..end], start, &tables[i], LogitsWanted::All)
                })
                .collect();
            // Slots in reverse, so that no sequence's slot is its index.
            let states: Vec<ChunkState> = live
                .iter()
                .map(|&i| ChunkState::in_slot((SLOTS - 1 - i) as u32))
                .collect();
            let out = e.forward_logits_states(&chunks, &states).unwrap();
            let mut row = 0;
            for (&i, c) in live.iter().zip(&chunks) {
                for _ in 0..c.tokens.len() {
                    cut[i].push(out.row(row).to_vec());
                    row += 1;
                }
            }
        }
        assert_eq!(cut, whole, "{name}: chunked prefill changed the logits");
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
        for (t, want) in cold.iter().enumerate().take(p.len()).skip(16) {
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
