//! The encoder's row-wise ops (BERT, XLM-RoBERTa): LayerNorm, GELU, and the position and
//! token-type rows added to the embeddings. Each row (each element for GELU) is computed the
//! same way whatever else the step holds: reductions run in sixteen lanes in a fixed order
//! that depends on the row's width only.

use lmi_engine_core::sampling::fast_exp::exp_nonpositive;
use rayon::prelude::*;

use crate::simd::{Isa, WElem, isa};

/// Below this many elements an op stays on the calling thread.
const PAR_ELEMS: usize = 1 << 15;

/// `Σ x` in sixteen lanes over whole sixteens, the lanes then summed in order, then the tail.
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut it = x.chunks_exact(16);
    for c in &mut it {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f(v);
        }
    }
    let mut s = 0.0f32;
    for l in lanes {
        s += l;
    }
    for &v in it.remainder() {
        s += f(v);
    }
    s
}

/// One row's LayerNorm: mean, then the variance of `x − mean` (two passes), then
/// `(x − mean) · rstd · w + b`.
#[inline(always)]
fn layer_norm_row(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let mean = lane_sum(x, |v| v) / n;
    let var = lane_sum(x, |v| (v - mean) * (v - mean)) / n;
    let rstd = 1.0 / (var + eps).sqrt();
    for (((o, &v), &g), &c) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = (v - mean) * rstd * g + c;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn layer_norm_row512(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    layer_norm_row(x, w, b, eps, out)
}

/// Rust never contracts a multiply and an add into an FMA, so every width gives the bits of
/// the portable loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn layer_norm_row256(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    layer_norm_row(x, w, b, eps, out)
}

/// `out = LayerNorm(x) · w + b` over rows of `w.len()`.
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    let isa = isa();
    let row = |r: usize, o: &mut [f32]| {
        let xr = &x[r * h..(r + 1) * h];
        match isa {
            // SAFETY: the features were detected.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { layer_norm_row512(xr, w, b, eps, o) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { layer_norm_row256(xr, w, b, eps, o) },
            _ => layer_norm_row(xr, w, b, eps, o),
        }
    };
    if out.len() < PAR_ELEMS {
        out.chunks_mut(h).enumerate().for_each(|(r, o)| row(r, o));
    } else {
        out.par_chunks_mut(h)
            .enumerate()
            .for_each(|(r, o)| row(r, o));
    }
}

/// Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7), as PyTorch's vectorized CPU `erf`:
/// `erfc(z) = t · poly(t) · exp(−z²)` with `t = 1 / (1 + p·z)` for `z ≥ 0`.
const P: f32 = 0.327_591_1;
const A: [f32; 5] = [
    0.254_829_6,
    -0.284_496_74,
    1.421_413_8,
    -1.453_152_1,
    1.061_405_4,
];
const SQRT1_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// √(2/π), for the tanh approximation.
const SQRT_2_PI: f32 = 0.797_884_6;

/// BERT's `gelu`: `x/2 · (1 + erf(x/√2))`, with `1 + erf` taken as `2 − erfc` or `erfc(−·)`
/// so that the negative tail keeps its precision.
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    let z = (x * SQRT1_2).abs();
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let erfc = poly * exp_nonpositive(-(z * z));
    let one_plus_erf = if x >= 0.0 { 2.0 - erfc } else { erfc };
    0.5 * x * one_plus_erf
}

/// `gelu_new`: `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`, the tanh from `exp(−2|u|)`.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    let u = SQRT_2_PI * (x + 0.044715 * x * x * x);
    let e = exp_nonpositive(-2.0 * u.abs());
    let th = (1.0 - e) / (1.0 + e);
    let one_plus_tanh = if u >= 0.0 { 1.0 + th } else { 1.0 - th };
    0.5 * x * one_plus_tanh
}

#[inline(always)]
fn gelu_slice(x: &mut [f32], tanh: bool) {
    match tanh {
        true => x.iter_mut().for_each(|v| *v = gelu_tanh(*v)),
        false => x.iter_mut().for_each(|v| *v = gelu_erf(*v)),
    }
}

/// `exp_nonpositive` sixteen at a time: the same operations per lane, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) fn exp_nonpositive16(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    let c = |v: f32| _mm512_set1_ps(v);
    let m87 = c(-87.0);
    let xc = _mm512_max_ps(v, m87);
    let n = _mm512_sub_ps(
        _mm512_add_ps(_mm512_mul_ps(xc, c(LOG2E)), c(ROUND)),
        c(ROUND),
    );
    let r = _mm512_sub_ps(
        _mm512_sub_ps(xc, _mm512_mul_ps(n, c(LN2_HI))),
        _mm512_mul_ps(n, c(LN2_LO)),
    );
    let mut p = c(1.0 / 720.0);
    for k in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0] {
        p = _mm512_add_ps(c(k), _mm512_mul_ps(r, p));
    }
    let p = _mm512_add_ps(c(1.0), _mm512_mul_ps(r, p));
    let e = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127));
    let y = _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e)));
    let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, m87);
    _mm512_mask_mov_ps(y, below, _mm512_setzero_ps())
}

