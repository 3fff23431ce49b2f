//! Paged causal attention for a ragged batch: each token attends to its sequence's keys
//! `0 ..= position` (a sliding window: the last `window` of them), read through the block
//! table. One pass per token (prefill chunk or decode alike), all q heads of a GQA group
//! sharing each K/V row load.

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
    let body = |t: usize, o: &mut [f32]| {
        let seq = layout.token_seq[t] as usize;
        let pos = layout.positions[t] as usize;
        // Keys `lo .. ctx` are attended: blocks from `b0` on are read, and the scores of the
        // `skip` keys of block b0 before `lo` are zero. Without a window: all of them. The
        // window counts back from the query's own position, `through` may reach past it.
        let ctx = through.map_or(pos, |th| pos.max(th[t] as usize)) + 1;
        let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let b0 = lo / BLOCK_SIZE;
        let (span, skip) = (ctx - b0 * BLOCK_SIZE, lo - b0 * BLOCK_SIZE);
        let table = layout.block_table(seq);
        let row = &qkv[t * l.row_width()..(t + 1) * l.row_width()];
        let mut scores = vec![0.0f32; l.q_heads * span];
        let blocks = ctx.div_ceil(BLOCK_SIZE);
        // Rows of kv head `g` in the b-th block of the sequence (all of them, or up to ctx).
        let rows = |cache: &'a [E], g: usize, b: usize| -> &'a [E] {
            let start = ((table[b] as usize * l.kv_heads + g) * BLOCK_SIZE) * d;
            &cache[start..][..(ctx - b * BLOCK_SIZE).min(BLOCK_SIZE) * d]
        };
        // A whole block, every kv head: one contiguous run, so blocks go outermost.
        let block = |cache: &'a [E], b: usize| -> &'a [E] {
            let run = l.kv_heads * BLOCK_SIZE * d;
            &cache[table[b] as usize * run..][..run]
        };
        for b in b0..blocks {
            if b + 1 < blocks {
                prefetch::<{ HINT_L1 }, E>(block(k_cache, b + 1));
            }
            // The values are read after the softmax: ask for them now, into L2.
            prefetch::<{ HINT_L2 }, E>(block(v_cache, b));
            for g in 0..l.kv_heads {
                // Keys of one block are contiguous: the group's heads share each key load.
                let keys = rows(k_cache, g, b);
                let s = &mut scores[g * group * span + (b - b0) * BLOCK_SIZE..];
                let q = &row[g * group * d..(g + 1) * group * d];
                group_scores(q, d, keys, keys.len() / d, scale, s, span);
            }
        }
        for (h, s) in scores.chunks_mut(span).enumerate() {
            s[..skip].fill(0.0);
            softmax(&mut s[skip..], sinks.map(|k| k[h]));
        }
        o.fill(0.0);
        for b in b0..blocks {
            if b + 1 < blocks {
                prefetch::<{ HINT_L1 }, E>(block(v_cache, b + 1));
            }
            for g in 0..l.kv_heads {
                let vals = rows(v_cache, g, b);
                let heads = &mut o[g * group * d..(g + 1) * group * d];
                let w = &scores[g * group * span + (b - b0) * BLOCK_SIZE..];
                accumulate_rows_shared(heads, d, w, span, vals.len() / d, vals);
            }
        }
    };
    let n = layout.num_tokens();
    if n == 1 {
        body(0, &mut out[..width]);
    } else {
        crate::pool::chunks_mut(&mut out[..n * width], width, body);
    }
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
