//! GLM-4.5 (`glm4moe`) and MiniMax-M2 (`minimax-m2`) as llama.cpp's converter writes them:
//! the DeepSeek-style routing in `<arch>.expert_*` metadata, back into config.json's fields,
//! and the few tensor names that differ from the other mixtures'.
//!
//! - `expert_gating_func` must be sigmoid (2); `expert_group_count` / `expert_group_used_count`
//!   are `n_group` / `topk_group`, `expert_weights_scale` `routed_scaling_factor`,
//!   `expert_weights_norm` `norm_topk_prob` (llama.cpp reads false when absent; MiniMax-M2's
//!   graph always renormalizes), `expert_shared_count` `n_shared_experts`,
//!   `leading_dense_block_count` `first_k_dense_replace`, `rope.dimension_count` the rotated
//!   dimensions.
//! - `blk.N.exp_probs_b.bias` is the router's `e_score_correction_bias`; GLM's
//!   `ffn_*_shexp` are `mlp.shared_experts.*` (ungated) and its `post_attention_norm` the norm
//!   before the MLP. q/k/v biases and q/k norms are read where the file holds them.
//! - GLM's first multi-token-prediction layer (`blk.{num_layers}.*` and its `nextn.*`
//!   tensors, past `block_count - nextn_predict_layers`) maps to HF's
//!   `model.layers.{num_layers}.*` (`eh_proj`, `enorm`, `hnorm`, `embed_tokens`,
//!   `shared_head.{head,norm}`, a decoder layer), which the model does not read and the
//!   engine's draft head does; later MTP layers and MiniMax-M2's are skipped.

use serde_json::{Value, json};

use super::hparams::{GgufArch, Hparams};
use super::reader::GgufFile;
use super::tensor_names::Mapped;
use crate::error::{CheckpointError, Result};

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`.
const GATING_SIGMOID: u64 = 2;

/// The routing of a `glm4moe` or `minimax-m2` file, in config.json's terms.
#[derive(Debug, Clone)]
pub struct SigmoidRouting {
    pub n_group: u64,
    pub topk_group: u64,
    pub routed_scaling_factor: f64,
    pub norm_topk_prob: bool,
    pub n_shared_experts: u64,
    pub first_k_dense_replace: u64,
}

/// The architectures this module reads.
pub fn is_sigmoid_moe(arch: GgufArch) -> bool {
    matches!(arch, GgufArch::Glm4Moe | GgufArch::MiniMaxM2)
}

pub fn read(g: &GgufFile, arch: GgufArch, name: &str) -> Result<Option<SigmoidRouting>> {
    if !is_sigmoid_moe(arch) {
        return Ok(None);
    }
    let key = |k: &str| format!("{name}.{k}");
    match g.get_u64(&key("expert_gating_func"))? {
        None | Some(GATING_SIGMOID) => {}
        Some(other) => {
            return Err(CheckpointError::Gguf(format!(
                "{} = {other}: only sigmoid gating (2) is supported for {name}",
                key("expert_gating_func")
            )));
        }
    }
    if arch == GgufArch::MiniMaxM2 {
        return Ok(Some(SigmoidRouting {
            n_group: 1,
            topk_group: 1,
            routed_scaling_factor: 1.0,
            norm_topk_prob: true,
            n_shared_experts: 0,
            first_k_dense_replace: 0,
        }));
    }
    Ok(Some(SigmoidRouting {
        n_group: g.get_u64(&key("expert_group_count"))?.unwrap_or(1).max(1),
        topk_group: g
            .get_u64(&key("expert_group_used_count"))?
            .unwrap_or(1)
            .max(1),
        routed_scaling_factor: g
            .get_f64(&key("expert_weights_scale"))?
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0),
        norm_topk_prob: g.get_bool(&key("expert_weights_norm"))?.unwrap_or(false),
        n_shared_experts: g.get_u64(&key("expert_shared_count"))?.unwrap_or(0),
        first_k_dense_replace: g.get_u64(&key("leading_dense_block_count"))?.unwrap_or(0),
    }))
}

/// config.json's mixture and RoPE fields for `h` (whose `experts` it has).
pub fn config_json(h: &Hparams, r: &SigmoidRouting, c: &mut Value) {
    let Some(e) = &h.experts else {
        return;
    };
    let rotary = h.rotary_dim.unwrap_or(h.head_dim);
    c["num_experts_per_tok"] = json!(e.used);
    c["scoring_func"] = json!("sigmoid");
    match h.arch {
        GgufArch::MiniMaxM2 => {
            c["num_local_experts"] = json!(e.count);
            c["intermediate_size"] = json!(e.feed_forward_length);
            c["rotary_dim"] = json!(rotary);
        }
        _ => {
            c["n_routed_experts"] = json!(e.count);
            c["moe_intermediate_size"] = json!(e.feed_forward_length);
            c["n_shared_experts"] = json!(r.n_shared_experts);
            c["n_group"] = json!(r.n_group);
            c["topk_group"] = json!(r.topk_group);
            c["routed_scaling_factor"] = json!(r.routed_scaling_factor);
            c["norm_topk_prob"] = json!(r.norm_topk_prob);
            c["first_k_dense_replace"] = json!(r.first_k_dense_replace);
            c["partial_rotary_factor"] = json!(rotary as f64 / h.head_dim as f64);
            // The file's MTP layers, if any, are not read.
            c["num_nextn_predict_layers"] = json!(0);
        }
    }
}

/// The names of a `glm4moe` / `minimax-m2` file that differ from the other mixtures'; None
/// for the rest (then [`super::tensor_names::map`]).
pub fn map(gguf: &str, h: &Hparams) -> Option<Mapped> {
    if !is_sigmoid_moe(h.arch) {
        return None;
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let glm = h.arch == GgufArch::Glm4Moe;
    // GLM's first MTP layer is read (as the engine's draft head reads HF's
    // `model.layers.{num_hidden_layers}.*`); later ones, and MiniMax-M2's, are not.
    if layer > h.num_layers || (layer == h.num_layers && !glm) {
        return Some(Mapped::Skip);
    }
    let hf = |n: &str| {
        Some(Mapped::Hf {
            name: format!("model.layers.{layer}.{n}"),
            qk: None,
        })
    };
    match part {
        "nextn.eh_proj.weight" => hf("eh_proj.weight"),
        "nextn.embed_tokens.weight" => hf("embed_tokens.weight"),
        "nextn.enorm.weight" => hf("enorm.weight"),
        "nextn.hnorm.weight" => hf("hnorm.weight"),
        "nextn.shared_head_head.weight" => hf("shared_head.head.weight"),
        "nextn.shared_head_norm.weight" => hf("shared_head.norm.weight"),
        _ if part.starts_with("nextn.") => Some(Mapped::Skip),
        "exp_probs_b.bias" => hf("mlp.gate.e_score_correction_bias"),
        "ffn_gate_shexp.weight" if glm => hf("mlp.shared_experts.gate_proj.weight"),
        "ffn_up_shexp.weight" if glm => hf("mlp.shared_experts.up_proj.weight"),
        "ffn_down_shexp.weight" if glm => hf("mlp.shared_experts.down_proj.weight"),
        "post_attention_norm.weight" if glm => hf("post_attention_layernorm.weight"),
        _ => None,
    }
}
