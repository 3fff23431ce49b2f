//! Quantized products on AVX512-VNNI (`x86.rs`) or AVX2 (`avx2.rs`, and `avx2_rows.rs` for
//! octets of rows) with exact block sums, the same bits at every batch size and on either,
//! and fast at many rows.
//!
//! Activations are 12-bit integers with one scale per block of 32 (`act.rs`; 8-bit ones on
//! request, [`bits`], in the same layout with their `lo` bytes zero). Weight rows are
//! laid out sixteen to a group, one per f32 lane (`pack.rs`), so a block's integer dot
//! products for 16 rows accumulate in one register and reach f32 with one conversion, one
//! multiply and one FMA per block and activation row (two FMAs with a minimum) — against the
//! int8 kernels' (`qlinear.rs`) conversion and two scalings per four products, which made
//! them compute-bound under load. An activation row costs two `vpdpbusd` per 64 products
//! whatever the tile, the codes are unpacked once per tile of eight rows, and the integer
//! sums are exact, so a row's result is the same bits alone or in any batch
//! ([`reference`] is the definition, tests hold both kernels to it bit for bit).
//!
//! Precision: per-32 scales at 12 bits are 16 times finer than llama.cpp's per-32 int8, and
//! finer than the int8 kernels' per-4 scales except for a group of four whose largest value
//! is under 1/16 of its block's.

mod act;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_rows;
mod pack;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "x86_64")]
use amx::TM;
use pack::ROWS;

use super::qlinear::SendPtr;

pub use act::Bits;
pub(crate) use act::LAct;
pub use pack::LMatrix;
#[cfg(test)]
use pack::offset;

/// Values per block.
const QK: usize = 32;

/// Activation rows per tile: eight, then up to four for the rest (`x86::dispatch`); four on
/// AVX2 (its 16 registers).
const MR: usize = 8;
/// Activation rows that share a pass over a weight group while it is in L1.
const ROW_CHUNK: usize = 64;
/// Products of at least this many activation rows run on the AMX tiles where [`Isa::Amx`] is
/// in use; fewer on the VNNI kernel (the same bits either way).
pub(crate) const AMX_MIN_ROWS: usize = 16;

/// Which instructions run the lane kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AMX-INT8 tiles from [`AMX_MIN_ROWS`] activation rows (`amx.rs`), `Avx512Vnni` below:
    /// every format.
    Amx,
    /// `vpdpbusd` on 512-bit registers: every format.
    Avx512Vnni,
    /// `vpmaddubsw` (codes of up to six bits) and `vpmaddwd` (8-bit codes) on 256-bit
    /// registers: every format.
    Avx2,
}

/// The activations' precision this process uses: 12 bits unless `LMI_CPU_ACTIVATIONS=int8`
/// asks for llama.cpp's 8 (half the multiplies on AVX2); an error names the values taken.
pub fn bits() -> Result<Bits, &'static str> {
    static BITS: std::sync::OnceLock<Result<Bits, String>> = std::sync::OnceLock::new();
    let bits = BITS.get_or_init(|| {
        let v = std::env::var("LMI_CPU_ACTIVATIONS").unwrap_or_default();
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "int12" => Ok(Bits::Twelve),
            "int8" => Ok(Bits::Eight),
            _ => Err(format!(
                "LMI_CPU_ACTIVATIONS={v:?}: expected int12 (the default) or int8"
            )),
        }
    });
    bits.as_ref().copied().map_err(String::as_str)
}