/// Sixteen at a time in explicit AVX-512 (the portable loop stays scalar: its division and
/// branches), the same operations per element in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gelu_slice512(x: &mut [f32], tanh: bool) {
    use std::arch::x86_64::*;
    let c = |v: f32| _mm512_set1_ps(v);
    let abs = |v: __m512| {
        _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(v),
            _mm512_set1_epi32(i32::MAX),
        ))
    };
    let mut it = x.chunks_exact_mut(16);
    for ch in &mut it {
        // SAFETY: `ch` holds 16 values.
        let v = unsafe { _mm512_loadu_ps(ch.as_ptr()) };
        let y = match tanh {
            false => {
                let z = abs(_mm512_mul_ps(v, c(SQRT1_2)));
                let t = _mm512_div_ps(c(1.0), _mm512_add_ps(c(1.0), _mm512_mul_ps(c(P), z)));
                let mut p = c(A[4]);
                for a in [A[3], A[2], A[1], A[0]] {
                    p = _mm512_add_ps(c(a), _mm512_mul_ps(t, p));
                }
                let poly = _mm512_mul_ps(t, p);
                let neg_z2 = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(_mm512_mul_ps(z, z)),
                    _mm512_set1_epi32(i32::MIN),
                ));
                let erfc = _mm512_mul_ps(poly, exp_nonpositive16(neg_z2));
                let pos = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, c(0.0));
                let ope = _mm512_mask_blend_ps(pos, erfc, _mm512_sub_ps(c(2.0), erfc));
                _mm512_mul_ps(_mm512_mul_ps(c(0.5), v), ope)
            }
            true => {
                let x3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(c(0.044715), v), v), v);
                let u = _mm512_mul_ps(c(SQRT_2_PI), _mm512_add_ps(v, x3));
                let e = exp_nonpositive16(_mm512_mul_ps(c(-2.0), abs(u)));
                let th = _mm512_div_ps(_mm512_sub_ps(c(1.0), e), _mm512_add_ps(c(1.0), e));
                let pos = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(u, c(0.0));
                let opt =
                    _mm512_mask_blend_ps(pos, _mm512_sub_ps(c(1.0), th), _mm512_add_ps(c(1.0), th));
                _mm512_mul_ps(_mm512_mul_ps(c(0.5), v), opt)
            }
        };
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(ch.as_mut_ptr(), y) };
    }
    gelu_slice(it.into_remainder(), tanh);
}

/// Eight at a time in explicit AVX2 (the compiler leaves the portable loop scalar there):
/// the same operations per element in the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gelu_slice256(x: &mut [f32], tanh: bool) {
    use lmi_engine_core::sampling::fast_exp::exp_nonpositive8;
    use std::arch::x86_64::*;
    let c = |v: f32| _mm256_set1_ps(v);
    let sign = c(-0.0);
    let mut it = x.chunks_exact_mut(8);
    for ch in &mut it {
        // SAFETY: `ch` holds 8 values.
        let v = unsafe { _mm256_loadu_ps(ch.as_ptr()) };
        let y = match tanh {
            false => {
                let z = _mm256_andnot_ps(sign, _mm256_mul_ps(v, c(SQRT1_2)));
                let t = _mm256_div_ps(c(1.0), _mm256_add_ps(c(1.0), _mm256_mul_ps(c(P), z)));
                let mut p = c(A[4]);
                for a in [A[3], A[2], A[1], A[0]] {
                    p = _mm256_add_ps(c(a), _mm256_mul_ps(t, p));
                }
                let poly = _mm256_mul_ps(t, p);
                let neg_z2 = _mm256_xor_ps(sign, _mm256_mul_ps(z, z));
                let erfc = _mm256_mul_ps(poly, exp_nonpositive8(neg_z2));
                let pos = _mm256_cmp_ps::<_CMP_GE_OQ>(v, c(0.0));
                let ope = _mm256_blendv_ps(erfc, _mm256_sub_ps(c(2.0), erfc), pos);
                _mm256_mul_ps(_mm256_mul_ps(c(0.5), v), ope)
            }
            true => {
                let x3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(c(0.044715), v), v), v);
                let u = _mm256_mul_ps(c(SQRT_2_PI), _mm256_add_ps(v, x3));
                let au = _mm256_andnot_ps(sign, u);
                let e = exp_nonpositive8(_mm256_mul_ps(c(-2.0), au));
                let th = _mm256_div_ps(_mm256_sub_ps(c(1.0), e), _mm256_add_ps(c(1.0), e));
                let pos = _mm256_cmp_ps::<_CMP_GE_OQ>(u, c(0.0));
                let opt =
                    _mm256_blendv_ps(_mm256_sub_ps(c(1.0), th), _mm256_add_ps(c(1.0), th), pos);
                _mm256_mul_ps(_mm256_mul_ps(c(0.5), v), opt)
            }
        };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(ch.as_mut_ptr(), y) };
    }
    gelu_slice(it.into_remainder(), tanh);
}

