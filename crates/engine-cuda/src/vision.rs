//! A Qwen2-VL / Qwen2.5-VL vision tower on the device: the host tower's weights uploaded (bf16
//! matrices, f32 vectors), run with cuBLAS products, the language model's RMSNorm, SwiGLU,
//! residual and rotary kernels (the 2D rotary embedding is a two-component M-RoPE table), and
//! `kernels/vision.cu` for LayerNorm, QuickGELU, GELU and the non-causal segment attention.
//!
//! Scratch memory is allocated per item and freed after it, outside the step arena (whose
//! addresses the step graphs depend on): a 1024² image through a full-size tower takes about
//! 400 MB for the duration of its encoding. Window order (Qwen2.5-VL) is applied to the
//! patches on the host before the upload and undone on the embeddings after the download.

use std::sync::Arc;

use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::{Device, DeviceExt, ElemType, LaunchConfig};
use lmi_engine_core::backend::{Backend, QkvLayout};
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::vision::VisionInput;
use lmi_engine_core::vision::tower::{self, NORM_EPS, VisionTower};
use lmi_engine_core::vision::window::{frame_segments, patch_rows_cols};

use super::backend::{CudaBackend, CudaBuf, CudaWeight, elementwise, row_threads};
use super::memory::{DeviceBox, cuda_err};
use super::rope::{self, CudaRope};

/// The `vision_attention` kernel's block (`VA_THREADS` in vision.cu): the largest head.
const MAX_HEAD_DIM: usize = 128;

struct Norm<D: Device> {
    weight: CudaWeight<D>,
    bias: Option<CudaWeight<D>>,
}

struct Linear<D: Device> {
    w: CudaWeight<D>,
    b: Option<CudaWeight<D>>,
}

enum Mlp<D: Device> {
    /// Gate and up fused into one product (`[gate | up]` rows, as the language model's).
    SwiGlu {
        gate_up: Linear<D>,
        down: Linear<D>,
    },
    QuickGelu {
        fc1: Linear<D>,
        fc2: Linear<D>,
    },
}

struct Block<D: Device> {
    norm1: Norm<D>,
    norm2: Norm<D>,
    qkv: Linear<D>,
    proj: Linear<D>,
    mlp: Mlp<D>,
}

/// A vision tower's weights on the device.
pub struct CudaVision<D: Device> {
    patch_embed: Linear<D>,
    blocks: Vec<Block<D>>,
    merger_norm: Norm<D>,
    merger_fc1: Linear<D>,
    merger_fc2: Linear<D>,
    /// The 2D rotary embedding: the first quarter of a head's frequencies turn with a
    /// patch's row, the second with its column.
    rotary: CudaRope<D>,
}

fn vector<D: Device>(b: &CudaBackend<D>, v: &[f32]) -> Result<CudaWeight<D>> {
    b.upload_weight(HostTensor::f32(vec![v.len()], v.to_vec()))
}

fn matrix<D: Device>(b: &CudaBackend<D>, w: &[f32], n: usize, k: usize) -> Result<CudaWeight<D>> {
    b.upload_weight(HostTensor::f32(vec![n, k], w.to_vec()))
}

fn linear<D: Device>(b: &CudaBackend<D>, l: &tower::Linear) -> Result<Linear<D>> {
    Ok(Linear {
        w: matrix(b, &l.w, l.n, l.k)?,
        b: l.b.as_deref().map(|v| vector(b, v)).transpose()?,
    })
}

fn norm<D: Device>(b: &CudaBackend<D>, n: &tower::Norm) -> Result<Norm<D>> {
    Ok(Norm {
        weight: vector(b, &n.weight)?,
        bias: n.bias.as_deref().map(|v| vector(b, v)).transpose()?,
    })
}

/// Device buffers of one encoding, freed together.
struct Scratch<D: Device> {
    dev: Arc<D>,
    boxes: Vec<DeviceBox<D>>,
}

impl<D: Device> Scratch<D> {
    fn buf(&mut self, len: usize, dtype: ElemType) -> Result<CudaBuf> {
        let mem = DeviceBox::new(&self.dev, len * dtype.size())?;
        let ptr = mem.ptr();
        self.boxes.push(mem);
        Ok(CudaBuf { ptr, len, dtype })
    }
}

