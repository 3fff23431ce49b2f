//! SIMD primitives with a fixed reduction order.
//!
//! Every dot product here is the same sequence of operations whatever else is computed beside
//! it: lane-wise FMAs over consecutive `LANES`-wide chunks, a fixed horizontal sum, then a
//! scalar tail. That makes every kernel built on them *batch invariant*: a sequence's logits
//! are bit-identical alone, in any batch, prefilled at once or in chunks (a seeded request then
//! yields the same tokens however it was scheduled).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Scalar,
}

pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::env::var_os("LMI_CPU_NO_AVX512").is_none()
                && std::arch::is_x86_feature_detected!("avx512f")
            {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    })
}

/// AVX512-BF16 dot products (`vdpbf16ps`): bf16 weights are then multiplied with inputs
/// rounded to bf16 (round-to-nearest-even, as GPUs do), two products per lane per
/// instruction, accumulated in f32. `LMI_CPU_NO_BF16_DOT` turns it off.
pub fn has_bf16_dot() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            isa() == Isa::Avx512
                && std::env::var_os("LMI_CPU_NO_BF16_DOT").is_none()
                && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// AVX-512 is in use and the CPU has AVX512-BF16 (whatever `LMI_CPU_NO_BF16_DOT` says): for
/// rounding to bf16 and for AMX.
pub fn has_avx512bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            isa() == Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// A weight (or KV) element type: f32, or bf16 bit patterns widened to f32 on load.
pub trait WElem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Loads 16 elements as f32.
    ///
    /// # Safety
    /// `p` must cover 16 elements; the caller runs with AVX-512.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
    /// Loads 8 elements as f32.
    ///
    /// # Safety
    /// `p` must cover 8 elements; the caller runs with AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
}

