//! Weights read straight from a GGUF file: quantized block types kept as they are (or
//! dequantized when a float or int8 dtype is asked for), under their HF names, with
//! llama.cpp's Q/K row permutation undone.

use std::collections::HashMap;
use std::path::Path;

use super::host::HostTensor;
use crate::dtype::DType;
use crate::error::{CheckpointError, Result};
use crate::gguf::dequant::dequantize;
use crate::gguf::hparams::{self, GgufArch};
use crate::gguf::tensor_names::{self, Mapped, QkKind, unpermute_rows};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{QMatrix, QType};

pub struct GgufWeights {
    file: GgufFile,
    /// HF name → where it is.
    by_name: HashMap<String, Source>,
    /// Quantized matrices stay in their block format.
    as_stored: bool,
}

impl GgufWeights {
    pub fn open(path: &Path, as_stored: bool) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let h = hparams::read(&file)?;
        let mut by_name = HashMap::new();
        for (i, info) in file.tensors.iter().enumerate() {
            match tensor_names::map(&info.name, h.arch) {
                Some(Mapped::Hf { name, qk }) => {
                    let heads = match (h.arch, qk) {
                        (GgufArch::Llama, Some(QkKind::Q)) => Some(h.num_heads as usize),
                        (GgufArch::Llama, Some(QkKind::K)) => Some(h.num_kv_heads as usize),
                        _ => None,
                    };
                    let source = Source {
                        tensor: i,
                        heads,
                        expert: None,
                    };
                    by_name.insert(name, source);
                }
                Some(Mapped::Experts {
                    layer,
                    proj,
                    suffix,
                }) => {
                    let count = info.hf_shape().first().copied().unwrap_or(0);
                    for e in 0..count {
                        let source = Source {
                            tensor: i,
                            heads: None,
                            expert: Some((e, count)),
                        };
                        let name = tensor_names::expert_name(layer, proj, e, suffix);
                        by_name.insert(name, source);
                    }
                }
                Some(Mapped::Skip) | None => {}
            }
        }
        Ok(GgufWeights {
            file,
            by_name,
            as_stored,
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Tensor `name` with the expected HF shape: quantized as stored (when opened so and the
    /// tensor is a matrix of a block type), else in `dtype`.
    pub fn load(&self, name: &str, expected: &[usize], dtype: DType) -> Result<HostTensor> {
        let &Source {
            tensor,
            heads,
            expert,
        } = self
            .by_name
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                name: name.to_string(),
                dir: self.file.path().to_path_buf(),
            })?;
        let info: &TensorInfo = &self.file.tensors[tensor];
        let mut shape = info.hf_shape();
        let mut bytes = self.file.tensor_data(info)?;
        if let Some((e, count)) = expert {
            // Expert `e`'s rows: whole rows, so a block format's bytes split evenly.
            shape.remove(0);
            let per = bytes.len() / count;
            bytes = &bytes[e * per..(e + 1) * per];
        }
        if shape != expected {
            return Err(CheckpointError::ShapeMismatch {
                name: name.to_string(),
                got: shape,
                expected: expected.to_vec(),
            });
        }
        let qtype = QType::from_ggml(info.ggml_type).filter(|_| self.as_stored);
        if let (Some(qt), [rows, cols]) = (qtype, expected) {
            let m = QMatrix::new(qt, *rows, *cols, bytes.to_vec(), Vec::new())
                .map_err(|e| CheckpointError::Gguf(format!("tensor {:?}: {e}", info.name)))?;
            self.file.release(bytes);
            let m = match heads {
                Some(h) => m.permute_rows(&unpermute_order(*rows, h)),
                None => m,
            };
            return Ok(HostTensor::quant(m));
        }
        let x = dequantize(&info.name, info.ggml_type, bytes, expected.iter().product())?;
        self.file.release(bytes);
        let x = match heads {
            Some(h) => unpermute_rows(&x, h, expected.get(1..).map_or(1, |s| s.iter().product())),
            None => x,
        };
        Ok(HostTensor::f32(expected.to_vec(), x).to_dtype(dtype))
    }
}

/// Where an HF-named tensor lies in the file.
#[derive(Clone, Copy)]
struct Source {
    tensor: usize,
    /// Heads to un-permute the rows over (llama-arch Q and K).
    heads: Option<usize>,
    /// Expert `e` of `count` stacked in the tensor.
    expert: Option<(usize, usize)>,
}

/// `order[hf_row] = gguf_row`: the inverse of llama.cpp's per-head interleaving (see
/// [`unpermute_rows`]).
fn unpermute_order(rows: usize, heads: usize) -> Vec<usize> {
    let d = rows / heads;
    let mut order = vec![0; rows];
    for h in 0..heads {
        for j in 0..d / 2 {
            for a in 0..2 {
                order[h * d + a * d / 2 + j] = h * d + 2 * j + a;
            }
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_matches_unpermute_rows() {
        let rows: Vec<f32> = (0..16).map(|r| r as f32).collect();
        let want = unpermute_rows(&rows, 2, 1);
        let got: Vec<f32> = unpermute_order(16, 2).iter().map(|&r| r as f32).collect();
        assert_eq!(got, want);
    }
}
