//! llama.cpp's `deepseek2` files (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash): multi-head latent
//! attention and DeepSeek-style experts, as its converter writes them. The converter stores
//! the attention as MQA over the latent (`head_count_kv` 1, `key_length` kv_lora + rope), the
//! per-head sizes as `key_length_mla` / `value_length_mla`, and kv_b_proj split per head into
//! `attn_k_b` (the key rows transposed, `[heads, kv_lora, nope]`) and `attn_v_b`
//! (`[heads, v, kv_lora]`): read here under HF-style names `k_b_proj` / `v_b_proj`, which the
//! model takes as they are. The rotary rows stay in HF's interleaved order (llama.cpp turns
//! adjacent pairs), so the config says `rope_interleave`.

use serde_json::{Value, json};

use super::hparams::{Hparams, as_written};
use super::reader::GgufFile;
use super::tensor_names::Mapped;
use crate::error::{CheckpointError, Result};

/// The `deepseek2.*` keys beyond a Llama file's.
#[derive(Debug, Clone)]
pub struct MlaHparams {
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
    /// `leading_dense_block_count`: layers before the first mixture of experts.
    pub leading_dense: u64,
    pub shared_experts: u64,
    pub routed_scaling: Option<f64>,
    pub norm_topk_prob: bool,
    pub n_group: u64,
    pub topk_group: u64,
    /// `expert_gating_func`: 1 softmax, 2 sigmoid; absent in files of models without
    /// `scoring_func` in their config (GLM-4.7-Flash).
    pub gating: Option<u64>,
    /// YaRN's `mscale_all_dim`, which the converter stores as `yarn_log_multiplier` / 10.
    pub mscale_all_dim: Option<f64>,
    /// The file holds routers' correction biases (`exp_probs_b`).
    pub correction_bias: bool,
}

pub fn read(g: &GgufFile, arch: &str) -> Result<MlaHparams> {
    let key = |k: &str| format!("{arch}.{k}");
    let rope = g.require_u64(&key("rope.dimension_count"))?;
    let qk = g.require_u64(&key("attention.key_length_mla"))?;
    let qk_nope_head_dim = qk.checked_sub(rope).ok_or_else(|| {
        CheckpointError::Gguf(format!(
            "{} ({qk}) is less than {} ({rope})",
            key("attention.key_length_mla"),
            key("rope.dimension_count")
        ))
    })?;
    Ok(MlaHparams {
        q_lora_rank: g.get_u64(&key("attention.q_lora_rank"))?,
        kv_lora_rank: g.require_u64(&key("attention.kv_lora_rank"))?,
        qk_nope_head_dim,
        qk_rope_head_dim: rope,
        v_head_dim: g.require_u64(&key("attention.value_length_mla"))?,
        leading_dense: g.get_u64(&key("leading_dense_block_count"))?.unwrap_or(0),
        shared_experts: g.get_u64(&key("expert_shared_count"))?.unwrap_or(0),
        routed_scaling: g.get_f64(&key("expert_weights_scale"))?.map(as_written),
        norm_topk_prob: g.get_bool(&key("expert_weights_norm"))?.unwrap_or(false),
        n_group: g.get_u64(&key("expert_group_count"))?.unwrap_or(1),
        topk_group: g.get_u64(&key("expert_group_used_count"))?.unwrap_or(1),
        gating: g.get_u64(&key("expert_gating_func"))?,
        mscale_all_dim: g
            .get_f64(&key("rope.scaling.yarn_log_multiplier"))?
            .map(|m| as_written(m) / 0.1),
        correction_bias: g
            .tensors
            .iter()
            .any(|t| t.name.ends_with(".exp_probs_b.bias")),
    })
}

