//! [`CpuBackend`]: the engine core's `Backend` on the host — weights, KV pools, the step's
//! operations, each through this crate's kernels.

use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{HostData, HostTensor};
use lmi_engine_core::backend::{
    AttnScoring, Backend, DeltaNet, Feature, LoraGroup, LoraSite, MlaDims, QkvLayout,
};
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::kv::{BLOCK_SIZE, KvCacheConfig};
use lmi_engine_core::state::StateConfig;
use lmi_engine_core::step::process_logits_host;
use lmi_engine_core::step::{LogitsOutput, LogitsWork};

use crate::attention::{self, Scoring};
use crate::delta_net::{self, CpuState};
use crate::kv_pool::KvPool;
use crate::{
    amx, encoder, encoder_attention, linear, lora, mla, moe, ops, panel, qlanes, qlinear, simd,
    vision,
};

/// A weight in CPU memory. bf16 matrices are kept in AMX tile order where the CPU has AMX.
pub enum CpuWeight {
    F32 {
        data: Vec<f32>,
        shape: Vec<usize>,
    },
    BF16 {
        data: Vec<u16>,
        shape: Vec<usize>,
    },
    Amx {
        packed: amx::AmxWeight,
        shape: Vec<usize>,
    },
    /// Quantized blocks (GGUF formats or per-channel int8), row ranges in order.
    Quant {
        w: qlinear::QWeight,
        shape: Vec<usize>,
    },
    /// An encoder's f32 matrix in panels for the outer-product kernel (`panel.rs`).
    Panels {
        w: panel::PanelWeight,
        shape: Vec<usize>,
    },
    /// An encoder's bf16 matrix in panels of pairs for `vdpbf16ps` (`panel.rs`).
    PanelsBf16 {
        w: panel::PanelWeightBf16,
        shape: Vec<usize>,
    },
}

impl CpuWeight {
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            CpuWeight::F32 { shape, .. }
            | CpuWeight::BF16 { shape, .. }
            | CpuWeight::Amx { shape, .. }
            | CpuWeight::Quant { shape, .. }
            | CpuWeight::Panels { shape, .. }
            | CpuWeight::PanelsBf16 { shape, .. } => shape,
        }
    }

    /// Bytes this weight occupies (what a matrix product streams from memory).
    pub fn bytes(&self) -> usize {
        match self {
            CpuWeight::F32 { data, .. } => data.len() * 4,
            CpuWeight::BF16 { data, .. } => data.len() * 2,
            CpuWeight::Amx { packed, .. } => packed.bytes(),
            CpuWeight::Quant { w, .. } => w.bytes(),
            CpuWeight::Panels { w, .. } => w.bytes(),
            CpuWeight::PanelsBf16 { w, .. } => w.bytes(),
        }
    }

    /// Norm vectors and biases are always kept in f32.
    fn as_f32(&self) -> &[f32] {
        match self {
            CpuWeight::F32 { data, .. } => data,
            CpuWeight::BF16 { .. }
            | CpuWeight::Amx { .. }
            | CpuWeight::Quant { .. }
            | CpuWeight::Panels { .. }
            | CpuWeight::PanelsBf16 { .. } => {
                panic!("vector weights are uploaded as f32")
            }
        }
    }
}

/// Rotary frequencies, and for M-RoPE which position component (time, row, column) each
/// frequency turns with.
pub struct CpuRope {
    pub inv_freq: Vec<f64>,
    pub component: Option<Vec<u8>>,
}

/// One layer's K or V pool, `[blocks, kv_heads, BLOCK_SIZE, head_dim]` (every layer's pools
/// share one allocation, `kv_pool.rs`).
pub enum CpuKv {
    F32(KvPool<f32>),
    /// bf16 bit patterns, rounded to nearest even when written.
    BF16(KvPool<u16>),
}

/// Step-sized scratch buffers are kept for reuse: allocating megabytes per step would have
/// the allocator return them to the kernel and fault them back in, zeroed, every step.
#[derive(Debug, Default)]
pub struct CpuBackend {
    pool: std::sync::Mutex<Vec<Vec<f32>>>,
}

