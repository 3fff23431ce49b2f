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

use rayon::prelude::*;

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
    let isa = isa();
    let panels = n.div_ceil(NR);
    let out_ptr = SendPtr(out.as_mut_ptr());
    // Rows `r0..r1` against panels `p0..p1`.
    let block = |r0: usize, r1: usize, p0: usize, p1: usize| {
        let o = out_ptr.get();
        for p in p0..p1 {
            let cols = (n - p * NR).min(NR);
            let panel = &w.data[p * k * NR..(p + 1) * k * NR];
            let b = bias.map(|b| &b[p * NR..p * NR + cols]);
            let mut i = r0;
            while i < r1 {
                let mr = (r1 - i).min(MR);
                // SAFETY: rows i..i+mr of x exist (asserted); the output block lies in `out`
                // (rows < m, columns p·NR .. p·NR + cols < n) and belongs to this task.
                unsafe {
                    kernel(
                        isa,
                        mr,
                        x.as_ptr().add(i * k),
                        k,
                        panel,
                        o.add(i * n + p * NR),
                        n,
                        cols,
                        b,
                    )
                };
                i += mr;
            }
        }
    };
    let row_tasks = m.div_ceil(TASK_ROWS);
    let panel_tasks = panels.div_ceil(TASK_PANELS);
    if m * n * k < 1 << 18 || row_tasks * panel_tasks == 1 {
        block(0, m, 0, panels);
        return;
    }
    (0..row_tasks * panel_tasks).into_par_iter().for_each(|t| {
        let (rt, pt) = (t / panel_tasks, t % panel_tasks);
        let r0 = rt * TASK_ROWS;
        let p0 = pt * TASK_PANELS;
        block(
            r0,
            (r0 + TASK_ROWS).min(m),
            p0,
            (p0 + TASK_PANELS).min(panels),
        );
    });
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
            let mask = |h: usize| -> __mmask16 {
                let c = cols.saturating_sub(16 * h).min(16);
                ((1u32 << c) - 1) as __mmask16
            };
            let (m0, m1) = (mask(0), mask(1));
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
}
