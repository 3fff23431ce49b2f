//! Paged causal attention for a ragged batch: each token attends to its sequence's keys
//! `0 ..= position` (a sliding window: the last `window` of them), read through the block
//! table. One pass per token (prefill chunk or decode alike), all q heads of a GQA group
//! sharing each K/V row load; a lone token over a long context splits its q heads among the
//! threads (each head computed as it would be with the others, so the bits do not move).

use lmi_engine_core::backend::{AttnScoring, QkvLayout};
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::kv::BLOCK_SIZE;
use lmi_engine_core::sampling::fast_exp::exp_nonpositive;

use super::group_scores::group_scores;
use super::simd::{WElem, accumulate_rows_shared};
#[cfg(target_arch = "x86_64")]
use lmi_engine_core::sampling::fast_exp::exp_nonpositive8;

/// How scores become weights, the sinks as f32.
pub type Scoring<'a> = AttnScoring<'a, [f32]>;

pub fn paged_attention<'a, E: WElem>(
    qkv: &[f32],
    layout: &BatchLayout,
    l: QkvLayout,
    k_cache: &'a [E],
    v_cache: &'a [E],
    scoring: Scoring<'_>,
    out: &mut [f32],
) {
    let Scoring {
        scale,
        window,
        sinks,
        through,
    } = scoring;
    let d = l.head_dim;
    let group = l.q_heads / l.kv_heads;
    let width = l.q_heads * d;
    // Token t's q heads h0 .. h0 + nh into `o` (nh heads wide).
    let heads = |t: usize, h0: usize, nh: usize, o: &mut [f32]| {
        let seq = layout.token_seq[t] as usize;
        // Keys `lo .. ctx` are attended: blocks from `b0` on are read, and the scores of the
        // `skip` keys of block b0 before `lo` are zero.
        let (lo, ctx) = keys(layout, t, window, through);
        let b0 = lo / BLOCK_SIZE;
        let (span, skip) = (ctx - b0 * BLOCK_SIZE, lo - b0 * BLOCK_SIZE);
        let table = layout.block_table(seq);
        let row = &qkv[t * l.row_width()..(t + 1) * l.row_width()];
        let mut scores = vec![0.0f32; nh * span];
        let blocks = ctx.div_ceil(BLOCK_SIZE);
        // The kv heads these q heads read, and each one's q heads (first, count) from h0.
        let kv = h0 / group..(h0 + nh).div_ceil(group);
        let part = |g: usize| {
            let a = (g * group).max(h0);
            (a - h0, ((g + 1) * group).min(h0 + nh) - a)
        };
        // Rows of kv head `g` in the b-th block of the sequence (all of them, or up to ctx).
        let rows = |cache: &'a [E], g: usize, b: usize| -> &'a [E] {
            let start = ((table[b] as usize * l.kv_heads + g) * BLOCK_SIZE) * d;
            &cache[start..][..(ctx - b * BLOCK_SIZE).min(BLOCK_SIZE) * d]
        };
        // The block's rows of those kv heads: one contiguous run, so blocks go outermost.
        let block = |cache: &'a [E], b: usize| -> &'a [E] {
            let start = (table[b] as usize * l.kv_heads + kv.start) * BLOCK_SIZE * d;
            &cache[start..][..kv.len() * BLOCK_SIZE * d]
        };
        // The values are read after the softmax: where they fit in L2 they are asked for
        // during the scores, else (a long context) a block ahead of their sums.
        let v_bytes = (blocks - b0) * std::mem::size_of_val(block(v_cache, b0));
        let v_early = v_bytes <= V_EARLY_BYTES;
        for b in b0..blocks {
            if b + 1 < blocks {
                prefetch::<{ HINT_L1 }, E>(block(k_cache, b + 1));
            }
            if v_early {
                prefetch::<{ HINT_L2 }, E>(block(v_cache, b));
            }
            for g in kv.clone() {
                // Keys of one block are contiguous: the group's heads share each key load.
                let (a, c) = part(g);
                let keys = rows(k_cache, g, b);
                let s = &mut scores[a * span + (b - b0) * BLOCK_SIZE..];
                let q = &row[(h0 + a) * d..(h0 + a + c) * d];
                group_scores(q, d, keys, keys.len() / d, scale, s, span);
            }
        }
        for (h, s) in scores.chunks_mut(span).enumerate() {
            s[..skip].fill(0.0);
            softmax(&mut s[skip..], sinks.map(|k| k[h0 + h]));
        }
        o.fill(0.0);
        for b in b0..blocks {
            if b + 1 < blocks {
                prefetch::<{ HINT_L1 }, E>(block(v_cache, b + 1));
            }
            for g in kv.clone() {
                let (a, c) = part(g);
                let vals = rows(v_cache, g, b);
                let hs = &mut o[a * d..(a + c) * d];
                let w = &scores[a * span + (b - b0) * BLOCK_SIZE..];
                accumulate_rows_shared(hs, d, w, span, vals.len() / d, vals);
            }
        }
    };
    let body = |t: usize, o: &mut [f32]| heads(t, 0, l.q_heads, o);
    let n = layout.num_tokens();
    let threads = crate::pool::threads();
    let long = |t: usize| {
        let (lo, ctx) = keys(layout, t, window, through);
        ctx - lo >= SPLIT_KEYS
    };
    if n == 1 && threads > 1 && long(0) {
        // One token over a long context: its q heads split among the threads (each head's
        // scores, softmax and sums are computed as in `body`, so the bits are the same).
        let per = heads_per_task(group, l.kv_heads, threads);
        crate::pool::chunks_mut(&mut out[..width], per * d, |i, o| heads(0, i * per, per, o));
    } else if n == 1 {
        body(0, &mut out[..width]);
    } else {
        crate::pool::chunks_mut(&mut out[..n * width], width, body);
    }
}

