//! Paged attention on the device (kernels/attention.cu, kernels/attention_prefill.cu): one
//! launch over the step's tiles for every token of the ragged batch, split keys included (the
//! last of a tile's blocks to finish merges its splits).
//!
//! Launch rules:
//! - grid (tiles, kv_heads, splits) of 256 threads; a block takes one tile (up to 16 tokens of
//!   one sequence) and the q heads of one KV head's GQA group;
//! - the decode shape (8 query rows per pass, CUDA cores) when every tile is one token, else
//!   the prefill shape: for head_dim 64 and 128 the tensor-core kernels of
//!   attention_prefill.cu (bf16 products, f32 accumulation, 64 rows per pass); other multiples
//!   of 8 up to 256 run attention.cu's 256-wide kernels with zero padding (32 prefill rows),
//!   and those over 256 up to 512 (Gemma 4's global heads) its 512-wide ones (8 rows a pass);
//! - split-KV when the tiles alone give fewer than half a wave of [`BLOCKS_PER_SM`] blocks per
//!   multiprocessor: gridDim.z is as many splits as fit the wave, each taking at least
//!   [`MIN_SPLIT_KEYS`] of the longest context the step may have ([`split_count`]). That is
//!   an upper bound: each tile uses [`tile_splits`] of them, one per [`MIN_SPLIT_KEYS`] keys
//!   its furthest token sees, computed by the kernels from device memory
//!   (kernels/attention_split.cuh). A tile's blocks past its count return at once; a tile of
//!   one split writes its output itself; otherwise the last of its blocks to finish (counted
//!   in the step's `tile_counters`) combines exactly its splits, in order, so no merge launch
//!   follows;
//! - a sliding window (Gemma's local layers), attention sinks (gpt-oss) or keys past a query's
//!   own position (`through`: Gemma 4's images attending both ways) run on attention.cu's
//!   kernels, which take them (the prefill of head_dim 64 and 128 then uses the 256-wide
//!   CUDA-core kernels, not the tensor cores); `through` is uploaded per call (image steps
//!   are never replayed from graphs);
//! - CUDA graphs: a step with a graph key is launched from the key alone (its block-table
//!   width bounds the context), never from its context lengths, which the kernels read from
//!   device memory; a captured graph replays the same launches for later steps, and the
//!   per-tile rule makes each replay do the work of its own contexts (a batch-1 decode at
//!   context 300 under a 512-block table uses 2 of its 33 splits).

use std::collections::HashMap;

use lmi_cuda::{DevPtr, Device, DeviceExt, ElemType, Function, LaunchConfig};
use lmi_engine_core::backend::QkvLayout;
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::kv::BLOCK_SIZE;

use super::backend::{CudaBackend, CudaBuf};
use super::step::CudaStep;

pub const KERNELS: &[&str] = &[
    "attention_decode_hd64_f32",
    "attention_decode_hd64_bf16",
    "attention_decode_hd128_f32",
    "attention_decode_hd128_bf16",
    "attention_decode_any_f32",
    "attention_decode_any_bf16",
    "attention_decode_wide_f32",
    "attention_decode_wide_bf16",
    "attention_prefill_wide_f32",
    "attention_prefill_wide_bf16",
    "attention_prefill_hd64_f32",
    "attention_prefill_hd64_bf16",
    "attention_prefill_hd128_f32",
    "attention_prefill_hd128_bf16",
    "attention_prefill_any_f32",
    "attention_prefill_any_bf16",
];

const THREADS: u32 = 256;
/// Keys a block stages per iteration (`ATT_CHUNK`).
const CHUNK: usize = 64;
/// Blocks per multiprocessor split-KV aims for (the decode kernels fit two).
const BLOCKS_PER_SM: usize = 2;
/// Fewest keys worth a split: below this the partials' traffic and the merge cost more than
/// the parallelism brings. `ATT_MIN_SPLIT_KEYS` in kernels/attention_split.cuh.
const MIN_SPLIT_KEYS: usize = 128;
/// Bounds the split scratch and the merge's loop.
const MAX_SPLITS: usize = 256;
/// Dynamic shared memory a kernel gets without opting in.
const DEFAULT_SHARED: u32 = 48 << 10;

