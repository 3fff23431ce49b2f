//! Bidirectional attention without a KV cache (encoders): every token of a sequence attends
//! to every token of it. Per (sequence, head): q gathered into contiguous rows, k and v packed
//! into panels (`panel.rs`), the scores `q·kᵀ` and the output `p·v` through the
//! outer-product kernel, the softmax row by row with a fixed order of its sums — so a
//! sequence's output does not depend on what else the step holds.

use std::cell::RefCell;

use lmi_engine_core::sampling::fast_exp::exp_nonpositive;
use rayon::prelude::*;

use crate::panel::{linear_packed, pack_with};

/// Query rows scored at once.
const QUERY_BLOCK: usize = 256;

/// A thread's scratch, grown to the longest sequence and kept.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: each (sequence, head) task writes its own head's columns of its own rows.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so that closures capture the whole wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `out[t, h·d ..][..d] = Σ_j softmax_j(scale · q_t·k_j) · v_j` over the tokens `j` of `t`'s
/// sequence (rows `cu[s] .. cu[s + 1]`), for rows of `qkv` laid out `[q | k | v]`, `heads`
/// heads of `d` each.
pub fn encoder_attention(
    qkv: &[f32],
    cu: &[u32],
    heads: usize,
    d: usize,
    scale: f32,
    out: &mut [f32],
) {
    let width = heads * d;
    let rows = cu.last().copied().unwrap_or(0) as usize;
    assert!(qkv.len() >= rows * 3 * width && out.len() >= rows * width);
    assert!(cu.windows(2).all(|w| w[0] <= w[1]));
    let seqs = cu.len().saturating_sub(1);
    let dst = SendPtr(out.as_mut_ptr());
    let task = |(s, h): (usize, usize)| {
        let (a, b) = (cu[s] as usize, cu[s + 1] as usize);
        let len = b - a;
        if len == 0 {
            return;
        }
        SCRATCH.with_borrow_mut(|scr| {
            let rows = &qkv[a * 3 * width..b * 3 * width];
            let at =
                |t: usize, part: usize, c: usize| rows[t * 3 * width + part * width + h * d + c];
            scr.q.resize(len * d, 0.0);
            for (t, q) in scr.q.chunks_exact_mut(d).enumerate() {
                q.copy_from_slice(&rows[t * 3 * width + h * d..][..d]);
            }
            // Keys as a matrix of `len` rows of `d`; values transposed, `d` rows of `len`.
            pack_with(&mut scr.k, len, d, |j, c| at(j, 1, c));
            pack_with(&mut scr.v, d, len, |c, j| at(j, 2, c));
            // Queries a block at a time: the scores of a long sequence stay small.
            scr.scores.resize(len.min(QUERY_BLOCK) * len, 0.0);
            scr.out.resize(len * d, 0.0);
            for q0 in (0..len).step_by(QUERY_BLOCK) {
                let qn = (len - q0).min(QUERY_BLOCK);
                let scores = &mut scr.scores[..qn * len];
                linear_packed(&scr.q[q0 * d..], qn, &scr.k, len, d, scores);
                for row in scores.chunks_exact_mut(len) {
                    softmax(row, scale);
                }
                linear_packed(scores, qn, &scr.v, d, len, &mut scr.out[q0 * d..]);
            }
            for (i, o) in scr.out.chunks_exact(d).enumerate() {
                // SAFETY: row a + i, columns h·d .. (h + 1)·d lie inside `out` (asserted
                // above) and belong to this task alone.
                unsafe {
                    let p = dst.get().add((a + i) * width + h * d);
                    std::ptr::copy_nonoverlapping(o.as_ptr(), p, d);
                }
            }
        });
    };
    let tasks = (0..seqs).flat_map(|s| (0..heads).map(move |h| (s, h)));
    if rows * width < 1 << 14 {
        tasks.for_each(task);
    } else {
        let tasks: Vec<(usize, usize)> = tasks.collect();
        tasks.into_par_iter().for_each(task);
    }
}

/// In place: `s = softmax(scale · s)`. The maximum lane by lane, the exponentials' sum in
/// sixteen lanes over whole sixteens (lanes then added in order) and the tail after: an order
/// that depends on the length only.
fn softmax(s: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa() == crate::simd::Isa::Avx512 {
        // SAFETY: the feature was detected.
        return unsafe { softmax512(s, scale) };
    }
    for v in s.iter_mut() {
        *v *= scale;
    }
    let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut lanes = [0.0f32; 16];
    let whole = s.len() / 16 * 16;
    for c in s[..whole].chunks_exact_mut(16) {
        for (l, v) in lanes.iter_mut().zip(c) {
            *v = exp_nonpositive(*v - max);
            *l += *v;
        }
    }
    finish(s, whole, lanes, max);
}