/// GELU in place: BERT's erf form, or with `tanh` the tanh approximation.
pub fn gelu(x: &mut [f32], tanh: bool) {
    let isa = isa();
    let run = |c: &mut [f32]| match isa {
        // SAFETY: the features were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { gelu_slice512(c, tanh) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { gelu_slice256(c, tanh) },
        _ => gelu_slice(c, tanh),
    };
    if x.len() < PAR_ELEMS {
        run(x);
    } else {
        x.par_chunks_mut(1 << 13).for_each(run);
    }
}

/// `out[t] += table[ids[t]]` over rows of `width`.
pub fn gather_add<W: WElem>(table: &[W], width: usize, ids: &[u32], out: &mut [f32]) {
    for (o, &id) in out.chunks_mut(width).zip(ids) {
        let row = &table[id as usize * width..(id as usize + 1) * width];
        for (o, &v) in o.iter_mut().zip(row) {
            *o += v.to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_checkpoint::testing::lcg;

    /// erf in f64 (Abramowitz & Stegun 7.1.28 is too coarse: the series / continued fraction
    /// is exact to f64 rounding where used here).
    fn erf64(x: f64) -> f64 {
        // Taylor series for |x| < 3, erfc's continued fraction beyond.
        let a = x.abs();
        let r = if a < 3.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            2.0 / std::f64::consts::PI.sqrt() * sum
        } else {
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = k as f64 / 2.0 / (a + f);
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f)
        };
        r.copysign(x)
    }

    #[test]
    fn gelu_matches_f64_and_every_width_gives_the_same_bits() {
        let mut seed = 3;
        let mut x: Vec<f32> = (0..1003).map(|_| lcg(&mut seed) * 12.0).collect();
        x[..6].copy_from_slice(&[0.0, -0.0, -9.5, 9.5, -200.0, 1e-30]);
        for tanh in [false, true] {
            let mut got = x.clone();
            gelu(&mut got, tanh);
            let mut scalar = x.clone();
            gelu_slice(&mut scalar, tanh);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&scalar), "tanh {tanh}");
            for (&g, &v) in got.iter().zip(&x) {
                let v = v as f64;
                let want = match tanh {
                    false => 0.5 * v * (1.0 + erf64(v / 2f64.sqrt())),
                    true => {
                        let c = (2.0 / std::f64::consts::PI).sqrt();
                        0.5 * v * (1.0 + (c * (v + 0.044715 * v.powi(3))).tanh())
                    }
                };
                // A&S 7.1.26's 1.5e-7 on erf, f32 rounding on the rest.
                let tol = 2e-7 * v.abs().max(1e-3) + 1e-6 * want.abs();
                assert!(
                    (g as f64 - want).abs() <= tol,
                    "tanh {tanh}: gelu({v}) = {g}, want {want}"
                );
            }
        }
    }

    #[test]
    fn layer_norm_matches_f64_row_by_row() {
        let mut seed = 11;
        for h in [7, 16, 37, 384] {
            let rows = 5;
            let x: Vec<f32> = (0..rows * h)
                .map(|i| lcg(&mut seed) * 3.0 + (i % 3) as f32)
                .collect();
            let w: Vec<f32> = (0..h).map(|_| 1.0 + lcg(&mut seed) * 0.2).collect();
            let b: Vec<f32> = (0..h).map(|_| lcg(&mut seed) * 0.1).collect();
            let eps = 1e-12;
            let mut out = vec![0.0; rows * h];
            layer_norm(&x, &w, &b, eps, &mut out);
            for r in 0..rows {
                let xr: Vec<f64> = x[r * h..(r + 1) * h].iter().map(|&v| v as f64).collect();
                let mean = xr.iter().sum::<f64>() / h as f64;
                let var = xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
                for i in 0..h {
                    let want =
                        (xr[i] - mean) / (var + eps as f64).sqrt() * w[i] as f64 + b[i] as f64;
                    let got = out[r * h + i] as f64;
                    assert!(
                        (got - want).abs() < 2e-6 * (1.0 + want.abs()),
                        "h {h} row {r} [{i}]: {got} vs {want}"
                    );
                }
                // Alone, a row gives the same bits.
                let mut alone = vec![0.0; h];
                layer_norm(&x[r * h..(r + 1) * h], &w, &b, eps, &mut alone);
                assert_eq!(alone, out[r * h..(r + 1) * h], "h {h} row {r}");
            }
        }
    }

    #[test]
    fn gather_add_adds_the_named_rows() {
        let table = [1.0f32, 2.0, 10.0, 20.0, 100.0, 200.0];
        let mut out = vec![0.5f32; 6];
        gather_add(&table, 2, &[2, 0, 2], &mut out);
        assert_eq!(out, [100.5, 200.5, 1.5, 2.5, 100.5, 200.5]);
        // bf16 rows are widened exactly.
        let t16: Vec<u16> = table.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let mut o16 = vec![0.0f32; 2];
        gather_add(&t16, 2, &[1], &mut o16);
        assert_eq!(o16, [10.0, 20.0]);
    }
}
