//! The Llama-family transformer (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2, their mixtures of
//! experts, and Gemma 3's variations on it), written once against [`Backend`].

mod gemma4;
mod gemma4_media;
mod linear_attn;
mod load;
mod mla;
mod mtp;
mod sigmoe;

use std::collections::HashMap;

use lmi_checkpoint::config::{Activation, ModelConfig};
use lmi_checkpoint::dtype::DType;

use crate::backend::{AttnScoring, Backend, LoraGroup, LoraSite, QkNorm, QkvLayout};
use crate::batch::BatchLayout;
use crate::error::Result;
use crate::kv::{KvCacheConfig, KvWindow};
use crate::lora::{LoraAdapter, Target};
use crate::moe::MoeLayer;
use crate::state::StateConfig;
use linear_attn::LinearAttn;

pub use gemma4::geometry_kv;
pub use load::LoadOptions;

pub(crate) struct Layer<B: Backend> {
    /// None where the layer has no norm before attention (OLMo 2/3).
    input_norm: Option<B::Weight>,
    /// How the layer mixes tokens: attention over the KV cache, or a linear-attention layer
    /// over its recurrent state.
    mixer: Mixer<B>,
    /// The norm before the MLP (HF's `post_attention_layernorm`, Gemma's
    /// `pre_feedforward_layernorm`); None where it has none (OLMo 2/3).
    post_norm: Option<B::Weight>,
    /// Gemma's norms of the attention's and of the MLP's output, before the residual add.
    attn_out_norm: Option<B::Weight>,
    mlp_out_norm: Option<B::Weight>,
    /// A local layer: attention over a sliding window, with the local RoPE.
    local: bool,
    mlp: Mlp<B::Weight, B::Experts>,
}

pub(crate) enum Mixer<B: Backend> {
    Attention(Attention<B>),
    Linear(LinearAttn<B>),
    /// Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash).
    Latent(mla::LatentAttn<B>),
}

pub(crate) struct Attention<B: Backend> {
    /// q, k and v projections fused into one `[q + 2 kv, hidden]` matrix.
    qkv: B::Weight,
    qkv_bias: Option<B::Weight>,
    q_norm: Option<B::Weight>,
    k_norm: Option<B::Weight>,
    /// `q_norm` and `k_norm` span the whole q and k projections (OLMo 2/3), not one head.
    qk_norm_whole: bool,
    /// A layer without RoPE (SmolLM3's NoPE layers): it turns by [`Model::rope_none`].
    no_rope: bool,
    o_proj: B::Weight,
    /// gpt-oss: the output projection's bias and each q head's sink logit.
    o_bias: Option<B::Weight>,
    sinks: Option<B::Weight>,
    /// Gated attention (Qwen3.5): the output gate's projection `[q_size, hidden]`; the
    /// attention's output is multiplied by its sigmoid before `o_proj`.
    gate: Option<B::Weight>,
    /// Which of the cache's K/V pools is this layer's.
    kv: usize,
}

impl<B: Backend> Mixer<B> {
    /// Bytes of the matrices a step reads.
    fn bytes(&self, w: &impl Fn(&B::Weight) -> usize) -> usize {
        let opt = |x: &Option<B::Weight>| x.as_ref().map_or(0, w);
        match self {
            Mixer::Attention(a) => {
                w(&a.qkv)
                    + w(&a.o_proj)
                    + opt(&a.gate)
                    + opt(&a.qkv_bias)
                    + opt(&a.q_norm)
                    + opt(&a.k_norm)
                    + opt(&a.o_bias)
                    + opt(&a.sinks)
            }
            Mixer::Linear(l) => l.bytes(w),
            Mixer::Latent(l) => l.bytes(w),
        }
    }
}

/// A layer's MLP: one SwiGLU, or a mixture of SwiGLU experts (and what the backend keeps
/// beside them, `X`: [`Backend::Experts`]).
pub(crate) enum Mlp<W, X> {
    Dense {
        /// gate and up projections fused into one `[2 · intermediate, hidden]` matrix.
        gate_up: W,
        down: W,
    },
    Moe(MoeLayer<W>, X),
}

