//! Mixture-of-experts MLPs (Qwen3-MoE, Qwen2-MoE, Mixtral, gpt-oss): what a layer holds and how
//! a token picks its experts. The experts' products are the backend's ([`Backend::moe`](crate::backend::Backend::moe)).

pub use lmi_checkpoint::config::moe::{ExpertActivation, MoeConfig, Routing};

/// One expert: its gate and up projections fused (`[2 · width, hidden]`) and its down
/// projection (`[hidden, width]`), as in the dense MLP.
pub struct Expert<W> {
    pub gate_up: W,
    pub down: W,
    /// `[2 · width]` (gate then up) and `[hidden]`, where the model has them.
    pub gate_up_bias: Option<W>,
    pub down_bias: Option<W>,
}

/// An expert every row runs, its output scaled by `σ(x · gate)` and added to the routed
/// experts' sum (Qwen2-MoE's `shared_expert` and `shared_expert_gate`).
pub struct SharedExpert<W> {
    /// `[2 · width, hidden]` and `[hidden, width]`, as an [`Expert`]'s.
    pub gate_up: W,
    pub down: W,
    /// `[1, hidden]`, f32 like the router.
    pub gate: W,
    pub width: usize,
}

/// A layer's experts and router.
pub struct MoeLayer<W> {
    /// `[num_experts, hidden]`: a token's logit for each expert.
    pub router: W,
    pub router_bias: Option<W>,
    pub experts: Vec<Expert<W>>,
    pub top_k: usize,
    /// Each expert's MLP width.
    pub width: usize,
    pub routing: Routing,
    pub activation: ExpertActivation,
    pub shared: Option<SharedExpert<W>>,
}

/// `σ(g)` in f32, as torch's `sigmoid` computes it.
#[inline]
pub fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

/// Each row's experts and weights, `top_k` per row in descending weight, from router logits
/// `[rows, num_experts]`. Ties go to the lower expert index.
pub fn route(
    logits: &[f32],
    num_experts: usize,
    top_k: usize,
    routing: Routing,
) -> Vec<(u32, f32)> {
    let mut out = Vec::with_capacity(logits.len() / num_experts.max(1) * top_k);
    let mut probs = vec![0f32; num_experts];
    let mut order: Vec<u32> = Vec::with_capacity(num_experts);
    for row in logits.chunks_exact(num_experts) {
        match routing {
            Routing::SoftmaxTopK { renormalize } => {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for (p, &l) in probs.iter_mut().zip(row) {
                    *p = (l - max).exp();
                    sum += *p;
                }
                probs.iter_mut().for_each(|p| *p /= sum);
                order.clear();
                order.extend(0..num_experts as u32);
                // A stable sort keeps the lower index first among equal weights.
                order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]));
                let picked = &order[..top_k.min(num_experts)];
                let total: f32 = picked.iter().map(|&e| probs[e as usize]).sum();
                for &e in picked {
                    let p = probs[e as usize];
                    out.push((e, if renormalize { p / total } else { p }));
                }
            }
            Routing::TopKSoftmax => {
                order.clear();
                order.extend(0..num_experts as u32);
                order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
                let picked = &order[..top_k.min(num_experts)];
                let max = picked.first().map_or(0.0, |&e| row[e as usize]);
                // The exponentials go out first and are divided in place: no buffer per row.
                let first = out.len();
                out.extend(picked.iter().map(|&e| (e, (row[e as usize] - max).exp())));
                let sum: f32 = out[first..].iter().map(|&(_, x)| x).sum();
                out[first..].iter_mut().for_each(|(_, x)| *x /= sum);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_softmax_weighs_only_the_picked_logits() {
        let logits = [0.0, 2.0, 1.0, -1.0];
        let r = route(&logits, 4, 2, Routing::TopKSoftmax);
        assert_eq!((r[0].0, r[1].0), (1, 2));
        let (a, b) = (1.0f32, (-1.0f32).exp());
        assert!((r[0].1 - a / (a + b)).abs() < 1e-6 && (r[1].1 - b / (a + b)).abs() < 1e-6);
    }

    #[test]
    fn softmax_top_k_picks_the_largest_and_renormalizes() {
        let logits = [0.0, 2.0, 1.0, 2.0, -1.0, 0.5, 3.0, 0.0];
        let r = route(&logits, 4, 2, Routing::SoftmaxTopK { renormalize: true });
        // Row 0: experts 1 and 3 tie; the lower index comes first; equal halves.
        assert_eq!(r[0].0, 1);
        assert_eq!(r[1].0, 3);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        // Row 1: expert 2 (3.0) then expert 1 (0.5).
        assert_eq!((r[2].0, r[3].0), (2, 1));
        let (a, b) = (3.0f32.exp(), 0.5f32.exp());
        assert!((r[2].1 - a / (a + b)).abs() < 1e-6);
        let plain = route(&logits, 4, 2, Routing::SoftmaxTopK { renormalize: false });
        let z: f32 = [-1.0f32, 0.5, 3.0, 0.0].iter().map(|x| x.exp()).sum();
        assert!((plain[2].1 - a / z).abs() < 1e-6);
    }
}
