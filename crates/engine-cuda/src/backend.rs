//! [`CudaBackend`]: the engine's [`Backend`] on a [`Device`] — a GPU through cudarc, or the
//! CPU emulator in tests. Weights live on the device in bf16 (norm vectors and biases in
//! f32); activations are f32, except buffers that only feed matrix products, which are bf16
//! (the input type of the cuBLAS products, f32 accumulation). Every buffer of a forward pass
//! comes from a step arena, so a step of one shape reuses the same addresses and decode
//! steps replay from CUDA graphs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{HostData, HostTensor};
use lmi_cuda::{Arg, DevPtr, Device, DeviceExt, ElemType, Function, Gemm, LaunchConfig};
use lmi_engine_core::backend::{
    AttnScoring, Backend, DeltaNet, Feature, LoraGroup, LoraPairs, LoraRegistration, LoraSite,
    MlaDims, QkNorm, QkvLayout,
};
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::error::{EngineError, Result};
use lmi_engine_core::kv::KvCacheConfig;
use lmi_engine_core::state::StateConfig;
use lmi_engine_core::step::{LogitsOutput, LogitsWork};

use super::graphs::{Captured, GraphCache, Plan};
use super::memory::{Arena, DeviceBox, cuda_err};
use super::rope::{self, CudaRope, u32_arg};
use super::step::{self, CudaStep, Packed};
use super::{attention, delta_net, encoder, lora, mla, moe, sampler};

/// Every kernel the backend launches; all are resolved when it starts, so a missing one is
/// an error at load time, never in a step.
const KERNELS: &[&str] = &[
    "embedding_bf16",
    "rms_norm_f32",
    "rms_norm_bf16",
    "add_rms_norm_f32",
    "add_rms_norm_bf16",
    "head_rms_norm",
    "span_rms_norm",
    "rope",
    "qk_norm_rope_write_kv",
    "write_kv",
    "copy_blocks",
    "silu_mul_f32",
    "silu_mul_bf16",
    "gelu_tanh_mul_f32",
    "gelu_tanh_mul_bf16",
    "scale_f32",
    "softcap_f32",
    "gelu_tanh_mul_slice_f32",
    "silu_mul_down_bf16",
    "add_f32",
    "add_bias_f32",
    "gather_rows_f32",
    "scatter_rows_f32",
    "scatter_add_rows_f32",
    "quick_gelu_f32",
    "vision_attention",
    "f32_to_bf16_rows",
    "bf16_to_f32_rows",
];

/// An activation buffer: a view into the step arena (cloning copies the handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaBuf {
    pub ptr: DevPtr,
    /// Elements.
    pub len: usize,
    pub dtype: ElemType,
}

/// A weight on the device: matrices in bf16, vectors in f32.
pub struct CudaWeight<D: Device> {
    mem: DeviceBox<D>,
    pub shape: Vec<usize>,
    pub dtype: ElemType,
}

impl<D: Device> CudaWeight<D> {
    pub fn ptr(&self) -> DevPtr {
        self.mem.ptr()
    }
}

/// One layer's K or V pool, `[num_blocks, kv_heads, BLOCK_SIZE, head_dim]` bf16.
pub struct CudaKv<D: Device> {
    mem: DeviceBox<D>,
}

impl<D: Device> CudaKv<D> {
    pub fn ptr(&self) -> DevPtr {
        self.mem.ptr()
    }
}

/// Where the packed step arrays live; moving them (a larger step) changes `epoch`.
struct StepBuffers<D: Device> {
    block: Option<DeviceBox<D>>,
    staging: Packed,
    epoch: u64,
}

/// The copy pairs last uploaded, in the arena: every layer's K and V pool (or state slots)
/// copies the same pairs before the step that needs them, so one upload serves them all.
struct CopyPairs {
    host: Vec<(u32, u32)>,
    ptr: DevPtr,
    /// `steps` when they were uploaded (the arena is reset by the next upload).
    step: u64,
}

impl Default for CopyPairs {
    fn default() -> Self {
        CopyPairs {
            host: Vec::new(),
            ptr: DevPtr::NULL,
            step: u64::MAX,
        }
    }
}

pub struct CudaBackend<D: Device> {
    pub(super) dev: Arc<D>,
    kernels: HashMap<&'static str, Function>,
    pub(super) arena: Mutex<Arena<D>>,
    steps: Mutex<StepBuffers<D>>,
    graphs: Mutex<GraphCache<D::Graph>>,
    /// Registered LoRA adapters' device slots (shared with their registrations).
    lora: Arc<Mutex<lora::LoraTable<D>>>,
    copy_pairs: Mutex<CopyPairs>,
    /// The same for the linear-attention layers' state slots.
    state_pairs: Mutex<CopyPairs>,
    /// Steps uploaded so far.
    steps_uploaded: std::sync::atomic::AtomicU64,
    pub(super) sampler: sampler::Sampler<D>,
    /// Steps of at most this many rows run the down projection fused with SwiGLU
    /// (kernels/mlp_down.cu); 0 sends every step through silu_mul and cuBLAS.
    fused_down_rows: std::sync::atomic::AtomicUsize,
}

/// The most rows kernels/mlp_down.cu takes (`MD_MAX_ROWS`).
pub const FUSED_DOWN_MAX_ROWS: usize = 8;

