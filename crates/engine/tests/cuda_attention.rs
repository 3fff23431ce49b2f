//! CUDA paged attention (kernels/attention.cu and its launches) against the CPU backend's,
//! through the `Backend` trait: on the emulator in both thread orders, and on a GPU when
//! present.
//!
//! Both sides fill bf16 K/V pools by `write_kv` from the same f32 QKV rows, so they attend
//! over the same bits with the same f32 q; outputs differ only by summation order, the
//! exponentials and the online softmax's rescaling (relative error around 1e-6). f32 outputs
//! must agree within 1e-4 absolute plus 1e-4 relative: ten times less than one key too many
//! or too few moves an output over a 1000-key context (about |v| / 1000, |v| up to 2). bf16
//! outputs may also differ by one rounding step (2^-7 relative).
//!
//! The tensor-core prefill kernels (head_dim 64 and 128, attention_prefill.cu) round q (after
//! scaling) and the softmax weights P to bf16, as FlashAttention does; see [`TENSOR_CORE_ATOL`]
//! for what that costs on random data. [`Data::Exact`] inputs make both roundings exact, so
//! the same kernels are also held to the tolerances above, where a key too many or too few, a
//! wrong row or a wrong split merge cannot hide.

mod cuda_common;

use cuda_common::{assert_close, bf16_round, cpu, random, to_host};
use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::{Arg, Device, DeviceExt, ElemType, LaunchConfig};
use lmi_engine::backend::{AttnScoring, QkvLayout};
use lmi_engine::cpu::{CpuBackend, CpuKv};
use lmi_engine::cuda::step::CudaStep;
use lmi_engine::cuda::{CudaBackend, CudaBuf, CudaKv};
use lmi_engine::{BLOCK_SIZE, Backend, BatchLayout, DType, KvCacheConfig, LogitsWanted, SeqChunk};

/// KV blocks in the pools: a prime, so block ids `i * 101 % POOL` are distinct and scattered.
const POOL: usize = 521;

/// One sequence of a step: its context after the step and how many of those tokens are new
/// (the rest are a cached prefix).
#[derive(Debug, Clone, Copy)]
struct Seq {
    context: usize,
    new: usize,
}

const fn decode(context: usize) -> Seq {
    Seq { context, new: 1 }
}

const fn prefill(context: usize, new: usize) -> Seq {
    Seq { context, new }
}

fn heads(q_heads: usize, kv_heads: usize, head_dim: usize) -> QkvLayout {
    QkvLayout {
        q_heads,
        kv_heads,
        head_dim,
    }
}

fn chunks(seqs: &[Seq]) -> Vec<SeqChunk> {
    let mut next = 0;
    let chunks = seqs
        .iter()
        .map(|s| {
            let blocks = s.context.div_ceil(BLOCK_SIZE);
            let block_table = (next..next + blocks)
                .map(|i| (i * 101 % POOL) as u32)
                .collect();
            next += blocks;
            SeqChunk {
                tokens: vec![1; s.new],
                start_pos: s.context - s.new,
                block_table,
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            }
        })
        .collect();
    assert!(next <= POOL, "the test's sequences need {next} blocks");
    chunks
}

/// The K and V pools of one layer on both backends.
struct Pools<D: Device> {
    ql: QkvLayout,
    cpu: (CpuKv, CpuKv),
    gpu: (CudaKv<D>, CudaKv<D>),
}

impl<D: Device> Pools<D> {
    fn new(c: &CpuBackend, g: &CudaBackend<D>, ql: QkvLayout) -> Self {
        let cfg = KvCacheConfig {
            num_blocks: POOL,
            num_layers: 1,
            num_kv_heads: ql.kv_heads,
            head_dim: ql.head_dim,
            dtype: DType::BF16,
        };
        Pools {
            ql,
            cpu: (c.alloc_kv(&cfg).unwrap(), c.alloc_kv(&cfg).unwrap()),
            gpu: (g.alloc_kv(&cfg).unwrap(), g.alloc_kv(&cfg).unwrap()),
        }
    }

    /// Writes the K/V of every sequence's cached prefix, on both sides.
    fn write_prefixes(
        &mut self,
        c: &CpuBackend,
        g: &CudaBackend<D>,
        chunks: &[SeqChunk],
        seed: u64,
        data: Data,
    ) {
        let prefixes: Vec<SeqChunk> = chunks
            .iter()
            .filter(|s| s.start_pos > 0)
            .map(|s| SeqChunk {
                tokens: vec![1; s.start_pos],
                start_pos: 0,
                ..s.clone()
            })
            .collect();
        if prefixes.is_empty() {
            return;
        }
        let l = BatchLayout::new(&prefixes, POOL).unwrap();
        let qkv = qkv_rows(l.num_tokens(), self.ql, seed, data);
        self.write(
            c,
            &l,
            &qkv,
            g,
            &g.upload_step(&l).unwrap(),
            &g.upload_f32(&qkv).unwrap(),
        );
    }

    /// `write_kv` of a step on both sides (the CUDA step may be a padded copy of `l`).
    fn write(
        &mut self,
        c: &CpuBackend,
        l: &BatchLayout,
        qkv: &Vec<f32>,
        g: &CudaBackend<D>,
        step: &CudaStep,
        gqkv: &CudaBuf,
    ) {
        let (ck, cv) = &mut self.cpu;
        c.write_kv(qkv, &c.upload_step(l).unwrap(), self.ql, ck, cv)
            .unwrap();
        let (gk, gv) = &mut self.gpu;
        g.write_kv(gqkv, step, self.ql, gk, gv).unwrap();
    }
}

fn scale(ql: QkvLayout) -> f32 {
    1.0 / (ql.head_dim as f32).sqrt()
}

