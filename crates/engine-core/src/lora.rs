//! LoRA adapters: `y = W x + s · B (A x)` on the attention and MLP projections, per sequence.
//!
//! Two forms, the two tiers of the adapter cache: [`LoraWeights`] on the host (parsed and
//! checked against the base model by `lmi_checkpoint::peft`, scale folded into B), and
//! [`LoraAdapter`] uploaded to a backend (what a step reads). The engine uploads host weights under the
//! scheduler's id and registers them with the backend (the CUDA backend gives each a slot of
//! its device table); who decides which adapters are resident is the scheduler's business.

use lmi_checkpoint::DType;

use crate::backend::{Backend, LoraLayer, LoraRegistration};
use crate::error::Result;

pub use lmi_checkpoint::peft::{LoraWeights, Target};

pub struct LoraPair<B: Backend> {
    pub a: B::Weight,
    pub b: B::Weight,
}

pub struct LoraAdapter<B: Backend> {
    /// Ends the backend's registration first when dropped (fields drop in order), so no
    /// device table points at the pairs once they are freed.
    _registration: Option<LoraRegistration>,
    pub rank: usize,
    /// `[layer][target]`, None where the adapter leaves a projection alone.
    pub layers: Vec<[Option<LoraPair<B>>; 7]>,
}

impl<B: Backend> LoraAdapter<B> {
    pub fn get(&self, layer: usize, t: Target) -> Option<&LoraPair<B>> {
        self.layers[layer][t as usize].as_ref()
    }

    /// Uploads host weights (the engine tier of the cache) in `dtype` (the model's: bf16
    /// models keep their adapters in bf16, as GPU engines do) and registers them under the
    /// engine's `id` (what `SeqChunk::adapter` names).
    pub fn upload(backend: &B, id: u64, w: &LoraWeights, dtype: DType) -> Result<Self> {
        let mut layers = Vec::with_capacity(w.layers.len());
        for row in &w.layers {
            let mut out: [Option<LoraPair<B>>; 7] = Default::default();
            for (slot, pair) in out.iter_mut().zip(row) {
                if let Some((a, b)) = pair {
                    let (a, b) = backend.upload_lora_pair(a.clone(), b.clone(), dtype)?;
                    *slot = Some(LoraPair { a, b });
                }
            }
            layers.push(out);
        }
        let pairs: Vec<LoraLayer<'_, B::Weight>> = layers
            .iter()
            .map(|row| std::array::from_fn(|t| row[t].as_ref().map(|p| (&p.a, &p.b))))
            .collect();
        let registration = backend.register_lora(id, &pairs)?;
        Ok(LoraAdapter {
            _registration: registration,
            rank: w.rank,
            layers,
        })
    }
}