pub struct Model<B: Backend> {
    pub config: ModelConfig,
    /// Element type of the matrices in memory (`I8` for any quantized format: then K/V and
    /// LoRA adapters are bf16).
    pub dtype: DType,
    /// The formats of the matrices, e.g. `bf16`, `q4_1`, `q4_k+q6_k`, `int8`.
    pub weights: String,
    embed: B::Weight,
    /// None when the embeddings are tied (the LM head reads `embed`).
    lm_head: Option<B::Weight>,
    final_norm: B::Weight,
    layers: Vec<Layer<B>>,
    rope: B::Rope,
    /// The local layers' RoPE (Gemma 3), where they have their own.
    rope_local: Option<B::Rope>,
    /// A table of zero frequencies (every angle 0: cos 1, sin 0 turn nothing, exactly) for
    /// layers without RoPE, so that they run the same launches as the others (one fused
    /// norm-RoPE-write op, the same CUDA graph nodes).
    rope_none: Option<B::Rope>,
    /// Token embeddings are multiplied by this (Gemma: sqrt(hidden), rounded to f32).
    embed_scale: Option<f32>,
    /// A vision-language model's vision tower (on the host).
    pub vision: Option<crate::vision::VisionTower>,
    /// The tower on the backend, where it runs there (CUDA); None runs `vision` on the host.
    pub vision_device: Option<B::Vision>,
    /// An embedding or scoring model's host head (Dense modules, Qwen3-Reranker's yes/no).
    pub head: Option<crate::pooler::HostHead>,
    /// Gemma 4's layers and what it adds (then `layers` is empty).
    gemma4: Option<gemma4::Gemma4Layers<B>>,
    /// A multi-token-prediction head's input stage ([`Model::load_mtp`]): this model is then
    /// the head, its one layer reading the target's hidden states beside the next tokens.
    mtp_front: Option<mtp::MtpFront<B>>,
}

impl<W, X> Mlp<W, X> {
    /// Bytes of the matrices a step of `tokens` tokens reads (`None`: all of them). A mixture
    /// reads its router, its shared expert and the experts its tokens pick, counted as if each
    /// picked `top_k` of `E` uniformly at random: `E · (1 - (1 - top_k / E)^tokens)`, `top_k`
    /// for one token.
    fn bytes(&self, w: &impl Fn(&W) -> usize, tokens: Option<usize>) -> usize {
        match self {
            Mlp::Dense { gate_up, down } => w(gate_up) + w(down),
            Mlp::Moe(m, _) => {
                let all: usize = m.experts.iter().map(|x| w(&x.gate_up) + w(&x.down)).sum();
                let read = match tokens {
                    None => all,
                    Some(t) => {
                        let e = m.experts.len().max(1) as f64;
                        let hit = e * (1.0 - (1.0 - m.top_k as f64 / e).powi(t as i32));
                        (all as f64 / e * hit).round() as usize
                    }
                };
                let shared = m.shared.as_ref().map_or(0, |s| {
                    w(&s.gate_up) + w(&s.down) + s.gate.as_ref().map_or(0, w)
                });
                w(&m.router) + shared + read
            }
        }
    }
}

/// A forward pass's logits and pooled states ([`Model::forward_pooled`]).
pub type PooledForward<B> = (Option<<B as Backend>::Buf>, Option<<B as Backend>::Buf>);

/// Embeddings that replace some tokens' (media placeholders'): `rows` of the step, `data`
/// `[rows.len(), hidden]` on the host.
#[derive(Debug, Default)]
pub struct InputEmbeds {
    pub rows: Vec<u32>,
    pub data: Vec<f32>,
    /// Each media run's place in `rows` (one item's consecutive rows), and whether it runs
    /// to the item's end.
    pub runs: Vec<MediaRun>,
    /// Qwen3-VL's DeepStack: `deepstack[k]` (`[rows.len(), hidden]`) is added to the same
    /// rows' hidden states after layer `k` (empty for other models).
    pub deepstack: Vec<Vec<f32>>,
    /// A multi-token-prediction head's other input ([`Model::load_mtp`]): per token of the
    /// step, `[tokens, hidden]`, the hidden state it continues (empty for other models).
    pub mtp_hidden: Vec<f32>,
}

