//! A candidate's weight after temperature, `w = 2^((x - max) · log2(e) / T)` (its probability
//! over the most likely token's), in f32 arithmetic that the CUDA sampler repeats operation for
//! operation (kernels/sampling.cu, `exp2_nonpositive` and `weight`), so both get the same bits
//! for every logit: no `exp` of a library, whose last bit differs between libm and CUDA.
//!
//! * `scale = log2(e) / T` is computed once per draw in f64 and rounded to f32 ([`scale`]; the
//!   CUDA sampler's host code calls it too and uploads the f32).
//! * `t = (x - max) · scale` in f32 (two roundings); `w = 2^t` by [`exp2_nonpositive`]:
//!   `t = n + f` with `n = floor(t)` (from round-to-nearest by the `1.5 · 2^23` trick, whose
//!   sum also holds `n` as an integer in its low bits, then one step down when that rounded
//!   up) and `f = t - n` in `[0, 1]`; `2^f` by a degree-6 polynomial with positive
//!   coefficients (minimax for the relative error with `p(0) = 1`, fitted for this; about
//!   `2e-9` before rounding) evaluated by Horner's rule and clamped to at most 2; then scaled
//!   by `2^n` exactly through the exponent bits. Weights are within `1.1e-7` of `2^t` (under
//!   two units in the last place; 6e-9 on average). The f32 argument `t` carries its own
//!   rounding: against `exp((x - max) / T)` in f64 the relative error grows to about
//!   `|t| · 7e-8` (6.6e-6 for weights near `2^-96`), far below what bf16 logits carry.
//! * `t < -126` (and NaN) gives 0: weights below `2^-126 ≈ 1.2e-38` of the most likely
//!   token's are zero (no subnormals, so no flush-to-zero question on any device). `t = 0`
//!   gives exactly 1.
//! * **Monotone** by construction: `x ↦ t` rounds monotone operations; within one `n` the
//!   fraction `f = t - n` is a rounded difference, and Horner's rule with non-negative `f` and
//!   positive coefficients only adds and multiplies non-negative, non-decreasing values; across
//!   `n`, `2^n · min(p, 2) <= 2^(n+1) · p(0)`. So `x1 >= x2` implies `w1 >= w2`: thresholds on
//!   `w` (`min_p`, `w > 0`) are thresholds on the logit, which the CUDA sampler finds by a
//!   binary search over logits.
//! * No fused multiply-add: Rust never contracts `a * b + c`; the kernel uses `__fmul_rn` /
//!   `__fadd_rn`, which NVRTC never contracts either.

/// `1.5 · 2^23`: `(t + ROUND) - ROUND` is `t` rounded to the nearest integer (ties to even)
/// for `|t| < 2^22`.
const ROUND: f32 = 12_582_912.0;

/// `2^f ≈ 1 + f·(C[0] + f·(C[1] + … + f·C[5]))` on `[0, 1]`; `SMP_EXP2_C1` … `SMP_EXP2_C6` in
/// kernels/sampling.cu (the same decimal literals, so the same f32s).
pub const EXP2_COEFFS: [f32; 6] = [
    0.693_147_06,
    0.240_229_31,
    0.055_485_282,
    0.009_675_452,
    0.001_246_784_7,
    0.000_216_129_15,
];

/// `log2(e) / temperature`, rounded to f32: the factor of a draw's weights.
pub fn scale(temperature: f32) -> f32 {
    (std::f64::consts::LOG2_E / f64::from(temperature)) as f32
}

/// The weight of logit `x` in a row whose largest logit is `max` (`x <= max`).
#[inline(always)]
pub fn weight(x: f32, max: f32, scale: f32) -> f32 {
    exp2_nonpositive((x - max) * scale)
}

