//! The AVX-512 form of quantized matrices: the same blocks, rearranged once at load so that a
//! 512-bit register decodes a pair of 32-value sub-blocks with a load or two, and their scales
//! come sixteen at a time (`qlinear.rs` explains the arithmetic).
//!
//! Per row:
//! - Q4_0: every block's f16 scale, then every block's 16 bytes of nibbles (18 bytes a block,
//!   as in the file); Q4_1: scales, mins, nibbles (20); Q8_0: scales, values (34); I8: values.
//!   A row of an odd number of blocks gets one zero block, so pairs never straddle rows.
//! - Q4_K: per super-block d, dmin, the eight 6-bit scales and eight mins unpacked to a byte
//!   each, the 128 bytes of nibbles (148 bytes instead of 144: 2.8% more memory).
//! - Q6_K: as in the file.
//! - MXFP4: every block's exponent byte, then every block's 16 bytes of nibbles (17 a block).

use lmi_checkpoint::quant::{QMatrix, QType, dequantize_block, scale_min_k4};

use super::qact::QK;

pub struct Packed {
    pub qtype: QType,
    pub rows: usize,
    pub cols: usize,
    /// 32-value sub-blocks per row, padded to even.
    pub nsub: usize,
    pub row_bytes: usize,
    pub data: Vec<u8>,
    pub row_scale: Vec<f32>,
}

/// Bytes of one packed super-block of Q4_K.
pub(crate) const Q4K_PACKED: usize = 148;

impl Packed {
    pub fn new(m: &QMatrix) -> Packed {
        let qt = m.qtype;
        let nb = m.cols / QK;
        let nsub = nb.div_ceil(2) * 2;
        let row_bytes = match qt {
            QType::Q4_0 => nsub * 18,
            QType::Q4_1 => nsub * 20,
            QType::Q8_0 => nsub * 34,
            QType::I8 => nsub * 32,
            QType::Q4_K => m.cols / 256 * Q4K_PACKED,
            QType::Q6_K => m.cols / 256 * 210,
            QType::MXFP4 => nsub * 17,
        };
        let mut data = vec![0u8; m.rows * row_bytes];
        let src_rb = m.row_bytes();
        for r in 0..m.rows {
            let src = &m.data[r * src_rb..(r + 1) * src_rb];
            let dst = &mut data[r * row_bytes..(r + 1) * row_bytes];
            match qt {
                QType::Q4_0 | QType::Q4_1 | QType::Q8_0 => {
                    let (bb, heads) = (qt.block_bytes(), if qt == QType::Q4_1 { 2 } else { 1 });
                    let body = bb - 2 * heads;
                    for (b, blk) in src.chunks_exact(bb).enumerate() {
                        for h in 0..heads {
                            let at = h * 2 * nsub + 2 * b;
                            dst[at..at + 2].copy_from_slice(&blk[2 * h..2 * h + 2]);
                        }
                        let at = heads * 2 * nsub + body * b;
                        dst[at..at + body].copy_from_slice(&blk[2 * heads..]);
                    }
                }
                QType::I8 => dst[..src.len()].copy_from_slice(src),
                QType::MXFP4 => {
                    for (b, blk) in src.chunks_exact(17).enumerate() {
                        dst[b] = blk[0];
                        dst[nsub + 16 * b..nsub + 16 * (b + 1)].copy_from_slice(&blk[1..]);
                    }
                }
                QType::Q4_K => {
                    for (blk, out) in src.chunks_exact(144).zip(dst.chunks_exact_mut(Q4K_PACKED)) {
                        out[..4].copy_from_slice(&blk[..4]);
                        for j in 0..8 {
                            let (sc, mn) = scale_min_k4(j, &blk[4..16]);
                            out[4 + j] = sc;
                            out[12 + j] = mn;
                        }
                        out[20..].copy_from_slice(&blk[16..]);
                    }
                }
                QType::Q6_K => dst.copy_from_slice(src),
            }
        }
        Packed {
            qtype: qt,
            rows: m.rows,
            cols: m.cols,
            nsub,
            row_bytes,
            data,
            row_scale: m.row_scale.clone(),
        }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() + self.row_scale.len() * 4
    }

