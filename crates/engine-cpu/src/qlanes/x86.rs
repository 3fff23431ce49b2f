//! The AVX512-VNNI lane kernel: 16 weight rows (one per lane) against up to eight activation
//! rows. Per block of 32 values and activation row, the integer `Σ code·a − OFFSET·Σa` is
//! accumulated exactly in int32 lanes, then one conversion and two f32 operations take it
//! into the row's accumulator: `acc = fma(f32(I), scale·d, acc)` and, for formats with a
//! minimum, `acc = fma(min, ms, acc)`. Integer sums are exact in any order, so the result of
//! an element does not depend on how many activation rows share its tile: the same bits as
//! [`super::reference`] at every batch size.
//!
//! The two halves of `a = 16·hi + lo` go to two accumulators, joined as `16·H + L` at the end
//! of the block (one accumulator with `16·code` against `hi` costs more: two more operations
//! per register of 4-bit codes, where the join is two per block).

use std::arch::x86_64::*;

use lmi_checkpoint::quant::QType;

use super::pack::{ROWS, code_bytes};

pub(super) trait LFmt {
    const QTYPE: QType;
    /// The codes go through MXFP4's table (twice the FP4 value, plus 12).
    const TABLE: bool = false;
    const MIN: bool = false;
    /// Per-lane scale and min of a block whose scales are at `s` and head at `h`.
    unsafe fn scales(s: *const u8, h: *const u8) -> (__m512, __m512);
}

#[inline(always)]
unsafe fn ph16(p: *const u8) -> __m512 {
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

#[inline(always)]
unsafe fn u8x16(p: *const u8) -> __m512 {
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))) }
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q8_0;
pub(super) struct I8;
pub(super) struct Q4K;
pub(super) struct Mxfp4;
pub(super) struct Q6K;

impl LFmt for Q6K {
    const QTYPE: QType = QType::Q6_K;
    /// The scales of the block's two halves (no minimum).
    #[inline(always)]
    unsafe fn scales(s: *const u8, h: *const u8) -> (__m512, __m512) {
        unsafe {
            let d = ph16(h);
            let sc = |p: *const u8| {
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)))
            };
            (_mm512_mul_ps(d, sc(s)), _mm512_mul_ps(d, sc(s.add(ROWS))))
        }
    }
}

impl LFmt for Q4_0 {
    const QTYPE: QType = QType::Q4_0;
    #[inline(always)]
    unsafe fn scales(s: *const u8, _: *const u8) -> (__m512, __m512) {
        unsafe { (ph16(s), _mm512_setzero_ps()) }
    }
}

impl LFmt for Q8_0 {
    const QTYPE: QType = QType::Q8_0;
    #[inline(always)]
    unsafe fn scales(s: *const u8, _: *const u8) -> (__m512, __m512) {
        unsafe { (ph16(s), _mm512_setzero_ps()) }
    }
}

impl LFmt for Q4_1 {
    const QTYPE: QType = QType::Q4_1;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn scales(s: *const u8, _: *const u8) -> (__m512, __m512) {
        unsafe { (ph16(s), ph16(s.add(2 * ROWS))) }
    }
}

impl LFmt for I8 {
    const QTYPE: QType = QType::I8;
    #[inline(always)]
    unsafe fn scales(_: *const u8, h: *const u8) -> (__m512, __m512) {
        unsafe { (_mm512_loadu_ps(h as *const f32), _mm512_setzero_ps()) }
    }
}

impl LFmt for Mxfp4 {
    const QTYPE: QType = QType::MXFP4;
    const TABLE: bool = true;
    #[inline(always)]
    unsafe fn scales(s: *const u8, _: *const u8) -> (__m512, __m512) {
        unsafe {
            let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(s as *const __m128i));
            (crate::qpack::x86::half_e8m0(e), _mm512_setzero_ps())
        }
    }
}

impl LFmt for Q4K {
    const QTYPE: QType = QType::Q4_K;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn scales(s: *const u8, h: *const u8) -> (__m512, __m512) {
        unsafe {
            let (d, dmin) = (ph16(h), ph16(h.add(2 * ROWS)));
            let min = _mm512_mul_ps(dmin, u8x16(s.add(ROWS)));
            (
                _mm512_mul_ps(d, u8x16(s)),
                _mm512_xor_ps(min, _mm512_set1_ps(-0.0)),
            )
        }
    }
}

/// Four activation bytes (one 4-value group) in every lane.
#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m512i {
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

