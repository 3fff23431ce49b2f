//! An engine = a backend + a loaded model + its paged KV pools. The scheduler drives it through
//! the object-safe [`StepEngine`] trait, so it never sees which backend runs underneath.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::dtype::DType;

use crate::backend::{Backend, GraphStats};
use crate::batch::{BatchLayout, SeqChunk};
use crate::error::Result;
use crate::kv::{KvCacheConfig, KvWindow};
use crate::lora::{LoraAdapter, LoraWeights};
use crate::model::InputEmbeds;
use crate::model::{KvCache, LoadOptions, Model};
use crate::state::{ChunkState, StateConfig};
use crate::step::{LogitsWork, StepBatch, StepOutput};
use crate::vision::EncoderCache;

mod media;
mod mtp;
mod pool;
pub mod warmup;

pub use media::EncoderStats;
pub use warmup::StepShape;

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// dtype of weight matrices in memory; None keeps the checkpoint's.
    pub dtype: Option<DType>,
    /// Bytes for the KV pools of all layers (ignored when `kv_blocks` is set).
    pub kv_cache_bytes: usize,
    /// Exact number of KV blocks (tests use tiny pools).
    pub kv_blocks: Option<usize>,
    /// On a GPU: the share of the device's memory the engine may take (weights, activations
    /// and the KV cache, which gets what the weights and an activation reserve leave). When
    /// None, or on the CPU, `kv_cache_bytes` sizes the cache.
    pub memory_fraction: Option<f32>,
    /// Read the weights from this GGUF (the model directory is its conversion: config and
    /// tokenizer); with `dtype` None its quantized blocks are used as they are.
    pub gguf: Option<std::path::PathBuf>,
    /// The largest step the scheduler will run: with `memory_fraction` on a GPU, the engine
    /// runs one at load to measure what it takes besides the KV cache, and captures the
    /// decode graphs up to it ([`warmup`]).
    pub max_step: StepShape,
    /// Run a vision-language model's vision tower on the host even where the backend could
    /// run it (a GPU): saves its device memory; tests compare the backends' language models
    /// with it on identical embeddings.
    pub vision_on_host: bool,
    /// Let sliding-window layers keep their K/V in pools of their own, sized to their windows
    /// ([`KvWindow`]), where the backend supports it and the model has local and global
    /// layers: the scheduler then gives their blocks back as they leave the window. False
    /// for an engine whose caller keeps one block table per sequence (a draft model).
    pub window_pools: bool,
    /// Models with linear-attention layers: recurrent-state slots, one per running sequence
    /// plus the prefix cache's snapshots. None: twice `max_step.seqs`, and at least 16.
    pub state_slots: Option<usize>,
    /// What the model is served for (LMI's `option.task`), overriding what its files say
    /// ([`lmi_checkpoint::pooling::PoolerInfo::read`]); None: as they say.
    pub task: Option<lmi_checkpoint::pooling::Task>,
    /// Load the checkpoint's multi-token-prediction layer, where it holds one, as a
    /// speculative draft ([`StepEngine::mtp`]); its K/V take a share of the cache's budget.
    pub mtp_draft: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            dtype: None,
            kv_cache_bytes: 1 << 30,
            kv_blocks: None,
            memory_fraction: None,
            gguf: None,
            max_step: StepShape::default(),
            vision_on_host: false,
            window_pools: true,
            state_slots: None,
            task: None,
            mtp_draft: false,
        }
    }
}

/// The logits of one forward pass: `rows` rows of `vocab` values, in the order of the step's
/// `logits_rows` (sequence by sequence). Only [`Engine::forward_logits`] returns them (tests,
/// diagnostics); serving goes through [`StepEngine::step`], which samples inside the engine.
#[derive(Debug, Clone)]
pub struct Logits {
    pub data: Vec<f32>,
    pub vocab: usize,
    /// How many rows each sequence of the step got (0, 1, or its chunk length).
    pub rows_per_seq: Vec<u32>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
    pub fn num_rows(&self) -> usize {
        self.data.len() / self.vocab.max(1)
    }
}