/// Values up to this size are prefetched into L2 while the scores are computed (half an L2
/// of 2 MiB): more would be evicted before their sums and read twice from memory.
const V_EARLY_BYTES: usize = 1 << 20;

/// The keys `lo .. ctx` token `t` attends: without a window all of them up to its own
/// position; the window counts back from that position, `through` may reach past it.
fn keys(
    layout: &BatchLayout,
    t: usize,
    window: Option<usize>,
    through: Option<&[u32]>,
) -> (usize, usize) {
    let pos = layout.positions[t] as usize;
    let ctx = through.map_or(pos, |th| pos.max(th[t] as usize)) + 1;
    (window.map_or(0, |w| (pos + 1).saturating_sub(w)), ctx)
}

/// A lone token attends at least this many keys before its heads are split among the
/// threads: below it the fork costs more than the second core gives.
const SPLIT_KEYS: usize = 1024;

/// q heads per task for a lone token: a divisor of the group (tasks never straddle two kv
/// heads), enough tasks for the threads where the group allows.
fn heads_per_task(group: usize, kv_heads: usize, threads: usize) -> usize {
    let parts = threads.div_ceil(kv_heads).clamp(1, group);
    (1..=group)
        .rev()
        .find(|&per| group.is_multiple_of(per) && group / per >= parts)
        .unwrap_or(1)
}

/// In place: `s = exp(s - max) / Σ exp(s - max)`, with a sink's `exp(sink - max)` in the
/// sum (and the max) when given. The exponentials vectorize; the sum runs in eight lanes in a
/// fixed order (it depends on the length only).
pub(crate) fn softmax(s: &mut [f32], sink: Option<f32>) {
    #[cfg(target_arch = "x86_64")]
    match super::simd::isa() {
        // SAFETY: the features were detected (AVX-512 machines have AVX2; the portable loop
        // under `avx512f` stayed scalar too, a twentieth of a decode step at 16 rows).
        super::simd::Isa::Avx512 | super::simd::Isa::Avx2 => return unsafe { softmax256(s, sink) },
        super::simd::Isa::Scalar => {}
    }
    let max = max_of(s, sink);
    let lanes = exp_lanes(s, max);
    normalize(s, sink, max, &lanes);
}

