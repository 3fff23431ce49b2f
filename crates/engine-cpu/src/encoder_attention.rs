//! Bidirectional attention without a KV cache (encoders): every token of a sequence attends
//! to every token of it. Per (sequence, head): q, k and vᵀ gathered into contiguous scratch,
//! the scores `q·kᵀ` and the output `p·v` through the register-tiled product kernel
//! (`linear.rs`, one canonical order per element), the softmax row by row — so a sequence's
//! output does not depend on what else the step holds.

use rayon::prelude::*;

use crate::attention::softmax;
use crate::linear::linear;

/// Per-thread scratch, grown to the longest sequence and kept.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    vt: Vec<f32>,
    scores: Vec<f32>,
    out: Vec<f32>,
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
    let task = |scr: &mut Scratch, (s, h): (usize, usize)| {
        let (a, b) = (cu[s] as usize, cu[s + 1] as usize);
        let len = b - a;
        if len == 0 {
            return;
        }
        scr.q.resize(len * d, 0.0);
        scr.k.resize(len * d, 0.0);
        scr.vt.resize(d * len, 0.0);
        scr.scores.resize(len * len, 0.0);
        scr.out.resize(len * d, 0.0);
        for (i, row) in qkv[a * 3 * width..b * 3 * width]
            .chunks_exact(3 * width)
            .enumerate()
        {
            scr.q[i * d..(i + 1) * d].copy_from_slice(&row[h * d..(h + 1) * d]);
            scr.k[i * d..(i + 1) * d].copy_from_slice(&row[width + h * d..width + (h + 1) * d]);
            for (c, &v) in row[2 * width + h * d..2 * width + (h + 1) * d]
                .iter()
                .enumerate()
            {
                scr.vt[c * len + i] = v;
            }
        }
        linear(&scr.q, len, d, &scr.k, len, None, &mut scr.scores);
        for srow in scr.scores.chunks_exact_mut(len) {
            for v in srow.iter_mut() {
                *v *= scale;
            }
            softmax(srow, None);
        }
        linear(&scr.scores, len, len, &scr.vt, d, None, &mut scr.out);
        for (i, o) in scr.out.chunks_exact(d).enumerate() {
            // SAFETY: row a + i, columns h·d .. (h + 1)·d lie inside `out` (asserted above)
            // and belong to this task alone.
            unsafe {
                let p = dst.get().add((a + i) * width + h * d);
                std::ptr::copy_nonoverlapping(o.as_ptr(), p, d);
            }
        }
    };
    let tasks = (0..seqs).flat_map(|s| (0..heads).map(move |h| (s, h)));
    if rows * width < 1 << 14 {
        let mut scr = Scratch::default();
        tasks.for_each(|t| task(&mut scr, t));
    } else {
        let tasks: Vec<(usize, usize)> = tasks.collect();
        tasks.into_par_iter().for_each_init(Scratch::default, task);
    }
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
        let (heads, d) = (3, 20);
        let w = heads * d;
        let lens = [1usize, 7, 33, 64];
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
                assert!((g as f64 - r).abs() < 1e-5, "seq {s} [{i}]: {g} vs {r}");
            }
            let mut alone = vec![0.0; len * w];
            encoder_attention(rows, &[0, len as u32], heads, d, scale, &mut alone);
            assert_eq!(alone, got, "sequence {s} alone gives other bits");
        }
    }
}