/// What the scheduler needs from an engine, whatever its backend.
pub trait StepEngine: Send {
    fn model_config(&self) -> &ModelConfig;
    fn backend_name(&self) -> &'static str;
    /// The weights' formats, as `/info` reports them (`bf16`, `q4_1`, `q4_k+q6_k`, ...).
    fn weights_format(&self) -> &str {
        "none"
    }
    fn num_blocks(&self) -> usize;
    /// The sliding-window layers' own pools, when the engine keeps them apart: chunks then
    /// carry a `window_table` of blocks in them.
    fn kv_window(&self) -> Option<KvWindow> {
        None
    }
    /// Which kernels run the matrix products of a step of `rows` token rows (reports).
    fn product_kernel(&self, rows: usize) -> String {
        let _ = rows;
        String::new()
    }
    /// Runs one ragged step: writes the chunks' K/V, then draws the requested tokens and
    /// scores the requested prompt tokens. Logits stay inside the engine.
    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput>;
    /// Copies whole KV blocks (copy-on-write of shared blocks).
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()>;
    /// Copies whole blocks of the sliding-window layers' own pools ([`Self::kv_window`]).
    fn copy_window_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        Err(crate::error::EngineError::Batch(
            "this engine keeps no window pools".into(),
        ))
    }
    /// The recurrent-state slots of a model with linear-attention layers (None for others):
    /// each chunk of a step then names its slot in [`StepBatch::states`].
    fn state_config(&self) -> Option<crate::state::StateConfig> {
        None
    }
    /// Copies whole state slots `src → dst`, in order, before a step (forks, prefix hits).
    fn copy_states(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        Err(crate::error::EngineError::Batch(
            "this engine keeps no recurrent states".into(),
        ))
    }
    /// An embedding or scoring model's pooling, dense modules and head (None for a
    /// generative model): its steps then carry [`StepBatch::pools`].
    fn pooler(&self) -> Option<&lmi_checkpoint::pooling::PoolerInfo> {
        None
    }
    /// The engine drafts with the checkpoint's multi-token-prediction head: its steps then
    /// carry [`StepBatch::mtp`] and return [`crate::step::StepOutput::drafts`].
    fn mtp(&self) -> bool {
        false
    }
    /// Bytes of weights a decode step streams (the roofline's numerator).
    fn weight_bytes(&self) -> usize;
    /// Bytes of weights a decode step of `tokens` tokens streams: more than
    /// [`Self::weight_bytes`] only for a mixture of experts, whose tokens read more experts.
    fn step_weight_bytes(&self, tokens: usize) -> usize {
        let _ = tokens;
        self.weight_bytes()
    }
    /// Bytes of every weight the engine holds (memory accounting; 0 when unknown).
    fn resident_weight_bytes(&self) -> usize {
        0
    }
    /// Tokens run through the model since load (prefix-cache tests count skipped work).
    fn tokens_computed(&self) -> u64;
    /// Uploads a LoRA adapter's host weights under `id` (the engine tier of the adapter
    /// cache); sequences name it in `SeqChunk::adapter`. Replaces an adapter already loaded
    /// under that id.
    fn load_adapter(&mut self, id: u64, weights: &LoraWeights) -> Result<()>;
    fn unload_adapter(&mut self, id: u64) -> bool;
    fn has_adapter(&self, id: u64) -> bool;
    /// The backend's CUDA graphs (None for backends without).
    fn graph_stats(&self) -> Option<GraphStats> {
        None
    }
    /// What the vision encoder has done since load (vision-language models).
    fn encoder_stats(&self) -> EncoderStats {
        EncoderStats::default()
    }
}

/// Bytes of vision embeddings the encoder cache keeps.
const ENCODER_CACHE_BYTES: usize = 256 << 20;

pub struct Engine<B: Backend> {
    backend: B,
    model: Model<B>,
    kv: KvCache<B>,
    weight_bytes: usize,
    tokens_computed: u64,
    adapters: HashMap<u64, LoraAdapter<B>>,
    encoder_cache: EncoderCache,
    encoder_stats: EncoderStats,
    /// An embedding or scoring model's pooler (its host head is the model's).
    pooler: Option<lmi_checkpoint::pooling::PoolerInfo>,
    /// The checkpoint's multi-token-prediction head, loaded as a draft.
    mtp: Option<mtp::MtpDraft<B>>,
}