/// The exponentials in explicit AVX2 (the compiler leaves [`exp_lanes`]' loop scalar: the
/// saturating `as i32` and the branch), the same operations per element, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax256(s: &mut [f32], sink: Option<f32>) {
    use std::arch::x86_64::*;
    let max = max_of(s, sink);
    let vmax = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let mut it = s.chunks_exact_mut(8);
    for c in &mut it {
        // SAFETY: `c` holds 8 values.
        unsafe {
            let e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), vmax));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            acc = _mm256_add_ps(acc, e);
        }
    }
    for v in it.into_remainder() {
        *v = exp_nonpositive(*v - max);
    }
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    normalize(s, sink, max, &lanes);
}

/// The largest score (and sink). Lane-wise maxima (exact in any order) so the comparison
/// vectorizes.
#[inline(always)]
fn max_of(s: &[f32], sink: Option<f32>) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut it = s.chunks_exact(16);
    for c in &mut it {
        for (l, &v) in lanes.iter_mut().zip(c) {
            if v > *l {
                *l = v;
            }
        }
    }
    lanes
        .iter()
        .chain(it.remainder())
        .chain(&sink)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// `s = exp(s - max)` in place, and the sums of its whole eights lane by lane.
#[inline(always)]
fn exp_lanes(s: &mut [f32], max: f32) -> [f32; 8] {
    for v in s.iter_mut() {
        *v = exp_nonpositive(*v - max);
    }
    let mut lanes = [0.0f32; 8];
    for c in s.chunks_exact(8) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v;
        }
    }
    lanes
}

