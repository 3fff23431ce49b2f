//! Linear-attention layers of a hybrid model (Qwen3.5 / Qwen3.6, Qwen3-Next: Gated DeltaNet),
//! as the config declares them: which layers they are and their heads. A linear layer keeps a
//! fixed-size recurrent state per sequence (a short convolution's last inputs and one
//! `key_dim × value_dim` matrix per value head) instead of K/V per token.

use serde_json::{Map, Value};

/// The Gated DeltaNet layers' shape (`linear_*` in config.json).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearAttnConfig {
    /// Per layer: true where it is a linear-attention layer (`layer_types`).
    pub layers: Vec<bool>,
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    /// The causal depthwise convolution's width (`linear_conv_kernel_dim`, 4 as published).
    pub conv_kernel: usize,
}

impl LinearAttnConfig {
    pub fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// Channels of the convolution: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Width of the fused input projection's rows: q, k, v (convolved), z (the output gate),
    /// then b (β) and a (the decay) per value head.
    pub fn proj_dim(&self) -> usize {
        self.conv_dim() + self.value_dim() + 2 * self.num_v_heads
    }

    /// f32 values of one layer's state for one sequence: the convolution's last
    /// `conv_kernel - 1` inputs per channel, then a `head_k_dim × head_v_dim` matrix per value
    /// head.
    pub fn state_len(&self) -> usize {
        self.conv_dim() * (self.conv_kernel - 1)
            + self.num_v_heads * self.head_k_dim * self.head_v_dim
    }

    pub fn num_linear_layers(&self) -> usize {
        self.layers.iter().filter(|&&l| l).count()
    }

    /// Parses the `linear_*` fields of a (flattened) config; None when the config has no
    /// linear layers.
    pub fn parse(
        top: &Map<String, Value>,
        num_layers: usize,
    ) -> std::result::Result<Option<Self>, String> {
        let int = |k: &str| top.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let Some(num_k_heads) = int("linear_num_key_heads") else {
            return Ok(None);
        };
        let req = |k: &str| -> std::result::Result<usize, String> {
            match int(k) {
                Some(0) => Err(format!("field {k:?} must be > 0")),
                Some(v) => Ok(v),
                None => Err(format!("field {k:?} is missing")),
            }
        };
        let layers = match top.get("layer_types").and_then(Value::as_array) {
            Some(types) => {
                if types.len() != num_layers {
                    return Err(format!(
                        "layer_types has {} entries for {num_layers} layers",
                        types.len()
                    ));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("linear_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        other => Err(format!(
                            "layer type {other:?} is not supported (linear_attention, full_attention)"
                        )),
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?
            }
            // transformers' default: every `full_attention_interval`-th layer is full.
            None => {
                let every = int("full_attention_interval").unwrap_or(4).max(1);
                (0..num_layers).map(|i| (i + 1) % every != 0).collect()
            }
        };
        let c = LinearAttnConfig {
            layers,
            num_k_heads,
            num_v_heads: req("linear_num_value_heads")?,
            head_k_dim: req("linear_key_head_dim")?,
            head_v_dim: req("linear_value_head_dim")?,
            conv_kernel: int("linear_conv_kernel_dim").unwrap_or(4),
        };
        if c.num_k_heads == 0 || !c.num_v_heads.is_multiple_of(c.num_k_heads) {
            return Err(format!(
                "linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
                c.num_v_heads, c.num_k_heads
            ));
        }
        if c.conv_kernel < 2 {
            return Err(format!(
                "linear_conv_kernel_dim ({}) must be at least 2",
                c.conv_kernel
            ));
        }
        Ok(Some(c))
    }
}
