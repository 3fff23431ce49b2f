//! Weights read straight from a GGUF file: quantized block types kept as they are (or
//! dequantized when a float or int8 dtype is asked for), under their HF names, with
//! llama.cpp's rearrangements undone: its Q/K row permutation, and the hybrids' value-head
//! order, splits and transformed values (`gguf/hybrid.rs`), each a [`Layout`].

use std::collections::HashMap;
use std::path::Path;

use super::host::{HostData, HostTensor};
use crate::dtype::DType;
use crate::error::{CheckpointError, Result};
use crate::gguf::dequant::dequantize;
use crate::gguf::hparams;
use crate::gguf::layout::{Layout, Values, block_order, gather_cols, gather_rows};
use crate::gguf::tensor_names::{self, Mapped, QkKind};
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
            let at = |layout| Source {
                tensor: i,
                expert: None,
                layout,
            };
            match tensor_names::map_in(&info.name, &h) {
                Some(Mapped::Hf { name, qk }) => {
                    let heads = match (h.arch, qk) {
                        (a, Some(QkKind::Q)) if a.permutes_qk() => Some(h.num_heads as usize),
                        (a, Some(QkKind::K)) if a.permutes_qk() => Some(h.num_kv_heads as usize),
                        _ => None,
                    };
                    let layout = match heads {
                        Some(heads) => {
                            let rows = info.hf_shape().first().copied().unwrap_or(0);
                            Layout::rows(unpermute_order(rows, heads))
                        }
                        None => Layout::default(),
                    };
                    by_name.insert(name, at(layout));
                }
                Some(Mapped::Rearranged(parts)) => {
                    for (name, layout) in parts {
                        by_name.insert(name, at(layout));
                    }
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
                            expert: Some((e, count)),
                            layout: Layout::default(),
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
        let src = self
            .by_name
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                name: name.to_string(),
                dir: self.file.path().to_path_buf(),
            })?;
        let info: &TensorInfo = &self.file.tensors[src.tensor];
        let mut stored = info.hf_shape();
        let mut bytes = self.file.tensor_data(info)?;
        if let Some((e, count)) = src.expert {
            // Expert `e`'s rows: whole rows, so a block format's bytes split evenly.
            stored.remove(0);
            let per = bytes.len() / count;
            bytes = &bytes[e * per..(e + 1) * per];
        }
        let l = &src.layout;
        let shape = hf_shape(&stored, l).ok_or_else(|| {
            CheckpointError::Gguf(format!(
                "tensor {:?} of shape {stored:?} does not hold {name} as this file's metadata \
                 describes it",
                info.name
            ))
        })?;
        if shape != expected {
            return Err(CheckpointError::ShapeMismatch {
                name: name.to_string(),
                got: shape,
                expected: expected.to_vec(),
            });
        }
        let qtype = QType::from_ggml(info.ggml_type).filter(|_| self.as_stored);
        if let (Some(qt), [rows, cols], [_, _]) = (qtype, &stored[..], expected)
            && l.values == Values::AsStored
        {
            let m = QMatrix::new(qt, *rows, *cols, bytes.to_vec(), Vec::new())
                .map_err(|e| CheckpointError::Gguf(format!("tensor {:?}: {e}", info.name)))?;
            self.file.release(bytes);
            let m = match &l.rows {
                Some(order) => m.permute_rows(order),
                None => m,
            };
            return Ok(match &l.cols {
                None => HostTensor::quant(m),
                Some(order) => match block_order(order, qt.block()) {
                    Some(blocks) => HostTensor::quant(m.permute_col_blocks(&blocks)),
                    // Qwen3.5's `ssm_out` with value heads narrower than a block (a K-quant's
                    // 256 columns hold two heads of 128): columns cannot move inside blocks,
                    // and permuting the other side instead (the value heads the layer
                    // computes) would pair them with the wrong key heads. So this one matrix
                    // per linear layer is dequantized and held in the load's dtype.
                    None => HostTensor::f32(
                        expected.to_vec(),
                        gather_cols(&m.dequantize(), *cols, order),
                    )
                    .to_dtype(dtype),
                },
            });
        }
        // A stack of matrices (Gemma 4's experts, `[experts, rows, cols]`): one matrix of all
        // their rows, split by whole rows where it is used (`HostTensor::unstack`).
        if let (Some(qt), [n, rows, cols], [_, _, _], None, None) =
            (qtype, &stored[..], expected, &l.rows, &l.cols)
            && l.values == Values::AsStored
        {
            let m = QMatrix::new(qt, n * rows, *cols, bytes.to_vec(), Vec::new())
                .map_err(|e| CheckpointError::Gguf(format!("tensor {:?}: {e}", info.name)))?;
            self.file.release(bytes);
            return Ok(HostTensor {
                shape: expected.to_vec(),
                data: HostData::Quant(vec![m]),
            });
        }
        let mut x = dequantize(&info.name, info.ggml_type, bytes, stored.iter().product())?;
        self.file.release(bytes);
        if let Some(order) = &l.rows {
            x = gather_rows(&x, stored[1..].iter().product(), order);
        }
        if let (Some(order), [_, cols]) = (&l.cols, &stored[..]) {
            x = gather_cols(&x, *cols, order);
        }
        l.values.apply(&mut x);
        Ok(HostTensor::f32(expected.to_vec(), x).to_dtype(dtype))
    }
}

