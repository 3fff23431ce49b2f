//! Row-wise CPU ops: RMSNorm, RoPE, SiLU·mul, embedding gather. Each row is computed the same
//! way whatever the batch, and rows run in parallel when there are enough of them.

use lmi_engine_core::backend::QkvLayout;
use lmi_engine_core::sampling::fast_exp::exp_nonpositive;
#[cfg(target_arch = "x86_64")]
use lmi_engine_core::sampling::fast_exp::exp_nonpositive8;

use super::simd::WElem;

/// Below this many elements an op stays on the calling thread: waking the pool costs more
/// than the work (a decode step of 16 rows runs ~10 such ops per layer).
const PAR_ELEMS: usize = 1 << 15;

fn for_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() < PAR_ELEMS || out.len() / width.max(1) < 2 {
        out.chunks_mut(width).enumerate().for_each(|(r, o)| f(r, o));
    } else {
        crate::pool::chunks_mut(out, width, f);
    }
}

/// `1 / sqrt(mean(x²) + eps)`, accumulated in f64 so long rows lose nothing.
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32
}

pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    for_rows(out, h, |r, o| {
        let xr = &x[r * h..(r + 1) * h];
        let inv = inv_rms(xr, eps);
        for ((o, &v), &g) in o.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    });
}

pub fn add_rms_norm(residual: &mut [f32], delta: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let h = w.len();
    let rows = out.len() / h;
    for_rows(&mut residual[..rows * h], h, |r, res| {
        for (x, d) in res.iter_mut().zip(&delta[r * h..(r + 1) * h]) {
            *x += d;
        }
    });
    rms_norm(residual, w, eps, out);
}

/// In-place RMSNorm of heads `first .. first + n` of every QKV row (Qwen3 q/k norm).
pub fn head_rms_norm(qkv: &mut [f32], l: QkvLayout, first: usize, n: usize, w: &[f32], eps: f32) {
    let d = l.head_dim;
    for_rows(qkv, l.row_width(), |_, row| {
        for h in first..first + n {
            let head = &mut row[h * d..(h + 1) * d];
            let inv = inv_rms(head, eps);
            for (v, &g) in head.iter_mut().zip(w) {
                *v = *v * inv * g;
            }
        }
    });
}

/// In-place RMSNorm of columns `offset .. offset + w.len()` of every row of `x` (rows
/// `row_width` wide): a q or k norm over its whole projection.
pub fn span_rms_norm(x: &mut [f32], row_width: usize, offset: usize, w: &[f32], eps: f32) {
    for_rows(x, row_width, |_, row| {
        let span = &mut row[offset..offset + w.len()];
        let inv = inv_rms(span, eps);
        for (v, &g) in span.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    });
}

/// Rotate-half RoPE (HF layout) on q and k heads; angles computed in f64 per position.
pub fn rope(qkv: &mut [f32], positions: &[u32], l: QkvLayout, inv_freq: &[f64]) {
    rope_by(qkv, l, inv_freq, |r, _| positions[r]);
}

/// RoPE with M-RoPE positions: frequency `i` turns with component `component[i]` of the
/// token's (time, row, column) position (`positions` holds 3 per token).
pub fn mrope(qkv: &mut [f32], positions: &[u32], l: QkvLayout, inv_freq: &[f64], component: &[u8]) {
    rope_by(qkv, l, inv_freq, |r, i| {
        positions[3 * r + component[i] as usize]
    });
}

/// Rotate-half RoPE where frequency `i` of row `r` turns by `pos(r, i)` positions. With fewer
/// frequencies than half a head (partial RoPE: Qwen3.5 turns a quarter of each head), only the
/// head's first `2 · inv_freq.len()` dimensions turn, pairing `i` with `i + inv_freq.len()`.
fn rope_by(
    qkv: &mut [f32],
    l: QkvLayout,
    inv_freq: &[f64],
    pos: impl Fn(usize, usize) -> u32 + Sync,
) {
    let d = l.head_dim;
    let half = inv_freq.len().min(d / 2);
    for_rows(qkv, l.row_width(), |r, row| {
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        for i in 0..half {
            let (s, c) = (pos(r, i) as f64 * inv_freq[i]).sin_cos();
            cos[i] = c as f32;
            sin[i] = s as f32;
        }
        for h in 0..l.q_heads + l.kv_heads {
            let head = &mut row[h * d..(h + 1) * d];
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = b * cos[i] + a * sin[i];
            }
        }
    });
}