    /// Row `r` in f32 (embedding lookups).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let row = &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        let qt = self.qtype;
        let mut buf = [0u8; 210]; // the largest block (Q6_K)
        let blk = &mut buf[..qt.block_bytes()];
        for (b, o) in out[..self.cols].chunks_exact_mut(qt.block()).enumerate() {
            match qt {
                QType::Q4_0 | QType::Q4_1 | QType::Q8_0 => {
                    let heads = if qt == QType::Q4_1 { 2 } else { 1 };
                    let body = qt.block_bytes() - 2 * heads;
                    for h in 0..heads {
                        let at = h * 2 * self.nsub + 2 * b;
                        blk[2 * h..2 * h + 2].copy_from_slice(&row[at..at + 2]);
                    }
                    let at = heads * 2 * self.nsub + body * b;
                    blk[2 * heads..].copy_from_slice(&row[at..at + body]);
                }
                QType::I8 => blk.copy_from_slice(&row[32 * b..32 * b + 32]),
                QType::MXFP4 => {
                    blk[0] = row[b];
                    blk[1..].copy_from_slice(&row[self.nsub + 16 * b..self.nsub + 16 * (b + 1)]);
                }
                QType::Q4_K => {
                    let p = &row[Q4K_PACKED * b..Q4K_PACKED * (b + 1)];
                    blk[..4].copy_from_slice(&p[..4]);
                    let (sc, mn) = (&p[4..12], &p[12..20]);
                    for j in 0..4 {
                        blk[4 + j] = sc[j] | ((sc[j + 4] >> 4) << 6);
                        blk[8 + j] = mn[j] | ((mn[j + 4] >> 4) << 6);
                        blk[12 + j] = (sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4);
                    }
                    blk[16..].copy_from_slice(&p[20..]);
                }
                QType::Q6_K => blk.copy_from_slice(&row[210 * b..210 * (b + 1)]),
            }
            dequantize_block(qt, blk, o);
        }
        if qt == QType::I8 {
            let s = self.row_scale[r];
            out[..self.cols].iter_mut().for_each(|v| *v *= s);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::Q4K_PACKED;

    /// A packed format, read a pair of sub-blocks at a time.
    pub trait PFmt {
        /// Q8_0 and I8: signed values, no min term. The VNNI kernel reads them offset by 128
        /// (unsigned) with a min of -128·scale; the others multiply |w| by x with w's sign.
        const SIGNED: bool;
        /// Pairs that share one load of scales.
        const GROUP: usize;
        /// Scales and mins (per lane of 4 values after `index`) of group `g`.
        unsafe fn group(row: *const u8, g: usize, rs: f32, nsub: usize) -> (__m512, __m512);
        /// Pair `p`'s 64 values in the activations' order (`qact::pair_pos`).
        unsafe fn quants(row: *const u8, p: usize, nsub: usize) -> __m512i;
        /// Lane → scale index for pair `pp` of a group.
        unsafe fn index(pp: usize) -> __m512i;
        /// The activation sums the group's mins multiply, lane for lane (`QAct::b32`/`b16`).
        #[inline(always)]
        unsafe fn min_sums(_a: &crate::qact::QAct, _row: usize, _g: usize) -> __m512 {
            unsafe { _mm512_setzero_ps() }
        }
    }

    /// Sums of blocks `w·g .. w·g + 16` of activation row `row`.
    #[inline(always)]
    unsafe fn block_sums(a: &crate::qact::QAct, row: usize, first: usize) -> __m512 {
        unsafe { _mm512_loadu_ps(a.b32.as_ptr().add(row * a.nb + first)) }
    }

    #[inline(always)]
    unsafe fn f16(p: *const u8) -> f32 {
        unsafe {
            let bits = u16::from_le_bytes([*p, *p.add(1)]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
        }
    }

    /// Up to 16 f16 scales starting at block `16g` of an array of `nsub`.
    #[inline(always)]
    pub(crate) unsafe fn scales16(at: *const u8, g: usize, nsub: usize) -> __m512 {
        unsafe {
            let n = (nsub - 16 * g).min(16);
            let mask: __mmask16 = if n == 16 { 0xffff } else { (1u16 << n) - 1 };
            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, at.add(32 * g) as *const i16))
        }
    }

