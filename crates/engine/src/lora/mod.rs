//! LoRA adapters: `y = W x + s · B (A x)` on the attention and MLP projections, per sequence.
//!
//! Two forms, the two tiers of the adapter cache: [`LoraWeights`] on the host (parsed and
//! checked against the base model by `peft.rs`, scale folded into B), and [`LoraAdapter`]
//! uploaded to a backend (what a step reads). The engine uploads host weights into its slots;
//! who decides which adapters are resident is the scheduler's business.

mod peft;

pub use peft::{AdapterInfo, LoraLimits, LoraWeights, PairInfo, ScaleRule, inspect};

use crate::backend::Backend;
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
    pub rank: usize,
    /// `[layer][target]`, None where the adapter leaves a projection alone.
    pub layers: Vec<[Option<LoraPair<B>>; 7]>,
}

impl<B: Backend> LoraAdapter<B> {
    pub fn get(&self, layer: usize, t: Target) -> Option<&LoraPair<B>> {
        self.layers[layer][t as usize].as_ref()
    }

    /// Uploads host weights (the engine tier of the cache) in `dtype` (the model's: bf16
    /// models keep their adapters in bf16, as GPU engines do).
    pub fn upload(backend: &B, w: &LoraWeights, dtype: DType) -> Result<Self> {
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
        Ok(LoraAdapter {
            rank: w.rank,
            layers,
        })
    }
}
