//! What the tests of HF-reference fixtures share: each fixture directory holds an HF model
//! (`config.json`, `model.safetensors`), what transformers computed with it
//! (`reference.json`, `reference.safetensors`), and sometimes llama.cpp's GGUF of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use lmi_engine::engine::EngineOptions;
use lmi_engine::{BLOCK_SIZE, DType, Engine, LogitsWanted, SeqChunk};

/// The quantized checkpoints of tests/fixtures/quantized/ (generate.py).
pub const QUANTIZED: [&str; 6] = [
    "fp8_block",
    "ct_int8",
    "ct_fp8",
    "ct_w4a16",
    "awq_gemm",
    "gptq_act_order",
];

/// transformers in f32 against ours in f32: the products sum in other orders.
pub const F32_TOL: f32 = 1e-4;
/// bf16 weights, matrix inputs and K/V against transformers in f32, relative to the largest
/// logit (a test may hold only the median position to it: see its own bound).
pub const BF16_TOL: f32 = 3e-2;

/// `tests/fixtures/{group}/{name}`.
pub fn fixture(group: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/{group}/{name}"))
}

pub struct Reference {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    pub prompt_logits: Vec<Vec<f32>>,
    pub full_logits: Vec<Vec<f32>>,
}

impl Reference {
    /// The prompt and its greedy tokens: the sequence `full_logits` covers.
    pub fn sequence(&self) -> Vec<u32> {
        self.prompt.iter().chain(&self.greedy).copied().collect()
    }
}

/// The logits at every position of `seq`, prefilled at once.
pub fn sequence_logits<B: lmi_engine::Backend>(e: &mut Engine<B>, seq: &[u32]) -> Vec<Vec<f32>> {
    let out = e
        .forward_logits(&[chunk(seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
        .unwrap();
    (0..seq.len()).map(|t| out.row(t).to_vec()).collect()
}

/// A copy of the fixture's model (config.json and model.safetensors) with its config.json
/// changed by `edit`.
pub fn with_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
    }
    let path = tmp.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(&path, c.to_string()).unwrap();
    tmp
}

/// The fixture's `reference.json`.
fn reference_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap()
}

/// Tensor `k` of a reference.safetensors (`[rows, vocab]` f32) as rows.
fn logit_rows(st: &safetensors::SafeTensors<'_>, k: &str) -> Vec<Vec<f32>> {
    let t = st.tensor(k).unwrap();
    let vocab = t.shape()[1];
    let v: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    v.chunks(vocab).map(<[f32]>::to_vec).collect()
}

pub fn reference(dir: &Path) -> Reference {
    let json = reference_json(dir);
    let ids = |k: &str| -> Vec<u32> {
        json[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let rows = |k: &str| logit_rows(&st, k);
    Reference {
        prompt: ids("prompt"),
        greedy: ids("greedy"),
        prompt_logits: rows("prompt_logits"),
        full_logits: rows("full_logits"),
    }
}

/// A hybrid fixture's six prompts (`tests/fixtures/hybrid`), their greedy continuations and
/// transformers' logits.
pub struct HybridRefs {
    pub prompts: Vec<Vec<u32>>,
    pub greedies: Vec<Vec<u32>>,
    /// Per prompt, one forward over it: `[len, vocab]`.
    pub prompt_logits: Vec<Vec<Vec<f32>>>,
    /// Per prompt, one forward over it and its greedy tokens: `[len + 32, vocab]`.
    pub full_logits: Vec<Vec<Vec<f32>>>,
}

pub fn hybrid_refs(dir: &Path) -> HybridRefs {
    let json = reference_json(dir);
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
    let rows = |k: &str| logit_rows(&st, k);
    let prompts = lists("prompts");
    let n = prompts.len();
    HybridRefs {
        greedies: lists("greedies"),
        prompt_logits: (0..n)
            .map(|i| rows(&format!("prompt_logits_{i}")))
            .collect(),
        full_logits: (0..n).map(|i| rows(&format!("full_logits_{i}"))).collect(),
        prompts,
    }
}

pub fn load(dir: &Path, dtype: DType) -> Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype: Some(dtype),
        kv_blocks: Some(64),
        ..Default::default()
    };
    lmi_engine::load_cpu(dir, &opts).unwrap()
}

/// The fixture in f32 with window pools for its local layers, sized for steps of one
/// sequence and 16 tokens, and 64 global blocks.
pub fn load_windowed(dir: &Path) -> Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(64),
        max_step: lmi_engine::engine::StepShape {
            seqs: 1,
            tokens: 16,
            context: None,
        },
        ..Default::default()
    };
    lmi_engine::load_cpu(dir, &opts).unwrap()
}