/// The model's scoring over the last `window` keys (all of them when `None`).
fn scoring<W: ?Sized>(ql: QkvLayout, window: Option<usize>) -> AttnScoring<'static, W> {
    AttnScoring {
        window,
        ..AttnScoring::plain(scale(ql))
    }
}

fn plain<W: ?Sized>(ql: QkvLayout) -> AttnScoring<'static, W> {
    scoring(ql, None)
}

/// How a test fills q, K and V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Data {
    /// Everything uniform in [-2, 2).
    Random,
    /// V uniform in [-2, 2); K in {-1, 0, 1}; q sparse in {-1, 0, 1} divided by the factor the
    /// kernels scale q by (scale · log2(e), computed as they compute it), so q after scaling is
    /// exact in bf16 and every score is a small integer in base 2: the softmax weights are
    /// powers of two, exact in bf16 too.
    Exact,
}

/// QKV rows for `tokens` tokens.
fn qkv_rows(tokens: usize, ql: QkvLayout, seed: u64, data: Data) -> Vec<f32> {
    let mut rows = random(tokens * ql.row_width(), seed, 2.0);
    if data == Data::Exact {
        let q_factor = scale(ql) * std::f32::consts::LOG2_E;
        let v = ql.v_offset();
        for row in rows.chunks_mut(ql.row_width()) {
            // A quarter of q's values and two thirds of K's are ±1, the others 0: scores of a
            // few units, so the weights spread over several keys.
            let ternary = |x: f32, zero_below: f32| {
                if x.abs() < zero_below {
                    0.0
                } else {
                    x.signum()
                }
            };
            for x in &mut row[..ql.k_offset()] {
                *x = ternary(*x, 1.5) / q_factor;
            }
            for x in &mut row[ql.k_offset()..v] {
                *x = ternary(*x, 2.0 / 3.0);
            }
        }
    }
    rows
}

/// Tolerance for the tensor-core prefill kernels on [`Data::Random`]: q (after scaling) and
/// the softmax weights are rounded to bf16 (8 significant bits, relative error up to 2^-9
/// each), so each weight of the average is off by a relative ~2^-9 (both roundings) and an
/// output, an average of values up to |v| = 2, moves by that times the values' spread. With
/// few keys nothing averages out: 8e-3 is the largest difference over this file's cases.
/// Allowed: one bf16 rounding step (2^-7) of the largest |v|, as the bf16 paths allow one
/// step of their values; plus the tolerances above.
const TENSOR_CORE_ATOL: f32 = 2.0 / 128.0;

/// Whether `attention::run` takes the tensor-core prefill kernels for this step.
fn on_tensor_cores(ql: QkvLayout, seqs: &[Seq]) -> bool {
    matches!(ql.head_dim, 64 | 128) && seqs.iter().any(|s| s.new > 1)
}

/// The CPU backend's attention output for step `l`.
fn cpu_attention<D: Device>(
    c: &CpuBackend,
    pools: &Pools<D>,
    l: &BatchLayout,
    ql: QkvLayout,
    qkv: &Vec<f32>,
) -> Vec<f32> {
    cpu_window_attention(c, pools, l, ql, qkv, None)
}

/// [`cpu_attention`] with a sliding window, when given.
fn cpu_window_attention<D: Device>(
    c: &CpuBackend,
    pools: &Pools<D>,
    l: &BatchLayout,
    ql: QkvLayout,
    qkv: &Vec<f32>,
    window: Option<usize>,
) -> Vec<f32> {
    cpu_scored_attention(c, pools, l, ql, qkv, window, None, None)
}

/// [`cpu_window_attention`] with per-head attention sinks and per-token limits past the
/// tokens' own positions (`through`), when given.
#[allow(clippy::too_many_arguments)]
fn cpu_scored_attention<D: Device>(
    c: &CpuBackend,
    pools: &Pools<D>,
    l: &BatchLayout,
    ql: QkvLayout,
    qkv: &Vec<f32>,
    window: Option<usize>,
    sinks: Option<&[f32]>,
    through: Option<&[u32]>,
) -> Vec<f32> {
    let mut want = c.alloc(l.num_tokens() * ql.q_heads * ql.head_dim).unwrap();
    let (ck, cv) = &pools.cpu;
    let step = c.upload_step(l).unwrap();
    let sinks = sinks.map(|v| {
        c.upload_weight(HostTensor::f32(vec![v.len()], v.to_vec()))
            .unwrap()
    });
    let scoring = AttnScoring {
        sinks: sinks.as_ref(),
        through,
        ..scoring(ql, window)
    };
    c.attention(qkv, &step, ql, ck, cv, scoring, &mut want)
        .unwrap();
    want
}

/// `bf16_products`: outputs of the tensor-core kernels on [`Data::Random`].
#[track_caller]
fn compare(what: &str, got: &[f32], want: &[f32], out: ElemType, bf16_products: bool) {
    let atol = |tight: f32| {
        if bf16_products {
            TENSOR_CORE_ATOL
        } else {
            tight
        }
    };
    match out {
        ElemType::F32 => assert_close(what, got, want, atol(1e-4), 1e-4),
        ElemType::BF16 => assert_close(what, got, &bf16_round(want), atol(1e-6), 1.0 / 128.0),
    }
}

fn alloc_out<D: Device>(g: &CudaBackend<D>, len: usize, out: ElemType) -> CudaBuf {
    match out {
        ElemType::F32 => g.alloc(len).unwrap(),
        ElemType::BF16 => g.alloc_matmul_input(len).unwrap(),
    }
}

/// One step of `seqs` on both backends, random data; the outputs must agree.
#[track_caller]
fn check<D: Device>(g: &CudaBackend<D>, ql: QkvLayout, seqs: &[Seq], out: ElemType) {
    check_data(g, ql, seqs, out, Data::Random)
}