/// One media item's rows in a step ([`InputEmbeds::runs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MediaRun {
    /// Its range of [`InputEmbeds::rows`].
    pub rows: std::ops::Range<usize>,
    /// The item's last token is in this step (its first ones may be in earlier steps or a
    /// prefix-cache hit).
    pub to_end: bool,
}

/// The paged K/V pools of every attention layer, and the linear-attention layers' state
/// slots beside them.
pub struct KvCache<B: Backend> {
    /// The pools of every layer, or of the global layers when the local ones have their own.
    pub cfg: KvCacheConfig,
    /// The local (sliding-window) layers' own pools, and which layers those are.
    pub window: Option<(KvWindow, Vec<bool>)>,
    layers: Vec<(B::Kv, B::Kv)>,
    /// The linear-attention layers' recurrent states, and their slots.
    pub state_cfg: Option<StateConfig>,
    states: Vec<B::State>,
    /// Per pool, its (KV heads, head width) where pools differ (Gemma 4's global layers);
    /// None: every pool is `cfg`'s.
    pub geometry: Option<Vec<(usize, usize)>>,
}

impl<B: Backend> KvCache<B> {
    pub fn new(backend: &B, cfg: KvCacheConfig) -> Result<Self> {
        let layers = backend.alloc_kv_layers(&cfg)?;
        Ok(KvCache {
            cfg,
            window: None,
            layers,
            state_cfg: None,
            states: Vec::new(),
            geometry: None,
        })
    }

    /// Adds state slots for the linear-attention layers (replacing any).
    pub fn with_states(mut self, backend: &B, cfg: StateConfig) -> Result<Self> {
        self.states = Vec::new();
        self.states = backend.alloc_states(&cfg)?;
        self.state_cfg = Some(cfg);
        Ok(self)
    }

    /// Copies whole state slots in every linear-attention layer, in order.
    pub fn copy_states(&mut self, backend: &B, pairs: &[(u32, u32)]) -> Result<()> {
        let Some(cfg) = self.state_cfg.filter(|_| !pairs.is_empty()) else {
            return Ok(());
        };
        if let Some(&(s, d)) = pairs
            .iter()
            .find(|&&(s, d)| s as usize >= cfg.slots || d as usize >= cfg.slots)
        {
            return Err(crate::error::EngineError::Batch(format!(
                "state copy {s} -> {d} is outside the {} slots",
                cfg.slots
            )));
        }
        for st in &mut self.states {
            backend.copy_states(st, &cfg, pairs)?;
        }
        Ok(())
    }

