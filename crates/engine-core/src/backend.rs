//! The few device operations a Llama-family step needs. The model is written once against
//! this trait; the CPU backend implements it here and the CUDA backend in crate `lmi-cuda`.
//!
//! Design rules that keep the trait fit for a GPU:
//! - buffers and weights are opaque device objects (`Buf`, `Weight`, `Kv`);
//! - a step's metadata (positions, slots, block tables) is uploaded once (`upload_step`) and
//!   referenced by every layer's ops; nothing comes back to the host but what
//!   `process_logits` returns (sampled ids and requested logprobs);
//! - every op writes into a caller-provided buffer, so a backend may preallocate and replay;
//! - ops return `Result`: a GPU launch can fail, and the error names the op.

use lmi_checkpoint::weights::HostTensor;

use crate::batch::BatchLayout;
use crate::error::Result;
use crate::kv::KvCacheConfig;
use crate::step::{LogitsOutput, LogitsWork};
use lmi_checkpoint::peft::Target;

/// Where each head lives inside a fused `[rows, (q_heads + 2 * kv_heads) * head_dim]` QKV row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvLayout {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl QkvLayout {
    pub fn row_width(&self) -> usize {
        (self.q_heads + 2 * self.kv_heads) * self.head_dim
    }
    pub fn k_offset(&self) -> usize {
        self.q_heads * self.head_dim
    }
    pub fn v_offset(&self) -> usize {
        (self.q_heads + self.kv_heads) * self.head_dim
    }
}

/// A decode shape a backend keeps a CUDA graph for: the padded batch size, the block-table
/// width, and whether the step has adapter rows (then it runs the LoRA launches of every
/// registered projection, whichever adapters it holds: rows reach theirs through the device
/// slot table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub seqs: usize,
    pub block_stride: usize,
    pub lora: bool,
}

/// The state of a backend's graphs (`lmi_cuda_graphs{state}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphStats {
    pub captured: usize,
    /// Keys whose capture failed: their steps run directly (slower, still correct).
    pub failed: usize,
}

/// Qwen3's per-head RMS norms of q and k (`head_dim` weights each), for
/// [`Backend::qk_norm_rope_write_kv`].
pub struct QkNorm<'a, B: Backend + ?Sized> {
    pub q: &'a B::Weight,
    pub k: &'a B::Weight,
    pub eps: f32,
}

/// One adapter's pair for a projection, and its group in the step's `adapter_rows`.
pub struct LoraGroup<'a, B: Backend + ?Sized> {
    pub group: usize,
    pub a: &'a B::Weight,
    pub b: &'a B::Weight,
}

/// The projection a LoRA call applies to: a layer's q/k/v/o/gate/up/down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraSite {
    pub layer: usize,
    pub target: Target,
}

/// A backend's hold on an adapter registered with [`Backend::register_lora`] (the CUDA
/// backend's device slot); dropping it ends the registration.
pub type LoraRegistration = Box<dyn Send + Sync>;

/// One layer of an uploaded adapter: its (A, B) pair per [`Target`], as `upload_lora_pair`
/// returned them (None where it leaves a projection alone).
pub type LoraLayer<'a, W> = [Option<(&'a W, &'a W)>; 7];

/// An uploaded adapter's pairs, `[layer][target]`.
pub type LoraPairs<'a, B> = [LoraLayer<'a, <B as Backend>::Weight>];