impl<B: Backend> Engine<B> {
    pub fn load(backend: B, dir: &Path, opts: &EngineOptions) -> Result<Self> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let pooler = lmi_checkpoint::pooling::PoolerInfo::read(dir, &config, opts.task)?;
        let load = LoadOptions {
            dtype: opts.dtype,
            gguf: opts.gguf.clone(),
            vision_on_host: opts.vision_on_host,
            pooler: pooler.clone(),
        };
        let model = Model::load(&backend, dir, &load)?;
        let mtp_model = match opts.mtp_draft {
            true => Model::load_mtp(&backend, dir, &model.config, &load)?,
            false => None,
        };
        let c = &model.config;
        // The head's K/V pool is one more layer's, from the same budget.
        let mut sizing = c.clone();
        sizing.num_layers += usize::from(mtp_model.is_some());
        let kv_dtype = KvCacheConfig::dtype_for_weights(model.dtype);
        // On a device with its own memory, a share of it: sized by a measured warm-up step.
        let device_share = match (opts.kv_blocks, opts.memory_fraction) {
            (None, Some(f)) if backend.memory_info()?.is_some() => Some(f),
            _ => None,
        };
        let cpu_budget = match (opts.kv_blocks, device_share) {
            (None, None) => Some(opts.kv_cache_bytes),
            _ => None,
        };
        let states = state_config(c, opts, cpu_budget)?;
        // The state slots come out of the KV budget.
        let kv_budget = opts
            .kv_cache_bytes
            .saturating_sub(states.map_or(0, |s| s.bytes()));
        let num_blocks = match (opts.kv_blocks, device_share) {
            (Some(n), _) => n,
            (None, Some(_)) => warmup::warmup_blocks(opts.max_step),
            (None, None) => {
                KvCacheConfig::blocks_for_budget(&sizing, kv_dtype.size(), kv_budget).max(1)
            }
        };
        let cfg = KvCacheConfig::new(c, num_blocks, kv_dtype);
        // Pools of several widths (Gemma 4) size their window pools themselves; the uniform
        // pools' window plan counts every layer as a pool, so it is only made for those.
        let kv = match model.kv_pools() {
            Some((geometry, local)) => {
                let share = device_share.is_some();
                crate::model::geometry_kv(&backend, c, opts, share, cfg, geometry, local)?
            }
            None => match window_pools(c, opts, &backend, device_share.is_some(), cfg) {
                Some((window, global_blocks, local)) => {
                    let cfg = KvCacheConfig {
                        num_blocks: global_blocks,
                        ..cfg
                    };
                    KvCache::with_window(&backend, cfg, window, local)?
                }
                None => KvCache::new(&backend, cfg)?,
            },
        };
        let kv = match states {
            Some(s) => kv.with_states(&backend, s)?,
            None => kv,
        };
        let weight_bytes = model.weight_bytes(&backend);
        let mtp = match mtp_model {
            Some(m) => {
                tracing::info!(
                    "drafting with the checkpoint's multi-token-prediction layer ({})",
                    m.weights
                );
                Some(mtp::MtpDraft::new(
                    &backend,
                    m,
                    kv.cfg.num_blocks,
                    kv_dtype,
                )?)
            }
            None => None,
        };
        let layers = c.num_layers;
        let mut engine = Engine {
            backend,
            model,
            kv,
            weight_bytes,
            tokens_computed: 0,
            adapters: HashMap::new(),
            encoder_cache: EncoderCache::new(ENCODER_CACHE_BYTES),
            encoder_stats: EncoderStats::default(),
            pooler,
            mtp,
        };
        if let Some(fraction) = device_share {
            let blocks = engine.measure_kv_blocks(opts.max_step, fraction)?;
            // The head's pool takes one layer's share of what the target's would have.
            let blocks = match engine.mtp {
                Some(_) => blocks * layers / (layers + 1),
                None => blocks,
            };
            engine.replace_kv(blocks)?;
            engine.capture_graphs(opts.max_step)?;
            engine.tokens_computed = 0;
        }
        Ok(engine)
    }

    /// The sliding-window layers' pools, if kept apart.
    pub(crate) fn window(&self) -> Option<KvWindow> {
        self.kv.window.as_ref().map(|(w, _)| *w)
    }

    /// Lays out `chunks`, with their window tables where the cache keeps window pools.
    fn layout(&self, chunks: &[SeqChunk]) -> Result<BatchLayout> {
        let mut layout = BatchLayout::new(chunks, self.kv.cfg.num_blocks)?;
        if let Some(w) = self.window() {
            layout.window = Some(layout.window_tables(chunks, w.blocks, w.size)?);
        }
        Ok(layout)
    }

    /// Bytes of every KV pool.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// The global layers' blocks `budget` bytes hold beside the window pools.
    pub(crate) fn global_blocks_for(&self, budget: usize) -> usize {
        self.kv.global_blocks_for(budget)
    }

    pub(crate) fn kv_config(&self) -> KvCacheConfig {
        self.kv.cfg
    }

    /// Swaps in a KV cache of `num_blocks` (the current one freed first).
    pub(crate) fn replace_kv(&mut self, num_blocks: usize) -> Result<()> {
        let cfg = KvCacheConfig {
            num_blocks,
            ..self.kv.cfg
        };
        let window = self.kv.window.take();
        let states = self.kv.state_cfg;
        let geometry = self.kv.geometry.take();
        self.kv = KvCache::empty(self.kv.cfg);
        self.kv = match (geometry, window) {
            (Some(g), w) => KvCache::with_geometry(&self.backend, cfg, w, g)?,
            (None, Some((w, local))) => KvCache::with_window(&self.backend, cfg, w, local)?,
            (None, None) => KvCache::new(&self.backend, cfg)?,
        };
        if let Some(s) = states {
            self.kv = std::mem::replace(&mut self.kv, KvCache::empty(cfg))
                .with_states(&self.backend, s)?;
        }
        if let Some(m) = &mut self.mtp {
            m.resize(&self.backend, num_blocks)?;
        }
        Ok(())
    }

    /// One forward pass over `chunks` on the device (replayed from a graph when the backend
    /// has one for the shape), with nothing read back: the load-time graph capture.
    pub(crate) fn run_device_pass(&mut self, chunks: &[SeqChunk]) -> Result<()> {
        let layout = self.layout(chunks)?;
        let layout = self.backend.prepare_layout(layout);
        let (model, backend, kv, adapters) =
            (&self.model, &self.backend, &mut self.kv, &self.adapters);
        backend.run_forward(|| {
            let step = backend.upload_step(&layout)?;
            backend
                .run_graph(&step, || {
                    model.forward(backend, &layout, &step, kv, adapters, None)
                })
                .map(|_| ())
        })
    }

    /// A step's layout, with M-RoPE positions and media embeddings where the model has them.
    fn prepare(
        &mut self,
        chunks: &[SeqChunk],
        media: &[crate::batch::ChunkMedia],
        rope_deltas: &[i64],
        states: &[ChunkState],
    ) -> Result<(BatchLayout, Option<InputEmbeds>)> {
        let mut layout = self.layout(chunks)?;
        if let Some(cfg) = self.kv.state_cfg {
            let tokens: Vec<usize> = chunks.iter().map(|c| c.tokens.len()).collect();
            crate::state::check_states(states, &tokens, cfg.slots)?;
            layout.states = states.to_vec();
        }
        if self.model.config.mrope_section.is_some() {
            let frame_items = self.model.config.mrope_interleaved;
            media::rope_positions(chunks, media, rope_deltas, frame_items, &mut layout)?;
        }
        let embeds = if media.is_empty() {
            None
        } else {
            let (model, backend) = (&self.model, &self.backend);
            let encode = |input: &crate::vision::VisionInput| -> Result<Vec<f32>> {
                let tower = model.vision.as_ref().ok_or_else(|| {
                    crate::error::EngineError::Batch("this model has no vision tower".into())
                })?;
                backend.encode_vision(model.vision_device.as_ref(), tower, input)
            };
            let encode: Option<media::Encode<'_>> = model.vision.is_some().then_some(&encode);
            let hidden = self.model.config.hidden_size;
            let width = self
                .model
                .config
                .vision
                .as_ref()
                .map_or(hidden, |v| v.output_width());
            Some(media::media_embeds(
                encode,
                &mut self.encoder_cache,
                media,
                &layout,
                (hidden, width),
                &mut self.encoder_stats,
            )?)
        };
        layout.host_embeds = embeds.as_ref().is_some_and(|e| !e.rows.is_empty());
        Ok((layout, embeds))
    }

    pub fn model(&self) -> &Model<B> {
        &self.model
    }

    /// [`StepEngine::step`], and with `mtp_logits` the multi-token-prediction head's logits
    /// at every row it reads (a test of its arithmetic; the head then drafts nothing).
    pub fn step_with(
        &mut self,
        batch: &StepBatch<'_>,
        mtp_logits: bool,
    ) -> Result<(StepOutput, Vec<f32>)> {
        let (mut layout, embeds) =
            self.prepare(batch.chunks, batch.media, batch.rope_deltas, batch.states)?;
        let pool_rows = pool::layout_pools(batch, &mut layout, self.model.head.as_ref())?;
        let work = LogitsWork::new(batch, &layout)?;
        // The chunks the head reads return their rows' hidden states, as pooled rows.
        let mtp_rows = match (&self.mtp, batch.mtp.is_empty()) {
            (_, true) => 0,
            (Some(_), false) if pool_rows == 0 => mtp::pool_rows(batch, &mut layout)?,
            _ => {
                return Err(crate::error::EngineError::Batch(
                    "this engine has no multi-token-prediction head (or the step pools)".into(),
                ));
            }
        };
        let pooled_rows = pool_rows + mtp_rows;
        let tokens = layout.num_tokens();
        // A step with pooled sequences runs directly (never padded or replayed from a decode
        // graph): its pool rows sit past the logits rows a graph would return.
        let layout = match pooled_rows {
            0 => self.backend.prepare_layout(layout),
            _ => layout,
        };
        let (model, backend, kv, adapters) =
            (&self.model, &self.backend, &mut self.kv, &self.adapters);
        let (vocab, hidden) = (model.config.vocab_size, model.config.hidden_size);
        let rows = layout.logits_rows.len();
        let (out, states, sample_time) = backend.run_forward(|| {
            let step = backend.upload_step(&layout)?;
            let embeds = embeds.as_ref();
            let (logits, pooled) = match pooled_rows {
                0 => {
                    let logits = backend.run_graph(&step, || {
                        model.forward(backend, &layout, &step, kv, adapters, embeds)
                    })?;
                    (logits, None)
                }
                p => model.forward_pooled(backend, &layout, &step, kv, adapters, embeds, p)?,
            };
            let t = Instant::now();
            let out = match logits {
                Some(buf) => backend.process_logits(buf, rows - pooled_rows, vocab, &work)?,
                None => Default::default(),
            };
            let states = match pooled {
                Some(buf) => backend.to_host(buf, rows * hidden)?,
                None => Vec::new(),
            };
            Ok::<_, crate::error::EngineError>((out, states, t.elapsed()))
        })?;
        self.tokens_computed += tokens as u64;
        let mut head_logits = Vec::new();
        let drafts = match &mut self.mtp {
            Some(m) if mtp_rows > 0 => {
                let hidden_rows = &states[(rows - mtp_rows) * hidden..];
                match mtp_logits {
                    true => {
                        head_logits = m.logits(&self.backend, batch, &out.samples, hidden_rows)?;
                        vec![Vec::new(); batch.mtp.len()]
                    }
                    false => m.run(&self.backend, batch, &out.samples, hidden_rows)?,
                }
            }
            _ => Vec::new(),
        };
        let mut output = LogitsWork::into_step_output(batch, out, sample_time);
        output.drafts = drafts;
        if let Some(head) = self.model.head.as_ref().filter(|_| pool_rows > 0) {
            output.pooled = pool::outputs(head, &states, hidden, pool_rows);
        }
        Ok((output, head_logits))
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Runs one forward pass and returns the requested logits on the host (no sampling):
    /// for tests that compare logits and for diagnostics.
    pub fn forward_logits(&mut self, chunks: &[SeqChunk]) -> Result<Logits> {
        self.forward_logits_media(chunks, &[], &[])
    }

    /// [`Self::forward_logits`] for a model with recurrent layers: each chunk's state slot.
    pub fn forward_logits_states(
        &mut self,
        chunks: &[SeqChunk],
        states: &[ChunkState],
    ) -> Result<Logits> {
        self.forward_logits_with(chunks, &[], &[], states)
    }

    /// [`Self::forward_logits`] for a step with media runs and M-RoPE deltas (as
    /// [`StepBatch::media`] and [`StepBatch::rope_deltas`]).
    pub fn forward_logits_media(
        &mut self,
        chunks: &[SeqChunk],
        media: &[crate::batch::ChunkMedia],
        rope_deltas: &[i64],
    ) -> Result<Logits> {
        self.forward_logits_with(chunks, media, rope_deltas, &[])
    }

    /// [`Self::forward_logits_media`] for a model with recurrent layers: each chunk's state
    /// slot too (Qwen3.5 with images).
    pub fn forward_logits_media_states(
        &mut self,
        chunks: &[SeqChunk],
        media: &[crate::batch::ChunkMedia],
        rope_deltas: &[i64],
        states: &[ChunkState],
    ) -> Result<Logits> {
        self.forward_logits_with(chunks, media, rope_deltas, states)
    }

    fn forward_logits_with(
        &mut self,
        chunks: &[SeqChunk],
        media: &[crate::batch::ChunkMedia],
        rope_deltas: &[i64],
        states: &[ChunkState],
    ) -> Result<Logits> {
        let (layout, embeds) = self.prepare(chunks, media, rope_deltas, states)?;
        let rows_per_seq = layout.logits_per_seq.clone();
        let rows = layout.logits_rows.len();
        let tokens = layout.num_tokens();
        let layout = self.backend.prepare_layout(layout);
        let (model, backend, kv, adapters) =
            (&self.model, &self.backend, &mut self.kv, &self.adapters);
        let vocab = model.config.vocab_size;
        let data = backend.run_forward(|| {
            let step = backend.upload_step(&layout)?;
            let logits = backend.run_graph(&step, || {
                model.forward(backend, &layout, &step, kv, adapters, embeds.as_ref())
            })?;
            match logits {
                Some(buf) => backend.to_host(buf, rows * vocab),
                None => Ok(Vec::new()),
            }
        })?;
        self.tokens_computed += tokens as u64;
        Ok(Logits {
            data,
            vocab,
            rows_per_seq,
        })
    }
}

