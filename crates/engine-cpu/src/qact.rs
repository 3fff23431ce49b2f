//! Activations quantized to int8 for the quantized products (`qlinear.rs`): blocks of 32 as
//! llama.cpp's Q8 activations, with one scale per 4 values rather than per block. The kernels
//! already scale each lane of 4 products on its own, so the finer scales cost nothing there
//! and keep one large value from flattening its 31 neighbours (SmolLM2's activations have
//! such outliers: per-32 scales move its prompt logprobs by half a nat, per-4 by a tenth).

/// Values per activation block.
pub(crate) const QK: usize = 32;
/// f32 lanes per block in `dl` and `s`: one per 4 values, the width of a `vpdpbusd` lane.
pub(crate) const LANES: usize = 8;

/// `rows × k` activations: per block of 32, the int8 values `q`, each lane of 4 values' scale
/// (`dl`), and per lane `d · Σ q` over its 4 values (`s`), which the weight formats with an
/// offset (Q4_0, Q4_1, Q4_K, Q6_K) multiply by their per-lane minimum.
pub(crate) struct QAct {
    /// Blocks per row.
    pub nb: usize,
    pub q: Vec<i8>,
    pub dl: Vec<f32>,
    pub s: Vec<f32>,
    /// Paired form only: per row, each block's `d · Σ q` in order (`nb` a row), and each
    /// half-block's (`2 nb` a row), with 16 zeros after the last row: the min terms of the
    /// offset formats, taken once per group of blocks (`qpack.rs`).
    pub b32: Vec<f32>,
    pub b16: Vec<f32>,
}

impl QAct {
    /// Quantizes `rows` rows of `k` values (`k` a multiple of 32). Each row is quantized on
    /// its own, so a row's values never depend on the batch it is in.
    pub fn new(x: &[f32], rows: usize, k: usize) -> QAct {
        debug_assert!(k.is_multiple_of(QK) && x.len() >= rows * k);
        let nb = k / QK;
        let mut a = QAct {
            nb,
            q: vec![0; rows * k],
            dl: vec![0.0; rows * nb * LANES],
            s: vec![0.0; rows * nb * LANES],
            b32: Vec::new(),
            b16: Vec::new(),
        };
        let blocks = x[..rows * k]
            .chunks_exact(QK)
            .zip(a.q.chunks_exact_mut(QK))
            .zip(
                a.dl.chunks_exact_mut(LANES)
                    .zip(a.s.chunks_exact_mut(LANES)),
            );
        for ((x, q), (dl, s)) in blocks {
            for l in 0..LANES {
                let (d, sum) = quantize4(&x[4 * l..4 * l + 4], &mut q[4 * l..4 * l + 4]);
                dl[l] = d;
                s[l] = d * sum as f32;
            }
        }
        a
    }
}

/// Position in a pair of blocks (a, b) of value `v` (0..32) of block `which` (0 = a): the
/// AVX-512 kernels' order, `[a0..16, b0..16, a16..32, b16..32]`, in which a pair of Q4 blocks
/// unpacks from its 32 bytes of nibbles with no shuffle.
#[inline]
pub(crate) fn pair_pos(which: usize, v: usize) -> usize {
    (v / 16) * 32 + which * 16 + v % 16
}

impl QAct {
    /// Like [`QAct::new`], in pairs of blocks laid out for the AVX-512 kernels (`pair_pos`);
    /// an odd last block is paired with a zero block. Values round to nearest even. Only the
    /// paired fields the kernels read are filled: `q`, `dl`, `b32`, `b16` (not `s`).
    pub fn paired(x: &[f32], rows: usize, k: usize) -> QAct {
        let nb = k / QK;
        let pairs = nb.div_ceil(2);
        let mut a = QAct {
            nb: pairs * 2,
            q: vec![0; rows * pairs * 2 * QK],
            dl: vec![0.0; rows * pairs * 2 * LANES],
            s: Vec::new(),
            b32: vec![0.0; rows * pairs * 2 + 16],
            b16: vec![0.0; rows * pairs * 4 + 16],
        };
        #[cfg(target_arch = "x86_64")]
        let avx512 = std::arch::is_x86_feature_detected!("avx512f");
        for r in 0..rows {
            let row = &x[r * k..(r + 1) * k];
            for p in 0..pairs {
                let mut v = [0f32; 2 * QK];
                let n = (k - p * 2 * QK).min(2 * QK);
                v[..n].copy_from_slice(&row[p * 2 * QK..p * 2 * QK + n]);
                let at = r * pairs + p;
                #[cfg(target_arch = "x86_64")]
                if avx512 {
                    // SAFETY: the feature was detected; the destinations hold a pair each.
                    unsafe { x86::pair(&v, &mut a, at) };
                    continue;
                }
                scalar_pair(&v, &mut a, at);
            }
        }
        a
    }
}

/// Four values to int8 with their own scale (round to nearest even); returns the scale and
/// the sum of the four integers.
#[inline]
fn quantize4(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += i32::from(*q);
    }
    (amax / 127.0, sum)
}