#[track_caller]
fn check_data<D: Device>(
    g: &CudaBackend<D>,
    ql: QkvLayout,
    seqs: &[Seq],
    out: ElemType,
    data: Data,
) {
    check_window(g, ql, seqs, out, data, None)
}

#[track_caller]
fn check_window<D: Device>(
    g: &CudaBackend<D>,
    ql: QkvLayout,
    seqs: &[Seq],
    out: ElemType,
    data: Data,
    window: Option<usize>,
) {
    check_scoring(g, ql, seqs, out, data, window, None, &[])
}

/// A run of a step's new tokens that see each other both ways (an image of Gemma 4 in its
/// sliding layers): sequence `seq`'s new tokens `tokens` (offsets into its chunk).
#[derive(Debug, Clone)]
struct Image {
    seq: usize,
    tokens: std::ops::Range<usize>,
}

/// Per token of `l`, the last position it sees (`AttnScoring::through`): the last of its
/// image's, else its own.
fn through(l: &BatchLayout, seqs: &[Seq], images: &[Image]) -> Vec<u32> {
    let mut th = l.positions.clone();
    for im in images {
        let first: usize = seqs[..im.seq].iter().map(|s| s.new).sum();
        let rows = first + im.tokens.start..first + im.tokens.end;
        let last = l.positions[rows.end - 1];
        th[rows].fill(last);
    }
    th
}

/// [`check_window`] with per-head attention sinks and images seen both ways, when given.
#[track_caller]
#[allow(clippy::too_many_arguments)]
fn check_scoring<D: Device>(
    g: &CudaBackend<D>,
    ql: QkvLayout,
    seqs: &[Seq],
    out: ElemType,
    data: Data,
    window: Option<usize>,
    sinks: Option<&[f32]>,
    images: &[Image],
) {
    let what = format!(
        "{ql:?}, {seqs:?}, {out:?} out, {data:?} data, window {window:?}, sinks {}, \
         images {images:?}",
        sinks.is_some()
    );
    let c = cpu();
    let mut pools = Pools::new(&c, g, ql);
    let chunks = chunks(seqs);
    pools.write_prefixes(&c, g, &chunks, 1, data);
    let l = BatchLayout::new(&chunks, POOL).unwrap();
    let qkv = qkv_rows(l.num_tokens(), ql, 2, data);
    let step = g.upload_step(&l).unwrap();
    let gqkv = g.upload_f32(&qkv).unwrap();
    pools.write(&c, &l, &qkv, g, &step, &gqkv);
    let th = (!images.is_empty()).then(|| through(&l, seqs, images));
    let want = cpu_scored_attention(&c, &pools, &l, ql, &qkv, window, sinks, th.as_deref());
    if th.is_some() {
        // The images change what the CPU computes: a causal kernel cannot pass.
        let causal = cpu_scored_attention(&c, &pools, &l, ql, &qkv, window, sinks, None);
        let moved = want.iter().zip(&causal).any(|(a, b)| (a - b).abs() > 0.05);
        assert!(moved, "{what}: the images do not move the output");
    }

    let mut got = alloc_out(g, want.len(), out);
    let (gk, gv) = &pools.gpu;
    let gsinks = sinks.map(|v| {
        g.upload_weight(HostTensor::f32(vec![v.len()], v.to_vec()))
            .unwrap()
    });
    let scoring = AttnScoring {
        sinks: gsinks.as_ref(),
        through: th.as_deref(),
        ..scoring(ql, window)
    };
    g.attention(&gqkv, &step, ql, gk, gv, scoring, &mut got)
        .unwrap();
    // Windowed steps, steps with sinks and with images never take the tensor cores.
    let bf16_products = data == Data::Random
        && window.is_none()
        && sinks.is_none()
        && th.is_none()
        && on_tensor_cores(ql, seqs);
    compare(&what, &to_host(g, &got), &want, out, bf16_products);
}

fn check_decode_contexts<D: Device>(g: &CudaBackend<D>) {
    // Around the KV block boundary, and beyond one 64-key chunk.
    let seqs = [decode(1), decode(15), decode(16), decode(17), decode(100)];
    for hd in [64, 128] {
        check(g, heads(8, 2, hd), &seqs, ElemType::F32);
    }
    check(g, heads(8, 2, 128), &seqs, ElemType::BF16);
}

fn check_split_contexts<D: Device>(g: &CudaBackend<D>) {
    // Few blocks and long contexts: the keys are split (7 and 5 ways here) and merged.
    for hd in [64, 128] {
        check(
            g,
            heads(8, 2, hd),
            &[decode(1000), decode(300)],
            ElemType::F32,
        );
        check(g, heads(8, 2, hd), &[prefill(720, 20)], ElemType::F32);
    }
    check(
        g,
        heads(8, 2, 128),
        &[decode(1000), decode(300)],
        ElemType::BF16,
    );
}

fn check_sliding_windows<D: Device>(g: &CudaBackend<D>) {
    // Windows inside one KV block, across blocks, over a 64-key chunk and beyond a split's
    // 128 keys; decode and prefill tiles, contexts shorter and longer than the window, and a
    // long context whose keys would otherwise split many ways.
    let seqs = [
        decode(1),
        decode(9),
        decode(100),
        decode(1000),
        prefill(40, 40),
        prefill(300, 20),
    ];
    for w in [1, 8, 16, 100, 300] {
        for hd in [16, 64, 128] {
            check_window(
                g,
                heads(8, 2, hd),
                &seqs,
                ElemType::F32,
                Data::Random,
                Some(w),
            );
        }
    }
    check_window(
        g,
        heads(4, 1, 256),
        &seqs,
        ElemType::BF16,
        Data::Random,
        Some(100),
    );
    // Exact data: one key too many or too few cannot hide.
    check_window(
        g,
        heads(8, 2, 64),
        &[decode(1000), prefill(720, 20)],
        ElemType::F32,
        Data::Exact,
        Some(130),
    );
}