/// `2^t` for `t <= 0` (see the module docs); 0 below -126 and for NaN, 1 from 0 up.
#[inline(always)]
pub fn exp2_nonpositive(t: f32) -> f32 {
    if t.is_nan() || t < -126.0 {
        return 0.0;
    }
    if t >= 0.0 {
        return 1.0;
    }
    // m's low mantissa bits hold round(t); n = floor(t), as a float and as an integer.
    let m = t + ROUND;
    let r = m - ROUND;
    let up = r > t;
    let n = if up { r - 1.0 } else { r };
    let ni = m.to_bits() as i32 - ROUND.to_bits() as i32 - i32::from(up);
    let f = t - n;
    let c = EXP2_COEFFS;
    let mut p = c[5];
    p = c[4] + f * p;
    p = c[3] + f * p;
    p = c[2] + f * p;
    p = c[1] + f * p;
    p = c[0] + f * p;
    p = 1.0 + f * p;
    // ni is in [-126, -1]: 2^ni is a normal f32.
    let two_n = f32::from_bits(((ni + 127) as u32) << 23);
    p.min(2.0) * two_n
}

/// [`weight`] of `x[i]` into `out[i]`, eight at a time in AVX2 where the CPU has it: the same
/// operations in the same order (no fused multiply-add), so the same bits.
pub fn weights(x: &[f32], max: f32, scale: f32, out: &mut [f32]) {
    let n = x.len().min(out.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        done = n / 8 * 8;
        // SAFETY: the feature was detected; both slices hold `done` values.
        unsafe { weights_avx2(&x[..done], max, scale, &mut out[..done]) };
    }
    for (o, &v) in out[done..n].iter_mut().zip(&x[done..n]) {
        *o = weight(v, max, scale);
    }
}

