//! Gemma 4's text model as its config declares it (transformers' `Gemma4TextConfig`): local
//! and global layers with their own head widths, KV heads and RoPE, K = V on the global layers
//! (`attention_k_eq_v`), per-layer embeddings, K/V shared by the last layers, a mixture of
//! experts beside the dense MLP, and final logit soft-capping.

use serde_json::{Map, Value};

use super::moe::{ExpertActivation, MoeConfig, Routing};

/// What Gemma 4 adds to [`super::ModelConfig`] (whose `head_dim` and `num_kv_heads` are the
/// local layers', and `rope_theta` the global layers').
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Config {
    /// The global (`full_attention`) layers' head width (`global_head_dim`).
    pub global_head_dim: usize,
    /// The global layers' KV heads: `num_global_key_value_heads` where `attention_k_eq_v`,
    /// else `num_key_value_heads`.
    pub global_kv_heads: usize,
    /// The global layers' V is their K projection's output (before k_norm and RoPE).
    pub k_eq_v: bool,
    /// Per layer: the layer whose K/V it attends over (itself unless it is one of the last
    /// `num_kv_shared_layers`, which read the last earlier layer of their own type).
    pub kv_source: Vec<usize>,
    /// Per-layer embeddings' width per layer (`hidden_size_per_layer_input`; 0: none) and
    /// their table's rows (`vocab_size_per_layer_input`).
    pub ple_dim: usize,
    pub ple_vocab: usize,
    /// The layers that share K/V have MLPs twice `intermediate_size` wide.
    pub double_wide_mlp: bool,
    /// `logits = cap · tanh(logits / cap)`.
    pub final_logit_softcapping: Option<f64>,
    /// The global layers' RoPE turns the first `rope_angles` of each head's `global_head_dim
    /// / 2` pairs ("proportional": frequencies over the whole head, the rest unturned).
    pub rope_angles: usize,
}

/// transformers' `Gemma4TextConfig` defaults (5.25) for the fields a config may leave out.
pub(super) const DEFAULTS: [(&str, &str); 12] = [
    ("vocab_size", "262144"),
    ("hidden_size", "2304"),
    ("intermediate_size", "9216"),
    ("num_hidden_layers", "30"),
    ("num_attention_heads", "8"),
    ("num_key_value_heads", "4"),
    ("head_dim", "256"),
    ("sliding_window", "512"),
    ("max_position_embeddings", "131072"),
    ("rms_norm_eps", "1e-6"),
    ("tie_word_embeddings", "true"),
    ("hidden_activation", "\"gelu_pytorch_tanh\""),
];

fn usize_of(top: &Map<String, Value>, k: &str) -> Option<usize> {
    top.get(k).and_then(Value::as_u64).map(|v| v as usize)
}

/// `layer_types`, or transformers' default (every sixth layer global), the last layer always
/// global. True where a layer is local.
pub(super) fn local_layers(
    top: &Map<String, Value>,
    num_layers: usize,
) -> Result<Vec<bool>, String> {
    let mut local: Vec<bool> = match top.get("layer_types").and_then(Value::as_array) {
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
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    other => Err(format!("layer type {other:?} is not supported")),
                })
                .collect::<Result<_, _>>()?
        }
        None => (0..num_layers).map(|i| (i + 1) % 6 != 0).collect(),
    };
    if let Some(last) = local.last_mut() {
        *last = false;
    }
    Ok(local)
}

/// One layer type's `rope_parameters` entry: (theta, partial rotary factor).
fn rope_of(top: &Map<String, Value>, kind: &str) -> Result<(f64, f64), String> {
    let default = match kind {
        "full_attention" => (1_000_000.0, 0.25, "proportional"),
        _ => (10_000.0, 1.0, "default"),
    };
    let Some(p) = top
        .get("rope_parameters")
        .and_then(|r| r.get(kind))
        .filter(|p| !p.is_null())
    else {
        return Ok((default.0, default.1));
    };
    let ty = p
        .get("rope_type")
        .and_then(Value::as_str)
        .unwrap_or("default");
    if ty != "default" && ty != "proportional" {
        return Err(format!(
            "rope_parameters.{kind}.rope_type {ty:?} is not supported for Gemma 4 (supported: \
             default, proportional)"
        ));
    }
    if p.get("factor")
        .and_then(Value::as_f64)
        .is_some_and(|f| f != 1.0)
    {
        return Err(format!(
            "rope_parameters.{kind}.factor is not supported for Gemma 4"
        ));
    }
    let theta = p
        .get("rope_theta")
        .and_then(Value::as_f64)
        .unwrap_or(default.0);
    // "default" RoPE turns the whole head whatever the factor says (transformers).
    let partial = match ty {
        "proportional" => p
            .get("partial_rotary_factor")
            .and_then(Value::as_f64)
            .unwrap_or(1.0),
        _ => 1.0,
    };
    Ok((theta, partial))
}

/// What [`parse`] reads besides [`Gemma4Config`]: the local layers' RoPE base, the global
/// layers', and the experts.
pub(super) struct Parsed {
    pub config: Gemma4Config,
    pub local_theta: f64,
    pub global_theta: f64,
    pub moe: Option<MoeConfig>,
}

