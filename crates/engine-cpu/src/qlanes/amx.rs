//! The lane kernels' products on AMX-INT8 tiles (Sapphire Rapids and later), with the same
//! bits.
//!
//! One `tdpbsud` multiplies a tile of signed activation bytes (16 rows × up to 64 bytes) by a
//! tile of unsigned weight codes into 16 × 16 int32 sums: the lane layout (`pack.rs`,
//! `[4-value group][row][4]`) is already the weight tile's layout, so a block's codes load as
//! they are stored (bytes) or after unpacking their nibbles into 1 KiB in L1. The sums are the
//! lane kernels' exact integers `Σ code·a − OFFSET·Σa` (integers do not depend on the order
//! they are summed in), and they reach f32 through the lane kernel's operations in its order
//! (`x86.rs`): `acc = fma(f32(I), scale·d, acc)`, then `acc = fma(min, ms, acc)`. So every
//! row count gives the lane kernels' bits, and batch invariance and the `==` tests hold
//! across both kernels and every machine.
//!
//! The activations' `a = 16·hi + lo` (`act.rs`) per block:
//! - 4-bit codes (Q4_0, Q4_1, Q4_K): one product of 64 bytes a row, the block's 32 `hi` then
//!   32 `lo` bytes as they lie in `LAct` against `16·code` then `code` (both fit a byte).
//! - Bytes (Q8_0, I8; MXFP4 through its table): `hi` and `lo` against the codes in two
//!   products, joined as `16·H + L` (`16·code` would not fit).
//! - Q6_K: the same per half of 16 values, each half with its own scale.
//!
//! A tile always takes 16 activation rows, laid out for it ([`super::LAct::tiled`]: whole
//! tiles, the last padded with zero rows); only the rows that exist are stored. The f32 epilogue per
//! block and row is the part that costs: the integer products are one instruction per block.

use std::arch::asm;
use std::arch::x86_64::*;

use lmi_checkpoint::quant::QType;

use super::QK;
use super::pack::{ROWS, code_bytes, offset, offsets};
use super::x86::{Args, LFmt, MXFP4_CODES, PREFETCH};
use crate::amx::TileConfig;

/// Activation rows per tile.
pub(super) const TM: usize = super::act::TILE_ROWS;

/// How a format's blocks meet the tiles (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Nibbles,
    Bytes,
    Q6K,
}

pub(super) const fn class(qt: QType) -> Class {
    match qt {
        QType::Q4_0 | QType::Q4_1 | QType::Q4_K => Class::Nibbles,
        QType::Q6_K => Class::Q6K,
        QType::Q8_0 | QType::I8 | QType::MXFP4 => Class::Bytes,
    }
}

impl Class {
    /// tmm0–3 the sums, tmm4–5 the activations, tmm6–7 the codes.
    fn config(self) -> TileConfig {
        const SUMS: (u8, u16) = (TM as u8, 64);
        const ACT: u8 = TM as u8;
        match self {
            Class::Nibbles => TileConfig::new([
                SUMS,
                SUMS,
                SUMS,
                SUMS,
                (ACT, 64),
                (ACT, 64),
                (16, 64),
                (16, 64),
            ]),
            Class::Bytes => TileConfig::new([
                SUMS,
                SUMS,
                SUMS,
                SUMS,
                (ACT, 32),
                (ACT, 32),
                (8, 64),
                (8, 64),
            ]),
            Class::Q6K => TileConfig::new([
                SUMS,
                SUMS,
                SUMS,
                SUMS,
                (ACT, 16),
                (ACT, 16),
                (4, 64),
                (4, 64),
            ]),
        }
    }
}

/// The tile configuration this thread has loaded for a run of products; the tile state is
/// released when it is dropped (other work on the thread, the bf16 tiles among it, loads
/// its own).
pub(super) struct Tiles(Option<Class>);

impl Tiles {
    pub(super) fn new() -> Tiles {
        Tiles(None)
    }