/// A kernel instantiation's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `AttnShape` (attention.cu): `d` head dims in the layout, `rows` query rows per pass,
    /// `dp` lanes sharing a key's dot product.
    Cores { d: usize, rows: usize, dp: usize },
    /// `PrefillShape` (attention_prefill.cu): tensor cores, head_dim `d`.
    Wmma { d: usize },
}

/// `PrefillShape`'s constants: q rows per pass, warps, a warp's score-tile stride (f32).
const WMMA_ROWS: usize = 64;
const WMMA_WARPS: usize = 8;
const WMMA_S_LD: usize = 36;

impl Shape {
    /// `AttnShape::SHARED_BYTES` (q rows, K and V chunks, scores, per-row stats and limits) or
    /// `PrefillShape::SHARED_BYTES` (bf16 q rows, K and V chunks with padded rows, the warps'
    /// score tiles, per-warp and per-row stats, 128 bytes of alignment slack).
    fn shared_bytes(self) -> u32 {
        let bytes = match self {
            Shape::Cores { d, rows, dp } => {
                let q_part = d / dp + if dp > 1 { 4 } else { 0 };
                let q = rows * dp * q_part * 4;
                let k = CHUNK * (d + 8) * 2;
                let v = CHUNK * d * 2;
                let s = rows * CHUNK * 4;
                q + k + v + s + 5 * rows * 4
            }
            Shape::Wmma { d } => {
                let qkv = (WMMA_ROWS + 2 * CHUNK) * (d + 8) * 2;
                let scores = WMMA_WARPS * 16 * WMMA_S_LD * 4;
                let stats = 2 * WMMA_WARPS * 16 * 4 + 3 * WMMA_ROWS * 4;
                qkv + scores + stats + 128
            }
        };
        bytes as u32
    }
}

