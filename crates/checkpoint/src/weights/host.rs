use half::{bf16, f16};

use crate::dtype::DType;
use crate::quant::QMatrix;

/// Tensor data on the host in the form a backend will keep it in.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    /// bf16 bit patterns.
    BF16(Vec<u16>),
    /// A quantized matrix: row ranges in order, each in one block format (a fused QKV of a
    /// Q4_K_M file mixes Q4_K and Q6_K).
    Quant(Vec<QMatrix>),
}

/// A row-major host tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor {
            shape,
            data: HostData::F32(data),
        }
    }

    /// A quantized `[rows, cols]` matrix.
    pub fn quant(m: QMatrix) -> Self {
        HostTensor {
            shape: vec![m.rows, m.cols],
            data: HostData::Quant(vec![m]),
        }
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Converts to `dtype`: quantized data is dequantized for a float dtype, float data is
    /// quantized per channel for `I8` (F16 is held as F32: backends compute f16 checkpoints in
    /// f32).
    pub fn to_dtype(self, dtype: DType) -> Self {
        let data = match (self.data, dtype) {
            (HostData::Quant(parts), DType::I8) => HostData::Quant(parts),
            (HostData::Quant(parts), d) => {
                let v = parts.iter().flat_map(QMatrix::dequantize).collect();
                return HostTensor::f32(self.shape, v).to_dtype(d);
            }
            (d, DType::I8) if self.shape.len() == 2 => {
                let (rows, cols) = (self.shape[0], self.shape[1]);
                let v = HostTensor {
                    shape: self.shape.clone(),
                    data: d,
                }
                .to_f32_vec();
                match QMatrix::quantize(crate::quant::QType::I8, rows, cols, &v) {
                    Ok(m) => HostData::Quant(vec![m]),
                    Err(_) => HostData::F32(v),
                }
            }
            (HostData::F32(v), DType::BF16) => {
                HostData::BF16(v.into_iter().map(|x| bf16::from_f32(x).to_bits()).collect())
            }
            (HostData::BF16(v), DType::F32 | DType::F16) => {
                HostData::F32(v.into_iter().map(|b| bf16::from_bits(b).to_f32()).collect())
            }
            (d, _) => d,
        };
        HostTensor {
            shape: self.shape,
            data,
        }
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            HostData::F32(v) => v.clone(),
            HostData::BF16(v) => v.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
            HostData::Quant(parts) => parts.iter().flat_map(QMatrix::dequantize).collect(),
        }
    }

    /// A stacked `[n, rows, cols]` tensor as its `n` matrices `[rows, cols]`, each in the
    /// stack's form (a quantized stack's blocks split by whole rows, so they stay as stored).
    pub fn unstack(&self) -> Vec<HostTensor> {
        let (n, shape) = match self.shape.split_first() {
            Some((&n, rest)) => (n, rest.to_vec()),
            None => return Vec::new(),
        };
        let per: usize = shape.iter().product();
        let one = |data| HostTensor {
            shape: shape.clone(),
            data,
        };
        match &self.data {
            HostData::F32(v) => v
                .chunks(per.max(1))
                .take(n)
                .map(|c| one(HostData::F32(c.to_vec())))
                .collect(),
            HostData::BF16(v) => v
                .chunks(per.max(1))
                .take(n)
                .map(|c| one(HostData::BF16(c.to_vec())))
                .collect(),
            HostData::Quant(parts) => {
                let rows = shape.first().copied().unwrap_or(0);
                let slice = |i: usize| i * rows..(i + 1) * rows;
                match &parts[..] {
                    // A GGUF stack: one matrix of all the rows, each slice's bytes copied out.
                    [m] => (0..n)
                        .map(|i| one(HostData::Quant(vec![m.row_range(slice(i))])))
                        .collect(),
                    // Rows in several formats: picked row by row from the whole.
                    _ => {
                        let flat = HostTensor {
                            shape: vec![n * rows, per / rows.max(1)],
                            data: self.data.clone(),
                        };
                        (0..n)
                            .map(|i| one(flat.select_rows(&slice(i).collect::<Vec<_>>()).data))
                            .collect()
                    }
                }
            }
        }
    }

    /// Every value times `s`, in the tensor's form: floats multiplied (bf16 rounded again),
    /// quantized blocks through [`QMatrix::scaled`]; None where a block format cannot take it.
    pub fn scaled(&self, s: f32) -> Option<HostTensor> {
        let data = match &self.data {
            HostData::F32(v) => HostData::F32(v.iter().map(|x| x * s).collect()),
            HostData::BF16(v) => HostData::BF16(
                v.iter()
                    .map(|&b| bf16::from_f32(bf16::from_bits(b).to_f32() * s).to_bits())
                    .collect(),
            ),
            HostData::Quant(parts) => HostData::Quant(
                parts
                    .iter()
                    .map(|m| m.scaled(s))
                    .collect::<Option<Vec<_>>>()?,
            ),
        };
        Some(HostTensor {
            shape: self.shape.clone(),
            data,
        })
    }

    /// The rows (along dim 0) that `rows` names, in that order. Whole rows move, so a
    /// quantized tensor stays in its blocks (Qwen3.5's gated attention splits q_proj's query
    /// rows from its gate rows so).
    pub fn select_rows(&self, rows: &[usize]) -> HostTensor {
        let row_len: usize = self.shape[1..].iter().product();
        let mut shape = self.shape.clone();
        shape[0] = rows.len();
        let data = match &self.data {
            HostData::F32(v) => HostData::F32(pick(v, row_len, rows)),
            HostData::BF16(v) => HostData::BF16(pick(v, row_len, rows)),
            HostData::Quant(parts) => {
                // Each part is a range of rows; a row is found in its part and runs of one
                // format are kept as one matrix.
                let mut out: Vec<QMatrix> = Vec::new();
                for &r in rows {
                    let (mut part, mut local) = (0, r);
                    while local >= parts[part].rows {
                        local -= parts[part].rows;
                        part += 1;
                    }
                    let one = parts[part].permute_rows(&[local]);
                    match out.last_mut() {
                        Some(last) if last.qtype == one.qtype => {
                            last.rows += 1;
                            last.data.extend_from_slice(&one.data);
                            last.row_scale.extend_from_slice(&one.row_scale);
                        }
                        _ => out.push(one),
                    }
                }
                HostData::Quant(out)
            }
        };
        HostTensor { shape, data }
    }

    /// Concatenates tensors along dim 0 (fusing q/k/v or gate/up projections). All parts
    /// share the trailing dims; the result has the first part's form (quantized parts stay
    /// quantized when every part is).
    pub fn concat_rows(parts: Vec<HostTensor>) -> HostTensor {
        let cols: usize = parts[0].shape[1..].iter().product();
        let rows: usize = parts.iter().map(|p| p.shape[0]).sum();
        let mut shape = parts[0].shape.clone();
        shape[0] = rows;
        let all_quant = parts.iter().all(|p| matches!(p.data, HostData::Quant(_)));
        let data = match &parts[0].data {
            HostData::Quant(_) if all_quant => {
                let mut out: Vec<QMatrix> = Vec::new();
                for p in parts {
                    let HostData::Quant(ms) = p.data else {
                        unreachable!("all parts are quantized")
                    };
                    for m in ms {
                        match out.last_mut() {
                            // Same format: one longer matrix (fewer, larger tiles).
                            Some(last) if last.qtype == m.qtype => {
                                last.rows += m.rows;
                                last.data.extend_from_slice(&m.data);
                                last.row_scale.extend_from_slice(&m.row_scale);
                            }
                            _ => out.push(m),
                        }
                    }
                }
                HostData::Quant(out)
            }
            HostData::BF16(_) => {
                let mut out = Vec::with_capacity(rows * cols);
                for p in parts {
                    match p.data {
                        HostData::BF16(v) => out.extend(v),
                        _ => out.extend(
                            p.to_f32_vec()
                                .into_iter()
                                .map(|x| bf16::from_f32(x).to_bits()),
                        ),
                    }
                }
                HostData::BF16(out)
            }
            _ => {
                let mut out = Vec::with_capacity(rows * cols);
                for p in parts {
                    out.extend(p.to_f32_vec());
                }
                HostData::F32(out)
            }
        };
        HostTensor { shape, data }
    }
}