/// `x.len()` a multiple of 8, `out` as long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weights_avx2(x: &[f32], max: f32, scale: f32, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let c = |v: f32| _mm256_set1_ps(v);
    let (vmax, vscale, round, one, two) = (c(max), c(scale), c(ROUND), c(1.0), c(2.0));
    let (lowest, zero) = (c(-126.0), _mm256_setzero_ps());
    let round_bits = _mm256_set1_epi32(ROUND.to_bits() as i32);
    let k = EXP2_COEFFS.map(c);
    for (xs, os) in x.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        // SAFETY: each chunk holds 8 values.
        let v = unsafe { _mm256_loadu_ps(xs.as_ptr()) };
        let t = _mm256_mul_ps(_mm256_sub_ps(v, vmax), vscale);
        let m = _mm256_add_ps(t, round);
        let r = _mm256_sub_ps(m, round);
        let up = _mm256_cmp_ps::<_CMP_GT_OQ>(r, t);
        let n = _mm256_blendv_ps(r, _mm256_sub_ps(r, one), up);
        // `up` is all ones (-1) where the rounding went up: adding it subtracts one.
        let ni = _mm256_add_epi32(
            _mm256_sub_epi32(_mm256_castps_si256(m), round_bits),
            _mm256_castps_si256(up),
        );
        let f = _mm256_sub_ps(t, n);
        let mut p = k[5];
        for &ck in k[..5].iter().rev() {
            p = _mm256_add_ps(ck, _mm256_mul_ps(f, p));
        }
        p = _mm256_add_ps(one, _mm256_mul_ps(f, p));
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            ni,
            _mm256_set1_epi32(127),
        )));
        // Rust's `min` gives 2 for a NaN p, as `minps` with 2 second does.
        let w = _mm256_mul_ps(_mm256_min_ps(p, two), two_n);
        let w = _mm256_blendv_ps(w, one, _mm256_cmp_ps::<_CMP_GE_OQ>(t, zero));
        let gone = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(t, t),
            _mm256_cmp_ps::<_CMP_LT_OQ>(t, lowest),
        );
        let w = _mm256_andnot_ps(gone, w);
        // SAFETY: each chunk holds 8 values.
        unsafe { _mm256_storeu_ps(os.as_mut_ptr(), w) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_path_gives_the_scalar_bits() {
        let mut x = 99u64;
        let mut row: Vec<f32> = (0..20_003)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.7) * 300.0
            })
            .collect();
        // Integers (n exact), NaN, infinities, the max itself and above it.
        row[..16].copy_from_slice(&[
            -1.0,
            -2.0,
            -126.0,
            -127.0,
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            0.0,
            90.0,
            89.999,
            100.0,
            -0.0,
            1e-30,
            -1e-30,
            3.0,
            -3.0,
        ]);
        for (max, temperature) in [(90.0f32, 0.7f32), (90.0, 1.0), (0.0, 0.05), (90.0, 3.0)] {
            let sc = scale(temperature);
            let mut got = vec![0f32; row.len()];
            weights(&row, max, sc, &mut got);
            for (i, (&g, &x)) in got.iter().zip(&row).enumerate() {
                let want = weight(x, max, sc);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "x {x} (at {i}), max {max}, T {temperature}"
                );
            }
        }
    }

    fn rel(w: f32, t: f32) -> f64 {
        let want = f64::from(t).exp2();
        (f64::from(w) - want).abs() / want
    }

    #[test]
    fn within_two_ulp_of_exp2() {
        let mut worst = 0.0f64;
        // Every 97th f32 in [-1, 0), where every binade of the fraction occurs, and a sweep
        // of [-126, -1].
        let mut bits = (-1.0f32).to_bits();
        while bits > 0x8000_0000 {
            let t = f32::from_bits(bits);
            worst = worst.max(rel(exp2_nonpositive(t), t));
            bits -= 97;
        }
        let mut t = -126.0f32;
        while t < -1.0 {
            worst = worst.max(rel(exp2_nonpositive(t), t));
            t += 0.000_731;
        }
        assert!(worst < 1.3e-7, "worst relative error {worst}");
        assert_eq!(exp2_nonpositive(0.0), 1.0);
        assert_eq!(exp2_nonpositive(-0.0), 1.0);
        assert_eq!(exp2_nonpositive(-1.0), 0.5);
        assert_eq!(exp2_nonpositive(-126.0), f32::MIN_POSITIVE);
        assert_eq!(exp2_nonpositive(-126.000_01), 0.0);
        assert_eq!(exp2_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp2_nonpositive(f32::NAN), 0.0);
        // Integers are exact: f = 0, p = 1.
        for n in 1..=126 {
            assert_eq!(exp2_nonpositive(-(n as f32)), (-(n as f32)).exp2());
        }
    }

    #[test]
    fn monotone_over_every_f32_near_the_joints() {
        // Consecutive f32s around every integer (where n changes) and near 0 (where f rounds
        // to 1): w never decreases as t grows.
        let check = |from: f32, steps: u32| {
            let mut t = from;
            let mut last = exp2_nonpositive(t);
            for _ in 0..steps {
                t = f32::from_bits(t.to_bits() - 1); // toward 0 (t < 0)
                if t >= 0.0 {
                    break;
                }
                let w = exp2_nonpositive(t);
                assert!(w >= last, "w({t}) = {w} < {last}");
                last = w;
            }
        };
        for n in 1..=126 {
            let below = f32::from_bits((-(n as f32)).to_bits() + 20_000);
            check(below, 40_000);
        }
        check(-1e-6, 1 << 20);
        check(-0.5, 1 << 20);
    }

    #[test]
    fn the_most_likely_token_weighs_one() {
        for temperature in [1e-5f32, 0.05, 0.7, 1.0, 1.3, 40.0, 1e9] {
            let s = scale(temperature);
            for max in [-3.5f32, 0.0, 7.25, 3e38] {
                assert_eq!(weight(max, max, s), 1.0);
            }
        }
        // A NaN temperature (unvalidated) weighs nothing.
        assert_eq!(weight(0.0, 1.0, scale(f32::NAN)), 0.0);
        assert_eq!(weight(1.0, 1.0, scale(f32::NAN)), 0.0);
    }
}
