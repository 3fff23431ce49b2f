//! The mixture-of-experts MLP on the CPU: the step's tokens grouped by expert, so that each
//! expert's matrices are read once per step whatever the batch.
//!
//! Batch invariance: a row's result is the sum, in ascending expert order, of its experts'
//! outputs times their weights, and each expert's products are batch invariant (`linear`),
//! so which other rows share the step (and which experts they wake) does not change it. The
//! order is also transformers' (`index_add_` over the experts hit, in index order).

use rayon::prelude::*;

use super::{CpuBackend, CpuWeight, ops};
use crate::backend::Backend;
use crate::error::Result;
use crate::moe::{ExpertActivation, MoeLayer, route};

/// `out[r] = Σ_e w[r, e] · expert_e(x[r])` over each row's routed experts.
pub(super) fn moe(
    backend: &CpuBackend,
    x: &Vec<f32>,
    rows: usize,
    hidden: usize,
    layer: &MoeLayer<CpuWeight>,
    out: &mut [f32],
) -> Result<()> {
    let num_experts = layer.experts.len();
    let mut logits = vec![0f32; rows * num_experts];
    backend.linear(
        x,
        rows,
        &layer.router,
        layer.router_bias.as_ref(),
        &mut logits,
    )?;
    let routes = route(&logits, num_experts, layer.top_k, layer.routing);
    let per_row = routes.len() / rows.max(1);

    // Per expert: the rows it serves and their weights, rows ascending.
    let mut members: Vec<Vec<(usize, f32)>> = vec![Vec::new(); num_experts];
    for (i, &(e, w)) in routes.iter().enumerate() {
        members[e as usize].push((i / per_row.max(1), w));
    }

    // The experts run side by side (each one's products split further where threads are
    // free): a decode step's few rows per expert would otherwise pay a fork and join per
    // product. Each expert's output does not depend on where it ran.
    let width = layer.width;
    let outputs: Vec<Option<Vec<f32>>> = layer
        .experts
        .par_iter()
        .zip(&members)
        .map(|(expert, rows_of)| -> Result<Option<Vec<f32>>> {
            let m = rows_of.len();
            if m == 0 {
                return Ok(None);
            }
            let mut xs = Vec::with_capacity(m * hidden);
            for &(r, _) in rows_of {
                xs.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
            }
            let mut gate_up = vec![0f32; m * 2 * width];
            let mut act = vec![0f32; m * width];
            let mut y = vec![0f32; m * hidden];
            backend.linear(
                &xs,
                m,
                &expert.gate_up,
                expert.gate_up_bias.as_ref(),
                &mut gate_up,
            )?;
            match layer.activation {
                ExpertActivation::Silu => ops::silu_mul(&gate_up, width, &mut act),
                ExpertActivation::ClampedSwiGlu { alpha, limit } => {
                    ops::clamped_swiglu(&gate_up, width, alpha, limit, &mut act)
                }
            }
            backend.linear(&act, m, &expert.down, expert.down_bias.as_ref(), &mut y)?;
            Ok(Some(y))
        })
        .collect::<Result<_>>()?;

    out[..rows * hidden].fill(0.0);
    for (y, rows_of) in outputs.iter().zip(&members) {
        let Some(y) = y else { continue };
        for (j, &(r, w)) in rows_of.iter().enumerate() {
            let o = &mut out[r * hidden..(r + 1) * hidden];
            for (o, &v) in o.iter_mut().zip(&y[j * hidden..(j + 1) * hidden]) {
                *o += v * w;
            }
        }
    }
    Ok(())
}