impl<B: Backend> StepEngine for Engine<B> {
    fn model_config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn graph_stats(&self) -> Option<GraphStats> {
        self.backend.graph_stats()
    }

    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    fn weights_format(&self) -> &str {
        &self.model.weights
    }

    fn product_kernel(&self, rows: usize) -> String {
        self.backend
            .product_kernel(rows, self.model.dtype == DType::I8)
    }

    fn num_blocks(&self) -> usize {
        self.kv.cfg.num_blocks
    }

    fn kv_window(&self) -> Option<KvWindow> {
        self.window()
    }

    fn step(&mut self, batch: &StepBatch<'_>) -> Result<StepOutput> {
        self.step_with(batch, false).map(|(out, _)| out)
    }

    fn mtp(&self) -> bool {
        self.mtp.is_some()
    }
    fn pooler(&self) -> Option<&lmi_checkpoint::pooling::PoolerInfo> {
        self.pooler.as_ref()
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        if let Some(m) = &mut self.mtp {
            m.kv.copy_blocks(&self.backend, pairs, false)?;
        }
        self.kv.copy_blocks(&self.backend, pairs, false)
    }

    fn copy_window_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        self.kv.copy_blocks(&self.backend, pairs, true)
    }

    fn state_config(&self) -> Option<crate::state::StateConfig> {
        self.kv.state_cfg
    }

    fn copy_states(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        self.kv.copy_states(&self.backend, pairs)
    }

    fn encoder_stats(&self) -> EncoderStats {
        self.encoder_stats
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn step_weight_bytes(&self, tokens: usize) -> usize {
        self.model.step_weight_bytes(&self.backend, tokens)
    }

    fn resident_weight_bytes(&self) -> usize {
        self.model.resident_bytes(&self.backend)
    }

    fn tokens_computed(&self) -> u64 {
        self.tokens_computed
    }

    fn load_adapter(&mut self, id: u64, weights: &LoraWeights) -> Result<()> {
        if self.model.config.linear_attn.is_some() {
            return Err(crate::error::EngineError::Batch(
                "LoRA adapters on Gated DeltaNet hybrids (Qwen3.5, Qwen3-Next) are not supported yet"
                    .into(),
            ));
        }
        if self.model.config.mla.is_some() {
            return Err(crate::error::EngineError::Batch(
                "LoRA adapters on latent-attention models (DeepSeek-V3, GLM-4.7-Flash) are not \
                 supported yet"
                    .into(),
            ));
        }
        if weights.layers.len() != self.model.config.num_layers {
            return Err(crate::error::EngineError::Batch(format!(
                "LoRA adapter {id} has {} layers, the model {}",
                weights.layers.len(),
                self.model.config.num_layers
            )));
        }
        let dtype = match self.model.dtype {
            DType::I8 => DType::BF16,
            d => d,
        };
        let a = LoraAdapter::upload(&self.backend, id, weights, dtype)?;
        self.adapters.insert(id, a);
        Ok(())
    }

    fn unload_adapter(&mut self, id: u64) -> bool {
        self.adapters.remove(&id).is_some()
    }

    fn has_adapter(&self, id: u64) -> bool {
        self.adapters.contains_key(&id)
    }
}

