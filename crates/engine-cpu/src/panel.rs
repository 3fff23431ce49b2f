//! Products for f32 matrices that only ever multiply many rows at once (an encoder's, whose
//! steps are whole sequences): the weight `[n, k]` packed in panels of 32 output columns, each
//! `[k][32]`, and an outer-product kernel that broadcasts each input value against a panel row
//! (up to 8 rows × 32 columns of accumulators, every load feeding several FMAs).
//!
//! Each output element is `k` fused multiply-adds in order from `t = 0`, then its bias: one
//! canonical order whatever the tile, the row count or the thread split, so a row's result
//! does not depend on the other rows of the step (batch invariance). It is not the order of
//! `linear.rs`'s kernels; a matrix is packed here only when every product it takes goes
//! through this kernel ([`Backend::upload_encoder_weight`]).
//!
//! [`Backend::upload_encoder_weight`]: lmi_engine_core::backend::Backend::upload_encoder_weight

use crate::simd::{Isa, isa};

/// Output columns per panel.
const NR: usize = 32;
/// Rows per kernel call at most.
const MR: usize = 8;
/// Rows and panels per parallel task.
const TASK_ROWS: usize = 64;
const TASK_PANELS: usize = 4;

/// A matrix `[n, k]` in panels of [`NR`] columns (the last one zero-padded).
pub struct PanelWeight {
    data: Vec<f32>,
    n: usize,
    k: usize,
}

impl PanelWeight {
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k);
        let panels = n.div_ceil(NR);
        let mut data = vec![0.0f32; panels * k * NR];
        for (c, row) in w.chunks_exact(k).enumerate() {
            let panel = &mut data[c / NR * k * NR..];
            for (t, &v) in row.iter().enumerate() {
                panel[t * NR + c % NR] = v;
            }
        }
        PanelWeight { data, n, k }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Row `r` of the original matrix.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let panel = &self.data[r / NR * self.k * NR..];
        for (t, o) in out[..self.k].iter_mut().enumerate() {
            *o = panel[t * NR + r % NR];
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint (rows, columns) blocks of the output.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `out[m, n] = x[m, k] · wᵀ (+ bias)`.
pub fn linear(x: &[f32], m: usize, w: &PanelWeight, bias: Option<&[f32]>, out: &mut [f32]) {
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= m * k && out.len() >= m * n);
    if let Some(b) = bias {
        assert!(b.len() >= n);
    }
    let panels = n.div_ceil(NR);
    let row_tasks = m.div_ceil(TASK_ROWS);
    let panel_tasks = panels.div_ceil(TASK_PANELS);
    if m * n * k < 1 << 18 || row_tasks * panel_tasks == 1 {
        // SAFETY: extents asserted above; one task writes everything.
        unsafe { block(x, k, &w.data, n, bias, out.as_mut_ptr(), 0..m, 0..panels) };
        return;
    }
    let out_ptr = SendPtr(out.as_mut_ptr());
    crate::pool::run(row_tasks * panel_tasks, |t| {
        let (rt, pt) = (t / panel_tasks, t % panel_tasks);
        let (r0, p0) = (rt * TASK_ROWS, pt * TASK_PANELS);
        let rows = r0..(r0 + TASK_ROWS).min(m);
        let cols = p0..(p0 + TASK_PANELS).min(panels);
        // SAFETY: extents asserted above; tasks write disjoint blocks.
        unsafe { block(x, k, &w.data, n, bias, out_ptr.get(), rows, cols) };
    });
}

/// Packs `n` rows of `k` (row `c`'s element `t` is `at(c, t)`) into panels in `data` (grown as
/// needed; padding columns are left as they were: their outputs are never stored).
pub(crate) fn pack_with(data: &mut Vec<f32>, n: usize, k: usize, at: impl Fn(usize, usize) -> f32) {
    let len = n.div_ceil(NR) * k * NR;
    if data.len() < len {
        data.resize(len, 0.0);
    }
    for c in 0..n {
        let panel = &mut data[c / NR * k * NR..];
        for t in 0..k {
            panel[t * NR + c % NR] = at(c, t);
        }
    }
}