/// One pair of blocks (64 values, natural order) into pair slot `at` of `a`.
fn scalar_pair(v: &[f32; 2 * QK], a: &mut QAct, at: usize) {
    for which in 0..2 {
        let x = &v[which * QK..(which + 1) * QK];
        let mut half = [0f32; 2];
        for l in 0..LANES {
            let mut q = [0i8; 4];
            let (d, sum) = quantize4(&x[4 * l..4 * l + 4], &mut q);
            for (t, &qv) in q.iter().enumerate() {
                a.q[at * 2 * QK + pair_pos(which, 4 * l + t)] = qv;
            }
            let h = l / 4;
            a.dl[at * 2 * LANES + h * 8 + which * 4 + l % 4] = d;
            half[h] += d * sum as f32;
        }
        let b = at * 2 + which;
        // Block b of the row-major block list: rows are whole pairs.
        a.b32[b] = half[0] + half[1];
        a.b16[2 * b] = half[0];
        a.b16[2 * b + 1] = half[1];
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{LANES, QAct, QK};

    /// As `scalar_pair`, sixteen values per instruction (the half-block sums may differ from
    /// the scalar ones in the last bit: another summation order).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn pair(v: &[f32; 2 * QK], a: &mut QAct, at: usize) {
        unsafe {
            let p = v.as_ptr();
            let q = a.q.as_mut_ptr().add(at * 2 * QK);
            let dl = a.dl.as_mut_ptr().add(at * 2 * LANES);
            for which in 0..2 {
                let mut sums = [0f32; 2];
                for (h, sum) in sums.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(p.add(which * 32 + h * 16));
                    // The largest magnitude of each group of 4, in all four of its lanes.
                    let ax = _mm512_abs_ps(x);
                    let m = _mm512_max_ps(ax, _mm512_permute_ps::<0xB1>(ax));
                    let amax = _mm512_max_ps(m, _mm512_permute_ps::<0x4E>(m));
                    let nz = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(amax, _mm512_setzero_ps());
                    let id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.0), amax);
                    let d = _mm512_div_ps(amax, _mm512_set1_ps(127.0));
                    // Round to nearest even (the default MXCSR mode), then narrow.
                    let qi = _mm512_cvtps_epi32(_mm512_mul_ps(x, id));
                    let dst = q.add(h * 32 + which * 16) as *mut __m128i;
                    _mm_storeu_si128(dst, _mm512_cvtepi32_epi8(qi));
                    let d4 = _mm512_maskz_compress_ps(0x1111, d);
                    _mm_storeu_ps(dl.add(h * 8 + which * 4), _mm512_castps512_ps128(d4));
                    *sum = _mm512_reduce_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(qi)));
                }
                let b = at * 2 + which;
                a.b32[b] = sums[0] + sums[1];
                a.b16[2 * b] = sums[0];
                a.b16[2 * b + 1] = sums[1];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13)
            .collect();
        let a = QAct::new(&x, 2, 32);
        assert_eq!(a.nb, 1);
        for (b, x) in x.chunks(32).enumerate() {
            for (t, &v) in x.iter().enumerate() {
                let d = a.dl[b * LANES + t / 4];
                let back = f32::from(a.q[b * 32 + t]) * d;
                assert!((back - v).abs() <= d / 2.0 + 1e-6, "{back} vs {v}");
            }
            for l in 0..LANES {
                let want: i32 = a.q[b * 32 + 4 * l..b * 32 + 4 * l + 4]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                assert!((a.s[b * LANES + l] - a.dl[b * LANES + l] * want as f32).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let a = QAct::new(&[0.0; 32], 1, 32);
        assert!(a.q.iter().all(|&v| v == 0) && a.dl.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn paired_layout_matches_the_scalar_reference() {
        let (rows, k) = (3, 288);
        let x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 0.01)
            .collect();
        let fast = QAct::paired(&x, rows, k);
        let pairs = (k / QK).div_ceil(2);
        let mut slow = QAct {
            nb: fast.nb,
            q: vec![0; fast.q.len()],
            dl: vec![0.0; fast.dl.len()],
            s: Vec::new(),
            b32: vec![0.0; fast.b32.len()],
            b16: vec![0.0; fast.b16.len()],
        };
        for r in 0..rows {
            for p in 0..pairs {
                let mut v = [0f32; 2 * QK];
                let n = (k - p * 2 * QK).min(2 * QK);
                v[..n].copy_from_slice(&x[r * k + p * 2 * QK..r * k + p * 2 * QK + n]);
                scalar_pair(&v, &mut slow, r * pairs + p);
            }
        }
        assert_eq!(fast.q, slow.q);
        assert_eq!(fast.dl, slow.dl);
        for (f, s) in fast
            .b32
            .iter()
            .chain(&fast.b16)
            .zip(slow.b32.iter().chain(&slow.b16))
        {
            assert!((f - s).abs() <= 1e-5 * (1.0 + s.abs()), "{f} vs {s}");
        }
        // Value t of block a lands where the kernels read it, within half its lane's step.
        for (t, &xv) in x.iter().take(32).enumerate() {
            let d = fast.dl[(t / 16) * 8 + (t % 16) / 4];
            let back = f32::from(fast.q[pair_pos(0, t)]) * d;
            assert!((back - xv).abs() <= d / 2.0 + 1e-6);
        }
    }
}
