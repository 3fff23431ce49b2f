//! Quantized weight matrices kept in their block formats in memory: the GGUF types most files
//! on the hub use (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, and MXFP4, gpt-oss's experts), and `I8`,
//! per-channel int8 the engine makes from a bf16/f32 checkpoint (`--dtype int8`).
//!
//! The block layouts are ggml's (`ggml-common.h`), byte for byte, so a GGUF tensor is used as
//! it is in the file. The CPU products are in `lmi-engine-cpu` (`qlanes/`, `qlinear.rs`); backends without kernels for
//! these formats dequantize at upload (`HostTensor::to_dtype`).

mod blocks;
mod mxfp4;

pub use blocks::scale_min_k4;
pub use blocks::{dequantize_block, quantize_row};
pub use mxfp4::{FP4_X2, half_e8m0};
pub use mxfp4::{MXFP4_BLOCK, dequantize_mxfp4};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QType {
    Q8_0,
    Q4_0,
    Q4_1,
    Q4_K,
    Q6_K,
    /// ggml's MXFP4: an E8M0 exponent and 32 FP4 (E2M1) values (`quant/mxfp4.rs`).
    MXFP4,
    /// Per-channel int8: one f32 scale per row, 32 signed bytes per block.
    I8,
}

impl QType {
    pub const ALL: [QType; 7] = [
        QType::Q8_0,
        QType::Q4_0,
        QType::Q4_1,
        QType::Q4_K,
        QType::Q6_K,
        QType::MXFP4,
        QType::I8,
    ];

    /// Elements per block.
    pub const fn block(self) -> usize {
        match self {
            QType::Q4_K | QType::Q6_K => 256,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QType::Q8_0 => 34,
            QType::Q4_0 => 18,
            QType::Q4_1 => 20,
            QType::Q4_K => 144,
            QType::Q6_K => 210,
            QType::MXFP4 => 17,
            QType::I8 => 32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QType::Q8_0 => "q8_0",
            QType::Q4_0 => "q4_0",
            QType::Q4_1 => "q4_1",
            QType::Q4_K => "q4_k",
            QType::Q6_K => "q6_k",
            QType::MXFP4 => "mxfp4",
            QType::I8 => "int8",
        }
    }
}

impl std::str::FromStr for QType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.to_ascii_lowercase();
        QType::ALL
            .into_iter()
            .find(|q| q.name() == s || (s == "i8" && *q == QType::I8))
            .ok_or_else(|| {
                format!(
                    "unknown block type {s:?}: expected q8_0, q4_0, q4_1, q4_k, q6_k, mxfp4 \
                     or int8"
                )
            })
    }
}

/// A row-major `[rows, cols]` matrix of one block type: each row is `cols / block` blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct QMatrix {
    pub qtype: QType,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<u8>,
    /// `I8` only: each row's scale.
    pub row_scale: Vec<f32>,
}

impl QMatrix {
    /// Checks the sizes: `cols` a whole number of blocks, `data` exactly `rows` rows.
    pub fn new(
        qtype: QType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        row_scale: Vec<f32>,
    ) -> Result<Self, String> {
        if !cols.is_multiple_of(qtype.block()) {
            return Err(format!(
                "a {} row of {cols} elements is not a whole number of {}-element blocks",
                qtype.name(),
                qtype.block()
            ));
        }
        let row_bytes = cols / qtype.block() * qtype.block_bytes();
        if data.len() != rows * row_bytes {
            return Err(format!(
                "{} bytes do not hold a [{rows}, {cols}] {} matrix ({} bytes)",
                data.len(),
                qtype.name(),
                rows * row_bytes
            ));
        }
        let scales = if qtype == QType::I8 { rows } else { 0 };
        if row_scale.len() != scales {
            return Err(format!(
                "{} row scales for {rows} rows of {}",
                row_scale.len(),
                qtype.name()
            ));
        }
        Ok(QMatrix {
            qtype,
            rows,
            cols,
            data,
            row_scale,
        })
    }

    /// Quantizes a row-major f32 matrix.
    pub fn quantize(qtype: QType, rows: usize, cols: usize, x: &[f32]) -> Result<Self, String> {
        assert_eq!(x.len(), rows * cols);
        if !cols.is_multiple_of(qtype.block()) {
            return Err(format!(
                "cannot quantize rows of {cols} elements to {}: not a multiple of {}",
                qtype.name(),
                qtype.block()
            ));
        }
        let mut data = Vec::with_capacity(rows * cols / qtype.block() * qtype.block_bytes());
        let mut row_scale = Vec::new();
        for r in x.chunks_exact(cols.max(1)).take(rows) {
            if let Some(s) = quantize_row(qtype, r, &mut data) {
                row_scale.push(s);
            }
        }
        QMatrix::new(qtype, rows, cols, data, row_scale)
    }

