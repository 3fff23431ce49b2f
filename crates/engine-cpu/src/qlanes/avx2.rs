//! The lane kernel on AVX2 (no AVX-512, no VNNI): the same layout, activations and result
//! bits as the AVX512-VNNI kernel (`x86.rs`), for every format. A 64-byte line of a group
//! holds 16 weight rows, two halves of 8 (one per f32 lane of a 256-bit register): tiles of
//! one or two activation rows run both halves in one pass, wider tiles each half on its own,
//! the second from cache. Whole octets of rows of the nibble formats run turned around
//! instead (`avx2_rows.rs`: activation rows in the lanes, weight codes broadcast). With 8-bit
//! activations (`lo` all zero) the `lo` products are skipped, and tiles of three and four
//! rows also run both halves at once (the `lo` sums' registers are free).
//!
//! `vpdpbusd` becomes `vpmaddubsw` (unsigned code × signed activation byte, pairs summed into
//! int16) whose sums stay in int16 across a few lines and are widened by `vpmaddwd` (times 16
//! for the `hi` half of `a = 16·hi + lo`, times 1 for `lo`). Nothing saturates or wraps: a pair
//! is at most 2·63·128 = 16128, and a lane holds at most 16 products of 4-bit codes (≤ 15)
//! with |hi| ≤ 128 (30720), 8 of MXFP4's (≤ 24: 24576) or 4 of Q6_K's (≤ 63: 32256) before
//! widening. So the block's integer is exact, and the f32 steps are the reference's: the
//! same bits as [`super::reference`] and as the AVX-512 kernel, at every batch size.
//!
//! 8-bit codes (Q8_0, I8) would overflow a `vpmaddubsw` pair (2·255·128): they are widened
//! to int16 and multiplied by the whole activation integers (`LAct::a16`) with `vpmaddwd`
//! ([`kernel8`]), exact in int32 as well.

use std::arch::x86_64::*;

use lmi_checkpoint::quant::QType;

use super::pack::{ROWS, code_bytes, offset, offsets};
use super::x86::{Args, MXFP4_CODES, PREFETCH};

/// A weight format as the 8-lane kernels read it.
pub(super) trait Fmt8 {
    const QTYPE: QType;
    /// The codes go through MXFP4's table (twice the FP4 value, plus 12).
    const TABLE: bool = false;
    const MIN: bool = false;
    /// Lines whose int16 sums a lane can hold (see the module's bounds).
    const LINES: usize = 4;
    /// Per-lane scale and min (Q6_K: the two halves' scales) of rows `8·half..8·half + 8`
    /// of a block whose scales are at `s` and head at `h`.
    unsafe fn scales(s: *const u8, h: *const u8, half: usize) -> (__m256, __m256);
}

#[inline(always)]
unsafe fn ph8(p: *const u8) -> __m256 {
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
}

#[inline(always)]
unsafe fn u8x8(p: *const u8) -> __m256 {
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
}

#[inline(always)]
unsafe fn i8x8(p: *const u8) -> __m256 {
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q4K;
pub(super) struct Mxfp4;
pub(super) struct Q6K;
pub(super) struct Q8_0;
/// I8: the row's f32 scale (in the group's head line).
pub(super) struct I8;

/// Formats with one f16 scale per block and no minimum.
macro_rules! f16_scaled {
    ($t:ty, $q:expr) => {
        impl Fmt8 for $t {
            const QTYPE: QType = $q;
            #[inline(always)]
            unsafe fn scales(s: *const u8, _: *const u8, half: usize) -> (__m256, __m256) {
                unsafe { (ph8(s.add(16 * half)), _mm256_setzero_ps()) }
            }
        }
    };
}
f16_scaled!(Q4_0, QType::Q4_0);
f16_scaled!(Q8_0, QType::Q8_0);

impl Fmt8 for Q4_1 {
    const QTYPE: QType = QType::Q4_1;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn scales(s: *const u8, _: *const u8, half: usize) -> (__m256, __m256) {
        unsafe { (ph8(s.add(16 * half)), ph8(s.add(2 * ROWS + 16 * half))) }
    }
}

impl Fmt8 for Q4K {
    const QTYPE: QType = QType::Q4_K;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn scales(s: *const u8, h: *const u8, half: usize) -> (__m256, __m256) {
        unsafe {
            let (d, dmin) = (ph8(h.add(16 * half)), ph8(h.add(2 * ROWS + 16 * half)));
            let min = _mm256_mul_ps(dmin, u8x8(s.add(ROWS + 8 * half)));
            (
                _mm256_mul_ps(d, u8x8(s.add(8 * half))),
                _mm256_xor_ps(min, _mm256_set1_ps(-0.0)),
            )
        }
    }
}

impl Fmt8 for Mxfp4 {
    const QTYPE: QType = QType::MXFP4;
    const TABLE: bool = true;
    const LINES: usize = 2;
    #[inline(always)]
    unsafe fn scales(s: *const u8, _: *const u8, half: usize) -> (__m256, __m256) {
        unsafe {
            // 2^(e − 128) from the exponent byte e (0 for e = 0), as `quant::half_e8m0`.
            let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(s.add(8 * half) as *const __m128i));
            let one = _mm256_set1_epi32(1);
            let biased = _mm256_sub_epi32(_mm256_max_epu32(e, one), one);
            (
                _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased)),
                _mm256_setzero_ps(),
            )
        }
    }
}

