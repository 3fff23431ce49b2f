//! A model's mixture-of-experts shape as its config declares it: how many experts, how a
//! token picks them, what each computes. The layers themselves are the engine's.

/// How router logits become each token's experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Softmax over every expert (in f32), the `top_k` largest probabilities, renormalized to
    /// sum to one when `renormalize` (Mixtral always; Qwen3-MoE when `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// The `top_k` largest logits, then a softmax over them (gpt-oss).
    TopKSoftmax,
    /// DeepSeek-V3's (and GLM-4.5's, MiniMax-M2's): `s = σ(logit)` per expert. Experts are
    /// chosen by `s + b` (the layer's `e_score_correction_bias`, which only chooses): the
    /// experts are split into `n_group` equal groups, each group ranked by the sum of its two
    /// largest `s + b`, and the `top_k` largest `s + b` taken within the `topk_group` best
    /// groups. Their weights are the unbiased `s`, divided by their sum when `renormalize`,
    /// then times `scaling` (`routed_scaling_factor`). Shared experts beside these are
    /// ungated (`n_shared_experts` of them, one MLP [`MoeConfig::shared_width`] wide).
    SigmoidGroupedTopK {
        n_group: usize,
        topk_group: usize,
        renormalize: bool,
        scaling: f32,
    },
}

/// What an expert computes between its gate/up and down projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) · up`.
    Silu,
    /// gpt-oss: `gate' · σ(alpha · gate') · (up' + 1)`, with `gate' = min(gate, limit)` and
    /// `up' = clamp(up, -limit, limit)`.
    ClampedSwiGlu { alpha: f32, limit: f32 },
    /// `gelu_tanh(gate) · up` (Gemma 4's experts).
    GeluTanh,
}

/// A model's mixture-of-experts shape, from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Each expert's MLP width.
    pub expert_intermediate_size: usize,
    pub routing: Routing,
    pub activation: ExpertActivation,
    /// Router and experts carry biases (gpt-oss).
    pub biases: bool,
    /// Layers whose MLP is dense (`intermediate_size` wide) rather than experts: Qwen3-MoE's
    /// `mlp_only_layers` and the layers `decoder_sparse_step` skips.
    pub dense_layers: Vec<usize>,
    /// The width of a shared expert every token runs beside its routed ones (Qwen2-MoE's
    /// `shared_expert_intermediate_size`; DeepSeek's `n_shared_experts ·
    /// moe_intermediate_size`), if the model has one.
    pub shared_width: Option<usize>,
}

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.dense_layers.contains(&layer)
    }

    /// The shared expert's output is scaled by `σ(x · shared_expert_gate)` (Qwen2-MoE's);
    /// DeepSeek-style mixtures ([`Routing::SigmoidGroupedTopK`]) add theirs ungated.
    pub fn shared_gated(&self) -> bool {
        !matches!(self.routing, Routing::SigmoidGroupedTopK { .. })
    }

    /// The router carries a per-expert `e_score_correction_bias` that only chooses experts.
    pub fn correction_bias(&self) -> bool {
        matches!(self.routing, Routing::SigmoidGroupedTopK { .. })
    }
}

type Json = serde_json::Map<String, serde_json::Value>;

fn field<T: serde::de::DeserializeOwned>(top: &Json, name: &str) -> Result<Option<T>, String> {
    match top.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| format!("field {name:?}: {e}")),
    }
}

fn required<T: serde::de::DeserializeOwned>(top: &Json, name: &str) -> Result<T, String> {
    field(top, name)?.ok_or_else(|| format!("field {name:?} is missing"))
}