pub fn blocks(first: u32, tokens: usize) -> Vec<u32> {
    (first..first + tokens.div_ceil(BLOCK_SIZE) as u32).collect()
}

pub fn chunk(tokens: &[u32], start_pos: usize, table: &[u32], logits: LogitsWanted) -> SeqChunk {
    SeqChunk {
        tokens: tokens.to_vec(),
        start_pos,
        block_table: table.to_vec(),
        window_table: Vec::new(),
        logits,
        adapter: None,
    }
}

/// The largest difference over a row, relative to the row's largest reference logit (at
/// least 1).
pub fn rel_diff(ours: &[f32], theirs: &[f32]) -> f32 {
    let scale = theirs.iter().fold(1f32, |m, x| m.max(x.abs()));
    ours.iter()
        .zip(theirs)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

pub fn argmax(row: &[f32]) -> u32 {
    lmi_checkpoint::testing::argmax(row)
}

/// A GGUF imported as `lmi serve --model FILE.gguf` does: the config and tokenizer from the
/// file's metadata into a directory, the weights read from the file.
pub fn load_gguf(
    gguf: &Path,
    dtype: Option<DType>,
) -> (tempfile::TempDir, Engine<lmi_engine::cpu::CpuBackend>) {
    let opts = EngineOptions {
        dtype,
        kv_blocks: Some(64),
        ..Default::default()
    };
    load_gguf_with(gguf, opts)
}

/// [`load_gguf`] with the caller's engine options (its KV blocks, state slots, dtype); the
/// file itself is set here.
pub fn load_gguf_with(
    gguf: &Path,
    opts: EngineOptions,
) -> (tempfile::TempDir, Engine<lmi_engine::cpu::CpuBackend>) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    lmi_checkpoint::gguf::convert::convert_gguf_with(gguf, &dir, DType::F32, false, false).unwrap();
    let opts = EngineOptions {
        gguf: Some(gguf.to_path_buf()),
        ..opts
    };
    let e = lmi_engine::load_cpu(&dir, &opts).unwrap();
    (tmp, e)
}

/// Every prompt position's difference from transformers' logits ([`rel_diff`]), the prompt
/// prefilled at once, sorted ascending.
pub fn prompt_diffs(dir: &Path, dtype: DType) -> Vec<f32> {
    let r = reference(dir);
    let mut e = load(dir, dtype);
    let table = blocks(0, r.prompt.len());
    let out = e
        .forward_logits(&[chunk(&r.prompt, 0, &table, LogitsWanted::All)])
        .unwrap();
    let mut diffs: Vec<f32> = (0..r.prompt.len())
        .map(|t| rel_diff(out.row(t), &r.prompt_logits[t]))
        .collect();
    diffs.sort_by(f32::total_cmp);
    diffs
}

/// Greedy decoding in f32, one token a step after the prompt: every step's logits within
/// `tol` of transformers' and the tokens transformers' greedy ones.
pub fn check_greedy(name: &str, dir: &Path, tol: f32) {
    let r = reference(dir);
    let mut e = load(dir, DType::F32);
    let table = blocks(3, r.prompt.len() + r.greedy.len());
    let out = e
        .forward_logits(&[chunk(&r.prompt, 0, &table, LogitsWanted::Last)])
        .unwrap();
    let mut next = argmax(out.row(0));
    let mut tokens = Vec::new();
    for step in 0..r.greedy.len() {
        tokens.push(next);
        let pos = r.prompt.len() + step;
        let out = e
            .forward_logits(&[chunk(&[next], pos, &table, LogitsWanted::Last)])
            .unwrap();
        let d = rel_diff(out.row(0), &r.full_logits[pos]);
        assert!(d < tol, "{name}: decode step {step} logits differ by {d}");
        next = argmax(out.row(0));
    }
    assert_eq!(
        tokens, r.greedy,
        "{name}: greedy tokens differ from transformers'"
    );
}

/// A sequence's window table as the scheduler's KV manager keeps it, over a window pool of
/// `blocks`: a block goes back once no later token's window reaches it, and is handed straight
/// to the sequence's next block (so a local layer reading a block it should not sees other
/// positions' K/V).
pub struct WindowRing {
    size: usize,
    table: Vec<u32>,
    free: Vec<u32>,
    /// Whether a given-back block was handed out again.
    pub reused: bool,
}

impl WindowRing {
    pub fn new(w: lmi_engine::KvWindow) -> Self {
        WindowRing {
            size: w.size,
            table: Vec::new(),
            free: (0..w.blocks as u32).rev().collect(),
            reused: false,
        }
    }

