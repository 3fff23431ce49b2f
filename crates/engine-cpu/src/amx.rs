//! AMX-BF16 matrix products for bf16 weights (Sapphire Rapids and later).
//!
//! A `tdpbf16ps` multiplies a 16×32 bf16 tile of inputs by a 32×16 bf16 tile of weights into a
//! 16×16 f32 tile, 512 times the work of one AVX-512 FMA. Decode batches up to 16 rows
//! then cost about what one row costs: the weights are streamed once and the arithmetic hides
//! under the loads.
//!
//! Batch invariance (see `simd.rs`) holds because AMX rows are independent: an output element
//! is accumulated over the same 32-wide k blocks, in the same order, whatever the other rows
//! of its tile hold. Inputs are always padded to whole 16-row tiles and k to whole blocks, so a
//! row alone and the same row in a batch go through identical instructions. The results differ
//! from the AVX-512 path's (another summation order), so a process uses one path or the other
//! for every product: `available()` decides once.
//!
//! Weights are repacked at upload into the layout the tiles load directly (see [`AmxWeight`]).

use std::cell::Cell;

use rayon::prelude::*;

/// Output columns per weight tile, and input rows per tile.
const TN: usize = 16;
/// k elements per tile (64 bytes of bf16 per tile row).
const TK: usize = 32;
/// Weight tiles multiplied per input tile load: four accumulators (tmm0-3).
const GROUP: usize = 4;
/// u16 elements in one 1 KiB tile.
const TILE: usize = TN * TK;

/// Whether bf16 matrix products use AMX: the CPU has AMX-BF16 and AVX512-BF16, Linux granted
/// the tile data state, and `LMI_CPU_NO_AMX` is unset.
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let on = super::simd::has_avx512bf16() && cpu_has(22) && tiles_granted();
        if on {
            tracing::info!("CPU: AMX-BF16 tiles for bf16 matrix products");
        }
        on
    })
}

/// Whether the quantized lane products may use AMX-INT8 tiles (`qlanes/amx.rs`): the CPU has
/// AMX-INT8, Linux granted the tile data state, and `LMI_CPU_NO_AMX` is unset.
pub fn int8_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has(25) && tiles_granted())
}

/// CPUID.(EAX=7,ECX=0):EDX bit `bit` (22 AMX-BF16, 25 AMX-INT8) and bit 24 (AMX-TILE).
fn cpu_has(bit: u32) -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let r = std::arch::x86_64::__cpuid_count(7, 0);
        r.edx & (1 << bit) != 0 && r.edx & (1 << 24) != 0
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = bit;
        false
    }
}