/// The tail's exponentials, the sum, and the division.
#[inline(always)]
fn finish(s: &mut [f32], whole: usize, lanes: [f32; 16], max: f32) {
    let mut sum = 0.0f32;
    for l in lanes {
        sum += l;
    }
    for v in &mut s[whole..] {
        *v = exp_nonpositive(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in s.iter_mut() {
        *v *= inv;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax512(s: &mut [f32], scale: f32) {
    use std::arch::x86_64::*;
    let whole = s.len() / 16 * 16;
    let vs = _mm512_set1_ps(scale);
    let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
    for c in s[..whole].chunks_exact_mut(16) {
        // SAFETY: `c` holds 16 values.
        unsafe {
            let v = _mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), vs);
            _mm512_storeu_ps(c.as_mut_ptr(), v);
            vmax = _mm512_max_ps(vmax, v);
        }
    }
    let mut max = _mm512_reduce_max_ps(vmax);
    for v in &mut s[whole..] {
        *v *= scale;
        max = max.max(*v);
    }
    let m = _mm512_set1_ps(max);
    let mut acc = _mm512_setzero_ps();
    for c in s[..whole].chunks_exact_mut(16) {
        // SAFETY: as above.
        unsafe {
            let e =
                crate::encoder::exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), m));
            _mm512_storeu_ps(c.as_mut_ptr(), e);
            acc = _mm512_add_ps(acc, e);
        }
    }
    let mut lanes = [0.0f32; 16];
    // SAFETY: `lanes` holds 16 values.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    finish(s, whole, lanes, max);
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_checkpoint::testing::lcg;

    /// Plain f64 attention of one sequence's rows.
    fn reference(qkv: &[f32], len: usize, heads: usize, d: usize, scale: f64) -> Vec<f64> {
        let w = heads * d;
        let at = |t: usize, part: usize, h: usize, c: usize| {
            qkv[t * 3 * w + part * w + h * d + c] as f64
        };
        let mut out = vec![0.0; len * w];
        for h in 0..heads {
            for t in 0..len {
                let s: Vec<f64> = (0..len)
                    .map(|j| (0..d).map(|c| at(t, 0, h, c) * at(j, 1, h, c)).sum::<f64>() * scale)
                    .collect();
                let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for c in 0..d {
                    out[t * w + h * d + c] = (0..len).map(|j| e[j] / sum * at(j, 2, h, c)).sum();
                }
            }
        }
        out
    }

    #[test]
    fn matches_f64_and_each_sequence_alone() {
        for (heads, d) in [(3, 20), (2, 64)] {
            let w = heads * d;
            let lens = [1usize, 7, 33, 64, 300];
            let total: usize = lens.iter().sum();
            let mut seed = 5;
            let qkv: Vec<f32> = (0..total * 3 * w).map(|_| lcg(&mut seed) * 2.0).collect();
            let mut cu = vec![0u32];
            for l in lens {
                cu.push(cu.last().unwrap() + l as u32);
            }
            let scale = 1.0 / (d as f32).sqrt();
            let mut out = vec![0.0; total * w];
            encoder_attention(&qkv, &cu, heads, d, scale, &mut out);
            for (s, &len) in lens.iter().enumerate() {
                let a = cu[s] as usize;
                let rows = &qkv[a * 3 * w..(a + len) * 3 * w];
                let want = reference(rows, len, heads, d, scale as f64);
                let got = &out[a * w..(a + len) * w];
                for (i, (&g, &r)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - r).abs() < 1e-5,
                        "d {d} seq {s} [{i}]: {g} vs {r}"
                    );
                }
                let mut alone = vec![0.0; len * w];
                encoder_attention(rows, &[0, len as u32], heads, d, scale, &mut alone);
                assert_eq!(alone, got, "d {d}: sequence {s} alone gives other bits");
            }
        }
    }

    /// The AVX-512 softmax gives the portable loop's bits.
    #[test]
    fn softmax_paths_agree() {
        let mut seed = 9;
        for n in [1, 15, 16, 17, 64, 131] {
            let x: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 30.0).collect();
            let mut got = x.clone();
            softmax(&mut got, 0.125);
            let mut want = x.clone();
            for v in want.iter_mut() {
                *v *= 0.125;
            }
            let max = want.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let whole = n / 16 * 16;
            let mut lanes = [0.0f32; 16];
            for c in want[..whole].chunks_exact_mut(16) {
                for (l, v) in lanes.iter_mut().zip(c) {
                    *v = exp_nonpositive(*v - max);
                    *l += *v;
                }
            }
            finish(&mut want, whole, lanes, max);
            assert_eq!(got, want, "n = {n}");
        }
    }
}