    /// The window table for a chunk of `len` tokens from `start`.
    pub fn table_for(&mut self, start: usize, len: usize) -> Vec<u32> {
        use lmi_engine::NO_BLOCK;
        let first = lmi_engine::KvWindow::first_needed(self.size, start);
        for b in self.table.iter_mut().take(first) {
            if *b != NO_BLOCK {
                self.free.push(std::mem::replace(b, NO_BLOCK));
            }
        }
        while self.table.len() < (start + len).div_ceil(BLOCK_SIZE) {
            self.reused |= self.table.contains(&NO_BLOCK);
            let b = self
                .free
                .pop()
                .expect("the window pool holds a step's windows");
            self.table.push(b);
        }
        self.table.clone()
    }
}

/// Runs `seq` through `e`, whose window pools are `w`, in chunks of `lens` and then one token
/// at a time, every position's logits the bits of `alone` (the one-table engine's), and
/// checks that blocks left the window and were handed out again. The global table's ids
/// start past the window pool's, so a local layer on the wrong table reads outside its pool.
pub fn run_on_window_pools(
    e: &mut Engine<lmi_engine::cpu::CpuBackend>,
    w: lmi_engine::KvWindow,
    seq: &[u32],
    alone: &lmi_engine::engine::Logits,
    lens: &[usize],
) {
    let table = blocks(w.blocks as u32, seq.len());
    let mut ring = WindowRing::new(w);
    let mut start = 0;
    let mut lens = lens.iter();
    while start < seq.len() {
        let len = lens.next().copied().unwrap_or(1);
        let mut c = chunk(&seq[start..start + len], start, &table, LogitsWanted::All);
        c.window_table = ring.table_for(start, len);
        let out = e.forward_logits(&[c]).unwrap();
        rows_equal(&out, alone, start, "window pools");
        start += len;
    }
    assert!(
        ring.reused,
        "no block left the window ({} tokens)",
        seq.len()
    );
}

/// Every row of `got` is the bits of `want`'s row `start + t`.
pub fn rows_equal(
    got: &lmi_engine::engine::Logits,
    want: &lmi_engine::engine::Logits,
    start: usize,
    what: &str,
) {
    for t in 0..got.num_rows() {
        assert_eq!(
            got.row(t),
            want.row(start + t),
            "{what}: token {} changed",
            start + t
        );
    }
}

/// The CPU engine the fixture tests load.
pub type Cpu = Engine<lmi_engine::cpu::CpuBackend>;

/// Every position's logits of `p`, prefilled alone and whole from block 0.
pub fn prompt_logits(e: &mut Cpu, p: &[u32]) -> Vec<Vec<f32>> {
    let out = e
        .forward_logits(&[chunk(p, 0, &blocks(0, p.len()), LogitsWanted::All)])
        .unwrap();
    (0..p.len()).map(|t| out.row(t).to_vec()).collect()
}

/// A step of a plain engine (no recurrent state): the chunks' forward.
pub fn plain_step(e: &mut Cpu, chunks: &[SeqChunk], _seqs: &[usize]) -> lmi_engine::engine::Logits {
    e.forward_logits(chunks).unwrap()
}

/// Every prompt of the six-prompt fixture `dir`, loaded by `load` in f32 and in bf16, its
/// logits (`logits`, each prompt alone) against transformers' at every position: in f32 the
/// worst position within [`F32_TOL`], in bf16 the median within `bf16_median_tol`.
pub fn check_prompt_logits(
    name: &str,
    dir: &Path,
    load: impl Fn(&Path, DType) -> Cpu,
    mut logits: impl FnMut(&mut Cpu, &[u32]) -> Vec<Vec<f32>>,
    bf16_median_tol: f32,
) {
    let r = hybrid_refs(dir);
    for dtype in [DType::F32, DType::BF16] {
        let mut e = load(dir, dtype);
        let mut diffs: Vec<f32> = Vec::new();
        for (p, theirs) in r.prompts.iter().zip(&r.prompt_logits) {
            let ours = logits(&mut e, p);
            diffs.extend(ours.iter().zip(theirs).map(|(a, b)| rel_diff(a, b)));
        }
        diffs.sort_by(f32::total_cmp);
        let (median, worst) = (diffs[diffs.len() / 2], diffs[diffs.len() - 1]);
        eprintln!("{name} {dtype}: within {worst:.2e} of transformers (median {median:.2e})");
        if dtype == DType::F32 {
            assert!(
                worst < F32_TOL,
                "{name} f32: prompt logits differ by {worst}"
            );
        } else {
            assert!(
                median < bf16_median_tol,
                "{name} bf16: median difference {median}"
            );
        }
    }
}

