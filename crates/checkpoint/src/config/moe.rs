//! A model's mixture-of-experts shape as its config declares it: how many experts, how a
//! token picks them, what each computes. The layers themselves are the engine's.

/// How router logits become each token's experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Softmax over every expert (in f32), the `top_k` largest probabilities, renormalized to
    /// sum to one when `renormalize` (Mixtral always; Qwen3-MoE when `norm_topk_prob`).
    SoftmaxTopK { renormalize: bool },
    /// The `top_k` largest logits, then a softmax over them (gpt-oss).
    TopKSoftmax,
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
    /// `shared_expert_intermediate_size`), if the model has one.
    pub shared_width: Option<usize>,
}

impl MoeConfig {
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.dense_layers.contains(&layer)
    }
}
