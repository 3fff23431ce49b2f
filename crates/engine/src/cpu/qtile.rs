//! Quantized products over many rows: each group of weight rows is dequantized once into bf16
//! (in L1/L2, never kept), then every input row runs through `vdpbf16ps` against it, as bf16
//! weights do (`linear.rs`). The int8 kernels (`qlinear.rs`) spend four vector operations per
//! 64 products on every row (the dot product, its conversion, two scale operations); here a
//! row costs two, and the dequantization is paid once per weight for the whole step. Memory
//! stays the file's: only the group being read is ever in bf16.
//!
//! The numbers differ from the int8 path's (inputs rounded to bf16 instead of int8 with a
//! scale per 4 values; weights rounded to bf16 after dequantization), so a row's result
//! depends on which path its step took: `qlinear` takes this one only when the step has
//! enough rows and the engine was not asked to be batch invariant (`KernelChoice`).
//!
//! Values are laid out in the packed pair order (`qact::pair_pos`) on both sides: a dot
//! product does not care about the order, and the weights dequantize without a shuffle.

use rayon::prelude::*;

use super::qpack::Packed;

/// Rows from which a step takes this path (`cargo bench -p lmi-engine --bench qlinear`: at 8
/// rows the two paths are about even, dequantizing costing what the scale arithmetic saves).
pub(crate) const MIN_ROWS: usize = 16;

/// Whether a product of `rows` rows takes this path on this CPU.
pub(crate) fn takes(rows: usize) -> bool {
    rows >= MIN_ROWS && available()
}

/// Weight rows dequantized at once: 16 rows of 2048 values are 64 KiB of bf16, inside L2,
/// and each is read by every input row of the step.
const GROUP_ROWS: usize = 16;
// `x86::group_product` keeps a 4-row tile's accumulators for 16 weight rows.
const _: () = assert!(GROUP_ROWS == 16);

/// Whether this CPU runs the path: the AVX-512 packed form and AVX512-BF16.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::qlinear::qpath_is_512() && super::simd::has_bf16_dot()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: tasks write disjoint column ranges of the output.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// # Safety
    /// `offset` must lie inside the allocation.
    unsafe fn at(&self, offset: usize) -> *mut T {
        unsafe { self.0.add(offset) }
    }
}