pub(super) struct Args<'a> {
    pub a: &'a super::act::LAct,
    /// First activation row.
    pub i0: usize,
    /// The group's first byte.
    pub w: *const u8,
    pub nb: usize,
    pub out: *mut f32,
    pub ldo: usize,
    /// Lanes to store (rows of the group that exist).
    pub mask: u16,
    pub prefetch: bool,
}

/// Bytes ahead of the block being read that each block prefetches (1–8 KiB measured alike).
pub(super) const PREFETCH: usize = 2048;

/// MXFP4's codes as the kernel multiplies them: twice the FP4 value, plus 12 (unsigned).
pub(super) const MXFP4_CODES: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = lmi_checkpoint::quant::FP4_X2[i] + 12;
        i += 1;
    }
    t
};

/// One group of 16 weight rows against activation rows `i0..i0 + MR`.
///
/// # Safety
/// The CPU has AVX512-F/BW/DQ/VL, VNNI and F16C; the group and the rows exist; the output
/// has `MR` rows of `ldo` with 16 (masked) columns at `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn kernel<F: LFmt, const MR: usize>(t: &Args) {
    unsafe {
        let cb = code_bytes(F::QTYPE);
        let nibbles = cb < ROWS * super::QK;
        let off = super::pack::offset(F::QTYPE);
        let m4 = _mm512_set1_epi8(0x0f);
        let m30 = _mm512_set1_epi8(0x30);
        let table = if F::TABLE {
            _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_CODES.as_ptr() as *const __m128i))
        } else {
            _mm512_setzero_si512()
        };
        let mut acc = [_mm512_setzero_ps(); MR];
        let mut ap = [std::ptr::null::<i8>(); MR];
        for (i, p) in ap.iter_mut().enumerate() {
            *p = t.a.block(t.i0 + i, 0);
        }
        let ab = (t.i0 * t.a.nb) as isize;
        // Q6_K's two halves of 16 values have scales of their own: each is summed and scaled
        // on its own (`sw` then `mw`, the second half's scale). Code lines per half:
        let halves = if F::QTYPE == QType::Q6_K { 2 } else { 1 };
        let lines = if nibbles { 4 } else { 8 } / halves;
        for b in 0..t.nb {
            let (co, so, ho) = super::pack::offsets(F::QTYPE, b);
            let cp = t.w.add(co);
            if t.prefetch {
                // The stream `PREFETCH` bytes ahead: here the lines past those the loop below
                // reads (Q6_K's high bits, the next line of scales); the loop prefetches one
                // line per line it reads, spread among the products rather than issued all
                // at once (a mixture's experts at 4 and 16 rows, streamed from memory, 2–10%
                // faster: `examples/moeprof.rs`).
                let mut l = 64 * lines * halves;
                while l <= cb {
                    _mm_prefetch::<_MM_HINT_T0>(cp.wrapping_add(PREFETCH + l) as *const i8);
                    l += 64;
                }
            }
            let (sw, mw) = F::scales(t.w.add(so), t.w.add(ho));
            let blk = b * 2 * super::QK;
            for half in 0..halves {
                // Up to two rows, two chains per half-activation (even and odd 4-value
                // groups): the dot products' latency, not their throughput, would bound the
                // tile. From three rows on the rows' chains are enough, and one chain saves
                // the joining additions (`[1]` stays zero).
                let mut hi = [[_mm512_setzero_si512(); 2]; MR];
                let mut lo = [[_mm512_setzero_si512(); 2]; MR];
                for (i, lo) in lo.iter_mut().enumerate() {
                    let at = ab + (i * t.a.nb + b) as isize;
                    let sum = *t.a.sum.as_ptr().offset(at);
                    let sum = match (halves, half) {
                        (1, _) => sum,
                        (_, 0) => *t.a.sum16.as_ptr().offset(at),
                        _ => sum - *t.a.sum16.as_ptr().offset(at),
                    };
                    lo[0] = _mm512_set1_epi32(-off * sum);
                }
                for z in half * lines..(half + 1) * lines {
                    if t.prefetch {
                        _mm_prefetch::<_MM_HINT_T0>(cp.wrapping_add(PREFETCH + 64 * z) as *const i8);
                    }
                    if nibbles {
                        let v = _mm512_load_si512(cp.add(64 * z) as *const _);
                        let (mut c0, mut c1) = (
                            _mm512_and_si512(v, m4),
                            _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
                        );
                        if F::TABLE {
                            c0 = _mm512_shuffle_epi8(table, c0);
                            c1 = _mm512_shuffle_epi8(table, c1);
                        }
                        if F::QTYPE == QType::Q6_K {
                            // The high two bits of 4-value group i of this line's 16 values
                            // are bits 2i..2i+2 of its byte: moved to bits 4..6.
                            let h = _mm512_load_si512(cp.add(256 + 64 * (z / 2)) as *const _);
                            let (h0, h1) = if z % 2 == 0 {
                                (_mm512_slli_epi16::<4>(h), _mm512_slli_epi16::<2>(h))
                            } else {
                                (h, _mm512_srli_epi16::<2>(h))
                            };
                            // (h & 0x30) | c
                            c0 = _mm512_ternarylogic_epi32::<0xEA>(h0, m30, c0);
                            c1 = _mm512_ternarylogic_epi32::<0xEA>(h1, m30, c1);
                        }
                        let k = if MR >= 3 { 0 } else { 1 };
                        for i in 0..MR {
                            let p = ap[i].add(blk + 8 * z);
                            hi[i][0] = _mm512_dpbusd_epi32(hi[i][0], c0, bcast(p));
                            lo[i][0] = _mm512_dpbusd_epi32(lo[i][0], c0, bcast(p.add(32)));
                            hi[i][k] = _mm512_dpbusd_epi32(hi[i][k], c1, bcast(p.add(4)));
                            lo[i][k] = _mm512_dpbusd_epi32(lo[i][k], c1, bcast(p.add(36)));
                        }
                    } else {
                        let c = _mm512_load_si512(cp.add(64 * z) as *const _);
                        for i in 0..MR {
                            let p = ap[i].add(blk + 4 * z);
                            let k = if MR >= 3 { 0 } else { z % 2 };
                            let (h, l) = (&mut hi[i][k], &mut lo[i][k]);
                            *h = _mm512_dpbusd_epi32(*h, c, bcast(p));
                            *l = _mm512_dpbusd_epi32(*l, c, bcast(p.add(32)));
                        }
                    }
                }
                let scale = if half == 0 { sw } else { mw };
                for i in 0..MR {
                    let at = ab + (i * t.a.nb + b) as isize;
                    let h = _mm512_add_epi32(hi[i][0], hi[i][1]);
                    let l = _mm512_add_epi32(lo[i][0], lo[i][1]);
                    let n = _mm512_add_epi32(_mm512_slli_epi32::<4>(h), l);
                    let d = _mm512_set1_ps(*t.a.d.as_ptr().offset(at));
                    let n = _mm512_cvtepi32_ps(n);
                    acc[i] = _mm512_fmadd_ps(n, _mm512_mul_ps(scale, d), acc[i]);
                }
            }
            if F::MIN {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let at = ab + (i * t.a.nb + b) as isize;
                    let ms = _mm512_set1_ps(*t.a.ms.as_ptr().offset(at));
                    *acc = _mm512_fmadd_ps(mw, ms, *acc);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm512_mask_storeu_ps(t.out.add(i * t.ldo), t.mask, *a);
        }
    }
}