/// The kernels of one head size, as instantiated in attention.cu and attention_prefill.cu.
struct Family {
    /// Head dims the kernels' layout holds (head_dim itself, or a zero-padded bound).
    d: usize,
    /// The prefill kernels' shape (the decode kernels take 8 rows on CUDA cores).
    prefill_shape: Shape,
    /// By output type: f32, bf16.
    decode: [&'static str; 2],
    prefill: [&'static str; 2],
}

const HD64: Family = Family {
    d: 64,
    prefill_shape: Shape::Wmma { d: 64 },
    decode: ["attention_decode_hd64_f32", "attention_decode_hd64_bf16"],
    prefill: ["attention_prefill_hd64_f32", "attention_prefill_hd64_bf16"],
};
const HD128: Family = Family {
    d: 128,
    prefill_shape: Shape::Wmma { d: 128 },
    decode: ["attention_decode_hd128_f32", "attention_decode_hd128_bf16"],
    prefill: [
        "attention_prefill_hd128_f32",
        "attention_prefill_hd128_bf16",
    ],
};
/// Any other head_dim up to 256 (a multiple of 8), zero-padded to 256.
const ANY: Family = Family {
    d: 256,
    prefill_shape: Shape::Cores {
        d: 256,
        rows: 32,
        dp: 1,
    },
    decode: ["attention_decode_any_f32", "attention_decode_any_bf16"],
    prefill: ["attention_prefill_any_f32", "attention_prefill_any_bf16"],
};

/// Heads over 256 up to 512 (a multiple of 8; Gemma 4's global layers), zero-padded to 512,
/// the decode shape for prefill too (its shared memory, 148 KiB, fits the devices that have
/// 164 KiB; 32 prefill rows would not).
const WIDE: Family = Family {
    d: 512,
    prefill_shape: Shape::Cores {
        d: 512,
        rows: 8,
        dp: 4,
    },
    decode: ["attention_decode_wide_f32", "attention_decode_wide_bf16"],
    prefill: ["attention_prefill_wide_f32", "attention_prefill_wide_bf16"],
};

/// The widest head the kernels take (`WIDE`).
pub const MAX_HEAD_DIM: usize = 512;

impl Family {
    fn for_head_dim(head_dim: usize) -> Option<&'static Family> {
        match head_dim {
            64 => Some(&HD64),
            128 => Some(&HD128),
            d if d > 0 && d % 8 == 0 && d <= 256 => Some(&ANY),
            d if d % 8 == 0 && d <= MAX_HEAD_DIM => Some(&WIDE),
            _ => None,
        }
    }

    /// The decode or prefill kernels (names by output type) and their shape.
    fn kernels(&self, decode: bool) -> ([&'static str; 2], Shape) {
        if decode {
            let d = self.d;
            (self.decode, Shape::Cores { d, rows: 8, dp: 4 })
        } else {
            (self.prefill, self.prefill_shape)
        }
    }
}

/// Raises the dynamic shared memory limit of the kernels that need more than 48 KiB.
pub fn configure<D: Device>(dev: &D, kernels: &HashMap<&'static str, Function>) -> Result<()> {
    let all = [&HD64, &HD128, &ANY, &WIDE].map(|f| [f.kernels(true), f.kernels(false)]);
    for (names, shape) in all.into_iter().flatten() {
        let bytes = shape.shared_bytes();
        if bytes <= DEFAULT_SHARED {
            continue;
        }
        let most = dev.info().max_shared_mem_per_block;
        // A device without room for the wide heads runs every other model: `run` refuses
        // those heads there.
        if shape == WIDE.prefill_shape && bytes > most {
            continue;
        }
        for name in names {
            if bytes > most {
                return Err(EngineError::Backend(format!(
                    "{name} needs {bytes} bytes of shared memory; the device allows {most}"
                )));
            }
            let f = kernels
                .get(name)
                .ok_or_else(|| EngineError::Backend(format!("kernel {name} was not loaded")))?;
            dev.set_max_dynamic_shared(*f, bytes)
                .map_err(|e| EngineError::Backend(format!("{name}: {e}")))?;
        }
    }
    Ok(())
}

/// Parts each tile's keys are split into: as many as keep the launch within one wave of
/// [`BLOCKS_PER_SM`] blocks per multiprocessor (a second, partial wave would idle most of
/// the GPU), each part at least [`MIN_SPLIT_KEYS`] of the longest context.
fn split_count(blocks: usize, longest: usize, multiprocessors: usize) -> usize {
    let wave = BLOCKS_PER_SM * multiprocessors;
    (wave / blocks.max(1))
        .min(longest / MIN_SPLIT_KEYS)
        .clamp(1, MAX_SPLITS)
}

/// The splits a tile whose furthest token sees `keys` keys uses out of a launch's `bound`
/// (gridDim.z): `att_tile_splits` of kernels/attention_split.cuh, which the kernels compute
/// from device memory. Here for tests and the cost notes.
#[cfg(test)]
fn tile_splits(keys: usize, bound: usize) -> usize {
    (keys / MIN_SPLIT_KEYS).clamp(1, bound.max(1))
}

#[allow(clippy::too_many_arguments)]
pub fn run<D: Device>(
    b: &CudaBackend<D>,
    qkv: &CudaBuf,
    step: &CudaStep,
    layout: QkvLayout,
    k_cache: DevPtr,
    v_cache: DevPtr,
    scale: f32,
    window: Option<usize>,
    sinks: Option<DevPtr>,
    through: Option<&[u32]>,
    out: &mut CudaBuf,
) -> Result<()> {
    let QkvLayout {
        q_heads,
        kv_heads,
        head_dim: hd,
    } = layout;
    let tokens = step.num_tokens;
    if tokens == 0 {
        return Ok(());
    }
    let family = Family::for_head_dim(hd).ok_or_else(|| {
        EngineError::Backend(format!(
            "CUDA attention supports head_dim 64, 128 and multiples of 8 up to {MAX_HEAD_DIM}, \
             not {hd}"
        ))
    })?;
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(EngineError::Backend(format!(
            "{q_heads} q heads do not form groups over {kv_heads} KV heads"
        )));
    }
    let rows = tokens * q_heads;
    if qkv.dtype != ElemType::F32 || qkv.len < tokens * layout.row_width() || out.len < rows * hd {
        return Err(EngineError::Backend(format!(
            "attention over {tokens} tokens: qkv ({:?}, {}) or out ({}) is too small",
            qkv.dtype, qkv.len, out.len
        )));
    }

    // Every tile is one token exactly when there are as many tokens as sequences.
    let decode = tokens == step.num_seqs;
    let (names, shape) = family.kernels(decode);
    // attention.cu's kernels (CUDA cores) take a window, sinks and `through`; the tensor-core
    // ones not.
    let (names, shape) = match shape {
        Shape::Wmma { .. } if window.is_some() || sinks.is_some() || through.is_some() => {
            ANY.kernels(decode)
        }
        _ => (names, shape),
    };
    let most = b.dev.info().max_shared_mem_per_block;
    if shape.shared_bytes() > most {
        return Err(EngineError::Backend(format!(
            "attention over heads of {hd} needs {} bytes of shared memory; the device allows \
             {most}",
            shape.shared_bytes()
        )));
    }
    let name = match out.dtype {
        ElemType::F32 => names[0],
        ElemType::BF16 => names[1],
    };
    let longest = step
        .graph_key
        .map_or(step.max_context, |k| k.block_stride * BLOCK_SIZE);
    let splits = split_count(
        step.num_tiles * kv_heads,
        longest,
        b.dev.info().multiprocessors as usize,
    );
    let (part_o, part_ml) = if splits > 1 {
        let o = b.arena_alloc(splits * rows * hd, ElemType::F32)?;
        let ml = b.arena_alloc(splits * rows * 2, ElemType::F32)?;
        (o.ptr, ml.ptr)
    } else {
        (DevPtr::NULL, DevPtr::NULL)
    };
    let cfg = LaunchConfig {
        grid: (step.num_tiles as u32, kv_heads as u32, splits as u32),
        block: (THREADS, 1, 1),
        shared_mem_bytes: shape.shared_bytes(),
    };
    let window = u32::try_from(window.unwrap_or(0))
        .map_err(|_| EngineError::Backend("sliding window too wide".into()))?;
    let through = match through {
        Some(th) => upload_through(b, th, tokens)?,
        None => DevPtr::NULL,
    };
    let mut args: Vec<lmi_cuda::Arg> = vec![
        out.ptr.into(),
        part_o.into(),
        part_ml.into(),
        step.tile_counters.into(),
        qkv.ptr.into(),
        k_cache.into(),
        v_cache.into(),
        step.tiles.into(),
        step.positions.into(),
        step.context_lens.into(),
        step.block_tables.into(),
        (step.block_stride as u32).into(),
        (tokens as u32).into(),
        (q_heads as u32).into(),
        (kv_heads as u32).into(),
        (hd as u32).into(),
        scale.into(),
    ];
    if matches!(shape, Shape::Cores { .. }) {
        args.push(window.into());
        args.push(sinks.unwrap_or(DevPtr::NULL).into());
        args.push(through.into());
    }
    b.launch(name, cfg, &args)
}

/// The step's per-token last positions seen, on the device: one per token of the layout,
/// zeros for the padding rows a padded step adds (context 0: they see nothing).
fn upload_through<D: Device>(b: &CudaBackend<D>, through: &[u32], tokens: usize) -> Result<DevPtr> {
    if through.len() > tokens {
        return Err(EngineError::Backend(format!(
            "attention limits for {} tokens in a step of {tokens}",
            through.len()
        )));
    }
    let mut th = through.to_vec();
    th.resize(tokens, 0);
    let buf = b.arena_alloc(tokens, ElemType::F32)?;
    b.dev
        .htod_slice(&th, buf.ptr)
        .map_err(super::memory::cuda_err)?;
    Ok(buf.ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_gpu_only_when_the_tiles_do_not() {
        // Batch-1 decode of an 8-KV-head model on 132 SMs: 33 splits of a 32k context
        // (264 blocks), but never parts under MIN_SPLIT_KEYS.
        assert_eq!(split_count(8, 32 << 10, 132), 33);
        assert_eq!(split_count(8, 1000, 132), 7);
        assert_eq!(split_count(8, 255, 132), 1);
        // Batch 8: 4 splits (256 blocks), not 5 (320 blocks, a second wave).
        assert_eq!(split_count(64, 32 << 10, 132), 4);
        assert_eq!(split_count(1, 1 << 20, 132), 256);
        // Enough blocks already (a large batch or a long prefill).
        assert_eq!(split_count(140, 1 << 20, 132), 1);
        assert_eq!(split_count(0, 0, 132), 1);
    }

    #[test]
    fn tiles_use_the_splits_their_keys_are_worth() {
        // One split per MIN_SPLIT_KEYS keys, at least one, at most the launch's bound.
        for (keys, want) in [
            (0, 1),
            (1, 1),
            (255, 1),
            (256, 2),
            (383, 2),
            (384, 3),
            (4096, 32),
            (4223, 32),
            (4224, 33),
            (1 << 20, 33),
        ] {
            assert_eq!(tile_splits(keys, 33), want, "{keys} keys");
        }
        assert_eq!(tile_splits(1000, 1), 1);
        assert_eq!(tile_splits(1000, 0), 1);
        // For the step's longest context the rule gives the host's own count (no graph key):
        // the bound is never more than the longest tile can use.
        for longest in [0, 200, 256, 300, 1000, 4096, 32 << 10, 1 << 20] {
            for blocks in [1, 2, 8, 64, 140] {
                let bound = split_count(blocks, longest, 132);
                assert_eq!(
                    tile_splits(longest, bound),
                    bound,
                    "{longest} keys, {blocks}"
                );
            }
        }
    }

    /// Per attention call of a batch-1 decode step with tiles seeing `keys` keys: (kernel
    /// launches, blocks that attend, blocks that return at once, partial bytes written, which
    /// the merge reads back), before (every tile used the whole bound, a merge launch
    /// followed) and now (the tile's last block merges).
    fn decode_costs(keys: usize, bound: usize, kv: usize, q_heads: usize, hd: usize) -> [usize; 8] {
        let row_bytes = q_heads * (hd * 4 + 8);
        let before = [
            if bound > 1 { 2 } else { 1 },
            kv * bound,
            0,
            if bound > 1 { bound * row_bytes } else { 0 },
        ];
        let used = tile_splits(keys, bound);
        let now = [
            1,
            kv * used,
            kv * (bound - used),
            if used > 1 { used * row_bytes } else { 0 },
        ];
        [before, now].concat().try_into().unwrap()
    }

    #[test]
    fn a_graph_keyed_decode_step_does_the_work_of_its_contexts() {
        // Batch-1 decode of a Llama-3-8B layer (32 q heads, 8 KV heads, head_dim 128) on 132
        // SMs, replayed from the graph of a 512-block table: 33 splits launched whatever the
        // context (the host sees only the key).
        let bound = split_count(8, 512 * BLOCK_SIZE, 132);
        assert_eq!(bound, 33);
        let row_bytes = 32 * (128 * 4 + 8);
        let full = 33 * row_bytes;
        // Context 300: 2 splits attend (160 and 140 keys), 31 return; partials 2 of 33.
        assert_eq!(
            decode_costs(300, bound, 8, 32, 128),
            [2, 264, 0, full, 1, 16, 248, 2 * row_bytes]
        );
        // 4k: 32 splits of 128 keys; 32k: all 33.
        assert_eq!(
            decode_costs(4096, bound, 8, 32, 128),
            [2, 264, 0, full, 1, 256, 8, 32 * row_bytes]
        );
        assert_eq!(
            decode_costs(32 << 10, bound, 8, 32, 128),
            [2, 264, 0, full, 1, 264, 0, full]
        );
        // Below 256 keys a tile needs no partials at all and writes its output itself.
        assert_eq!(decode_costs(255, bound, 8, 32, 128)[4..], [1, 8, 256, 0]);
        // Without a graph key the bound follows the step's own longest context.
        assert_eq!(split_count(8, 300, 132), 2);
        assert_eq!(split_count(8, 255, 132), 1);
    }

    #[test]
    fn the_kernels_use_the_same_minimum() {
        let header = lmi_cuda::kernels::HEADERS
            .iter()
            .find(|h| h.name == "attention_split.cuh")
            .expect("kernels/attention_split.cuh");
        let line = format!("#define ATT_MIN_SPLIT_KEYS {MIN_SPLIT_KEYS}u");
        assert!(header.text.lines().any(|l| l == line), "{line}");
    }

    #[test]
    fn shared_memory_matches_the_kernels_layout() {
        // The figures of attention.cu's AttnShape::SHARED_BYTES.
        assert_eq!(HD128.kernels(true).1.shared_bytes(), 40_608);
        assert_eq!(HD128.kernels(false).1.shared_bytes(), 72_576);
        assert_eq!(HD64.kernels(false).1.shared_bytes(), 48_000);
        assert_eq!(HD64.kernels(true).1.shared_bytes(), 22_176);
        assert_eq!(ANY.kernels(false).1.shared_bytes(), 108_160);
        assert!(Family::for_head_dim(96).is_some_and(|f| f.d == 256));
        assert!(Family::for_head_dim(264).is_some_and(|f| f.d == 512));
        assert!(Family::for_head_dim(520).is_none() && Family::for_head_dim(100).is_none());
    }
}