/// `out[m, n] = x[m, k] · wᵀ` on this thread, `w` packed by [`pack_with`] in `panels`.
pub(crate) fn linear_packed(
    x: &[f32],
    m: usize,
    panels: &[f32],
    n: usize,
    k: usize,
    out: &mut [f32],
) {
    assert!(x.len() >= m * k && out.len() >= m * n && panels.len() >= n.div_ceil(NR) * k * NR);
    // SAFETY: extents asserted above.
    unsafe {
        block(
            x,
            k,
            panels,
            n,
            None,
            out.as_mut_ptr(),
            0..m,
            0..n.div_ceil(NR),
        )
    };
}

/// Rows `rows` of `x` against panels `cols` of `data` (a matrix of `n` columns), into `out`
/// (`n` wide).
///
/// # Safety
/// `x` covers the rows, `data` the panels, `out` the rows × columns written.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    x: &[f32],
    k: usize,
    data: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) {
    let isa = isa();
    for p in cols {
        let width = (n - p * NR).min(NR);
        let panel = &data[p * k * NR..(p + 1) * k * NR];
        let b = bias.map(|b| &b[p * NR..p * NR + width]);
        let mut i = rows.start;
        while i < rows.end {
            let mr = (rows.end - i).min(MR);
            // SAFETY: the caller guarantees the extents.
            unsafe {
                kernel(
                    isa,
                    mr,
                    x.as_ptr().add(i * k),
                    k,
                    panel,
                    out.add(i * n + p * NR),
                    n,
                    width,
                    b,
                )
            };
            i += mr;
        }
    }
}

/// `mr` rows of `x` (stride `ldx`) against one panel, into `cols` columns of `out` (stride
/// `ldo`), plus `bias`.
///
/// # Safety
/// `x` covers `mr` rows of `k`, `panel` holds `k · NR` values, `out` the `mr × cols` block.
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    isa: Isa,
    mr: usize,
    x: *const f32,
    ldx: usize,
    panel: &[f32],
    out: *mut f32,
    ldo: usize,
    cols: usize,
    bias: Option<&[f32]>,
) {
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => match mr {
                8 => x86::k512::<8>(x, ldx, panel, out, ldo, cols, bias),
                7 => x86::k512::<7>(x, ldx, panel, out, ldo, cols, bias),
                6 => x86::k512::<6>(x, ldx, panel, out, ldo, cols, bias),
                5 => x86::k512::<5>(x, ldx, panel, out, ldo, cols, bias),
                4 => x86::k512::<4>(x, ldx, panel, out, ldo, cols, bias),
                3 => x86::k512::<3>(x, ldx, panel, out, ldo, cols, bias),
                2 => x86::k512::<2>(x, ldx, panel, out, ldo, cols, bias),
                _ => x86::k512::<1>(x, ldx, panel, out, ldo, cols, bias),
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // Four rows × 32 columns fill 16 registers; more rows go four at a time.
                let mut i = 0;
                while i < mr {
                    let r = (mr - i).min(4);
                    let (xi, oi) = (x.add(i * ldx), out.add(i * ldo));
                    match r {
                        4 => x86::k256::<4>(xi, ldx, panel, oi, ldo, cols, bias),
                        3 => x86::k256::<3>(xi, ldx, panel, oi, ldo, cols, bias),
                        2 => x86::k256::<2>(xi, ldx, panel, oi, ldo, cols, bias),
                        _ => x86::k256::<1>(xi, ldx, panel, oi, ldo, cols, bias),
                    }
                    i += r;
                }
            }
            _ => scalar(mr, x, ldx, panel, out, ldo, cols, bias),
        }
    }
}

