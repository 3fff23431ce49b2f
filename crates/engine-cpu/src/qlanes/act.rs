//! Activations for the lane kernels: per block of 32 values one scale and 12-bit integers
//! `a` in [-2047, 2047], each split as `a = 16·hi + lo` (`hi` signed, `lo` in 0..16) so that
//! `vpdpbusd` (unsigned × signed bytes) multiplies both halves exactly.
//!
//! The SIMD and scalar quantizers give the same bits: a block's largest magnitude is exact in
//! any order, the scale is one division, each value one multiply and a round to nearest
//! even, and the block's sum is an integer.

use super::QK;

/// Largest magnitude of an activation integer.
const AMAX_Q: f32 = 2047.0;
/// Largest magnitude of an 8-bit activation integer ([`Bits::Eight`]), before it is scaled
/// by 16 into the 12-bit range.
const AMAX_8: f32 = 127.0;

/// How finely activations are quantized: 12 bits (the default) or 8 bits, as llama.cpp's
/// `q8_0` activations (`LMI_CPU_ACTIVATIONS=int8`). An 8-bit integer `a8` is kept as
/// `a = 16·a8` (`hi = a8`, `lo = 0`), so every kernel and the reference read the same layout
/// and give the same bits; the AVX2 kernels skip the `lo` products, half their multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bits {
    Twelve,
    Eight,
}

impl Bits {
    /// The scale's divisor: the largest integer `a`.
    fn amax_q(self) -> f32 {
        self.limit() * (1 << self.shift()) as f32
    }

    /// The largest magnitude before scaling (`a8`'s for 8 bits).
    fn limit(self) -> f32 {
        match self {
            Bits::Twelve => AMAX_Q,
            Bits::Eight => AMAX_8,
        }
    }

    /// Left shift from the rounded integer to `a`.
    fn shift(self) -> u32 {
        match self {
            Bits::Twelve => 0,
            Bits::Eight => 4,
        }
    }
}

/// `rows × k` activations. Per row and block: 32 `hi` bytes then 32 `lo` bytes in `q`; the
/// scale `d`, the integer sum `sum` (for the weight formats' integer offsets), and
/// `ms = d · sum` (what a per-block weight minimum multiplies).
pub(crate) struct LAct {
    /// Blocks per row.
    pub nb: usize,
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
    /// The sum of each block's first 16 integers (Q6_K's scales cover 16 values).
    pub sum16: Vec<i32>,
    pub ms: Vec<f32>,
    /// Whether the `lo` bytes may be nonzero (12 bits); all zero for [`Bits::Eight`].
    pub lo: bool,
    /// The integers `a` whole, 32 a block in order ([`LAct::widen`]; empty until then): the
    /// AVX2 kernel's 8-bit codes multiply them in int16.
    pub a16: Vec<i16>,
    /// `q` is in tiles of [`TILE_ROWS`] rows ([`LAct::tiled`]) rather than row after row.
    pub tiled: bool,
    /// For [`LAct::tiled`]: the scales and sums again, per tile and block (`tile · nb + b`),
    /// so that the tile kernel's f32 steps read a block's 16 rows at fixed offsets.
    pub tsc: Vec<TileScales>,
}

/// One tile's scales and sums for one block, a value per row of the tile (zero for padding).
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
pub(crate) struct TileScales {
    pub d: [f32; TILE_ROWS],
    pub ms: [f32; TILE_ROWS],
    pub sum: [i32; TILE_ROWS],
    pub sum16: [i32; TILE_ROWS],
}

/// Rows of a tile of [`LAct::tiled`].
pub(crate) const TILE_ROWS: usize = 16;

/// From this many values (64 rows of 512, say) and more than one tile of rows, a product's
/// activations are quantized on the pool's threads, a tile of rows a task; smaller ones stay
/// on the calling thread, whose few microseconds of work a fork would not shorten by much.
const PARALLEL_VALUES: usize = 32 * 1024;

