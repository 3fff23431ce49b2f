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
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_exp_avx2(row: &[f32], max: f32) -> f64 {
    sum_exp_lanes(row, max)
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
        let mut s: f32 = lanes.iter().sum();
        for &x in it.remainder() {
            let v = super::logprobs::clean(x) - max;
            s += exp_nonpositive(v);
        }
        total += f64::from(s);
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
