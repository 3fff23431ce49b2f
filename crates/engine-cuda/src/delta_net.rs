//! Gated DeltaNet layers (Qwen3.5 / Qwen3-Next linear attention) on the device
//! (`kernels/delta_net.cu`): the recurrent-state slots, their copies, and a layer's token
//! mixing in four launches whose grids depend only on the step's shape (decode steps replay
//! from CUDA graphs; the slots are found through the step upload, `step::StateRows`). The
//! recurrence runs in its recurrent form for prefill and decode alike, as the CPU's does
//! (`engine-cpu/src/delta_net.rs`), so a sequence's outputs do not depend on how its prompt was
//! cut into chunks nor on the rest of the step.

use lmi_cuda::{DevPtr, Device, ElemType, LaunchConfig};
use lmi_engine_core::backend::DeltaNet;
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::state::StateConfig;

use super::backend::{CudaBackend, CudaBuf, CudaWeight, elementwise, row_threads};
use super::memory::{DeviceBox, cuda_err};
use super::rope::u32_arg;
use super::step::CudaStep;

pub const KERNELS: &[&str] = &[
    "delta_conv",
    "delta_conv_state",
    "delta_rule_r8",
    "delta_rule_r16",
    "delta_rule_r32",
    "delta_out_norm_f32",
    "delta_out_norm_bf16",
    "copy_state_slots",
    "sigmoid_mul_f32",
    "sigmoid_mul_bf16",
];

/// The widest convolution the kernels take (`DN_MAX_KERNEL`).
const MAX_CONV_KERNEL: usize = 8;
/// Rows of a state matrix per lane of `delta_rule_r{R}`'s 8 warps: the kernel for a head's
/// `dk` is the smallest with `dk <= 8 R`.
const RULE_ROWS: [(usize, &str); 3] = [
    (8, "delta_rule_r8"),
    (16, "delta_rule_r16"),
    (32, "delta_rule_r32"),
];
/// `delta_rule`'s block: `DN_WARPS` warps over `DN_COLS` state columns.
const RULE_THREADS: u32 = 256;
const RULE_COLS: usize = 32;
/// The largest grid dimension y or z.
const GRID_YZ: usize = 65_535;

/// One linear-attention layer's state slots, `[slots, slot_len]` f32 (the slot layout of
/// `kernels/delta_net.cu`).
pub struct CudaState<D: Device> {
    mem: DeviceBox<D>,
    slots: usize,
    slot_len: usize,
}

/// Every linear layer's slots, zeroed (a sequence's first chunk zeroes its slot anyway; zeros
/// keep a slot no chunk has written yet from being read as NaN).
pub(super) fn alloc<D: Device>(b: &CudaBackend<D>, cfg: &StateConfig) -> Result<Vec<CudaState<D>>> {
    let bytes = cfg
        .slots
        .checked_mul(cfg.slot_len)
        .and_then(|n| n.checked_mul(4))
        .ok_or_else(|| {
            EngineError::Backend("recurrent state slots overflow the address space".into())
        })?;
    (0..cfg.layers)
        .map(|_| {
            let mem = DeviceBox::new(&b.dev, bytes)?;
            b.dev.memset_zero(mem.ptr(), bytes).map_err(cuda_err)?;
            Ok(CudaState {
                mem,
                slots: cfg.slots,
                slot_len: cfg.slot_len,
            })
        })
        .collect()
}