impl WElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl WElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> __m512 {
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// `Σ a[i]·b[i]` in the canonical order.
pub fn dot<W: WElem>(a: &[f32], b: &[W]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut out = [0.0f32; 1];
    // SAFETY: one row of each, lengths checked above; the tile reads a.len() elements.
    unsafe {
        crate::linear::tile_dispatch::<W>(
            isa(),
            1,
            1,
            a.as_ptr(),
            0,
            b.as_ptr(),
            0,
            a.len(),
            out.as_mut_ptr(),
            0,
        )
    };
    out[0]
}

/// `out[j] = Σ a[i]·rows[j·a.len() + i]` for each of `out.len()` contiguous rows, in the
/// canonical order (bit-identical to [`dot`] per row), several rows per tile.
pub fn dots<W: WElem>(a: &[f32], rows: &[W], out: &mut [f32]) {
    let k = a.len();
    assert!(rows.len() >= out.len() * k);
    let isa = isa();
    let mut j = 0;
    while j < out.len() {
        let nr = match (isa, out.len() - j) {
            (Isa::Avx512, r) if r >= 8 => 8,
            (Isa::Avx512, r) if r >= 4 => 4,
            (Isa::Avx2, r) if r >= 8 => 8,
            (Isa::Avx2, r) if r >= 4 => 4,
            _ => 1,
        };
        // SAFETY: rows j..j+nr of k elements exist (asserted); out has nr slots at j.
        unsafe {
            crate::linear::tile_dispatch::<W>(
                isa,
                1,
                nr,
                a.as_ptr(),
                0,
                rows.as_ptr().add(j * k),
                k,
                k,
                out.as_mut_ptr().add(j),
                0,
            )
        };
        j += nr;
    }
}

/// `y += alpha · x`, a rounded product then a rounded sum per element (no FMA), so every
/// width of vector gives the same bits.
#[inline]
pub fn axpy<W: WElem>(y: &mut [f32], alpha: f32, x: &[W]) {
    let n = y.len().min(x.len());
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 {
        // SAFETY: the feature was detected; both slices hold n elements.
        unsafe { axpy512(&mut y[..n], alpha, &x[..n]) };
        return;
    }
    for (y, &x) in y[..n].iter_mut().zip(&x[..n]) {
        *y += alpha * x.to_f32();
    }
}

/// [`accumulate_rows`] for several outputs that share the rows (the q heads of a GQA group):
/// `out[h·d ..][..d] += Σ_j weights[h·w_stride + j] · rows[j]` for `h < out.len() / d` and
/// `j < n`, each row loaded once for all of them. Bit-identical to one `accumulate_rows` per
/// output.
pub fn accumulate_rows_shared<W: WElem>(
    out: &mut [f32],
    d: usize,
    weights: &[f32],
    w_stride: usize,
    n: usize,
    rows: &[W],
) {
    let heads = out.len() / d;
    assert!(rows.len() >= n * d && (heads == 0 || weights.len() >= (heads - 1) * w_stride + n));
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && d.is_multiple_of(64) {
        let mut h = 0;
        while h < heads {
            let take = (heads - h).min(4);
            let (o, w) = (&mut out[h * d..(h + take) * d], &weights[h * w_stride..]);
            // SAFETY: the feature was detected; extents asserted above.
            unsafe {
                match take {
                    4 => shared512::<W, 4>(o, d, w, w_stride, n, rows),
                    3 => shared512::<W, 3>(o, d, w, w_stride, n, rows),
                    2 => shared512::<W, 2>(o, d, w, w_stride, n, rows),
                    _ => shared512::<W, 1>(o, d, w, w_stride, n, rows),
                }
            }
            h += take;
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        let mut h = 0;
        while h < heads {
            // Three heads of 32 columns fill 12 of the 16 registers; four go as two pairs.
            let take = match heads - h {
                4 => 2,
                r => r.min(3),
            };
            let (o, w) = (&mut out[h * d..(h + take) * d], &weights[h * w_stride..]);
            // SAFETY: the features were detected; extents asserted above.
            unsafe {
                match take {
                    3 => shared256::<W, 3>(o, d, w, w_stride, n, rows),
                    2 => shared256::<W, 2>(o, d, w, w_stride, n, rows),
                    _ => shared256::<W, 1>(o, d, w, w_stride, n, rows),
                }
            }
            h += take;
        }
        return;
    }
    for h in 0..heads {
        let w = &weights[h * w_stride..][..n];
        accumulate_rows(&mut out[h * d..(h + 1) * d], w, &rows[..n * d]);
    }
}

/// [`accumulate_rows_shared`] on AVX2 for `H` outputs: 32 columns (four registers an
/// output) at a time across all rows, then 8, then scalars; each step a rounded product and
/// a rounded sum, as [`axpy`].
///
/// # Safety
/// AVX2 is available; `out` holds `H·d` values, `rows` `n·d`, `weights` `(H-1)·w_stride + n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn shared256<W: WElem, const H: usize>(
    out: &mut [f32],
    d: usize,
    weights: &[f32],
    w_stride: usize,
    n: usize,
    rows: &[W],
) {
    let mut c = 0;
    while c + 32 <= d {
        // SAFETY: columns c..c+32 of the outputs and rows exist (caller).
        unsafe { columns256::<W, H, 4>(out, d, weights, w_stride, n, rows, c) };
        c += 32;
    }
    while c + 8 <= d {
        // SAFETY: as above for 8 columns.
        unsafe { columns256::<W, H, 1>(out, d, weights, w_stride, n, rows, c) };
        c += 8;
    }
    for h in 0..H {
        for j in 0..n {
            let w = weights[h * w_stride + j];
            for (o, &x) in out[h * d + c..(h + 1) * d]
                .iter_mut()
                .zip(&rows[j * d + c..][..d - c])
            {
                *o += w * x.to_f32();
            }
        }
    }
}

/// Columns `c..c + 8·Q` of `H` outputs, held in registers across the `n` rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn columns256<W: WElem, const H: usize, const Q: usize>(
    out: &mut [f32],
    d: usize,
    weights: &[f32],
    w_stride: usize,
    n: usize,
    rows: &[W],
    c: usize,
) {
    // SAFETY: the caller guarantees the extents.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); Q]; H];
        for (h, acc) in acc.iter_mut().enumerate() {
            for (q, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(out.as_ptr().add(h * d + c + 8 * q));
            }
        }
        for j in 0..n {
            let r = rows.as_ptr().add(j * d + c);
            let mut v = [_mm256_setzero_ps(); Q];
            for (q, v) in v.iter_mut().enumerate() {
                *v = W::load8(r.add(8 * q));
            }
            for (h, acc) in acc.iter_mut().enumerate() {
                let a = _mm256_set1_ps(*weights.get_unchecked(h * w_stride + j));
                for (q, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(a, v[q]));
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (q, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(h * d + c + 8 * q), *a);
            }
        }
    }
}