impl Fmt8 for I8 {
    const QTYPE: QType = QType::I8;
    #[inline(always)]
    unsafe fn scales(_: *const u8, h: *const u8, half: usize) -> (__m256, __m256) {
        unsafe {
            (
                _mm256_loadu_ps(h.add(32 * half) as *const f32),
                _mm256_setzero_ps(),
            )
        }
    }
}

impl Fmt8 for Q6K {
    const QTYPE: QType = QType::Q6_K;
    const LINES: usize = 1;
    #[inline(always)]
    unsafe fn scales(s: *const u8, h: *const u8, half: usize) -> (__m256, __m256) {
        unsafe {
            let d = ph8(h.add(16 * half));
            (
                _mm256_mul_ps(d, i8x8(s.add(8 * half))),
                _mm256_mul_ps(d, i8x8(s.add(ROWS + 8 * half))),
            )
        }
    }
}

/// The lines `PREFETCH` bytes past a block's `cb` bytes of codes at `codes` (the first
/// half's pass brings both halves in).
#[inline(always)]
unsafe fn prefetch(codes: *const u8, cb: usize) {
    let mut l = 0;
    while l <= cb {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(codes.wrapping_add(PREFETCH + l) as *const i8) };
        l += 64;
    }
}

/// Block `b` of the group for halves `half..half + sides`: its codes at the first half's
/// bytes, and each half's scale and min ([`Fmt8::scales`]). Prefetches ahead on the first half.
#[inline(always)]
pub(super) unsafe fn block<F: Fmt8>(
    t: &Args,
    b: usize,
    half: usize,
    sides: usize,
) -> (*const u8, [__m256; 2], [__m256; 2]) {
    unsafe {
        let (co, so, ho) = offsets(F::QTYPE, b);
        if t.prefetch && half == 0 {
            prefetch(t.w.add(co), code_bytes(F::QTYPE));
        }
        let (mut sw, mut mw) = ([_mm256_setzero_ps(); 2], [_mm256_setzero_ps(); 2]);
        for s in 0..sides {
            (sw[s], mw[s]) = F::scales(t.w.add(so), t.w.add(ho), half + s);
        }
        (t.w.add(co + 32 * half), sw, mw)
    }
}

/// The low and the high nibbles of `v` as codes (MXFP4's through `table`).
#[inline(always)]
pub(super) unsafe fn nibbles<F: Fmt8>(
    v: __m256i,
    m4: __m256i,
    table: __m256i,
) -> (__m256i, __m256i) {
    unsafe {
        let (c0, c1) = (
            _mm256_and_si256(v, m4),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4),
        );
        if F::TABLE {
            (
                _mm256_shuffle_epi8(table, c0),
                _mm256_shuffle_epi8(table, c1),
            )
        } else {
            (c0, c1)
        }
    }
}