/// Buffers kept for reuse at most.
const POOL_MAX: usize = 32;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend::default()
    }

    /// `out[..rows · n] = x · wᵀ (+ bias)`: [`Backend::linear`] on slices, so callers can hand
    /// it parts of larger buffers.
    pub(crate) fn linear_into(
        &self,
        x: &[f32],
        rows: usize,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        out: &mut [f32],
    ) {
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let bias = bias.map(|b| b.as_f32());
        match w {
            CpuWeight::F32 { data, .. } => linear::linear(x, rows, k, data, n, bias, out),
            CpuWeight::BF16 { data, .. } => linear::linear(x, rows, k, data, n, bias, out),
            CpuWeight::Amx { packed, .. } => amx::linear(x, rows, packed, bias, out),
            CpuWeight::Quant { w, .. } => qlinear::qlinear(x, rows, w, bias, out),
            CpuWeight::Panels { w, .. } => panel::linear(x, rows, w, bias, out),
            CpuWeight::PanelsBf16 { w, .. } => panel::linear_bf16(x, rows, w, bias, out),
        }
    }

    /// The kernel quantized weights' products of `rows` activation rows take, for reports.
    pub fn quant_kernel(&self, rows: usize) -> String {
        qlinear::qpath().name_for_rows(rows)
    }

    /// `count` zeroed pools of `cfg`'s shape and dtype, in one allocation.
    fn kv_pools(cfg: &KvCacheConfig, count: usize) -> Result<Vec<CpuKv>> {
        let n = cfg.layer_elems();
        Ok(match cfg.dtype {
            DType::BF16 | DType::I8 => KvPool::zeroed(count, n)?
                .into_iter()
                .map(CpuKv::BF16)
                .collect(),
            DType::F32 | DType::F16 => KvPool::zeroed(count, n)?
                .into_iter()
                .map(CpuKv::F32)
                .collect(),
        })
    }
}

/// Checks that an absorbed projection came as one `shape` matrix per head.
fn per_head(what: &str, w: &[CpuWeight], heads: usize, shape: [usize; 2]) -> Result<()> {
    if w.len() != heads || w.iter().any(|m| m.shape() != shape) {
        return Err(EngineError::Backend(format!(
            "latent attention: {what} must be {heads} matrices of {shape:?}, got {} ({:?})",
            w.len(),
            w.first().map(CpuWeight::shape)
        )));
    }
    Ok(())
}

