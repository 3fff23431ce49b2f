//! The AVX2 lane kernel turned around, for tiles of whole octets of activation rows: a
//! register's eight 32-bit lanes are eight activation rows and each weight row's four codes
//! are broadcast, where [`super::avx2::kernel`] has a weight row per lane and broadcasts
//! every activation group. One code broadcast and its unpacking serve two octets' `hi` and
//! `lo` (four registers), the activations are memory operands of the multiplies, and a
//! block's weight scales are broadcast once per weight row instead of every activation
//! group per tile of four rows. Measured 1.1–1.3x on a 16384×2048 product at 16 and 64 rows
//! (docs/benchmarks.md); prefill gains the most.
//!
//! The integer sums are the same exact block sums (any order gives the same integer) and the
//! f32 steps are the reference's per element — `acc = fma(f32(I), scale·d, acc)`, then the
//! minimum's FMA — so the bits equal [`super::reference`] and the other kernels at every
//! tile, and a row's result does not depend on which tile it lands in. For the nibble
//! formats (Q4_0, Q4_1, Q4_K, MXFP4); Q6_K and the 8-bit codes keep the row-broadcast
//! kernels.

use std::arch::x86_64::*;

use lmi_checkpoint::quant::QType;

use super::QK;
use super::act::LAct;
use super::avx2::{Fmt8, Mxfp4, Q4_0, Q4_1, Q4K, block, nibbles};
use super::pack::{ROWS, offset};
use super::x86::{Args, MXFP4_CODES};

/// Activation rows per register.
pub(super) const OCTET: usize = 8;

/// Activations of whole octets of rows, per octet and block: each 4-value group's `hi`
/// bytes for the 8 rows (32 bytes, one register), the 8 groups, then the same of `lo`; and
/// per block the 8 rows' scales, integer sums and `d·sum` side by side.
pub(super) struct Octets {
    nb: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<i32>,
    ms: Vec<f32>,
}

impl Octets {
    /// The first `8·octets` rows of `a`, transposed.
    pub(super) fn new(a: &LAct, octets: usize) -> Octets {
        let nb = a.nb;
        let mut t = Octets {
            nb,
            q: vec![0; octets * nb * 2 * QK * OCTET],
            d: vec![0.0; octets * nb * OCTET],
            sum: vec![0; octets * nb * OCTET],
            ms: vec![0.0; octets * nb * OCTET],
        };
        for o in 0..octets {
            for b in 0..nb {
                let ob = o * nb + b;
                let dst = &mut t.q[ob * 2 * QK * OCTET..(ob + 1) * 2 * QK * OCTET];
                for l in 0..OCTET {
                    let at = (OCTET * o + l) * nb + b;
                    let src = &a.q[at * 2 * QK..(at + 1) * 2 * QK];
                    // src: 32 hi then 32 lo; dst: [hi/lo][group of 4][row][4].
                    // 8-bit activations' `lo` bytes are all zero, as `q` starts.
                    let halves = if a.lo { 2 } else { 1 };
                    for (hl, half) in src.chunks_exact(QK).take(halves).enumerate() {
                        for (g, v) in half.chunks_exact(4).enumerate() {
                            let p = hl * QK * OCTET + g * 4 * OCTET + 4 * l;
                            dst[p..p + 4].copy_from_slice(v);
                        }
                    }
                    t.d[ob * OCTET + l] = a.d[at];
                    t.sum[ob * OCTET + l] = a.sum[at];
                    t.ms[ob * OCTET + l] = a.ms[at];
                }
            }
        }
        t
    }
}

/// Whether [`dispatch`] takes the format.
pub(super) fn takes(qt: QType) -> bool {
    matches!(qt, QType::Q4_0 | QType::Q4_1 | QType::Q4_K | QType::MXFP4)
}