    /// Loads `c`'s configuration unless it is the one loaded.
    ///
    /// # Safety
    /// The process was granted the tile state (`crate::amx::int8_available`).
    pub(super) unsafe fn set(&mut self, c: Class) {
        if self.0 != Some(c) {
            // SAFETY: as the caller promises.
            unsafe { c.config().load() };
            self.0 = Some(c);
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        if self.0.is_some() {
            // SAFETY: tiles were configured, so the state was granted.
            unsafe { crate::amx::tile_release() };
        }
    }
}

/// Blocks in flight: block `b`'s codes are unpacked at step `b`, its tile products run at
/// step `b + 1`, its sums are stored at `b + 2` and taken into f32 at `b + 3`, so that no
/// step waits on the one before (the tile loads on the unpacking's stores, the tile store on
/// the product's latency, the f32 loads on the tile store: each measured as costly as the
/// products when back to back). Slots are reused every `RING` blocks.
const RING: usize = 4;

/// Per slot: a block's unpacked codes (16 tile rows) and its sum tiles (up to four: Q6_K's
/// two halves, `hi` and `lo` each), 64-byte aligned.
#[repr(C, align(64))]
struct Scratch {
    codes: [[u8; 16 * 64]; RING],
    sums: [[i32; 4 * TM * ROWS]; RING],
}

/// Where a block's unpacked codes go: slots reused every `RING` blocks, or (for passes of
/// more than one tile of activation rows) a block each in a buffer kept for the whole group,
/// unpacked by the pass's first tile and read by the rest.
#[derive(Clone, Copy)]
pub(super) enum Codes {
    Ring,
    Group { base: *mut u8, unpack: bool },
}

/// Bytes of unpacked codes a block takes in [`Codes::Group`].
pub(super) const BLOCK_CODES: usize = 16 * 64;

/// What the steps of a block read.
struct Ctx<'a, 'b> {
    t: &'a Args<'b>,
    codes: *mut u8,
    /// Whether `codes` is a group's buffer (a block each) rather than the ring.
    group: bool,
    unpack: bool,
    sums: *mut i32,
    /// Bytes from one activation row's block to the next row's.
    ast: usize,
}

impl Ctx<'_, '_> {
    #[inline(always)]
    fn codes(&self, b: usize) -> *mut u8 {
        let slot = if self.group { b } else { b % RING };
        // SAFETY (callers): inside the scratch or the group's buffer.
        unsafe { self.codes.add(slot * BLOCK_CODES) }
    }

    #[inline(always)]
    fn sums(&self, b: usize, j: usize) -> *mut i32 {
        // SAFETY (callers): inside the scratch.
        unsafe { self.sums.add((b % RING * 4 + j) * TM * ROWS) }
    }
}

/// Step 1 of block `b`: prefetch ahead and unpack the codes where the tiles cannot read them
/// as stored.
#[inline(always)]
unsafe fn unpack<F: LFmt>(c: &Ctx, b: usize) {
    unsafe {
        let t = c.t;
        let (co, _, _) = offsets(F::QTYPE, b);
        let cp = t.w.add(co);
        if t.prefetch {
            let mut l = 0;
            while l <= code_bytes(F::QTYPE) {
                _mm_prefetch::<_MM_HINT_T0>(cp.wrapping_add(PREFETCH + l) as *const i8);
                l += 64;
            }
        }
        if !c.unpack {
            return;
        }
        let dst = c.codes(b);
        let put = |r: usize, x: __m512i| _mm512_store_si512(dst.add(64 * r) as *mut _, x);
        let line = |z: usize| _mm512_load_si512(cp.add(64 * z) as *const _);
        let m4 = _mm512_set1_epi8(0x0f);
        match class(F::QTYPE) {
            Class::Nibbles => {
                let mf0 = _mm512_set1_epi8(0xf0u8 as i8);
                for z in 0..4 {
                    let v = line(z);
                    // Rows 2z and 2z+1 hold values 8z..8z+4 (low nibbles) and 8z+4..8z+8
                    // (high): times 16 against `hi`, then as they are against `lo`.
                    put(2 * z, _mm512_and_si512(_mm512_slli_epi16::<4>(v), mf0));
                    put(2 * z + 1, _mm512_and_si512(v, mf0));
                    put(8 + 2 * z, _mm512_and_si512(v, m4));
                    put(9 + 2 * z, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
                }
            }
            Class::Bytes if F::TABLE => {
                let table =
                    _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_CODES.as_ptr() as *const __m128i));
                for z in 0..4 {
                    let v = line(z);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    put(2 * z, _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4)));
                    put(2 * z + 1, _mm512_shuffle_epi8(table, hi));
                }
            }
            Class::Bytes => {}
            Class::Q6K => {
                let m30 = _mm512_set1_epi8(0x30);
                for z in 0..4 {
                    // As the lane kernel: the high two bits of 4-value group i of this line's
                    // 16 values are bits 2i..2i+2 of its byte, moved to bits 4..6.
                    let v = line(z);
                    let h = _mm512_load_si512(cp.add(256 + 64 * (z / 2)) as *const _);
                    let (h0, h1) = if z % 2 == 0 {
                        (_mm512_slli_epi16::<4>(h), _mm512_slli_epi16::<2>(h))
                    } else {
                        (h, _mm512_srli_epi16::<2>(h))
                    };
                    let lo = _mm512_and_si512(v, m4);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                    // (h & 0x30) | c
                    put(2 * z, _mm512_ternarylogic_epi32::<0xEA>(h0, m30, lo));
                    put(2 * z + 1, _mm512_ternarylogic_epi32::<0xEA>(h1, m30, hi));
                }
            }
        }
    }
}

