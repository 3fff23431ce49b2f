//! Multi-head latent attention on the device (`kernels/mla.cu`): [`Backend::mla_qkv`] and
//! [`Backend::mla_attention`], one launch each, grids of the step's shape only.
//!
//! [`Backend::mla_qkv`]: lmi_engine_core::backend::Backend::mla_qkv
//! [`Backend::mla_attention`]: lmi_engine_core::backend::Backend::mla_attention

use lmi_cuda::{Device, ElemType, LaunchConfig};
use lmi_engine_core::backend::MlaDims;
use lmi_engine_core::error::{EngineError, Result};

use super::backend::{CudaBackend, CudaBuf, CudaKv, CudaWeight};
use super::rope::{CudaRope, u32_arg};
use super::step::CudaStep;

pub const KERNELS: &[&str] = &["mla_qkv", "mla_attention_f32", "mla_attention_bf16"];

/// `MLA_THREADS` of kernels/mla.cu.
const THREADS: u32 = 128;

/// Checks that a weight is the flat f32 vector of `len` the kernels read.
fn flat<D: Device>(what: &str, w: &CudaWeight<D>, len: usize) -> Result<()> {
    if w.dtype != ElemType::F32 || w.shape.iter().product::<usize>() != len {
        return Err(EngineError::Backend(format!(
            "latent attention: {what} is {:?} {:?}, expected {len} f32 values",
            w.shape, w.dtype
        )));
    }
    Ok(())
}

/// The one flat f32 weight this backend takes for an absorbed projection (it does not ask
/// for one per head: `Backend::mla_per_head`).
pub(super) fn one_flat<'a, D: Device>(
    what: &str,
    w: &'a [CudaWeight<D>],
) -> Result<&'a CudaWeight<D>> {
    match w {
        [one] => Ok(one),
        _ => Err(EngineError::Backend(format!(
            "latent attention: {what} in {} pieces, expected one flat weight",
            w.len()
        ))),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn qkv<D: Device>(
    b: &CudaBackend<D>,
    q: &CudaBuf,
    kva: &CudaBuf,
    step: &CudaStep,
    d: MlaDims,
    kv_norm: &CudaWeight<D>,
    w_uk: &CudaWeight<D>,
    eps: f32,
    rope: &CudaRope<D>,
    out: &mut CudaBuf,
) -> Result<()> {
    let tokens = step.num_tokens;
    if tokens == 0 {
        return Ok(());
    }
    if rope.pairs() != d.rope / 2 || !d.rope.is_multiple_of(2) {
        return Err(EngineError::Backend(format!(
            "latent attention: {} rotary frequencies for a rotary part of {}",
            rope.pairs(),
            d.rope
        )));
    }
    flat("kv_a_layernorm", kv_norm, d.kv_lora)?;
    flat("W_UK", w_uk, d.heads * d.kv_lora * d.nope)?;
    for (what, buf) in [("q", q), ("kv_a", kva), ("out", &*out)] {
        if buf.dtype != ElemType::F32 {
            return Err(EngineError::Backend(format!(
                "latent attention: {what} must be f32"
            )));
        }
    }
    u32_arg("a latent-attention step", tokens * d.row_width())?;
    b.launch(
        "mla_qkv",
        LaunchConfig {
            grid: (tokens as u32, d.heads as u32 + 1, 1),
            block: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            q.ptr.into(),
            kva.ptr.into(),
            step.positions.into(),
            rope.steps_ptr().into(),
            kv_norm.ptr().into(),
            w_uk.ptr().into(),
            out.ptr.into(),
            (d.heads as u32).into(),
            (d.kv_lora as u32).into(),
            (d.nope as u32).into(),
            (d.rope as u32).into(),
            d.rope_factor.into(),
            eps.into(),
        ],
    )
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention<D: Device>(
    b: &CudaBackend<D>,
    qkv: &CudaBuf,
    step: &CudaStep,
    d: MlaDims,
    k_cache: &CudaKv<D>,
    v_cache: &CudaKv<D>,
    w_uv: &CudaWeight<D>,
    scale: f32,
    out: &mut CudaBuf,
) -> Result<()> {
    let tokens = step.num_tokens;
    if tokens == 0 {
        return Ok(());
    }
    flat("W_UV", w_uv, d.heads * d.v * d.kv_lora)?;
    let kernel = match out.dtype {
        ElemType::F32 => "mla_attention_f32",
        ElemType::BF16 => "mla_attention_bf16",
    };
    let shared = (d.cache_width() + d.kv_lora + THREADS as usize) * 4;
    if shared > 48 * 1024 {
        return Err(EngineError::Backend(format!(
            "latent attention: a record of {} values is more than the kernel's shared memory holds",
            d.cache_width()
        )));
    }
    u32_arg("a latent-attention step", tokens * d.row_width())?;
    b.launch(
        kernel,
        LaunchConfig {
            grid: (tokens as u32, d.heads as u32, 1),
            block: (THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        },
        &[
            qkv.ptr.into(),
            k_cache.ptr().into(),
            v_cache.ptr().into(),
            step.positions.into(),
            step.token_seq.into(),
            step.block_tables.into(),
            (step.block_stride as u32).into(),
            w_uv.ptr().into(),
            out.ptr.into(),
            (d.heads as u32).into(),
            (d.kv_lora as u32).into(),
            (d.rope as u32).into(),
            (d.v as u32).into(),
            scale.into(),
        ],
    )
}
