//! LoRA on the device for the rows of one adapter: shrink (`t = x · Aᵀ`, rank-wide) then
//! expand (`out += t · Bᵀ` into the projection's column slice). One pair of launches per
//! adapter, projection and layer; the rows come from the step upload.

use lmi_cuda::{DevPtr, Device, ElemType, LaunchConfig};

use super::backend::{CudaBackend, CudaBuf, CudaWeight};
use crate::error::Result;

pub const KERNELS: &[&str] = &["lora_shrink_f32", "lora_shrink_bf16", "lora_expand"];

#[allow(clippy::too_many_arguments)]
pub fn run<D: Device>(
    b: &CudaBackend<D>,
    x: &CudaBuf,
    x_width: usize,
    rows: DevPtr,
    count: usize,
    a_w: &CudaWeight<D>,
    b_w: &CudaWeight<D>,
    out: &mut CudaBuf,
    out_width: usize,
    out_offset: usize,
) -> Result<()> {
    if count == 0 {
        return Ok(());
    }
    let (rank, n_out) = (a_w.shape[0], b_w.shape[0]);
    let t = b.arena_alloc(count * rank, ElemType::F32)?;
    let shrink = match x.dtype {
        ElemType::F32 => "lora_shrink_f32",
        ElemType::BF16 => "lora_shrink_bf16",
    };
    b.launch(
        shrink,
        LaunchConfig::linear(count as u32, 128),
        &[
            t.ptr.into(),
            x.ptr.into(),
            a_w.ptr().into(),
            rows.into(),
            (x_width as u32).into(),
            (rank as u32).into(),
        ],
    )?;
    let cfg = LaunchConfig {
        grid: (n_out.div_ceil(256) as u32, count as u32, 1),
        block: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    b.launch(
        "lora_expand",
        cfg,
        &[
            out.ptr.into(),
            t.ptr.into(),
            b_w.ptr().into(),
            rows.into(),
            (rank as u32).into(),
            (n_out as u32).into(),
            (out_width as u32).into(),
            (out_offset as u32).into(),
        ],
    )
}
