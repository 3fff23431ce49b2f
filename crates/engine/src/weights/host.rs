use half::{bf16, f16};

use crate::dtype::DType;

/// Tensor data on the host in the dtype a backend will keep it in.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    /// bf16 bit patterns.
    BF16(Vec<u16>),
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

    pub fn len(&self) -> usize {
        match &self.data {
            HostData::F32(v) => v.len(),
            HostData::BF16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self.data {
            HostData::F32(_) => DType::F32,
            HostData::BF16(_) => DType::BF16,
        }
    }

    /// Converts to `dtype` (F16 is held as F32: backends compute f16 checkpoints in f32).
    pub fn to_dtype(self, dtype: DType) -> Self {
        let data = match (self.data, dtype) {
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
        }
    }

    /// Concatenates tensors along dim 0 (fusing q/k/v or gate/up projections).
    /// All parts must share the trailing dims and the dtype.
    pub fn concat_rows(parts: Vec<HostTensor>) -> HostTensor {
        let cols: usize = parts[0].shape[1..].iter().product();
        let rows: usize = parts.iter().map(|p| p.shape[0]).sum();
        let mut shape = parts[0].shape.clone();
        shape[0] = rows;
        let data = match parts[0].dtype() {
            DType::BF16 => {
                let mut out = Vec::with_capacity(rows * cols);
                for p in parts {
                    match p.data {
                        HostData::BF16(v) => out.extend(v),
                        HostData::F32(v) => {
                            out.extend(v.into_iter().map(|x| bf16::from_f32(x).to_bits()))
                        }
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