/// Four activation bytes (one 4-value group) in every lane.
#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m256i {
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// Rows `8·half..8·half + 8` of one group against activation rows `i0..i0 + MR`; with
/// `BOTH`, all 16 rows in one pass (`half` 0), each activation broadcast serving both halves.
/// Without `LO` the activations' `lo` bytes are all zero (8-bit activations) and skipped.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the group and the rows exist; the output has `MR` rows of
/// `ldo` with 8 (masked) columns at `out` (16 with `BOTH`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn kernel<F: Fmt8, const MR: usize, const BOTH: bool, const LO: bool>(
    t: &Args,
    half: usize,
) {
    unsafe {
        let off = offset(F::QTYPE);
        let m4 = _mm256_set1_epi8(0x0f);
        let m30 = _mm256_set1_epi8(0x30);
        let (ones, sixteen) = (_mm256_set1_epi16(1), _mm256_set1_epi16(16));
        let table = if F::TABLE {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_CODES.as_ptr() as *const __m128i))
        } else {
            _mm256_setzero_si256()
        };
        // The row halves this pass runs: `sides` of them from `half`.
        let sides = if BOTH { 2 } else { 1 };
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let mut ap = [std::ptr::null::<i8>(); MR];
        for (i, p) in ap.iter_mut().enumerate() {
            *p = t.a.block(t.i0 + i, 0);
        }
        let ab = (t.i0 * t.a.nb) as isize;
        // Q6_K's two 16-value sub-blocks, each with its scale.
        let subs = if F::QTYPE == QType::Q6_K { 2 } else { 1 };
        let lines = 4 / subs;
        for b in 0..t.nb {
            let (cp, sw, mw) = block::<F>(t, b, half, sides);
            let blk = b * 2 * super::QK;
            for sub in 0..subs {
                let mut n = [[_mm256_setzero_si256(); 2]; MR];
                for (i, n) in n.iter_mut().enumerate() {
                    let at = ab + (i * t.a.nb + b) as isize;
                    let sum = *t.a.sum.as_ptr().offset(at);
                    let sum = match (subs, sub) {
                        (1, _) => sum,
                        (_, 0) => *t.a.sum16.as_ptr().offset(at),
                        _ => sum - *t.a.sum16.as_ptr().offset(at),
                    };
                    *n = [_mm256_set1_epi32(-off * sum); 2];
                }
                let mut hi = [[_mm256_setzero_si256(); 2]; MR];
                let mut lo = [[_mm256_setzero_si256(); 2]; MR];
                for z in sub * lines..(sub + 1) * lines {
                    let mut c = [[_mm256_setzero_si256(); 2]; 2];
                    for (s, c) in c.iter_mut().enumerate().take(sides) {
                        let line = cp.add(64 * z + 32 * s);
                        let v = _mm256_load_si256(line as *const __m256i);
                        let (mut c0, mut c1) = nibbles::<F>(v, m4, table);
                        if F::QTYPE == QType::Q6_K {
                            // As in `x86.rs`: the high two bits of each 4-value group to bits
                            // 4..6.
                            let h = _mm256_load_si256(
                                cp.add(256 + 64 * (z / 2) + 32 * s) as *const __m256i
                            );
                            let (h0, h1) = if z % 2 == 0 {
                                (_mm256_slli_epi16::<4>(h), _mm256_slli_epi16::<2>(h))
                            } else {
                                (h, _mm256_srli_epi16::<2>(h))
                            };
                            c0 = _mm256_or_si256(_mm256_and_si256(h0, m30), c0);
                            c1 = _mm256_or_si256(_mm256_and_si256(h1, m30), c1);
                        }
                        *c = [c0, c1];
                    }
                    for i in 0..MR {
                        let p = ap[i].add(blk + 8 * z);
                        let (ah0, ah1) = (bcast(p), bcast(p.add(4)));
                        for s in 0..sides {
                            let [c0, c1] = c[s];
                            let h0 = _mm256_maddubs_epi16(c0, ah0);
                            let h1 = _mm256_maddubs_epi16(c1, ah1);
                            hi[i][s] = _mm256_add_epi16(hi[i][s], _mm256_add_epi16(h0, h1));
                        }
                        if LO {
                            let (al0, al1) = (bcast(p.add(32)), bcast(p.add(36)));
                            for s in 0..sides {
                                let [c0, c1] = c[s];
                                let l0 = _mm256_maddubs_epi16(c0, al0);
                                let l1 = _mm256_maddubs_epi16(c1, al1);
                                lo[i][s] = _mm256_add_epi16(lo[i][s], _mm256_add_epi16(l0, l1));
                            }
                        }
                    }
                    if (z + 1 - sub * lines) % F::LINES == 0 {
                        for i in 0..MR {
                            for s in 0..sides {
                                let mut wide = _mm256_madd_epi16(hi[i][s], sixteen);
                                if LO {
                                    wide =
                                        _mm256_add_epi32(wide, _mm256_madd_epi16(lo[i][s], ones));
                                }
                                n[i][s] = _mm256_add_epi32(n[i][s], wide);
                                hi[i][s] = _mm256_setzero_si256();
                                lo[i][s] = _mm256_setzero_si256();
                            }
                        }
                    }
                }
                for i in 0..MR {
                    let at = ab + (i * t.a.nb + b) as isize;
                    let d = _mm256_set1_ps(*t.a.d.as_ptr().offset(at));
                    for s in 0..sides {
                        let scale = if sub == 0 { sw[s] } else { mw[s] };
                        let n = _mm256_cvtepi32_ps(n[i][s]);
                        acc[i][s] = _mm256_fmadd_ps(n, _mm256_mul_ps(scale, d), acc[i][s]);
                    }
                }
            }
            if F::MIN {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let at = ab + (i * t.a.nb + b) as isize;
                    let ms = _mm256_set1_ps(*t.a.ms.as_ptr().offset(at));
                    for s in 0..sides {
                        acc[s] = _mm256_fmadd_ps(mw[s], ms, acc[s]);
                    }
                }
            }
        }
        store(t, half, sides, &acc);
    }
}

