//! A bidirectional encoder's ops on the device (BERT, XLM-RoBERTa; `Feature::Encoder`):
//! LayerNorm (`kernels/norm.cu`), the GELUs (`kernels/activation.cu`), and from
//! `kernels/encoder.cu` the embeddings added by host ids and attention within each sequence
//! without a KV cache. The ids and the attention's tile table are uploaded into the step
//! arena inside the forward pass, so an encoder step is never a graph (nor graph-keyed: its
//! chunks are prompts).

use lmi_cuda::{Device, DeviceExt, ElemType, LaunchConfig};
use lmi_engine_core::error::{EngineError, Result};

use super::backend::{CudaBackend, CudaBuf, CudaWeight, elementwise, row_threads, rows_cols};
use super::memory::cuda_err;
use super::rope::u32_arg;

pub const KERNELS: &[&str] = &[
    "layer_norm_f32",
    "layer_norm_bf16",
    "gelu_erf_f32",
    "gelu_tanh_f32",
    "gather_add_bf16",
    "gather_add_f32",
    "encoder_attention_f32",
    "encoder_attention_bf16",
];

/// Query rows of an `encoder_attention` block (`EA_QUERIES`).
const TILE_QUERIES: usize = 16;
/// The largest head `encoder_attention` takes (`EA_MAX_HEAD_DIM`).
const MAX_HEAD_DIM: usize = 128;
/// Its block: `EA_WARPS` warps.
const THREADS: u32 = 128;
/// The largest grid dimension y.
const GRID_Y: usize = 65_535;

fn err(msg: String) -> EngineError {
    EngineError::Backend(msg)
}

/// `what` holds at least `len` elements.
fn holds(what: &str, buf: &CudaBuf, len: usize) -> Result<()> {
    if buf.len < len {
        return Err(err(format!(
            "{what} holds {} values, the op needs {len}",
            buf.len
        )));
    }
    Ok(())
}

fn f32_only(what: &str, buf: &CudaBuf) -> Result<()> {
    if buf.dtype != ElemType::F32 {
        return Err(err(format!(
            "{what} must be an f32 buffer (Backend::alloc), not {:?}",
            buf.dtype
        )));
    }
    Ok(())
}

/// `out = (x − mean) / sqrt(var + eps) · w + b` per row; `out` f32 or bf16.
pub(super) fn layer_norm<D: Device>(
    b: &CudaBackend<D>,
    x: &CudaBuf,
    rows: usize,
    w: &CudaWeight<D>,
    bias: &CudaWeight<D>,
    eps: f32,
    out: &CudaBuf,
) -> Result<()> {
    let width = w.shape.iter().product::<usize>();
    if w.shape.len() != 1 || bias.shape != w.shape {
        return Err(err(format!(
            "LayerNorm's weight {:?} and bias {:?} must be vectors of one width",
            w.shape, bias.shape
        )));
    }
    if w.dtype != ElemType::F32 || bias.dtype != ElemType::F32 {
        return Err(err("LayerNorm's weight and bias must be f32 vectors".into()));
    }
    f32_only("LayerNorm's input", x)?;
    holds("LayerNorm's input", x, rows * width)?;
    holds("LayerNorm's output", out, rows * width)?;
    if rows == 0 || width == 0 {
        return Ok(());
    }
    let kernel = match out.dtype {
        ElemType::F32 => "layer_norm_f32",
        ElemType::BF16 => "layer_norm_bf16",
    };
    b.launch(
        kernel,
        LaunchConfig::linear(u32_arg("LayerNorm's rows", rows)?, row_threads(width)),
        &[
            out.ptr.into(),
            x.ptr.into(),
            w.ptr().into(),
            bias.ptr().into(),
            u32_arg("a LayerNorm row", width)?.into(),
            eps.into(),
        ],
    )
}

/// GELU in place over `x[..len]`: the erf form, or the tanh approximation.
pub(super) fn gelu<D: Device>(
    b: &CudaBackend<D>,
    x: &CudaBuf,
    len: usize,
    tanh: bool,
) -> Result<()> {
    f32_only("GELU's buffer", x)?;
    holds("GELU's buffer", x, len)?;
    if len == 0 {
        return Ok(());
    }
    let kernel = if tanh {
        "gelu_tanh_f32"
    } else {
        "gelu_erf_f32"
    };
    b.launch(
        kernel,
        elementwise(len),
        &[x.ptr.into(), (len as u64).into()],
    )
}