pub fn silu_mul(gate_up: &[f32], width: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    let avx2 = super::simd::isa() != super::simd::Isa::Scalar;
    for_rows(out, width, |r, o| {
        let g = &gate_up[r * 2 * width..r * 2 * width + width];
        let u = &gate_up[r * 2 * width + width..(r + 1) * 2 * width];
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: AVX2 was detected (both vector ISAs have it).
            unsafe { silu_mul_row256(g, u, o) };
            return;
        }
        silu_mul_row(g, u, o);
    });
}

/// `silu(g)·u = g·σ(g)·u`, with σ from `exp(-|g|)` (never overflows; plain f32 arithmetic,
/// the same bits in [`silu_mul_row256`]).
#[inline(always)]
fn silu_mul_row(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        let e = exp_nonpositive(-g.abs());
        let sigmoid = if g >= 0.0 {
            1.0 / (1.0 + e)
        } else {
            e / (1.0 + e)
        };
        *o = g * sigmoid * u;
    }
}

/// [`silu_mul_row`] eight at a time, with the same operations per lane (the compiler left
/// that loop scalar, 2.5 ns an element, a tenth of a decode step at 16 rows).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn silu_mul_row256(g: &[f32], u: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len().min(g.len()).min(u.len());
    let whole = n / 8 * 8;
    let (one, sign) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-0.0));
    for j in (0..whole).step_by(8) {
        // SAFETY: j + 8 ≤ n for all three slices.
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr().add(j));
            let uv = _mm256_loadu_ps(u.as_ptr().add(j));
            let e = exp_nonpositive8(_mm256_or_ps(gv, sign));
            let num =
                _mm256_blendv_ps(e, one, _mm256_cmp_ps::<_CMP_GE_OQ>(gv, _mm256_setzero_ps()));
            let sigmoid = _mm256_div_ps(num, _mm256_add_ps(one, e));
            let o = _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid), uv);
            _mm256_storeu_ps(out.as_mut_ptr().add(j), o);
        }
    }
    silu_mul_row(&g[whole..n], &u[whole..n], &mut out[whole..n]);
}

/// `out[r] = gelu_tanh(gate[r]) · up[r]` for rows of `[gate | up]` (`gelu_pytorch_tanh`:
/// `g/2 · (1 + tanh(√(2/π) · (g + 0.044715 g³)))`), computed as `g · σ(2y) · u` with
/// `y = √(2/π) · (g + 0.044715 g³)` (`1 + tanh(y) = 2σ(2y)`) and σ as [`silu_mul_row`] forms
/// it, eight lanes at a time where AVX2 is ([`gelu8`], the same bits as [`gelu1`]; libm's
/// scalar `tanh` was a tenth of a Gemma 4 decode step).
pub fn gelu_tanh_mul(gate_up: &[f32], width: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    let avx2 = super::simd::isa() != super::simd::Isa::Scalar;
    for_rows(out, width, |r, o| {
        let g = &gate_up[r * 2 * width..r * 2 * width + width];
        let u = &gate_up[r * 2 * width + width..(r + 1) * 2 * width];
        let mut j = 0;
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            while j + 8 <= width {
                // SAFETY: AVX2 was detected; j + 8 ≤ width for the three slices.
                unsafe {
                    use std::arch::x86_64::*;
                    let v = gelu8(
                        _mm256_loadu_ps(g.as_ptr().add(j)),
                        _mm256_loadu_ps(u.as_ptr().add(j)),
                    );
                    _mm256_storeu_ps(o.as_mut_ptr().add(j), v);
                }
                j += 8;
            }
        }
        for j in j..width {
            o[j] = gelu1(g[j], u[j]);
        }
    });
}