/// A 4-bit block's product (sum tile tmm`$c`, activations tmm`$a`, codes tmm`$b`).
macro_rules! nibble_block {
    ($c:literal, $a:literal, $b:literal, $codes:expr, $ap:expr, $ast:expr) => {
        asm!(
            concat!("tilezero tmm", $c),
            concat!("tileloadd tmm", $b, ", [{c} + {row}*1]"),
            concat!("tileloadd tmm", $a, ", [{a} + {ast}*1]"),
            concat!("tdpbsud tmm", $c, ", tmm", $a, ", tmm", $b),
            c = in(reg) $codes,
            a = in(reg) $ap,
            row = in(reg) 64usize,
            ast = in(reg) $ast,
            options(nostack, readonly, preserves_flags)
        )
    };
}

/// A byte block's products: `hi` and `lo` sums in tmm`$h` and tmm`$l`, codes in tmm`$b`.
macro_rules! byte_block {
    ($h:literal, $l:literal, $b:literal, $codes:expr, $ap:expr, $ast:expr) => {
        asm!(
            concat!("tilezero tmm", $h),
            concat!("tilezero tmm", $l),
            concat!("tileloadd tmm", $b, ", [{c} + {row}*1]"),
            "tileloadd tmm4, [{a} + {ast}*1]",
            "tileloadd tmm5, [{al} + {ast}*1]",
            concat!("tdpbsud tmm", $h, ", tmm4, tmm", $b),
            concat!("tdpbsud tmm", $l, ", tmm5, tmm", $b),
            c = in(reg) $codes,
            a = in(reg) $ap,
            al = in(reg) $ap.add(QK),
            row = in(reg) 64usize,
            ast = in(reg) $ast,
            options(nostack, readonly, preserves_flags)
        )
    };
}

/// Stores sum tiles tmm`$t`… to `$o` (one tile after another).
macro_rules! store_sums {
    ($o:expr, $($t:literal @ $at:literal),+) => {
        asm!(
            $(concat!("tilestored [{o} + {row}*1 + ", $at, "], tmm", $t),)+
            o = in(reg) $o,
            row = in(reg) 64usize,
            options(nostack, preserves_flags)
        )
    };
}

/// Step 2 of block `b`: its integer sums in tile registers (Q6_K's stored too: its four
/// tiles leave no room to wait). Consecutive blocks use other tile registers, so that one
/// block's products need not wait for the last one's store.
#[inline(always)]
unsafe fn products<F: LFmt>(c: &Ctx, b: usize) {
    unsafe {
        let t = c.t;
        let ap = t.a.block(t.i0, b);
        let (codes, ast) = (c.codes(b), c.ast);
        match class(F::QTYPE) {
            Class::Nibbles => match b % 4 {
                0 => nibble_block!("0", "4", "6", codes, ap, ast),
                1 => nibble_block!("1", "5", "7", codes, ap, ast),
                2 => nibble_block!("2", "4", "6", codes, ap, ast),
                _ => nibble_block!("3", "5", "7", codes, ap, ast),
            },
            Class::Bytes => {
                let src = if F::TABLE {
                    codes as *const u8
                } else {
                    t.w.add(offsets(F::QTYPE, b).0)
                };
                if b.is_multiple_of(2) {
                    byte_block!("0", "1", "6", src, ap, ast)
                } else {
                    byte_block!("2", "3", "7", src, ap, ast)
                }
            }
            Class::Q6K => {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "tileloadd tmm6, [{c} + {row}*1]",
                    "tileloadd tmm7, [{c2} + {row}*1]",
                    "tileloadd tmm4, [{a} + {ast}*1]",
                    "tileloadd tmm5, [{al} + {ast}*1]",
                    "tdpbsud tmm0, tmm4, tmm6",
                    "tdpbsud tmm1, tmm5, tmm6",
                    "tileloadd tmm4, [{a2} + {ast}*1]",
                    "tileloadd tmm5, [{al2} + {ast}*1]",
                    "tdpbsud tmm2, tmm4, tmm7",
                    "tdpbsud tmm3, tmm5, tmm7",
                    c = in(reg) codes,
                    c2 = in(reg) codes.add(256),
                    a = in(reg) ap,
                    al = in(reg) ap.add(QK),
                    a2 = in(reg) ap.add(QK / 2),
                    al2 = in(reg) ap.add(QK + QK / 2),
                    row = in(reg) 64usize,
                    ast = in(reg) ast,
                    options(nostack, readonly, preserves_flags)
                );
                store_sums!(c.sums(b, 0), "0" @ "0", "1" @ "1024", "2" @ "2048", "3" @ "3072");
            }
        }
    }
}