/// gpt-oss's per-head sinks: decode tiles over one split and over several (split 0 alone
/// starts from the sink; the merge must count it once), prefill tiles, a padded head size,
/// with and without a window; sinks from well below to well above the scores.
fn check_attention_sinks<D: Device>(g: &CudaBackend<D>) {
    let seqs = [
        decode(1),
        decode(100),
        decode(1000),
        prefill(40, 40),
        prefill(300, 20),
    ];
    for (hd, q_heads) in [(64, 8), (16, 4)] {
        let sinks: Vec<f32> = (0..q_heads).map(|h| h as f32 * 1.5 - 4.0).collect();
        for window in [None, Some(100)] {
            let ql = heads(q_heads, 2, hd);
            check_scoring(
                g,
                ql,
                &seqs,
                ElemType::F32,
                Data::Random,
                window,
                Some(&sinks),
                &[],
            );
        }
    }
    let sinks: Vec<f32> = (0..8).map(|h| 8.0 - h as f32).collect();
    check_scoring(
        g,
        heads(8, 2, 64),
        &[decode(1000), prefill(720, 20)],
        ElemType::BF16,
        Data::Exact,
        None,
        Some(&sinks),
        &[],
    );
}

/// Gemma 4's images in its sliding layers: an image's tokens see the whole image (the
/// window counted back from each token's own position), the others stay causal. Images
/// inside one 16-token tile and across tiles, longer than the window and shorter, at the
/// chunk's end and before text, after a cached prefix whose keys split several ways, beside
/// decode rows; GQA groups of 1 to 4; padded, tensor-core and 512-wide head sizes.
fn check_images_both_ways<D: Device>(g: &CudaBackend<D>) {
    let im = |seq, tokens| Image { seq, tokens };
    let seqs = [prefill(40, 40), decode(30), prefill(700, 60), decode(300)];
    let images = [im(0, 3..9), im(0, 12..37), im(2, 5..60)];
    for window in [None, Some(8), Some(100)] {
        for (q_heads, kv_heads, hd) in [(4, 2, 16), (8, 2, 64), (4, 4, 128), (4, 1, 512)] {
            let ql = heads(q_heads, kv_heads, hd);
            let data = Data::Random;
            check_scoring(g, ql, &seqs, ElemType::F32, data, window, None, &images);
        }
    }
    // Exact data: one key too many or too few cannot hide; bf16 output.
    let ql = heads(8, 2, 64);
    for out in [ElemType::F32, ElemType::BF16] {
        let data = Data::Exact;
        check_scoring(g, ql, &seqs, out, data, Some(8), None, &images);
    }
}

fn check_ragged_batches<D: Device>(g: &CudaBackend<D>) {
    // A prompt from position 0 (tiles of 16, 16, 8), a chunk after a cached prefix, and
    // decode rows, over GQA groups of 1, 3, 4 and 8.
    let seqs = [
        prefill(40, 40),
        prefill(57, 20),
        decode(1),
        decode(17),
        decode(100),
    ];
    for (q_heads, kv_heads) in [(2, 2), (6, 2), (8, 2), (16, 2)] {
        for hd in [64, 128] {
            check(g, heads(q_heads, kv_heads, hd), &seqs, ElemType::F32);
        }
    }
    // One long row splits every tile's keys; the short tiles' later splits are empty.
    let long = [prefill(40, 40), prefill(57, 20), decode(600)];
    check(g, heads(8, 2, 128), &long, ElemType::F32);
    check(g, heads(8, 2, 64), &long, ElemType::BF16);
}

fn check_large_groups<D: Device>(g: &CudaBackend<D>) {
    // More rows than a pass holds: groups of 16 (two decode passes, four prefill passes),
    // and of 5 (a prefill pass boundary inside a token's heads).
    for (q_heads, kv_heads) in [(16, 1), (10, 2)] {
        let ql = heads(q_heads, kv_heads, 128);
        check(
            g,
            ql,
            &[prefill(40, 40), decode(33), decode(300)],
            ElemType::F32,
        );
        check(g, ql, &[decode(33), decode(300)], ElemType::F32);
    }
}

fn check_tensor_core_tiling<D: Device>(g: &CudaBackend<D>) {
    // Prompts from position 0 and chunks after cached prefixes, of lengths off the 16-token
    // tiles and the 64-key chunks, beside a decode row (which then takes the prefill kernel),
    // over GQA groups 1 to 8: one to eight row tiles per pass, and two passes at 5 to 8.
    let seqs = [
        prefill(5, 5),
        prefill(17, 17),
        prefill(100, 37),
        prefill(130, 65),
        decode(70),
    ];
    for group in 1..=8 {
        for hd in [64, 128] {
            let ql = heads(2 * group, 2, hd);
            check_data(g, ql, &seqs, ElemType::F32, Data::Exact);
        }
    }
    // Long contexts after cached prefixes: the keys are split (7 ways) and merged.
    for (q_heads, kv_heads) in [(4, 1), (8, 2), (24, 8)] {
        let ql = heads(q_heads, kv_heads, 128);
        check_data(g, ql, &[prefill(1000, 40)], ElemType::F32, Data::Exact);
    }
    let ql = heads(8, 2, 64);
    let seqs = [prefill(1000, 40), prefill(200, 3)];
    check_data(g, ql, &seqs, ElemType::BF16, Data::Exact);
    check_data(g, heads(6, 2, 128), &seqs[..1], ElemType::BF16, Data::Exact);
}