pub trait Backend: Send + Sync + 'static {
    /// An activation buffer (f32 values; see `alloc_matmul_input`). Cloning a CUDA buffer
    /// copies the handle, not the data.
    type Buf: Send + Clone + 'static;
    /// A weight resident on the device (matrix, embedding table, norm vector, bias).
    type Weight: Send + Sync;
    /// One layer's K or V pool: `[num_blocks, kv_heads, BLOCK_SIZE, head_dim]`.
    type Kv: Send;
    /// A step's layout, uploaded.
    type Step: Send;
    /// RoPE frequencies, uploaded once.
    type Rope: Send + Sync;
    /// A vision tower's weights on this backend, where it keeps a copy of its own (the CPU
    /// runs the host weights: it has none).
    type Vision: Send + Sync;
    /// What a backend keeps beside a mixture-of-experts layer's weights to run it
    /// ([`Backend::index_experts`]; CUDA: the device table of the experts' addresses).
    type Experts: Send + Sync;
    /// One linear-attention layer's recurrent states, every slot
    /// ([`crate::state::StateConfig`]).
    type State: Send;

    fn name(&self) -> &'static str;
    /// Which kernels run a step's matrix products of `rows` rows, for reports (`lmi bench
    /// engine`); `quantized`: the weights are kept in quantized blocks.
    fn product_kernel(&self, rows: usize, quantized: bool) -> String {
        let _ = (rows, quantized);
        self.name().to_string()
    }

    fn upload_weight(&self, t: HostTensor) -> Result<Self::Weight>;
    /// A mixture's router `[experts, hidden]`, in f32 where this backend would round other
    /// matrices (a rounded logit can flip a token between two close experts).
    fn upload_router(&self, t: HostTensor) -> Result<Self::Weight> {
        self.upload_weight(t)
    }
    /// A matrix that only ever multiplies whole sequences' rows, never a decode batch (an
    /// encoder's): a backend may keep it in a layout for large products, whose
    /// [`Backend::linear`] then has its own canonical order per element (the CPU packs f32
    /// matrices in panels for an outer-product kernel).
    fn upload_encoder_weight(&self, t: HostTensor) -> Result<Self::Weight> {
        self.upload_weight(t)
    }
    /// Uploads a LoRA pair (`a` `[rank, in]`, `b` `[out, rank]`, scale folded into `b`) in
    /// `dtype`, in whatever layout this backend's `lora` reads.
    fn upload_lora_pair(
        &self,
        a: HostTensor,
        b: HostTensor,
        dtype: lmi_checkpoint::dtype::DType,
    ) -> Result<(Self::Weight, Self::Weight)> {
        Ok((
            self.upload_weight(a.to_dtype(dtype))?,
            self.upload_weight(b.to_dtype(dtype))?,
        ))
    }
    /// Registers an uploaded adapter under the engine's `id`, for backends whose LoRA
    /// launches find each row's adapter on the device (the CUDA backend's slot table: the
    /// step upload maps the rows of `id` to its slot). None where nothing is kept (the CPU
    /// reads each step's pairs from `lora`'s groups).
    fn register_lora(
        &self,
        _id: u64,
        _pairs: &LoraPairs<'_, Self>,
    ) -> Result<Option<LoraRegistration>> {
        Ok(None)
    }
    /// `(free, total)` bytes of the device's own memory once issued work has finished (the
    /// engine sizes the KV cache by a share of it, less what a measured step takes); None for
    /// backends in host memory (the CPU).
    fn memory_info(&self) -> Result<Option<(usize, usize)>> {
        Ok(None)
    }
    /// The decode shapes (padded batch size, block-table width) this backend replays from
    /// graphs, for batches of at most `max_seqs` sequences with block tables of at most
    /// `max_blocks` entries: the engine captures them at load. Empty without graphs.
    fn graph_keys(&self, _max_seqs: usize, _max_blocks: usize) -> Vec<GraphKey> {
        Vec::new()
    }
    /// Graphs captured, and keys whose capture failed (run directly instead).
    fn graph_stats(&self) -> Option<GraphStats> {
        None
    }
    /// Called once the load-time warm-up has run a step of the largest shape: step buffers
    /// are now as large as any step needs (a later step that needs more is logged).
    fn finish_warmup(&self) -> Result<()> {
        Ok(())
    }
    /// Bytes a weight occupies on the device.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;
    fn rope_table(&self, inv_freq: &[f64]) -> Result<Self::Rope>;
    /// M-RoPE (Qwen-VL): frequency `i` turns with component `components[i]` (0 time, 1 row,
    /// 2 column) of a token's position (`BatchLayout::rope_positions`;
    /// `ModelConfig::mrope_components`: contiguous sections or Qwen3-VL's interleaving).
    /// Backends without it refuse at load.
    fn mrope_table(&self, inv_freq: &[f64], components: &[u8]) -> Result<Self::Rope> {
        let _ = (inv_freq, components);
        Err(crate::error::EngineError::Backend(format!(
            "the {} engine does not run M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) yet: use --device cpu",
            self.name()
        )))
    }
    /// Adds row `i` of `src` (host data) to row `rows[i]` of `dst` (`width` wide): Qwen3-VL's
    /// DeepStack features added to the hidden states of a media item's tokens.
    fn add_rows(&self, dst: &mut Self::Buf, width: usize, rows: &[u32], src: &[f32]) -> Result<()> {
        let _ = (dst, width, rows, src);
        Err(crate::error::EngineError::Backend(format!(
            "the {} engine does not add DeepStack features (Qwen3-VL) yet: use --device cpu",
            self.name()
        )))
    }
    /// Overwrites rows `rows[i]` of `dst` (`width` wide) with row `i` of `src` (host data):
    /// a vision encoder's embeddings in place of placeholder tokens'.
    fn write_rows(
        &self,
        dst: &mut Self::Buf,
        width: usize,
        rows: &[u32],
        src: &[f32],
    ) -> Result<()> {
        let _ = (dst, width, rows, src);
        Err(crate::error::EngineError::Backend(format!(
            "the {} engine does not take media embeddings yet: use --device cpu",
            self.name()
        )))
    }
    /// Puts a vision tower on this backend; None where it runs the host weights.
    fn upload_vision(&self, tower: &crate::vision::VisionTower) -> Result<Option<Self::Vision>> {
        let _ = tower;
        Ok(None)
    }
    /// A media item's embeddings, `[input.tokens(), out_hidden_size]` in the order of its
    /// placeholder tokens: through `vision`, the tower's upload, where there is one, else
    /// through its host weights `tower` on the host.
    fn encode_vision(
        &self,
        vision: Option<&Self::Vision>,
        tower: &crate::vision::VisionTower,
        input: &crate::vision::VisionInput,
    ) -> Result<Vec<f32>>;
    /// One layer's K or V pool.
    fn alloc_kv(&self, cfg: &KvCacheConfig) -> Result<Self::Kv>;
    /// Every layer's (K, V) pools (a backend may place them in one allocation).
    fn alloc_kv_layers(&self, cfg: &KvCacheConfig) -> Result<Vec<(Self::Kv, Self::Kv)>> {
        (0..cfg.num_layers)
            .map(|_| Ok((self.alloc_kv(cfg)?, self.alloc_kv(cfg)?)))
            .collect()
    }
    /// Whether sliding-window layers may keep their K/V in pools of their own
    /// ([`crate::kv::KvWindow`]): a second block table per step
    /// ([`crate::batch::WindowTables`]).
    fn window_pools(&self) -> bool {
        false
    }
    /// The uploaded step as the sliding-window layers run it: its window tables in place of
    /// the block tables (None when the layout had none).
    fn window_step(&self, step: &Self::Step) -> Option<Self::Step> {
        let _ = step;
        None
    }
    /// Adjusts a step's layout before it is uploaded and run: the CUDA backend pads decode
    /// batches to the sizes it keeps CUDA graphs for. The logits rows the step's requests
    /// name are unchanged.
    fn prepare_layout(&self, layout: BatchLayout) -> BatchLayout {
        layout
    }
    fn upload_step(&self, layout: &BatchLayout) -> Result<Self::Step>;
    /// A buffer of `len` f32 (zeroed on the CPU; uninitialized on a GPU: every op writes
    /// its whole output).
    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    /// A buffer of `len` values that only feed matrix products and LoRA (normalized
    /// activations, attention and MLP outputs). f32 here by default; the CUDA backend keeps
    /// them in bf16, the input type of its products, rounding where the CPU's bf16 products
    /// round their inputs too.
    fn alloc_matmul_input(&self, len: usize) -> Result<Self::Buf> {
        self.alloc(len)
    }

    /// `out[t] = table[token_ids[t]]`, converted to f32.
    fn embedding(&self, table: &Self::Weight, step: &Self::Step, out: &mut Self::Buf)
    -> Result<()>;
    /// `out[rows, n] = x[rows, k] · wᵀ (+ bias)`, with `w` of shape `[n, k]`.
    fn linear(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `out = rms_norm(x) * w` per row of width `w.len()`.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `residual += delta; out = rms_norm(residual) * w`.
    fn add_rms_norm(
        &self,
        residual: &mut Self::Buf,
        delta: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// `residual += delta`.
    fn add(&self, residual: &mut Self::Buf, delta: &Self::Buf, len: usize) -> Result<()>;
    /// RMSNorm over each of `n_heads` heads starting at head `first_head` of every QKV row,
    /// in place (Qwen3's q_norm / k_norm).
    #[allow(clippy::too_many_arguments)]
    fn head_rms_norm(
        &self,
        qkv: &mut Self::Buf,
        rows: usize,
        layout: QkvLayout,
        first_head: usize,
        n_heads: usize,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<()>;
    /// RMSNorm in place over the columns `offset .. offset + w.len()` of each of `rows` rows
    /// of `x`, rows `row_width` wide: q/k norms over a whole projection, every head at once
    /// (OLMo 2, OLMo 3, MiniMax-M2), on their span of a fused QKV row
    /// ([`Feature::SpanNorm`]).
    fn span_rms_norm(
        &self,
        x: &mut Self::Buf,
        rows: usize,
        row_width: usize,
        offset: usize,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<()> {
        let _ = (x, rows, row_width, offset, w, eps);
        Err(refused(self.name(), Feature::SpanNorm))
    }
    /// Rotate-half RoPE on the q and k heads of every QKV row, at each token's position.
    fn rope(
        &self,
        qkv: &mut Self::Buf,
        step: &Self::Step,
        layout: QkvLayout,
        rope: &Self::Rope,
    ) -> Result<()>;
    /// Stores each token's k and v heads at its slot.
    fn write_kv(
        &self,
        qkv: &Self::Buf,
        step: &Self::Step,
        layout: QkvLayout,
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
    ) -> Result<()>;
    /// What a layer does between its QKV projection and attention, for every token of the
    /// step: the q and k heads RMS-normalized when `qk_norm` is given (Qwen3), then rotated
    /// (`rope`), then the token's k and v heads stored at its slot. Afterwards the q heads of
    /// `qkv` hold what `attention` reads; its k and v heads are unspecified (a backend may
    /// write the rotated k straight to the cache). `tokens` is the step's token count.
    /// By default `head_rms_norm`, `rope` and `write_kv` in turn; the CUDA backend does it
    /// in one launch.
    #[allow(clippy::too_many_arguments)]
    fn qk_norm_rope_write_kv(
        &self,
        qkv: &mut Self::Buf,
        tokens: usize,
        step: &Self::Step,
        layout: QkvLayout,
        qk_norm: Option<QkNorm<'_, Self>>,
        rope: &Self::Rope,
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
    ) -> Result<()> {
        if let Some(n) = qk_norm {
            self.head_rms_norm(qkv, tokens, layout, 0, layout.q_heads, n.q, n.eps)?;
            let kv = layout.kv_heads;
            self.head_rms_norm(qkv, tokens, layout, layout.q_heads, kv, n.k, n.eps)?;
        }
        self.rope(qkv, step, layout, rope)?;
        self.write_kv(qkv, step, layout, k_cache, v_cache)
    }
    /// Causal attention of each token's q heads over its sequence's cached keys
    /// `0 ..= position` (or the last `window` of them), read through the block table, scored
    /// as `scoring` says. `out` is `[tokens, q_heads * head_dim]`. A backend refuses scoring
    /// it lacks ([`Feature::SlidingWindow`], [`Feature::AttentionSinks`]); models that need
    /// it are refused at load.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        qkv: &Self::Buf,
        step: &Self::Step,
        layout: QkvLayout,
        k_cache: &Self::Kv,
        v_cache: &Self::Kv,
        scoring: AttnScoring<'_, Self::Weight>,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Every linear-attention layer's state slots, zeroed ([`Feature::LinearAttention`]).
    fn alloc_states(&self, cfg: &crate::state::StateConfig) -> Result<Vec<Self::State>> {
        let _ = cfg;
        Err(refused(self.name(), Feature::LinearAttention))
    }
    /// Copies whole slots `src → dst` of one layer's states, in order (forks, prefix hits).
    fn copy_states(
        &self,
        state: &mut Self::State,
        cfg: &crate::state::StateConfig,
        pairs: &[(u32, u32)],
    ) -> Result<()> {
        let _ = (state, cfg, pairs);
        Err(refused(self.name(), Feature::LinearAttention))
    }
    /// A Gated DeltaNet layer's token mixing for every token of the step, each sequence from
    /// and into its state slot (`step`'s [`crate::state::ChunkState`]s, zeroed first for a
    /// sequence's first chunk, snapshots taken on the way). `proj` holds each token's fused
    /// input projection `[q k v | z | b | a]` ([`LinearAttnConfig::proj_dim`] wide); `out`
    /// gets the gated-normed output `[tokens, value_dim]`, before the output projection. A
    /// sequence's result must not depend on the other sequences of the step.
    ///
    /// [`LinearAttnConfig::proj_dim`]: lmi_checkpoint::config::linear_attn::LinearAttnConfig::proj_dim
    fn gated_delta_net(
        &self,
        proj: &Self::Buf,
        step: &Self::Step,
        layer: DeltaNet<'_, Self>,
        state: &mut Self::State,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = (proj, step, layer, state, out);
        Err(refused(self.name(), Feature::LinearAttention))
    }
    /// `x[i] *= σ(gate[i])` for `i < len` (the gated attention's output gate).
    fn sigmoid_mul(&self, x: &mut Self::Buf, gate: &Self::Buf, len: usize) -> Result<()> {
        let _ = (x, gate, len);
        Err(refused(self.name(), Feature::LinearAttention))
    }
    /// `x[..len] *= s` (Gemma's embedding scale).
    fn scale(&self, x: &mut Self::Buf, len: usize, s: f32) -> Result<()> {
        let _ = (x, len, s);
        Err(refused(self.name(), Feature::Gemma))
    }
    /// `out[r, i] = gelu_tanh(gate[r, i]) * up[r, i]` (GeGLU), rows as [`Backend::silu_mul`].
    fn gelu_tanh_mul(
        &self,
        gate_up: &Self::Buf,
        rows: usize,
        width: usize,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = (gate_up, rows, width, out);
        Err(refused(self.name(), Feature::Gemma))
    }
    /// `x[r, j] = gelu_tanh(x[r, j]) · other[r · stride + offset + j]` for `rows` rows of
    /// `width` (Gemma 4's per-layer input gate times its layer's slice of the per-layer
    /// inputs).
    #[allow(clippy::too_many_arguments)]
    fn gelu_tanh_mul_slice(
        &self,
        x: &mut Self::Buf,
        other: &Self::Buf,
        rows: usize,
        width: usize,
        stride: usize,
        offset: usize,
    ) -> Result<()> {
        let _ = (x, other, rows, width, stride, offset);
        Err(refused(self.name(), Feature::Gemma4))
    }
    /// `x = cap · tanh(x / cap)` over `x[..len]` (Gemma 4's final logit soft-capping).
    fn softcap(&self, x: &mut Self::Buf, len: usize, cap: f32) -> Result<()> {
        let _ = (x, len, cap);
        Err(refused(self.name(), Feature::Gemma4))
    }
    /// `out = (x − mean) / sqrt(var + eps) · w + b` per row of width `w.len()` (an encoder's
    /// LayerNorm; `out` may be an [`Backend::alloc`] or a matmul-input buffer).
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        b: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = (x, rows, w, b, eps, out);
        Err(refused(self.name(), Feature::Encoder))
    }
    /// GELU in place over `x[..len]`: the erf form (BERT's `gelu`), or with `tanh` the tanh
    /// approximation (`gelu_new`, `gelu_pytorch_tanh`).
    fn gelu(&self, x: &mut Self::Buf, len: usize, tanh: bool) -> Result<()> {
        let _ = (x, len, tanh);
        Err(refused(self.name(), Feature::Encoder))
    }
    /// `out[t] += table[ids[t]]` (converted to f32) for each of `ids`, host ids: an encoder's
    /// position and token-type embeddings.
    fn gather_add(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf) -> Result<()> {
        let _ = (table, ids, out);
        Err(refused(self.name(), Feature::Encoder))
    }
    /// Bidirectional attention within each sequence of a step without a KV cache: sequence
    /// `s` is rows `cu[s] .. cu[s + 1]` of `qkv`, each row `[q | k | v]` of `heads` heads of
    /// `head_dim` (as many K/V heads as q heads); every token attends to every token of its
    /// sequence, scores scaled by `scale`. `out` is `[rows, heads · head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn encoder_attention(
        &self,
        qkv: &Self::Buf,
        cu: &[u32],
        heads: usize,
        head_dim: usize,
        scale: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = (qkv, cu, heads, head_dim, scale, out);
        Err(refused(self.name(), Feature::Encoder))
    }
    /// Whether the operations a model needs beyond the Llama family's run here; a model
    /// that needs one this backend lacks is refused at load (before its weights are uploaded).
    fn supports(&self, feature: Feature) -> bool {
        let _ = feature;
        false
    }
    /// The widest attention head this backend's kernels take (None: any); a model with wider
    /// heads is refused at load.
    fn max_head_dim(&self) -> Option<usize> {
        None
    }
    /// `out[r, i] = silu(gate[r, i]) * up[r, i]`, each input row holding `[gate | up]` (2·`width`).
    fn silu_mul(
        &self,
        gate_up: &Self::Buf,
        rows: usize,
        width: usize,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// The MLP's down projection from its `[gate | up]` rows: `act = silu(gate) * up`
    /// ([`Backend::silu_mul`]), then `out = act · wᵀ`. `act` must hold the activations
    /// afterwards only when `keep_act` (a LoRA on the projection reads them). A backend may
    /// fuse the two (CUDA does for a few rows); this default runs them in turn.
    #[allow(clippy::too_many_arguments)]
    fn silu_mul_linear(
        &self,
        gate_up: &Self::Buf,
        rows: usize,
        width: usize,
        w: &Self::Weight,
        act: &mut Self::Buf,
        keep_act: bool,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = keep_act;
        self.silu_mul(gate_up, rows, width, act)?;
        self.linear(act, rows, w, None, out)
    }
    /// What [`Backend::moe`] needs beside an uploaded layer's weights, built once at load
    /// (after [`Backend::supports`] accepted [`Feature::Experts`]).
    fn index_experts(&self, layer: &crate::moe::MoeLayer<Self::Weight>) -> Result<Self::Experts>;
    /// A mixture-of-experts MLP over `rows` rows of `x` (`hidden` wide): each row's experts
    /// from `layer.router`, `out[r] = Σ weight · down(silu(gate) · up)` over them. A row's
    /// result must not depend on the other rows of the step (batch invariance), even though
    /// they change which experts the step reads.
    #[allow(clippy::too_many_arguments)]
    fn moe(
        &self,
        x: &Self::Buf,
        rows: usize,
        hidden: usize,
        layer: &crate::moe::MoeLayer<Self::Weight>,
        experts: &Self::Experts,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = (x, rows, hidden, layer, experts, out);
        Err(refused(self.name(), Feature::Experts))
    }
    /// LoRA deltas on one projection, `site`, for every adapter of the step at once (SGMV's
    /// grouping): for each group, the token rows of `BatchLayout::adapter_rows[group]` get
    /// `out[r, offset .. offset + n] += B · (A · x[r])`, with A `[rank, x_width]` and B
    /// `[n, rank]` (scale folded in; each backend keeps them in its own layout). The model
    /// calls it for every projection of every layer whenever the step has adapter rows, with
    /// the step's adapters that change this projection as `groups` (possibly none): a
    /// backend that replays steps from CUDA graphs launches from what is registered
    /// (`register_lora`), so its launches must not depend on which adapters a step holds.
    #[allow(clippy::too_many_arguments)]
    fn lora(
        &self,
        x: &Self::Buf,
        x_width: usize,
        step: &Self::Step,
        site: LoraSite,
        groups: &[LoraGroup<'_, Self>],
        out: &mut Self::Buf,
        out_width: usize,
        out_offset: usize,
    ) -> Result<()>;
    /// Gathers the step's `logits_rows` rows of `x` (row width `width`) into `out`.
    fn gather_logit_rows(
        &self,
        x: &Self::Buf,
        step: &Self::Step,
        width: usize,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// The first `len` values on the host (the buffer is consumed).
    fn to_host(&self, buf: Self::Buf, len: usize) -> Result<Vec<f32>>;
    /// Draws and scores tokens on rows of a step's logits (`rows × vocab` f32, the buffer the
    /// forward pass returned, consumed), with the semantics of `sampling::sample` and
    /// `sampling::token_logprob`; only the results come back to the host.
    fn process_logits(
        &self,
        logits: Self::Buf,
        rows: usize,
        vocab: usize,
        work: &LogitsWork<'_>,
    ) -> Result<LogitsOutput>;
    /// Gives a scratch buffer back for reuse by later `alloc`s (a step allocates the same
    /// sizes every time).
    fn recycle(&self, _buf: Self::Buf) {}
    /// Runs one forward pass. The CPU backend runs it on its thread pool, so the pass's
    /// hundreds of parallel ops fork and join among pool threads instead of each waking the
    /// pool from outside and sleeping until it finishes.
    fn run_forward<R: Send>(&self, forward: impl FnOnce() -> R + Send) -> R {
        forward()
    }
    /// Runs the device work of one forward pass over an uploaded step. The CUDA backend
    /// replays a CUDA graph captured for the step's shape when it has one (the closure's
    /// launches then run from the graph, with the result it returned at capture).
    /// `forward` may be called more than once (a failed capture is run again directly).
    fn run_graph<R: Clone + Send + 'static>(
        &self,
        _step: &Self::Step,
        mut forward: impl FnMut() -> Result<R>,
    ) -> Result<R> {
        forward()
    }
    /// Whether [`Backend::mla_qkv`] and [`Backend::mla_attention`] take the absorbed
    /// up-projections as one matrix per head in the model's weight form (`[kv_lora, nope]`
    /// and `[v, kv_lora]`; a GGUF's quantized blocks as stored), so a decode step reads them
    /// at the file's size; otherwise each is one flat f32 weight.
    fn mla_per_head(&self) -> bool {
        false
    }
    /// Latent attention's queries and cache records for every token of the step
    /// ([`Feature::LatentAttention`]). `q` is `[tokens, heads · (nope + rope)]` (q_b_proj's or
    /// q_proj's output), `kva` `[tokens, kv_lora + rope]` (kv_a_proj_with_mqa's), their rotary
    /// parts in rotate-half order. Writes `out` `[tokens, dims.row_width()]`: per head the
    /// latent query `W_UKᵀ · q_nope` (`w_uk` `[heads, kv_lora, nope]` as
    /// [`Backend::mla_per_head`] says) and q's rotary
    /// part turned; then the token's record, `rms_norm(latent) · kv_norm` and the key's rotary
    /// part turned, which [`Backend::write_kv`] with [`MlaDims::kv_layout`] stores. The rotated
    /// parts are multiplied by `dims.rope_factor` (YaRN's attention factor on cos and sin).
    #[allow(clippy::too_many_arguments)]
    fn mla_qkv(
        &self,
        q: &Self::Buf,
        kva: &Self::Buf,
        step: &Self::Step,
        dims: MlaDims,
        kv_norm: &Self::Weight,
        w_uk: &[Self::Weight],
        eps: f32,
        rope: &Self::Rope,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = (q, kva, step, dims, kv_norm, w_uk, eps, rope, out);
        Err(refused(self.name(), Feature::LatentAttention))
    }
    /// Causal attention of each token's latent queries (`qkv` as [`Backend::mla_qkv`] wrote
    /// it) over its sequence's cached records `0 ..= position` (each record's first half in
    /// `k_cache`, its second in `v_cache`), scores times `scale`; the weighted sum of the
    /// latents, per head, times `w_uv` (`[heads, v, kv_lora]`, in `w_uk`'s form): `out` is
    /// `[tokens, heads · v]`, what o_proj reads.
    #[allow(clippy::too_many_arguments)]
    fn mla_attention(
        &self,
        qkv: &Self::Buf,
        step: &Self::Step,
        dims: MlaDims,
        k_cache: &Self::Kv,
        v_cache: &Self::Kv,
        w_uv: &[Self::Weight],
        scale: f32,
        out: &mut Self::Buf,
    ) -> Result<()> {
        let _ = (qkv, step, dims, k_cache, v_cache, w_uv, scale, out);
        Err(refused(self.name(), Feature::LatentAttention))
    }
    /// Copies whole blocks `src → dst` in one layer's pool (copy-on-write of shared blocks).
    fn copy_blocks(
        &self,
        cache: &mut Self::Kv,
        cfg: &KvCacheConfig,
        pairs: &[(u32, u32)],
    ) -> Result<()>;
}

/// A latent-attention layer's shape ([`Backend::mla_qkv`], [`Backend::mla_attention`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaDims {
    pub heads: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    /// Multiplies the turned rotary parts of q and k (YaRN's attention factor; 1 without).
    pub rope_factor: f32,
}

impl MlaDims {
    /// Values of one cache record: the latent, then the rotary key part.
    pub fn cache_width(&self) -> usize {
        self.kv_lora + self.rope
    }
    /// Width of a row of [`Backend::mla_qkv`]'s output: a record-wide query per head, then
    /// the token's record.
    pub fn row_width(&self) -> usize {
        (self.heads + 1) * self.cache_width()
    }
    /// The record as [`Backend::write_kv`] reads it from those rows: one "kv head" of half a
    /// record in each of the K and V pools (`KvCacheConfig::geometry`), after `2 · heads`
    /// half-record "q heads".
    pub fn kv_layout(&self) -> QkvLayout {
        QkvLayout {
            q_heads: 2 * self.heads,
            kv_heads: 1,
            head_dim: self.cache_width() / 2,
        }
    }
}

/// A Gated DeltaNet layer's weights besides its projections, for [`Backend::gated_delta_net`].
pub struct DeltaNet<'a, B: Backend + ?Sized> {
    pub dims: &'a lmi_checkpoint::config::linear_attn::LinearAttnConfig,
    /// The depthwise convolution: `conv_dim` rows of `conv_kernel` taps, f32, uploaded flat
    /// (1-D) so that no backend rounds it as a matrix.
    pub conv: &'a B::Weight,
    /// Per value head: `A_log` and `dt_bias` (the decay `exp(-exp(A_log) · softplus(a + dt_bias))`).
    pub a_log: &'a B::Weight,
    pub dt_bias: &'a B::Weight,
    /// The gated RMSNorm's weight `[head_v_dim]`.
    pub norm: &'a B::Weight,
    pub eps: f32,
}

/// How attention scores a query against its keys.
#[derive(Debug)]
pub struct AttnScoring<'a, W: ?Sized> {
    /// Multiplies q·k.
    pub scale: f32,
    /// Only the last `window` keys (`position - window + 1 ..= position`): a local layer's
    /// sliding window (Gemma 3, gpt-oss).
    pub window: Option<usize>,
    /// A learned logit per q head in each softmax's denominator, `[q_heads]` (gpt-oss's
    /// attention sinks).
    pub sinks: Option<&'a W>,
    /// Per token of the step, the last position its query sees when that is past its own
    /// (the window still counted back from its own position): an image's soft tokens
    /// attending to the whole image in Gemma 4's sliding layers
    /// ([`Feature::BidirectionalImages`]). None: causal.
    pub through: Option<&'a [u32]>,
}