/// Rows `8·half..8·half + 8` of one group of 8-bit codes against activation rows
/// `i0..i0 + MR`, through the whole integers `a` ([`super::act::LAct::widen`]).
///
/// Per line (four values of each row) the codes are widened to int16, four rows a register,
/// and `vpmaddwd` against the four activations gives each row two int32 partial sums; the
/// block's are joined by one horizontal add and a permute into one lane per row.
///
/// # Safety
/// As [`kernel`], and `t.a.a16` is filled.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn kernel8<F: Fmt8, const MR: usize, const BOTH: bool>(t: &Args, half: usize) {
    unsafe {
        let off = offset(F::QTYPE);
        // Rows [0, 1, 4, 5 | 2, 3, 6, 7] after the horizontal add, back in order.
        let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
        let sides = if BOTH { 2 } else { 1 };
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let mut ap = [std::ptr::null::<i16>(); MR];
        for (i, p) in ap.iter_mut().enumerate() {
            *p = t.a.a16.as_ptr().add((t.i0 + i) * t.a.nb * super::QK);
        }
        let ab = (t.i0 * t.a.nb) as isize;
        for b in 0..t.nb {
            let (cp, sw, _) = block::<F>(t, b, half, sides);
            let blk = b * super::QK;
            // Per half, rows 0..4 and 4..8, two partial sums a row.
            let mut lo = [[_mm256_setzero_si256(); 2]; MR];
            let mut hi = [[_mm256_setzero_si256(); 2]; MR];
            for z in 0..8 {
                let mut c = [[_mm256_setzero_si256(); 2]; 2];
                for (s, c) in c.iter_mut().enumerate().take(sides) {
                    let line = cp.add(64 * z + 32 * s);
                    *c = [
                        _mm256_cvtepu8_epi16(_mm_load_si128(line as *const __m128i)),
                        _mm256_cvtepu8_epi16(_mm_load_si128(line.add(16) as *const __m128i)),
                    ];
                }
                for i in 0..MR {
                    let a = _mm256_set1_epi64x(std::ptr::read_unaligned(
                        ap[i].add(blk + 4 * z) as *const i64
                    ));
                    for s in 0..sides {
                        lo[i][s] = _mm256_add_epi32(lo[i][s], _mm256_madd_epi16(c[s][0], a));
                        hi[i][s] = _mm256_add_epi32(hi[i][s], _mm256_madd_epi16(c[s][1], a));
                    }
                }
            }
            for i in 0..MR {
                let at = ab + (i * t.a.nb + b) as isize;
                let sum = *t.a.sum.as_ptr().offset(at);
                let d = _mm256_set1_ps(*t.a.d.as_ptr().offset(at));
                for s in 0..sides {
                    let rows = _mm256_hadd_epi32(lo[i][s], hi[i][s]);
                    let rows = _mm256_permutevar8x32_epi32(rows, order);
                    let n = _mm256_add_epi32(rows, _mm256_set1_epi32(-off * sum));
                    let n = _mm256_cvtepi32_ps(n);
                    acc[i][s] = _mm256_fmadd_ps(n, _mm256_mul_ps(sw[s], d), acc[i][s]);
                }
            }
        }
        store(t, half, sides, &acc);
    }
}