/// `x[r, j] = gelu_tanh(x[r, j]) · other[r · stride + offset + j]` over rows of `width`
/// (Gemma 4's per-layer input gate), with [`gelu_tanh_mul`]'s arithmetic.
pub fn gelu_tanh_mul_slice(
    x: &mut [f32],
    other: &[f32],
    width: usize,
    stride: usize,
    offset: usize,
) {
    #[cfg(target_arch = "x86_64")]
    let avx2 = super::simd::isa() != super::simd::Isa::Scalar;
    for_rows(x, width, |r, row| {
        let u = &other[r * stride + offset..][..width];
        let mut j = 0;
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            while j + 8 <= width {
                // SAFETY: AVX2 was detected; j + 8 ≤ width for both slices.
                unsafe {
                    use std::arch::x86_64::*;
                    let p = row.as_mut_ptr().add(j);
                    _mm256_storeu_ps(
                        p,
                        gelu8(_mm256_loadu_ps(p), _mm256_loadu_ps(u.as_ptr().add(j))),
                    );
                }
                j += 8;
            }
        }
        for j in j..width {
            row[j] = gelu1(row[j], u[j]);
        }
    });
}

/// `gelu_tanh(g) · u` = `g · σ(2y) · u` (see [`gelu_tanh_mul`]).
#[inline(always)]
fn gelu1(g: f32, u: f32) -> f32 {
    const C: f32 = 0.797_884_6; // √(2/π)
    let y2 = 2.0 * (C * (g + 0.044715 * g * g * g));
    let e = exp_nonpositive(-y2.abs());
    let sigmoid = if y2 >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    };
    g * sigmoid * u
}

/// [`gelu1`] on eight lanes, with the same operations in the same order (no FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn gelu8(g: std::arch::x86_64::__m256, u: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let (one, two, sign) = (
        _mm256_set1_ps(1.0),
        _mm256_set1_ps(2.0),
        _mm256_set1_ps(-0.0),
    );
    let (c, k) = (_mm256_set1_ps(0.797_884_6), _mm256_set1_ps(0.044715));
    let cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(k, g), g), g);
    let y2 = _mm256_mul_ps(two, _mm256_mul_ps(c, _mm256_add_ps(g, cube)));
    let e = exp_nonpositive8(_mm256_or_ps(y2, sign));
    let num = _mm256_blendv_ps(e, one, _mm256_cmp_ps::<_CMP_GE_OQ>(y2, _mm256_setzero_ps()));
    let sigmoid = _mm256_div_ps(num, _mm256_add_ps(one, e));
    _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), u)
}

/// gpt-oss's expert activation over rows of `[gate | up]`: `g · σ(alpha · g) · (u + 1)` with
/// `g = min(gate, limit)`, `u = clamp(up, -limit, limit)` (transformers' GptOssExperts).
pub fn clamped_swiglu(gate_up: &[f32], width: usize, alpha: f32, limit: f32, out: &mut [f32]) {
    for_rows(out, width, |r, o| {
        let g = &gate_up[r * 2 * width..r * 2 * width + width];
        let u = &gate_up[r * 2 * width + width..(r + 1) * 2 * width];
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            let sigmoid = 1.0 / (1.0 + (-alpha * g).exp());
            *o = g * sigmoid * (u + 1.0);
        }
    });
}

