//! The lane layout of a quantized matrix: weight rows in groups of 16 (one per f32 lane of a
//! 512-bit register), each group's bytes contiguous so that a thread reads one sequential
//! stream. Per group, for every 32-value block, the 16 rows' integer codes interleaved four
//! values at a time (`[4-value group][row][4]`, what one `vpdpbusd` against a broadcast
//! activation group multiplies), behind a line of their scales ([`offsets`]). Sizes equal
//! the file's (Q4_K: +2.8%, its 6-bit scales and mins unpacked to bytes). (Scales in an area
//! of their own after the codes missed the cache at every group's start: batch 1 read
//! SmolLM2's matrices a quarter slower.)
//!
//! Codes are unsigned, `value = scale · (code − OFFSET) (+ min)`:
//! - Q4_0: 4-bit codes, offset 8, f16 scale per block.
//! - Q4_1: 4-bit codes, f16 scale and f16 min per block.
//! - Q4_K: 4-bit codes; per super-block of 256 the f16 `d` and `dmin`, per block the 6-bit
//!   scale and min as bytes: scale `d·sc`, min `−dmin·mn`.
//! - MXFP4: 4-bit FP4 codes (read through a table as twice their value plus 12, offset 12),
//!   the E8M0 exponent byte per block (scale `2^(e−128)`).
//! - Q8_0: bytes `w + 128`, offset 128, f16 scale per block.
//! - I8: bytes `w + 128`, offset 128, the row's f32 scale.
//! - Q6_K: 6-bit codes (4-bit low nibbles as above, then the high two bits four values a
//!   byte), offset 32; per super-block the f16 `d`, per 16 values the int8 scale (`d·sc`).
//!
//! 4-bit codes are stored two to a byte: in each 64-byte line of a block, the low nibbles are
//! values `8z..8z+4` of the 16 rows and the high nibbles values `8z+4..8z+8` (line z of 4).

use lmi_checkpoint::quant::{FP4_X2, QMatrix, QType, half_e8m0, scale_min_k4};

use super::QK;
use crate::weight_arena::ArenaBuf;

/// Weight rows per group (f32 lanes of a 512-bit register).
pub(crate) const ROWS: usize = 16;

/// Bytes of one block's codes for a group.
pub(crate) const fn code_bytes(qt: QType) -> usize {
    match qt {
        QType::Q8_0 | QType::I8 => ROWS * QK,
        // Low nibbles as the 4-bit formats, then the high two bits (four values a byte).
        QType::Q6_K => ROWS * QK / 2 + ROWS * QK / 4,
        _ => ROWS * QK / 2,
    }
}

/// Where block `b`'s bytes lie in its group: `(codes, scales, head)`. A 64-byte line of
/// scales precedes the blocks it covers (two blocks' f16 scales, one block's scale and min,
/// four MXFP4 exponents, two Q4_K blocks' scales and mins), so a group is one sequential
/// stream with its codes on 64-byte boundaries. `head` is Q4_K's super-block line (`d`,
/// `dmin`) and I8's line of row scales at the group's start.
#[inline(always)]
pub(crate) const fn offsets(qt: QType, b: usize) -> (usize, usize, usize) {
    let cb = code_bytes(qt);
    match qt {
        QType::Q4_0 | QType::Q8_0 => chunked(b, 2, cb, 0),
        QType::Q4_1 => chunked(b, 1, cb, 0),
        QType::MXFP4 => chunked(b, 4, cb, 0),
        QType::I8 => (64 + b * cb, 0, 0),
        QType::Q4_K | QType::Q6_K => {
            let head = b / 8 * (64 + 4 * (64 + 2 * cb));
            let (c, s, _) = chunked(b % 8, 2, cb, head + 64);
            (c, s, head)
        }
    }
}

/// Blocks in chunks of `per` behind one line of scales, from `base`.
#[inline(always)]
const fn chunked(b: usize, per: usize, cb: usize, base: usize) -> (usize, usize, usize) {
    let at = base + b / per * (64 + per * cb);
    (at + 64 + b % per * cb, at + b % per * (64 / per), 0)
}

/// Bytes of a group of `nb` blocks (a multiple of 64).
fn group_bytes(qt: QType, nb: usize) -> usize {
    let (last, _, _) = offsets(qt, nb - 1);
    last + code_bytes(qt)
}

pub struct LMatrix {
    pub qtype: QType,
    pub rows: usize,
    pub cols: usize,
    /// 32-value blocks per row.
    pub nb: usize,
    pub groups: usize,
    /// Bytes per group (a multiple of 64).
    pub group_bytes: usize,
    /// Carved from the weights' arena (see `weight_arena.rs` for why not a `Vec`).
    data: ArenaBuf,
}

