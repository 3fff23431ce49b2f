//! `Σ exp(x - max)` over a logits row without libm: the log-normalizer is computed for every
//! sampled token of every sequence (greedy included, for its logprob), and libm's f64 `exp`
//! over a 50k–150k vocabulary made it the scheduler's largest cost.
//!
//! `exp(x) = 2^n · exp(r)` with `n = round(x·log2 e)` and `r = x - n·ln 2` computed in two
//! parts (Cody–Waite, so `r` keeps f32 precision), `|r| ≤ ln2/2`; `exp(r)` by its degree-6
//! Taylor polynomial (truncation below 2e-7). Plain f32 arithmetic that the compiler
//! vectorizes; partial sums are f32 over short chunks, added up in f64.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n · LN2_HI` is exact for the n that occur here.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding and subtracting it rounds an f32 to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// `exp(x)` for `x ≤ 0`; values below -87 (and `-inf`) give 0.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    let xc = x.max(-87.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < -87.0 { 0.0 } else { p * scale }
}

/// `Σ exp(clean(x) - max)` over the row, with `clean` as in `logprobs` (NaN → -inf,
/// +inf → f32::MAX).
pub(crate) fn sum_exp_shifted_clean(row: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was detected. The same lanes and order as below, 8 at a time
        // in one register instead of two: the same bits.
        return unsafe { sum_exp_avx2(row, max) };
    }
    sum_exp_lanes(row, max)
}

/// [`sum_exp_lanes`] in explicit AVX2: the compiler left that loop scalar (the saturating
/// `as i32` and `clean`'s branches), 2.5 ns an entry. The same operations in the same order
/// per lane (no fused multiply-add), so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_exp_avx2(row: &[f32], max: f32) -> f64 {
    use std::arch::x86_64::*;
    const CHUNK: usize = 256;
    let c = |v: f32| _mm256_set1_ps(v);
    let vmax = c(max);
    let (neg_inf, big, pos_inf) = (c(f32::NEG_INFINITY), c(f32::MAX), c(f32::INFINITY));
    let mut total = 0.0f64;
    for chunk in row.chunks(CHUNK) {
        let mut acc = _mm256_setzero_ps();
        let mut it = chunk.chunks_exact(8);
        for g in &mut it {
            // SAFETY: `g` holds 8 values.
            let x = unsafe { _mm256_loadu_ps(g.as_ptr()) };
            let x = _mm256_blendv_ps(x, neg_inf, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            let x = _mm256_blendv_ps(x, big, _mm256_cmp_ps::<_CMP_EQ_OQ>(x, pos_inf));
            acc = _mm256_add_ps(acc, exp_nonpositive8(_mm256_sub_ps(x, vmax)));
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        total += f64::from(chunk_sum(&lanes, it.remainder(), max));
    }
    total
}

/// [`exp_nonpositive`] of 8 values at once: the same operations in the same order per lane
/// (no fused multiply-add), so the same bits.
///
/// # Safety
/// The CPU must have AVX2 (callers are AVX2 kernels, chosen by runtime detection).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub fn exp_nonpositive8(v: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = |v: f32| _mm256_set1_ps(v);
    let m87 = c(-87.0);
    let xc = _mm256_max_ps(v, m87);
    let n = _mm256_sub_ps(
        _mm256_add_ps(_mm256_mul_ps(xc, c(LOG2E)), c(ROUND)),
        c(ROUND),
    );
    let r = _mm256_sub_ps(
        _mm256_sub_ps(xc, _mm256_mul_ps(n, c(LN2_HI))),
        _mm256_mul_ps(n, c(LN2_LO)),
    );
    let mut p = c(1.0 / 720.0);
    for k in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0] {
        p = _mm256_add_ps(c(k), _mm256_mul_ps(r, p));
    }
    let p = _mm256_add_ps(c(1.0), _mm256_mul_ps(r, p));
    let e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
    let y = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)));
    _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(v, m87), y)
}

/// A chunk's sum: its lanes in order, then the values past the last whole 8.
#[inline(always)]
fn chunk_sum(lanes: &[f32; 8], rest: &[f32], max: f32) -> f32 {
    let mut s: f32 = lanes.iter().sum();
    for &x in rest {
        s += exp_nonpositive(super::logprobs::clean(x) - max);
    }
    s
}

#[inline(always)]
fn sum_exp_lanes(row: &[f32], max: f32) -> f64 {
    const CHUNK: usize = 256;
    let mut total = 0.0f64;
    for chunk in row.chunks(CHUNK) {
        let mut lanes = [0.0f32; 8];
        let mut it = chunk.chunks_exact(8);
        for c in &mut it {
            for i in 0..8 {
                let v = super::logprobs::clean(c[i]) - max;
                lanes[i] += exp_nonpositive(v);
            }
        }
        total += f64::from(chunk_sum(&lanes, it.remainder(), max));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_libm_within_4e_7_relative() {
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -87.0 {
            let got = f64::from(exp_nonpositive(x));
            let want = f64::from(x).exp();
            worst = worst.max(((got - want) / want).abs());
            x -= 0.0137;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    #[test]
    fn the_vector_path_gives_the_scalar_bits() {
        let mut x = 12345u64;
        let mut row: Vec<f32> = (0..10_007)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 200.0
            })
            .collect();
        row[5] = f32::NAN;
        row[77] = f32::NEG_INFINITY;
        // The caller's max is the cleaned row's: f32::MAX once +inf is in it.
        let finite_max = row
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::MIN, f32::max);
        for (inf, max) in [(false, finite_max), (true, f32::MAX)] {
            if inf {
                row[300] = f32::INFINITY;
            }
            let want = sum_exp_lanes(&row, max);
            let got = sum_exp_shifted_clean(&row, max);
            assert_eq!(got.to_bits(), want.to_bits(), "{max}");
        }
    }

    #[test]
    fn sums_like_f64_reference() {
        let row: Vec<f32> = (0..50_001)
            .map(|i| ((i * 7919) % 1000) as f32 / 50.0 - 10.0)
            .collect();
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: f64 = row
            .iter()
            .map(|&x| (f64::from(x) - f64::from(max)).exp())
            .sum();
        let got = sum_exp_shifted_clean(&row, max);
        assert!(((got - want) / want).abs() < 1e-6, "{got} vs {want}");
    }
}