fn check_other_head_dims<D: Device>(g: &CudaBackend<D>) {
    // The 256-wide kernels, zero-padded for smaller head sizes; the 512-wide ones (Gemma 4's
    // global heads), zero-padded for those over 256.
    for hd in [32, 96, 256, 264, 512] {
        let ql = heads(4, 2, hd);
        check(
            g,
            ql,
            &[prefill(30, 20), decode(50), decode(300)],
            ElemType::F32,
        );
        check(g, ql, &[decode(20), decode(290)], ElemType::F32);
    }
}

fn check_padded_decode_graphs<D: Device>(g: &CudaBackend<D>) {
    // Three decode steps of one graph key (3 sequences padded to 4, tables padded to 16
    // blocks) with different contexts: run directly, captured, then replayed. Each must match
    // the CPU, and the padding row must be zeros.
    let steps: [&[usize]; 3] = [&[5, 40, 200], &[100, 3, 256], &[17, 250, 64]];
    check_graph_steps(g, heads(8, 2, 128), &steps, None);
}

/// Decode steps of one graph key, in order: the first runs directly, the second is captured,
/// the others replay it. `width` pads the first sequence's block table (with block 0, never
/// read) so the key's stride is at least that; otherwise the stride follows the longest
/// context. Each step must match the CPU, and the padding rows must be zeros. On a backend
/// of its own (on `g`'s device): graphs are keyed by shape, not by what they launch.
#[track_caller]
fn check_graph_steps<D: Device>(
    g: &CudaBackend<D>,
    ql: QkvLayout,
    steps: &[&[usize]],
    width: Option<usize>,
) {
    let g = &CudaBackend::with_graphs(g.device().clone(), true).unwrap();
    let c = cpu();
    let mut pools = Pools::new(&c, g, ql);
    let row = ql.q_heads * ql.head_dim;
    let captured = g.graphs_captured();
    let mut key = None;
    for (i, contexts) in steps.iter().enumerate() {
        let what = format!("graph step {i} {contexts:?}, table width {width:?}");
        let seqs: Vec<Seq> = contexts.iter().map(|&n| decode(n)).collect();
        let mut chunks = chunks(&seqs);
        if let Some(w) = width {
            chunks[0].block_table.resize(w, 0);
        }
        pools.write_prefixes(&c, g, &chunks, 10 + i as u64, Data::Random);
        let l = BatchLayout::new(&chunks, POOL).unwrap();
        let padded = g.prepare_layout(l.clone());
        let n = l.num_tokens();
        assert!(padded.num_tokens() >= n, "{what}");
        let shape = (padded.num_tokens(), padded.max_blocks);
        assert!(key.is_none_or(|k| k == shape), "{what}: one graph key");
        key = Some(shape);
        // The padding rows' q is garbage the kernel must not use.
        let qkv = random(padded.num_tokens() * ql.row_width(), 20 + i as u64, 2.0);
        let step = g.upload_step(&padded).unwrap();
        assert!(step.graph_key.is_some(), "{what}: a graph-keyed step");
        let gqkv = g.upload_f32(&qkv).unwrap();
        let real = qkv[..n * ql.row_width()].to_vec();
        pools.write(&c, &l, &real, g, &step, &gqkv);
        let want = cpu_attention(&c, &pools, &l, ql, &real);

        let (gk, gv) = &pools.gpu;
        let out = g
            .run_graph(&step, || {
                let mut out = g.alloc(padded.num_tokens() * row)?;
                g.attention(&gqkv, &step, ql, gk, gv, plain(ql), &mut out)?;
                Ok(out)
            })
            .unwrap();
        let got = to_host(g, &out);
        compare(&what, &got[..n * row], &want, ElemType::F32, false);
        assert!(
            got[n * row..].iter().all(|&v| v == 0.0),
            "{what}: the padding rows are not zeros"
        );
    }
    assert_eq!(
        g.graphs_captured() - captured,
        1,
        "the steps after the second replay one graph"
    );
}

fn check_wide_graph_keys<D: Device>(g: &CudaBackend<D>) {
    // Tables 512 blocks wide: the launch has 64 splits at batch 1 (two KV heads) and 33 at
    // batch 4, whatever the contexts; each tile uses one per 128 keys it sees. Short contexts
    // (one split: no partials, nothing merged), a few splits, and many, in one graph.
    let ql = heads(8, 2, 128);
    let batch1: [&[usize]; 5] = [&[300], &[100], &[4000], &[255], &[256]];
    check_graph_steps(g, ql, &batch1, Some(512));
    // Long and short rows mixed in one step (each tile its own count), and a step where no
    // row needs a split.
    let batch3: [&[usize]; 4] = [
        &[5, 300, 100],
        &[256, 17, 255],
        &[129, 384, 3000],
        &[1, 40, 250],
    ];
    check_graph_steps(g, ql, &batch3, Some(512));
    check_graph_steps(g, heads(4, 2, 64), &batch3, Some(512));
}

fn check_mixed_split_rows<D: Device>(g: &CudaBackend<D>) {
    // Without a graph key the launch's bound follows the longest row (2000 keys: 15 splits);
    // the other rows use 1, 1, 2, 1, 2 and 1.
    let seqs = [
        decode(2000),
        decode(100),
        decode(300),
        decode(255),
        decode(256),
        decode(1),
    ];
    for hd in [64, 128] {
        check(g, heads(8, 2, hd), &seqs, ElemType::F32);
    }
    check(g, heads(8, 2, 128), &seqs, ElemType::BF16);
    check(g, heads(4, 2, 96), &seqs, ElemType::F32);
    // Prefill tiles: each counts the keys of its furthest token (the first tiles of a chunk
    // after a 1000-token prefix use 7 splits, a 3-token chunk at 200 one).
    let seqs = [prefill(1000, 40), prefill(200, 3), decode(50), decode(600)];
    for hd in [64, 128] {
        check_data(g, heads(8, 2, hd), &seqs, ElemType::F32, Data::Exact);
    }
    check(g, heads(4, 2, 96), &seqs, ElemType::F32);
}