/// One task's part of [`LAct`]'s arrays (a tile of rows).
struct Part<'a> {
    q: &'a mut [i8],
    d: &'a mut [f32],
    sum: &'a mut [i32],
    sum16: &'a mut [i32],
    ms: &'a mut [f32],
    /// The tile's [`LAct::tsc`] entries (empty unless tiled).
    tsc: &'a mut [TileScales],
}

/// The block quantizer this CPU runs (all give the same bits).
#[derive(Clone, Copy)]
enum Quantizer {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Scalar,
}

impl Quantizer {
    fn detect() -> Quantizer {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
                return Quantizer::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Quantizer::Avx2;
            }
        }
        Quantizer::Scalar
    }

    /// One block of 32 values into `q`'s 64 bytes: its scale, its sum and its first 16's.
    #[inline]
    fn block(self, x: &[f32], q: &mut [i8], bits: Bits) -> (f32, i32, i32) {
        match self {
            // SAFETY: AVX-512F/BW were detected; `x` holds 32 values and `q` 64 bytes.
            #[cfg(target_arch = "x86_64")]
            Quantizer::Avx512 => unsafe { x86::block(x, q, bits) },
            // SAFETY: AVX2 was detected; as above.
            #[cfg(target_arch = "x86_64")]
            Quantizer::Avx2 => unsafe { x86::block_avx2(x, q, bits) },
            Quantizer::Scalar => scalar_block(x, q, bits),
        }
    }
}

impl LAct {
    /// Quantizes `rows` rows of `k` values (`k` a multiple of 32), each row on its own.
    pub fn new(x: &[f32], rows: usize, k: usize, bits: Bits) -> LAct {
        LAct::build(x, rows, k, bits, false)
    }

    /// [`LAct::new`] with `q` laid out for the AMX tiles: per tile of [`TILE_ROWS`] rows (the
    /// last padded with zero rows) and block, the rows' 64 bytes one after another, so that a
    /// tile's operand is 1 KiB in a row and each tile's blocks one sequential stream.
    /// (Row after row, a tile load gathers 16 lines 64·nb bytes apart, and from L2 that cost
    /// as much as the product.) The scales and sums stay row after row.
    pub fn tiled(x: &[f32], rows: usize, k: usize, bits: Bits) -> LAct {
        LAct::build(x, rows, k, bits, true)
    }

    fn build(x: &[f32], rows: usize, k: usize, bits: Bits, tiled: bool) -> LAct {
        debug_assert!(k.is_multiple_of(QK) && x.len() >= rows * k);
        let nb = k / QK;
        let held = if tiled {
            rows.next_multiple_of(TILE_ROWS)
        } else {
            rows
        };
        let mut a = LAct {
            nb,
            q: vec![0; held * nb * 2 * QK],
            d: vec![0.0; held * nb],
            sum: vec![0; held * nb],
            sum16: vec![0; held * nb],
            ms: vec![0.0; held * nb],
            lo: bits == Bits::Twelve,
            a16: Vec::new(),
            tiled,
            tsc: if tiled {
                vec![TileScales::default(); held / TILE_ROWS * nb]
            } else {
                Vec::new()
            },
        };
        let quantizer = Quantizer::detect();
        // Per task a tile's rows: its part of every array is then one slice, in either
        // layout (a tile's blocks lie together in `q` when tiled, its rows when not).
        // (`max(1)`: a product with no columns has empty arrays and nothing to split.)
        let per = (TILE_ROWS * nb).max(1);
        let mut tsc = a.tsc.chunks_mut(nb.max(1));
        let parts =
            a.q.chunks_mut(per * 2 * QK)
                .zip(a.d.chunks_mut(per))
                .zip(a.sum.chunks_mut(per).zip(a.sum16.chunks_mut(per)))
                .zip(a.ms.chunks_mut(per))
                .take(rows.div_ceil(TILE_ROWS))
                .map(|(((q, d), (sum, sum16)), ms)| Part {
                    q,
                    d,
                    sum,
                    sum16,
                    ms,
                    tsc: tsc.next().unwrap_or_default(),
                });
        let quantize = |c: usize, p: &mut Part| {
            let r0 = c * TILE_ROWS;
            for r in r0..rows.min(r0 + TILE_ROWS) {
                for b in 0..nb {
                    let xb = &x[r * k + b * QK..][..QK];
                    let q0 = offset(nb, tiled, r, b) - c * per * 2 * QK;
                    let i = (r - r0) * nb + b;
                    let (d, sum, sum16) = quantizer.block(xb, &mut p.q[q0..q0 + 2 * QK], bits);
                    let ms = d * sum as f32;
                    (p.d[i], p.sum[i], p.sum16[i], p.ms[i]) = (d, sum, sum16, ms);
                    if let Some(t) = p.tsc.get_mut(b) {
                        let j = r - r0;
                        (t.d[j], t.ms[j], t.sum[j], t.sum16[j]) = (d, ms, sum, sum16);
                    }
                }
            }
        };
        if rows > TILE_ROWS && rows * k >= PARALLEL_VALUES {
            // Rows are quantized each on their own: the same bits on any thread.
            let parts: Vec<_> = parts.map(std::sync::Mutex::new).collect();
            crate::pool::run(parts.len(), |c| {
                if let Some(Ok(mut part)) = parts.get(c).map(|p| p.lock()) {
                    quantize(c, &mut part);
                }
            });
        } else {
            for (c, mut part) in parts.enumerate() {
                quantize(c, &mut part);
            }
        }
        a
    }