fn pick<T: Copy>(v: &[T], row_len: usize, rows: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.len() * row_len);
    for &r in rows {
        out.extend_from_slice(&v[r * row_len..(r + 1) * row_len]);
    }
    out
}

pub(crate) fn f16_bytes_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

pub(crate) fn bf16_bytes_to_bits(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

pub(crate) fn f32_bytes_to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QType;

    #[test]
    fn selected_rows_keep_their_form() {
        let x: Vec<f32> = (0..4 * 32).map(|v| (v % 7) as f32 - 3.0).collect();
        let f = HostTensor::f32(vec![4, 32], x.clone());
        let rows = [3, 0, 2];
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| x[r * 32..(r + 1) * 32].to_vec())
            .collect();
        assert_eq!(f.select_rows(&rows).to_f32_vec(), want);
        let b = f.clone().to_dtype(DType::BF16).select_rows(&rows);
        assert!(matches!(b.data, HostData::BF16(_)));
        assert_eq!(b.to_f32_vec(), want);
        // Rows 0-1 in Q8_0 and 2-3 in Q4_0 (as a fused matrix of a mixed file holds them).
        let q8 = QMatrix::quantize(QType::Q8_0, 2, 32, &x[..64]).unwrap();
        let q4 = QMatrix::quantize(QType::Q4_0, 2, 32, &x[64..]).unwrap();
        let both = HostTensor {
            shape: vec![4, 32],
            data: HostData::Quant(vec![q8.clone(), q4.clone()]),
        };
        let picked = both.select_rows(&rows);
        let HostData::Quant(parts) = &picked.data else {
            panic!("stays quantized")
        };
        let kinds: Vec<(QType, usize)> = parts.iter().map(|p| (p.qtype, p.rows)).collect();
        assert_eq!(
            kinds,
            [(QType::Q4_0, 1), (QType::Q8_0, 1), (QType::Q4_0, 1)]
        );
        let all = both.to_f32_vec();
        let want: Vec<f32> = rows
            .iter()
            .flat_map(|&r| all[r * 32..(r + 1) * 32].to_vec())
            .collect();
        assert_eq!(picked.to_f32_vec(), want);
    }
}
