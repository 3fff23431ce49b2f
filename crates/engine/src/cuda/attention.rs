//! Paged attention on the device (kernels/attention.cu).
//!
//! NOT WRITTEN YET: the interface the backend calls. `run` computes, for every token of the
//! step and every q head, causal attention over its sequence's cached keys `0 ..= position`
//! read through the block table (`step.block_tables`, stride `step.block_stride`), and writes
//! `out` (`[tokens, q_heads * head_dim]`, `out.dtype`).

use std::collections::HashMap;

use lmi_cuda::{DevPtr, Device, Function};

use super::backend::{CudaBackend, CudaBuf};
use super::step::CudaStep;
use crate::backend::QkvLayout;
use crate::error::{EngineError, Result};

pub const KERNELS: &[&str] = &[];

/// One-time launch settings (dynamic shared memory limits).
pub fn configure<D: Device>(_dev: &D, _kernels: &HashMap<&'static str, Function>) -> Result<()> {
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn run<D: Device>(
    _b: &CudaBackend<D>,
    _qkv: &CudaBuf,
    _step: &CudaStep,
    _layout: QkvLayout,
    _k_cache: DevPtr,
    _v_cache: DevPtr,
    _scale: f32,
    _out: &mut CudaBuf,
) -> Result<()> {
    Err(EngineError::Backend(
        "CUDA attention is not written yet".into(),
    ))
}