/// One weight row's block `b` decoded: its codes, scale and min as the kernels use them.
pub(crate) struct Decoded {
    pub codes: [u8; QK],
    pub scale: f32,
    /// The scale of values 16..32 (Q6_K's sub-blocks are 16 values; `scale` elsewhere).
    pub scale2: f32,
    pub min: f32,
}

impl LMatrix {
    pub fn new(m: &QMatrix) -> LMatrix {
        let qt = m.qtype;
        assert!(m.cols.is_multiple_of(qt.block()));
        let nb = m.cols / QK;
        let groups = m.rows.div_ceil(ROWS);
        let group_bytes = group_bytes(qt, nb);
        let mut l = LMatrix {
            qtype: qt,
            rows: m.rows,
            cols: m.cols,
            nb,
            groups,
            group_bytes,
            data: ArenaBuf::zeroed(groups * group_bytes),
        };
        for r in 0..m.rows {
            let (g, lane) = (r / ROWS, r % ROWS);
            let src = &m.data[r * m.row_bytes()..(r + 1) * m.row_bytes()];
            let base = g * group_bytes;
            let bytes = l.bytes_mut();
            for b in 0..nb {
                let codes = row_codes(qt, src, b);
                let (co, so, ho) = offsets(qt, b);
                let (cb, sc, head) = (base + co, base + so, base + ho);
                if code_bytes(qt) == ROWS * QK {
                    for (v, &c) in codes.iter().enumerate() {
                        bytes[cb + (v / 4) * 64 + lane * 4 + v % 4] = c;
                    }
                } else {
                    for (v, &c) in codes.iter().enumerate() {
                        let at = cb + (v / 8) * 64 + lane * 4 + v % 4;
                        bytes[at] |= if v % 8 < 4 { c & 15 } else { (c & 15) << 4 };
                        if qt == QType::Q6_K {
                            let at = cb + 256 + (v / 16) * 64 + lane * 4 + v % 4;
                            bytes[at] |= (c >> 4) << (2 * (v % 16 / 4));
                        }
                    }
                }
                let put16 = |bytes: &mut [u8], at: usize, h: &[u8]| {
                    bytes[at + 2 * lane..at + 2 * lane + 2].copy_from_slice(h)
                };
                match qt {
                    QType::Q4_0 | QType::Q8_0 => {
                        put16(bytes, sc, &src[b * qt.block_bytes()..][..2]);
                    }
                    QType::Q4_1 => {
                        let blk = &src[b * 20..];
                        put16(bytes, sc, &blk[..2]);
                        put16(bytes, sc + 2 * ROWS, &blk[2..4]);
                    }
                    QType::MXFP4 => bytes[sc + lane] = src[b * 17],
                    QType::I8 => {
                        let at = head + 4 * lane;
                        bytes[at..at + 4].copy_from_slice(&m.row_scale[r].to_le_bytes());
                    }
                    QType::Q4_K => {
                        let sb = &src[b / 8 * 144..];
                        if b % 8 == 0 {
                            put16(bytes, head, &sb[..2]);
                            put16(bytes, head + 2 * ROWS, &sb[2..4]);
                        }
                        let (s, mn) = scale_min_k4(b % 8, &sb[4..16]);
                        bytes[sc + lane] = s;
                        bytes[sc + ROWS + lane] = mn;
                    }
                    QType::Q6_K => {
                        let sb = &src[b / 8 * 210..];
                        if b % 8 == 0 {
                            put16(bytes, head, &sb[208..210]);
                        }
                        bytes[sc + lane] = sb[192 + 2 * (b % 8)];
                        bytes[sc + ROWS + lane] = sb[192 + 2 * (b % 8) + 1];
                    }
                }
            }
        }
        l
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.data.bytes_mut()
    }

    fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// Group `g`'s first byte (64-byte aligned).
    pub(crate) fn group(&self, g: usize) -> *const u8 {
        debug_assert!(g < self.groups);
        // SAFETY: the group lies inside `data`.
        unsafe { self.data.as_ptr().add(g * self.group_bytes) }
    }