/// `out[i, c] = x[i, :] · w[c, :]` over the concatenated `parts` (`n` columns in all), for
/// `m` rows of `x` quantized to `bits`, on a CPU that has `isa`. Both give the same bits.
pub(crate) fn qlinear_lanes(
    isa: Isa,
    bits: Bits,
    x: &[f32],
    m: usize,
    parts: &[LMatrix],
    out: &mut [f32],
) {
    let Some(first) = parts.first() else {
        return;
    };
    let k = first.cols;
    let n: usize = parts.iter().map(|p| p.rows).sum();
    assert!(x.len() >= m * k && out.len() >= m * n);
    let isa = if isa == Isa::Amx && m < AMX_MIN_ROWS {
        Isa::Avx512Vnni
    } else {
        isa
    };
    let mr_max = if isa == Isa::Avx2 { 4 } else { MR };
    if m == 0 || n == 0 {
        return;
    }
    let mut a = if isa == Isa::Amx {
        LAct::tiled(x, m, k, bits)
    } else {
        LAct::new(x, m, k, bits)
    };
    if isa == Isa::Avx2 && parts.iter().any(|p| pack::code_bytes(p.qtype) == ROWS * QK) {
        a.widen();
    }
    // AVX2 tiles of whole octets of rows run turned around (`avx2_rows.rs`).
    #[cfg(target_arch = "x86_64")]
    let octets = (isa == Isa::Avx2
        && m >= avx2_rows::OCTET
        && parts.iter().any(|p| avx2_rows::takes(p.qtype)))
    .then(|| avx2_rows::Octets::new(&a, m / avx2_rows::OCTET));
    // (part, group, first output column)
    let mut tasks = Vec::with_capacity(n / ROWS + parts.len());
    let mut col = 0;
    for (pi, p) in parts.iter().enumerate() {
        for g in 0..p.groups {
            tasks.push((pi, g, col + g * ROWS));
        }
        col += p.rows;
    }
    let threads = crate::pool::threads();
    let per = if m * n * k < 1 << 16 || threads == 1 {
        tasks.len()
    } else {
        tasks.len().div_ceil(threads * 4).max(1)
    };
    let o = SendPtr(out.as_mut_ptr());
    let run = |chunk: &[(usize, usize, usize)]| {
        #[cfg(target_arch = "x86_64")]
        let mut tiles = amx::Tiles::new();
        #[cfg(target_arch = "x86_64")]
        let mut group_codes = amx::GroupCodes::new();
        for r0 in (0..m).step_by(ROW_CHUNK) {
            let rows = (m - r0).min(ROW_CHUNK);
            for &(pi, g, col) in chunk {
                let p = &parts[pi];
                let lanes = (p.rows - g * ROWS).min(ROWS);
                let mut i = r0;
                while i < r0 + rows {
                    let left = r0 + rows - i;
                    #[cfg(target_arch = "x86_64")]
                    if let Some(x) = &octets
                        && left >= avx2_rows::OCTET
                        && avx2_rows::takes(p.qtype)
                    {
                        let no = if left >= 2 * avx2_rows::OCTET { 2 } else { 1 };
                        // SAFETY: as below; rows i..i+8·no are whole octets (i is r0 plus
                        // a multiple of 8 here, r0 a multiple of ROW_CHUNK).
                        unsafe {
                            run_octets(&a, x, p, g, i, no, o.at(i * n + col), n, lanes, i == r0);
                        }
                        i += no * avx2_rows::OCTET;
                        continue;
                    }
                    #[cfg(target_arch = "x86_64")]
                    if isa == Isa::Amx {
                        let mr = left.min(TM);
                        // A pass of several tiles unpacks the group's codes once, with its
                        // first tile.
                        let codes = if rows > TM && amx::unpacks(p.qtype) {
                            amx::Codes::Group {
                                base: group_codes.base(p.nb),
                                unpack: i == r0,
                            }
                        } else {
                            amx::Codes::Ring
                        };
                        // SAFETY: AMX-INT8 is granted (`Isa::Amx`); `a` is tiled and `i` a
                        // multiple of 16; the group buffer holds `p.nb` blocks, unpacked by
                        // this pass's first tile; as below for the rest.
                        unsafe {
                            tiles.set(amx::class(p.qtype));
                            let args = args(&a, p, g, i, o.at(i * n + col), n, lanes, i == r0);
                            amx::dispatch(p.qtype, mr, &args, codes);
                        }
                        i += mr;
                        continue;
                    }
                    let mr = if left >= mr_max { mr_max } else { left.min(4) };
                    // SAFETY: the group and rows exist; columns col..col+lanes of rows
                    // i..i+mr are this task's alone.
                    unsafe {
                        run_tile(isa, &a, p, g, i, mr, o.at(i * n + col), n, lanes, i == r0);
                    }
                    i += mr;
                }
            }
        }
    };
    if per >= tasks.len() {
        run(&tasks);
    } else {
        crate::pool::run(tasks.len().div_ceil(per), |c| {
            run(&tasks[c * per..((c + 1) * per).min(tasks.len())])
        });
    }
}

