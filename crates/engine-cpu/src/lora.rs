//! LoRA on the CPU for every adapter of a step on one projection at once: each token row of
//! an adapter gets `out[r, off ..] += B · (A · x[r])`. Rows are independent (a token belongs to
//! one adapter), so all of them run in one pass, in parallel when it is large enough; an
//! adapter's A and B are read once from memory and from cache for its other rows.
//!
//! Layout (`upload_pair`): A as uploaded, `[rank, in]`; B transposed to `[rank, out]`, so the
//! expand is `rank` contiguous multiply-adds over the output row. Both plain f32 or bf16 (the
//! model's dtype), never AMX tiles.

use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{HostData, HostTensor};
use lmi_engine_core::backend::LoraGroup;
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::error::{EngineError, Result};
use rayon::prelude::*;

use super::simd::dots;
use super::{CpuBackend, CpuWeight};

/// Below this many multiply-adds the pass stays on the calling thread.
const PAR_MACS: usize = 1 << 16;

/// A and transposed B of one pair, in `dtype`.
pub fn upload_pair(a: HostTensor, b: HostTensor, dtype: DType) -> Result<(CpuWeight, CpuWeight)> {
    let (out, rank) = (b.shape[0], b.shape[1]);
    let bv = b.to_f32_vec();
    let mut bt = vec![0.0f32; bv.len()];
    for n in 0..out {
        for r in 0..rank {
            bt[r * out + n] = bv[n * rank + r];
        }
    }
    let plain = |t: HostTensor| {
        // Adapters stay in a float type beside quantized base weights.
        let t = t.to_dtype(if dtype == DType::I8 {
            DType::BF16
        } else {
            dtype
        });
        match t.data {
            HostData::F32(data) => CpuWeight::F32 {
                data,
                shape: t.shape,
            },
            HostData::BF16(data) => CpuWeight::BF16 {
                data,
                shape: t.shape,
            },
            HostData::Quant(_) => CpuWeight::F32 {
                data: t.to_f32_vec(),
                shape: t.shape,
            },
        }
    };
    let a = plain(a);
    let b = plain(HostTensor::f32(vec![rank, out], bt));
    Ok((a, b))
}

enum Rows<'a> {
    F32(&'a [f32]),
    BF16(&'a [u16]),
}

fn rows(w: &CpuWeight) -> Result<Rows<'_>> {
    match w {
        CpuWeight::F32 { data, .. } => Ok(Rows::F32(data)),
        CpuWeight::BF16 { data, .. } => Ok(Rows::BF16(data)),
        CpuWeight::Amx { .. }
        | CpuWeight::Quant { .. }
        | CpuWeight::Panels { .. }
        | CpuWeight::PanelsBf16 { .. } => Err(EngineError::Backend(
            "LoRA weights are kept plain on the CPU, not in AMX tiles or quantized".into(),
        )),
    }
}

/// `t[r] = A[r] · x`.
fn shrink(x: &[f32], a: &Rows<'_>, t: &mut [f32]) {
    match a {
        Rows::F32(r) => dots(x, r, t),
        Rows::BF16(r) => dots(x, r, t),
    }
}

/// `d += Σ_r t[r] · Bᵀ[r]`.
fn expand(t: &[f32], bt: &Rows<'_>, d: &mut [f32]) {
    let n = d.len();
    for (r, &tr) in t.iter().enumerate() {
        match bt {
            Rows::F32(w) => {
                for (o, &v) in d.iter_mut().zip(&w[r * n..(r + 1) * n]) {
                    *o += tr * v;
                }
            }
            Rows::BF16(w) => {
                for (o, &v) in d.iter_mut().zip(&w[r * n..(r + 1) * n]) {
                    *o += tr * f32::from_bits(u32::from(v) << 16);
                }
            }
        }
    }
}

struct Job<'a> {
    row: usize,
    a: Rows<'a>,
    bt: Rows<'a>,
    rank: usize,
}

#[allow(clippy::too_many_arguments)]
pub fn lora(
    x: &[f32],
    x_width: usize,
    step: &BatchLayout,
    groups: &[LoraGroup<'_, CpuBackend>],
    out: &mut [f32],
    out_width: usize,
    out_offset: usize,
) -> Result<()> {
    let Some(first) = groups.first() else {
        return Ok(());
    };
    let n = first.b.shape()[1];
    let mut jobs = Vec::new();
    for g in groups {
        let rank = g.a.shape()[0];
        let rows_of = &step
            .adapter_rows
            .get(g.group)
            .ok_or_else(|| {
                EngineError::Backend(format!("the step has no adapter group {}", g.group))
            })?
            .1;
        for &r in rows_of {
            jobs.push(Job {
                row: r as usize,
                a: rows(g.a)?,
                bt: rows(g.b)?,
                rank,
            });
        }
    }
    // Deltas computed (in parallel when worth it), then added row by row.
    let mut delta = vec![0.0f32; jobs.len() * n];
    let one = |(d, j): (&mut [f32], &Job<'_>)| {
        let xr = &x[j.row * x_width..(j.row + 1) * x_width];
        let mut t = [0.0f32; 64];
        let mut long = Vec::new();
        let t: &mut [f32] = if j.rank <= t.len() {
            &mut t[..j.rank]
        } else {
            long.resize(j.rank, 0.0);
            &mut long
        };
        shrink(xr, &j.a, t);
        expand(t, &j.bt, d);
    };
    let macs = jobs.iter().map(|j| j.rank * (x_width + n)).sum::<usize>();
    if macs < PAR_MACS {
        delta.chunks_mut(n).zip(&jobs).for_each(one);
    } else {
        delta.par_chunks_mut(n).zip(jobs.par_iter()).for_each(one);
    }
    for (d, j) in delta.chunks(n).zip(&jobs) {
        let o = &mut out[j.row * out_width + out_offset..][..n];
        for (o, v) in o.iter_mut().zip(d) {
            *o += v;
        }
    }
    Ok(())
}