/// `out[t] += table[ids[t]]` for each id: the ids checked against the table, uploaded, one
/// launch.
pub(super) fn gather_add<D: Device>(
    b: &CudaBackend<D>,
    table: &CudaWeight<D>,
    ids: &[u32],
    out: &CudaBuf,
) -> Result<()> {
    let &[vocab, width] = table.shape.as_slice() else {
        return Err(err(format!(
            "an embedding table is a matrix, not {:?}",
            table.shape
        )));
    };
    f32_only("the embeddings' output", out)?;
    holds("the embeddings' output", out, ids.len() * width)?;
    // The request's input (as the CPU backend reports it), not the device's fault.
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(EngineError::Batch(format!(
            "embedding id {id} is outside a table of {vocab} rows (a position past the model's \
             max_position_embeddings, or a token type it does not have)"
        )));
    }
    if ids.is_empty() || width == 0 {
        return Ok(());
    }
    let idx = b.arena_alloc(ids.len(), ElemType::F32)?;
    b.dev.htod_slice(ids, idx.ptr).map_err(cuda_err)?;
    let kernel = match table.dtype {
        ElemType::BF16 => "gather_add_bf16",
        ElemType::F32 => "gather_add_f32",
    };
    b.launch(
        kernel,
        rows_cols(ids.len(), width)?,
        &[
            out.ptr.into(),
            table.ptr().into(),
            idx.ptr.into(),
            u32_arg("an embedding row", width)?.into(),
            ((ids.len() * width) as u64).into(),
        ],
    )
}

/// The tiles of `encoder_attention`: per tile of up to [`TILE_QUERIES`] queries, (its first
/// row, its sequence's first row, the row after its sequence). An error when `cu` decreases.
fn tiles(cu: &[u32]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for pair in cu.windows(2) {
        let (first, end) = (pair[0], pair[1]);
        if end < first {
            return Err(err(format!(
                "encoder attention's sequence bounds decrease ({first} then {end})"
            )));
        }
        for q in (first..end).step_by(TILE_QUERIES) {
            out.extend([q, first, end]);
        }
    }
    Ok(out)
}

/// Bidirectional attention within each sequence `cu[s] .. cu[s + 1]` of the `[q | k | v]`
/// rows of `qkv` (f32): a block per (tile of queries, head). `out` f32 or bf16.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention<D: Device>(
    b: &CudaBackend<D>,
    qkv: &CudaBuf,
    cu: &[u32],
    heads: usize,
    head_dim: usize,
    scale: f32,
    out: &CudaBuf,
) -> Result<()> {
    if head_dim == 0 || head_dim > MAX_HEAD_DIM || !head_dim.is_multiple_of(4) {
        return Err(err(format!(
            "the CUDA encoder attention takes heads of 4 to {MAX_HEAD_DIM} dimensions (a \
             multiple of 4), not {head_dim}: use --device cpu"
        )));
    }
    if heads > GRID_Y {
        return Err(err(format!(
            "the CUDA encoder attention takes at most {GRID_Y} heads, not {heads}"
        )));
    }
    f32_only("encoder attention's QKV rows", qkv)?;
    let tiles = tiles(cu)?;
    let rows = cu.last().map_or(0, |&r| r as usize);
    let width = heads * head_dim;
    holds("encoder attention's QKV rows", qkv, rows * 3 * width)?;
    holds("encoder attention's output", out, rows * width)?;
    if tiles.is_empty() || heads == 0 {
        return Ok(());
    }
    let count = u32_arg("encoder attention's tiles", tiles.len() / 3)?;
    let table = b.arena_alloc(tiles.len(), ElemType::F32)?;
    b.dev.htod_slice(&tiles, table.ptr).map_err(cuda_err)?;
    let kernel = match out.dtype {
        ElemType::F32 => "encoder_attention_f32",
        ElemType::BF16 => "encoder_attention_bf16",
    };
    b.launch(
        kernel,
        LaunchConfig {
            grid: (count, heads as u32, 1),
            block: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            out.ptr.into(),
            qkv.ptr.into(),
            table.ptr.into(),
            (heads as u32).into(),
            (head_dim as u32).into(),
            scale.into(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_every_query_of_each_sequence_once() {
        // Lengths 1, 0, 17, 16 from row 0.
        let t = tiles(&[0, 1, 1, 18, 34]).unwrap();
        assert_eq!(
            t,
            [0, 0, 1, 1, 1, 18, 17, 1, 18, 18, 18, 34],
            "(first query, sequence start, sequence end) per tile"
        );
        assert!(tiles(&[0, 5, 3]).is_err());
        assert!(tiles(&[7]).unwrap().is_empty());
    }

    #[test]
    fn the_kernels_use_the_same_shape() {
        let src = lmi_cuda::kernels::source("encoder.cu").expect("kernels/encoder.cu");
        for line in [
            format!("#define EA_QUERIES {TILE_QUERIES}"),
            format!("#define EA_MAX_HEAD_DIM {MAX_HEAD_DIM}"),
            format!("#define EA_WARPS {}", THREADS / 32),
        ] {
            assert!(src.text.lines().any(|l| l == line), "{line}");
        }
    }
}