/// The HF shape of a tensor stored as `stored` read through `l`; None when the layout does not
/// fit the stored tensor (indices past its rows or columns, another element count).
fn hf_shape(stored: &[usize], l: &Layout) -> Option<Vec<usize>> {
    let mut shape = stored.to_vec();
    if let Some(order) = &l.rows {
        let rows = *stored.first()?;
        if order.iter().any(|&r| r >= rows) {
            return None;
        }
        shape[0] = order.len();
    }
    if let Some(order) = &l.cols {
        let &[_, cols] = stored else { return None };
        if order.len() != cols || order.iter().any(|&c| c >= cols) {
            return None;
        }
    }
    match &l.shape {
        Some(s) if s.iter().product::<usize>() != shape.iter().product::<usize>() => None,
        Some(s) => Some(s.clone()),
        None => Some(shape),
    }
}

/// Where an HF-named tensor lies in the file.
struct Source {
    tensor: usize,
    /// Expert `e` of `count` stacked in the tensor.
    expert: Option<(usize, usize)>,
    layout: Layout,
}

/// `order[hf_row] = gguf_row`: the inverse of llama.cpp's per-head interleaving (see
/// [`tensor_names::unpermute_rows`]).
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
    use crate::gguf::tensor_names::unpermute_rows;

    #[test]
    fn order_matches_unpermute_rows() {
        let rows: Vec<f32> = (0..16).map(|r| r as f32).collect();
        let want = unpermute_rows(&rows, 2, 1);
        let got: Vec<f32> = unpermute_order(16, 2).iter().map(|&r| r as f32).collect();
        assert_eq!(got, want);
    }
}

#[cfg(test)]
mod hybrid_tests {
    use super::*;
    use crate::gguf::GgmlType;
    use crate::gguf::reader::GgufValue as V;
    use crate::gguf::writer::{TensorOut, write};
    use crate::weights::HostData;

    /// A one-layer qwen35 file holding only `ssm_out` (value heads tiled, 2 key heads of 2
    /// value heads of `dv`), quantized to Q8_0, and the HF matrix it was made from.
    fn file_with_ssm_out(dir: &Path, dv: usize) -> (std::path::PathBuf, Vec<f32>) {
        let (hidden, vd) = (32, 4 * dv);
        let hf: Vec<f32> = (0..hidden * vd)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
            .collect();
        // The converter's tiling: HF column of head g·2 + v lands in head v·2 + g.
        let mut file = vec![0f32; hf.len()];
        for r in 0..hidden {
            for (g, v, i) in
                (0..2).flat_map(|g| (0..2).flat_map(move |v| (0..dv).map(move |i| (g, v, i))))
            {
                file[r * vd + (v * 2 + g) * dv + i] = hf[r * vd + (g * 2 + v) * dv + i];
            }
        }
        let q = QMatrix::quantize(QType::Q8_0, hidden, vd, &file).unwrap();
        let u = |k: &str, v: usize| (format!("qwen35.{k}"), V::U32(v as u32));
        let meta = vec![
            (
                "general.architecture".to_string(),
                V::String("qwen35".into()),
            ),
            u("embedding_length", hidden),
            u("feed_forward_length", hidden),
            u("block_count", 1),
            u("attention.head_count", 1),
            u("ssm.group_count", 2),
            u("ssm.time_step_rank", 4),
            u("ssm.inner_size", vd),
            u("ssm.state_size", 8),
            u("ssm.conv_kernel", 4),
        ];
        let tensors = [
            TensorOut {
                name: "token_embd.weight".into(),
                dims: vec![hidden as u64, 2],
                ggml_type: GgmlType::F32,
                data: vec![0; 2 * hidden * 4],
            },
            TensorOut {
                name: "blk.0.ssm_out.weight".into(),
                dims: vec![vd as u64, hidden as u64],
                ggml_type: GgmlType::Q8_0,
                data: q.data.clone(),
            },
        ];
        let path = dir.join(format!("dv{dv}.gguf"));
        write(&path, &meta, &tensors).unwrap();
        // What the file's blocks hold, in HF's column order.
        let stored = q.dequantize();
        let mut want = vec![0f32; hf.len()];
        for r in 0..hidden {
            for (g, v, i) in
                (0..2).flat_map(|g| (0..2).flat_map(move |v| (0..dv).map(move |i| (g, v, i))))
            {
                want[r * vd + (g * 2 + v) * dv + i] = stored[r * vd + (v * 2 + g) * dv + i];
            }
        }
        (path, want)
    }

    /// `ssm_out`'s columns go back to transformers' value-head order: as whole Q8_0 blocks
    /// where a head is whole blocks (dv 32), else dequantized to the load's dtype (dv 16).
    #[test]
    fn ssm_out_columns_move_as_blocks_or_dequantized() {
        let dir = tempfile::tempdir().unwrap();
        let name = "model.layers.0.linear_attn.out_proj.weight";
        for dv in [32, 16] {
            let (path, want) = file_with_ssm_out(dir.path(), dv);
            // Dequantized on request: the file's values in HF's order, in f32.
            let f = GgufWeights::open(&path, false).unwrap();
            let t = f.load(name, &[32, 4 * dv], DType::F32).unwrap();
            assert_eq!(t.to_f32_vec(), want, "dv {dv}: f32");
            let w = GgufWeights::open(&path, true).unwrap();
            let t = w.load(name, &[32, 4 * dv], DType::BF16).unwrap();
            let want = match (&t.data, dv) {
                (HostData::Quant(parts), 32) => {
                    assert_eq!(parts[0].qtype, QType::Q8_0);
                    want
                }
                (HostData::BF16(_), 16) => HostTensor::f32(vec![32, 64], want)
                    .to_dtype(DType::BF16)
                    .to_f32_vec(),
                (other, _) => panic!("dv {dv}: held as {other:?}"),
            };
            assert_eq!(t.to_f32_vec(), want, "dv {dv}: as stored");
        }
    }
}