fn check_split_boundaries<D: Device>(g: &CudaBackend<D>) {
    // Contexts on both sides of each split count: 1 split below 256 keys, 2 from 256, 3 from
    // 384, 4 from 512 (the bound of this 20-block launch), then the same rows under a
    // 512-block graph key (bound 8, reached at 1024 keys).
    let contexts = [127, 128, 255, 256, 257, 383, 384, 385, 511, 512];
    let seqs: Vec<Seq> = contexts.iter().map(|&n| decode(n)).collect();
    check(g, heads(8, 2, 128), &seqs, ElemType::F32);
    check(g, heads(8, 2, 64), &seqs, ElemType::BF16);
    let steps: [&[usize]; 3] = [
        &contexts,
        &[1023, 1024, 1100, 640, 639, 130, 2, 896, 895, 50],
        &[512, 511, 384, 383, 256, 255, 128, 127, 1, 2],
    ];
    check_graph_steps(g, heads(8, 2, 128), &steps, Some(512));
}

/// The split protocol kernel by kernel, launched here with 8 splits: a tile uses one per 128
/// keys its furthest token sees. Tiles of one split write their output and no partials; the
/// others write partials for exactly their splits (the rest of the scratch keeps its
/// sentinel), and the last of their blocks merges them into the output within the same
/// launch, leaving the tile's counter at zero for the next. The result must match the CPU
/// (the emulator runs the blocks in both orders, so either end of a tile's splits merges);
/// the partial rows written are counted against the 8 per row the launch bounds.
fn check_split_protocol<D: Device>(g: &CudaBackend<D>) {
    const BOUND: usize = 8;
    const SENTINEL: u32 = 0x7fba_dbad;
    let dev = g.device();
    // (kernel, head_dim, its dynamic shared memory, sequences): the decode kernel over one
    // token per tile, the tensor-core prefill kernel over tiles of up to 16.
    let cases = [
        (
            "attention_decode_hd128_f32",
            128,
            40_608,
            vec![
                decode(1),
                decode(255),
                decode(256),
                decode(300),
                decode(1000),
                decode(1200),
            ],
        ),
        (
            "attention_prefill_hd64_f32",
            64,
            48_000,
            vec![
                prefill(1000, 40),
                prefill(300, 20),
                prefill(100, 3),
                prefill(40, 40),
            ],
        ),
    ];
    for (kernel, hd, shared, seqs) in cases {
        let what = format!("{kernel} over {seqs:?}");
        let ql = heads(8, 2, hd);
        let c = cpu();
        let mut pools = Pools::new(&c, g, ql);
        let chunks = chunks(&seqs);
        pools.write_prefixes(&c, g, &chunks, 1, Data::Exact);
        let l = BatchLayout::new(&chunks, POOL).unwrap();
        let qkv = qkv_rows(l.num_tokens(), ql, 2, Data::Exact);
        let step = g.upload_step(&l).unwrap();
        let gqkv = g.upload_f32(&qkv).unwrap();
        pools.write(&c, &l, &qkv, g, &step, &gqkv);
        let want = cpu_attention(&c, &pools, &l, ql, &qkv);

        // Each token's tile's split count, by the rule (16-token tiles per sequence).
        let mut splits_of_token = Vec::new();
        let mut tiles = 0;
        for s in &seqs {
            let first = s.context - s.new;
            for t0 in (0..s.new).step_by(16) {
                let count = (s.new - t0).min(16);
                let keys = first + t0 + count;
                tiles += 1;
                splits_of_token.extend(std::iter::repeat_n((keys / 128).clamp(1, BOUND), count));
            }
        }
        assert_eq!(tiles, step.num_tiles, "{what}");
        let tokens = l.num_tokens();
        let rows = tokens * ql.q_heads;
        let (out_len, o_len, ml_len) = (rows * hd, BOUND * rows * hd, BOUND * rows * 2);
        let alloc = |words: usize| {
            let p = dev.alloc(words * 4).unwrap();
            dev.htod_slice(&vec![SENTINEL; words], p).unwrap();
            p
        };
        let (out, part_o, part_ml) = (alloc(out_len), alloc(o_len), alloc(ml_len));
        let (gk, gv) = &pools.gpu;
        let f = dev.function(kernel).unwrap();
        let cfg = LaunchConfig {
            grid: (step.num_tiles as u32, ql.kv_heads as u32, BOUND as u32),
            block: (256, 1, 1),
            shared_mem_bytes: shared,
        };
        // The step upload zeroes the counters; each launch must leave them at zero.
        let counters = step.tile_counters;
        let mut args: Vec<Arg> = vec![
            out.into(),
            part_o.into(),
            part_ml.into(),
            counters.into(),
            gqkv.ptr.into(),
            gk.ptr().into(),
            gv.ptr().into(),
            step.tiles.into(),
            step.positions.into(),
            step.context_lens.into(),
            step.block_tables.into(),
            Arg::U32(step.block_stride as u32),
            Arg::U32(tokens as u32),
            Arg::U32(ql.q_heads as u32),
            Arg::U32(ql.kv_heads as u32),
            Arg::U32(hd as u32),
            Arg::F32(scale(ql)),
        ];
        if kernel.starts_with("attention_decode") {
            // attention.cu's kernels: no window, no sinks, no limits past the positions
            args.push(Arg::U32(0));
            args.push(Arg::Ptr(lmi_cuda::DevPtr::NULL));
            args.push(Arg::Ptr(lmi_cuda::DevPtr::NULL));
        }
        dev.launch(f, &cfg, &args).unwrap();
        let got_out: Vec<u32> = dev.dtoh_vec(out, out_len).unwrap();
        let got_o: Vec<u32> = dev.dtoh_vec(part_o, o_len).unwrap();
        let got_ml: Vec<u32> = dev.dtoh_vec(part_ml, ml_len).unwrap();
        let mut partial_rows = 0;
        for (row, n) in (0..rows).map(|r| (r, splits_of_token[r / ql.q_heads])) {
            let written = |v: &[u32]| v.iter().all(|&w| w != SENTINEL);
            let untouched = |v: &[u32]| v.iter().all(|&w| w == SENTINEL);
            let out_row = &got_out[row * hd..(row + 1) * hd];
            assert!(written(out_row), "{what}: row {row} ({n} splits): output");
            for split in 0..BOUND {
                let at = split * rows + row;
                let o = &got_o[at * hd..(at + 1) * hd];
                let ml = &got_ml[2 * at..2 * at + 2];
                let wrote = n > 1 && split < n;
                assert!(
                    if wrote {
                        written(o) && written(ml)
                    } else {
                        untouched(o) && untouched(ml)
                    },
                    "{what}: row {row} ({n} splits): partials of split {split}"
                );
                partial_rows += usize::from(wrote);
            }
        }
        eprintln!(
            "{what}: partial rows written {partial_rows} of the {} the launch bounds",
            BOUND * rows
        );

        let left: Vec<u32> = dev.dtoh_vec(counters, step.num_tiles).unwrap();
        assert!(
            left.iter().all(|&c| c == 0),
            "{what}: tile counters left {left:?}"
        );
        let got: Vec<f32> = dev.dtoh_vec(out, out_len).unwrap();
        compare(&what, &got, &want, ElemType::F32, false);
        // The next layer's launch over the same step merges again from zeroed counters.
        dev.htod_slice(&vec![SENTINEL; out_len], out).unwrap();
        dev.launch(f, &cfg, &args).unwrap();
        let got: Vec<f32> = dev.dtoh_vec(out, out_len).unwrap();
        compare(&what, &got, &want, ElemType::F32, false);
        for p in [out, part_o, part_ml] {
            dev.free(p);
        }
    }
}