    /// Pools of `cfg.num_blocks` for the global layers and of `window.blocks` for the layers
    /// `local` marks.
    pub fn with_window(
        backend: &B,
        cfg: KvCacheConfig,
        window: KvWindow,
        local: Vec<bool>,
    ) -> Result<Self> {
        let count = local.iter().filter(|&&l| l).count();
        let global = backend.alloc_kv_layers(&KvCacheConfig {
            num_layers: cfg.num_layers - count,
            ..cfg
        })?;
        let windowed = backend.alloc_kv_layers(&KvCacheConfig {
            num_layers: count,
            num_blocks: window.blocks,
            ..cfg
        })?;
        let (mut global, mut windowed) = (global.into_iter(), windowed.into_iter());
        let layers = local
            .iter()
            .map(|&l| if l { windowed.next() } else { global.next() })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| crate::error::EngineError::Backend("KV pools missing".into()))?;
        Ok(KvCache {
            cfg,
            window: Some((window, local)),
            layers,
            state_cfg: None,
            states: Vec::new(),
            geometry: None,
        })
    }

    /// A cache holding no pools (a placeholder while one is replaced).
    pub fn empty(cfg: KvCacheConfig) -> Self {
        KvCache {
            cfg,
            window: None,
            layers: Vec::new(),
            state_cfg: None,
            states: Vec::new(),
            geometry: None,
        }
    }

    /// Pools of `geometry` (per pool: KV heads, head width), `cfg.num_blocks` each or, where
    /// `window` marks a pool local, the window's: Gemma 4's layers of two widths.
    pub fn with_geometry(
        backend: &B,
        cfg: KvCacheConfig,
        window: Option<(KvWindow, Vec<bool>)>,
        geometry: Vec<(usize, usize)>,
    ) -> Result<Self> {
        let mut kv = KvCache {
            window,
            geometry: Some(geometry),
            ..KvCache::empty(cfg)
        };
        kv.layers = (0..kv.pools())
            .map(|i| {
                let c = kv.pool_cfg(i);
                Ok((backend.alloc_kv(&c)?, backend.alloc_kv(&c)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(kv)
    }

    fn pools(&self) -> usize {
        self.geometry.as_ref().map_or(self.cfg.num_layers, Vec::len)
    }

    /// Pool `i`'s geometry and block count.
    pub fn pool_cfg(&self, i: usize) -> KvCacheConfig {
        let (num_kv_heads, head_dim) = self
            .geometry
            .as_ref()
            .map_or((self.cfg.num_kv_heads, self.cfg.head_dim), |g| g[i]);
        let num_blocks = match &self.window {
            Some((w, local)) if local[i] => w.blocks,
            _ => self.cfg.num_blocks,
        };
        KvCacheConfig {
            num_blocks,
            num_kv_heads,
            head_dim,
            num_layers: 1,
            ..self.cfg
        }
    }

    /// Bytes of every pool and state slot.
    pub fn bytes(&self) -> usize {
        if self.geometry.is_some() {
            let pools: usize = (0..self.pools())
                .map(|i| {
                    let c = self.pool_cfg(i);
                    c.num_blocks * c.layer_block_bytes()
                })
                .sum();
            return pools + self.state_cfg.map_or(0, |c| c.bytes());
        }
        let per_block = self.cfg.layer_block_bytes();
        let local = self.local_layers();
        (self.cfg.num_blocks * (self.cfg.num_layers - local)
            + self.window.as_ref().map_or(0, |(w, _)| w.blocks) * local)
            * per_block
            + self.state_cfg.map_or(0, |c| c.bytes())
    }

    /// The global layers' blocks that `budget` bytes hold beside the window pools.
    pub fn global_blocks_for(&self, budget: usize) -> usize {
        if self.geometry.is_some() {
            let (mut window, mut global) = (0, 0);
            for i in 0..self.pools() {
                let c = self.pool_cfg(i);
                match self.in_window_pool(i) {
                    true => window += c.num_blocks * c.layer_block_bytes(),
                    false => global += c.layer_block_bytes(),
                }
            }
            return budget.saturating_sub(window) / global.max(1);
        }
        let window_blocks = self.window.as_ref().map_or(0, |(w, _)| w.blocks);
        self.cfg
            .global_blocks(budget, window_blocks, self.local_layers())
    }

    /// How many layers keep their K/V in the window pools.
    fn local_layers(&self) -> usize {
        self.window
            .as_ref()
            .map_or(0, |(_, local)| local.iter().filter(|&&l| l).count())
    }

    /// Whether layer `i` keeps its K/V in the window pools.
    fn in_window_pool(&self, i: usize) -> bool {
        self.window.as_ref().is_some_and(|(_, local)| local[i])
    }

    /// Copies blocks of the global pools (`window` false) or of the window pools.
    pub fn copy_blocks(&mut self, backend: &B, pairs: &[(u32, u32)], window: bool) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        if window && self.window.is_none() {
            return Err(crate::error::EngineError::Batch(
                "window block copies for a cache without window pools".into(),
            ));
        }
        for i in 0..self.layers.len() {
            if self.in_window_pool(i) != window {
                continue;
            }
            let c = match self.geometry {
                Some(_) => self.pool_cfg(i),
                None => self.cfg,
            };
            let (k, v) = &mut self.layers[i];
            backend.copy_blocks(k, &c, pairs)?;
            backend.copy_blocks(v, &c, pairs)?;
        }
        Ok(())
    }
}

impl<B: Backend> Model<B> {
    /// Bytes a one-token decode step streams: every layer's matrices and the LM head (the
    /// embedding table itself when tied; an untied input table is only gathered from). Of a
    /// mixture of experts, the router and `top_k` experts (a token reads no others).
    pub fn weight_bytes(&self, backend: &B) -> usize {
        self.step_weight_bytes(backend, 1)
    }

    /// Gemma 4's K/V pools: their geometry and which are local (None for other models).
    pub fn kv_pools(&self) -> Option<gemma4::KvPools> {
        self.gemma4.as_ref().map(|g| g.pools(&self.config))
    }

    /// Bytes a decode step of `tokens` tokens streams: [`Self::weight_bytes`], with the experts
    /// a mixture reads for that many tokens ([`Mlp::bytes`]).
    pub fn step_weight_bytes(&self, backend: &B, tokens: usize) -> usize {
        let w = |x: &B::Weight| backend.weight_bytes(x);
        let opt = |x: &Option<B::Weight>| x.as_ref().map_or(0, w);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.mixer.bytes(&w)
                    + opt(&l.input_norm)
                    + opt(&l.post_norm)
                    + opt(&l.attn_out_norm)
                    + opt(&l.mlp_out_norm)
                    + l.mlp.bytes(&w, Some(tokens))
            })
            .sum();
        let gemma4 = self
            .gemma4
            .as_ref()
            .map_or(0, |g| g.bytes(&w, Some(tokens)));
        layers + gemma4 + w(self.lm_head.as_ref().unwrap_or(&self.embed))
    }

    /// Bytes of every weight held on the device.
    pub fn resident_bytes(&self, backend: &B) -> usize {
        let w = |x: &B::Weight| backend.weight_bytes(x);
        let opt = |x: &Option<B::Weight>| x.as_ref().map_or(0, w);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                opt(&l.input_norm)
                    + l.mixer.bytes(&w)
                    + opt(&l.post_norm)
                    + opt(&l.attn_out_norm)
                    + opt(&l.mlp_out_norm)
                    + l.mlp.bytes(&w, None)
            })
            .sum();
        let gemma4 = self.gemma4.as_ref().map_or(0, |g| g.bytes(&w, None));
        layers + gemma4 + w(&self.embed) + opt(&self.lm_head) + w(&self.final_norm)
    }

    fn qkv_layout(&self) -> QkvLayout {
        QkvLayout {
            q_heads: self.config.num_heads,
            kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// Runs one step over `layout` (uploaded as `step`) and returns the logits of its
    /// `logits_rows`, row-major `[logits_rows.len(), vocab]`, on the device; None when no
    /// row is wanted. Issues device work only (no host copies), so a backend may capture it.
    pub fn forward(
        &self,
        backend: &B,
        layout: &BatchLayout,
        step: &B::Step,
        kv: &mut KvCache<B>,
        adapters: &HashMap<u64, LoraAdapter<B>>,
        embeds: Option<&InputEmbeds>,
    ) -> Result<Option<B::Buf>> {
        self.forward_pooled(backend, layout, step, kv, adapters, embeds, 0)
            .map(|(logits, _)| logits)
    }

    /// [`Self::forward`] for a step whose last `pool_rows` of `logits_rows` are pooled
    /// sequences' last tokens: the logits of the rows before them, and the final-normed
    /// hidden states of every logits row, `[logits_rows.len(), hidden]` in f32 (None without
    /// pool rows). The pool rows get no LM head.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_pooled(
        &self,
        backend: &B,
        layout: &BatchLayout,
        step: &B::Step,
        kv: &mut KvCache<B>,
        adapters: &HashMap<u64, LoraAdapter<B>>,
        embeds: Option<&InputEmbeds>,
        pool_rows: usize,
    ) -> Result<PooledForward<B>> {
        if let Some(g) = &self.gemma4 {
            return g.forward(self, backend, layout, step, kv, embeds, pool_rows);
        }
        let c = &self.config;
        let n = layout.num_tokens();
        let hidden = c.hidden_size;
        let ql = self.qkv_layout();
        let eps = c.rms_norm_eps as f32;
        let scale = c.attention_scale();
        let scale_local = c.attention_scale_local();
        let window = c.sliding_window.as_ref().map(|w| w.size);
        // The local layers' addressing when they keep pools of their own.
        let window_step = backend.window_step(step);

        let mut residual = backend.alloc(n * hidden)?;
        let mut normed = backend.alloc_matmul_input(n * hidden)?;
        let mut qkv = backend.alloc(n * ql.row_width())?;
        let mut proj = backend.alloc(n * hidden)?;
        // Gemma's output norms write here, then trade places with `proj`.
        let sandwich = self.layers.iter().any(|l| l.attn_out_norm.is_some());
        let mut post = backend.alloc(if sandwich { n * hidden } else { 1 })?;
        // Dense MLPs' scratch (a mixture of experts keeps its own, `Backend::moe`).
        let dense = self
            .layers
            .iter()
            .any(|l| matches!(l.mlp, Mlp::Dense { .. }));
        let dense_width = if dense { c.intermediate_size } else { 1 };
        let mut gate_up = backend.alloc(n * 2 * dense_width)?;
        let mut act = backend.alloc_matmul_input(n * dense_width)?;
        // Gated attention's gates, and the linear-attention layers' scratch.
        let gated = self
            .layers
            .iter()
            .any(|l| matches!(&l.mixer, Mixer::Attention(a) if a.gate.is_some()));
        let mut attn_gate = backend.alloc(if gated { n * c.q_size() } else { 1 })?;
        // Attention's output only feeds the output projection, unless a gate multiplies it
        // first: then it stays f32 until the product rounds it, once, as on the CPU.
        let attn_len = n * ql.q_heads * ql.head_dim;
        let mut attn = match gated {
            true => backend.alloc(attn_len)?,
            false => backend.alloc_matmul_input(attn_len)?,
        };
        let mut linear = linear_attn::Scratch::new(backend, c.linear_attn.as_ref(), n)?;
        let mut latent = mla::Scratch::new(backend, c, n)?;

        // Adapters used this step, in the order of `layout.adapter_rows` (their groups).
        let mut active: Vec<&LoraAdapter<B>> = Vec::new();
        for (id, _) in &layout.adapter_rows {
            let a = adapters.get(id).ok_or_else(|| {
                crate::error::EngineError::Batch(format!("LoRA adapter {id} is not loaded"))
            })?;
            active.push(a);
        }
        let h = hidden;
        let (qs, kvs, inter) = (c.q_size(), c.kv_size(), c.intermediate_size);
        let lora = |i: usize,
                    t: Target,
                    x: &B::Buf,
                    xw: usize,
                    out: &mut B::Buf,
                    ow: usize,
                    off: usize|
         -> Result<()> {
            if active.is_empty() {
                return Ok(());
            }
            // Called for every projection, even one no adapter of this step changes: the
            // CUDA backend's launches then depend on the registered adapters, not on the step.
            let groups: Vec<LoraGroup<'_, B>> = active
                .iter()
                .enumerate()
                .filter_map(|(g, a)| {
                    a.get(i, t).map(|p| LoraGroup {
                        group: g,
                        a: &p.a,
                        b: &p.b,
                    })
                })
                .collect();
            let site = LoraSite {
                layer: i,
                target: t,
            };
            backend.lora(x, xw, step, site, &groups, out, ow, off)
        };

        backend.embedding(&self.embed, step, &mut residual)?;
        if let Some(s) = self.embed_scale {
            backend.scale(&mut residual, n * hidden, s)?;
        }
        // Media embeddings replace rows as the encoder made them (never scaled).
        let embeds_all = embeds;
        let embeds = embeds.filter(|e| !e.rows.is_empty());
        if let Some(e) = embeds {
            backend.write_rows(&mut residual, hidden, &e.rows, &e.data)?;
        }
        let deepstack = embeds.map_or(&[][..], |e| e.deepstack.as_slice());
        if let Some(f) = &self.mtp_front {
            let hidden = embeds_all.map_or(&[][..], |e| e.mtp_hidden.as_slice());
            f.input(backend, &mut residual, hidden, n, (h, eps), &mut normed)?;
        }
        // Whether `proj` holds the previous layer's MLP output, not yet added to `residual`.
        let mut pending = false;
        for (i, layer) in self.layers.iter().enumerate() {
            match (&layer.input_norm, pending) {
                (Some(w), false) => backend.rms_norm(&residual, n, w, eps, &mut normed)?,
                // The previous layer's MLP output is still in `proj`.
                (Some(w), true) => {
                    backend.add_rms_norm(&mut residual, &proj, n, w, eps, &mut normed)?
                }
                (None, true) => backend.add(&mut residual, &proj, n * hidden)?,
                (None, false) => {}
            }
            // What attention reads: the normed residual, or the residual itself (OLMo).
            let x = match layer.input_norm {
                Some(_) => &normed,
                None => &residual,
            };
            match &layer.mixer {
                Mixer::Linear(l) => {
                    let d = c.linear_attn.as_ref().ok_or_else(|| {
                        crate::error::EngineError::Backend("no linear_* config".into())
                    })?;
                    l.forward(backend, x, n, step, kv, d, eps, &mut linear, &mut proj)?;
                }
                Mixer::Latent(l) => {
                    if !active.is_empty() {
                        return Err(crate::error::EngineError::Batch(
                            "LoRA adapters on latent-attention models are not supported".into(),
                        ));
                    }
                    l.forward(
                        backend,
                        c,
                        &normed,
                        n,
                        step,
                        kv,
                        &self.rope,
                        &mut latent,
                        &mut proj,
                    )?;
                }
                Mixer::Attention(a) => {
                    backend.linear(x, n, &a.qkv, a.qkv_bias.as_ref(), &mut qkv)?;
                    let w = ql.row_width();
                    lora(i, Target::Q, x, h, &mut qkv, w, 0)?;
                    lora(i, Target::K, x, h, &mut qkv, w, qs)?;
                    lora(i, Target::V, x, h, &mut qkv, w, qs + kvs)?;
                    let qk_norm = match (&a.q_norm, &a.k_norm) {
                        (Some(q), Some(k)) if a.qk_norm_whole => {
                            backend.span_rms_norm(&mut qkv, n, w, 0, q, eps)?;
                            backend.span_rms_norm(&mut qkv, n, w, qs, k, eps)?;
                            None
                        }
                        (Some(q), Some(k)) => Some(QkNorm { q, k, eps }),
                        _ => None,
                    };
                    // A local layer with pools of its own runs on its own block tables.
                    let attn_step = match &window_step {
                        Some(w) if kv.in_window_pool(a.kv) => w,
                        _ => step,
                    };
                    let (k_cache, v_cache) = &mut kv.layers[a.kv];
                    let rope = match (&self.rope_local, layer.local, &self.rope_none) {
                        (_, _, Some(r)) if a.no_rope => r,
                        (Some(r), true, _) => r,
                        _ => &self.rope,
                    };
                    backend.qk_norm_rope_write_kv(
                        &mut qkv, n, attn_step, ql, qk_norm, rope, k_cache, v_cache,
                    )?;
                    let scoring = AttnScoring {
                        scale: if layer.local { scale_local } else { scale },
                        window: window.filter(|_| layer.local),
                        sinks: a.sinks.as_ref(),
                        through: None,
                    };
                    backend.attention(&qkv, attn_step, ql, k_cache, v_cache, scoring, &mut attn)?;
                    if let Some(g) = &a.gate {
                        backend.linear(x, n, g, None, &mut attn_gate)?;
                        backend.sigmoid_mul(&mut attn, &attn_gate, n * qs)?;
                    }
                    backend.linear(&attn, n, &a.o_proj, a.o_bias.as_ref(), &mut proj)?;
                    lora(i, Target::O, &attn, qs, &mut proj, h, 0)?;
                }
            }
            if let Some(w) = &layer.attn_out_norm {
                backend.rms_norm(&proj, n, w, eps, &mut post)?;
                std::mem::swap(&mut proj, &mut post);
            }
            match &layer.post_norm {
                Some(w) => backend.add_rms_norm(&mut residual, &proj, n, w, eps, &mut normed)?,
                None => backend.add(&mut residual, &proj, n * hidden)?,
            }
            // What the MLP reads: the normed residual, or the residual itself (OLMo).
            let x = match layer.post_norm {
                Some(_) => &normed,
                None => &residual,
            };
            match &layer.mlp {
                Mlp::Dense {
                    gate_up: w_gate_up,
                    down,
                } => {
                    backend.linear(x, n, w_gate_up, None, &mut gate_up)?;
                    lora(i, Target::Gate, x, h, &mut gate_up, 2 * inter, 0)?;
                    lora(i, Target::Up, x, h, &mut gate_up, 2 * inter, inter)?;
                    let keep_act = !active.is_empty();
                    match c.activation {
                        Activation::Silu => backend.silu_mul_linear(
                            &gate_up, n, inter, down, &mut act, keep_act, &mut proj,
                        )?,
                        Activation::GeluTanh => {
                            backend.gelu_tanh_mul(&gate_up, n, inter, &mut act)?;
                            backend.linear(&act, n, down, None, &mut proj)?;
                        }
                    }
                    lora(i, Target::Down, &act, inter, &mut proj, h, 0)?;
                }
                // Adapters on experts are refused at load (`lora`), so none applies here.
                Mlp::Moe(moe, index) => backend.moe(x, n, h, moe, index, &mut proj)?,
            }
            if let Some(w) = &layer.mlp_out_norm {
                backend.rms_norm(&proj, n, w, eps, &mut post)?;
                std::mem::swap(&mut proj, &mut post);
            }
            pending = true;
            // DeepStack: the layer's output, then the media rows' visual features added.
            if let (Some(e), Some(features)) = (embeds, deepstack.get(i)) {
                backend.add(&mut residual, &proj, n * hidden)?;
                backend.add_rows(&mut residual, hidden, &e.rows, features)?;
                pending = false;
            }
        }
        if pending {
            backend.add(&mut residual, &proj, n * hidden)?;
        }

        let rows = layout.logits_rows.len();
        for b in [normed, qkv, attn, gate_up, act, post, attn_gate] {
            backend.recycle(b);
        }
        linear.recycle(backend);
        latent.recycle(backend);
        if rows == 0 {
            backend.recycle(residual);
            backend.recycle(proj);
            return Ok((None, None));
        }
        // Norm and LM head only for the rows whose logits are wanted.
        let mut picked = backend.alloc(rows * hidden)?;
        backend.gather_logit_rows(&residual, step, hidden, &mut picked)?;
        let lm_rows = rows.saturating_sub(pool_rows);
        let logits = match lm_rows {
            0 => None,
            _ => {
                let mut picked_normed = backend.alloc_matmul_input(lm_rows * hidden)?;
                backend.rms_norm(&picked, lm_rows, &self.final_norm, eps, &mut picked_normed)?;
                let mut logits = backend.alloc(lm_rows * c.vocab_size)?;
                let head = self.lm_head.as_ref().unwrap_or(&self.embed);
                backend.linear(&picked_normed, lm_rows, head, None, &mut logits)?;
                backend.recycle(picked_normed);
                Some(logits)
            }
        };
        // Pooled states in f32 (a matmul input may be rounded), every row normed: a norm
        // reads only its own row, and the pool rows come last. An MTP head's are its layer's
        // output as it is (what its next draft continues, [`mtp`]).
        let (pooled, picked) = match pool_rows {
            0 => (None, Some(picked)),
            _ if self.mtp_front.is_some() => (Some(picked), None),
            _ => {
                let mut normed = backend.alloc(rows * hidden)?;
                backend.rms_norm(&picked, rows, &self.final_norm, eps, &mut normed)?;
                (Some(normed), Some(picked))
            }
        };
        for b in [residual, proj].into_iter().chain(picked) {
            backend.recycle(b);
        }
        Ok((logits, pooled))
    }
}