/// Step 3 of block `b`: its sum tiles to its slot (a step after the products, whose latency
/// the store would otherwise wait out).
#[inline(always)]
unsafe fn store<F: LFmt>(c: &Ctx, b: usize) {
    unsafe {
        let o = c.sums(b, 0);
        match class(F::QTYPE) {
            Class::Nibbles => match b % 4 {
                0 => store_sums!(o, "0" @ "0"),
                1 => store_sums!(o, "1" @ "0"),
                2 => store_sums!(o, "2" @ "0"),
                _ => store_sums!(o, "3" @ "0"),
            },
            Class::Bytes if b.is_multiple_of(2) => store_sums!(o, "0" @ "0", "1" @ "1024"),
            Class::Bytes => store_sums!(o, "2" @ "0", "3" @ "1024"),
            Class::Q6K => {}
        }
    }
}

/// Step 4 of block `b`: its sums into the rows' accumulators, with the lane kernel's f32
/// operations in its order.
#[inline(always)]
unsafe fn accumulate<F: LFmt, const MR: usize>(c: &Ctx, b: usize, acc: &mut [__m512; MR]) {
    unsafe {
        let t = c.t;
        let off = offset(F::QTYPE);
        let (_, so, ho) = offsets(F::QTYPE, b);
        let (sw, mw) = F::scales(t.w.add(so), t.w.add(ho));
        // Opaque base pointers, so that each row's operands are at fixed offsets from them
        // (indexed addresses would split the fused loads into twice the operations).
        let sp = opaque(c.sums(b, 0));
        let sum = |j: usize, i: usize| _mm512_load_si512(sp.add((j * TM + i) * ROWS) as *const _);
        // The block's exact integer less the offset term, as `x86.rs` forms it.
        let join = |h: __m512i, l: __m512i, s: i32| {
            let n = _mm512_add_epi32(_mm512_slli_epi32::<4>(h), l);
            if off == 0 {
                n
            } else {
                _mm512_sub_epi32(n, _mm512_set1_epi32(off * s))
            }
        };
        let sc =
            &*opaque(t.a.tsc.as_ptr().add(t.i0 / TM * t.a.nb + b) as *mut super::act::TileScales);
        for (i, acc) in acc.iter_mut().enumerate() {
            let d = _mm512_set1_ps(sc.d[i]);
            let total = sc.sum[i];
            match class(F::QTYPE) {
                Class::Nibbles => {
                    let mut n = sum(0, i);
                    if off != 0 {
                        n = _mm512_sub_epi32(n, _mm512_set1_epi32(off * total));
                    }
                    let n = _mm512_cvtepi32_ps(n);
                    *acc = _mm512_fmadd_ps(n, _mm512_mul_ps(sw, d), *acc);
                }
                Class::Bytes => {
                    let n = _mm512_cvtepi32_ps(join(sum(0, i), sum(1, i), total));
                    *acc = _mm512_fmadd_ps(n, _mm512_mul_ps(sw, d), *acc);
                }
                Class::Q6K => {
                    let s16 = sc.sum16[i];
                    let n0 = _mm512_cvtepi32_ps(join(sum(0, i), sum(1, i), s16));
                    let n1 = _mm512_cvtepi32_ps(join(sum(2, i), sum(3, i), total - s16));
                    *acc = _mm512_fmadd_ps(n0, _mm512_mul_ps(sw, d), *acc);
                    *acc = _mm512_fmadd_ps(n1, _mm512_mul_ps(mw, d), *acc);
                }
            }
            if F::MIN {
                let ms = _mm512_set1_ps(sc.ms[i]);
                *acc = _mm512_fmadd_ps(mw, ms, *acc);
            }
        }
    }
}