/// The 8 (masked) columns of halves `half..half + sides` of each activation row.
#[inline(always)]
unsafe fn store<const MR: usize>(t: &Args, half: usize, sides: usize, acc: &[[__m256; 2]; MR]) {
    unsafe {
        for s in half..half + sides {
            let lanes = (t.mask >> (8 * s)) as u8;
            let keep = _mm256_set_epi32(
                -i32::from(lanes >> 7 & 1),
                -i32::from(lanes >> 6 & 1),
                -i32::from(lanes >> 5 & 1),
                -i32::from(lanes >> 4 & 1),
                -i32::from(lanes >> 3 & 1),
                -i32::from(lanes >> 2 & 1),
                -i32::from(lanes >> 1 & 1),
                -i32::from(lanes & 1),
            );
            for (i, a) in acc.iter().enumerate() {
                let o = t.out.add(i * t.ldo + 8 * s);
                if lanes == u8::MAX {
                    _mm256_storeu_ps(o, a[s - half]);
                } else {
                    _mm256_maskstore_ps(o, keep, a[s - half]);
                }
            }
        }
    }
}

/// Runs [`kernel`] (or [`kernel8`]) for `qt` with `mr` rows (1 to 4) on both halves of the
/// group that hold rows.
///
/// # Safety
/// As [`kernel`], with 16 (masked) output columns.
pub(super) unsafe fn dispatch(qt: QType, mr: usize, t: &Args) {
    macro_rules! nibbles {
        ($mr:literal, $both:literal, $half:expr, $lo:literal) => {
            match qt {
                QType::Q4_0 => kernel::<Q4_0, $mr, $both, $lo>(t, $half),
                QType::Q4_1 => kernel::<Q4_1, $mr, $both, $lo>(t, $half),
                QType::Q4_K => kernel::<Q4K, $mr, $both, $lo>(t, $half),
                QType::MXFP4 => kernel::<Mxfp4, $mr, $both, $lo>(t, $half),
                QType::Q6_K => kernel::<Q6K, $mr, $both, $lo>(t, $half),
                QType::Q8_0 | QType::I8 => unreachable!("8-bit codes take kernel8"),
            }
        };
    }
    macro_rules! run {
        ($mr:literal, $both:literal, $half:expr) => {
            match qt {
                QType::Q8_0 => kernel8::<Q8_0, $mr, $both>(t, $half),
                QType::I8 => kernel8::<I8, $mr, $both>(t, $half),
                _ if t.a.lo => nibbles!($mr, $both, $half, true),
                _ => nibbles!($mr, $both, $half, false),
            }
        };
    }
    let halves = if t.mask > 0xff { 2 } else { 1 };
    unsafe {
        // One pass over both halves for tiles of one or two rows (decode): each activation
        // broadcast and block scalar serves 16 weight rows (batch 1 read 10–13 GB/s a half
        // at a time, 15–17 both at once). Wider tiles hold too many accumulators for 16
        // registers, and run a half at a time; without `lo` sums (8-bit activations), tiles of
        // three and four rows of the nibble formats fit (1.1–1.3x at four rows).
        let nibble = code_bytes(qt) < ROWS * super::QK;
        match (halves, mr) {
            (2, 1) => run!(1, true, 0),
            (2, 2) => run!(2, true, 0),
            (2, 3) if nibble && !t.a.lo => nibbles!(3, true, 0, false),
            (2, 4) if nibble && !t.a.lo => nibbles!(4, true, 0, false),
            _ => {
                for half in 0..halves {
                    match mr {
                        1 => run!(1, false, half),
                        2 => run!(2, false, half),
                        3 => run!(3, false, half),
                        _ => run!(4, false, half),
                    }
                }
            }
        }
    }
}