impl<D: Device> CudaVision<D> {
    pub(super) fn upload(b: &CudaBackend<D>, t: &VisionTower) -> Result<Self> {
        let cfg = t.config();
        let hd = cfg.head_dim();
        if hd > MAX_HEAD_DIM || !hd.is_multiple_of(4) {
            return Err(EngineError::Backend(format!(
                "the CUDA vision tower takes heads of at most {MAX_HEAD_DIM} (a multiple of 4), \
                 not {hd}: use --device cpu"
            )));
        }
        let blocks = t
            .blocks
            .iter()
            .map(|blk| {
                let mlp = match &blk.mlp {
                    tower::Mlp::SwiGlu { gate, up, down } => {
                        let w = [gate.w.as_slice(), up.w.as_slice()].concat();
                        let bias = match (&gate.b, &up.b) {
                            (Some(g), Some(u)) => Some(vector(b, &[g.as_slice(), u].concat())?),
                            _ => None,
                        };
                        Mlp::SwiGlu {
                            gate_up: Linear {
                                w: matrix(b, &w, gate.n + up.n, gate.k)?,
                                b: bias,
                            },
                            down: linear(b, down)?,
                        }
                    }
                    tower::Mlp::QuickGelu { fc1, fc2 } => Mlp::QuickGelu {
                        fc1: linear(b, fc1)?,
                        fc2: linear(b, fc2)?,
                    },
                    tower::Mlp::Gelu { .. } => {
                        return Err(EngineError::Backend(
                            "the CUDA vision tower does not run Qwen3-VL's blocks: it stays on \
                             the host"
                                .into(),
                        ));
                    }
                };
                Ok(Block {
                    norm1: norm(b, &blk.norm1)?,
                    norm2: norm(b, &blk.norm2)?,
                    qkv: linear(b, &blk.qkv)?,
                    proj: linear(b, &blk.proj)?,
                    mlp,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // As the reference: 1/10000^(2i/dim) over dim = head_dim / 2, rows then columns.
        let dim = hd / 2;
        let inv: Vec<f64> = (0..dim / 2)
            .map(|i| 1.0 / 10000f64.powf((2 * i) as f64 / dim as f64))
            .collect();
        let freqs = [inv.as_slice(), &inv].concat();
        Ok(CudaVision {
            patch_embed: linear(b, &t.patch_embed)?,
            blocks,
            merger_norm: norm(b, &t.merger.norm)?,
            merger_fc1: linear(b, &t.merger.fc1)?,
            merger_fc2: linear(b, &t.merger.fc2)?,
            rotary: CudaRope::upload_mrope(b.device(), &freqs, &rows_then_columns(dim))?,
        })
    }

    /// The item's embeddings, as [`VisionTower::forward`] gives them.
    pub(super) fn forward(
        &self,
        b: &CudaBackend<D>,
        t: &VisionTower,
        input: &VisionInput,
    ) -> Result<Vec<f32>> {
        let cfg = t.config();
        let (h, m) = (cfg.hidden_size, cfg.spatial_merge_size);
        let grid = input.grid_thw;
        let n: usize = grid.iter().product();
        let pd = cfg.patch_dim();
        t.check_input(input)?;
        let unit = cfg.merge_unit();
        let windows = t.windows(grid);
        let mut rows_cols = patch_rows_cols(grid, m);
        let (pixels, full) = match &windows {
            Some((order, _)) => {
                rows_cols = tower::permute_units(&rows_cols, order, unit);
                (
                    std::borrow::Cow::Owned(tower::permute_units(&input.pixels, order, unit * pd)),
                    frame_segments(grid),
                )
            }
            None => (
                std::borrow::Cow::Borrowed(&input.pixels),
                frame_segments(grid),
            ),
        };
        let u32s = |v: &[usize]| v.iter().map(|&x| x as u32).collect::<Vec<u32>>();
        let positions: Vec<u32> = rows_cols.iter().flat_map(|&(r, c)| [r, c, 0]).collect();

        let dev = b.device();
        let mut s = Scratch {
            dev: dev.clone(),
            boxes: Vec::new(),
        };
        let upload_u32 = |s: &mut Scratch<D>, v: &[u32]| -> Result<CudaBuf> {
            let buf = s.buf(v.len().max(1), ElemType::F32)?;
            dev.htod_slice(v, buf.ptr).map_err(cuda_err)?;
            Ok(buf)
        };
        let pos = upload_u32(&mut s, &positions)?;
        let full_bounds = upload_u32(&mut s, &u32s(&full))?;
        let window_bounds = match &windows {
            Some((_, bounds)) => Some((upload_u32(&mut s, &u32s(bounds))?, bounds.len() - 1)),
            None => None,
        };
        let px = s.buf(n * pd, ElemType::F32)?;
        dev.htod_slice(&pixels, px.ptr).map_err(cuda_err)?;
        let px16 = s.buf(n * pd, ElemType::BF16)?;
        to_bf16(b, &px, &px16)?;

        let inter = cfg.intermediate_size;
        let mut x = s.buf(n * h, ElemType::F32)?;
        let normed = s.buf(n * h, ElemType::BF16)?;
        let norm_f32 = s.buf(n * h, ElemType::F32)?;
        let qkv = s.buf(n * 3 * h, ElemType::F32)?;
        let attn = s.buf(n * h, ElemType::F32)?;
        let attn16 = s.buf(n * h, ElemType::BF16)?;
        let mut proj = s.buf(n * h, ElemType::F32)?;
        let mid = s.buf(n * 2 * inter, ElemType::F32)?;
        let act16 = s.buf(n * inter, ElemType::BF16)?;

        b.linear(&px16, n, &self.patch_embed.w, None, &mut x)?;
        let layout = QkvLayout {
            q_heads: cfg.num_heads,
            kv_heads: cfg.num_heads,
            head_dim: cfg.head_dim(),
        };
        for (l, blk) in self.blocks.iter().enumerate() {
            let (bounds, segments) = match &window_bounds {
                Some(w) if !cfg.fullatt_block_indexes.contains(&l) => *w,
                _ => (full_bounds, full.len() - 1),
            };
            self.norm(b, &blk.norm1, &x, n, h, &normed, &norm_f32)?;
            let mut qkv_out = qkv;
            b.linear(&normed, n, &blk.qkv.w, blk.qkv.b.as_ref(), &mut qkv_out)?;
            rope::rope_rows(b, qkv.ptr, n, pos.ptr, layout, &self.rotary)?;
            attention(b, &attn, &qkv, &bounds, segments, n, layout)?;
            to_bf16(b, &attn, &attn16)?;
            b.linear(&attn16, n, &blk.proj.w, blk.proj.b.as_ref(), &mut proj)?;
            b.add(&mut x, &proj, n * h)?;
            self.norm(b, &blk.norm2, &x, n, h, &normed, &norm_f32)?;
            let mut mid_out = mid;
            match &blk.mlp {
                Mlp::SwiGlu { gate_up, down } => {
                    b.linear(&normed, n, &gate_up.w, gate_up.b.as_ref(), &mut mid_out)?;
                    let mut act = act16;
                    b.silu_mul(&mid, n, inter, &mut act)?;
                    b.linear(&act16, n, &down.w, down.b.as_ref(), &mut proj)?;
                }
                Mlp::QuickGelu { fc1, fc2 } => {
                    b.linear(&normed, n, &fc1.w, fc1.b.as_ref(), &mut mid_out)?;
                    in_place(b, "quick_gelu_f32", &mid, n * inter)?;
                    to_bf16(
                        b,
                        &CudaBuf {
                            len: n * inter,
                            ..mid
                        },
                        &act16,
                    )?;
                    b.linear(&act16, n, &fc2.w, fc2.b.as_ref(), &mut proj)?;
                }
            }
            b.add(&mut x, &proj, n * h)?;
        }
        // The merger: each unit's patches side by side (consecutive rows), norm first.
        self.norm(b, &self.merger_norm, &x, n, h, &normed, &norm_f32)?;
        let tokens = n / unit;
        let wide = h * unit;
        let mut hidden = s.buf(tokens * wide, ElemType::F32)?;
        b.linear(
            &normed,
            tokens,
            &self.merger_fc1.w,
            self.merger_fc1.b.as_ref(),
            &mut hidden,
        )?;
        in_place(b, "gelu_erf_f32", &hidden, tokens * wide)?;
        let hidden16 = s.buf(tokens * wide, ElemType::BF16)?;
        to_bf16(b, &hidden, &hidden16)?;
        let out_h = cfg.out_hidden_size;
        let mut out = s.buf(tokens * out_h, ElemType::F32)?;
        b.linear(
            &hidden16,
            tokens,
            &self.merger_fc2.w,
            self.merger_fc2.b.as_ref(),
            &mut out,
        )?;
        let got = dev
            .dtoh_vec::<f32>(out.ptr, tokens * out_h)
            .map_err(cuda_err)?;
        drop(s);
        Ok(tower::unwindow(
            got,
            windows.as_ref().map(|(o, _)| o.as_slice()),
            out_h,
        ))
    }

    /// `out` (bf16) = the block's norm of `x`: RMSNorm (2.5) straight to bf16, or LayerNorm
    /// (2) in f32 through `tmp`.
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &self,
        b: &CudaBackend<D>,
        nrm: &Norm<D>,
        x: &CudaBuf,
        rows: usize,
        width: usize,
        out: &CudaBuf,
        tmp: &CudaBuf,
    ) -> Result<()> {
        let mut o = *out;
        match &nrm.bias {
            None => b.rms_norm(x, rows, &nrm.weight, NORM_EPS, &mut o),
            Some(bias) => {
                b.launch(
                    "layer_norm_f32",
                    LaunchConfig::linear(rows as u32, row_threads(width)),
                    &[
                        tmp.ptr.into(),
                        x.ptr.into(),
                        nrm.weight.ptr().into(),
                        bias.ptr().into(),
                        (width as u32).into(),
                        NORM_EPS.into(),
                    ],
                )?;
                to_bf16(
                    b,
                    &CudaBuf {
                        len: rows * width,
                        ..*tmp
                    },
                    out,
                )
            }
        }
    }
}

/// `out` (bf16) = `x` (f32), `out.len` values.
fn to_bf16<D: Device>(b: &CudaBackend<D>, x: &CudaBuf, out: &CudaBuf) -> Result<()> {
    let len = out.len.min(x.len);
    b.launch(
        "f32_to_bf16_rows",
        elementwise(len),
        &[out.ptr.into(), x.ptr.into(), (len as u64).into()],
    )
}

/// An elementwise activation in place over `len` f32 values.
fn in_place<D: Device>(
    b: &CudaBackend<D>,
    kernel: &'static str,
    x: &CudaBuf,
    len: usize,
) -> Result<()> {
    b.launch(
        kernel,
        elementwise(len),
        &[x.ptr.into(), (len as u64).into()],
    )
}

/// `kernels/vision.cu`'s `vision_attention`: a block per (patch, head).
fn attention<D: Device>(
    b: &CudaBackend<D>,
    out: &CudaBuf,
    qkv: &CudaBuf,
    bounds: &CudaBuf,
    segments: usize,
    rows: usize,
    l: QkvLayout,
) -> Result<()> {
    let scale = 1.0 / (l.head_dim as f32).sqrt();
    b.launch(
        "vision_attention",
        LaunchConfig {
            grid: (rows as u32, l.q_heads as u32, 1),
            block: (MAX_HEAD_DIM as u32, 1, 1),
            shared_mem_bytes: 0,
        },
        &[
            out.ptr.into(),
            qkv.ptr.into(),
            bounds.ptr.into(),
            (segments as u32).into(),
            (l.q_heads as u32).into(),
            (l.head_dim as u32).into(),
            scale.into(),
        ],
    )
}

/// The tower's 2D rotary table as a two-component M-RoPE: the first half of the pairs turn
/// with the patch's row, the second half with its column.
fn rows_then_columns(pairs: usize) -> Vec<u8> {
    (0..pairs).map(|i| u8::from(i >= pairs / 2)).collect()
}