/// Copies slots `src → dst` in order: pairs that read or overwrite a slot an earlier pair of
/// the same launch writes or reads go to a later launch, so the result is the sequential one.
pub(super) fn copy<D: Device>(
    b: &CudaBackend<D>,
    state: &mut CudaState<D>,
    pairs: &[(u32, u32)],
) -> Result<()> {
    if pairs.is_empty() {
        return Ok(());
    }
    if let Some(&(s, d)) = pairs
        .iter()
        .find(|&&(s, d)| s as usize >= state.slots || d as usize >= state.slots)
    {
        return Err(EngineError::Batch(format!(
            "state copy {s} -> {d} is outside the {} slots",
            state.slots
        )));
    }
    let ptr = b.state_pairs(pairs)?;
    let per_slot = state
        .slot_len
        .div_ceil(RULE_THREADS as usize)
        .clamp(1, 1024) as u32;
    for (start, len) in waves(pairs) {
        b.launch(
            "copy_state_slots",
            LaunchConfig {
                grid: (len as u32, per_slot, 1),
                block: (RULE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                state.mem.ptr().into(),
                ptr.offset(8 * start).into(),
                (state.slot_len as u64).into(),
            ],
        )?;
    }
    Ok(())
}

/// `pairs` cut into runs `(start, len)` that may run in parallel: within a run no pair reads
/// or writes a slot an earlier pair of the run writes, nor writes one it reads.
fn waves(pairs: &[(u32, u32)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &(s, d)) in pairs.iter().enumerate() {
        let run = &pairs[start..i];
        if run.iter().any(|&(rs, rd)| rd == s || rd == d || rs == d) {
            out.push((start, i - start));
            start = i;
        }
    }
    out.push((start, pairs.len() - start));
    out
}

/// `Backend::gated_delta_net`: `proj` `[tokens, proj_dim]` f32, `out` `[tokens, value_dim]`
/// (f32 or bf16).
pub(super) fn forward<D: Device>(
    b: &CudaBackend<D>,
    proj: &CudaBuf,
    step: &CudaStep,
    layer: &DeltaNet<'_, CudaBackend<D>>,
    state: &mut CudaState<D>,
    out: &mut CudaBuf,
) -> Result<()> {
    let d = layer.dims;
    let rule = check(layer, state)?;
    let tokens = step.num_tokens;
    if tokens == 0 {
        return Ok(());
    }
    let (conv_dim, pd, vd) = (d.conv_dim(), d.proj_dim(), d.value_dim());
    let (nk, nv, dk, dv) = (d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim);
    if proj.dtype != ElemType::F32 || proj.len < tokens * pd || out.len < tokens * vd {
        return Err(EngineError::Backend(format!(
            "gated DeltaNet over {tokens} tokens: projections {:?} of {} values ({} wanted), \
             output of {} ({} wanted)",
            proj.dtype,
            proj.len,
            tokens * pd,
            out.len,
            tokens * vd
        )));
    }
    let u = |what: &str, v: usize| u32_arg(what, v);
    let (pd32, conv32) = (u("a projection row", pd)?, u("the convolution", conv_dim)?);
    let seqs = step.num_seqs;
    let conv_out = b.arena_alloc(tokens * conv_dim, ElemType::F32)?;
    let raw = b.arena_alloc(tokens * vd, ElemType::F32)?;
    let states = state.mem.ptr();
    let slot_len = state.slot_len as u64;
    let rows = step.states;
    let segment = dk.max(dv).next_multiple_of(32).clamp(32, 256) as u32;
    b.launch(
        "delta_conv",
        LaunchConfig {
            grid: (u("a step", tokens)?, (2 * nk + nv) as u32, 1),
            block: (segment, 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            conv_out.ptr.into(),
            proj.ptr.into(),
            states.into(),
            layer.conv.ptr().into(),
            step.token_seq.into(),
            step.seq_start.into(),
            step.positions.into(),
            rows.slots.into(),
            pd32.into(),
            conv32.into(),
            (d.conv_kernel as u32).into(),
            (nk as u32).into(),
            (dk as u32).into(),
            (dv as u32).into(),
            slot_len.into(),
        ],
    )?;
    b.launch(
        "delta_conv_state",
        LaunchConfig {
            grid: (u("a step", seqs)?, conv_dim.div_ceil(256) as u32, 1),
            block: (256, 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            states.into(),
            proj.ptr.into(),
            step.seq_start.into(),
            step.positions.into(),
            rows.slots.into(),
            rows.snap_start.into(),
            rows.snaps.into(),
            pd32.into(),
            conv32.into(),
            (d.conv_kernel as u32).into(),
            slot_len.into(),
        ],
    )?;
    b.launch(
        rule,
        LaunchConfig {
            grid: (u("a step", seqs)?, nv as u32, dv.div_ceil(RULE_COLS) as u32),
            block: (RULE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            raw.ptr.into(),
            states.into(),
            conv_out.ptr.into(),
            proj.ptr.into(),
            layer.a_log.ptr().into(),
            layer.dt_bias.ptr().into(),
            step.seq_start.into(),
            step.positions.into(),
            rows.slots.into(),
            rows.snap_start.into(),
            rows.snaps.into(),
            pd32.into(),
            conv32.into(),
            (d.conv_kernel as u32).into(),
            (nk as u32).into(),
            (nv as u32).into(),
            (dk as u32).into(),
            (dv as u32).into(),
            slot_len.into(),
        ],
    )?;
    let norm = match out.dtype {
        ElemType::F32 => "delta_out_norm_f32",
        ElemType::BF16 => "delta_out_norm_bf16",
    };
    b.launch(
        norm,
        LaunchConfig {
            grid: (u("a step", tokens)?, nv as u32, 1),
            block: (row_threads(dv), 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            out.ptr.into(),
            raw.ptr.into(),
            proj.ptr.into(),
            layer.norm.ptr().into(),
            pd32.into(),
            conv32.into(),
            (nv as u32).into(),
            (dv as u32).into(),
            layer.eps.into(),
        ],
    )
}

/// Checks a layer's shape and weights against the kernels and `state`; returns the recurrence
/// kernel for its key heads.
fn check<D: Device>(
    layer: &DeltaNet<'_, CudaBackend<D>>,
    state: &CudaState<D>,
) -> Result<&'static str> {
    let d = layer.dims;
    let (nk, nv, dk, dv) = (d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim);
    let refuse = |what: String| EngineError::Backend(format!("gated DeltaNet: {what}"));
    if nk == 0 || dk == 0 || dv == 0 || !nv.is_multiple_of(nk) {
        return Err(refuse(format!(
            "{nv} value heads of {dv} over {nk} key heads of {dk}"
        )));
    }
    if !(2..=MAX_CONV_KERNEL).contains(&d.conv_kernel) {
        return Err(refuse(format!(
            "a convolution of width {} (the kernels take 2 to {MAX_CONV_KERNEL})",
            d.conv_kernel
        )));
    }
    if 2 * nk + nv > GRID_YZ || dv.div_ceil(RULE_COLS) > GRID_YZ {
        return Err(refuse(format!(
            "{nk} key heads and {nv} value heads of {dv}"
        )));
    }
    let Some(&(_, rule)) = RULE_ROWS.iter().find(|&&(r, _)| dk <= 8 * r) else {
        return Err(refuse(format!(
            "key heads of {dk} (the kernels take up to 256)"
        )));
    };
    if state.slot_len != d.state_len() {
        return Err(refuse(format!(
            "state slots of {} values for a layer of {}",
            state.slot_len,
            d.state_len()
        )));
    }
    let vector = |name: &str, w: &CudaWeight<D>, len: usize| -> Result<()> {
        let n: usize = w.shape.iter().product();
        if w.dtype != ElemType::F32 || n != len {
            return Err(refuse(format!(
                "{name} is {:?} {:?}, {len} f32 values expected",
                w.shape, w.dtype
            )));
        }
        Ok(())
    };
    vector("the convolution", layer.conv, d.conv_dim() * d.conv_kernel)?;
    vector("A_log", layer.a_log, nv)?;
    vector("dt_bias", layer.dt_bias, nv)?;
    vector("the norm", layer.norm, dv)?;
    Ok(rule)
}

/// `Backend::sigmoid_mul`: `x[i] *= σ(gate[i])`, `x` f32 or bf16, `gate` f32.
pub(super) fn sigmoid_mul<D: Device>(
    b: &CudaBackend<D>,
    x: &mut CudaBuf,
    gate: &CudaBuf,
    len: usize,
) -> Result<()> {
    if gate.dtype != ElemType::F32 || x.len < len || gate.len < len {
        return Err(EngineError::Backend(format!(
            "sigmoid gate of {len}: x holds {}, the gate {} ({:?})",
            x.len, gate.len, gate.dtype
        )));
    }
    if len == 0 {
        return Ok(());
    }
    let kernel = match x.dtype {
        ElemType::F32 => "sigmoid_mul_f32",
        ElemType::BF16 => "sigmoid_mul_bf16",
    };
    b.launch(
        kernel,
        elementwise(len),
        &[x.ptr.into(), gate.ptr.into(), (len as u64).into()],
    )
}

impl<D: Device> CudaState<D> {
    /// Slot `slot`'s values (`[slot_len]` f32), after the work issued so far: for tests.
    pub fn read_slot(&self, b: &CudaBackend<D>, slot: usize) -> Result<Vec<f32>> {
        use lmi_cuda::DeviceExt;
        if slot >= self.slots {
            return Err(EngineError::Batch(format!(
                "state slot {slot} of {}",
                self.slots
            )));
        }
        let at: DevPtr = self.mem.ptr().offset(slot * self.slot_len * 4);
        b.dev.dtoh_vec::<f32>(at, self.slot_len).map_err(cuda_err)
    }

    /// Overwrites every slot with `values` (`[slots, slot_len]`): for tests.
    pub fn write_slots(&mut self, b: &CudaBackend<D>, values: &[f32]) -> Result<()> {
        use lmi_cuda::DeviceExt;
        if values.len() != self.slots * self.slot_len {
            return Err(EngineError::Batch(format!(
                "{} values for {} slots of {}",
                values.len(),
                self.slots,
                self.slot_len
            )));
        }
        b.dev.htod_slice(values, self.mem.ptr()).map_err(cuda_err)
    }
}

#[cfg(test)]
mod tests {
    use super::waves;

    #[test]
    fn copies_that_depend_on_each_other_run_in_later_launches() {
        // Independent copies: one launch.
        assert_eq!(waves(&[(0, 1), (2, 3), (0, 4)]), vec![(0, 3)]);
        // 1 is written, then read: the read waits.
        assert_eq!(waves(&[(0, 1), (1, 2)]), vec![(0, 1), (1, 1)]);
        // 2 is read, then overwritten; then 5 written twice.
        assert_eq!(
            waves(&[(2, 3), (4, 2), (6, 5), (7, 5)]),
            vec![(0, 1), (1, 2), (3, 1)]
        );
    }
}
