//! Attention scores of a GQA group against one block of keys: `G` q heads × `n` keys, each
//! key's chunks loaded (and widened from bf16) once for all the heads, with the bits of
//! [`dots`] per head times `scale`.
//!
//! Each (head, key) dot keeps [`dots`]' order on AVX-512: 16 f32 lanes of FMAs over the
//! 16-element chunks in ascending order, the lanes summed by the tree of
//! `_mm512_reduce_add_ps` (lane i + i+8, then + i+4, then + i+2, then + i+1; here sixteen
//! dots at a time, transposed), then the scalar tail, then one rounded product by `scale`.
//! Other ISAs go through [`dots`] itself.

use super::simd::{Isa, WElem, dots, isa};

/// `out[h·stride + j] = scale · dot(q[h·d ..][..d], keys[j·d ..][..d])` for `h < q.len() / d`
/// (at most 8 heads) and `j < n`.
pub fn group_scores<W: WElem>(
    q: &[f32],
    d: usize,
    keys: &[W],
    n: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let g = q.len() / d;
    assert!(keys.len() >= n * d && (g == 0 || out.len() >= (g - 1) * stride + n));
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && g <= 8 && d >= 16 {
        // SAFETY: the feature was detected; extents asserted above.
        unsafe {
            // Tiles of at most 16 dots, one reduction each: 24 accumulators (3 heads × 8
            // keys) measured slower than 15 (3 × 5), and the leftover keys go in pairs/singles.
            let (q, k, o) = (q.as_ptr(), keys.as_ptr(), out.as_mut_ptr());
            match g {
                1 => x86::group::<W, 1, 16>(q, d, k, n, scale, o, stride),
                2 => x86::group::<W, 2, 8>(q, d, k, n, scale, o, stride),
                3 => x86::group::<W, 3, 5>(q, d, k, n, scale, o, stride),
                4 => x86::group::<W, 4, 4>(q, d, k, n, scale, o, stride),
                5 => x86::group::<W, 5, 3>(q, d, k, n, scale, o, stride),
                6 => x86::group::<W, 6, 2>(q, d, k, n, scale, o, stride),
                7 => x86::group::<W, 7, 2>(q, d, k, n, scale, o, stride),
                8 => x86::group::<W, 8, 2>(q, d, k, n, scale, o, stride),
                _ => {}
            }
        }
        return;
    }
    for h in 0..g {
        let s = &mut out[h * stride..][..n];
        dots(&q[h * d..(h + 1) * d], &keys[..n * d], s);
        for v in s.iter_mut() {
            *v *= scale;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::WElem;

    /// All `n` keys in tiles of `NK`, then of 2, then 1.
    ///
    /// # Safety
    /// AVX-512F; `q` holds `G·d` values, `keys` `n·d`, `out` `(G-1)·stride + n`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn group<W: WElem, const G: usize, const NK: usize>(
        q: *const f32,
        d: usize,
        keys: *const W,
        n: usize,
        scale: f32,
        out: *mut f32,
        stride: usize,
    ) {
        let mut j = 0;
        // SAFETY: each tile reads keys j.. j+NK < n and writes out columns j.. j+NK (caller).
        unsafe {
            while j + NK <= n {
                tile::<W, G, NK>(q, d, keys.add(j * d), scale, out.add(j), stride);
                j += NK;
            }
            while NK > 2 && j + 2 <= n {
                tile::<W, G, 2>(q, d, keys.add(j * d), scale, out.add(j), stride);
                j += 2;
            }
            while j < n {
                tile::<W, G, 1>(q, d, keys.add(j * d), scale, out.add(j), stride);
                j += 1;
            }
        }
    }

    /// `G` heads × `NK` keys: accumulators `acc[h][j]` in registers across the chunks.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile<W: WElem, const G: usize, const NK: usize>(
        q: *const f32,
        d: usize,
        keys: *const W,
        scale: f32,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: the caller guarantees the extents.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NK]; G];
            let kv = d / 16 * 16;
            let mut t = 0;
            while t < kv {
                let mut kc = [_mm512_setzero_ps(); NK];
                for (j, kc) in kc.iter_mut().enumerate() {
                    *kc = W::load16(keys.add(j * d + t));
                }
                for (h, acc) in acc.iter_mut().enumerate() {
                    let qv = _mm512_loadu_ps(q.add(h * d + t));
                    for j in 0..NK {
                        acc[j] = _mm512_fmadd_ps(qv, kc[j], acc[j]);
                    }
                }
                t += 16;
            }
            // The sums, 16 dots per reduction (the last group padded with zeros).
            let mut sums = [0.0f32; 32];
            let flat = acc.as_flattened();
            let mut i = 0;
            while i < flat.len() {
                let mut g16 = [_mm512_setzero_ps(); 16];
                let m = (flat.len() - i).min(16);
                g16[..m].copy_from_slice(&flat[i..i + m]);
                _mm512_storeu_ps(sums.as_mut_ptr().add(i), reduce16(&g16));
                i += 16;
            }
            for h in 0..G {
                for j in 0..NK {
                    let mut s = sums[h * NK + j];
                    for t in kv..d {
                        s += *q.add(h * d + t) * (*keys.add(j * d + t)).to_f32();
                    }
                    *out.add(h * stride + j) = s * scale;
                }
            }
        }
    }

    /// Lane `i` of the result is `_mm512_reduce_add_ps(a[i])`, the same additions in the
    /// same tree: 256-bit halves, then 128-bit quarters, then pairs, then neighbours, each
    /// step adding two accumulators' partial sums with one instruction.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn reduce16(a: &[__m512; 16]) -> __m512 {
        // Lane i + lane i+8: [x.lo8, y.lo8] + [x.hi8, y.hi8] holds x's sums in the low half
        // and y's in the high one.
        let mut s1 = [_mm512_setzero_ps(); 8];
        for (p, s) in s1.iter_mut().enumerate() {
            let (x, y) = (a[2 * p], a[2 * p + 1]);
            *s = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
            );
        }
        // + lane i+4 within each half: 128-bit lane L of s2[r] now belongs to a[4r + L].
        let mut s2 = [_mm512_setzero_ps(); 4];
        for (r, s) in s2.iter_mut().enumerate() {
            let (x, y) = (s1[2 * r], s1[2 * r + 1]);
            *s = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
            );
        }
        // + element i+2 within each 128-bit lane: lane L of s3[u] holds two sums of
        // a[8u + L], then two of a[8u + 4 + L].
        let mut s3 = [_mm512_setzero_ps(); 2];
        for (u, s) in s3.iter_mut().enumerate() {
            let (x, y) = (s2[2 * u], s2[2 * u + 1]);
            *s = _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
                _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
            );
        }
        // + element i+1: element e of 128-bit lane L is a[4e + L]'s sum.
        let s4 = _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(s3[0], s3[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(s3[0], s3[1]),
        );
        // Transpose the 4×4 of (lane, element) back to a[i] at lane i.
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, s4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_checkpoint::testing::lcg;

    /// The bits of `dots` per head, scaled, for every group size and key count, head
    /// dimensions with and without a scalar tail, f32 and bf16 keys.
    #[test]
    fn group_scores_equal_dots_per_head() {
        fn check<W: WElem>(to_w: impl Fn(f32) -> W, name: &str) {
            let mut seed = 11;
            let scale = 1.0 / (80f32).sqrt();
            for d in [64, 80, 128, 72] {
                for g in 1..=8 {
                    // Magnitudes spread over a few binades, so any change of order shows.
                    let q: Vec<f32> = (0..g * d)
                        .map(|_| lcg(&mut seed) * (1.0 + 30.0 * lcg(&mut seed).abs()))
                        .collect();
                    let keys: Vec<W> = (0..16 * d).map(|_| to_w(3.0 * lcg(&mut seed))).collect();
                    for n in 1..=16 {
                        let stride = 19;
                        let mut got = vec![f32::NAN; g * stride];
                        group_scores(&q, d, &keys, n, scale, &mut got, stride);
                        for h in 0..g {
                            let mut want = vec![0.0; n];
                            dots(&q[h * d..(h + 1) * d], &keys[..n * d], &mut want);
                            for (j, w) in want.iter().enumerate() {
                                assert_eq!(
                                    got[h * stride + j].to_bits(),
                                    (w * scale).to_bits(),
                                    "{name}: d {d}, g {g}, n {n}, head {h}, key {j}"
                                );
                            }
                        }
                    }
                }
            }
        }
        check(|x| x, "f32");
        check(|x| half::bf16::from_f32(x).to_bits(), "bf16");
    }
}