pub fn embedding<W: WElem>(table: &[W], width: usize, ids: &[u32], out: &mut [f32]) {
    for (o, &id) in out.chunks_mut(width).zip(ids) {
        let row = &table[id as usize * width..(id as usize + 1) * width];
        for (o, &v) in o.iter_mut().zip(row) {
            *o = v.to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row's span normalized by its own mean square (computed here in f64), the columns
    /// around it untouched.
    #[test]
    fn span_rms_norm_touches_only_its_span() {
        let (rows, width, offset, span) = (3, 11, 4, 5);
        let mut seed = 5;
        let x: Vec<f32> = (0..rows * width)
            .map(|_| lmi_checkpoint::testing::lcg(&mut seed) * 4.0)
            .collect();
        let w: Vec<f32> = (0..span).map(|i| 0.5 + i as f32 * 0.25).collect();
        let mut out = x.clone();
        span_rms_norm(&mut out, width, offset, &w, 1e-6);
        for r in 0..rows {
            let row = &x[r * width..(r + 1) * width];
            let ms: f64 = row[offset..offset + span]
                .iter()
                .map(|&v| (v as f64).powi(2))
                .sum::<f64>()
                / span as f64;
            for c in 0..width {
                let got = out[r * width + c] as f64;
                let want = match c.checked_sub(offset).filter(|&i| i < span) {
                    Some(i) => row[c] as f64 / (ms + 1e-6).sqrt() * w[i] as f64,
                    None => row[c] as f64,
                };
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{r},{c}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn gelu_tanh_mul_matches_f64() {
        let width = 41;
        let g: Vec<f32> = (0..width).map(|i| (i as f32 - 20.0) * 0.45).collect();
        let u: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 / 7.0).collect();
        let gate_up: Vec<f32> = g.iter().chain(&u).copied().collect();
        let mut out = vec![0.0; width];
        gelu_tanh_mul(&gate_up, width, &mut out);
        for ((&o, &g), &u) in out.iter().zip(&g).zip(&u) {
            let (g, u) = (g as f64, u as f64);
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let want = 0.5 * g * (1.0 + (c * (g + 0.044715 * g.powi(3))).tanh()) * u;
            // f32's tanh reaches -1 a little before f64's: outputs near zero are then 0.
            let tol = 1e-6 + 1e-5 * want.abs();
            assert!((o as f64 - want).abs() <= tol, "{g}: {o} vs {want}");
        }
    }

    #[test]
    fn silu_mul_matches_f64_at_every_scale() {
        let width = 37;
        let g: Vec<f32> = (0..width)
            .map(|i| (i as f32 - 18.0) * if i % 3 == 0 { 6.0 } else { 0.37 })
            .collect();
        let u: Vec<f32> = (0..width).map(|i| 1.0 + i as f32 / 10.0).collect();
        let gate_up: Vec<f32> = g.iter().chain(&u).copied().collect();
        let mut out = vec![0.0; width];
        silu_mul(&gate_up, width, &mut out);
        for ((&o, &g), &u) in out.iter().zip(&g).zip(&u) {
            let (g, u) = (g as f64, u as f64);
            let want = g / (1.0 + (-g).exp()) * u;
            assert!(
                (o as f64 - want).abs() <= 1e-6 * want.abs().max(1e-30),
                "{g}: {o} vs {want}"
            );
        }
    }

    /// The vector paths (AVX-512 or AVX2, whichever runs) give the scalar loop's bits,
    /// tails and extremes included.
    #[test]
    fn gelu_simd_equals_scalar_bits() {
        let width = 203;
        let mut seed = 11;
        let mut g: Vec<f32> = (0..width)
            .map(|_| lmi_checkpoint::testing::lcg(&mut seed) * 12.0)
            .collect();
        g[..6].copy_from_slice(&[-0.0, 0.0, -9.0, -30.0, -1e30, 1e30]);
        let u: Vec<f32> = (0..width)
            .map(|_| lmi_checkpoint::testing::lcg(&mut seed) * 3.0)
            .collect();
        let gate_up: Vec<f32> = g.iter().chain(&u).copied().collect();
        let mut simd = vec![0.0; width];
        gelu_tanh_mul(&gate_up, width, &mut simd);
        let scalar: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| gelu1(g, u)).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&simd), bits(&scalar));
        // In place, beside a wider row of other values.
        let other: Vec<f32> = (0..3 * width).map(|i| u[i % width]).collect();
        let mut x = g.clone();
        gelu_tanh_mul_slice(&mut x, &other[..], width, 3 * width, 0);
        assert_eq!(bits(&x), bits(&scalar));
    }

    #[test]
    fn silu_mul_simd_equals_scalar_bits() {
        let width = 203;
        let mut seed = 9;
        let mut g: Vec<f32> = (0..width)
            .map(|_| lmi_checkpoint::testing::lcg(&mut seed) * 40.0)
            .collect();
        g[..6].copy_from_slice(&[-0.0, 0.0, -87.0, -87.5, -1e30, 1e30]);
        let u: Vec<f32> = (0..width)
            .map(|_| lmi_checkpoint::testing::lcg(&mut seed) * 3.0)
            .collect();
        let gate_up: Vec<f32> = g.iter().chain(&u).copied().collect();
        let (mut simd, mut scalar) = (vec![0.0; width], vec![0.0; width]);
        silu_mul(&gate_up, width, &mut simd);
        silu_mul_row(&g, &u, &mut scalar);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&simd), bits(&scalar));
    }
}