/// The same operations one element at a time (`mul_add` is the fused multiply-add).
#[allow(clippy::too_many_arguments)]
unsafe fn scalar(
    mr: usize,
    x: *const f32,
    ldx: usize,
    panel: &[f32],
    out: *mut f32,
    ldo: usize,
    cols: usize,
    bias: Option<&[f32]>,
) {
    let k = panel.len() / NR;
    for r in 0..mr {
        for c in 0..cols {
            let mut s = 0.0f32;
            for t in 0..k {
                // SAFETY: the caller guarantees the extents.
                s = unsafe { *x.add(r * ldx + t) }.mul_add(panel[t * NR + c], s);
            }
            let b = bias.map_or(0.0, |b| b[c]);
            unsafe { *out.add(r * ldo + c) = s + b };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::NR;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn k512<const MR: usize>(
        x: *const f32,
        ldx: usize,
        panel: &[f32],
        out: *mut f32,
        ldo: usize,
        cols: usize,
        bias: Option<&[f32]>,
    ) {
        let k = panel.len() / NR;
        let p = panel.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        unsafe {
            for t in 0..k {
                let w0 = _mm512_loadu_ps(p.add(t * NR));
                let w1 = _mm512_loadu_ps(p.add(t * NR + 16));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xb = _mm512_set1_ps(*x.add(r * ldx + t));
                    a[0] = _mm512_fmadd_ps(xb, w0, a[0]);
                    a[1] = _mm512_fmadd_ps(xb, w1, a[1]);
                }
            }
            store(&acc, out, ldo, cols, bias);
        }
    }

    /// [`k512`] on bf16 pairs: `x` rows of `k2` pairs (stride `k2` pairs), the panel
    /// `[k2][NR][2]`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn kbf<const MR: usize>(
        x: *const u16,
        k2: usize,
        panel: &[u16],
        out: *mut f32,
        ldo: usize,
        cols: usize,
        bias: Option<&[f32]>,
    ) {
        let p = panel.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        unsafe {
            for t in 0..k2 {
                let w0: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(p.add(t * NR * 2) as *const _));
                let w1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(p.add(t * NR * 2 + 32) as *const _));
                for (r, a) in acc.iter_mut().enumerate() {
                    let pair = (x.add((r * k2 + t) * 2) as *const i32).read_unaligned();
                    let xb: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    a[0] = _mm512_dpbf16_ps(a[0], xb, w0);
                    a[1] = _mm512_dpbf16_ps(a[1], xb, w1);
                }
            }
            store(&acc, out, ldo, cols, bias);
        }
    }

    /// Each accumulator row plus the bias, into the `cols` valid columns.
    #[target_feature(enable = "avx512f")]
    unsafe fn store<const MR: usize>(
        acc: &[[__m512; 2]; MR],
        out: *mut f32,
        ldo: usize,
        cols: usize,
        bias: Option<&[f32]>,
    ) {
        let mask = |h: usize| -> __mmask16 {
            let c = cols.saturating_sub(16 * h).min(16);
            ((1u32 << c) - 1) as __mmask16
        };
        let (m0, m1) = (mask(0), mask(1));
        unsafe {
            let (b0, b1) = match bias {
                Some(b) => (
                    _mm512_maskz_loadu_ps(m0, b.as_ptr()),
                    _mm512_maskz_loadu_ps(m1, b.as_ptr().wrapping_add(16)),
                ),
                None => (_mm512_setzero_ps(), _mm512_setzero_ps()),
            };
            for (r, a) in acc.iter().enumerate() {
                let o = out.add(r * ldo);
                _mm512_mask_storeu_ps(o, m0, _mm512_add_ps(a[0], b0));
                _mm512_mask_storeu_ps(o.wrapping_add(16), m1, _mm512_add_ps(a[1], b1));
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn k256<const MR: usize>(
        x: *const f32,
        ldx: usize,
        panel: &[f32],
        out: *mut f32,
        ldo: usize,
        cols: usize,
        bias: Option<&[f32]>,
    ) {
        let k = panel.len() / NR;
        let p = panel.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 4]; MR];
        unsafe {
            for t in 0..k {
                let w = [0, 8, 16, 24].map(|c| _mm256_loadu_ps(p.add(t * NR + c)));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xb = _mm256_set1_ps(*x.add(r * ldx + t));
                    for (a, w) in a.iter_mut().zip(&w) {
                        *a = _mm256_fmadd_ps(xb, *w, *a);
                    }
                }
            }
            let mut row = [0.0f32; NR];
            for (r, a) in acc.iter().enumerate() {
                for (q, v) in a.iter().enumerate() {
                    _mm256_storeu_ps(row.as_mut_ptr().add(8 * q), *v);
                }
                for (c, v) in row[..cols].iter().enumerate() {
                    *out.add(r * ldo + c) = v + bias.map_or(0.0, |b| b[c]);
                }
            }
        }
    }
}

