//! Gemma 4 GGUF files as llama.cpp's converter writes them (`gemma4`): the metadata back into
//! config.json's Gemma 4 fields, and the tensor names back into transformers' (no tensor is
//! rearranged: the converter stores Gemma 4's norms as they are, and its stacked experts in
//! transformers' layout).

use serde_json::{Value, json};

use super::hparams::{GgufArch, Hparams};
use super::reader::GgufFile;
use super::tensor_names::Mapped;
use crate::error::{CheckpointError, Result};

fn err(msg: String) -> CheckpointError {
    CheckpointError::Gguf(msg)
}

/// A key that is one number or one per layer (`head_count_kv`, `feed_forward_length`).
fn per_layer(g: &GgufFile, key: &str, layers: usize) -> Result<Option<Vec<u64>>> {
    if let Some(a) = g.get(key).and_then(|v| v.as_array()) {
        let v: Vec<u64> = a.iter().filter_map(|x| x.as_u64()).collect();
        if v.len() != layers {
            return Err(err(format!(
                "{key} has {} entries for {layers} layers",
                v.len()
            )));
        }
        return Ok(Some(v));
    }
    Ok(g.get_u64(key)?.map(|x| vec![x; layers]))
}

/// The global layers' RoPE: how many of the head's pairs turn, from `rope_freqs.weight` (the
/// converter's 1 for a turned pair, 1e30 for an unturned one).
fn rope_angles(g: &GgufFile) -> Result<Option<usize>> {
    let Some(info) = g.tensor("rope_freqs.weight") else {
        return Ok(None);
    };
    if info.ggml_type != super::GgmlType::F32 {
        return Err(err("rope_freqs.weight is not f32".into()));
    }
    let bytes = g.tensor_data(info)?;
    let turned = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .filter(|&f| f < 1e10)
        .count();
    Ok(Some(turned))
}

/// The file's hyperparameters, with config.json's Gemma 4 text config in `gemma4_config`.
pub(super) fn read(g: &GgufFile, base: Hparams) -> Result<Hparams> {
    let key = |k: &str| format!("gemma4.{k}");
    let n = base.num_layers as usize;
    let pattern: Vec<bool> = match g.get_array(&key("attention.sliding_window_pattern"))? {
        Some(a) => a.iter().filter_map(|x| x.as_bool()).collect(),
        None => (0..n).map(|i| (i + 1) % 6 != 0).collect(),
    };
    if pattern.len() != n {
        return Err(err(format!(
            "attention.sliding_window_pattern has {} flags for {n} layers",
            pattern.len()
        )));
    }
    let kv = per_layer(g, &key("attention.head_count_kv"), n)?
        .unwrap_or_else(|| vec![base.num_heads; n]);
    let ff = per_layer(g, &key("feed_forward_length"), n)?
        .ok_or_else(|| err(format!("{} is missing", key("feed_forward_length"))))?;
    let local_of = |want: bool| (0..n).find(|&i| pattern[i] == want);
    let (first_local, first_global) = (local_of(true), local_of(false));
    let head_dim = g
        .get_u64(&key("attention.key_length_swa"))?
        .unwrap_or(base.head_dim);
    let global_head_dim = base.head_dim;
    let local_kv = first_local.map_or(base.num_kv_heads, |i| kv[i]);
    let global_kv = first_global.map_or(local_kv, |i| kv[i]);
    // K = V where the global layers have no V projection.
    let k_eq_v =
        first_global.is_some_and(|i| g.tensor(&format!("blk.{i}.attn_v.weight")).is_none());
    let shared = g.get_u64(&key("attention.shared_kv_layers"))?.unwrap_or(0) as usize;
    let intermediate = ff[0];
    let double_wide = shared > 0 && ff[n - 1] == 2 * intermediate && ff[n - 1] != ff[0];
    let ple_dim = g
        .get_u64(&key("embedding_length_per_layer_input"))?
        .unwrap_or(0);
    let ple_vocab = g
        .tensor("per_layer_token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .unwrap_or(base.vocab_size);
    let angles = rope_angles(g)?.unwrap_or(global_head_dim as usize / 8);
    let partial = 2.0 * angles as f64 / global_head_dim as f64;
    let types: Vec<&str> = pattern
        .iter()
        .map(|&l| match l {
            true => "sliding_attention",
            false => "full_attention",
        })
        .collect();
    let mut c = json!({
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": base.vocab_size,
        "hidden_size": base.hidden_size,
        "intermediate_size": intermediate,
        "num_hidden_layers": n,
        "num_attention_heads": base.num_heads,
        "num_key_value_heads": local_kv,
        "head_dim": head_dim,
        "global_head_dim": global_head_dim,
        "num_global_key_value_heads": if k_eq_v { json!(global_kv) } else { Value::Null },
        "attention_k_eq_v": k_eq_v,
        "layer_types": types,
        "sliding_window": g.get_u64(&key("attention.sliding_window"))?.unwrap_or(512),
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": g.get_f64(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0),
            },
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": partial,
                "rope_theta": base.rope_theta,
            },
        },
        "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": ple_dim,
        "vocab_size_per_layer_input": ple_vocab,
        "use_double_wide_mlp": double_wide,
        "final_logit_softcapping": g.get_f64(&key("final_logit_softcapping"))?,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": base.rms_norm_eps,
        "max_position_embeddings": base.context_length,
        "tie_word_embeddings": base.tie_word_embeddings,
        "bos_token_id": base.bos_token_id,
        "eos_token_id": base.eos_token_ids.first(),
        "enable_moe_block": false,
    });
    if let Some(count) = g.get_u64(&key("expert_count"))?.filter(|&e| e > 0) {
        c["enable_moe_block"] = json!(true);
        c["num_experts"] = json!(count);
        c["top_k_experts"] = json!(g.require_u64(&key("expert_used_count"))?);
        c["moe_intermediate_size"] = json!(g.require_u64(&key("expert_feed_forward_length"))?);
    }
    Ok(Hparams {
        arch: GgufArch::Gemma4,
        intermediate_size: intermediate,
        num_kv_heads: local_kv,
        head_dim,
        experts: None,
        gemma4_config: Some(c),
        ..base
    })
}