    /// Blocks 2pp and 2pp+1 of a group of 16, lanes a a b b a a b b → [2pp, 2pp+1, 2pp, 2pp+1].
    #[inline(always)]
    unsafe fn pair_index(pp: usize) -> __m512i {
        unsafe {
            let base = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
            _mm512_add_epi32(base, _mm512_set1_epi32(2 * pp as i32))
        }
    }

    /// 32 bytes of nibbles of two blocks → [a lo, b lo, a hi, b hi] (`pair_pos` order).
    #[inline(always)]
    unsafe fn nibbles32(p: *const u8) -> __m512i {
        unsafe {
            let v = _mm256_loadu_si256(p as *const __m256i);
            let m4 = _mm256_set1_epi8(0x0f);
            let lo = _mm256_and_si256(v, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        }
    }

    /// [a0..32 | b0..32] → [a lo, b lo, a hi, b hi].
    #[inline(always)]
    unsafe fn interleave(v: __m512i) -> __m512i {
        unsafe { _mm512_shuffle_i64x2::<0xD8>(v, v) }
    }

    pub struct Q4_0;
    pub struct Q4_1;
    pub struct Q8_0;
    pub struct I8;
    pub struct Q4K;
    pub struct Q6K;
    pub struct Mxfp4;

    /// Half an E8M0 scale, 2^(e − 128), per lane of a u32 vector of exponents: the scale of the
    /// doubled FP4 values ([`lmi_checkpoint::quant::FP4_X2`]). Exponents 0 and 1 (2^-128, 2^-127,
    /// values under 1e-37) read as 0, as [`super::super::qlinear`]'s other paths do.
    #[inline(always)]
    pub(crate) unsafe fn half_e8m0(e: __m512i) -> __m512 {
        unsafe {
            let one = _mm512_set1_epi32(1);
            let biased = _mm512_sub_epi32(_mm512_max_epu32(e, one), one);
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(biased))
        }
    }