/// A bf16 matrix `[n, k]` for AVX512-BF16's `vdpbf16ps`: panels of [`NR`] columns, each
/// `[k / 2][NR][2]` (pairs of consecutive `k`, the last zero-padded when `k` is odd).
pub struct PanelWeightBf16 {
    data: Vec<u16>,
    n: usize,
    k: usize,
}

impl PanelWeightBf16 {
    /// Whether this CPU runs it (AVX512-BF16 in use).
    pub fn available() -> bool {
        crate::simd::has_bf16_dot()
    }

    pub fn pack(w: &[u16], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k);
        let (panels, k2) = (n.div_ceil(NR), k.div_ceil(2));
        let mut data = vec![0u16; panels * k2 * NR * 2];
        for (c, row) in w.chunks_exact(k).enumerate() {
            let panel = &mut data[c / NR * k2 * NR * 2..];
            for (t, &v) in row.iter().enumerate() {
                panel[(t / 2 * NR + c % NR) * 2 + t % 2] = v;
            }
        }
        PanelWeightBf16 { data, n, k }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }

    /// Row `r` of the original matrix, widened to f32.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let k2 = self.k.div_ceil(2);
        let panel = &self.data[r / NR * k2 * NR * 2..];
        for (t, o) in out[..self.k].iter_mut().enumerate() {
            *o = f32::from_bits((panel[(t / 2 * NR + r % NR) * 2 + t % 2] as u32) << 16);
        }
    }
}