/// The sliding-window layers' own pools, when they are worth having: the backend supports
/// them, the caller keeps window tables, the model has local layers, and a full step's
/// windows need fewer blocks than the uniform pools hold. Returns the window pools, the
/// global layers' blocks (the freed budget goes to them; `kv_blocks` and a device share keep
/// theirs) and which layers are local. With every layer local (Mistral's window) the global
/// pools hold no layer: their blocks cost nothing and only number the sequences' positions
/// for the scheduler and the prefix cache, as many as the budget would have held for one
/// layer, so contexts are bounded by `max_model_len`, not by the KV memory.
fn window_pools<B: Backend>(
    c: &ModelConfig,
    opts: &EngineOptions,
    backend: &B,
    device_share: bool,
    cfg: KvCacheConfig,
) -> Option<(KvWindow, usize, Vec<bool>)> {
    let w = c.sliding_window.as_ref()?;
    let local = w.local.iter().filter(|&&l| l).count();
    if !opts.window_pools || !backend.window_pools() || local == 0 {
        return None;
    }
    let shape = opts.max_step;
    let blocks = KvWindow::blocks_for_step(w.size, shape.seqs.max(1), shape.tokens.max(1));
    // A device share sizes the global pools after a warm-up (`measure_kv_blocks`), from the
    // memory the window pools leave; otherwise they must save blocks now.
    if blocks >= cfg.num_blocks && !device_share {
        return None;
    }
    let global_blocks = match (opts.kv_blocks, device_share) {
        (None, false) => cfg
            .global_blocks(opts.kv_cache_bytes, blocks, local)
            .max(cfg.num_blocks),
        _ => cfg.num_blocks,
    };
    let window = KvWindow {
        blocks,
        size: w.size,
    };
    Some((window, global_blocks, w.local.clone()))
}