/// The MLA and expert fields of config.json, in DeepSeek-V3's names.
pub fn config_json(h: &Hparams, m: &MlaHparams, c: &mut Value) {
    c["architectures"] = json!(["DeepseekV3ForCausalLM"]);
    c["model_type"] = json!("deepseek_v3");
    c["num_key_value_heads"] = json!(h.num_heads);
    c["head_dim"] = json!(m.qk_rope_head_dim);
    c["q_lora_rank"] = json!(m.q_lora_rank);
    c["kv_lora_rank"] = json!(m.kv_lora_rank);
    c["qk_nope_head_dim"] = json!(m.qk_nope_head_dim);
    c["qk_rope_head_dim"] = json!(m.qk_rope_head_dim);
    c["v_head_dim"] = json!(m.v_head_dim);
    c["rope_interleave"] = json!(true);
    c["attention_bias"] = json!(false);
    if let (Some(all), Some(rs)) = (m.mscale_all_dim, c["rope_scaling"].as_object_mut()) {
        // llama.cpp scales the softmax by mscale(mscale_all_dim)² and leaves cos and sin
        // alone: DeepSeek's mscale = mscale_all_dim.
        rs.insert("mscale".into(), json!(all));
        rs.insert("mscale_all_dim".into(), json!(all));
    }
    let Some(e) = &h.experts else {
        return;
    };
    // A correction bias exists only beside sigmoid routing (DeepSeek-V3's noaux_tc): a file
    // without the gating key (GLM-4.7-Flash's) that has one routes by sigmoid.
    let scoring = match m.gating {
        Some(2) => "sigmoid",
        None if m.correction_bias => "sigmoid",
        _ => "softmax",
    };
    c["n_routed_experts"] = json!(e.count);
    c["num_experts_per_tok"] = json!(e.used);
    c["moe_intermediate_size"] = json!(e.feed_forward_length);
    c["n_shared_experts"] = json!(m.shared_experts);
    c["routed_scaling_factor"] = json!(m.routed_scaling.unwrap_or(1.0));
    c["norm_topk_prob"] = json!(m.norm_topk_prob);
    c["n_group"] = json!(m.n_group);
    c["topk_group"] = json!(m.topk_group);
    c["first_k_dense_replace"] = json!(m.leading_dense);
    c["scoring_func"] = json!(scoring);
    c["topk_method"] = json!("noaux_tc");
}

/// The deepseek2 tensors beyond a Llama file's, by their HF names (None: a Llama name).
pub fn map(gguf: &str) -> Option<Mapped> {
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let hf = match (part, suffix) {
        ("attn_q_a", "weight") => "self_attn.q_a_proj.weight",
        ("attn_q_a_norm", "weight") => "self_attn.q_a_layernorm.weight",
        ("attn_q_b", "weight") => "self_attn.q_b_proj.weight",
        // Not Llama's: no rows permuted.
        ("attn_q", "weight") => "self_attn.q_proj.weight",
        ("attn_kv_a_mqa", "weight") => "self_attn.kv_a_proj_with_mqa.weight",
        ("attn_kv_a_norm", "weight") => "self_attn.kv_a_layernorm.weight",
        ("attn_kv_b", "weight") => "self_attn.kv_b_proj.weight",
        ("attn_k_b", "weight") => "self_attn.k_b_proj.weight",
        ("attn_v_b", "weight") => "self_attn.v_b_proj.weight",
        ("exp_probs_b", "bias") => "mlp.gate.e_score_correction_bias",
        ("ffn_gate_shexp", "weight") => "mlp.shared_experts.gate_proj.weight",
        ("ffn_up_shexp", "weight") => "mlp.shared_experts.up_proj.weight",
        ("ffn_down_shexp", "weight") => "mlp.shared_experts.down_proj.weight",
        _ => return None,
    };
    Some(Mapped::Hf {
        name: format!("model.layers.{layer}.{hf}"),
        qk: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_the_latent_attention_and_deepseek_expert_names() {
        let name = |g: &str| match map(g) {
            Some(Mapped::Hf { name, qk: None }) => name,
            other => panic!("{g}: {other:?}"),
        };
        assert_eq!(
            name("blk.2.attn_k_b.weight"),
            "model.layers.2.self_attn.k_b_proj.weight"
        );
        assert_eq!(
            name("blk.0.attn_kv_a_mqa.weight"),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
        );
        assert_eq!(
            name("blk.1.exp_probs_b.bias"),
            "model.layers.1.mlp.gate.e_score_correction_bias"
        );
        assert_eq!(
            name("blk.1.ffn_up_shexp.weight"),
            "model.layers.1.mlp.shared_experts.up_proj.weight"
        );
        assert!(map("blk.1.attn_norm.weight").is_none());
    }
}