/// `out[m, n] = x[m, k] · wᵀ (+ bias)` with the inputs rounded to bf16 (to nearest even, as
/// every bf16 product here takes them), each element one `vdpbf16ps` chain over the pairs of
/// `k` in order, then its bias.
pub fn linear_bf16(
    x: &[f32],
    m: usize,
    w: &PanelWeightBf16,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= m * k && out.len() >= m * n);
    if let Some(b) = bias {
        assert!(b.len() >= n);
    }
    // Rows of k / 2 pairs, the odd k's last pair padded with zero.
    let k2 = k.div_ceil(2);
    let mut xb = vec![0u16; m * k2 * 2];
    for (src, dst) in x[..m * k].chunks_exact(k).zip(xb.chunks_exact_mut(k2 * 2)) {
        crate::linear::round_bf16_into(src, &mut dst[..k]);
    }
    let panels = n.div_ceil(NR);
    let row_tasks = m.div_ceil(TASK_ROWS);
    let panel_tasks = panels.div_ceil(TASK_PANELS);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let run = |rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
        let o = out_ptr.get();
        for p in cols {
            let width = (n - p * NR).min(NR);
            let panel = &w.data[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
            let b = bias.map(|b| &b[p * NR..p * NR + width]);
            let mut i = rows.start;
            while i < rows.end {
                let mr = (rows.end - i).min(MR);
                // SAFETY: rows i..i+mr of xb exist; the output block lies in `out` and
                // belongs to this task; the CPU has AVX512-BF16 (checked at upload).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    let (xi, oi) = (xb.as_ptr().add(i * k2 * 2), o.add(i * n + p * NR));
                    match mr {
                        8 => x86::kbf::<8>(xi, k2, panel, oi, n, width, b),
                        7 => x86::kbf::<7>(xi, k2, panel, oi, n, width, b),
                        6 => x86::kbf::<6>(xi, k2, panel, oi, n, width, b),
                        5 => x86::kbf::<5>(xi, k2, panel, oi, n, width, b),
                        4 => x86::kbf::<4>(xi, k2, panel, oi, n, width, b),
                        3 => x86::kbf::<3>(xi, k2, panel, oi, n, width, b),
                        2 => x86::kbf::<2>(xi, k2, panel, oi, n, width, b),
                        _ => x86::kbf::<1>(xi, k2, panel, oi, n, width, b),
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (panel, b, o);
                i += mr;
            }
        }
    };
    if m * n * k < 1 << 18 || row_tasks * panel_tasks == 1 {
        run(0..m, 0..panels);
        return;
    }
    crate::pool::run(row_tasks * panel_tasks, |t| {
        let (rt, pt) = (t / panel_tasks, t % panel_tasks);
        let (r0, p0) = (rt * TASK_ROWS, pt * TASK_PANELS);
        run(
            r0..(r0 + TASK_ROWS).min(m),
            p0..(p0 + TASK_PANELS).min(panels),
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_checkpoint::testing::lcg;

    /// Every element is the fused multiply-adds in order, then the bias: the scalar loop's
    /// bits, for any row count (tails of the 8-row tiles, a partial last panel), alone or
    /// among other rows, and within f64 rounding of the exact product.
    #[test]
    fn equals_the_canonical_order_for_any_rows() {
        let mut seed = 17;
        for (n, k) in [(40, 24), (96, 384), (7, 5)] {
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
            let b: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let p = PanelWeight::pack(&w, n, k);
            let mut row = vec![0.0; k];
            p.row_into(n - 1, &mut row);
            assert_eq!(row, w[(n - 1) * k..]);
            let m = 77;
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 2.0).collect();
            let mut out = vec![0.0; m * n];
            linear(&x, m, &p, Some(&b), &mut out);
            for r in 0..m {
                for c in 0..n {
                    let mut s = 0.0f32;
                    for t in 0..k {
                        s = x[r * k + t].mul_add(w[c * k + t], s);
                    }
                    assert_eq!(
                        out[r * n + c].to_bits(),
                        (s + b[c]).to_bits(),
                        "({n}, {k}) [{r}, {c}]"
                    );
                    let exact: f64 = (0..k)
                        .map(|t| x[r * k + t] as f64 * w[c * k + t] as f64)
                        .sum::<f64>()
                        + b[c] as f64;
                    assert!((out[r * n + c] as f64 - exact).abs() < 1e-4);
                }
            }
            let mut one = vec![0.0; n];
            linear(&x[5 * k..6 * k], 1, &p, Some(&b), &mut one);
            assert_eq!(one, out[5 * n..6 * n]);
        }
    }

    /// bf16 panels: each element is the `vdpbf16ps` chain over `k`'s pairs of the rounded
    /// inputs, the same bits for any row count, within bf16 input rounding of the product.
    #[test]
    fn bf16_panels_are_batch_invariant() {
        if !PanelWeightBf16::available() {
            return;
        }
        let mut seed = 23;
        for (n, k) in [(40, 25), (96, 384)] {
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
            let wb: Vec<u16> = w
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let b: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let p = PanelWeightBf16::pack(&wb, n, k);
            let mut row = vec![0.0; k];
            p.row_into(n - 1, &mut row);
            let want: Vec<f32> = wb[(n - 1) * k..]
                .iter()
                .map(|&v| f32::from_bits((v as u32) << 16))
                .collect();
            assert_eq!(row, want);
            let m = 77;
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 2.0).collect();
            let mut out = vec![0.0; m * n];
            linear_bf16(&x, m, &p, Some(&b), &mut out);
            for r in 0..m {
                let mut one = vec![0.0; n];
                linear_bf16(&x[r * k..(r + 1) * k], 1, &p, Some(&b), &mut one);
                assert_eq!(one, out[r * n..(r + 1) * n], "({n}, {k}) row {r}");
                for c in 0..n {
                    let exact: f64 = (0..k)
                        .map(|t| {
                            let xr = half::bf16::from_f32(x[r * k + t]).to_f32() as f64;
                            xr * f32::from_bits((wb[c * k + t] as u32) << 16) as f64
                        })
                        .sum::<f64>()
                        + b[c] as f64;
                    assert!((out[r * n + c] as f64 - exact).abs() < 1e-3, "[{r}, {c}]");
                }
            }
        }
    }
}
