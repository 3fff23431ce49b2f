//! The mixture-of-experts MLP on the CPU: the step's tokens grouped by expert, so that each
//! expert's matrices are read once per step whatever the batch.
//!
//! Batch invariance: a row's result is the sum, in ascending expert order, of its experts'
//! outputs times their weights, and each expert's products are batch invariant (`linear`),
//! so which other rows share the step (and which experts they wake) does not change it. The
//! order is also transformers' (`index_add_` over the experts hit, in index order). A shared
//! expert (Qwen2-MoE) is added to that sum afterwards, each row on its own, as transformers adds it.

use std::cell::Cell;

use lmi_engine_core::backend::Backend;
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::moe::{Expert, ExpertActivation, MoeLayer, SharedExpert, route, sigmoid};

use super::{CpuBackend, CpuWeight, ops};

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
    let correction = match &layer.correction_bias {
        None => None,
        Some(CpuWeight::F32 { data, .. }) if data.len() == num_experts => Some(&data[..]),
        Some(_) => {
            return Err(EngineError::Backend(format!(
                "a mixture's e_score_correction_bias must be {num_experts} f32 values"
            )));
        }
    };
    let routes = route(&logits, num_experts, layer.top_k, layer.routing, correction);
    let per_row = routes.len() / rows.max(1);

    // Per expert: the rows it serves and their weights, rows ascending.
    let mut members: Vec<Vec<(usize, f32)>> = vec![Vec::new(); num_experts];
    for (i, &(e, w)) in routes.iter().enumerate() {
        members[e as usize].push((i / per_row.max(1), w));
    }

    // Every expert's outputs side by side, in expert order. The experts run side by side
    // (each one's products split further where threads are free): a decode step's few rows
    // per expert would otherwise pay a fork and join per product. Each expert's output does
    // not depend on where it ran.
    let mut ys = scratch::take(scratch::OUT, routes.len() * hidden);
    let mut parts = Vec::with_capacity(num_experts);
    let mut rest = &mut ys[..routes.len() * hidden];
    for rows_of in &members {
        let (part, tail) = rest.split_at_mut(rows_of.len() * hidden);
        parts.push(part);
        rest = tail;
    }
    // The experts with rows, each with its output (a lock per task, uncontended: each is
    // taken once).
    let mut busy: Vec<_> = layer
        .experts
        .iter()
        .zip(&members)
        .zip(parts)
        .filter(|((_, rows_of), _)| !rows_of.is_empty())
        .map(|((expert, rows_of), y)| (expert, rows_of, std::sync::Mutex::new(y)))
        .collect();
    // The experts with the most rows first (stable: index order among equals), so that the
    // step does not end on one thread running a large expert while the others wait: a
    // Qwen3-MoE-shaped layer at 16 rows (`examples/moeprof.rs`) 1% faster.
    busy.sort_by_key(|(_, rows_of, _)| std::cmp::Reverse(rows_of.len()));
    crate::pool::run(busy.len(), |i| {
        let (expert, rows_of, y) = &busy[i];
        if let Ok(mut y) = y.lock() {
            run_expert(backend, x, hidden, layer, expert, rows_of, &mut y);
        }
    });

    out[..rows * hidden].fill(0.0);
    let mut at = 0;
    for rows_of in &members {
        for &(r, w) in rows_of {
            let o = &mut out[r * hidden..(r + 1) * hidden];
            for (o, &v) in o.iter_mut().zip(&ys[at..at + hidden]) {
                *o += v * w;
            }
            at += hidden;
        }
    }
    scratch::give(scratch::OUT, ys);
    if let Some(shared) = &layer.shared {
        shared_expert(backend, x, rows, hidden, shared, out);
    }
    Ok(())
}

