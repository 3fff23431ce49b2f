//! `out[m, n] = x[m, k] · w[n, k]ᵀ` for f32 or bf16 weights, register-tiled and parallel over
//! output columns. See `simd.rs` for why every element uses one canonical FMA order.

use super::simd::{Isa, WElem, has_bf16_dot, isa};

/// Tiles of up to MR_MAX input rows × NR_MAX weight rows share each load.
const MR_MAX: usize = 4;
/// Up to this many rows, loop weight tiles outermost (see `run_chunk`).
const SMALL_M: usize = 64;

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: tasks write disjoint column ranges of the output.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

pub fn linear<W: WElem>(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[W],
    n: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    if let Some(b) = bias {
        assert!(b.len() >= n);
    }
    let isa = isa();
    let nr = nr_max(isa);
    let threads = crate::pool::threads();
    // Column chunks: a few per thread for balance, a multiple of the tile width, not so small
    // that scheduling costs more than the work.
    let work = m * n * k;
    let chunk = if work < 1 << 16 || threads == 1 {
        n
    } else {
        let per = n.div_ceil(threads * 4);
        (per.div_ceil(nr) * nr).clamp(16, n.max(16))
    };
    // bf16 weights: the inputs are rounded to bf16 once per call, as a GPU's bf16 product
    // takes them, on every CPU (so a bf16 model computes the same numbers whatever the CPU,
    // and the CUDA engine's). With AVX512-BF16 every element (every tile shape, every batch)
    // goes through the same vdpbf16ps sequence; without, the rounded inputs are widened back
    // to f32 for the FMA kernels.
    let bf16_weights = std::any::TypeId::of::<W>() == std::any::TypeId::of::<u16>();
    let bf16_dot = bf16_weights && has_bf16_dot();
    let xb: Vec<u16> = if bf16_weights {
        to_bf16(&x[..m * k])
    } else {
        Vec::new()
    };
    let x_rounded: Vec<f32> = if bf16_weights && !bf16_dot {
        xb.iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect()
    } else {
        Vec::new()
    };
    let x = if x_rounded.is_empty() {
        x
    } else {
        &x_rounded[..]
    };
    let out_ptr = SendPtr(out.as_mut_ptr());
    let xp = SendPtr(x.as_ptr() as *mut f32);
    let xbp = SendPtr(xb.as_ptr() as *mut u16);
    let wp = SendPtr(w.as_ptr() as *mut W);
    let tile = move |i: usize, mr: usize, j: usize, nr: usize| {
        let (xp, xbp, wp, o) = (xp, xbp, wp, out_ptr);
        // SAFETY: rows i..i+mr of x and j..j+nr of w exist (asserted above); the output tile
        // lies inside out, and each task owns its column range.
        unsafe {
            let out = o.0.add(i * n + j);
            #[cfg(target_arch = "x86_64")]
            if bf16_dot {
                x86::tile512bf(
                    mr,
                    nr,
                    xbp.0.add(i * k),
                    k,
                    wp.0.add(j * k) as *const u16,
                    k,
                    k,
                    out,
                    n,
                );
                return;
            }
            tile_dispatch(
                isa,
                mr,
                nr,
                xp.0.add(i * k),
                k,
                wp.0.add(j * k),
                k,
                k,
                out,
                n,
            )
        }
    };
    let run = |c: usize| {
        let n0 = c * chunk;
        let n1 = (n0 + chunk).min(n);
        let o = out_ptr;
        // SAFETY: bounds asserted above; chunk c writes only columns n0..n1.
        unsafe { run_chunk(isa, m, n0, n1, o.0, n, bias, &tile) };
    };
    let chunks = n.div_ceil(chunk);
    if chunks == 1 {
        run(0);
    } else {
        crate::pool::run(chunks, run);
    }
}

/// Round-to-nearest-even f32 → bf16 bits.
fn to_bf16(x: &[f32]) -> Vec<u16> {
    let mut out = vec![0u16; x.len()];
    round_bf16_into(x, &mut out);
    out
}

