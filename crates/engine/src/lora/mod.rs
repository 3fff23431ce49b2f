//! LoRA adapters: `y = W x + s · B (A x)` on the attention and MLP projections, per sequence.
//!
//! Two forms, the two tiers of the adapter cache: [`LoraWeights`] on the host (parsed and
//! checked against the base model by `peft.rs`, scale folded into B), and [`LoraAdapter`]
//! uploaded to a backend (what a step reads). The engine uploads host weights under the
//! scheduler's id and registers them with the backend (the CUDA backend gives each a slot of
//! its device table); who decides which adapters are resident is the scheduler's business.

mod peft;

pub use peft::{AdapterInfo, LoraLimits, LoraWeights, PairInfo, ScaleRule, inspect};

use crate::backend::{Backend, LoraLayer, LoraRegistration};
use crate::config::ModelConfig;
use crate::dtype::DType;
use crate::error::Result;

/// Projections an adapter may target, with (output rows, input width) in model terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The PEFT module name (`self_attn.q_proj`, ...).
    pub fn module(self) -> &'static str {
        match self {
            Target::Q => "self_attn.q_proj",
            Target::K => "self_attn.k_proj",
            Target::V => "self_attn.v_proj",
            Target::O => "self_attn.o_proj",
            Target::Gate => "mlp.gate_proj",
            Target::Up => "mlp.up_proj",
            Target::Down => "mlp.down_proj",
        }
    }

    /// (out, in) of the base projection.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let h = c.hidden_size;
        match self {
            Target::Q => (c.q_size(), h),
            Target::K | Target::V => (c.kv_size(), h),
            Target::O => (h, c.q_size()),
            Target::Gate | Target::Up => (c.intermediate_size, h),
            Target::Down => (h, c.intermediate_size),
        }
    }
}

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