/// Gemma 4's own fields of `top` (the text config), for a model of `num_layers` layers whose
/// local ones `local` marks.
pub(super) fn parse(
    top: &Map<String, Value>,
    local: &[bool],
    num_kv_heads: usize,
) -> Result<Parsed, String> {
    let num_layers = local.len();
    // "vision" (the larger published models) makes only an image's own tokens see each other;
    // text is causal as without it. "all" (an encoder's attention) is not a generator's.
    match top.get("use_bidirectional_attention") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "vision" => {}
        Some(other) => {
            return Err(format!(
                "use_bidirectional_attention {other} is not supported for Gemma 4 (null or \"vision\" load)"
            ));
        }
    }
    if top.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        return Err("attention_bias: true is not supported for Gemma 4".into());
    }
    let k_eq_v = top
        .get("attention_k_eq_v")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // The published configs say `global_head_dim` / `num_global_key_value_heads`; transformers
    // 5.25 writes them into `per_layer_config` (layer -> overrides) instead.
    let per_layer = top.get("per_layer_config").and_then(Value::as_object);
    let global_override = |k: &str| -> Option<usize> {
        let first_global = local.iter().position(|&l| !l)?;
        per_layer?
            .get(&first_global.to_string())?
            .get(k)?
            .as_u64()
            .map(|v| v as usize)
    };
    let global_head_dim = usize_of(top, "global_head_dim")
        .or_else(|| global_override("head_dim"))
        .unwrap_or(512);
    let global_kv_heads = match k_eq_v {
        true => usize_of(top, "num_global_key_value_heads")
            .or_else(|| global_override("num_key_value_heads"))
            .unwrap_or(num_kv_heads),
        false => num_kv_heads,
    };
    let num_heads = usize_of(top, "num_attention_heads").unwrap_or(8);
    if global_kv_heads == 0
        || !num_heads.is_multiple_of(global_kv_heads)
        || !global_head_dim.is_multiple_of(2)
    {
        return Err(format!(
            "global layers of {global_kv_heads} KV heads of {global_head_dim}: the {num_heads} \
             heads must be a multiple of the KV heads, the width even"
        ));
    }
    let shared = usize_of(top, "num_kv_shared_layers").unwrap_or(0);
    if shared >= num_layers && shared > 0 {
        return Err(format!(
            "num_kv_shared_layers ({shared}) leaves no layer of the {num_layers} to keep K/V"
        ));
    }
    let first_shared = num_layers - shared;
    let kv_source = (0..num_layers)
        .map(|i| {
            if i < first_shared {
                return Ok(i);
            }
            (0..first_shared)
                .rev()
                .find(|&j| local[j] == local[i])
                .ok_or_else(|| {
                    format!("layer {i} shares K/V, but no earlier layer of its type keeps any")
                })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let ple_dim = usize_of(top, "hidden_size_per_layer_input").unwrap_or(0);
    let ple_vocab = usize_of(top, "vocab_size_per_layer_input").unwrap_or(262_144);
    let (local_theta, _) = rope_of(top, "sliding_attention")?;
    let (global_theta, partial) = rope_of(top, "full_attention")?;
    if !(0.0..=1.0).contains(&partial) {
        return Err(format!(
            "rope_parameters.full_attention.partial_rotary_factor ({partial}) must be in [0, 1]"
        ));
    }
    let rope_angles = (partial * global_head_dim as f64 / 2.0) as usize;
    let moe = match top.get("enable_moe_block").and_then(Value::as_bool) {
        Some(true) => {
            let req = |k: &str| usize_of(top, k).ok_or(format!("field {k:?} is missing"));
            let num_experts = req("num_experts")?;
            let top_k = req("top_k_experts")?;
            if top_k == 0 || top_k > num_experts {
                return Err(format!(
                    "top_k_experts ({top_k}) must be in 1..={num_experts}"
                ));
            }
            Some(MoeConfig {
                num_experts,
                top_k,
                expert_intermediate_size: req("moe_intermediate_size")?,
                routing: Routing::SoftmaxTopK { renormalize: true },
                activation: ExpertActivation::GeluTanh,
                biases: false,
                dense_layers: Vec::new(),
                shared_width: None,
            })
        }
        _ => None,
    };
    Ok(Parsed {
        config: Gemma4Config {
            global_head_dim,
            global_kv_heads,
            k_eq_v,
            kv_source,
            ple_dim,
            ple_vocab,
            double_wide_mlp: top
                .get("use_double_wide_mlp")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            final_logit_softcapping: top
                .get("final_logit_softcapping")
                .and_then(Value::as_f64)
                .filter(|&c| c > 0.0),
            rope_angles,
        },
        local_theta,
        global_theta,
        moe,
    })
}

impl Gemma4Config {
    /// Whether layer `i` reads another layer's K/V and keeps none.
    pub fn shares_kv(&self, i: usize) -> bool {
        self.kv_source[i] != i
    }

    /// The global layers' RoPE frequencies ("proportional"): `theta^(-2i / global_head_dim)`
    /// for the first `rope_angles` of the head's half, 0 (unturned) for the rest.
    pub fn global_inv_freq(&self, theta: f64) -> Vec<f64> {
        let d = self.global_head_dim as f64;
        (0..self.global_head_dim / 2)
            .map(|i| match i < self.rope_angles {
                true => 1.0 / theta.powf(2.0 * i as f64 / d),
                false => 0.0,
            })
            .collect()
    }
}
