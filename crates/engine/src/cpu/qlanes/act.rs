//! Activations for the lane kernels: per block of 32 values one scale and 12-bit integers
//! `a` in [-2047, 2047], each split as `a = 16·hi + lo` (`hi` signed, `lo` in 0..16) so that
//! `vpdpbusd` (unsigned × signed bytes) multiplies both halves exactly.
//!
//! The SIMD and scalar quantizers give the same bits: a block's largest magnitude is exact in
//! any order, the scale is one division, each value one multiply and a round to nearest
//! even, and the block's sum is an integer.

use super::QK;

/// Largest magnitude of an activation integer.
const AMAX_Q: f32 = 2047.0;

/// `rows × k` activations. Per row and block: 32 `hi` bytes then 32 `lo` bytes in `q`; the
/// scale `d`, the integer sum `sum` (for the weight formats' integer offsets), and
/// `ms = d · sum` (what a per-block weight minimum multiplies).
pub(crate) struct LAct {
    /// Blocks per row.
    pub nb: usize,
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
    /// The sum of each block's first 16 integers (Q6_K's scales cover 16 values).
    pub sum16: Vec<i32>,
    pub ms: Vec<f32>,
}

impl LAct {
    /// Quantizes `rows` rows of `k` values (`k` a multiple of 32), each row on its own.
    pub fn new(x: &[f32], rows: usize, k: usize) -> LAct {
        debug_assert!(k.is_multiple_of(QK) && x.len() >= rows * k);
        let nb = k / QK;
        let mut a = LAct {
            nb,
            q: vec![0; rows * nb * 2 * QK],
            d: vec![0.0; rows * nb],
            sum: vec![0; rows * nb],
            sum16: vec![0; rows * nb],
            ms: vec![0.0; rows * nb],
        };
        #[cfg(target_arch = "x86_64")]
        let simd = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw");
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        let blocks = x[..rows * k]
            .chunks_exact(QK)
            .zip(a.q.chunks_exact_mut(2 * QK))
            .zip(a.d.iter_mut().zip(a.sum.iter_mut()))
            .zip(a.sum16.iter_mut().zip(a.ms.iter_mut()));
        for (((x, q), (d, sum)), (sum16, ms)) in blocks {
            #[cfg(target_arch = "x86_64")]
            if simd {
                // SAFETY: AVX-512F/BW were detected; `x` holds 32 values and `q` 64 bytes.
                (*d, *sum, *sum16) = unsafe { x86::block(x, q) };
                *ms = *d * *sum as f32;
                continue;
            }
            let _ = simd;
            (*d, *sum, *sum16) = scalar_block(x, q);
            *ms = *d * *sum as f32;
        }
        a
    }

    /// Row `r`'s block `b`: the `hi` bytes (the `lo` bytes follow at +32).
    #[inline(always)]
    pub fn block(&self, r: usize, b: usize) -> *const i8 {
        // SAFETY (callers): r < rows and b < nb.
        unsafe { self.q.as_ptr().add((r * self.nb + b) * 2 * QK) }
    }
}

/// One block: returns its scale, the sum of its integers and of its first 16.
pub(crate) fn scalar_block(x: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
    let amax = x[..QK].iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        q[..2 * QK].fill(0);
        return (0.0, 0, 0);
    }
    let id = AMAX_Q / amax;
    let (mut sum, mut sum16) = (0, 0);
    for (j, &v) in x[..QK].iter().enumerate() {
        let a = ((v * id).round_ties_even() as i32).clamp(-2047, 2047);
        q[j] = (a >> 4) as i8;
        q[QK + j] = (a & 15) as i8;
        sum += a;
        if j < 16 {
            sum16 += a;
        }
    }
    (amax / AMAX_Q, sum, sum16)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::scalar_block`] in AVX-512 (the same bits).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn block(x: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
        unsafe {
            let x0 = _mm512_loadu_ps(x.as_ptr());
            let x1 = _mm512_loadu_ps(x.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            if amax == 0.0 {
                q[..64].fill(0);
                return (0.0, 0, 0);
            }
            let id = _mm512_set1_ps(super::AMAX_Q / amax);
            let (lo_q, hi_q) = (_mm512_set1_epi32(-2047), _mm512_set1_epi32(2047));
            // Round to nearest even: the default rounding mode of the conversion.
            let a0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
            let a1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
            let a0 = _mm512_min_epi32(_mm512_max_epi32(a0, lo_q), hi_q);
            let a1 = _mm512_min_epi32(_mm512_max_epi32(a1, lo_q), hi_q);
            let m15 = _mm512_set1_epi32(15);
            let p = q.as_mut_ptr() as *mut __m128i;
            _mm_storeu_si128(p, _mm512_cvtepi32_epi8(_mm512_srai_epi32::<4>(a0)));
            _mm_storeu_si128(p.add(1), _mm512_cvtepi32_epi8(_mm512_srai_epi32::<4>(a1)));
            _mm_storeu_si128(p.add(2), _mm512_cvtepi32_epi8(_mm512_and_si512(a0, m15)));
            _mm_storeu_si128(p.add(3), _mm512_cvtepi32_epi8(_mm512_and_si512(a1, m15)));
            let sum16 = _mm512_reduce_add_epi32(a0);
            let sum = sum16 + _mm512_reduce_add_epi32(a1);
            (amax / super::AMAX_Q, sum, sum16)
        }
    }
}