/// One group of `w` against activation rows `i..i+mr`.
///
/// # Safety
/// As [`x86::kernel`] (and [`avx2::kernel`] for each half of the group).
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile(
    isa: Isa,
    a: &LAct,
    w: &LMatrix,
    g: usize,
    i: usize,
    mr: usize,
    out: *mut f32,
    ldo: usize,
    lanes: usize,
    prefetch: bool,
) {
    #[cfg(target_arch = "x86_64")]
    unsafe {
        let args = args(a, w, g, i, out, ldo, lanes, prefetch);
        match isa {
            Isa::Avx512Vnni | Isa::Amx => x86::dispatch(w.qtype, mr, &args),
            Isa::Avx2 => avx2::dispatch(w.qtype, mr, &args),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, a, w, g, i, mr, out, ldo, lanes, prefetch);
        unreachable!("the lane kernels run on x86-64 only");
    }
}

/// One group of `w` against the `8·no` activation rows from `i` (whole octets of `x`) on
/// AVX2, turned around ([`avx2_rows`]).
///
/// # Safety
/// As [`run_tile`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn run_octets(
    a: &LAct,
    x: &avx2_rows::Octets,
    w: &LMatrix,
    g: usize,
    i: usize,
    no: usize,
    out: *mut f32,
    ldo: usize,
    lanes: usize,
    prefetch: bool,
) {
    let args = args(a, w, g, i, out, ldo, lanes, prefetch);
    unsafe { avx2_rows::dispatch(w.qtype, no, &args, x, i / avx2_rows::OCTET, lanes) }
}

/// A kernel's arguments for group `g` of `w` (`lanes` of its rows) from activation row `i`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn args<'a>(
    a: &'a LAct,
    w: &LMatrix,
    g: usize,
    i: usize,
    out: *mut f32,
    ldo: usize,
    lanes: usize,
    prefetch: bool,
) -> x86::Args<'a> {
    x86::Args {
        a,
        i0: i,
        w: w.group(g),
        nb: w.nb,
        out,
        ldo,
        mask: if lanes == ROWS {
            u16::MAX
        } else {
            (1u16 << lanes) - 1
        },
        prefetch,
    }
}

/// Whether the format has a per-block minimum term.
#[cfg(test)]
fn has_min(qt: lmi_checkpoint::quant::QType) -> bool {
    matches!(
        qt,
        lmi_checkpoint::quant::QType::Q4_1 | lmi_checkpoint::quant::QType::Q4_K
    )
}

/// The definition of the kernel's result for activation row `i` and weight row `r`, in
/// scalar arithmetic: per block, the exact integer `Σ code·a − offset·Σa`, then
/// `acc = fma(f32(I), scale·d, acc)` and, with a minimum, `acc = fma(min, ms, acc)`.
#[cfg(test)]
pub(crate) fn reference(a: &LAct, i: usize, w: &LMatrix, r: usize) -> f32 {
    let off = offset(w.qtype);
    let mut acc = 0f32;
    for b in 0..w.nb {
        let dec = w.decode(r, b);
        let at = i * a.nb + b;
        let q = &a.q[at * 2 * QK..(at + 1) * 2 * QK];
        // The exact integer over values `vs`, less the offset times their activation sum.
        let dot = |vs: std::ops::Range<usize>, sum: i32| {
            vs.fold(-off * sum, |s, v| {
                s + i32::from(dec.codes[v]) * (16 * i32::from(q[v]) + i32::from(q[QK + v]))
            })
        };
        if w.qtype == lmi_checkpoint::quant::QType::Q6_K {
            // Two halves of 16 values, each with its scale.
            let (s0, s1) = (
                dot(0..16, a.sum16[at]),
                dot(16..QK, a.sum[at] - a.sum16[at]),
            );
            acc = (s0 as f32).mul_add(dec.scale * a.d[at], acc);
            acc = (s1 as f32).mul_add(dec.scale2 * a.d[at], acc);
            continue;
        }
        acc = (dot(0..QK, a.sum[at]) as f32).mul_add(dec.scale * a.d[at], acc);
        if has_min(w.qtype) {
            acc = dec.min.mul_add(a.ms[at], acc);
        }
    }
    acc
}
