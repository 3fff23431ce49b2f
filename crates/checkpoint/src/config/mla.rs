//! Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash) as config.json declares
//! it: q through a low-rank projection (`q_lora_rank`, or a plain `q_proj` when null), keys and
//! values through one compressed latent of `kv_lora_rank` per token plus a rotary key part of
//! `qk_rope_head_dim` shared by every head. The cache holds only those two.

use serde_json::{Map, Value};

/// The MLA fields of a (flattened) config.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaConfig {
    /// The rank of q's down-projection; None: a plain `q_proj` (DeepSeek-V2-Lite, Moonlight).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// The rotary dimensions pair up as `(x0, x1), (x2, x3), ...` (`rope_interleave`, true as
    /// published) rather than rotate-half's `(x_i, x_{i + d/2})`.
    pub rope_interleave: bool,
    /// What the scores are multiplied by: `(qk_nope + qk_rope)^-1/2`, times YaRN's
    /// `mscale(factor, mscale_all_dim)²` where the config scales RoPE (transformers'
    /// `yarn_apply_mscale`).
    pub softmax_scale: f64,
    /// Multi-token-prediction layers after the model's own (`num_nextn_predict_layers`):
    /// their tensors are in the published files, and not read.
    pub nextn_layers: usize,
}

impl MlaConfig {
    /// Values cached per token and layer: the latent, then the rotated key part (576 for
    /// DeepSeek-V3).
    pub fn cache_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// One head's q (and expanded k): the part without position, then the rotary part.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Parses the MLA fields; `rope_scaling` is the config's (DeepSeek's `type: yarn`, with
    /// `factor` and `mscale_all_dim`).
    pub fn parse(top: &Map<String, Value>) -> std::result::Result<Self, String> {
        let int = |k: &str| top.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let req = |k: &str| match int(k) {
            Some(0) => Err(format!("field {k:?} must be > 0")),
            Some(v) => Ok(v),
            None => Err(format!(
                "field {k:?} is missing (a multi-head latent attention config)"
            )),
        };
        let q_lora_rank = match top.get("q_lora_rank") {
            None | Some(Value::Null) => None,
            Some(_) => Some(req("q_lora_rank")?),
        };
        let (nope, rope) = (req("qk_nope_head_dim")?, req("qk_rope_head_dim")?);
        let kv_lora_rank = req("kv_lora_rank")?;
        if !rope.is_multiple_of(2) || !(kv_lora_rank + rope).is_multiple_of(2) {
            return Err(format!(
                "qk_rope_head_dim ({rope}) and kv_lora_rank + qk_rope_head_dim ({}) must be even",
                kv_lora_rank + rope
            ));
        }
        if top.get("attention_bias").and_then(Value::as_bool) == Some(true) {
            return Err("attention_bias: true is not supported for latent attention".into());
        }
        let mut softmax_scale = 1.0 / ((nope + rope) as f64).sqrt();
        if let Some(Value::Object(rs)) = top.get("rope_scaling") {
            let kind = rs
                .get("rope_type")
                .or(rs.get("type"))
                .and_then(Value::as_str);
            let num = |k: &str| rs.get(k).and_then(Value::as_f64);
            if kind.is_some_and(|k| k != "default")
                && let (Some(factor), Some(all)) = (num("factor"), num("mscale_all_dim"))
                && all != 0.0
            {
                let m = if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * all * factor.ln() + 1.0
                };
                softmax_scale *= m * m;
            }
        }
        Ok(MlaConfig {
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope,
            v_head_dim: req("v_head_dim")?,
            rope_interleave: top
                .get("rope_interleave")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            softmax_scale,
            nextn_layers: int("num_nextn_predict_layers").unwrap_or(0),
        })
    }
}

/// Which layers of a DeepSeek-style model hold experts: GLM-4.7-Flash's `mlp_layer_types`
/// ("dense" / "sparse") where given, else DeepSeek's layers from `first_k_dense_replace` on
/// (every `moe_layer_freq`-th), none without `n_routed_experts`.
pub fn sparse_layers(
    top: &Map<String, Value>,
    num_layers: usize,
    default_dense: usize,
) -> std::result::Result<Vec<bool>, String> {
    if let Some(Value::Array(types)) = top.get("mlp_layer_types") {
        if types.len() != num_layers {
            return Err(format!(
                "mlp_layer_types has {} entries for {num_layers} layers",
                types.len()
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("dense") => Ok(false),
                Some("sparse") => Ok(true),
                other => Err(format!("mlp layer type {other:?} is not supported")),
            })
            .collect();
    }
    let int = |k: &str| top.get(k).and_then(Value::as_u64).map(|v| v as usize);
    if int("n_routed_experts").unwrap_or(0) == 0 {
        return Ok(vec![false; num_layers]);
    }
    let first = int("first_k_dense_replace").unwrap_or(default_dense);
    let freq = int("moe_layer_freq").unwrap_or(1).max(1);
    Ok((0..num_layers)
        .map(|i| i >= first && i % freq == 0)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(s: &str) -> Map<String, Value> {
        serde_json::from_str(s).unwrap()
    }

    /// DeepSeek-V3's published fields: 576 cached values, and the softmax scale of its YaRN
    /// (factor 40, mscale_all_dim 1): 192^-1/2 · (0.1 · ln 40 + 1)², as transformers'
    /// `yarn_apply_mscale` computes it.
    #[test]
    fn deepseek_v3_published_fields() {
        let c = MlaConfig::parse(&map(
            r#"{"q_lora_rank":1536,"kv_lora_rank":512,"qk_nope_head_dim":128,
            "qk_rope_head_dim":64,"v_head_dim":128,"num_nextn_predict_layers":1,
            "rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":40,"mscale":1.0,
            "mscale_all_dim":1.0,"original_max_position_embeddings":4096,"type":"yarn"}}"#,
        ))
        .unwrap();
        assert_eq!(c.cache_width(), 576);
        assert_eq!(c.q_lora_rank, Some(1536));
        assert!(c.rope_interleave);
        assert_eq!(c.nextn_layers, 1);
        // Python: (0.1 * math.log(40) + 1) ** 2 / math.sqrt(192).
        let want = 0.135_233_778_860_880_1;
        let m = 0.1 * 40f64.ln() + 1.0;
        assert!((c.softmax_scale - m * m / 192f64.sqrt()).abs() < 1e-15);
        assert!((c.softmax_scale - want).abs() < 1e-9, "{}", c.softmax_scale);
    }

    #[test]
    fn q_lora_null_and_layer_kinds() {
        let top = map(
            r#"{"q_lora_rank":null,"kv_lora_rank":512,"qk_nope_head_dim":128,
            "qk_rope_head_dim":64,"v_head_dim":128,"n_routed_experts":64,
            "first_k_dense_replace":1}"#,
        );
        let c = MlaConfig::parse(&top).unwrap();
        assert_eq!(c.q_lora_rank, None);
        assert!((c.softmax_scale - 1.0 / 192f64.sqrt()).abs() < 1e-15);
        assert_eq!(sparse_layers(&top, 3, 3).unwrap(), vec![false, true, true]);
        let glm = map(r#"{"mlp_layer_types":["dense","sparse"],"first_k_dense_replace":2}"#);
        assert_eq!(sparse_layers(&glm, 2, 1).unwrap(), vec![false, true]);
        assert!(sparse_layers(&glm, 3, 1).is_err());
    }
}