impl<W: ?Sized> Clone for AttnScoring<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W: ?Sized> Copy for AttnScoring<'_, W> {}

impl<'a, W: ?Sized> AttnScoring<'a, W> {
    /// Every earlier key, no sinks.
    pub fn plain(scale: f32) -> Self {
        AttnScoring {
            scale,
            window: None,
            sinks: None,
            through: None,
        }
    }

    /// The same scoring, its sinks seen through `f` (a backend's view of its weight).
    pub fn map_sinks<V: ?Sized>(self, f: impl FnOnce(&'a W) -> &'a V) -> AttnScoring<'a, V> {
        AttnScoring {
            scale: self.scale,
            window: self.window,
            sinks: self.sinks.map(f),
            through: self.through,
        }
    }
}

/// What a model may need beyond the Llama family's operations ([`Backend::supports`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// [`Backend::moe`].
    Experts,
    /// [`AttnScoring::window`].
    SlidingWindow,
    /// [`AttnScoring::sinks`].
    AttentionSinks,
    /// Gemma's [`Backend::gelu_tanh_mul`] and [`Backend::scale`].
    Gemma,
    /// Gated DeltaNet layers and gated attention ([`Backend::gated_delta_net`],
    /// [`Backend::sigmoid_mul`], partial RoPE).
    LinearAttention,
    /// Qwen3-VL's DeepStack: visual features added to the hidden states of the first layers
    /// ([`Backend::add_rows`]).
    DeepStack,
    /// Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash): [`Backend::mla_qkv`],
    /// [`Backend::mla_attention`].
    LatentAttention,
    /// Gemma 4: [`Backend::gelu_tanh_mul_slice`], [`Backend::softcap`], attention layers of
    /// two head widths, K/V shared between layers.
    Gemma4,
    /// Bidirectional encoders (BERT, XLM-RoBERTa): [`Backend::layer_norm`],
    /// [`Backend::gelu`], [`Backend::gather_add`], [`Backend::encoder_attention`].
    Encoder,
    /// RMSNorm over a span of each row, [`Backend::span_rms_norm`]: q/k norms over the whole
    /// projection (OLMo 2, OLMo 3, MiniMax-M2).
    SpanNorm,
    /// [`AttnScoring::through`]: queries that see keys after their own position (an image's
    /// soft tokens in Gemma 4 26B-A4B's and 31B's sliding layers).
    BidirectionalImages,
}