    pub fn row_bytes(&self) -> usize {
        self.cols / self.qtype.block() * self.qtype.block_bytes()
    }

    /// Rows `r` as a matrix of their own (their bytes copied).
    pub fn row_range(&self, r: std::ops::Range<usize>) -> QMatrix {
        let rb = self.row_bytes();
        QMatrix {
            qtype: self.qtype,
            rows: r.len(),
            cols: self.cols,
            data: self.data[r.start * rb..r.end * rb].to_vec(),
            row_scale: match self.row_scale.is_empty() {
                true => Vec::new(),
                false => self.row_scale[r].to_vec(),
            },
        }
    }

    /// Every value times `s`, as stored: each block's f16 scales (and minimum) multiplied by
    /// `s` and rounded to f16 again (a relative change of at most 2^-11 on each, far inside
    /// the blocks' own error), `I8`'s row scales exactly in f32. None where that cannot be
    /// done: MXFP4 (its scale is a power of two) or a scale leaving f16's range.
    pub fn scaled(&self, s: f32) -> Option<QMatrix> {
        let mut m = self.clone();
        // Byte offsets of the f16 scales in a block.
        let at: &[usize] = match self.qtype {
            QType::Q8_0 | QType::Q4_0 => &[0],
            QType::Q4_1 | QType::Q4_K => &[0, 2],
            QType::Q6_K => &[208],
            QType::I8 => {
                m.row_scale.iter_mut().for_each(|x| *x *= s);
                return m.row_scale.iter().all(|x| x.is_finite()).then_some(m);
            }
            QType::MXFP4 => return None,
        };
        for b in m.data.chunks_exact_mut(self.qtype.block_bytes()) {
            for &i in at {
                let x = half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32() * s;
                let h = half::f16::from_f32(x);
                if !h.is_finite() {
                    return None;
                }
                b[i..i + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
        Some(m)
    }

    /// Bytes held (blocks and row scales).
    pub fn bytes(&self) -> usize {
        self.data.len() + self.row_scale.len() * 4
    }

    /// Row `r` in f32.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let row = &self.data[r * rb..(r + 1) * rb];
        let (b, bb) = (self.qtype.block(), self.qtype.block_bytes());
        for (blk, o) in row
            .chunks_exact(bb)
            .zip(out[..self.cols].chunks_exact_mut(b))
        {
            dequantize_block(self.qtype, blk, o);
        }
        if self.qtype == QType::I8 {
            let s = self.row_scale[r];
            out[..self.cols].iter_mut().for_each(|v| *v *= s);
        }
    }

    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.dequantize_row(r, o);
        }
        out
    }

    /// The rows `order` names, in that order (llama.cpp's Q/K permutation undone, or some
    /// rows picked out): rows are whole blocks, so this moves bytes without touching values.
    pub fn permute_rows(&self, order: &[usize]) -> QMatrix {
        let rb = self.row_bytes();
        let mut data = Vec::with_capacity(order.len() * rb);
        let mut row_scale = Vec::with_capacity(self.row_scale.len().min(order.len()));
        for &src in order {
            data.extend_from_slice(&self.data[src * rb..(src + 1) * rb]);
            if let Some(&s) = self.row_scale.get(src) {
                row_scale.push(s);
            }
        }
        QMatrix {
            qtype: self.qtype,
            rows: order.len(),
            cols: self.cols,
            data,
            row_scale,
        }
    }

    /// Every row with its blocks in the order `blocks` names (`blocks[new] = old`, one entry
    /// per block of a row): columns that move as whole blocks move without touching values
    /// (an `I8` row keeps its one scale).
    pub fn permute_col_blocks(&self, blocks: &[usize]) -> QMatrix {
        let bb = self.qtype.block_bytes();
        let mut data = Vec::with_capacity(self.data.len());
        for row in self.data.chunks_exact(self.row_bytes().max(1)) {
            for &b in blocks {
                data.extend_from_slice(&row[b * bb..(b + 1) * bb]);
            }
        }
        QMatrix {
            data,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests;