/// The `lanes` weight rows of one group against the `8·NO` activation rows of octets
/// `o0..o0 + NO`; `t.out` is row `8·o0`'s first column, `t.i0` unused.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the group and the octets exist; the output has `8·NO`
/// rows of `ldo` with `lanes` columns at `t.out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<F: Fmt8, const NO: usize, const LO: bool>(
    t: &Args,
    x: &Octets,
    o0: usize,
    lanes: usize,
) {
    unsafe {
        let off = _mm256_set1_epi32(-offset(F::QTYPE));
        let m4 = _mm256_set1_epi8(0x0f);
        let (ones, sixteen) = (_mm256_set1_epi16(1), _mm256_set1_epi16(16));
        let table = if F::TABLE {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_CODES.as_ptr() as *const __m128i))
        } else {
            _mm256_setzero_si256()
        };
        let mut acc = [[_mm256_setzero_ps(); NO]; ROWS];
        let accs = acc.as_mut_ptr();
        let (mut sws, mut mws) = ([0f32; ROWS], [0f32; ROWS]);
        for b in 0..t.nb {
            let (cp, sw, mw) = block::<F>(t, b, 0, 2);
            for s in 0..2 {
                _mm256_storeu_ps(sws.as_mut_ptr().add(8 * s), sw[s]);
                _mm256_storeu_ps(mws.as_mut_ptr().add(8 * s), mw[s]);
            }
            // Per octet: its activations, scales and the offset term `−offset·Σa`.
            let mut aq = [std::ptr::null::<__m256i>(); NO];
            let mut d = [_mm256_setzero_ps(); NO];
            let mut ms = [_mm256_setzero_ps(); NO];
            let mut n0 = [_mm256_setzero_si256(); NO];
            for o in 0..NO {
                let ob = (o0 + o) * x.nb + b;
                aq[o] = x.q.as_ptr().add(ob * 2 * QK * OCTET) as *const __m256i;
                d[o] = _mm256_loadu_ps(x.d.as_ptr().add(ob * OCTET));
                ms[o] = _mm256_loadu_ps(x.ms.as_ptr().add(ob * OCTET));
                let sum = _mm256_loadu_si256(x.sum.as_ptr().add(ob * OCTET) as *const __m256i);
                n0[o] = _mm256_mullo_epi32(sum, off);
            }
            // A loop, not unrolled: 16 rows' registers at once would spill.
            let mut r = 0;
            while r < lanes {
                let acc = &mut *accs.add(r);
                let mut n = n0;
                let mut hi = [_mm256_setzero_si256(); NO];
                let mut lo = [_mm256_setzero_si256(); NO];
                for z in 0..4 {
                    // Row r's four bytes of line z: values 8z..8z+4 low, 8z+4..8z+8 high.
                    let v = _mm256_set1_epi32(std::ptr::read_unaligned(
                        cp.add(64 * z + 4 * r) as *const i32
                    ));
                    let (c0, c1) = nibbles::<F>(v, m4, table);
                    for o in 0..NO {
                        // Groups 2z and 2z + 1 of hi (registers 0..8) and lo (8..16).
                        let p = aq[o].add(2 * z);
                        let h = _mm256_add_epi16(
                            _mm256_maddubs_epi16(c0, _mm256_loadu_si256(p)),
                            _mm256_maddubs_epi16(c1, _mm256_loadu_si256(p.add(1))),
                        );
                        hi[o] = _mm256_add_epi16(hi[o], h);
                        if LO {
                            let l = _mm256_add_epi16(
                                _mm256_maddubs_epi16(c0, _mm256_loadu_si256(p.add(8))),
                                _mm256_maddubs_epi16(c1, _mm256_loadu_si256(p.add(9))),
                            );
                            lo[o] = _mm256_add_epi16(lo[o], l);
                        }
                    }
                    if (z + 1) % F::LINES == 0 {
                        for o in 0..NO {
                            let mut wide = _mm256_madd_epi16(hi[o], sixteen);
                            if LO {
                                wide = _mm256_add_epi32(wide, _mm256_madd_epi16(lo[o], ones));
                            }
                            n[o] = _mm256_add_epi32(n[o], wide);
                            hi[o] = _mm256_setzero_si256();
                            lo[o] = _mm256_setzero_si256();
                        }
                    }
                }
                let (s, m) = (_mm256_set1_ps(sws[r]), _mm256_set1_ps(mws[r]));
                for o in 0..NO {
                    let n = _mm256_cvtepi32_ps(n[o]);
                    acc[o] = _mm256_fmadd_ps(n, _mm256_mul_ps(s, d[o]), acc[o]);
                    if F::MIN {
                        acc[o] = _mm256_fmadd_ps(m, ms[o], acc[o]);
                    }
                }
                r += 1;
            }
        }
        let mut col = [0f32; OCTET];
        for (r, acc) in acc.iter().enumerate().take(lanes) {
            for (o, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(col.as_mut_ptr(), *a);
                for (l, v) in col.iter().enumerate() {
                    *t.out.add((OCTET * o + l) * t.ldo + r) = *v;
                }
            }
        }
    }
}

/// Runs [`kernel`] for `qt` (one that [`takes`]) over `no` (1 or 2) octets from `o0`.
///
/// # Safety
/// As [`kernel`].
pub(super) unsafe fn dispatch(qt: QType, no: usize, t: &Args, x: &Octets, o0: usize, lanes: usize) {
    macro_rules! run {
        ($no:literal, $lo:literal) => {
            match qt {
                QType::Q4_0 => kernel::<Q4_0, $no, $lo>(t, x, o0, lanes),
                QType::Q4_1 => kernel::<Q4_1, $no, $lo>(t, x, o0, lanes),
                QType::Q4_K => kernel::<Q4K, $no, $lo>(t, x, o0, lanes),
                QType::MXFP4 => kernel::<Mxfp4, $no, $lo>(t, x, o0, lanes),
                _ => unreachable!("{qt:?} is not a nibble format"),
            }
        };
    }
    unsafe {
        match (no, t.a.lo) {
            (2, true) => run!(2, true),
            (2, false) => run!(2, false),
            (_, true) => run!(1, true),
            (_, false) => run!(1, false),
        }
    }
}