/// `H` outputs × 64 columns of accumulators (4H registers) across all rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn shared512<W: WElem, const H: usize>(
    out: &mut [f32],
    d: usize,
    weights: &[f32],
    w_stride: usize,
    n: usize,
    rows: &[W],
) {
    for c in (0..d).step_by(64) {
        // SAFETY: out holds H·d values, rows n·d, weights (H-1)·w_stride + n (caller).
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 4]; H];
            for (h, acc) in acc.iter_mut().enumerate() {
                for (q, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(out.as_ptr().add(h * d + c + 16 * q));
                }
            }
            for j in 0..n {
                let r = rows.as_ptr().add(j * d + c);
                let v = [
                    W::load16(r),
                    W::load16(r.add(16)),
                    W::load16(r.add(32)),
                    W::load16(r.add(48)),
                ];
                for (h, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*weights.get_unchecked(h * w_stride + j));
                    for (q, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(a, v[q]));
                    }
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                for (q, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(out.as_mut_ptr().add(h * d + c + 16 * q), *a);
                }
            }
        }
    }
}

/// `out += Σ_j weights[j] · rows[j]` over contiguous rows of `out.len()` elements, row after
/// row, each step the same rounded product and rounded sum as [`axpy`] (so the bits equal a
/// loop of `axpy`), with `out` held in registers across rows.
pub fn accumulate_rows<W: WElem>(out: &mut [f32], weights: &[f32], rows: &[W]) {
    let d = out.len();
    assert!(rows.len() >= weights.len() * d);
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 {
        // SAFETY: the feature was detected; lengths asserted above.
        unsafe { accumulate_rows512(out, weights, rows) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx2 {
        // SAFETY: the features were detected; lengths asserted above.
        unsafe { shared256::<W, 1>(out, d, weights, 0, weights.len(), rows) };
        return;
    }
    for (j, &w) in weights.iter().enumerate() {
        axpy(out, w, &rows[j * d..(j + 1) * d]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_rows512<W: WElem>(out: &mut [f32], weights: &[f32], rows: &[W]) {
    let d = out.len();
    let mut c = 0;
    // 64 columns (four registers) at a time, then 16, then scalars.
    while c + 64 <= d {
        // SAFETY: columns c..c+64 of out and of each of the weights.len() rows exist.
        unsafe {
            let o = out.as_mut_ptr().add(c);
            let mut acc = [
                _mm512_loadu_ps(o),
                _mm512_loadu_ps(o.add(16)),
                _mm512_loadu_ps(o.add(32)),
                _mm512_loadu_ps(o.add(48)),
            ];
            for (j, &w) in weights.iter().enumerate() {
                let a = _mm512_set1_ps(w);
                let r = rows.as_ptr().add(j * d + c);
                for (q, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_add_ps(*acc, _mm512_mul_ps(a, W::load16(r.add(16 * q))));
                }
            }
            for (q, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.add(16 * q), *acc);
            }
        }
        c += 64;
    }
    while c + 16 <= d {
        // SAFETY: as above for 16 columns.
        unsafe {
            let o = out.as_mut_ptr().add(c);
            let mut acc = _mm512_loadu_ps(o);
            for (j, &w) in weights.iter().enumerate() {
                let r = rows.as_ptr().add(j * d + c);
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(w), W::load16(r)));
            }
            _mm512_storeu_ps(o, acc);
        }
        c += 16;
    }
    for (j, &w) in weights.iter().enumerate() {
        for (o, &x) in out[c..].iter_mut().zip(&rows[j * d + c..(j + 1) * d]) {
            *o += w * x.to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy512<W: WElem>(y: &mut [f32], alpha: f32, x: &[W]) {
    let main = y.len() / 16 * 16;
    let a = _mm512_set1_ps(alpha);
    let mut i = 0;
    while i < main {
        // SAFETY: i + 16 ≤ len of both slices.
        unsafe {
            let p = y.as_mut_ptr().add(i);
            let v = _mm512_add_ps(
                _mm512_loadu_ps(p),
                _mm512_mul_ps(a, W::load16(x.as_ptr().add(i))),
            );
            _mm512_storeu_ps(p, v);
        }
        i += 16;
    }
    for (y, &x) in y[main..].iter_mut().zip(&x[main..]) {
        *y += alpha * x.to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulate_rows_equals_axpy_row_by_row() {
        for d in [64, 80, 128, 7] {
            let rows: Vec<f32> = (0..13 * d)
                .map(|i| ((i * 53 % 29) as f32 - 14.0) / 9.0)
                .collect();
            let w: Vec<f32> = (0..13).map(|j| (j as f32 - 5.5) / 3.3).collect();
            let mut want: Vec<f32> = (0..d).map(|i| i as f32 / 7.0).collect();
            let mut got = want.clone();
            for (j, &wj) in w.iter().enumerate() {
                for (o, &x) in want.iter_mut().zip(&rows[j * d..(j + 1) * d]) {
                    *o += wj * x;
                }
            }
            accumulate_rows(&mut got, &w, &rows);
            assert_eq!(got, want, "d = {d}");
        }
    }

    #[test]
    fn shared_rows_equal_the_scalar_accumulation() {
        for (d, heads) in [(64, 3), (128, 5), (48, 2), (70, 4), (64, 1)] {
            let n = 11;
            let rows: Vec<u16> = (0..n * d)
                .map(|i| half::bf16::from_f32(((i * 53 % 29) as f32 - 14.0) / 9.0).to_bits())
                .collect();
            let stride = 20;
            let w: Vec<f32> = (0..heads * stride)
                .map(|j| (j as f32 - 5.5) / 3.3)
                .collect();
            let init: Vec<f32> = (0..heads * d).map(|i| i as f32 / 7.0).collect();
            let mut want = init.clone();
            // Row after row, a rounded product and a rounded sum per element (`axpy`).
            for h in 0..heads {
                for j in 0..n {
                    let (o, r) = (&mut want[h * d..(h + 1) * d], &rows[j * d..(j + 1) * d]);
                    for (o, &x) in o.iter_mut().zip(r) {
                        *o += w[h * stride + j] * x.to_f32();
                    }
                }
            }
            let mut got = init;
            accumulate_rows_shared(&mut got, d, &w, stride, n, &rows);
            assert_eq!(got, want, "d = {d}, heads = {heads}");
        }
    }

    #[test]
    fn dots_equal_dot_row_by_row() {
        let k = 64;
        let a: Vec<f32> = (0..k).map(|i| ((i * 37 % 17) as f32 - 8.0) / 7.0).collect();
        for rows in [1, 3, 4, 7, 8, 13, 16] {
            let m: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 53 % 29) as f32 - 14.0) / 9.0)
                .collect();
            let mut out = vec![0.0; rows];
            dots(&a, &m, &mut out);
            for (j, &o) in out.iter().enumerate() {
                assert_eq!(o.to_bits(), dot(&a, &m[j * k..(j + 1) * k]).to_bits());
            }
        }
    }
}