/// A KV pool past 2^32 elements: 4 KV heads × 16 tokens × 64 dims = 4,096 elements a block, so
/// block 2^20 + k starts 2^32 elements beyond block k, where 32-bit index arithmetic would
/// land. Two sequences hold blocks above 2^20 and one holds the low blocks they would alias,
/// with other K/V; the CPU attends over the same K/V in a compact pool (its block ids moved
/// down: only the values matter). The device pools are sparse: two of 8 GiB, only the used
/// blocks written (allocations of 1 GiB and more are neither poisoned nor zeroed).
fn check_high_block_ids<D: Device>(g: &CudaBackend<D>) {
    const HIGH: usize = 1 << 20;
    let ql = heads(8, 4, 64);
    let c = cpu();
    let pool = |num_blocks| KvCacheConfig {
        num_blocks,
        num_layers: 1,
        num_kv_heads: ql.kv_heads,
        head_dim: ql.head_dim,
        dtype: DType::BF16,
    };
    let (gpu_blocks, cpu_blocks) = (HIGH + 64, 128);
    let mut pools = Pools {
        ql,
        cpu: (
            c.alloc_kv(&pool(cpu_blocks)).unwrap(),
            c.alloc_kv(&pool(cpu_blocks)).unwrap(),
        ),
        gpu: (
            g.alloc_kv(&pool(gpu_blocks)).unwrap(),
            g.alloc_kv(&pool(gpu_blocks)).unwrap(),
        ),
    };
    // Block ids: high even ones, the low even ones 32-bit arithmetic would alias them to,
    // high odd ones.
    let tables: [Vec<u32>; 3] = [
        (0..19).map(|i| (HIGH + 2 * i) as u32).collect(),
        (0..13).map(|i| 2 * i as u32).collect(),
        (0..3).map(|i| (HIGH + 2 * i + 1) as u32).collect(),
    ];
    // The CPU's ids: high ones moved down past the low ones.
    let compact = |table: &[u32]| -> Vec<u32> {
        table
            .iter()
            .map(|&b| {
                if b as usize >= HIGH {
                    (b as usize - HIGH + 64) as u32
                } else {
                    b
                }
            })
            .collect()
    };
    // A mixed step (prefill kernels) and a decode-only one (decode kernels), each after its
    // prefixes are written: (context, new tokens) per sequence.
    for (step_no, seqs) in [
        [(300, 1), (200, 40), (40, 1)],
        [(301, 1), (201, 1), (41, 1)],
    ]
    .iter()
    .enumerate()
    {
        for prefix in [true, false] {
            let mut gpu_chunks = Vec::new();
            let mut cpu_chunks = Vec::new();
            for (&(context, new), table) in seqs.iter().zip(&tables) {
                let (start, len) = if prefix {
                    (0, context - new)
                } else {
                    (context - new, new)
                };
                let c = SeqChunk {
                    tokens: vec![1; len],
                    start_pos: start,
                    block_table: table.clone(),
                    window_table: Vec::new(),
                    logits: LogitsWanted::Last,
                    adapter: None,
                };
                cpu_chunks.push(SeqChunk {
                    block_table: compact(table),
                    window_table: Vec::new(),
                    ..c.clone()
                });
                gpu_chunks.push(c);
            }
            let gl = BatchLayout::new(&gpu_chunks, gpu_blocks).unwrap();
            let cl = BatchLayout::new(&cpu_chunks, cpu_blocks).unwrap();
            let seed = 70 + 2 * step_no as u64 + u64::from(prefix);
            let qkv = random(gl.num_tokens() * ql.row_width(), seed, 2.0);
            let step = g.upload_step(&gl).unwrap();
            let gqkv = g.upload_f32(&qkv).unwrap();
            pools.write(&c, &cl, &qkv, g, &step, &gqkv);
            if prefix {
                continue;
            }
            let want = cpu_attention(&c, &pools, &cl, ql, &qkv);
            let mut got = g.alloc(want.len()).unwrap();
            let (gk, gv) = &pools.gpu;
            g.attention(&gqkv, &step, ql, gk, gv, plain(ql), &mut got)
                .unwrap();
            let tensor_cores = seqs.iter().any(|&(_, new)| new > 1);
            compare(
                &format!("block ids above 2^20, step {step_no}"),
                &to_host(g, &got),
                &want,
                ElemType::F32,
                tensor_cores,
            );
        }
    }
}