/// `p`, hidden from the optimizer (see [`accumulate`]).
#[inline(always)]
// The block reads no memory through `p`: it only launders the value.
#[allow(clippy::pointers_in_nomem_asm_block)]
fn opaque<T>(mut p: *mut T) -> *mut T {
    // SAFETY: an empty statement; it only stops the compiler from seeing where `p` came from.
    unsafe { asm!("/* {0} */", inout(reg) p, options(pure, nomem, nostack, preserves_flags)) };
    p
}

/// One group of 16 weight rows against activation rows `t.i0..t.i0 + rows` (`rows ≤ MR`);
/// the f32 steps run `MR` rows (the padding's are zero and not stored).
///
/// # Safety
/// The CPU has AMX-INT8 and AVX-512 (F/BW/VL/DQ, F16C), the tiles are configured for
/// `class(F::QTYPE)` ([`Tiles::set`]); the group exists; `t.a` is tiled
/// ([`super::LAct::tiled`]) and `t.i0` a multiple of 16; the output has `rows` rows of `t.ldo` with 16
/// (masked) columns at `t.out`; a [`Codes::Group`] buffer holds `t.nb` blocks of
/// [`BLOCK_CODES`] bytes, 64-byte aligned, unpacked (`unpack`) by an earlier call for this
/// group unless this one unpacks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn kernel<F: LFmt, const MR: usize>(t: &Args, rows: usize, codes: Codes) {
    unsafe {
        let mut s = std::mem::MaybeUninit::<Scratch>::uninit();
        let ring = std::ptr::addr_of_mut!((*s.as_mut_ptr()).codes) as *mut u8;
        let (codes, group, fresh) = match codes {
            Codes::Ring => (ring, false, true),
            Codes::Group { base, unpack } => (base, true, unpack),
        };
        let c = Ctx {
            t,
            codes,
            group,
            unpack: fresh,
            sums: std::ptr::addr_of_mut!((*s.as_mut_ptr()).sums) as *mut i32,
            ast: t.a.row_stride(),
        };
        let mut acc = [_mm512_setzero_ps(); MR];
        for step in 0..t.nb + 3 {
            if step < t.nb {
                unpack::<F>(&c, step);
            }
            if (1..=t.nb).contains(&step) {
                products::<F>(&c, step - 1);
            }
            if (2..t.nb + 2).contains(&step) {
                store::<F>(&c, step - 2);
            }
            if step >= 3 {
                accumulate::<F, MR>(&c, step - 3, &mut acc);
            }
        }
        for (i, a) in acc.iter().enumerate().take(rows) {
            _mm512_mask_storeu_ps(t.out.add(i * t.ldo), t.mask, *a);
        }
    }
}

/// Whether `qt`'s tiles read unpacked codes (a [`Codes::Group`] buffer is worth keeping).
pub(super) const fn unpacks(qt: QType) -> bool {
    !matches!(qt, QType::Q8_0 | QType::I8)
}

/// A thread's buffer of unpacked codes for one group ([`Codes::Group`]), grown as needed.
pub(super) struct GroupCodes(Vec<Line>);

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

impl GroupCodes {
    pub(super) fn new() -> GroupCodes {
        GroupCodes(Vec::new())
    }

    /// Room for `nb` blocks.
    pub(super) fn base(&mut self, nb: usize) -> *mut u8 {
        let lines = nb * BLOCK_CODES / 64;
        if self.0.len() < lines {
            self.0.resize(lines, Line([0; 64]));
        }
        self.0.as_mut_ptr() as *mut u8
    }
}

/// Runs [`kernel`] for `qt` over `rows` activation rows (1 to 16).
///
/// # Safety
/// As [`kernel`].
pub(super) unsafe fn dispatch(qt: QType, rows: usize, t: &Args, codes: Codes) {
    macro_rules! by_rows {
        ($f:ty) => {
            match rows {
                0..=4 => kernel::<$f, 4>(t, rows, codes),
                5..=8 => kernel::<$f, 8>(t, rows, codes),
                _ => kernel::<$f, 16>(t, rows, codes),
            }
        };
    }
    unsafe { super::x86::by_format!(qt, by_rows) }
}
