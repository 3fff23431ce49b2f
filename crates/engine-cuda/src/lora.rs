//! LoRA on the device for every row of a step at once (kernels/lora.cu, Punica's BGMV/SGMV):
//! one shrink launch (`t = x · Aᵀ`, K split across blocks) and one expand launch (`out +=
//! t · Bᵀ` into the projection's column slice) per projection and layer, whatever mix of
//! adapters — of any ranks — and rows without one the step holds. Each row finds its adapter
//! through the step's entries (token row, slot) and the site's slot table (`table.rs`).
//!
//! Launch rule (CUDA graphs): grids and arguments come from the entry count (the token count
//! for a graph-keyed step), the widths, the table's address and its rank bound — never from
//! which adapters a step holds — so a decode step with adapters replays from a graph.

mod table;

use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::{Device, ElemType, LaunchConfig};
use lmi_engine_core::error::{EngineError, Result};

use super::backend::{CudaBackend, CudaBuf};
use super::step::LoraRows;

pub use table::{LoraTable, Registration, SiteLaunch};

pub const KERNELS: &[&str] = &["lora_shrink_f32", "lora_shrink_bf16", "lora_expand"];

// Mirrors of kernels/lora.cu.
const THREADS: u32 = 128;
const SHRINK_ROWS: usize = 4;
const RANKS: usize = 8;
const K_SPLIT: usize = THREADS as usize * 8 * 2;
const EXPAND_ROWS: usize = 4;
const EXPAND_COLS: usize = THREADS as usize * 2;
/// Dynamic shared memory a kernel gets without opting in.
const DEFAULT_SHARED: usize = 48 << 10;

/// `b` `[out, rank]` as Bᵀ `[rank, out]`: the expand reads a rank's row of outputs
/// contiguously.
pub fn transpose_b(b: HostTensor) -> HostTensor {
    let (out, rank) = (b.shape[0], b.shape[1]);
    let v = b.to_f32_vec();
    let mut t = vec![0.0f32; v.len()];
    for n in 0..out {
        for r in 0..rank {
            t[r * out + n] = v[n * rank + r];
        }
    }
    HostTensor::f32(vec![rank, out], t)
}

/// `out[row_e, out_offset ..] += Bᵀ · (A · x[row_e])` for every entry of `rows`.
pub fn run<D: Device>(
    b: &CudaBackend<D>,
    x: &CudaBuf,
    rows: &LoraRows,
    site: &SiteLaunch,
    out: &mut CudaBuf,
    out_width: usize,
    out_offset: usize,
) -> Result<()> {
    let entries = rows.entries;
    if entries == 0 {
        return Ok(());
    }
    if out.dtype != ElemType::F32 || out_offset + site.n_out > out_width {
        return Err(EngineError::Backend(format!(
            "LoRA output: {:?} columns {out_offset}..{} of rows {out_width} wide (an f32 \
             buffer whose rows hold the projection is needed)",
            out.dtype,
            out_offset + site.n_out
        )));
    }
    let bound = site.rank_bound;
    let shared = EXPAND_ROWS * bound * 4;
    if shared > DEFAULT_SHARED {
        return Err(EngineError::Backend(format!(
            "LoRA rank {bound} is above what the expand kernel stages ({} at most)",
            DEFAULT_SHARED / (EXPAND_ROWS * 4)
        )));
    }
    let splits = site.x_width.div_ceil(K_SPLIT);
    let t = b.arena_alloc(splits * entries * bound, ElemType::F32)?;
    let shrink = match x.dtype {
        ElemType::F32 => "lora_shrink_f32",
        ElemType::BF16 => "lora_shrink_bf16",
    };
    let cfg = LaunchConfig {
        grid: (
            entries.div_ceil(SHRINK_ROWS) as u32,
            (bound / RANKS) as u32,
            splits as u32,
        ),
        block: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    b.launch(
        shrink,
        cfg,
        &[
            t.ptr.into(),
            x.ptr.into(),
            site.table.into(),
            rows.rows.into(),
            rows.slots.into(),
            (entries as u32).into(),
            (site.x_width as u32).into(),
            (bound as u32).into(),
        ],
    )?;
    let cfg = LaunchConfig {
        grid: (
            entries.div_ceil(EXPAND_ROWS) as u32,
            site.n_out.div_ceil(EXPAND_COLS) as u32,
            1,
        ),
        block: (THREADS, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    b.launch(
        "lora_expand",
        cfg,
        &[
            out.ptr.into(),
            t.ptr.into(),
            site.table.into(),
            rows.rows.into(),
            rows.slots.into(),
            (entries as u32).into(),
            (bound as u32).into(),
            (splits as u32).into(),
            (site.n_out as u32).into(),
            (out_width as u32).into(),
            (out_offset as u32).into(),
        ],
    )
}