/// Locks a mutex, ignoring poisoning (a panic elsewhere must not wedge the engine).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// 1-D grid-stride launch over `n` elements.
pub(super) fn elementwise(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 16) as u32;
    LaunchConfig::linear(blocks, 256)
}

/// A launch over `rows` rows of `width` elements for the loops of `kernels/rows.cuh` (rows in
/// y, columns in x, no division per element), or an error when a row is too wide for their
/// 32-bit column index. Depends only on the shape (graphs replay it).
pub(super) fn rows_cols(rows: usize, width: usize) -> Result<LaunchConfig> {
    if width >= 1 << 31 {
        return Err(EngineError::Backend(format!(
            "rows of {width} elements are too wide for the row kernels"
        )));
    }
    let threads = width.next_multiple_of(32).clamp(32, 256);
    // x blocks · threads <= 2^24: with width < 2^31, column indices stay below 2^32.
    let x = width.div_ceil(threads).clamp(1, 1 << 16) as u32;
    let y = rows.clamp(1, 65_535) as u32;
    Ok(LaunchConfig {
        grid: (x, y, 1),
        block: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// A block size for one row of `width` elements: a multiple of 32, at most 1024.
pub(super) fn row_threads(width: usize) -> u32 {
    (width.div_ceil(4).next_multiple_of(32)).clamp(32, 1024) as u32
}

impl<D: Device> CudaBackend<D> {
    /// A backend on `dev`; CUDA graphs for decode steps unless `LMI_CUDA_GRAPHS=0`; the
    /// fused down projection up to `LMI_CUDA_FUSED_DOWN_ROWS` rows (default and most
    /// [`FUSED_DOWN_MAX_ROWS`], 0 for never: the device runbook compares the two).
    pub fn new(dev: Arc<D>) -> Result<Self> {
        let graphs = std::env::var("LMI_CUDA_GRAPHS").map_or(true, |v| v != "0");
        let fused = std::env::var("LMI_CUDA_FUSED_DOWN_ROWS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(FUSED_DOWN_MAX_ROWS);
        let b = Self::with_graphs(dev, graphs)?;
        b.set_fused_down_rows(fused);
        Ok(b)
    }

    /// Steps of at most `rows` rows (clamped to [`FUSED_DOWN_MAX_ROWS`]) run the down
    /// projection fused with SwiGLU; 0 never. Set before graphs are captured: a captured
    /// graph keeps the launches it recorded.
    pub fn set_fused_down_rows(&self, rows: usize) {
        self.fused_down_rows.store(
            rows.min(FUSED_DOWN_MAX_ROWS),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// A backend on `dev` that replays decode steps from CUDA graphs when `graphs` is set.
    pub fn with_graphs(dev: Arc<D>, graphs: bool) -> Result<Self> {
        let mut kernels = HashMap::new();
        let all = KERNELS
            .iter()
            .chain(attention::KERNELS)
            .chain(lora::KERNELS)
            .chain(moe::KERNELS)
            .chain(delta_net::KERNELS)
            .chain(mla::KERNELS)
            .chain(encoder::KERNELS)
            .chain(sampler::KERNELS);
        for &name in all {
            let f = dev
                .function(name)
                .map_err(|e| EngineError::Backend(format!("loading kernel {name}: {e}")))?;
            kernels.insert(name, f);
        }
        attention::configure(dev.as_ref(), &kernels)?;
        Ok(CudaBackend {
            arena: Mutex::new(Arena::new(&dev)),
            steps: Mutex::new(StepBuffers {
                block: None,
                staging: Packed::default(),
                epoch: 0,
            }),
            graphs: Mutex::new(GraphCache::new(graphs)),
            lora: Arc::new(Mutex::new(lora::LoraTable::new(&dev))),
            copy_pairs: Mutex::new(CopyPairs::default()),
            state_pairs: Mutex::new(CopyPairs::default()),
            steps_uploaded: Default::default(),
            sampler: sampler::Sampler::new(&dev),
            fused_down_rows: FUSED_DOWN_MAX_ROWS.into(),
            kernels,
            dev,
        })
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    /// A buffer holding `data` (for tests and tools: the forward pass allocates from the
    /// step arena; this buffer lives until the next step is uploaded).
    pub fn upload_f32(&self, data: &[f32]) -> Result<CudaBuf> {
        let buf = self.arena_alloc(data.len(), ElemType::F32)?;
        self.dev.htod_slice(data, buf.ptr).map_err(cuda_err)?;
        Ok(buf)
    }

    /// Graphs captured so far (tests check that decode steps replay).
    pub fn graphs_captured(&self) -> usize {
        lock(&self.graphs).len()
    }

    pub(super) fn launch(&self, name: &'static str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let f = self
            .kernels
            .get(name)
            .ok_or_else(|| EngineError::Backend(format!("kernel {name} was not loaded")))?;
        self.dev
            .launch(*f, &cfg, args)
            .map_err(|e| EngineError::Backend(format!("launching {name}: {e}")))
    }

    pub(super) fn arena_alloc(&self, len: usize, dtype: ElemType) -> Result<CudaBuf> {
        let ptr = lock(&self.arena).alloc(len * dtype.size())?;
        Ok(CudaBuf { ptr, len, dtype })
    }

    /// `pairs` as `[src, dst]` u32s in the arena, uploaded once for every layer's copies
    /// between two steps (`cache` remembers the last upload).
    fn upload_pairs(&self, cache: &Mutex<CopyPairs>, pairs: &[(u32, u32)]) -> Result<DevPtr> {
        let mut cp = lock(cache);
        let step = self
            .steps_uploaded
            .load(std::sync::atomic::Ordering::Relaxed);
        if cp.step != step || cp.host != pairs {
            let flat: Vec<u32> = pairs.iter().flat_map(|&(s, d)| [s, d]).collect();
            let buf = self.arena_alloc(flat.len(), ElemType::F32)?;
            self.dev.htod_slice(&flat, buf.ptr).map_err(cuda_err)?;
            *cp = CopyPairs {
                host: pairs.to_vec(),
                ptr: buf.ptr,
                step,
            };
        }
        Ok(cp.ptr)
    }

    /// [`Self::upload_pairs`] for the state slots' copies.
    pub(super) fn state_pairs(&self, pairs: &[(u32, u32)]) -> Result<DevPtr> {
        self.upload_pairs(&self.state_pairs, pairs)
    }

    /// `x` as bf16: itself, or converted into a new arena buffer.
    fn as_bf16(&self, x: &CudaBuf, len: usize) -> Result<CudaBuf> {
        if x.dtype == ElemType::BF16 {
            return Ok(*x);
        }
        let out = self.arena_alloc(len, ElemType::BF16)?;
        self.launch(
            "f32_to_bf16_rows",
            elementwise(len),
            &[out.ptr.into(), x.ptr.into(), (len as u64).into()],
        )?;
        Ok(out)
    }

    /// Changes whenever captured graphs may be stale: the arena or the step buffers moved,
    /// or the LoRA table grew (each counter only increases).
    fn epoch(&self) -> u64 {
        lock(&self.arena).epoch() + lock(&self.steps).epoch + lock(&self.lora).generation()
    }

    /// `out[rows, n] = x[rows, k] · wᵀ` through the device's matrix product.
    pub(super) fn gemm(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &CudaWeight<D>,
        out: &CudaBuf,
    ) -> Result<()> {
        let (n, k) = (w.shape[0], w.shape[1]);
        let x = self.as_bf16(x, rows * k)?;
        self.dev
            .gemm(&Gemm {
                m: rows,
                n,
                k,
                x: x.ptr,
                x_type: ElemType::BF16,
                ldx: k,
                w: w.ptr(),
                w_type: w.dtype,
                ldw: k,
                out: out.ptr,
                out_type: out.dtype,
                ldout: n,
                accumulate: false,
            })
            .map_err(|e| {
                EngineError::Backend(format!("matrix product [{rows}x{k}]·[{n}x{k}]ᵀ: {e}"))
            })
    }
}

impl<D: Device> CudaBackend<D> {
    /// Host rows `src` written over (`scatter_rows_f32`) or added to (`scatter_add_rows_f32`)
    /// rows `rows` of `dst`: uploaded into the step arena, then one launch.
    fn scatter_rows(
        &self,
        kernel: &'static str,
        dst: &mut CudaBuf,
        width: usize,
        rows: &[u32],
        src: &[f32],
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if src.len() != rows.len() * width {
            return Err(EngineError::Backend(format!(
                "{} embedding values for {} rows of {width}",
                src.len(),
                rows.len()
            )));
        }
        if let Some(&r) = rows.iter().find(|&&r| (r as usize + 1) * width > dst.len) {
            return Err(EngineError::Backend(format!(
                "embedding row {r} is outside a buffer of {} rows",
                dst.len / width.max(1)
            )));
        }
        let idx = self.arena_alloc(rows.len(), ElemType::F32)?;
        self.dev.htod_slice(rows, idx.ptr).map_err(cuda_err)?;
        let data = self.upload_f32(src)?;
        self.launch(
            kernel,
            rows_cols(rows.len(), width)?,
            &[
                dst.ptr.into(),
                data.ptr.into(),
                idx.ptr.into(),
                (u32_arg("an embedding row", width)?).into(),
                (src.len() as u64).into(),
            ],
        )
    }

    /// `t` on the device in `dtype` (bf16 rounded to nearest even).
    fn upload_as(&self, t: HostTensor, dtype: ElemType) -> Result<CudaWeight<D>> {
        let shape = t.shape.clone();
        let bytes = match dtype {
            ElemType::BF16 => match t.to_dtype(DType::BF16).data {
                HostData::BF16(v) => lmi_cuda::device::as_bytes(&v).to_vec(),
                HostData::F32(_) | HostData::Quant(_) => {
                    unreachable!("to_dtype(BF16) gives bf16")
                }
            },
            ElemType::F32 => lmi_cuda::device::as_bytes(&t.to_f32_vec()).to_vec(),
        };
        let mem = DeviceBox::new(&self.dev, bytes.len())?;
        self.dev.htod(&bytes, mem.ptr()).map_err(cuda_err)?;
        Ok(CudaWeight { mem, shape, dtype })
    }

    /// A gated activation's launch (kernels/activation.cu) over rows of `[gate | up]`.
    fn gated(
        &self,
        kernel: &'static str,
        gate_up: &CudaBuf,
        rows: usize,
        width: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let n = rows * width;
        self.launch(
            kernel,
            rows_cols(rows, width)?,
            &[
                out.ptr.into(),
                gate_up.ptr.into(),
                (width as u32).into(),
                (n as u64).into(),
            ],
        )
    }
}

fn norm_kernel(out: &CudaBuf, f32_name: &'static str, bf16_name: &'static str) -> &'static str {
    match out.dtype {
        ElemType::F32 => f32_name,
        ElemType::BF16 => bf16_name,
    }
}

impl<D: Device> Backend for CudaBackend<D> {
    type Buf = CudaBuf;
    type Weight = CudaWeight<D>;
    type Kv = CudaKv<D>;
    type Step = CudaStep;
    type Rope = CudaRope<D>;
    type Vision = super::vision::CudaVision<D>;
    type Experts = moe::CudaExperts<D>;
    /// One linear-attention layer's state slots (kernels/delta_net.cu).
    type State = delta_net::CudaState<D>;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn upload_weight(&self, t: HostTensor) -> Result<CudaWeight<D>> {
        let dtype = if t.shape.len() >= 2 {
            ElemType::BF16
        } else {
            ElemType::F32
        };
        self.upload_as(t, dtype)
    }

    /// Kept in f32 (kernels/moe.cu's router reads it so).
    fn upload_router(&self, t: HostTensor) -> Result<CudaWeight<D>> {
        self.upload_as(t, ElemType::F32)
    }

    /// A `[rank, in]` and Bᵀ `[rank, out]`, both bf16 (see kernels/lora.cu).
    fn upload_lora_pair(
        &self,
        a: HostTensor,
        b: HostTensor,
        _dtype: DType,
    ) -> Result<(CudaWeight<D>, CudaWeight<D>)> {
        Ok((
            self.upload_weight(a)?,
            self.upload_weight(lora::transpose_b(b))?,
        ))
    }

    fn register_lora(
        &self,
        id: u64,
        pairs: &LoraPairs<'_, Self>,
    ) -> Result<Option<LoraRegistration>> {
        let slot = lock(&self.lora).register(id, pairs)?;
        Ok(Some(Box::new(lora::Registration {
            table: self.lora.clone(),
            slot,
            id,
        })))
    }

    fn weight_bytes(&self, w: &CudaWeight<D>) -> usize {
        w.mem.bytes()
    }

    fn memory_info(&self) -> Result<Option<(usize, usize)>> {
        self.dev.memory_info().map(Some).map_err(cuda_err)
    }

    fn graph_keys(
        &self,
        max_seqs: usize,
        max_blocks: usize,
    ) -> Vec<lmi_engine_core::backend::GraphKey> {
        if lock(&self.graphs).enabled() {
            step::graph_keys(max_seqs, max_blocks)
        } else {
            Vec::new()
        }
    }

    fn graph_stats(&self) -> Option<lmi_engine_core::backend::GraphStats> {
        Some(lock(&self.graphs).stats())
    }

    fn finish_warmup(&self) -> Result<()> {
        lock(&self.arena).seal()
    }

    fn rope_table(&self, inv_freq: &[f64]) -> Result<CudaRope<D>> {
        CudaRope::upload(&self.dev, inv_freq)
    }

    fn upload_vision(
        &self,
        tower: &lmi_engine_core::vision::VisionTower,
    ) -> Result<Option<super::vision::CudaVision<D>>> {
        // Qwen3-VL's tower (learned positions, GELU-tanh MLP, DeepStack mergers) and Gemma 4's
        // have no GPU kernels yet: they run on the host, as with `vision_on_host`.
        if matches!(
            tower.config().variant,
            lmi_engine_core::vision::VisionVariant::Qwen3Vl
                | lmi_engine_core::vision::VisionVariant::Gemma4
        ) {
            return Ok(None);
        }
        super::vision::CudaVision::upload(self, tower).map(Some)
    }

    fn encode_vision(
        &self,
        vision: Option<&super::vision::CudaVision<D>>,
        tower: &lmi_engine_core::vision::VisionTower,
        input: &lmi_engine_core::vision::VisionInput,
    ) -> Result<Vec<f32>> {
        match vision {
            Some(v) => v.forward(self, tower, input),
            // Kept on the host (`EngineOptions::vision_on_host`): the CPU backend's tower.
            None => lmi_engine_cpu::vision::forward(tower, input),
        }
    }

    fn mrope_table(&self, inv_freq: &[f64], components: &[u8]) -> Result<CudaRope<D>> {
        CudaRope::upload_mrope(&self.dev, inv_freq, components)
    }

    /// Uploads the rows and their embeddings into the step arena, then scatters them: host
    /// copies inside the forward pass, which is why such steps are never graphs
    /// (`BatchLayout::host_embeds`).
    fn write_rows(&self, dst: &mut CudaBuf, width: usize, rows: &[u32], src: &[f32]) -> Result<()> {
        self.scatter_rows("scatter_rows_f32", dst, width, rows, src)
    }

    fn add_rows(&self, dst: &mut CudaBuf, width: usize, rows: &[u32], src: &[f32]) -> Result<()> {
        self.scatter_rows("scatter_add_rows_f32", dst, width, rows, src)
    }

    fn alloc_kv(&self, cfg: &KvCacheConfig) -> Result<CudaKv<D>> {
        if cfg.dtype != DType::BF16 {
            return Err(EngineError::Backend(format!(
                "the CUDA backend keeps the KV cache in bf16, not {}",
                cfg.dtype
            )));
        }
        // Not zeroed: attention reads only the slots a step has written (keys past a context
        // are zeros in registers, never loaded), and the emulator's poison proves it.
        Ok(CudaKv {
            mem: DeviceBox::new(&self.dev, cfg.layer_elems() * 2)?,
        })
    }

    fn prepare_layout(&self, layout: BatchLayout) -> BatchLayout {
        step::pad_decode(layout)
    }

    fn window_pools(&self) -> bool {
        true
    }

    fn window_step(&self, step: &CudaStep) -> Option<CudaStep> {
        step.on_window()
    }

    fn upload_step(&self, layout: &BatchLayout) -> Result<CudaStep> {
        self.steps_uploaded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lora = {
            let table = lock(&self.lora);
            step::lora_entries(layout, |id| table.slot_of(id))?
        };
        lock(&self.arena).reset()?;
        let mut bufs = lock(&self.steps);
        let bufs = &mut *bufs;
        let tiles = step::pack(layout, lora.as_ref(), &mut bufs.staging);
        let need = bufs.staging.bytes.len().max(16);
        if bufs.block.as_ref().is_none_or(|b| b.bytes() < need) {
            bufs.block = None;
            bufs.block = Some(DeviceBox::new(
                &self.dev,
                need.next_power_of_two().max(64 << 10),
            )?);
            bufs.epoch += 1;
        }
        let base = bufs.block.as_ref().map(|b| b.ptr()).unwrap_or_default();
        self.dev.htod(&bufs.staging.bytes, base).map_err(cuda_err)?;
        Ok(step::view(layout, &bufs.staging, &tiles, lora, base))
    }

    fn alloc(&self, len: usize) -> Result<CudaBuf> {
        self.arena_alloc(len, ElemType::F32)
    }

    fn alloc_matmul_input(&self, len: usize) -> Result<CudaBuf> {
        self.arena_alloc(len, ElemType::BF16)
    }

    fn embedding(&self, table: &CudaWeight<D>, step: &CudaStep, out: &mut CudaBuf) -> Result<()> {
        let (vocab, width) = (table.shape[0], table.shape[1]);
        self.launch(
            "embedding_bf16",
            LaunchConfig::linear(step.num_tokens as u32, row_threads(width).min(256)),
            &[
                out.ptr.into(),
                table.ptr().into(),
                step.token_ids.into(),
                (width as u32).into(),
                (vocab as u32).into(),
            ],
        )
    }

    fn linear(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &CudaWeight<D>,
        bias: Option<&CudaWeight<D>>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        self.gemm(x, rows, w, out)?;
        if let Some(b) = bias {
            let n = w.shape[0];
            self.launch(
                "add_bias_f32",
                rows_cols(rows, n)?,
                &[
                    out.ptr.into(),
                    b.ptr().into(),
                    (n as u32).into(),
                    ((rows * n) as u64).into(),
                ],
            )?;
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &CudaWeight<D>,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let width = w.shape[0];
        self.launch(
            norm_kernel(out, "rms_norm_f32", "rms_norm_bf16"),
            LaunchConfig::linear(rows as u32, row_threads(width)),
            &[
                out.ptr.into(),
                x.ptr.into(),
                w.ptr().into(),
                (width as u32).into(),
                eps.into(),
            ],
        )
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaBuf,
        delta: &CudaBuf,
        rows: usize,
        w: &CudaWeight<D>,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let width = w.shape[0];
        self.launch(
            norm_kernel(out, "add_rms_norm_f32", "add_rms_norm_bf16"),
            LaunchConfig::linear(rows as u32, row_threads(width)),
            &[
                out.ptr.into(),
                residual.ptr.into(),
                delta.ptr.into(),
                w.ptr().into(),
                (width as u32).into(),
                eps.into(),
            ],
        )
    }

    fn add(&self, residual: &mut CudaBuf, delta: &CudaBuf, len: usize) -> Result<()> {
        self.launch(
            "add_f32",
            elementwise(len),
            &[residual.ptr.into(), delta.ptr.into(), (len as u64).into()],
        )
    }

    fn head_rms_norm(
        &self,
        qkv: &mut CudaBuf,
        rows: usize,
        layout: QkvLayout,
        first_head: usize,
        n_heads: usize,
        w: &CudaWeight<D>,
        eps: f32,
    ) -> Result<()> {
        let cfg = LaunchConfig {
            grid: (rows as u32, n_heads as u32, 1),
            block: (row_threads(layout.head_dim * 4).min(256), 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(
            "head_rms_norm",
            cfg,
            &[
                qkv.ptr.into(),
                w.ptr().into(),
                (layout.row_width() as u32).into(),
                (first_head as u32).into(),
                (layout.head_dim as u32).into(),
                eps.into(),
            ],
        )
    }

    fn span_rms_norm(
        &self,
        x: &mut CudaBuf,
        rows: usize,
        row_width: usize,
        offset: usize,
        w: &CudaWeight<D>,
        eps: f32,
    ) -> Result<()> {
        let width = w.shape[0];
        if offset + width > row_width || x.dtype != ElemType::F32 || x.len < rows * row_width {
            return Err(EngineError::Backend(format!(
                "span_rms_norm: columns {offset}..{} of {rows} f32 rows {row_width} wide \
                 (the buffer: {} {:?})",
                offset + width,
                x.len,
                x.dtype
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        self.launch(
            "span_rms_norm",
            LaunchConfig::linear(rows as u32, row_threads(width)),
            &[
                x.ptr.into(),
                w.ptr().into(),
                (row_width as u32).into(),
                (offset as u32).into(),
                (width as u32).into(),
                eps.into(),
            ],
        )
    }

    fn rope(
        &self,
        qkv: &mut CudaBuf,
        step: &CudaStep,
        layout: QkvLayout,
        rope: &CudaRope<D>,
    ) -> Result<()> {
        rope::rope(self, qkv, step, layout, rope)
    }

    fn qk_norm_rope_write_kv(
        &self,
        qkv: &mut CudaBuf,
        _tokens: usize,
        step: &CudaStep,
        layout: QkvLayout,
        qk_norm: Option<QkNorm<'_, Self>>,
        rope: &CudaRope<D>,
        k_cache: &mut CudaKv<D>,
        v_cache: &mut CudaKv<D>,
    ) -> Result<()> {
        let norm = qk_norm.map(|n| (n.q, n.k, n.eps));
        rope::qk_norm_rope_write_kv(self, qkv, step, layout, norm, rope, k_cache, v_cache)
    }

    fn write_kv(
        &self,
        qkv: &CudaBuf,
        step: &CudaStep,
        layout: QkvLayout,
        k_cache: &mut CudaKv<D>,
        v_cache: &mut CudaKv<D>,
    ) -> Result<()> {
        if step.num_tokens == 0 || layout.kv_heads == 0 {
            return Ok(());
        }
        u32_arg("a QKV row", layout.row_width())?;
        let cfg = LaunchConfig {
            grid: (step.num_tokens as u32, layout.kv_heads as u32, 1),
            block: (row_threads(layout.head_dim * 4).min(256), 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(
            "write_kv",
            cfg,
            &[
                k_cache.ptr().into(),
                v_cache.ptr().into(),
                qkv.ptr.into(),
                step.slots.into(),
                (layout.row_width() as u32).into(),
                (layout.q_heads as u32).into(),
                (layout.kv_heads as u32).into(),
                (layout.head_dim as u32).into(),
            ],
        )
    }

    fn attention(
        &self,
        qkv: &CudaBuf,
        step: &CudaStep,
        layout: QkvLayout,
        k_cache: &CudaKv<D>,
        v_cache: &CudaKv<D>,
        scoring: AttnScoring<'_, CudaWeight<D>>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let sinks = match scoring.sinks {
            Some(w) if w.dtype != ElemType::F32 || w.shape != [layout.q_heads] => {
                return Err(EngineError::Backend(format!(
                    "attention sinks are {:?} {:?}, expected [{}] f32",
                    w.shape, w.dtype, layout.q_heads
                )));
            }
            w => w.map(|w| w.ptr()),
        };
        attention::run(
            self,
            qkv,
            step,
            layout,
            k_cache.ptr(),
            v_cache.ptr(),
            scoring.scale,
            scoring.window,
            sinks,
            scoring.through,
            out,
        )
    }

    fn scale(&self, x: &mut CudaBuf, len: usize, s: f32) -> Result<()> {
        self.launch(
            "scale_f32",
            elementwise(len),
            &[x.ptr.into(), s.into(), (len as u64).into()],
        )
    }

    fn gelu_tanh_mul(
        &self,
        gate_up: &CudaBuf,
        rows: usize,
        width: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let kernel = norm_kernel(out, "gelu_tanh_mul_f32", "gelu_tanh_mul_bf16");
        self.gated(kernel, gate_up, rows, width, out)
    }

    fn gelu_tanh_mul_slice(
        &self,
        x: &mut CudaBuf,
        other: &CudaBuf,
        rows: usize,
        width: usize,
        stride: usize,
        offset: usize,
    ) -> Result<()> {
        let n = rows * width;
        if x.dtype != ElemType::F32
            || other.dtype != ElemType::F32
            || x.len < n
            || offset + width > stride
            || other.len < rows * stride
        {
            return Err(EngineError::Backend(format!(
                "gelu_tanh_mul_slice: {rows} rows of {width} ({} {:?}) against columns \
                 {offset}..{} of rows {stride} wide ({} {:?})",
                x.len,
                x.dtype,
                offset + width,
                other.len,
                other.dtype
            )));
        }
        if n == 0 {
            return Ok(());
        }
        self.launch(
            "gelu_tanh_mul_slice_f32",
            rows_cols(rows, width)?,
            &[
                x.ptr.into(),
                other.ptr.into(),
                (width as u32).into(),
                (stride as u32).into(),
                (offset as u32).into(),
                (n as u64).into(),
            ],
        )
    }

    fn softcap(&self, x: &mut CudaBuf, len: usize, cap: f32) -> Result<()> {
        self.launch(
            "softcap_f32",
            elementwise(len),
            &[x.ptr.into(), cap.into(), (len as u64).into()],
        )
    }

    /// attention.rs's and rope.rs's bound.
    fn max_head_dim(&self) -> Option<usize> {
        Some(attention::MAX_HEAD_DIM.min(super::rope::MAX_HEAD_DIM))
    }

    fn supports(&self, feature: Feature) -> bool {
        match feature {
            Feature::SlidingWindow
            | Feature::Gemma
            | Feature::Experts
            | Feature::AttentionSinks
            | Feature::DeepStack
            | Feature::LinearAttention
            | Feature::Encoder
            | Feature::LatentAttention
            | Feature::Gemma4 => true,
            Feature::SpanNorm => true,
            Feature::BidirectionalImages => true,
        }
    }

    fn layer_norm(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &CudaWeight<D>,
        b: &CudaWeight<D>,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        encoder::layer_norm(self, x, rows, w, b, eps, out)
    }

    fn gelu(&self, x: &mut CudaBuf, len: usize, tanh: bool) -> Result<()> {
        encoder::gelu(self, x, len, tanh)
    }

    fn gather_add(&self, table: &CudaWeight<D>, ids: &[u32], out: &mut CudaBuf) -> Result<()> {
        encoder::gather_add(self, table, ids, out)
    }

    fn encoder_attention(
        &self,
        qkv: &CudaBuf,
        cu: &[u32],
        heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        encoder::attention(self, qkv, cu, heads, head_dim, scale, out)
    }

    fn alloc_states(&self, cfg: &StateConfig) -> Result<Vec<delta_net::CudaState<D>>> {
        delta_net::alloc(self, cfg)
    }

    fn copy_states(
        &self,
        state: &mut delta_net::CudaState<D>,
        _cfg: &StateConfig,
        pairs: &[(u32, u32)],
    ) -> Result<()> {
        delta_net::copy(self, state, pairs)
    }

    fn gated_delta_net(
        &self,
        proj: &CudaBuf,
        step: &CudaStep,
        layer: DeltaNet<'_, Self>,
        state: &mut delta_net::CudaState<D>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        delta_net::forward(self, proj, step, &layer, state, out)
    }

    fn mla_qkv(
        &self,
        q: &CudaBuf,
        kva: &CudaBuf,
        step: &CudaStep,
        dims: MlaDims,
        kv_norm: &CudaWeight<D>,
        w_uk: &[CudaWeight<D>],
        eps: f32,
        rope: &CudaRope<D>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let w_uk = mla::one_flat("W_UK", w_uk)?;
        mla::qkv(self, q, kva, step, dims, kv_norm, w_uk, eps, rope, out)
    }

    fn mla_attention(
        &self,
        qkv: &CudaBuf,
        step: &CudaStep,
        dims: MlaDims,
        k_cache: &CudaKv<D>,
        v_cache: &CudaKv<D>,
        w_uv: &[CudaWeight<D>],
        scale: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let w_uv = mla::one_flat("W_UV", w_uv)?;
        mla::attention(self, qkv, step, dims, k_cache, v_cache, w_uv, scale, out)
    }

    fn sigmoid_mul(&self, x: &mut CudaBuf, gate: &CudaBuf, len: usize) -> Result<()> {
        delta_net::sigmoid_mul(self, x, gate, len)
    }

    fn index_experts(
        &self,
        layer: &lmi_engine_core::moe::MoeLayer<CudaWeight<D>>,
    ) -> Result<moe::CudaExperts<D>> {
        moe::index(self, layer)
    }

    fn moe(
        &self,
        x: &CudaBuf,
        rows: usize,
        hidden: usize,
        layer: &lmi_engine_core::moe::MoeLayer<CudaWeight<D>>,
        experts: &moe::CudaExperts<D>,
        out: &mut CudaBuf,
    ) -> Result<()> {
        moe::forward(self, x, rows, hidden, layer, experts, out)
    }

    fn silu_mul(
        &self,
        gate_up: &CudaBuf,
        rows: usize,
        width: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let kernel = norm_kernel(out, "silu_mul_f32", "silu_mul_bf16");
        self.gated(kernel, gate_up, rows, width, out)
    }

    fn silu_mul_linear(
        &self,
        gate_up: &CudaBuf,
        rows: usize,
        width: usize,
        w: &CudaWeight<D>,
        act: &mut CudaBuf,
        keep_act: bool,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let n = w.shape[0];
        let limit = self
            .fused_down_rows
            .load(std::sync::atomic::Ordering::Relaxed);
        let fused = rows > 0
            && rows <= limit
            && w.dtype == ElemType::BF16
            && w.shape[1] == width
            && width.is_multiple_of(8)
            && act.dtype == ElemType::BF16
            && out.dtype == ElemType::F32
            && gate_up.dtype == ElemType::F32;
        if !fused {
            self.silu_mul(gate_up, rows, width, act)?;
            return self.linear(act, rows, w, None, out);
        }
        if gate_up.len < rows * 2 * width || out.len < rows * n || act.len < rows * width {
            return Err(EngineError::Backend(format!(
                "down projection of {rows} rows [{width} -> {n}]: a buffer is too small"
            )));
        }
        // MD_BLOCK_COLS (16) columns per block of 256 threads.
        self.launch(
            "silu_mul_down_bf16",
            LaunchConfig {
                grid: (n.div_ceil(16) as u32, 1, 1),
                block: (256, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                out.ptr.into(),
                if keep_act { act.ptr } else { DevPtr::NULL }.into(),
                gate_up.ptr.into(),
                w.ptr().into(),
                (rows as u32).into(),
                (n as u32).into(),
                (width as u32).into(),
            ],
        )
    }

    /// One shrink and one expand launch for every row of the step, from the site's slot
    /// table; `groups` are only checked against it (the launches read the registered pairs).
    fn lora(
        &self,
        x: &CudaBuf,
        x_width: usize,
        step: &CudaStep,
        site: LoraSite,
        groups: &[LoraGroup<'_, Self>],
        out: &mut CudaBuf,
        out_width: usize,
        out_offset: usize,
    ) -> Result<()> {
        let unregistered = |what: String| {
            Err(EngineError::Backend(format!(
                "LoRA at layer {} {}: {what} (adapters must be uploaded and registered \
                 through LoraAdapter::upload)",
                site.layer,
                site.target.module()
            )))
        };
        let Some(rows) = &step.lora else {
            return match groups.is_empty() {
                true => Ok(()),
                false => unregistered("the step has no adapter rows".into()),
            };
        };
        let launch = {
            let table = lock(&self.lora);
            let Some(launch) = table.site(site) else {
                return match groups.is_empty() {
                    true => Ok(()),
                    false => unregistered("no registered adapter changes this projection".into()),
                };
            };
            for g in groups {
                let slot = rows.group_slots.get(g.group).copied();
                if !slot.is_some_and(|s| table.holds(site, s, g.a.ptr(), g.b.ptr())) {
                    return unregistered(format!(
                        "adapter group {} is not the pair registered in slot {slot:?}",
                        g.group
                    ));
                }
            }
            launch
        };
        if x_width != launch.x_width {
            return unregistered(format!(
                "the input is {x_width} wide, the registered pairs take {}",
                launch.x_width
            ));
        }
        lora::run(self, x, rows, &launch, out, out_width, out_offset)
    }

    fn gather_logit_rows(
        &self,
        x: &CudaBuf,
        step: &CudaStep,
        width: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let n = step.num_logits_rows * width;
        if n == 0 {
            return Ok(());
        }
        self.launch(
            "gather_rows_f32",
            rows_cols(step.num_logits_rows, width)?,
            &[
                out.ptr.into(),
                x.ptr.into(),
                step.logits_rows.into(),
                (width as u32).into(),
                (n as u64).into(),
            ],
        )
    }

    fn to_host(&self, buf: CudaBuf, len: usize) -> Result<Vec<f32>> {
        let len = len.min(buf.len);
        match buf.dtype {
            ElemType::F32 => self.dev.dtoh_vec::<f32>(buf.ptr, len).map_err(cuda_err),
            ElemType::BF16 => {
                let bits = self.dev.dtoh_vec::<u16>(buf.ptr, len).map_err(cuda_err)?;
                Ok(bits
                    .into_iter()
                    .map(|b| f32::from_bits((b as u32) << 16))
                    .collect())
            }
        }
    }

    fn process_logits(
        &self,
        logits: CudaBuf,
        rows: usize,
        vocab: usize,
        work: &LogitsWork<'_>,
    ) -> Result<LogitsOutput> {
        sampler::process(self, logits, rows, vocab, work)
    }

    fn run_graph<R: Clone + Send + 'static>(
        &self,
        step: &CudaStep,
        mut forward: impl FnMut() -> Result<R>,
    ) -> Result<R> {
        let epoch = self.epoch();
        let mut graphs = lock(&self.graphs);
        let key = step.graph_key;
        match graphs.plan(key, epoch) {
            Plan::Direct | Plan::WarmUp => {
                drop(graphs);
                forward()
            }
            Plan::Replay(c) => {
                let result = c.result.downcast_ref::<R>().cloned();
                if let Some(r) = result {
                    lock(&self.arena).restore(c.arena_mark);
                    self.dev.replay(&c.graph).map_err(cuda_err)?;
                    return Ok(r);
                }
                // A graph of this key returned another type: run directly.
                drop(graphs);
                forward()
            }
            Plan::Capture => {
                let Some(key) = key else { return forward() };
                let start = lock(&self.arena).mark();
                let captured = self.dev.begin_capture().map_err(cuda_err).and_then(|()| {
                    let r = forward();
                    let g = self.dev.end_capture().map_err(cuda_err);
                    Ok((r?, g?))
                });
                match captured {
                    Ok((r, graph)) => {
                        let arena_mark = lock(&self.arena).mark();
                        // Capture records the launches without running them.
                        self.dev.replay(&graph).map_err(cuda_err)?;
                        graphs.store(
                            key,
                            Captured {
                                graph,
                                result: Box::new(r.clone()),
                                arena_mark,
                                epoch,
                            },
                        );
                        Ok(r)
                    }
                    Err(e) => {
                        tracing::error!(
                            "capturing a CUDA graph for {key:?} failed ({e}); running such steps \
                             directly (slower)"
                        );
                        graphs.fail(key);
                        drop(graphs);
                        lock(&self.arena).restore(start);
                        forward()
                    }
                }
            }
        }
    }

    fn copy_blocks(
        &self,
        cache: &mut CudaKv<D>,
        cfg: &KvCacheConfig,
        pairs: &[(u32, u32)],
    ) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let ptr = self.upload_pairs(&self.copy_pairs, pairs)?;
        let block_elems = cfg.num_kv_heads * lmi_engine_core::kv::BLOCK_SIZE * cfg.head_dim;
        self.launch(
            "copy_blocks",
            LaunchConfig::linear(pairs.len() as u32, 256),
            &[cache.ptr().into(), ptr.into(), (block_elems as u32).into()],
        )
    }
}