    /// Fills [`LAct::a16`]: `16·hi + lo` for every value.
    pub fn widen(&mut self) {
        debug_assert!(!self.tiled);
        self.a16 = self
            .q
            .chunks_exact(2 * QK)
            .flat_map(|b| (0..QK).map(move |j| 16 * i16::from(b[j]) + i16::from(b[QK + j])))
            .collect();
    }

    /// Row `r`'s block `b`: the `hi` bytes (the `lo` bytes follow at +32).
    #[inline(always)]
    pub fn block(&self, r: usize, b: usize) -> *const i8 {
        // SAFETY (callers): r < rows and b < nb.
        unsafe { self.q.as_ptr().add(offset(self.nb, self.tiled, r, b)) }
    }

    /// Bytes from a row's block to the next row's.
    #[inline(always)]
    pub fn row_stride(&self) -> usize {
        if self.tiled { 2 * QK } else { self.nb * 2 * QK }
    }
}

/// Where row `r`'s block `b` starts in `q`.
#[inline(always)]
fn offset(nb: usize, tiled: bool, r: usize, b: usize) -> usize {
    if tiled {
        ((r / TILE_ROWS * nb + b) * TILE_ROWS + r % TILE_ROWS) * 2 * QK
    } else {
        (r * nb + b) * 2 * QK
    }
}

