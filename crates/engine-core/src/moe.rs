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
    /// `[1, hidden]`, f32 like the router; None where the shared expert is ungated
    /// (DeepSeek-style `shared_experts`: its output is added as it is).
    pub gate: Option<W>,
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
    /// `[num_experts]` f32: [`Routing::SigmoidGroupedTopK`]'s `e_score_correction_bias`,
    /// added to the scores that choose experts (not to their weights).
    pub correction_bias: Option<W>,
}

/// `σ(g)` in f32, as torch's `sigmoid` computes it.
#[inline]
pub fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

/// Each row's experts and weights, `top_k` per row in descending weight (for
/// [`Routing::SigmoidGroupedTopK`], descending choice score `σ + bias`), from router logits
/// `[rows, num_experts]`; `correction` is that routing's `e_score_correction_bias` (zeros when
/// None). Ties go to the lower expert index.
pub fn route(
    logits: &[f32],
    num_experts: usize,
    top_k: usize,
    routing: Routing,
    correction: Option<&[f32]>,
) -> Vec<(u32, f32)> {
    let mut out = Vec::with_capacity(logits.len() / num_experts.max(1) * top_k);
    let mut probs = vec![0f32; num_experts];
    let mut choice = vec![0f32; num_experts];
    let mut order: Vec<u32> = Vec::with_capacity(num_experts);
    for row in logits.chunks_exact(num_experts) {
        match routing {
            Routing::SigmoidGroupedTopK {
                n_group,
                topk_group,
                renormalize,
                scaling,
            } => {
                for (e, (p, &l)) in probs.iter_mut().zip(row).enumerate() {
                    *p = sigmoid(l);
                    choice[e] = *p + correction.map_or(0.0, |b| b[e]);
                }
                mask_groups(&mut choice, n_group, topk_group);
                order.clear();
                order.extend(0..num_experts as u32);
                order.sort_by(|&a, &b| choice[b as usize].total_cmp(&choice[a as usize]));
                let picked = &order[..top_k.min(num_experts)];
                // transformers adds 1e-20 to the sum (no effect on a sum of sigmoids in f32,
                // kept so that an all-zero pick divides as it does there).
                let total: f32 = picked.iter().map(|&e| probs[e as usize]).sum::<f32>() + 1e-20;
                for &e in picked {
                    let p = probs[e as usize];
                    let w = if renormalize { p / total } else { p };
                    out.push((e, w * scaling));
                }
            }
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

/// DeepSeek-V3's group limit: each of `n_group` equal groups is ranked by the sum of its two
/// largest scores, and the experts outside the `topk_group` best groups are set to -inf
/// (ties go to the lower group, as the experts' do).
fn mask_groups(choice: &mut [f32], n_group: usize, topk_group: usize) {
    if n_group <= 1 || topk_group >= n_group {
        return;
    }
    let per = choice.len() / n_group;
    let ranks: Vec<f32> = choice
        .chunks_exact(per)
        .map(|g| {
            let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for &x in g {
                if x > a {
                    (a, b) = (x, a);
                } else if x > b {
                    b = x;
                }
            }
            a + b
        })
        .collect();
    let mut groups: Vec<usize> = (0..n_group).collect();
    groups.sort_by(|&a, &b| ranks[b].total_cmp(&ranks[a]));
    for &g in &groups[topk_group..] {
        choice[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_softmax_weighs_only_the_picked_logits() {
        let logits = [0.0, 2.0, 1.0, -1.0];
        let r = route(&logits, 4, 2, Routing::TopKSoftmax, None);
        assert_eq!((r[0].0, r[1].0), (1, 2));
        let (a, b) = (1.0f32, (-1.0f32).exp());
        assert!((r[0].1 - a / (a + b)).abs() < 1e-6 && (r[1].1 - b / (a + b)).abs() < 1e-6);
    }

    #[test]
    fn softmax_top_k_picks_the_largest_and_renormalizes() {
        let logits = [0.0, 2.0, 1.0, 2.0, -1.0, 0.5, 3.0, 0.0];
        let r = route(
            &logits,
            4,
            2,
            Routing::SoftmaxTopK { renormalize: true },
            None,
        );
        // Row 0: experts 1 and 3 tie; the lower index comes first; equal halves.
        assert_eq!(r[0].0, 1);
        assert_eq!(r[1].0, 3);
        assert!((r[0].1 - 0.5).abs() < 1e-6 && (r[1].1 - 0.5).abs() < 1e-6);
        // Row 1: expert 2 (3.0) then expert 1 (0.5).
        assert_eq!((r[2].0, r[3].0), (2, 1));
        let (a, b) = (3.0f32.exp(), 0.5f32.exp());
        assert!((r[2].1 - a / (a + b)).abs() < 1e-6);
        let plain = route(
            &logits,
            4,
            2,
            Routing::SoftmaxTopK { renormalize: false },
            None,
        );
        let z: f32 = [-1.0f32, 0.5, 3.0, 0.0].iter().map(|x| x.exp()).sum();
        assert!((plain[2].1 - a / z).abs() < 1e-6);
    }

    /// Against transformers' `DeepseekV3TopkRouter` on these logits (computed by hand below):
    /// 8 experts in 4 groups of 2, 2 groups kept, top 3, renormalized, scaled by 2.5.
    #[test]
    fn sigmoid_grouped_top_k_chooses_with_the_bias_and_weighs_without_it() {
        let logits = [0.0, 1.0, -1.0, 2.0, 0.5, 0.4, 3.0, -3.0];
        let bias = [0.0, 0.0, 0.9, 0.0, 0.0, 0.0, -0.5, 0.0];
        let routing = Routing::SigmoidGroupedTopK {
            n_group: 4,
            topk_group: 2,
            renormalize: true,
            scaling: 2.5,
        };
        let r = route(&logits, 8, 3, routing, Some(&bias));
        let s: Vec<f32> = logits.iter().map(|&l| sigmoid(l)).collect();
        let c: Vec<f32> = s.iter().zip(&bias).map(|(s, b)| s + b).collect();
        // Group sums: [c0+c1, c2+c3, c4+c5, c6+c7] = [1.23, 2.05, 1.22, 0.50]: groups 1, 0.
        // Within them c = [0.5, 0.73, 1.17, 0.88]: experts 2, 3, 1 (by biased score).
        assert!(c[4] + c[5] < c[0] + c[1]);
        let picked: Vec<u32> = r.iter().map(|&(e, _)| e).collect();
        assert_eq!(picked, [2, 3, 1]);
        // Expert 6 has the largest sigmoid but its group is out.
        let total = s[2] + s[3] + s[1];
        for &(e, w) in &r {
            assert!((w - 2.5 * s[e as usize] / total).abs() < 1e-6, "{e}: {w}");
        }
        // One group, no bias, no renormalizing: the plain top 3 of σ, weights σ.
        let flat = Routing::SigmoidGroupedTopK {
            n_group: 1,
            topk_group: 1,
            renormalize: false,
            scaling: 1.0,
        };
        let r = route(&logits, 8, 3, flat, None);
        assert_eq!(r.iter().map(|&(e, _)| e).collect::<Vec<_>>(), [6, 3, 1]);
        assert!((r[2].1 - s[1]).abs() < 1e-7);
    }
}