    impl PFmt for Mxfp4 {
        const SIGNED: bool = true;
        const GROUP: usize = 8;
        #[inline(always)]
        unsafe fn min_sums(a: &crate::qact::QAct, row: usize, g: usize) -> __m512 {
            unsafe { block_sums(a, row, 16 * g) }
        }
        #[inline(always)]
        unsafe fn group(row: *const u8, g: usize, _: f32, nsub: usize) -> (__m512, __m512) {
            unsafe {
                let n = (nsub - 16 * g).min(16);
                let mask: __mmask16 = if n == 16 { 0xffff } else { (1u16 << n) - 1 };
                let e =
                    _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, row.add(16 * g) as *const i8));
                (half_e8m0(e), _mm512_setzero_ps())
            }
        }
        #[inline(always)]
        unsafe fn quants(row: *const u8, p: usize, nsub: usize) -> __m512i {
            unsafe {
                let codes = nibbles32(row.add(nsub + 32 * p));
                let table = _mm512_broadcast_i32x4(_mm_loadu_si128(
                    lmi_checkpoint::quant::FP4_X2.as_ptr() as *const __m128i,
                ));
                _mm512_shuffle_epi8(table, codes)
            }
        }
        #[inline(always)]
        unsafe fn index(pp: usize) -> __m512i {
            unsafe { pair_index(pp) }
        }
    }

    impl PFmt for Q4_0 {
        const SIGNED: bool = false;
        const GROUP: usize = 8;
        #[inline(always)]
        unsafe fn min_sums(a: &crate::qact::QAct, row: usize, g: usize) -> __m512 {
            unsafe { block_sums(a, row, 16 * g) }
        }
        #[inline(always)]
        unsafe fn group(row: *const u8, g: usize, _: f32, nsub: usize) -> (__m512, __m512) {
            unsafe {
                let d = scales16(row, g, nsub);
                (d, _mm512_mul_ps(d, _mm512_set1_ps(-8.0)))
            }
        }
        #[inline(always)]
        unsafe fn quants(row: *const u8, p: usize, nsub: usize) -> __m512i {
            unsafe { nibbles32(row.add(2 * nsub + 32 * p)) }
        }
        #[inline(always)]
        unsafe fn index(pp: usize) -> __m512i {
            unsafe { pair_index(pp) }
        }
    }

    impl PFmt for Q4_1 {
        const SIGNED: bool = false;
        const GROUP: usize = 8;
        #[inline(always)]
        unsafe fn min_sums(a: &crate::qact::QAct, row: usize, g: usize) -> __m512 {
            unsafe { block_sums(a, row, 16 * g) }
        }
        #[inline(always)]
        unsafe fn group(row: *const u8, g: usize, _: f32, nsub: usize) -> (__m512, __m512) {
            unsafe { (scales16(row, g, nsub), scales16(row.add(2 * nsub), g, nsub)) }
        }
        #[inline(always)]
        unsafe fn quants(row: *const u8, p: usize, nsub: usize) -> __m512i {
            unsafe { nibbles32(row.add(4 * nsub + 32 * p)) }
        }
        #[inline(always)]
        unsafe fn index(pp: usize) -> __m512i {
            unsafe { pair_index(pp) }
        }
    }

    impl PFmt for Q8_0 {
        const SIGNED: bool = true;
        const GROUP: usize = 8;
        #[inline(always)]
        unsafe fn min_sums(a: &crate::qact::QAct, row: usize, g: usize) -> __m512 {
            unsafe { block_sums(a, row, 16 * g) }
        }
        #[inline(always)]
        unsafe fn group(row: *const u8, g: usize, _: f32, nsub: usize) -> (__m512, __m512) {
            unsafe { (scales16(row, g, nsub), _mm512_setzero_ps()) }
        }
        #[inline(always)]
        unsafe fn quants(row: *const u8, p: usize, nsub: usize) -> __m512i {
            unsafe { interleave(_mm512_loadu_si512(row.add(2 * nsub + 64 * p) as *const _)) }
        }
        #[inline(always)]
        unsafe fn index(pp: usize) -> __m512i {
            unsafe { pair_index(pp) }
        }
    }

    impl PFmt for I8 {
        const SIGNED: bool = true;
        const GROUP: usize = 8;
        #[inline(always)]
        unsafe fn group(_: *const u8, g: usize, rs: f32, nsub: usize) -> (__m512, __m512) {
            unsafe {
                // Lanes past the row's last block stay zero (they meet the next row's sums).
                let n = (nsub - 16 * g).min(16);
                let mask: __mmask16 = if n == 16 { 0xffff } else { (1u16 << n) - 1 };
                (
                    _mm512_maskz_mov_ps(mask, _mm512_set1_ps(rs)),
                    _mm512_setzero_ps(),
                )
            }
        }
        #[inline(always)]
        unsafe fn min_sums(a: &crate::qact::QAct, row: usize, g: usize) -> __m512 {
            unsafe { block_sums(a, row, 16 * g) }
        }
        #[inline(always)]
        unsafe fn quants(row: *const u8, p: usize, _: usize) -> __m512i {
            unsafe { interleave(_mm512_loadu_si512(row.add(64 * p) as *const _)) }
        }
        #[inline(always)]
        unsafe fn index(pp: usize) -> __m512i {
            unsafe { pair_index(pp) }
        }
    }

    impl PFmt for Q4K {
        const SIGNED: bool = false;
        const GROUP: usize = 4;
        #[inline(always)]
        unsafe fn min_sums(a: &crate::qact::QAct, row: usize, g: usize) -> __m512 {
            unsafe { block_sums(a, row, 8 * g) }
        }
        #[inline(always)]
        unsafe fn group(row: *const u8, g: usize, _: f32, _: usize) -> (__m512, __m512) {
            unsafe {
                let sb = row.add(Q4K_PACKED * g);
                let v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                    sb.add(4) as *const __m128i
                )));
                // Mins in lanes 0-7 (the activation sums' lanes 8-15 belong to the next
                // super-block).
                let mins = _mm512_shuffle_f32x4::<0xEE>(v, v);
                (
                    _mm512_mul_ps(v, _mm512_set1_ps(f16(sb))),
                    _mm512_maskz_mul_ps(0x00ff, mins, _mm512_set1_ps(-f16(sb.add(2)))),
                )
            }
        }
        #[inline(always)]
        unsafe fn quants(row: *const u8, p: usize, _: usize) -> __m512i {
            unsafe {
                let q = row.add(Q4K_PACKED * (p / 4) + 20 + 32 * (p % 4));
                let v = _mm256_loadu_si256(q as *const __m256i);
                let m4 = _mm256_set1_epi8(0x0f);
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                interleave(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi))
            }
        }
        #[inline(always)]
        unsafe fn index(pp: usize) -> __m512i {
            unsafe { pair_index(pp) }
        }
    }

    impl PFmt for Q6K {
        const SIGNED: bool = false;
        const GROUP: usize = 4;
        #[inline(always)]
        unsafe fn min_sums(a: &crate::qact::QAct, row: usize, g: usize) -> __m512 {
            unsafe { _mm512_loadu_ps(a.b16.as_ptr().add(row * 2 * a.nb + 16 * g)) }
        }
        #[inline(always)]
        unsafe fn group(row: *const u8, g: usize, _: f32, _: usize) -> (__m512, __m512) {
            unsafe {
                let sb = row.add(210 * g);
                let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                    sb.add(192) as *const __m128i
                )));
                let s = _mm512_mul_ps(sc, _mm512_set1_ps(f16(sb.add(208))));
                (s, _mm512_mul_ps(s, _mm512_set1_ps(-32.0)))
            }
        }
        #[inline(always)]
        unsafe fn quants(row: *const u8, p: usize, _: usize) -> __m512i {
            unsafe {
                let sb = row.add(210 * (p / 4));
                let (h, q) = (p % 4 / 2, p % 2);
                let ql = _mm512_loadu_si512(sb.add(64 * h) as *const _);
                let m4 = _mm512_set1_epi8(0x0f);
                let nib = if q == 0 {
                    _mm512_and_si512(ql, m4)
                } else {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4)
                };
                let qh = _mm256_loadu_si256(sb.add(128 + 32 * h) as *const __m256i);
                let s0 = _mm_cvtsi32_si128(4 * q as i32);
                let s1 = _mm_cvtsi32_si128(4 * q as i32 + 2);
                let hb = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_srl_epi16(qh, s0)),
                    _mm256_srl_epi16(qh, s1),
                );
                let hb = _mm512_slli_epi16::<4>(_mm512_and_si512(hb, _mm512_set1_epi8(3)));
                interleave(_mm512_or_si512(nib, hb))
            }
        }
        #[inline(always)]
        unsafe fn index(pp: usize) -> __m512i {
            unsafe {
                // Sub-blocks of 16: a lo, b lo, a hi, b hi of half h, pair q.
                let first = 8 * (pp / 2) as i32 + 4 * (pp % 2) as i32;
                let base = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3);
                _mm512_add_epi32(base, _mm512_set1_epi32(first))
            }
        }
    }
}