/// `out[r] += σ(x[r] · gate) · down(silu(gate) · up)(x[r])` for every row (without the
/// `σ(x[r] · gate)` where the shared expert has no gate: DeepSeek's).
fn shared_expert(
    backend: &CpuBackend,
    x: &[f32],
    rows: usize,
    hidden: usize,
    s: &SharedExpert<CpuWeight>,
    out: &mut [f32],
) {
    let w = s.width;
    let mut gate_up = scratch::take(scratch::GATE_UP, rows * 2 * w);
    let mut act = scratch::take(scratch::ACT, rows * w);
    let mut y = scratch::take(scratch::ROWS, rows * hidden);
    // Ungated: a scale of σ(∞) = 1 exactly.
    let mut g = vec![f32::INFINITY; rows];
    let (x, gate_up_m, act_m) = (
        &x[..rows * hidden],
        &mut gate_up[..rows * 2 * w],
        &mut act[..rows * w],
    );
    if let Some(gate) = &s.gate {
        backend.linear_into(x, rows, gate, None, &mut g);
    }
    backend.linear_into(x, rows, &s.gate_up, None, gate_up_m);
    ops::silu_mul(gate_up_m, w, act_m);
    backend.linear_into(act_m, rows, &s.down, None, &mut y[..rows * hidden]);
    for ((o, y), &g) in out
        .chunks_exact_mut(hidden)
        .zip(y.chunks_exact(hidden))
        .zip(&g)
    {
        let scale = sigmoid(g);
        for (o, &v) in o.iter_mut().zip(y) {
            *o += scale * v;
        }
    }
    scratch::give(scratch::GATE_UP, gate_up);
    scratch::give(scratch::ACT, act);
    scratch::give(scratch::ROWS, y);
}

/// `y = expert(x[r])` for the rows `r` of `rows_of`, one after another.
fn run_expert(
    backend: &CpuBackend,
    x: &[f32],
    hidden: usize,
    layer: &MoeLayer<CpuWeight>,
    expert: &Expert<CpuWeight>,
    rows_of: &[(usize, f32)],
    y: &mut [f32],
) {
    let (m, width) = (rows_of.len(), layer.width);
    // The expert's rows, gathered unless they are `x`'s first `m` in order (batch 1).
    let whole = rows_of.iter().enumerate().all(|(j, &(r, _))| j == r);
    let mut xs = scratch::take(scratch::ROWS, if whole { 0 } else { m * hidden });
    if !whole {
        for (dst, &(r, _)) in xs.chunks_exact_mut(hidden).zip(rows_of) {
            dst.copy_from_slice(&x[r * hidden..(r + 1) * hidden]);
        }
    }
    let xs_in = if whole {
        &x[..m * hidden]
    } else {
        &xs[..m * hidden]
    };
    let mut gate_up = scratch::take(scratch::GATE_UP, m * 2 * width);
    let mut act = scratch::take(scratch::ACT, m * width);
    let (gate_up_m, act_m) = (&mut gate_up[..m * 2 * width], &mut act[..m * width]);
    let bias = expert.gate_up_bias.as_ref();
    backend.linear_into(xs_in, m, &expert.gate_up, bias, gate_up_m);
    match layer.activation {
        ExpertActivation::Silu => ops::silu_mul(gate_up_m, width, act_m),
        ExpertActivation::ClampedSwiGlu { alpha, limit } => {
            ops::clamped_swiglu(gate_up_m, width, alpha, limit, act_m)
        }
        ExpertActivation::GeluTanh => ops::gelu_tanh_mul(gate_up_m, width, act_m),
    }
    backend.linear_into(act_m, m, &expert.down, expert.down_bias.as_ref(), y);
    scratch::give(scratch::ROWS, xs);
    scratch::give(scratch::GATE_UP, gate_up);
    scratch::give(scratch::ACT, act);
}

/// Buffers kept per thread across layers and steps, so that a step's experts neither
/// allocate nor zero megabytes (2–3% of a 16-sequence mixture step went to `memset`). A
/// buffer is taken out of its slot while in use — a thread that runs another expert's task
/// meanwhile finds the slot empty and allocates its own — and
/// grows when short. Its contents are stale: every element read is written first.
mod scratch {
    use super::Cell;

    pub(super) const ROWS: usize = 0;
    pub(super) const GATE_UP: usize = 1;
    pub(super) const ACT: usize = 2;
    pub(super) const OUT: usize = 3;

    thread_local! {
        static SLOTS: [Cell<Vec<f32>>; 4] = Default::default();
    }

    /// Slot `slot`'s buffer, at least `len` long.
    pub(super) fn take(slot: usize, len: usize) -> Vec<f32> {
        let mut v = SLOTS.with(|s| s[slot].take());
        if v.len() < len {
            v.resize(len, 0.0);
        }
        v
    }

    /// Puts a buffer back in its slot (dropping one that another task put there meanwhile).
    pub(super) fn give(slot: usize, v: Vec<f32>) {
        SLOTS.with(|s| s[slot].set(v));
    }
}