/// Greedy decoding of every prompt of the six-prompt fixture `dir` at once, loaded by `load`
/// in f32, sequence `i` on block table `table(i)`: one prefill step of all six, then one
/// token per sequence per step (`step` runs the chunks of sequences 0..6); every step's
/// logits within [`F32_TOL`] of transformers' and 32 tokens each equal to its greedy ones.
pub fn check_greedy_together(
    name: &str,
    dir: &Path,
    load: impl Fn(&Path, DType) -> Cpu,
    table: impl Fn(usize) -> Vec<u32>,
    mut step: impl FnMut(&mut Cpu, &[SeqChunk], &[usize]) -> lmi_engine::engine::Logits,
) {
    let r = hybrid_refs(dir);
    let mut e = load(dir, DType::F32);
    let n = r.prompts.len();
    let seqs: Vec<usize> = (0..n).collect();
    let tables: Vec<Vec<u32>> = (0..n).map(&table).collect();
    let chunks: Vec<_> = r
        .prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| chunk(p, 0, t, LogitsWanted::Last))
        .collect();
    let out = step(&mut e, &chunks, &seqs);
    let mut next: Vec<u32> = (0..n).map(|i| argmax(out.row(i))).collect();
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); n];
    for s in 0..32 {
        let chunks: Vec<_> = (0..n)
            .map(|i| {
                tokens[i].push(next[i]);
                let pos = r.prompts[i].len() + s;
                chunk(&[next[i]], pos, &tables[i], LogitsWanted::Last)
            })
            .collect();
        let out = step(&mut e, &chunks, &seqs);
        for (i, n) in next.iter_mut().enumerate() {
            let pos = r.prompts[i].len() + s;
            let d = rel_diff(out.row(i), &r.full_logits[i][pos]);
            assert!(
                d < F32_TOL,
                "{name} prompt {i} step {s}: logits differ by {d}"
            );
            *n = argmax(out.row(i));
        }
    }
    assert_eq!(tokens, r.greedies, "{name}: greedy tokens differ");
}

/// Prefill of every prompt of the six-prompt fixture `dir` (loaded by `load` in f32) in
/// chunks of 5 tokens (every prompt cut), the live sequences together in each step (`step`
/// gets the chunks and their sequences' indices), sequence `i` on block table `table(i)`:
/// the bits of each prompt prefilled alone and whole (`alone`, on an engine of its own).
pub fn check_chunked_prefill(
    name: &str,
    dir: &Path,
    load: impl Fn(&Path, DType) -> Cpu,
    mut alone: impl FnMut(&mut Cpu, &[u32]) -> Vec<Vec<f32>>,
    table: impl Fn(usize) -> Vec<u32>,
    mut step: impl FnMut(&mut Cpu, &[SeqChunk], &[usize]) -> lmi_engine::engine::Logits,
) {
    let prompts = hybrid_refs(dir).prompts;
    let mut e = load(dir, DType::F32);
    let whole: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(&mut e, p)).collect();
    let mut e = load(dir, DType::F32);
    let n = prompts.len();
    let tables: Vec<Vec<u32>> = (0..n).map(table).collect();
    let mut cut: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
    let longest = prompts.iter().map(Vec::len).max().unwrap();
    for start in (0..longest).step_by(5) {
        let live: Vec<usize> = (0..n).filter(|&i| start < prompts[i].len()).collect();
        let chunks: Vec<_> = live
            .iter()
            .map(|&i| {
                let p = &prompts[i];
                let end = (start + 5).min(p.len());
                chunk(&p[start..end], start, &tables[i], LogitsWanted::All)
            })
            .collect();
        let out = step(&mut e, &chunks, &live);
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

/// A prefix-cache hit on the six-prompt fixture `dir` (loaded by `load` in f32): another
/// sequence with the last prompt's first 16 tokens writes block 0; the prompt resumes at 16
/// on it and gets the cold run's logits (prefilled alone on a fresh engine), bit for bit.
pub fn check_prefix_hit(name: &str, dir: &Path, load: impl Fn(&Path, DType) -> Cpu) {
    let r = hybrid_refs(dir);
    let p = &r.prompts[5];
    assert!(p.len() > 32);
    let cold = prompt_logits(&mut load(dir, DType::F32), p);
    let mut e = load(dir, DType::F32);
    let mut other: Vec<u32> = p[..16].to_vec();
    other.extend([5, 6, 7, 8, 9]);
    e.forward_logits(&[chunk(&other, 0, &[0, 1], LogitsWanted::Last)])
        .unwrap();
    let out = e
        .forward_logits(&[chunk(&p[16..], 16, &[0, 10, 11], LogitsWanted::All)])
        .unwrap();
    for (t, want) in cold.iter().enumerate().skip(16) {
        assert_eq!(out.row(t - 16), &want[..], "{name}: position {t}");
    }
}