/// `out[m, n] = x[m, k] · wᵀ` over the parts' rows in order. Requires [`available`].
pub(crate) fn qlinear_bf16(x: &[f32], m: usize, parts: &[Packed], out: &mut [f32]) {
    let k = parts[0].cols;
    let nsub = parts[0].nsub;
    let kp = nsub * 32;
    let n: usize = parts.iter().map(|p| p.rows).sum();
    assert!(available() && x.len() >= m * k && out.len() >= m * n);
    assert!(parts.iter().all(|p| p.cols == k && p.nsub == nsub));
    let xb = inputs_bf16(x, m, k, kp);
    // Groups of weight rows, never straddling parts: (part, first row, rows, output column).
    let mut groups = Vec::with_capacity(n / GROUP_ROWS + parts.len());
    let mut col = 0;
    for (pi, p) in parts.iter().enumerate() {
        let mut r = 0;
        while r < p.rows {
            let nr = (p.rows - r).min(GROUP_ROWS);
            groups.push((pi, r, nr, col));
            r += nr;
            col += nr;
        }
    }
    let o = SendPtr(out.as_mut_ptr());
    let xp = SendPtr(xb.as_ptr() as *mut u16);
    let run = |&(pi, r0, nr, c0): &(usize, usize, usize, usize)| {
        WEIGHTS.with_borrow_mut(|wb| {
            wb.resize(GROUP_ROWS * kp, 0);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the path is available (asserted); the group's rows exist in the part,
            // `wb` holds `nr` rows of `kp`, `xb` m rows of `kp`, and the group's output
            // columns are this task's alone.
            unsafe {
                x86::dequantize(&parts[pi], r0, nr, wb.as_mut_ptr(), kp);
                x86::group_product(xp.at(0), m, wb.as_ptr(), nr, kp, o.at(c0), n);
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (pi, r0, nr, c0, &o, &xp);
        })
    };
    let threads = rayon::current_num_threads().max(1);
    if threads == 1 || groups.len() == 1 {
        groups.iter().for_each(run);
    } else {
        groups.par_iter().for_each(run);
    }
}

thread_local! {
    /// One group of dequantized weight rows per thread, reused across products.
    static WEIGHTS: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The inputs rounded to bf16 (nearest even) in pair order, zero-padded to `kp`.
fn inputs_bf16(x: &[f32], m: usize, k: usize, kp: usize) -> Vec<u16> {
    let mut natural = vec![0u16; kp];
    let mut out = vec![0u16; m * kp];
    for (r, o) in out.chunks_exact_mut(kp).enumerate() {
        super::linear::round_bf16_into(&x[r * k..(r + 1) * k], &mut natural[..k]);
        // Natural [a0..32 | b0..32] → [a0..16, b0..16, a16..32, b16..32].
        for (src, dst) in natural.chunks_exact(64).zip(o.chunks_exact_mut(64)) {
            dst[..16].copy_from_slice(&src[..16]);
            dst[16..32].copy_from_slice(&src[32..48]);
            dst[32..48].copy_from_slice(&src[16..32]);
            dst[48..].copy_from_slice(&src[48..]);
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::cpu::qpack::Packed;
    use crate::cpu::qpack::x86::*;
    use crate::quant::QType;

    /// Values of K a pass covers: four input rows (4 KiB) and the group's sixteen weight rows
    /// (16 KiB) of it stay in L1 while every tile of the group reads them. (One pass over rows
    /// of 2048 read 32 KiB a tile and ran slower than the int8 kernels.)
    const KC: usize = 512;

    /// `out[i·ldo + j] = Σ_t x[i·k + t] · w[j·k + t]` for i < m, j < nr (nr ≤ GROUP_ROWS): tiles of 4
    /// input rows by 4 weight rows, K in passes of [`KC`] with the tiles' accumulators kept in
    /// L1 between passes. Each output's lanes see the same `vdpbf16ps` sequence, in order,
    /// whatever `m` and the pass boundaries, then one fixed horizontal sum.
    ///
    /// # Safety
    /// AVX512-BF16; `x` holds m rows of k, `w` nr rows of k (k a multiple of 32); the output
    /// rows and columns exist.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn group_product(
        x: *const u16,
        m: usize,
        w: *const u16,
        nr: usize,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let mut acc = [_mm512_setzero_ps(); 4 * 16];
            let a = acc.as_mut_ptr();
            let mut i = 0;
            while i < m {
                let mr = if m - i >= 4 { 4 } else { 1 };
                acc.iter_mut().for_each(|v| *v = _mm512_setzero_ps());
                let mut t0 = 0;
                while t0 < k {
                    let t1 = (t0 + KC).min(k);
                    let mut j = 0;
                    while j < nr {
                        let xi = x.add(i * k);
                        let wj = w.add(j * k);
                        let aj = a.add(j);
                        match (mr, nr - j >= 4) {
                            (4, true) => pass::<4, 4>(xi, wj, k, t0, t1, aj),
                            (4, false) => pass::<4, 1>(xi, wj, k, t0, t1, aj),
                            (_, true) => pass::<1, 4>(xi, wj, k, t0, t1, aj),
                            (_, false) => pass::<1, 1>(xi, wj, k, t0, t1, aj),
                        }
                        j += if nr - j >= 4 { 4 } else { 1 };
                    }
                    t0 = t1;
                }
                for r in 0..mr {
                    for c in 0..nr {
                        *out.add((i + r) * ldo + c) = _mm512_reduce_add_ps(acc[r * 16 + c]);
                    }
                }
                i += mr;
            }
        }
    }

    /// One pass of an `MR × NR` tile over values `t0..t1`: accumulators at `acc[r·16 + c]`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[inline]
    unsafe fn pass<const MR: usize, const NR: usize>(
        x: *const u16,
        w: *const u16,
        k: usize,
        t0: usize,
        t1: usize,
        acc: *mut __m512,
    ) {
        unsafe {
            let mut v = [[_mm512_setzero_ps(); NR]; MR];
            for (r, v) in v.iter_mut().enumerate() {
                for (c, v) in v.iter_mut().enumerate() {
                    *v = *acc.add(r * 16 + c);
                }
            }
            let mut t = t0;
            while t < t1 {
                let mut wv: [__m512bh; NR] = std::mem::zeroed();
                for (c, wv) in wv.iter_mut().enumerate() {
                    *wv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        w.add(c * k + t) as *const _,
                    ));
                }
                for (r, v) in v.iter_mut().enumerate() {
                    let xv = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        x.add(r * k + t) as *const _,
                    ));
                    for c in 0..NR {
                        v[c] = _mm512_dpbf16_ps(v[c], xv, wv[c]);
                    }
                }
                t += 32;
            }
            for (r, v) in v.iter().enumerate() {
                for (c, v) in v.iter().enumerate() {
                    *acc.add(r * 16 + c) = *v;
                }
            }
        }
    }

    /// Rows `r0..r0 + nr` of `w` into `out` (`ld` values a row), bf16 in pair order.
    ///
    /// # Safety
    /// AVX-512 (F, BW, DQ) and AVX512-BF16; the rows exist; `out` holds `nr` rows of `ld`.
    pub unsafe fn dequantize(w: &Packed, r0: usize, nr: usize, out: *mut u16, ld: usize) {
        for j in 0..nr {
            let r = r0 + j;
            // SAFETY: as the caller promises.
            unsafe {
                let row = w.data.as_ptr().add(r * w.row_bytes);
                let rs = if w.qtype == QType::I8 {
                    w.row_scale[r]
                } else {
                    1.0
                };
                let o = out.add(j * ld);
                match w.qtype {
                    QType::Q4_0 => row_q4::<Q4_0_TABLE>(row, w.nsub, o),
                    QType::Q4_1 => row_q4::<Q4_1_TABLE>(row, w.nsub, o),
                    QType::MXFP4 => row_q4::<MXFP4_TABLE>(row, w.nsub, o),
                    QType::Q8_0 => row_generic::<Q8_0>(row, rs, w.nsub, o),
                    QType::I8 => row_generic::<I8>(row, rs, w.nsub, o),
                    QType::Q4_K => row_generic::<Q4K>(row, rs, w.nsub, o),
                    QType::Q6_K => row_generic::<Q6K>(row, rs, w.nsub, o),
                }
            }
        }
    }

    const Q4_0_TABLE: u8 = 0;
    const Q4_1_TABLE: u8 = 1;
    const MXFP4_TABLE: u8 = 2;

    /// The 4-bit formats of one scale per block of 32: each block's 16 possible values are
    /// computed once in f32 and rounded to bf16, and its codes look them up (`vpermw`), a
    /// pair of blocks per table: about a third of the generic path's operations.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
    unsafe fn row_q4<const FMT: u8>(row: *const u8, nsub: usize, out: *mut u16) {
        unsafe {
            // The codes' values before the scale: q, q - 8, or twice the FP4 value.
            let base = match FMT {
                Q4_0_TABLE => _mm512_setr_ps(
                    -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0,
                    6.0, 7.0,
                ),
                Q4_1_TABLE => _mm512_setr_ps(
                    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                    15.0,
                ),
                _ => _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                    crate::quant::FP4_X2.as_ptr() as *const __m128i,
                ))),
            };
            // Codes of the pair's second block index the table's upper half.
            let upper = _mm512_setr_epi64(
                0,
                0,
                0,
                0,
                0x10_0010_0010_0010,
                0x10_0010_0010_0010,
                0x10_0010_0010_0010,
                0x10_0010_0010_0010,
            );
            let m4 = _mm512_set1_epi16(0x0f);
            let (codes, heads) = match FMT {
                Q4_0_TABLE => (row.add(2 * nsub), 1),
                Q4_1_TABLE => (row.add(4 * nsub), 2),
                _ => (row.add(nsub), 0),
            };
            let mut d = [0f32; 16];
            let mut m = [0f32; 16];
            for g in 0..nsub.div_ceil(16) {
                match FMT {
                    MXFP4_TABLE => {
                        let n = (nsub - 16 * g).min(16);
                        let mask: __mmask16 = if n == 16 { 0xffff } else { (1u16 << n) - 1 };
                        let e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(
                            mask,
                            row.add(16 * g) as *const i8,
                        ));
                        _mm512_storeu_ps(d.as_mut_ptr(), half_e8m0(e));
                    }
                    _ => {
                        _mm512_storeu_ps(d.as_mut_ptr(), scales16(row, g, nsub));
                        if heads == 2 {
                            _mm512_storeu_ps(m.as_mut_ptr(), scales16(row.add(2 * nsub), g, nsub));
                        }
                    }
                }
                let pairs = (nsub - 16 * g).min(16) / 2;
                for pp in 0..pairs {
                    let p = 8 * g + pp;
                    let (a, b) = (2 * pp, 2 * pp + 1);
                    let (ta, tb) = if FMT == Q4_1_TABLE {
                        (
                            _mm512_fmadd_ps(base, _mm512_set1_ps(d[a]), _mm512_set1_ps(m[a])),
                            _mm512_fmadd_ps(base, _mm512_set1_ps(d[b]), _mm512_set1_ps(m[b])),
                        )
                    } else {
                        (
                            _mm512_mul_ps(base, _mm512_set1_ps(d[a])),
                            _mm512_mul_ps(base, _mm512_set1_ps(d[b])),
                        )
                    };
                    let table: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(tb, ta));
                    let raw = _mm512_cvtepu8_epi16(_mm256_loadu_si256(
                        codes.add(32 * p) as *const __m256i
                    ));
                    let lo = _mm512_or_si512(_mm512_and_si512(raw, m4), upper);
                    let hi = _mm512_or_si512(_mm512_srli_epi16::<4>(raw), upper);
                    _mm512_storeu_si512(
                        out.add(64 * p) as *mut _,
                        _mm512_permutexvar_epi16(lo, table),
                    );
                    _mm512_storeu_si512(
                        out.add(64 * p + 32) as *mut _,
                        _mm512_permutexvar_epi16(hi, table),
                    );
                }
            }
        }
    }

    /// Any packed format through its `PFmt` decoding: value = scale · q + min per lane of 4.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
    unsafe fn row_generic<F: PFmt>(row: *const u8, rs: f32, nsub: usize, out: *mut u16) {
        unsafe {
            let npairs = nsub / 2;
            // Lane l of 16 values c·16.. takes the scale of lane 4c + l/4.
            let spread = [
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7),
                _mm512_setr_epi32(8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 11, 11, 11, 11),
                _mm512_setr_epi32(
                    12, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14, 15, 15, 15, 15,
                ),
            ];
            let mut g = 0;
            while g * F::GROUP < npairs {
                let (gs, gm) = F::group(row, g, rs, nsub);
                let pairs = (npairs - g * F::GROUP).min(F::GROUP);
                for pp in 0..pairs {
                    let p = g * F::GROUP + pp;
                    let idx = F::index(pp);
                    let ws = _mm512_permutexvar_ps(idx, gs);
                    let wm = _mm512_permutexvar_ps(idx, gm);
                    let u = F::quants(row, p, nsub);
                    let quarters = [
                        _mm512_castsi512_si128(u),
                        _mm512_extracti32x4_epi32::<1>(u),
                        _mm512_extracti32x4_epi32::<2>(u),
                        _mm512_extracti32x4_epi32::<3>(u),
                    ];
                    let mut f = [_mm512_setzero_ps(); 4];
                    for c in 0..4 {
                        let v = if F::SIGNED {
                            _mm512_cvtepi8_epi32(quarters[c])
                        } else {
                            _mm512_cvtepu8_epi32(quarters[c])
                        };
                        f[c] = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(v),
                            _mm512_permutexvar_ps(spread[c], ws),
                            _mm512_permutexvar_ps(spread[c], wm),
                        );
                    }
                    let lo: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(f[1], f[0]));
                    let hi: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(f[3], f[2]));
                    _mm512_storeu_si512(out.add(64 * p) as *mut _, lo);
                    _mm512_storeu_si512(out.add(64 * p + 32) as *mut _, hi);
                }
                g += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::qlinear::{QWeight, qlinear_tiles};
    use crate::quant::{QMatrix, QType};
    use crate::testing::lcg;

    fn bf16(v: f32) -> f64 {
        f64::from(half::bf16::from_f32(v).to_f32())
    }

    /// Every format, an odd block count, fused parts of two formats: against the f64 product
    /// of the bf16-rounded inputs and dequantized weights. A weight's own rounding may differ
    /// by one bf16 step (the dequantization's f32 operations are fused here): hence 2^-14 of
    /// Σ|xw|, where the f32 sums alone stay within about 2^-17.
    #[test]
    fn every_format_matches_bf16_rounded_operands() {
        if !available() {
            eprintln!("skipped: no AVX-512 packed path with AVX512-BF16 on this CPU");
            return;
        }
        let mut seed = 7;
        for &(m, k, n) in &[(5usize, 768usize, 37usize), (17, 288, 21), (1, 256, 3)] {
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 4.0).collect();
            let wf: Vec<f32> = (0..2 * n * k).map(|_| lcg(&mut seed)).collect();
            for qt in QType::ALL {
                if !k.is_multiple_of(qt.block()) {
                    continue;
                }
                // Two parts: this format, then Q8_0 (a fused QKV of a Q4_K_M file mixes them).
                let a = QMatrix::quantize(qt, n, k, &wf[..n * k]).unwrap();
                let b = QMatrix::quantize(QType::Q8_0, n, k, &wf[n * k..]).unwrap();
                let deq = [a.dequantize(), b.dequantize()].concat();
                let w = QWeight::new(vec![a, b]);
                let mut got = vec![f32::NAN; m * 2 * n];
                assert!(qlinear_tiles(&x, m, &w, None, &mut got));
                for i in 0..m {
                    for j in 0..2 * n {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for t in 0..k {
                            let p = bf16(x[i * k + t]) * bf16(deq[j * k + t]);
                            want += p;
                            mag += p.abs();
                        }
                        let g = f64::from(got[i * 2 * n + j]);
                        assert!(
                            (g - want).abs() <= mag / 16384.0 + 1e-5,
                            "{qt:?} m={m} k={k} [{i},{j}]: {g} vs {want} (Σ|xw| {mag})"
                        );
                    }
                }
            }
        }
    }

    /// On this path too a row's outputs are the same bits in any batch that takes it.
    #[test]
    fn rows_are_bit_identical_in_any_batch_on_the_path() {
        if !available() {
            return;
        }
        let mut seed = 3;
        let (k, n) = (576, 45);
        let x: Vec<f32> = (0..37 * k).map(|_| lcg(&mut seed)).collect();
        let wf: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        for qt in [QType::Q4_1, QType::Q8_0, QType::MXFP4] {
            let w = QWeight::new(vec![QMatrix::quantize(qt, n, k, &wf).unwrap()]);
            let mut all = vec![0f32; 37 * n];
            assert!(qlinear_tiles(&x, 37, &w, None, &mut all));
            for (i0, m) in [(0usize, 1usize), (5, 16), (30, 7)] {
                let mut part = vec![0f32; m * n];
                assert!(qlinear_tiles(&x[i0 * k..], m, &w, None, &mut part));
                assert_eq!(part, all[i0 * n..(i0 + m) * n], "{qt:?} rows {i0}..+{m}");
            }
        }
    }
}