/// Divides the exponentials `s` by their sum: `lanes` (the whole eights'), the values past
/// the last whole eight, and the sink's.
#[inline(always)]
fn normalize(s: &mut [f32], sink: Option<f32>, max: f32, lanes: &[f32; 8]) {
    let sum = lanes.iter().sum::<f32>()
        + s[s.len() / 8 * 8..].iter().sum::<f32>()
        + sink.map_or(0.0, |k| exp_nonpositive(k - max));
    let inv = 1.0 / sum;
    for v in s.iter_mut() {
        *v *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
const HINT_L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const HINT_L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const HINT_L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const HINT_L2: i32 = 0;

/// Asks for rows needed soon: the blocks of a sequence are scattered through the pool, out of
/// the hardware prefetcher's sight.
#[inline(always)]
fn prefetch<const HINT: i32, E>(rows: &[E]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::_mm_prefetch;
        let p = rows.as_ptr() as *const i8;
        for off in (0..std::mem::size_of_val(rows)).step_by(64) {
            // SAFETY: prefetches never fault; the addresses lie inside `rows` anyway.
            unsafe { _mm_prefetch::<HINT>(p.wrapping_add(off)) };
        }
    }
}

/// Stores each token's k and v heads at its slot of the `[blocks, kv_heads, BLOCK_SIZE, d]` pools.
pub fn write_kv<E: KvElem>(
    qkv: &[f32],
    slots: &[u32],
    l: QkvLayout,
    k_cache: &mut [E],
    v_cache: &mut [E],
) {
    let d = l.head_dim;
    for (t, &slot) in slots.iter().enumerate() {
        let row = &qkv[t * l.row_width()..(t + 1) * l.row_width()];
        let (block, off) = (slot as usize / BLOCK_SIZE, slot as usize % BLOCK_SIZE);
        for g in 0..l.kv_heads {
            let dst = ((block * l.kv_heads + g) * BLOCK_SIZE + off) * d;
            let k = l.k_offset() + g * d;
            let v = l.v_offset() + g * d;
            E::store(&row[k..k + d], &mut k_cache[dst..dst + d]);
            E::store(&row[v..v + d], &mut v_cache[dst..dst + d]);
        }
    }
}

/// How K/V values are stored: f32 as they are, bf16 rounded to nearest even.
pub trait KvElem: WElem {
    fn store(src: &[f32], dst: &mut [Self]);
}

impl KvElem for f32 {
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for u16 {
    fn store(src: &[f32], dst: &mut [u16]) {
        super::linear::round_bf16_into(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_checkpoint::testing::lcg;
    use lmi_engine_core::batch::{LogitsWanted, SeqChunk};

    /// A lone token over a long context (its heads split among the threads) gives the bits
    /// it gets beside another sequence's token (one task for all its heads), with and
    /// without a window and sinks, GQA groups of 4 and 1, f32 and bf16 K/V.
    #[test]
    fn a_lone_token_split_by_heads_keeps_its_bits() {
        let ctx = SPLIT_KEYS + 300;
        let blocks = ctx.div_ceil(BLOCK_SIZE);
        let mut seed = 11;
        for (q_heads, kv_heads) in [(8, 2), (4, 4)] {
            let l = QkvLayout {
                q_heads,
                kv_heads,
                head_dim: 64,
            };
            let pool = 2 * blocks * kv_heads * BLOCK_SIZE * l.head_dim;
            let k: Vec<f32> = (0..pool).map(|_| lcg(&mut seed)).collect();
            let v: Vec<f32> = (0..pool).map(|_| lcg(&mut seed)).collect();
            let (kb, vb): (Vec<u16>, Vec<u16>) = (
                k.iter().map(|x| (x.to_bits() >> 16) as u16).collect(),
                v.iter().map(|x| (x.to_bits() >> 16) as u16).collect(),
            );
            let row: Vec<f32> = (0..l.row_width()).map(|_| lcg(&mut seed)).collect();
            let sinks: Vec<f32> = (0..q_heads).map(|_| lcg(&mut seed)).collect();
            let seq = |first: u32| SeqChunk {
                tokens: vec![1],
                start_pos: ctx - 1,
                block_table: (first..first + blocks as u32).collect(),
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            };
            let alone = BatchLayout::new(&[seq(0)], 2 * blocks).unwrap();
            let pair = BatchLayout::new(&[seq(0), seq(blocks as u32)], 2 * blocks).unwrap();
            let both: Vec<f32> = row.iter().chain(&row).copied().collect();
            let w = q_heads * l.head_dim;
            for (window, sinks) in [(None, None), (Some(ctx - 100), Some(&sinks[..]))] {
                let scoring = || Scoring {
                    scale: 0.125,
                    window,
                    sinks,
                    through: None,
                };
                let (mut one, mut two) = (vec![0.0; w], vec![0.0; 2 * w]);
                paged_attention(&row, &alone, l, &k, &v, scoring(), &mut one);
                paged_attention(&both, &pair, l, &k, &v, scoring(), &mut two);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&one), bits(&two[..w]), "f32 {l:?} {window:?}");
                paged_attention(&row, &alone, l, &kb, &vb, scoring(), &mut one);
                paged_attention(&both, &pair, l, &kb, &vb, scoring(), &mut two);
                assert_eq!(bits(&one), bits(&two[..w]), "bf16 {l:?} {window:?}");
            }
        }
    }

    /// The detected ISA's softmax gives the portable loop's bits, for lengths around the
    /// eight- and sixteen-wide chunks, with and without a sink.
    #[test]
    fn softmax_equals_the_portable_loop() {
        let mut seed = 7;
        for n in [1, 5, 8, 9, 16, 23, 64, 130] {
            for sink in [None, Some(0.3f32)] {
                let s: Vec<f32> = (0..n).map(|_| 20.0 * lcg(&mut seed)).collect();
                let mut want = s.clone();
                let max = max_of(&want, sink);
                let lanes = exp_lanes(&mut want, max);
                normalize(&mut want, sink, max, &lanes);
                let mut got = s;
                softmax(&mut got, sink);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n = {n}, sink {sink:?}");
            }
        }
    }
}