/// Linux hands out the 8 KiB tile register state only on request (`ARCH_REQ_XCOMP_PERM`),
/// once per process; a tile instruction without it kills the process. Asked once, unless
/// `LMI_CPU_NO_AMX` is set.
fn tiles_granted() -> bool {
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GRANTED.get_or_init(|| {
        if std::env::var_os("LMI_CPU_NO_AMX").is_some() {
            return false;
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a plain syscall with integer arguments.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            if rc != 0 {
                tracing::info!("CPU: AMX present but the kernel refused the tile state");
            }
            rc == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// A `[n, k]` bf16 weight in tile order. Columns are padded to whole groups of
/// `GROUP × TN` = 64 and k to whole `TK` blocks, with zeros. Group `g` is one contiguous run:
/// for each k block, its four 1 KiB tiles, so a task streams memory sequentially. Inside a
/// tile, row `r` holds k elements `2r, 2r+1` of each of the 16 columns, interleaved
/// (the pair layout `tdpbf16ps` reads).
pub struct AmxWeight {
    data: Vec<u16>,
    n: usize,
    k: usize,
    kb: usize,
}

impl AmxWeight {
    pub fn pack(w: &[u16], n: usize, k: usize) -> AmxWeight {
        assert!(w.len() >= n * k);
        let kb = k.div_ceil(TK);
        let groups = n.div_ceil(GROUP * TN);
        let mut data = vec![0u16; groups * kb * GROUP * TILE];
        data.par_chunks_mut(kb * GROUP * TILE)
            .enumerate()
            .for_each(|(g, run)| {
                for c in 0..GROUP * TN {
                    let col = g * GROUP * TN + c;
                    if col >= n {
                        break;
                    }
                    let src = &w[col * k..(col + 1) * k];
                    for (t, &v) in src.iter().enumerate() {
                        run[Self::offset_in_group(c, t)] = v;
                    }
                }
            });
        AmxWeight { data, n, k, kb }
    }

    /// Position of (column `c` within its group, k index `t`) inside the group's run.
    #[inline]
    fn offset_in_group(c: usize, t: usize) -> usize {
        let (b, j) = (t / TK, c / TN);
        let (r, half) = ((t % TK) / 2, t % 2);
        (b * GROUP + j) * TILE + r * (2 * TN) + (c % TN) * 2 + half
    }

    /// Bytes streamed per product (padding included).
    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }

    /// Row `r` of the original `[n, k]` matrix, widened to f32 (embedding lookups).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let group = &self.data[(r / (GROUP * TN)) * self.kb * GROUP * TILE..];
        let c = r % (GROUP * TN);
        for (t, o) in out[..self.k].iter_mut().enumerate() {
            let v = group[Self::offset_in_group(c, t)];
            *o = f32::from_bits((v as u32) << 16);
        }
    }
}

thread_local! {
    /// A buffer for the inputs of a product, rounded to bf16 and padded to whole tiles. Taken
    /// out for the product's duration: a thread waiting in the product's parallel loop may run
    /// another forward pass's product meanwhile (it then allocates its own).
    static INPUT: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
}

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: tasks write disjoint column ranges of the output.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

/// `out[m, n] = x[m, k] · wᵀ (+ bias)`, inputs rounded to bf16, f32 accumulation.
/// Only call when [`available`] is true.
pub fn linear(x: &[f32], m: usize, w: &AmxWeight, bias: Option<&[f32]>, out: &mut [f32]) {
    let (n, k, kb) = (w.n, w.k, w.kb);
    assert!(available(), "AMX products called without AMX");
    assert!(x.len() >= m * k && out.len() >= m * n);
    if let Some(b) = bias {
        assert!(b.len() >= n);
    }
    if m == 0 || n == 0 {
        return;
    }
    let kp = kb * TK;
    let mp = m.div_ceil(TN) * TN;
    let mut xb = INPUT.take();
    xb.clear();
    xb.resize(mp * kp, 0);
    for r in 0..m {
        super::linear::round_bf16_into(&x[r * k..(r + 1) * k], &mut xb[r * kp..r * kp + k]);
    }
    let groups = n.div_ceil(GROUP * TN);
    let threads = crate::pool::threads();
    // A few tasks per thread for balance; every task configures the tiles once.
    let per_task = groups.div_ceil(threads * 4).max(1);
    let tasks = groups.div_ceil(per_task);
    let xp = SendPtr(xb.as_ptr() as *mut u16);
    let op = SendPtr(out.as_mut_ptr());
    let run = |t: usize| {
        let (xp, op) = (xp, op);
        let g0 = t * per_task;
        let g1 = (g0 + per_task).min(groups);
        // SAFETY: AMX is available (asserted); the input holds mp × kp elements, the weight
        // `groups` runs, and this task writes only the columns of groups g0..g1.
        unsafe { run_groups(xp.0, m, mp, kp, w, g0, g1, op.0, bias) };
    };
    if tasks == 1 {
        run(0);
    } else {
        crate::pool::run(tasks, run);
    }
    INPUT.set(xb);
}

/// A tile configuration (`ldtilecfg`'s 64 bytes): palette 1, each tile's rows and bytes a row.
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

impl TileConfig {
    /// Tile `t` gets `shapes[t]` = (rows, bytes a row); (0, 0) leaves it unused.
    pub(crate) const fn new(shapes: [(u8, u16); 8]) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            let colsb = shapes[t].1.to_le_bytes();
            c[16 + 2 * t] = colsb[0];
            c[17 + 2 * t] = colsb[1];
            c[48 + t] = shapes[t].0;
            t += 1;
        }
        TileConfig(c)
    }

    /// All eight tiles 16 rows × 64 bytes.
    fn full() -> TileConfig {
        TileConfig::new([(TN as u8, (TK * 2) as u16); 8])
    }

    /// Loads this configuration (zeroing every tile).
    ///
    /// # Safety
    /// The process was granted the tile state ([`available`] or [`int8_available`]).
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn load(&self) {
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) self as *const TileConfig, options(nostack, readonly, preserves_flags));
        }
    }
}