#[test]
fn block_ids_above_2_pow_20() {
    if cuda_common::in_child() {
        if let Some(dev) = cuda_common::driver() {
            check_high_block_ids(&CudaBackend::with_graphs(dev, true).unwrap());
        }
        return;
    }
    if !cuda_common::emulator_orders().is_empty() {
        let dev = std::sync::Arc::new(lmi_cuda_emu::EmuDevice::with_total_memory(20 << 30));
        check_high_block_ids(&CudaBackend::with_graphs(dev, true).unwrap());
    }
    // The driver's device needs room for the two 8 GiB pools: in a process of its own.
    cuda_common::run_in_child(
        "block_ids_above_2_pow_20",
        &[("LMI_FAKE_CUDA_MEMORY_MB", "20480")],
    );
}

#[test]
fn decode_contexts() {
    on_every_device!(check_decode_contexts);
}

#[test]
fn split_contexts() {
    on_every_device!(check_split_contexts);
}

#[test]
fn sliding_windows() {
    on_every_device!(check_sliding_windows);
}

#[test]
fn attention_sinks() {
    on_every_device!(check_attention_sinks);
}

#[test]
fn images_both_ways() {
    on_every_device!(check_images_both_ways);
}

#[test]
fn ragged_batches() {
    on_every_device!(check_ragged_batches);
}

#[test]
fn large_groups() {
    on_every_device!(check_large_groups);
}

#[test]
fn tensor_core_tiling() {
    on_every_device!(check_tensor_core_tiling);
}

#[test]
fn other_head_dims() {
    on_every_device!(check_other_head_dims);
}

#[test]
fn padded_decode_and_graphs() {
    on_every_device!(check_padded_decode_graphs);
}

#[test]
fn wide_graph_keys_split_by_context() {
    on_every_device!(check_wide_graph_keys);
}

#[test]
fn mixed_split_rows() {
    on_every_device!(check_mixed_split_rows);
}

#[test]
fn split_boundaries() {
    on_every_device!(check_split_boundaries);
}

#[test]
fn split_protocol() {
    on_every_device!(check_split_protocol);
}

/// Batch-1 decode attention of a Llama-3-8B layer (32 q heads, 8 KV heads, head_dim 128) at
/// `contexts`: microseconds per call and the K/V bytes streamed per second.
fn time_decode<D: Device>(g: &CudaBackend<D>, contexts: &[usize], reps: usize) {
    let ql = heads(32, 8, 128);
    for &context in contexts {
        let blocks = context.div_ceil(BLOCK_SIZE);
        let cfg = KvCacheConfig {
            num_blocks: blocks,
            num_layers: 1,
            num_kv_heads: ql.kv_heads,
            head_dim: ql.head_dim,
            dtype: DType::BF16,
        };
        let (k, v) = (g.alloc_kv(&cfg).unwrap(), g.alloc_kv(&cfg).unwrap());
        let chunk = SeqChunk {
            tokens: vec![1],
            start_pos: context - 1,
            block_table: (0..blocks as u32).rev().collect(),
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter: None,
        };
        let l = g.prepare_layout(BatchLayout::new(&[chunk], blocks).unwrap());
        let step = g.upload_step(&l).unwrap();
        let qkv = g.upload_f32(&random(ql.row_width(), 1, 1.0)).unwrap();
        let mut out = g.alloc_matmul_input(ql.q_heads * ql.head_dim).unwrap();
        let mut run = || {
            g.attention(&qkv, &step, ql, &k, &v, plain(ql), &mut out)
                .unwrap()
        };
        run();
        g.device().synchronize().unwrap();
        let t = std::time::Instant::now();
        for _ in 0..reps {
            run();
        }
        g.device().synchronize().unwrap();
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        let bytes = 2 * context * ql.kv_heads * ql.head_dim * 2;
        println!(
            "batch-1 decode, context {context:>6}: {:8.1} µs, K/V at {:7.1} GB/s",
            secs * 1e6,
            bytes as f64 / secs / 1e9
        );
    }
}

/// On a GPU: `cuda_attention --ignored --nocapture decode_bandwidth`, to read against the
/// device's copy bandwidth (`lmi bench engine --device cuda` reports it).
#[test]
#[ignore = "timing, for a GPU"]
fn decode_bandwidth() {
    match cuda_common::gpu() {
        Some(dev) => time_decode(
            &CudaBackend::with_graphs(dev, false).unwrap(),
            &[1 << 10, 4 << 10, 16 << 10, 64 << 10],
            200,
        ),
        None => eprintln!("decode_bandwidth: no NVIDIA driver here"),
    }
}