/// Runs [`kernel`] for `qt` with `mr` rows (1 to 4, or 8).
///
/// # Safety
/// As [`kernel`].
pub(super) unsafe fn dispatch(qt: QType, mr: usize, t: &Args) {
    macro_rules! by_rows {
        ($f:ty) => {
            match mr {
                1 => kernel::<$f, 1>(t),
                2 => kernel::<$f, 2>(t),
                3 => kernel::<$f, 3>(t),
                4 => kernel::<$f, 4>(t),
                _ => kernel::<$f, 8>(t),
            }
        };
    }
    unsafe { by_format!(qt, by_rows) }
}

/// `$run!(F)` with `F` the [`LFmt`] of `$qt`.
macro_rules! by_format {
    ($qt:expr, $run:ident) => {{
        use $crate::qlanes::x86::{I8, Mxfp4, Q4_0, Q4_1, Q4K, Q6K, Q8_0};
        match $qt {
            QType::Q4_0 => $run!(Q4_0),
            QType::Q4_1 => $run!(Q4_1),
            QType::Q8_0 => $run!(Q8_0),
            QType::I8 => $run!(I8),
            QType::Q4_K => $run!(Q4K),
            QType::MXFP4 => $run!(Mxfp4),
            QType::Q6_K => $run!(Q6K),
        }
    }};
}
pub(super) use by_format;