    pub fn size_bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r`'s block `b` as the kernels read it.
    pub(crate) fn decode(&self, r: usize, b: usize) -> Decoded {
        let qt = self.qtype;
        let (g, lane) = (r / ROWS, r % ROWS);
        let bytes = &self.bytes()[g * self.group_bytes..(g + 1) * self.group_bytes];
        let (co, so, ho) = offsets(qt, b);
        let mut codes = [0u8; QK];
        for (v, c) in codes.iter_mut().enumerate() {
            *c = if code_bytes(qt) == ROWS * QK {
                bytes[co + (v / 4) * 64 + lane * 4 + v % 4]
            } else {
                let byte = bytes[co + (v / 8) * 64 + lane * 4 + v % 4];
                if v % 8 < 4 { byte & 15 } else { byte >> 4 }
            };
            if qt == QType::Q6_K {
                let byte = bytes[co + 256 + (v / 16) * 64 + lane * 4 + v % 4];
                *c |= ((byte >> (2 * (v % 16 / 4))) & 3) << 4;
            }
            if qt == QType::MXFP4 {
                *c = (FP4_X2[usize::from(*c)] + 12) as u8;
            }
        }
        let f16 =
            |at: usize| half::f16::from_le_bytes([bytes[at + 2 * lane], bytes[at + 2 * lane + 1]]);
        let mut scale2 = None;
        let (scale, min) = match qt {
            QType::Q4_0 | QType::Q8_0 => (f16(so).to_f32(), 0.0),
            QType::Q4_1 => (f16(so).to_f32(), f16(so + 2 * ROWS).to_f32()),
            QType::MXFP4 => (half_e8m0(bytes[so + lane]), 0.0),
            QType::I8 => (
                f32::from_le_bytes(
                    bytes[ho + 4 * lane..ho + 4 * lane + 4]
                        .try_into()
                        .unwrap_or([0; 4]),
                ),
                0.0,
            ),
            QType::Q4_K => {
                let (d, dmin) = (f16(ho).to_f32(), f16(ho + 2 * ROWS).to_f32());
                let (sc, mn) = (
                    f32::from(bytes[so + lane]),
                    f32::from(bytes[so + ROWS + lane]),
                );
                (d * sc, -(dmin * mn))
            }
            QType::Q6_K => {
                let d = f16(ho).to_f32();
                let sc = |i: usize| f32::from(bytes[so + i * ROWS + lane] as i8);
                scale2 = Some(d * sc(1));
                (d * sc(0), 0.0)
            }
        };
        let scale2 = scale2.unwrap_or(scale);
        Decoded {
            codes,
            scale,
            scale2,
            min,
        }
    }

    /// Row `r` in f32 (embedding lookups): `scale · (code − offset) + min`, the file's values.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let off = offset(self.qtype);
        for (b, o) in out[..self.cols].chunks_exact_mut(QK).enumerate() {
            let d = self.decode(r, b);
            for (v, (o, &c)) in o.iter_mut().zip(&d.codes).enumerate() {
                let scale = if v < 16 { d.scale } else { d.scale2 };
                *o = (i32::from(c) - off) as f32 * scale + d.min;
            }
        }
    }
}

/// The integer subtracted from every code.
pub(crate) const fn offset(qt: QType) -> i32 {
    match qt {
        QType::Q4_0 => 8,
        QType::Q8_0 | QType::I8 => 128,
        QType::MXFP4 => 12,
        QType::Q6_K => 32,
        _ => 0,
    }
}

/// Block `b` (32 values) of a row in the file's layout: the unsigned codes, as stored (MXFP4:
/// its 4-bit FP4 codes).
fn row_codes(qt: QType, src: &[u8], b: usize) -> [u8; QK] {
    let mut c = [0u8; QK];
    match qt {
        QType::Q4_0 | QType::Q4_1 | QType::MXFP4 => {
            let head = match qt {
                QType::Q4_0 => 2,
                QType::Q4_1 => 4,
                _ => 1,
            };
            let q = &src[b * qt.block_bytes() + head..(b + 1) * qt.block_bytes()];
            for j in 0..16 {
                c[j] = q[j] & 15;
                c[j + 16] = q[j] >> 4;
            }
        }
        QType::Q8_0 => {
            let q = &src[b * 34 + 2..b * 34 + 34];
            for j in 0..QK {
                c[j] = q[j] ^ 0x80;
            }
        }
        QType::I8 => {
            for j in 0..QK {
                c[j] = src[b * QK + j] ^ 0x80;
            }
        }
        QType::Q4_K => {
            let q = &src[b / 8 * 144 + 16..];
            let (p, hi) = ((b % 8) / 2, b % 2 == 1);
            for l in 0..QK {
                let byte = q[32 * p + l];
                c[l] = if hi { byte >> 4 } else { byte & 15 };
            }
        }
        QType::Q6_K => {
            // ggml's order (`dequantize_row_q6_K`): per half of 128, value l of each quarter.
            let blk = &src[b / 8 * 210..];
            let w = b % 8;
            for (j, c) in c.iter_mut().enumerate() {
                let v = 32 * w + j;
                let (h, r) = (v / 128, v % 128);
                let (quarter, l) = (r / 32, r % 32);
                let ql = blk[64 * h + l + 32 * (quarter % 2)];
                let nib = if quarter < 2 { ql & 15 } else { ql >> 4 };
                let qh = (blk[128 + 32 * h + l] >> (2 * quarter)) & 3;
                *c = nib | (qh << 4);
            }
        }
    }
    c
}