/// Releases the tile state (back to the init state: cheaper context switches).
///
/// # Safety
/// As [`TileConfig::load`].
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn tile_release() {
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
}

/// Tile loads alone keep too few cache misses in flight to stream the weights at the memory's
/// pace: each 4 KiB step asks for the step `PREFETCH_BYTES` ahead into L2. (Measured on the
/// weights of the default model: T1 at 24–128 KiB all ≈ the AVX-512 path's batch-1 time, no
/// prefetch 30% slower, T0 or NTA slower still.)
const PREFETCH_BYTES: usize = 32 << 10;

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead(step: *const u16) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    let ahead = (step as *const i8).wrapping_add(PREFETCH_BYTES);
    for line in 0..GROUP * TILE * 2 / 64 {
        // SAFETY: prefetches never fault, even past the end of the weight.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(line * 64)) };
    }
}

/// Groups `g0..g1` of output columns for all rows.
///
/// # Safety
/// AMX must be available; `x` holds `mp × kp` bf16 values (`mp` a multiple of 16) and `out`
/// `m × w.n` values of which only this task writes the columns of its groups.
#[allow(clippy::too_many_arguments)]
#[cfg(target_arch = "x86_64")]
unsafe fn run_groups(
    x: *const u16,
    m: usize,
    mp: usize,
    kp: usize,
    w: &AmxWeight,
    g0: usize,
    g1: usize,
    out: *mut f32,
    bias: Option<&[f32]>,
) {
    use std::arch::asm;
    let cfg = TileConfig::full();
    let mut acc = [[0f32; GROUP * TN]; TN];
    let x_stride = kp * 2;
    let w_stride = TN * 2 * 2;
    let acc_stride = GROUP * TN * 4;
    let run_len = w.kb * GROUP * TILE;
    unsafe {
        cfg.load();
        for g in g0..g1 {
            let wg = w.data.as_ptr().add(g * run_len);
            for m0 in (0..mp).step_by(TN) {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem, preserves_flags)
                );
                let xrow = x.add(m0 * kp);
                for b in 0..w.kb {
                    let a = xrow.add(b * TK);
                    let wt = wg.add(b * GROUP * TILE);
                    if m0 == 0 {
                        prefetch_ahead(wt);
                    }
                    asm!(
                        "tileloadd tmm4, [{a} + {xs}*1]",
                        "tileloadd tmm5, [{w0} + {ws}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm5",
                        "tileloadd tmm6, [{w1} + {ws}*1]",
                        "tdpbf16ps tmm1, tmm4, tmm6",
                        "tileloadd tmm7, [{w2} + {ws}*1]",
                        "tdpbf16ps tmm2, tmm4, tmm7",
                        "tileloadd tmm5, [{w3} + {ws}*1]",
                        "tdpbf16ps tmm3, tmm4, tmm5",
                        a = in(reg) a,
                        xs = in(reg) x_stride,
                        w0 = in(reg) wt,
                        w1 = in(reg) wt.add(TILE),
                        w2 = in(reg) wt.add(2 * TILE),
                        w3 = in(reg) wt.add(3 * TILE),
                        ws = in(reg) w_stride,
                        options(nostack, readonly, preserves_flags)
                    );
                }
                let c0 = g * GROUP * TN;
                let cols = (GROUP * TN).min(w.n - c0);
                let rows = (m - m0).min(TN);
                // Whole tiles go straight to the output; partial ones through `acc`.
                let direct = rows == TN && cols == GROUP * TN;
                let (dst, stride) = if direct {
                    (out.add(m0 * w.n + c0), w.n * 4)
                } else {
                    (acc.as_mut_ptr() as *mut f32, acc_stride)
                };
                asm!(
                    "tilestored [{p} + {s}*1], tmm0",
                    "tilestored [{p1} + {s}*1], tmm1",
                    "tilestored [{p2} + {s}*1], tmm2",
                    "tilestored [{p3} + {s}*1], tmm3",
                    p = in(reg) dst,
                    p1 = in(reg) dst.add(TN),
                    p2 = in(reg) dst.add(2 * TN),
                    p3 = in(reg) dst.add(3 * TN),
                    s = in(reg) stride,
                    options(nostack, preserves_flags)
                );
                for (r, tile_row) in acc.iter().enumerate().take(rows) {
                    let o = std::slice::from_raw_parts_mut(out.add((m0 + r) * w.n + c0), cols);
                    if !direct {
                        o.copy_from_slice(&tile_row[..cols]);
                    }
                    if let Some(b) = bias {
                        for (o, &b) in o.iter_mut().zip(&b[c0..c0 + cols]) {
                            *o += b;
                        }
                    }
                }
            }
        }
        tile_release();
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn run_groups(
    _x: *const u16,
    _m: usize,
    _mp: usize,
    _kp: usize,
    _w: &AmxWeight,
    _g0: usize,
    _g1: usize,
    _out: *mut f32,
    _bias: Option<&[f32]>,
) {
    unreachable!("AMX is x86-64 only")
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmi_checkpoint::testing::lcg;

    fn bf16(v: f32) -> u16 {
        half::bf16::from_f32(v).to_bits()
    }

    fn widen(v: u16) -> f64 {
        f32::from_bits((v as u32) << 16) as f64
    }

    #[test]
    fn packing_keeps_every_row() {
        let mut s = 5;
        let (n, k) = (70, 45);
        let w: Vec<u16> = (0..n * k).map(|_| bf16(lcg(&mut s))).collect();
        let p = AmxWeight::pack(&w, n, k);
        let mut row = vec![0.0; k];
        for r in 0..n {
            p.row_into(r, &mut row);
            let want: Vec<f32> = w[r * k..(r + 1) * k]
                .iter()
                .map(|&v| widen(v) as f32)
                .collect();
            assert_eq!(row, want, "row {r}");
        }
    }

    #[test]
    fn matches_the_reference_and_rows_are_batch_invariant() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 here");
            return;
        }
        let mut s = 9;
        for &(m, k, n) in &[(1, 576, 64), (17, 80, 37), (33, 1536, 130), (3, 8, 5)] {
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<u16> = (0..n * k).map(|_| bf16(lcg(&mut s))).collect();
            let bias: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            let p = AmxWeight::pack(&w, n, k);
            let mut out = vec![0.0; m * n];
            linear(&x, m, &p, Some(&bias), &mut out);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = bias[j] as f64
                        + (0..k)
                            .map(|t| widen(bf16(x[i * k + t])) * widen(w[j * k + t]))
                            .sum::<f64>();
                    let got = out[i * n + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{m}x{k}x{n} [{i},{j}]: {got} vs {want}"
                    );
                }
            }
            for i in 0..m {
                let mut one = vec![0.0; n];
                linear(&x[i * k..(i + 1) * k], 1, &p, Some(&bias), &mut one);
                assert_eq!(&out[i * n..(i + 1) * n], &one[..], "{m}x{k}x{n} row {i}");
            }
        }
    }
}