/// Paged attention over pools of either element type.
fn attend(
    qkv: &[f32],
    step: &BatchLayout,
    layout: QkvLayout,
    k_cache: &CpuKv,
    v_cache: &CpuKv,
    scoring: Scoring<'_>,
    out: &mut [f32],
) -> Result<()> {
    match (k_cache, v_cache) {
        (CpuKv::F32(k), CpuKv::F32(v)) => {
            attention::paged_attention(qkv, step, layout, k, v, scoring, out)
        }
        (CpuKv::BF16(k), CpuKv::BF16(v)) => {
            attention::paged_attention(qkv, step, layout, k, v, scoring, out)
        }
        _ => unreachable!("K and V pools share one dtype"),
    }
    Ok(())
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;
    type Kv = CpuKv;
    type Step = BatchLayout;
    type Rope = CpuRope;
    type Vision = std::convert::Infallible;
    type Experts = ();
    type State = CpuState;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn product_kernel(&self, rows: usize, quantized: bool) -> String {
        if quantized {
            self.quant_kernel(rows)
        } else if amx::available() {
            "bf16 (AMX-BF16 tiles), f32 (FMA)".into()
        } else if simd::has_bf16_dot() {
            "bf16 (vdpbf16ps), f32 (FMA)".into()
        } else {
            "FMA (bf16 widened to f32)".into()
        }
    }

    fn upload_weight(&self, t: HostTensor) -> Result<CpuWeight> {
        let shape = t.shape;
        Ok(match t.data {
            HostData::F32(data) => CpuWeight::F32 { data, shape },
            HostData::Quant(parts) if shape.len() == 2 && qlinear::QWeight::supports(&parts) => {
                qlanes::bits().map_err(|e| EngineError::Backend(e.into()))?;
                CpuWeight::Quant {
                    w: qlinear::QWeight::new(parts),
                    shape,
                }
            }
            HostData::Quant(parts) => {
                // A width no kernel tiles (not a multiple of 32): held in bf16 instead.
                let t = HostTensor {
                    shape,
                    data: HostData::Quant(parts),
                };
                return self.upload_weight(t.to_dtype(DType::BF16));
            }
            HostData::BF16(data) if shape.len() == 2 && amx::available() => CpuWeight::Amx {
                packed: amx::AmxWeight::pack(&data, shape[0], shape[1]),
                shape,
            },
            HostData::BF16(data) if shape.len() > 1 => CpuWeight::BF16 { data, shape },
            HostData::BF16(_) => {
                return Err(EngineError::Backend(
                    "vector weights must be uploaded as f32".into(),
                ));
            }
        })
    }

    /// f32 matrices in panels, bf16 ones in panels of pairs where the CPU has AVX512-BF16
    /// (`panel.rs`); other forms as [`Backend::upload_weight`] keeps them.
    fn upload_encoder_weight(&self, t: HostTensor) -> Result<CpuWeight> {
        match &t.data {
            HostData::F32(data) if t.shape.len() == 2 => Ok(CpuWeight::Panels {
                w: panel::PanelWeight::pack(data, t.shape[0], t.shape[1]),
                shape: t.shape,
            }),
            HostData::BF16(data) if t.shape.len() == 2 && panel::PanelWeightBf16::available() => {
                Ok(CpuWeight::PanelsBf16 {
                    w: panel::PanelWeightBf16::pack(data, t.shape[0], t.shape[1]),
                    shape: t.shape,
                })
            }
            _ => self.upload_weight(t),
        }
    }

    fn upload_lora_pair(
        &self,
        a: HostTensor,
        b: HostTensor,
        dtype: DType,
    ) -> Result<(CpuWeight, CpuWeight)> {
        lora::upload_pair(a, b, dtype)
    }

    fn weight_bytes(&self, w: &CpuWeight) -> usize {
        w.bytes()
    }

    fn rope_table(&self, inv_freq: &[f64]) -> Result<CpuRope> {
        Ok(CpuRope {
            inv_freq: inv_freq.to_vec(),
            component: None,
        })
    }

    fn encode_vision(
        &self,
        _: Option<&std::convert::Infallible>,
        tower: &lmi_engine_core::vision::VisionTower,
        input: &lmi_engine_core::vision::VisionInput,
    ) -> Result<Vec<f32>> {
        vision::forward(tower, input)
    }

    fn mrope_table(&self, inv_freq: &[f64], components: &[u8]) -> Result<CpuRope> {
        if components.len() != inv_freq.len() || components.iter().any(|&c| c > 2) {
            return Err(EngineError::Backend(format!(
                "M-RoPE components {components:?} do not fit the {} rotary frequencies",
                inv_freq.len()
            )));
        }
        Ok(CpuRope {
            inv_freq: inv_freq.to_vec(),
            component: Some(components.to_vec()),
        })
    }

    fn add_rows(&self, dst: &mut Vec<f32>, width: usize, rows: &[u32], src: &[f32]) -> Result<()> {
        if src.len() != rows.len() * width
            || rows.iter().any(|&r| (r as usize + 1) * width > dst.len())
        {
            return Err(EngineError::Backend(format!(
                "{} values to add to rows {rows:?} of {width} in a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        for (&r, s) in rows.iter().zip(src.chunks(width)) {
            let r = r as usize;
            for (d, v) in dst[r * width..(r + 1) * width].iter_mut().zip(s) {
                *d += v;
            }
        }
        Ok(())
    }

    fn write_rows(
        &self,
        dst: &mut Vec<f32>,
        width: usize,
        rows: &[u32],
        src: &[f32],
    ) -> Result<()> {
        for (&r, s) in rows.iter().zip(src.chunks(width)) {
            let r = r as usize;
            dst[r * width..(r + 1) * width].copy_from_slice(s);
        }
        Ok(())
    }

    fn alloc_kv(&self, cfg: &KvCacheConfig) -> Result<CpuKv> {
        let mut pools = Self::kv_pools(cfg, 1)?;
        pools
            .pop()
            .ok_or_else(|| EngineError::Backend("no KV pool allocated".into()))
    }

    fn alloc_kv_layers(&self, cfg: &KvCacheConfig) -> Result<Vec<(CpuKv, CpuKv)>> {
        let mut pools = Self::kv_pools(cfg, 2 * cfg.num_layers)?.into_iter();
        Ok(std::iter::from_fn(|| Some((pools.next()?, pools.next()?))).collect())
    }

    fn window_pools(&self) -> bool {
        true
    }

    fn window_step(&self, step: &BatchLayout) -> Option<BatchLayout> {
        step.on_window()
    }

    fn upload_step(&self, layout: &BatchLayout) -> Result<BatchLayout> {
        Ok(layout.clone())
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        let reused = self.pool.lock().ok().and_then(|mut pool| {
            // The smallest buffer that fits; when none does, the largest is dropped for a
            // new one, so the pool never holds more buffers than a step has live at once.
            // (Keeping the small ones too had steps of different widths pile up copies of
            // the vocab-wide logits buffer: 60 MB of them at 64 sequences of SmolLM2.)
            let by_size = pool.iter().enumerate().map(|(i, b)| (b.capacity(), i));
            let i = match by_size.clone().filter(|&(c, _)| c >= len).min() {
                Some((_, i)) => i,
                None => by_size.max()?.1,
            };
            Some(pool.swap_remove(i))
        });
        let mut v = match reused {
            Some(v) if v.capacity() >= len => v,
            _ => Vec::with_capacity(len),
        };
        v.clear();
        v.resize(len, 0.0);
        Ok(v)
    }

    fn recycle(&self, buf: Vec<f32>) {
        if let Ok(mut pool) = self.pool.lock()
            && pool.len() < POOL_MAX
        {
            pool.push(buf);
        }
    }

    fn embedding(&self, table: &CpuWeight, step: &BatchLayout, out: &mut Vec<f32>) -> Result<()> {
        let width = table.shape()[1];
        match table {
            CpuWeight::F32 { data, .. } => ops::embedding(data, width, &step.token_ids, out),
            CpuWeight::BF16 { data, .. } => ops::embedding(data, width, &step.token_ids, out),
            CpuWeight::Amx { packed, .. } => {
                for (o, &id) in out.chunks_mut(width).zip(&step.token_ids) {
                    packed.row_into(id as usize, o);
                }
            }
            CpuWeight::Quant { w, .. } => {
                for (o, &id) in out.chunks_mut(width).zip(&step.token_ids) {
                    w.row_into(id as usize, o);
                }
            }
            CpuWeight::Panels { w, .. } => {
                for (o, &id) in out.chunks_mut(width).zip(&step.token_ids) {
                    w.row_into(id as usize, o);
                }
            }
            CpuWeight::PanelsBf16 { w, .. } => {
                for (o, &id) in out.chunks_mut(width).zip(&step.token_ids) {
                    w.row_into(id as usize, o);
                }
            }
        }
        Ok(())
    }

    fn linear(
        &self,
        x: &Vec<f32>,
        rows: usize,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.linear_into(x, rows, w, bias, out);
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        rows: usize,
        w: &CpuWeight,
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let h = w.shape()[0];
        ops::rms_norm(&x[..rows * h], w.as_f32(), eps, &mut out[..rows * h]);
        Ok(())
    }

    fn add_rms_norm(
        &self,
        residual: &mut Vec<f32>,
        delta: &Vec<f32>,
        rows: usize,
        w: &CpuWeight,
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let h = w.shape()[0];
        ops::add_rms_norm(residual, delta, w.as_f32(), eps, &mut out[..rows * h]);
        Ok(())
    }

    fn add(&self, residual: &mut Vec<f32>, delta: &Vec<f32>, len: usize) -> Result<()> {
        for (r, d) in residual[..len].iter_mut().zip(&delta[..len]) {
            *r += d;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn head_rms_norm(
        &self,
        qkv: &mut Vec<f32>,
        rows: usize,
        layout: QkvLayout,
        first_head: usize,
        n_heads: usize,
        w: &CpuWeight,
        eps: f32,
    ) -> Result<()> {
        let len = rows * layout.row_width();
        ops::head_rms_norm(
            &mut qkv[..len],
            layout,
            first_head,
            n_heads,
            w.as_f32(),
            eps,
        );
        Ok(())
    }

    fn span_rms_norm(
        &self,
        x: &mut Vec<f32>,
        rows: usize,
        row_width: usize,
        offset: usize,
        w: &CpuWeight,
        eps: f32,
    ) -> Result<()> {
        let w = w.as_f32();
        if offset + w.len() > row_width {
            return Err(EngineError::Backend(format!(
                "span_rms_norm: columns {offset}..{} of rows {row_width} wide",
                offset + w.len()
            )));
        }
        ops::span_rms_norm(&mut x[..rows * row_width], row_width, offset, w, eps);
        Ok(())
    }

    fn rope(
        &self,
        qkv: &mut Vec<f32>,
        step: &BatchLayout,
        layout: QkvLayout,
        rope: &CpuRope,
    ) -> Result<()> {
        let len = step.num_tokens() * layout.row_width();
        match &rope.component {
            Some(c) if !step.rope_positions.is_empty() => ops::mrope(
                &mut qkv[..len],
                &step.rope_positions,
                layout,
                &rope.inv_freq,
                c,
            ),
            _ => ops::rope(&mut qkv[..len], &step.positions, layout, &rope.inv_freq),
        }
        Ok(())
    }

    fn write_kv(
        &self,
        qkv: &Vec<f32>,
        step: &BatchLayout,
        layout: QkvLayout,
        k_cache: &mut CpuKv,
        v_cache: &mut CpuKv,
    ) -> Result<()> {
        let slots = &step.slot_mapping;
        match (k_cache, v_cache) {
            (CpuKv::F32(k), CpuKv::F32(v)) => attention::write_kv(qkv, slots, layout, k, v),
            (CpuKv::BF16(k), CpuKv::BF16(v)) => attention::write_kv(qkv, slots, layout, k, v),
            _ => unreachable!("K and V pools share one dtype"),
        }
        Ok(())
    }

    fn attention(
        &self,
        qkv: &Vec<f32>,
        step: &BatchLayout,
        layout: QkvLayout,
        k_cache: &CpuKv,
        v_cache: &CpuKv,
        scoring: AttnScoring<'_, CpuWeight>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let s = scoring.map_sinks(CpuWeight::as_f32);
        attend(qkv, step, layout, k_cache, v_cache, s, out)
    }

    fn mla_per_head(&self) -> bool {
        true
    }

    fn mla_qkv(
        &self,
        q: &Vec<f32>,
        kva: &Vec<f32>,
        step: &BatchLayout,
        dims: MlaDims,
        kv_norm: &CpuWeight,
        w_uk: &[CpuWeight],
        eps: f32,
        rope: &CpuRope,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if rope.inv_freq.len() != dims.rope / 2 {
            return Err(EngineError::Backend(format!(
                "latent attention: {} rotary frequencies for a rotary part of {}",
                rope.inv_freq.len(),
                dims.rope
            )));
        }
        per_head("W_UK", w_uk, dims.heads, [dims.kv_lora, dims.nope])?;
        let (norm, p) = (kv_norm.as_f32(), &step.positions);
        mla::qkv(self, q, kva, p, dims, norm, w_uk, eps, &rope.inv_freq, out);
        Ok(())
    }

    fn mla_attention(
        &self,
        qkv: &Vec<f32>,
        step: &BatchLayout,
        dims: MlaDims,
        k_cache: &CpuKv,
        v_cache: &CpuKv,
        w_uv: &[CpuWeight],
        scale: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        per_head("W_UV", w_uv, dims.heads, [dims.v, dims.kv_lora])?;
        match (k_cache, v_cache) {
            (CpuKv::F32(k), CpuKv::F32(v)) => {
                mla::attention(self, qkv, step, dims, k, v, w_uv, scale, out)
            }
            (CpuKv::BF16(k), CpuKv::BF16(v)) => {
                mla::attention(self, qkv, step, dims, k, v, w_uv, scale, out)
            }
            _ => unreachable!("K and V pools share one dtype"),
        }
        Ok(())
    }

    fn silu_mul(
        &self,
        gate_up: &Vec<f32>,
        rows: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        ops::silu_mul(gate_up, width, &mut out[..rows * width]);
        Ok(())
    }

    fn layer_norm(
        &self,
        x: &Vec<f32>,
        rows: usize,
        w: &CpuWeight,
        b: &CpuWeight,
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (w, b) = (w.as_f32(), b.as_f32());
        let len = rows * w.len();
        if b.len() != w.len() || x.len() < len || out.len() < len {
            return Err(EngineError::Backend(format!(
                "layer_norm: {rows} rows of {} (bias {}) over buffers of {} and {}",
                w.len(),
                b.len(),
                x.len(),
                out.len()
            )));
        }
        encoder::layer_norm(&x[..len], w, b, eps, &mut out[..len]);
        Ok(())
    }

    fn gelu(&self, x: &mut Vec<f32>, len: usize, tanh: bool) -> Result<()> {
        encoder::gelu(&mut x[..len], tanh);
        Ok(())
    }

    fn gather_add(&self, table: &CpuWeight, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let (rows, width) = (table.shape()[0], table.shape()[1]);
        if let Some(&id) = ids.iter().find(|&&i| i as usize >= rows) {
            return Err(EngineError::Batch(format!(
                "row {id} of a table of {rows} rows (an encoder's positions or token types)"
            )));
        }
        let out = &mut out[..ids.len() * width];
        match table {
            CpuWeight::F32 { data, .. } => encoder::gather_add(data, width, ids, out),
            CpuWeight::BF16 { data, .. } => encoder::gather_add(data, width, ids, out),
            CpuWeight::Amx { packed, .. } => {
                let mut row = vec![0.0; width];
                for (o, &id) in out.chunks_mut(width).zip(ids) {
                    packed.row_into(id as usize, &mut row);
                    o.iter_mut().zip(&row).for_each(|(o, v)| *o += v);
                }
            }
            CpuWeight::Quant { w, .. } => {
                let mut row = vec![0.0; width];
                for (o, &id) in out.chunks_mut(width).zip(ids) {
                    w.row_into(id as usize, &mut row);
                    o.iter_mut().zip(&row).for_each(|(o, v)| *o += v);
                }
            }
            CpuWeight::Panels { w, .. } => {
                let mut row = vec![0.0; width];
                for (o, &id) in out.chunks_mut(width).zip(ids) {
                    w.row_into(id as usize, &mut row);
                    o.iter_mut().zip(&row).for_each(|(o, v)| *o += v);
                }
            }
            CpuWeight::PanelsBf16 { w, .. } => {
                let mut row = vec![0.0; width];
                for (o, &id) in out.chunks_mut(width).zip(ids) {
                    w.row_into(id as usize, &mut row);
                    o.iter_mut().zip(&row).for_each(|(o, v)| *o += v);
                }
            }
        }
        Ok(())
    }

    fn encoder_attention(
        &self,
        qkv: &Vec<f32>,
        cu: &[u32],
        heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        encoder_attention::encoder_attention(qkv, cu, heads, head_dim, scale, out);
        Ok(())
    }

    fn supports(&self, _: Feature) -> bool {
        true
    }

    fn alloc_states(&self, cfg: &StateConfig) -> Result<Vec<CpuState>> {
        (0..cfg.layers).map(|_| CpuState::zeroed(cfg)).collect()
    }

    fn copy_states(
        &self,
        state: &mut CpuState,
        _: &StateConfig,
        pairs: &[(u32, u32)],
    ) -> Result<()> {
        state.copy(pairs);
        Ok(())
    }

    fn gated_delta_net(
        &self,
        proj: &Vec<f32>,
        step: &BatchLayout,
        layer: DeltaNet<'_, Self>,
        state: &mut CpuState,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = delta_net::Weights {
            dims: layer.dims,
            conv: layer.conv.as_f32(),
            a_log: layer.a_log.as_f32(),
            dt_bias: layer.dt_bias.as_f32(),
            norm: layer.norm.as_f32(),
            eps: layer.eps,
        };
        delta_net::gated_delta_net(proj, step, &w, state, out)
    }

    fn sigmoid_mul(&self, x: &mut Vec<f32>, gate: &Vec<f32>, len: usize) -> Result<()> {
        for (v, &g) in x[..len].iter_mut().zip(&gate[..len]) {
            *v /= 1.0 + (-g).exp();
        }
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, len: usize, s: f32) -> Result<()> {
        x[..len].iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn gelu_tanh_mul_slice(
        &self,
        x: &mut Vec<f32>,
        other: &Vec<f32>,
        rows: usize,
        width: usize,
        stride: usize,
        offset: usize,
    ) -> Result<()> {
        ops::gelu_tanh_mul_slice(&mut x[..rows * width], other, width, stride, offset);
        Ok(())
    }

    fn softcap(&self, x: &mut Vec<f32>, len: usize, cap: f32) -> Result<()> {
        x[..len]
            .iter_mut()
            .for_each(|v| *v = (*v / cap).tanh() * cap);
        Ok(())
    }

    fn gelu_tanh_mul(
        &self,
        gate_up: &Vec<f32>,
        rows: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        ops::gelu_tanh_mul(gate_up, width, &mut out[..rows * width]);
        Ok(())
    }

    /// Nothing: the CPU groups each step's rows by expert itself.
    fn index_experts(&self, _: &lmi_engine_core::moe::MoeLayer<CpuWeight>) -> Result<()> {
        Ok(())
    }

    fn moe(
        &self,
        x: &Vec<f32>,
        rows: usize,
        hidden: usize,
        layer: &lmi_engine_core::moe::MoeLayer<CpuWeight>,
        _: &(),
        out: &mut Vec<f32>,
    ) -> Result<()> {
        moe::moe(self, x, rows, hidden, layer, out)
    }

    fn lora(
        &self,
        x: &Vec<f32>,
        x_width: usize,
        step: &BatchLayout,
        _site: LoraSite,
        groups: &[LoraGroup<'_, Self>],
        out: &mut Vec<f32>,
        out_width: usize,
        out_offset: usize,
    ) -> Result<()> {
        lora::lora(x, x_width, step, groups, out, out_width, out_offset)
    }

    fn gather_logit_rows(
        &self,
        x: &Vec<f32>,
        step: &BatchLayout,
        width: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        for (o, &r) in out.chunks_mut(width).zip(&step.logits_rows) {
            let r = r as usize;
            o.copy_from_slice(&x[r * width..(r + 1) * width]);
        }
        Ok(())
    }

    fn to_host(&self, mut buf: Vec<f32>, len: usize) -> Result<Vec<f32>> {
        buf.truncate(len);
        Ok(buf)
    }

    fn process_logits(
        &self,
        mut logits: Vec<f32>,
        rows: usize,
        vocab: usize,
        work: &LogitsWork<'_>,
    ) -> Result<LogitsOutput> {
        logits.truncate(rows * vocab);
        let out = process_logits_host(&mut logits, vocab, work);
        self.recycle(logits);
        Ok(out)
    }

    fn run_forward<R: Send>(&self, forward: impl FnOnce() -> R + Send) -> R {
        rayon::scope(|_| forward())
    }

    fn copy_blocks(
        &self,
        cache: &mut CpuKv,
        cfg: &KvCacheConfig,
        pairs: &[(u32, u32)],
    ) -> Result<()> {
        fn copy<T: Copy>(cache: &mut [T], block: usize, pairs: &[(u32, u32)]) {
            for &(src, dst) in pairs {
                let (s, d) = (src as usize * block, dst as usize * block);
                cache.copy_within(s..s + block, d);
            }
        }
        let block = cfg.num_kv_heads * BLOCK_SIZE * cfg.head_dim;
        match cache {
            CpuKv::F32(c) => copy(c, block, pairs),
            CpuKv::BF16(c) => copy(c, block, pairs),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_pool_holds_no_more_buffers_than_a_step_had_live() {
        let b = CpuBackend::new();
        // Steps of three live buffers, each step's larger than the last.
        for step in 1..=5 {
            let bufs: Vec<Vec<f32>> = [100, 1_000, 10_000]
                .iter()
                .map(|&n| b.alloc(n * step).unwrap())
                .collect();
            assert!(bufs.iter().flatten().all(|&x| x == 0.0), "zeroed");
            for (v, n) in bufs.iter().zip([100, 1_000, 10_000]) {
                assert_eq!(v.len(), n * step);
            }
            for v in bufs {
                b.recycle(v);
            }
        }
        let pool = b.pool.lock().unwrap();
        assert_eq!(pool.len(), 3);
        let held: usize = pool.iter().map(Vec::capacity).sum();
        assert!(held <= 2 * (500 + 5_000 + 50_000), "{held} floats held");
    }

    #[test]
    fn every_layers_kv_pools_are_one_allocation_in_order() {
        let cfg = KvCacheConfig {
            num_blocks: 3,
            num_layers: 4,
            num_kv_heads: 2,
            head_dim: 8,
            dtype: DType::BF16,
        };
        let layers = CpuBackend::new().alloc_kv_layers(&cfg).unwrap();
        assert_eq!(layers.len(), 4);
        let n = cfg.layer_elems();
        let starts: Vec<*const u16> = layers
            .iter()
            .flat_map(|(k, v)| [k, v])
            .map(|p| match p {
                CpuKv::BF16(p) => {
                    assert_eq!(p.len(), n);
                    assert!(p.iter().all(|&x| x == 0));
                    p.as_ptr()
                }
                CpuKv::F32(_) => panic!("bf16 pools expected"),
            })
            .collect();
        for w in starts.windows(2) {
            assert_eq!(w[1], w[0].wrapping_add(n), "pools follow each other");
        }
    }
}
