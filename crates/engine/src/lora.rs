//! LoRA adapters: `y = W x + s · B (A x)` on the attention and MLP projections, per sequence.
//! An adapter is a PEFT directory (adapter_config.json + adapter_model.safetensors) or a bare
//! safetensors file (with an adapter_config.json beside it, else scale 1). The scale
//! (`lora_alpha / r`, or `/ sqrt(r)` with rsLoRA) is folded into B at load.

use std::path::{Path, PathBuf};

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::dtype::DType;
use crate::error::{EngineError, Result};
use crate::weights::{HostTensor, SafetensorsDir};

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

    fn module(self) -> &'static str {
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
    fn dims(self, c: &ModelConfig) -> (usize, usize) {
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

    /// Loads an adapter for a model of config `c`; errors name the file and tensor at fault.
    pub fn load(backend: &B, c: &ModelConfig, path: &Path) -> Result<Self> {
        let (file, config_path): (PathBuf, PathBuf) = if path.is_dir() {
            (
                path.join("adapter_model.safetensors"),
                path.join("adapter_config.json"),
            )
        } else {
            (
                path.to_path_buf(),
                path.with_file_name("adapter_config.json"),
            )
        };
        if !file.is_file() {
            return Err(EngineError::Config {
                path: file,
                msg: "LoRA weights not found: give a PEFT adapter directory or a .safetensors file"
                    .into(),
            });
        }
        let st = SafetensorsDir::open_file(&file)?;
        let cfg: serde_json::Value = match std::fs::read_to_string(&config_path) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| EngineError::Config {
                path: config_path.clone(),
                msg: e.to_string(),
            })?,
            Err(_) => serde_json::Value::Null,
        };
        // Tensor names: strip whatever prefix precedes "layers.N." (PEFT adds base_model.model.model.).
        let names: Vec<String> = st.names().map(str::to_string).collect();
        let find = |layer: usize, t: Target, ab: &str| -> Option<String> {
            let suffix = format!("layers.{layer}.{}.lora_{ab}.weight", t.module());
            names
                .iter()
                .find(|n| {
                    n.ends_with(&suffix)
                        && (n.len() == suffix.len() || n[..n.len() - suffix.len()].ends_with('.'))
                })
                .cloned()
        };
        let mut rank = 0;
        let mut layers = Vec::with_capacity(c.num_layers);
        let mut found = 0;
        for l in 0..c.num_layers {
            let mut row: [Option<LoraPair<B>>; 7] = Default::default();
            for t in Target::ALL {
                let (Some(an), Some(bn)) = (find(l, t, "A"), find(l, t, "B")) else {
                    continue;
                };
                let (out, inp) = t.dims(c);
                let r = st.shape(&an).and_then(|s| s.first().copied()).unwrap_or(0);
                if r == 0 {
                    return Err(EngineError::ShapeMismatch {
                        name: an,
                        got: vec![0],
                        expected: vec![1, inp],
                    });
                }
                let a = st.load(&an, &[r, inp], DType::F32)?;
                let b = st.load(&bn, &[out, r], DType::F32)?;
                let scale = lora_scale(&cfg, r);
                let b = HostTensor::f32(
                    vec![out, r],
                    b.to_f32_vec().into_iter().map(|x| x * scale).collect(),
                );
                row[t as usize] = Some(LoraPair {
                    a: backend.upload_weight(a)?,
                    b: backend.upload_weight(b)?,
                });
                rank = rank.max(r);
                found += 1;
            }
            layers.push(row);
        }
        if found == 0 {
            return Err(EngineError::Config {
                path: file,
                msg: "no LoRA tensors (…layers.N.<module>.lora_A/lora_B.weight) match this model"
                    .into(),
            });
        }
        Ok(LoraAdapter { rank, layers })
    }
}

fn lora_scale(cfg: &serde_json::Value, r: usize) -> f32 {
    let alpha = cfg
        .get("lora_alpha")
        .and_then(|v| v.as_f64())
        .unwrap_or(r as f64);
    let rs = cfg
        .get("use_rslora")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    (if rs {
        alpha / (r as f64).sqrt()
    } else {
        alpha / r as f64
    }) as f32
}