/// The state slots of a model with linear-attention layers: `state_slots`, else twice the
/// largest step's sequences (the running ones and as many prefix snapshots), at least 16 —
/// and, out of a byte budget (the CPU's KV budget), no more than half of it holds. A GPU's
/// budget is only known after the warm-up: it starts with at most 64 slots, whose bytes the
/// warm-up takes out of the KV cache's share.
fn state_config(
    c: &ModelConfig,
    opts: &EngineOptions,
    budget: Option<usize>,
) -> Result<Option<StateConfig>> {
    let Some(l) = c.linear_attn.as_ref() else {
        return Ok(None);
    };
    let mut cfg = StateConfig {
        slots: (2 * opts.max_step.seqs).max(16),
        layers: l.num_linear_layers(),
        slot_len: l.state_len(),
    };
    if let Some(n) = opts.state_slots {
        cfg.slots = n;
        return Ok(Some(cfg));
    }
    match budget {
        Some(b) => {
            let fit = b / 2 / cfg.slot_bytes().max(1);
            if fit < 2 {
                return Err(crate::error::EngineError::Backend(format!(
                    "the KV cache budget ({} MiB) holds fewer than two of this model's \
                     recurrent states ({} MiB each across its {} linear-attention layers) \
                     beside its K/V: raise the KV cache size (--kv-cache-bytes, \
                     option.kv_cache_bytes)",
                    b >> 20,
                    cfg.slot_bytes() >> 20,
                    cfg.layers
                )));
            }
            cfg.slots = cfg.slots.min(fit);
        }
        None => cfg.slots = cfg.slots.min(64),
    }
    Ok(Some(cfg))
}