/// DeepSeek-V3's mixture as its config (and GLM-4.5's, Kimi K2's, GLM-4.7-Flash's) gives it:
/// `n_routed_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `n_shared_experts`,
/// `n_group` / `topk_group`, `norm_topk_prob`, `routed_scaling_factor`, and the first
/// `first_k_dense_replace` layers dense (then every `moe_layer_freq`-th sparse, DeepSeek's
/// field, 1 when absent). Defaults are transformers' `Glm4MoeConfig`'s / `DeepseekV3Config`'s
/// where they agree; `scoring_func` other than `sigmoid` and `topk_method` other than
/// `noaux_tc` (DeepSeek-V2's softmax routings) are refused.
pub fn parse_deepseek(top: &Json, num_layers: usize) -> Result<MoeConfig, String> {
    if let Some(f) = field::<String>(top, "scoring_func")?
        && f != "sigmoid"
    {
        return Err(format!(
            "scoring_func {f:?} is not supported (DeepSeek-style mixtures route by sigmoid)"
        ));
    }
    if let Some(m) = field::<String>(top, "topk_method")?
        && m != "noaux_tc"
    {
        return Err(format!(
            "topk_method {m:?} is not supported (only DeepSeek-V3's noaux_tc)"
        ));
    }
    let num_experts: usize = required(top, "n_routed_experts")?;
    let top_k: usize = required(top, "num_experts_per_tok")?;
    let width: usize = required(top, "moe_intermediate_size")?;
    let n_shared: usize = field(top, "n_shared_experts")?.unwrap_or(1);
    let n_group: usize = field(top, "n_group")?.unwrap_or(1);
    let topk_group: usize = field(top, "topk_group")?.unwrap_or(1);
    let first_dense: usize = field(top, "first_k_dense_replace")?.unwrap_or(1);
    let freq: usize = field::<usize>(top, "moe_layer_freq")?.unwrap_or(1).max(1);
    let routing = Routing::SigmoidGroupedTopK {
        n_group,
        topk_group,
        renormalize: field(top, "norm_topk_prob")?.unwrap_or(true),
        scaling: field::<f64>(top, "routed_scaling_factor")?.unwrap_or(1.0) as f32,
    };
    check_groups(num_experts, top_k, routing)?;
    Ok(MoeConfig {
        num_experts,
        top_k,
        expert_intermediate_size: width,
        routing,
        activation: ExpertActivation::Silu,
        biases: false,
        dense_layers: (0..num_layers)
            .filter(|&i| i < first_dense || i % freq != 0)
            .collect(),
        shared_width: (n_shared > 0).then_some(n_shared * width),
    })
}

/// MiniMax-M2's mixture: `num_local_experts` experts `intermediate_size` wide in every layer,
/// chosen by sigmoid plus the correction bias with no groups, always renormalized, no scaling
/// and no shared expert (transformers' `MiniMaxM2TopKRouter`).
pub fn parse_minimax_m2(top: &Json) -> Result<MoeConfig, String> {
    if let Some(f) = field::<String>(top, "scoring_func")?
        && f != "sigmoid"
    {
        return Err(format!(
            "scoring_func {f:?} is not supported (MiniMax-M2 routes by sigmoid)"
        ));
    }
    if field::<usize>(top, "shared_intermediate_size")?.is_some_and(|w| w > 0) {
        return Err(
            "shared_intermediate_size > 0 is not supported (MiniMax-M2 has no shared \
                    expert)"
                .into(),
        );
    }
    let num_experts: usize = required(top, "num_local_experts")?;
    let top_k: usize = required(top, "num_experts_per_tok")?;
    let routing = Routing::SigmoidGroupedTopK {
        n_group: 1,
        topk_group: 1,
        renormalize: true,
        scaling: 1.0,
    };
    check_groups(num_experts, top_k, routing)?;
    Ok(MoeConfig {
        num_experts,
        top_k,
        expert_intermediate_size: required(top, "intermediate_size")?,
        routing,
        activation: ExpertActivation::Silu,
        biases: false,
        dense_layers: Vec::new(),
        shared_width: None,
    })
}

/// The groups divide the experts, `topk_group` of them hold at least `top_k` experts, and
/// each group has the two experts its rank sums.
fn check_groups(num_experts: usize, top_k: usize, routing: Routing) -> Result<(), String> {
    let Routing::SigmoidGroupedTopK {
        n_group,
        topk_group,
        ..
    } = routing
    else {
        return Ok(());
    };
    if n_group == 0 || !num_experts.is_multiple_of(n_group) {
        return Err(format!(
            "n_group ({n_group}) must divide n_routed_experts ({num_experts})"
        ));
    }
    let per_group = num_experts / n_group;
    if topk_group == 0 || topk_group > n_group || topk_group * per_group < top_k {
        return Err(format!(
            "topk_group ({topk_group}) of {n_group} groups of {per_group} experts cannot hold \
             num_experts_per_tok ({top_k})"
        ));
    }
    if n_group > 1 && per_group < 2 {
        return Err(format!(
            "groups of {per_group} expert: a group is ranked by its two best"
        ));
    }
    Ok(())
}