/// transformers' name of a `gemma4` tensor (under `model.`); None for a name we do not know.
pub(crate) fn map(gguf: &str) -> Option<Mapped> {
    let hf = |name: String| Some(Mapped::Hf { name, qk: None });
    let top = match gguf {
        "token_embd.weight" => Some("embed_tokens.weight"),
        "output_norm.weight" => Some("norm.weight"),
        "per_layer_token_embd.weight" => Some("embed_tokens_per_layer.weight"),
        "per_layer_model_proj.weight" => Some("per_layer_model_projection.weight"),
        "per_layer_proj_norm.weight" => Some("per_layer_projection_norm.weight"),
        "output.weight" => return hf("lm_head.weight".into()),
        "rope_freqs.weight" => return Some(Mapped::Skip),
        _ => None,
    };
    if let Some(t) = top {
        return hf(format!("model.{t}"));
    }
    let (layer, part) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let name = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "post_ffw_norm_1.weight" => "post_feedforward_layernorm_1.weight",
        "post_ffw_norm_2.weight" => "post_feedforward_layernorm_2.weight",
        "pre_ffw_norm_2.weight" => "pre_feedforward_layernorm_2.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        "inp_gate.weight" => "per_layer_input_gate.weight",
        "proj.weight" => "per_layer_projection.weight",
        "post_norm.weight" => "post_per_layer_input_norm.weight",
        "layer_output_scale.weight" => "layer_scalar",
        "ffn_gate_inp.weight" => "router.proj.weight",
        "ffn_gate_inp.scale" => "router.scale",
        "ffn_down_exps.scale" => "router.per_expert_scale",
        "ffn_gate_up_exps.weight" => "experts.gate_up_proj",
        "ffn_down_exps.weight" => "experts.down_proj",
        _ => return None,
    };
    hf(format!("model.layers.{layer}.{name}"))
}
