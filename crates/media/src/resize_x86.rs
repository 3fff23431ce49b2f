//! The two bicubic passes with AVX2, giving the scalar passes' bytes exactly.
//!
//! Pillow's sums are `i32` sums of `u8 * i32` products with 22-bit weights; integer sums do not
//! depend on their order, so any grouping that keeps every product exact gives Pillow's result.
//! - Horizontal: `_mm256_madd_epi16` multiplies 16-bit pairs, too narrow for a 22-bit weight, so
//!   each weight is split as `hi * 2048 + lo` (`lo` in 0..2048, `hi` at most 2^11 in size) and
//!   the pixel sums against `hi` and `lo` are kept apart and joined as `(hi_sum << 11) + lo_sum`.
//!   A 128-bit lane holds two taps of one pixel (R, G, B and a zero pair); the two lanes hold two
//!   rows, so one broadcast of a tap pair's weights serves both, and four rows go at a time.
//! - Vertical: every output byte of a row has the same weights, so eight bytes widen to eight
//!   `i32` and take `_mm256_mullo_epi32` with the tap's weight, 32 bytes of a row at a time.

use std::arch::x86_64::*;

use super::{Coefficients, HALF, PRECISION_BITS, clip8};

/// Bits of a weight in its low half (see the module comment).
const LO_BITS: i32 = 11;

/// Whether this CPU runs the passes here.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// The horizontal weights as the AVX2 pass reads them: per output pixel, its taps in pairs, each
/// pair's `hi` and `lo` halves packed as two `i16` in an `i32` (a pair past the pixel's taps is
/// zero, so the pixels it reads count for nothing).
pub(super) struct PairWeights {
    pairs: usize,
    hi: Vec<i32>,
    lo: Vec<i32>,
}

impl PairWeights {
    /// `None` when a weight's high half does not fit 16 bits (a weight of 16 or more: not the
    /// bicubic filter's, whose weights stay near 1).
    pub(super) fn new(c: &Coefficients) -> Option<Self> {
        let pairs = c.ksize.div_ceil(2);
        let n = c.bounds.len();
        let (mut hi, mut lo) = (vec![0i32; n * pairs], vec![0i32; n * pairs]);
        for x in 0..n {
            let (_, k) = c.of(x);
            for (t, pair) in k.chunks(2).enumerate() {
                let split = |w: i32| (w >> LO_BITS, w & ((1 << LO_BITS) - 1));
                let (h0, l0) = split(pair[0]);
                let (h1, l1) = pair.get(1).map_or((0, 0), |&w| split(w));
                let pack = |a: i32, b: i32| (a & 0xffff) | (b << 16);
                hi[x * pairs + t] = pack(h0, h1);
                lo[x * pairs + t] = pack(l0, l1);
            }
        }
        let fits = c
            .weights
            .iter()
            .all(|&w| i16::try_from(w >> LO_BITS).is_ok());
        fits.then_some(Self { pairs, hi, lo })
    }

    /// Bytes a load for output pixel `x` may read past its first tap's first byte.
    fn reach(&self, c: &Coefficients, x: usize) -> usize {
        (c.bounds[x].0 + 2 * (self.pairs - 1)) * 3 + 16
    }
}

/// The horizontal pass over `rows` rows of `input` (`in_stride` bytes each) into `out`
/// (`out_width * 3` bytes a row): the rows for which every load stays inside `input` go four at
/// a time here, the rest through `scalar_row`.
pub(super) fn horizontal(
    input: &[u8],
    in_stride: usize,
    c: &Coefficients,
    w: &PairWeights,
    out: &mut [u8],
    scalar_row: impl Fn(&[u8], &mut [u8]),
) {
    let out_stride = c.bounds.len() * 3;
    let n_rows = out.len() / out_stride.max(1);
    let reach = (0..c.bounds.len())
        .map(|x| w.reach(c, x))
        .max()
        .unwrap_or(0);
    // Rows `r` with `r * in_stride + reach <= input.len()` never load past the input's end.
    let safe_rows = if input.len() >= reach {
        ((input.len() - reach) / in_stride.max(1) + 1).min(n_rows)
    } else {
        0
    };
    let quads = safe_rows / 4;
    for q in 0..quads {
        let rows = &input[q * 4 * in_stride..];
        let out_rows = &mut out[q * 4 * out_stride..(q + 1) * 4 * out_stride];
        // SAFETY: AVX2 is present (`available`), and every load of the four rows ends within
        // `rows`: the fourth row's loads end at most `3 * in_stride + reach` bytes in, and
        // `(4q + 3) * in_stride + reach <= input.len()` because `4q + 3 < safe_rows`.
        unsafe { horizontal_quad(rows, in_stride, c, w, out_rows, out_stride) };
    }
    for r in quads * 4..n_rows {
        scalar_row(
            &input[r * in_stride..(r + 1) * in_stride],
            &mut out[r * out_stride..(r + 1) * out_stride],
        );
    }
}