/// Round-to-nearest-even f32 → bf16 bits into `out` (same length), vectorized when the CPU
/// has AVX512-BF16 (bit-identical to the scalar rounding).
pub(crate) fn round_bf16_into(x: &[f32], out: &mut [u16]) {
    assert_eq!(x.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if super::simd::has_avx512bf16() {
        // SAFETY: the feature was detected; lengths checked above.
        return unsafe { x86::to_bf16_into(x, out) };
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = half::bf16::from_f32(v).to_bits();
    }
}

fn nr_max(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 4,
        Isa::Avx2 => 2,
        Isa::Scalar => 1,
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn run_chunk(
    isa: Isa,
    m: usize,
    n0: usize,
    n1: usize,
    out: *mut f32,
    ldo: usize,
    bias: Option<&[f32]>,
    tile: &(dyn Fn(usize, usize, usize, usize) + Sync),
) {
    // A single row streams more weight rows at once: more loads in flight per core.
    let nrm = if m == 1 && isa == Isa::Avx512 {
        8
    } else {
        nr_max(isa)
    };
    let m_tiles = || {
        let mut v = Vec::with_capacity(m / MR_MAX + MR_MAX);
        let mut i = 0;
        while i < m {
            let mr = if m - i >= MR_MAX { MR_MAX } else { 1 };
            v.push((i, mr));
            i += mr;
        }
        v
    };
    let n_tiles = || {
        let mut v = Vec::with_capacity((n1 - n0) / nrm + nrm);
        let mut j = n0;
        while j < n1 {
            let nr = if n1 - j >= nrm {
                nrm
            } else if n1 - j >= 4 && nrm > 4 {
                4
            } else {
                1
            };
            v.push((j, nr));
            j += nr;
        }
        v
    };
    if m <= SMALL_M {
        // Decode-sized batches: each weight tile is loaded once and used for every row while it
        // is in L1, so streaming the weights overlaps with the FMAs.
        let rows = m_tiles();
        for (j, nr) in n_tiles() {
            for &(i, mr) in &rows {
                tile(i, mr, j, nr);
            }
        }
    } else {
        // Prefill-sized batches: the chunk's weights stay in L2 while row tiles sweep them.
        let cols = n_tiles();
        for (i, mr) in m_tiles() {
            for &(j, nr) in &cols {
                tile(i, mr, j, nr);
            }
        }
    }
    if let Some(b) = bias {
        for r in 0..m {
            for (c, &bv) in b.iter().enumerate().take(n1).skip(n0) {
                // SAFETY: r < m, c < n.
                unsafe { *out.add(r * ldo + c) += bv };
            }
        }
    }
}

/// One `mr × nr` tile: `out[i·ldo + j] = Σ_t x[i·ldx + t] · w[j·ldw + t]`.
///
/// # Safety
/// The pointers must cover `mr` rows of `k` (strides ldx/ldw) and the output tile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile_dispatch<W: WElem>(
    isa: Isa,
    mr: usize,
    nr: usize,
    x: *const f32,
    ldx: usize,
    w: *const W,
    ldw: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => match (mr, nr) {
                (1, 8) => x86::tile512::<W, 1, 8>(x, ldx, w, ldw, k, out, ldo),
                (4, 4) => x86::tile512::<W, 4, 4>(x, ldx, w, ldw, k, out, ldo),
                (1, 4) => x86::tile512::<W, 1, 4>(x, ldx, w, ldw, k, out, ldo),
                (4, 1) => x86::tile512::<W, 4, 1>(x, ldx, w, ldw, k, out, ldo),
                _ => x86::tile512::<W, 1, 1>(x, ldx, w, ldw, k, out, ldo),
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => match (mr, nr) {
                (4, 2) => x86::tile256::<W, 4, 2>(x, ldx, w, ldw, k, out, ldo),
                (1, 8) => x86::tile256::<W, 1, 8>(x, ldx, w, ldw, k, out, ldo),
                (1, 4) => x86::tile256::<W, 1, 4>(x, ldx, w, ldw, k, out, ldo),
                (1, 2) => x86::tile256::<W, 1, 2>(x, ldx, w, ldw, k, out, ldo),
                (4, 1) => x86::tile256::<W, 4, 1>(x, ldx, w, ldw, k, out, ldo),
                _ => x86::tile256::<W, 1, 1>(x, ldx, w, ldw, k, out, ldo),
            },
            _ => scalar_tile(mr, nr, x, ldx, w, ldw, k, out, ldo),
        }
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn scalar_tile<W: WElem>(
    mr: usize,
    nr: usize,
    x: *const f32,
    ldx: usize,
    w: *const W,
    ldw: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    for i in 0..mr {
        for j in 0..nr {
            let mut s = 0.0f32;
            for t in 0..k {
                // SAFETY: caller guarantees the extents.
                unsafe { s += *x.add(i * ldx + t) * (*w.add(j * ldw + t)).to_f32() };
            }
            unsafe { *out.add(i * ldo + j) = s };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::WElem;

    /// Dispatches on the concrete element type (the generic entry points take any WElem).
    #[inline(always)]
    unsafe fn as_load<W: WElem, R>(
        w: *const W,
        f32_case: impl FnOnce(*const f32) -> R,
        u16_case: impl FnOnce(*const u16) -> R,
    ) -> R {
        if std::any::TypeId::of::<W>() == std::any::TypeId::of::<f32>() {
            f32_case(w as *const f32)
        } else {
            u16_case(w as *const u16)
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile512<W: WElem, const MR: usize, const NR: usize>(
        x: *const f32,
        ldx: usize,
        w: *const W,
        ldw: usize,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            as_load(
                w,
                |w| t512::<f32, MR, NR>(x, ldx, w, ldw, k, out, ldo),
                |w| t512::<u16, MR, NR>(x, ldx, w, ldw, k, out, ldo),
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile256<W: WElem, const MR: usize, const NR: usize>(
        x: *const f32,
        ldx: usize,
        w: *const W,
        ldw: usize,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            as_load(
                w,
                |w| t256::<f32, MR, NR>(x, ldx, w, ldw, k, out, ldo),
                |w| t256::<u16, MR, NR>(x, ldx, w, ldw, k, out, ldo),
            )
        }
    }

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn t512<W: WElem, const MR: usize, const NR: usize>(
        x: *const f32,
        ldx: usize,
        w: *const W,
        ldw: usize,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NR]; MR];
            let kv = k / 16 * 16;
            // Prefetch the next tile's rows (they follow this tile's in memory) while this
            // one computes: the hardware prefetcher alone leaves each tile starting on a
            // memory stall. Prefetches never fault; wrapping_add keeps the address
            // arithmetic defined past the end of the matrix.
            let mut t = 0;
            while t < kv {
                let mut wv = [_mm512_setzero_ps(); NR];
                for (j, wv) in wv.iter_mut().enumerate() {
                    let p = w.add(j * ldw + t);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(NR * ldw) as *const i8);
                    *wv = W::load16(p);
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_loadu_ps(x.add(i * ldx + t));
                    for j in 0..NR {
                        acc[j] = _mm512_fmadd_ps(xv, wv[j], acc[j]);
                    }
                }
                t += 16;
            }
            for (i, acc) in acc.iter().enumerate() {
                for (j, a) in acc.iter().enumerate() {
                    let mut s = _mm512_reduce_add_ps(*a);
                    for t in kv..k {
                        s += *x.add(i * ldx + t) * (*w.add(j * ldw + t)).to_f32();
                    }
                    *out.add(i * ldo + j) = s;
                }
            }
        }
    }

    /// f32 → bf16 (round to nearest even), 16 at a time.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn to_bf16_into(x: &[f32], out: &mut [u16]) {
        let main = x.len() / 16 * 16;
        let mut i = 0;
        while i < main {
            unsafe {
                let v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x.as_ptr().add(i)));
                _mm256_storeu_si256(
                    out.as_mut_ptr().add(i) as *mut __m256i,
                    std::mem::transmute::<__m256bh, __m256i>(v),
                );
            }
            i += 16;
        }
        for (o, &v) in out[main..].iter_mut().zip(&x[main..]) {
            *o = half::bf16::from_f32(v).to_bits();
        }
    }

    /// One tile with bf16 inputs and weights: vdpbf16ps over 32-element steps, then a fixed
    /// horizontal sum and a scalar tail, so every element has one canonical order.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile512bf(
        mr: usize,
        nr: usize,
        x: *const u16,
        ldx: usize,
        w: *const u16,
        ldw: usize,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            match (mr, nr) {
                (1, 8) => tbf::<1, 8>(x, ldx, w, ldw, k, out, ldo),
                (4, 4) => tbf::<4, 4>(x, ldx, w, ldw, k, out, ldo),
                (1, 4) => tbf::<1, 4>(x, ldx, w, ldw, k, out, ldo),
                (4, 1) => tbf::<4, 1>(x, ldx, w, ldw, k, out, ldo),
                _ => tbf::<1, 1>(x, ldx, w, ldw, k, out, ldo),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tbf<const MR: usize, const NR: usize>(
        x: *const u16,
        ldx: usize,
        w: *const u16,
        ldw: usize,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let zero: __m512bh = std::mem::transmute(_mm512_setzero_si512());
            let mut acc = [[_mm512_setzero_ps(); NR]; MR];
            let kv = k / 32 * 32;
            let mut t = 0;
            while t < kv {
                let mut wv = [zero; NR];
                for (j, wv) in wv.iter_mut().enumerate() {
                    let p = w.add(j * ldw + t);
                    // The next tile's rows, as in `t512`.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(NR * ldw) as *const i8);
                    *wv =
                        std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p as *const _));
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let xv: __m512bh =
                        std::mem::transmute(_mm512_loadu_si512(x.add(i * ldx + t) as *const _));
                    for j in 0..NR {
                        acc[j] = _mm512_dpbf16_ps(acc[j], xv, wv[j]);
                    }
                }
                t += 32;
            }
            for (i, acc) in acc.iter().enumerate() {
                for (j, a) in acc.iter().enumerate() {
                    let mut s = _mm512_reduce_add_ps(*a);
                    for t in kv..k {
                        s += (*x.add(i * ldx + t)).to_f32() * (*w.add(j * ldw + t)).to_f32();
                    }
                    *out.add(i * ldo + j) = s;
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn t256<W: WElem, const MR: usize, const NR: usize>(
        x: *const f32,
        ldx: usize,
        w: *const W,
        ldw: usize,
        k: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); NR]; MR];
            let kv = k / 8 * 8;
            let mut t = 0;
            while t < kv {
                let mut wv = [_mm256_setzero_ps(); NR];
                for (j, wv) in wv.iter_mut().enumerate() {
                    *wv = W::load8(w.add(j * ldw + t));
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x.add(i * ldx + t));
                    for j in 0..NR {
                        acc[j] = _mm256_fmadd_ps(xv, wv[j], acc[j]);
                    }
                }
                t += 8;
            }
            for (i, acc) in acc.iter().enumerate() {
                for (j, a) in acc.iter().enumerate() {
                    let hi = _mm256_extractf128_ps::<1>(*a);
                    let lo = _mm256_castps256_ps128(*a);
                    let q = _mm_add_ps(lo, hi);
                    let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
                    let mut s = _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps::<1>(d, d)));
                    for t in kv..k {
                        s += *x.add(i * ldx + t) * (*w.add(j * ldw + t)).to_f32();
                    }
                    *out.add(i * ldo + j) = s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_checkpoint::testing::lcg;

    fn reference(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f64> {
        let mut o = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                o[i * n + j] = (0..k)
                    .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                    .sum();
            }
        }
        o
    }

    #[test]
    fn matches_f64_reference_for_odd_shapes() {
        let mut s = 7;
        for &(m, k, n) in &[
            (1, 576, 49),
            (5, 37, 3),
            (9, 64, 130),
            (4, 1536, 8),
            (3, 16, 1),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let mut out = vec![0.0; m * n];
            linear(&x, m, k, &w, n, None, &mut out);
            let r = reference(&x, m, k, &w, n);
            for (a, b) in out.iter().zip(&r) {
                assert!((*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn bf16_weights_match_the_reference_and_are_batch_invariant() {
        let mut s = 3;
        let (m, k, n) = (9, 80, 37);
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
        let wb: Vec<u16> = (0..n * k)
            .map(|_| half::bf16::from_f32(lcg(&mut s)).to_bits())
            .collect();
        let wf: Vec<f32> = wb.iter().map(|&b| b.to_f32()).collect();
        // The inputs are rounded to bf16 first, on every CPU (as a GPU's bf16 product).
        let xr: Vec<f32> = x
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        let mut a = vec![0.0; m * n];
        linear(&x, m, k, &wb, n, None, &mut a);
        for (got, want) in a.iter().zip(reference(&xr, m, k, &wf, n)) {
            assert!(
                (*got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
        for r in 0..m {
            let mut one = vec![0.0; n];
            linear(&x[r * k..(r + 1) * k], 1, k, &wb, n, None, &mut one);
            assert_eq!(&a[r * n..(r + 1) * n], &one[..], "row {r}");
        }
    }

    #[test]
    fn rows_are_bit_identical_whatever_the_batch() {
        let mut s = 11;
        let (k, n) = (200, 300);
        let x: Vec<f32> = (0..13 * k).map(|_| lcg(&mut s)).collect();
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
        let bias: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
        let mut full = vec![0.0; 13 * n];
        linear(&x, 13, k, &w, n, Some(&bias), &mut full);
        for r in 0..13 {
            let mut one = vec![0.0; n];
            linear(&x[r * k..(r + 1) * k], 1, k, &w, n, Some(&bias), &mut one);
            assert_eq!(&full[r * n..(r + 1) * n], &one[..], "row {r}");
        }
    }
}
