//! Gemma 4's vision tower on the host, in f32 (transformers' `Gemma4VisionModel` and the
//! `Gemma4MultimodalEmbedder` after it): the patch embedding with its learned (x, y) position
//! tables, encoder layers (q/k-normed heads with 2-D RoPE, a weightless v norm, unscaled
//! scores, Gemma RMSNorm sandwiches, a GeGLU MLP, every projection optionally clamped), then
//! `k x k` average pooling, `√hidden`, standardization, and the embedder's weightless norm and
//! projection into the language model. `engine-cpu/src/vision_gemma4.rs` runs it.

use lmi_checkpoint::DType;
use lmi_checkpoint::config::vision::{Gemma4Vision, VisionConfig};
use lmi_checkpoint::weights::WeightSource;

use crate::error::{EngineError, Result};

/// A projection `[n, k]` (no bias), and its clamps (`Gemma4ClippableLinear`): input min,
/// input max, output min, output max.
pub struct ClipLinear {
    pub w: Vec<f32>,
    pub n: usize,
    pub k: usize,
    pub clip: Option<[f32; 4]>,
}

pub struct Layer {
    pub input_norm: Vec<f32>,
    pub post_attention_norm: Vec<f32>,
    pub pre_feedforward_norm: Vec<f32>,
    pub post_feedforward_norm: Vec<f32>,
    pub q: ClipLinear,
    pub k: ClipLinear,
    pub v: ClipLinear,
    pub o: ClipLinear,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub gate: ClipLinear,
    pub up: ClipLinear,
    pub down: ClipLinear,
}

pub struct Gemma4Tower {
    pub g: Gemma4Vision,
    /// `[hidden, 3 · patch²]`, over the patch's pixels with the channels innermost.
    pub input_proj: Vec<f32>,
    /// `[2, position_embedding_size, hidden]`: the x table, then the y table.
    pub positions: Vec<f32>,
    pub layers: Vec<Layer>,
    /// `standardize`: `(pooled - bias) · scale`.
    pub std: Option<(Vec<f32>, Vec<f32>)>,
    /// The embedder's projection `[lm hidden, hidden]`.
    pub embed_proj: Vec<f32>,
}

impl Gemma4Tower {
    /// `model.vision_tower.*` and `model.embed_vision.*`.
    pub fn load(cfg: &VisionConfig, st: &WeightSource) -> Result<Self> {
        let g = cfg.gemma4.clone().ok_or_else(|| {
            EngineError::Backend("a Gemma 4 vision tower without its settings".into())
        })?;
        let p = "model.vision_tower";
        let t = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            Ok(st.load(name, shape, DType::F32)?.to_f32_vec())
        };
        let scalar = |name: &str| -> Result<f32> {
            let v = t(name, &[])?;
            v.first()
                .copied()
                .ok_or_else(|| EngineError::Backend(format!("{name}: an empty scalar")))
        };
        let lin = |name: &str, n: usize, k: usize| -> Result<ClipLinear> {
            let clip = match g.clipped_linears {
                true => Some([
                    scalar(&format!("{name}.input_min"))?,
                    scalar(&format!("{name}.input_max"))?,
                    scalar(&format!("{name}.output_min"))?,
                    scalar(&format!("{name}.output_max"))?,
                ]),
                false => None,
            };
            Ok(ClipLinear {
                w: t(&format!("{name}.linear.weight"), &[n, k])?,
                n,
                k,
                clip,
            })
        };
        let (h, hd, inter) = (cfg.hidden_size, g.head_dim, cfg.intermediate_size);
        let (qw, kvw) = (cfg.num_heads * hd, g.num_kv_heads * hd);
        let layers = (0..cfg.depth)
            .map(|i| {
                let l = format!("{p}.encoder.layers.{i}");
                Ok(Layer {
                    input_norm: t(&format!("{l}.input_layernorm.weight"), &[h])?,
                    post_attention_norm: t(&format!("{l}.post_attention_layernorm.weight"), &[h])?,
                    pre_feedforward_norm: t(
                        &format!("{l}.pre_feedforward_layernorm.weight"),
                        &[h],
                    )?,
                    post_feedforward_norm: t(
                        &format!("{l}.post_feedforward_layernorm.weight"),
                        &[h],
                    )?,
                    q: lin(&format!("{l}.self_attn.q_proj"), qw, h)?,
                    k: lin(&format!("{l}.self_attn.k_proj"), kvw, h)?,
                    v: lin(&format!("{l}.self_attn.v_proj"), kvw, h)?,
                    o: lin(&format!("{l}.self_attn.o_proj"), h, qw)?,
                    q_norm: t(&format!("{l}.self_attn.q_norm.weight"), &[hd])?,
                    k_norm: t(&format!("{l}.self_attn.k_norm.weight"), &[hd])?,
                    gate: lin(&format!("{l}.mlp.gate_proj"), inter, h)?,
                    up: lin(&format!("{l}.mlp.up_proj"), inter, h)?,
                    down: lin(&format!("{l}.mlp.down_proj"), h, inter)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let std = match g.standardize {
            true => Some((
                t(&format!("{p}.std_bias"), &[h])?,
                t(&format!("{p}.std_scale"), &[h])?,
            )),
            false => None,
        };
        let patch_dim = cfg.in_chans * cfg.patch_size * cfg.patch_size;
        Ok(Gemma4Tower {
            input_proj: t(
                &format!("{p}.patch_embedder.input_proj.weight"),
                &[h, patch_dim],
            )?,
            positions: t(
                &format!("{p}.patch_embedder.position_embedding_table"),
                &[2, g.position_embedding_size, h],
            )?,
            layers,
            std,
            embed_proj: t(
                "model.embed_vision.embedding_projection.weight",
                &[cfg.out_hidden_size, h],
            )?,
            g,
        })
    }

    /// Multiply-adds of `patches` patches through the tower (benchmarks).
    pub fn macs(&self, cfg: &VisionConfig, patches: usize) -> u64 {
        let n = patches as u64;
        let h = cfg.hidden_size as u64;
        let per_layer: u64 = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|x| (x.n * x.k) as u64)
                    .sum::<u64>()
            })
            .sum();
        let attn = 2 * n * n * (cfg.num_heads * self.g.head_dim) as u64 * self.layers.len() as u64;
        let pooled = n / cfg.merge_unit().max(1) as u64;
        n * (self.input_proj.len() as u64)
            + n * per_layer
            + attn
            + pooled * h * cfg.out_hidden_size as u64
    }
}
