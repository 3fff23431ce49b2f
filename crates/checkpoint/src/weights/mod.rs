//! Host tensors and the checkpoint readers: HF safetensors (single or sharded) and GGUF.

mod gguf_source;
mod hf_quant;
mod host;
mod safetensors_dir;

pub use gguf_source::GgufWeights;
pub use hf_quant::fp8_e4m3;
pub use host::{HostData, HostTensor};
pub use safetensors_dir::SafetensorsDir;

use crate::dtype::DType;
use crate::error::Result;

/// Where a model's tensors come from, under their HF names.
pub enum WeightSource {
    Safetensors(SafetensorsDir),
    Gguf(GgufWeights),
}

impl WeightSource {
    pub fn contains(&self, name: &str) -> bool {
        match self {
            WeightSource::Safetensors(s) => s.contains(name),
            WeightSource::Gguf(g) => g.contains(name),
        }
    }

    /// A U8 tensor's bytes (MXFP4 blocks and scales), from safetensors.
    pub fn load_u8(&self, name: &str, shape: &[usize]) -> Result<Vec<u8>> {
        match self {
            WeightSource::Safetensors(s) => s.load_u8(name, shape),
            WeightSource::Gguf(_) => Err(crate::error::CheckpointError::Gguf(format!(
                "{name}: a GGUF holds no U8 tensors"
            ))),
        }
    }

    /// Rows `rows` of the 2-D tensor `name` in f32 ([`SafetensorsDir::load_rows`]; a GGUF's
    /// tensor is read whole, then picked).
    pub fn load_rows(
        &self,
        name: &str,
        shape: [usize; 2],
        rows: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        match self {
            WeightSource::Safetensors(s) => s.load_rows(name, shape, rows),
            WeightSource::Gguf(g) => {
                let width = shape[1];
                let all = g.load(name, &shape, DType::F32)?.to_f32_vec();
                Ok(rows
                    .iter()
                    .map(|&r| {
                        all.get(r * width..(r + 1) * width)
                            .unwrap_or_default()
                            .to_vec()
                    })
                    .collect())
            }
        }
    }

    pub fn load(&self, name: &str, shape: &[usize], dtype: DType) -> Result<HostTensor> {
        match self {
            WeightSource::Safetensors(s) => s.load(name, shape, dtype),
            WeightSource::Gguf(g) => g.load(name, shape, dtype),
        }
    }
}