/// One block: returns its scale, the sum of its integers and of its first 16.
pub(crate) fn scalar_block(x: &[f32], q: &mut [i8], bits: Bits) -> (f32, i32, i32) {
    let amax = x[..QK].iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        q[..2 * QK].fill(0);
        return (0.0, 0, 0);
    }
    let (lim, shift) = (bits.limit(), bits.shift());
    let id = lim / amax;
    let (mut sum, mut sum16) = (0, 0);
    for (j, &v) in x[..QK].iter().enumerate() {
        let a = ((v * id).round_ties_even() as i32).clamp(-(lim as i32), lim as i32) << shift;
        q[j] = (a >> 4) as i8;
        q[QK + j] = (a & 15) as i8;
        sum += a;
        if j < 16 {
            sum16 += a;
        }
    }
    (amax / bits.amax_q(), sum, sum16)
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;

    use super::Bits;

    /// [`super::scalar_block`] in AVX-512 (the same bits).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn block(x: &[f32], q: &mut [i8], bits: Bits) -> (f32, i32, i32) {
        unsafe {
            let x0 = _mm512_loadu_ps(x.as_ptr());
            let x1 = _mm512_loadu_ps(x.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            if amax == 0.0 {
                q[..64].fill(0);
                return (0.0, 0, 0);
            }
            let lim = bits.limit();
            let id = _mm512_set1_ps(lim / amax);
            let (lo_q, hi_q) = (
                _mm512_set1_epi32(-(lim as i32)),
                _mm512_set1_epi32(lim as i32),
            );
            let shift = _mm_cvtsi32_si128(bits.shift() as i32);
            // Round to nearest even: the default rounding mode of the conversion.
            let a0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
            let a1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
            let a0 = _mm512_sll_epi32(_mm512_min_epi32(_mm512_max_epi32(a0, lo_q), hi_q), shift);
            let a1 = _mm512_sll_epi32(_mm512_min_epi32(_mm512_max_epi32(a1, lo_q), hi_q), shift);
            let m15 = _mm512_set1_epi32(15);
            let p = q.as_mut_ptr() as *mut __m128i;
            _mm_storeu_si128(p, _mm512_cvtepi32_epi8(_mm512_srai_epi32::<4>(a0)));
            _mm_storeu_si128(p.add(1), _mm512_cvtepi32_epi8(_mm512_srai_epi32::<4>(a1)));
            _mm_storeu_si128(p.add(2), _mm512_cvtepi32_epi8(_mm512_and_si512(a0, m15)));
            _mm_storeu_si128(p.add(3), _mm512_cvtepi32_epi8(_mm512_and_si512(a1, m15)));
            let sum16 = _mm512_reduce_add_epi32(a0);
            let sum = sum16 + _mm512_reduce_add_epi32(a1);
            (amax / bits.amax_q(), sum, sum16)
        }
    }

    /// [`super::scalar_block`] in AVX2 (the same bits).
    #[target_feature(enable = "avx2")]
    pub(in crate::qlanes) unsafe fn block_avx2(
        x: &[f32],
        q: &mut [i8],
        bits: Bits,
    ) -> (f32, i32, i32) {
        unsafe {
            let xs: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
            let sign = _mm256_set1_ps(-0.0);
            let m = xs.iter().fold(_mm256_setzero_ps(), |m, &v| {
                _mm256_max_ps(m, _mm256_andnot_ps(sign, v))
            });
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
            if amax == 0.0 {
                q[..64].fill(0);
                return (0.0, 0, 0);
            }
            let lim = bits.limit();
            let id = _mm256_set1_ps(lim / amax);
            let (lo_q, hi_q) = (
                _mm256_set1_epi32(-(lim as i32)),
                _mm256_set1_epi32(lim as i32),
            );
            let shift = _mm_cvtsi32_si128(bits.shift() as i32);
            // Round to nearest even: the default rounding mode of the conversion.
            let a: [__m256i; 4] = std::array::from_fn(|i| {
                let a = _mm256_cvtps_epi32(_mm256_mul_ps(xs[i], id));
                _mm256_sll_epi32(_mm256_min_epi32(_mm256_max_epi32(a, lo_q), hi_q), shift)
            });
            // Bytes in order: the packs interleave 128-bit lanes, one permute restores it.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let bytes = |f: &dyn Fn(__m256i) -> __m256i| {
                let p01 = _mm256_packs_epi32(f(a[0]), f(a[1]));
                let p23 = _mm256_packs_epi32(f(a[2]), f(a[3]));
                _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), order)
            };
            let m15 = _mm256_set1_epi32(15);
            let p = q.as_mut_ptr() as *mut __m256i;
            _mm256_storeu_si256(p, bytes(&|v| _mm256_srai_epi32::<4>(v)));
            _mm256_storeu_si256(p.add(1), bytes(&|v| _mm256_and_si256(v, m15)));
            let hsum = |v: __m256i| {
                let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
                let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
            };
            let sum16 = hsum(_mm256_add_epi32(a[0], a[1]));
            let sum = sum16 + hsum(_mm256_add_epi32(a[2], a[3]));
            (amax / bits.amax_q(), sum, sum16)
        }
    }
}
