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