impl Feature {
    /// The features `config`'s model needs.
    pub fn needed_by(config: &lmi_checkpoint::config::ModelConfig) -> Vec<Feature> {
        let mut out = Vec::new();
        if config.moe.is_some() {
            out.push(Feature::Experts);
        }
        if config.sliding_window.is_some() {
            out.push(Feature::SlidingWindow);
        }
        if config.architecture.has_sinks() {
            out.push(Feature::AttentionSinks);
        }
        if config.architecture.is_gemma() {
            out.push(Feature::Gemma);
        }
        if config.gemma4.is_some() {
            out.extend([Feature::Gemma, Feature::Gemma4]);
        }
        if config.linear_attn.is_some() {
            out.push(Feature::LinearAttention);
        }
        if config.mla.is_some() {
            out.push(Feature::LatentAttention);
        }
        if config.architecture.qk_norm_whole() {
            out.push(Feature::SpanNorm);
        }
        if config
            .vision
            .as_ref()
            .is_some_and(|v| !v.deepstack_visual_indexes.is_empty())
        {
            out.push(Feature::DeepStack);
        }
        out
    }

    fn describe(self) -> &'static str {
        match self {
            Feature::Experts => "mixture-of-experts models (Qwen3-MoE, Mixtral, gpt-oss)",
            Feature::SlidingWindow => "sliding-window attention (Gemma 3, gpt-oss)",
            Feature::AttentionSinks => "attention sinks (gpt-oss)",
            Feature::Gemma => "Gemma models",
            Feature::Gemma4 => "Gemma 4",
            Feature::LinearAttention => "Gated DeltaNet hybrids (Qwen3.5, Qwen3.6, Qwen3-Next)",
            Feature::DeepStack => "Qwen3-VL (its DeepStack visual features)",
            Feature::Encoder => "encoder models (BERT, XLM-RoBERTa)",
            Feature::LatentAttention => {
                "multi-head latent attention (DeepSeek-V3, Kimi K2, GLM-4.7-Flash)"
            }
            Feature::SpanNorm => "q/k norms over the whole projection (OLMo 2, OLMo 3, MiniMax-M2)",
            Feature::BidirectionalImages => {
                "images on Gemma 4 models whose image tokens attend both ways (26B-A4B, 31B)"
            }
        }
    }
}

/// The error for a model that needs `feature` on a backend without it.
pub fn refused(backend: &str, feature: Feature) -> crate::error::EngineError {
    crate::error::EngineError::Backend(format!(
        "the {backend} engine does not run {} yet: use --device cpu",
        feature.describe()
    ))
}