/// Four rows of the horizontal pass.
#[target_feature(enable = "avx2")]
unsafe fn horizontal_quad(
    rows: &[u8],
    in_stride: usize,
    c: &Coefficients,
    w: &PairWeights,
    out: &mut [u8],
    out_stride: usize,
) {
    debug_assert!(
        rows.len()
            >= 3 * in_stride
                + (0..c.bounds.len())
                    .map(|x| w.reach(c, x))
                    .max()
                    .unwrap_or(0)
    );
    // Per 128-bit lane: bytes R0 R1 G0 G1 B0 B1 of a tap pair widened to i16, then a zero pair.
    let spread = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128, -128, -128, -128, -128,
    ));
    let half = _mm256_set1_epi32(HALF);
    let base = rows.as_ptr();
    for x in 0..c.bounds.len() {
        let first = c.bounds[x].0 * 3;
        let (mut hi01, mut lo01, mut hi23, mut lo23) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        for t in 0..w.pairs {
            let whi = _mm256_set1_epi32(w.hi[x * w.pairs + t]);
            let wlo = _mm256_set1_epi32(w.lo[x * w.pairs + t]);
            // SAFETY: within `rows` (the caller's bound on `reach`).
            let p = unsafe { base.add(first + 6 * t) };
            let (p01, p23) = unsafe {
                (
                    two_rows(p, p.add(in_stride), spread),
                    two_rows(p.add(2 * in_stride), p.add(3 * in_stride), spread),
                )
            };
            hi01 = _mm256_add_epi32(hi01, _mm256_madd_epi16(p01, whi));
            lo01 = _mm256_add_epi32(lo01, _mm256_madd_epi16(p01, wlo));
            hi23 = _mm256_add_epi32(hi23, _mm256_madd_epi16(p23, whi));
            lo23 = _mm256_add_epi32(lo23, _mm256_madd_epi16(p23, wlo));
        }
        // Saturating packs clip to 0..=255 as `clip8` does. Lane 0: rows 0 and 2; lane 1: 1, 3.
        let words = _mm256_packs_epi32(join(hi01, lo01, half), join(hi23, lo23, half));
        let bytes = _mm256_packus_epi16(words, words);
        let px = [
            _mm256_extract_epi32::<0>(bytes),
            _mm256_extract_epi32::<4>(bytes),
            _mm256_extract_epi32::<1>(bytes),
            _mm256_extract_epi32::<5>(bytes),
        ];
        for (r, v) in px.into_iter().enumerate() {
            let o = r * out_stride + x * 3;
            out[o..o + 3].copy_from_slice(&v.to_le_bytes()[..3]);
        }
    }
}

/// A tap pair's pixels in two rows (16 bytes loaded at each of `a` and `b`), spread to `i16`:
/// lane 0 from `a`, lane 1 from `b`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn two_rows(a: *const u8, b: *const u8, spread: __m256i) -> __m256i {
    // SAFETY: the caller's: 16 bytes readable at `a` and at `b`.
    let (a, b) = unsafe { (_mm_loadu_si128(a.cast()), _mm_loadu_si128(b.cast())) };
    _mm256_shuffle_epi8(
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b),
        spread,
    )
}

/// `(hi << 11) + lo + HALF`, shifted down to the 8-bit value (before clipping).
#[inline]
#[target_feature(enable = "avx2")]
fn join(hi: __m256i, lo: __m256i, half: __m256i) -> __m256i {
    let s = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32::<LO_BITS>(hi), lo), half);
    _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(s)
}

/// The vertical pass: output row `yy` sums input rows `ymin + i - offset` of `data` (`stride`
/// bytes each) with its weights.
pub(super) fn vertical(
    data: &[u8],
    stride: usize,
    offset: usize,
    c: &Coefficients,
    out: &mut [u8],
) {
    for (yy, out_row) in out.chunks_exact_mut(stride).enumerate() {
        let (ymin, k) = c.of(yy);
        let first = (ymin - offset) * stride;
        let taps = &data[first..first + k.len() * stride];
        // SAFETY: AVX2 is present (`available`); `taps` holds the `k.len()` rows read.
        unsafe { vertical_row(taps, stride, k, out_row) };
    }
}

#[target_feature(enable = "avx2")]
unsafe fn vertical_row(taps: &[u8], stride: usize, k: &[i32], out: &mut [u8]) {
    debug_assert!(taps.len() >= k.len() * stride && out.len() == stride);
    let half = _mm256_set1_epi32(HALF);
    let base = taps.as_ptr();
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let blocks = stride / 32;
    for b in 0..blocks {
        let mut acc = [half; 4];
        for (i, &wt) in k.iter().enumerate() {
            let wv = _mm256_set1_epi32(wt);
            // SAFETY: bytes `i * stride + 32 b .. + 32` of `taps`, inside row `i`.
            let p = unsafe { base.add(i * stride + b * 32) };
            for (j, a) in acc.iter_mut().enumerate() {
                let px = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.add(8 * j).cast()) });
                *a = _mm256_add_epi32(*a, _mm256_mullo_epi32(px, wv));
            }
        }
        let s = acc.map(|a| _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(a));
        let words = _mm256_packus_epi16(
            _mm256_packs_epi32(s[0], s[1]),
            _mm256_packs_epi32(s[2], s[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(words, order);
        // SAFETY: 32 bytes at `32 b` of `out`, which is `stride` long.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(b * 32).cast(), bytes) };
    }
    for (j, o) in out.iter_mut().enumerate().skip(blocks * 32) {
        let mut s = HALF;
        for (i, &wt) in k.iter().enumerate() {
            s = s.wrapping_add(i32::from(taps[i * stride + j]) * wt);
        }
        *o = clip8(s);
    }
}
