//! The few device operations a Llama-family step needs. The model is written once against
//! this trait; the CPU backend implements it here and the CUDA backend in crate `lmi-cuda`.
//!
//! Design rules that keep the trait fit for a GPU:
//! - buffers and weights are opaque device objects (`Buf`, `Weight`, `Kv`);
//! - a step's metadata (positions, slots, block tables) is uploaded once (`upload_step`) and
//!   referenced by every layer's ops; nothing comes back to the host until the logits;
//! - every op writes into a caller-provided buffer, so a backend may preallocate and replay.

use crate::batch::BatchLayout;
use crate::error::Result;
use crate::kv::KvCacheConfig;
use crate::weights::HostTensor;

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

pub trait Backend: Send + Sync + 'static {
    /// An activation buffer of f32 values.
    type Buf: Send;
    /// A weight resident on the device (matrix, embedding table, norm vector, bias).
    type Weight: Send + Sync;
    /// One layer's K or V pool: `[num_blocks, kv_heads, BLOCK_SIZE, head_dim]`.
    type Kv: Send;
    /// A step's layout, uploaded.
    type Step: Send;
    /// RoPE frequencies, uploaded once.
    type Rope: Send + Sync;

    fn name(&self) -> &'static str;

    fn upload_weight(&self, t: HostTensor) -> Result<Self::Weight>;
    /// Bytes a weight occupies on the device.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;
    fn rope_table(&self, inv_freq: &[f64]) -> Result<Self::Rope>;
    fn alloc_kv(&self, cfg: &KvCacheConfig) -> Result<Self::Kv>;
    fn upload_step(&self, layout: &BatchLayout) -> Result<Self::Step>;
    /// A zeroed buffer of `len` f32.
    fn alloc(&self, len: usize) -> Result<Self::Buf>;

    /// `out[t] = table[token_ids[t]]`, converted to f32.
    fn embedding(&self, table: &Self::Weight, step: &Self::Step, out: &mut Self::Buf);
    /// `out[rows, n] = x[rows, k] · wᵀ (+ bias)`, with `w` of shape `[n, k]`.
    fn linear(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        out: &mut Self::Buf,
    );
    /// `out = rms_norm(x) * w` per row of width `w.len()`.
    fn rms_norm(&self, x: &Self::Buf, rows: usize, w: &Self::Weight, eps: f32, out: &mut Self::Buf);
    /// `residual += delta; out = rms_norm(residual) * w`.
    fn add_rms_norm(
        &self,
        residual: &mut Self::Buf,
        delta: &Self::Buf,
        rows: usize,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Buf,
    );
    /// `residual += delta`.
    fn add(&self, residual: &mut Self::Buf, delta: &Self::Buf, len: usize);
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
    );
    /// Rotate-half RoPE on the q and k heads of every QKV row, at each token's position.
    fn rope(&self, qkv: &mut Self::Buf, step: &Self::Step, layout: QkvLayout, rope: &Self::Rope);
    /// Stores each token's k and v heads at its slot.
    fn write_kv(
        &self,
        qkv: &Self::Buf,
        step: &Self::Step,
        layout: QkvLayout,
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
    );
    /// Causal attention of each token's q heads over its sequence's cached keys
    /// `0 ..= position`, read through the block table. `out` is `[tokens, q_heads * head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        qkv: &Self::Buf,
        step: &Self::Step,
        layout: QkvLayout,
        k_cache: &Self::Kv,
        v_cache: &Self::Kv,
        scale: f32,
        out: &mut Self::Buf,
    );
    /// `out[r, i] = silu(gate[r, i]) * up[r, i]`, each input row holding `[gate | up]` (2·`width`).
    fn silu_mul(&self, gate_up: &Self::Buf, rows: usize, width: usize, out: &mut Self::Buf);
    /// LoRA delta for the listed token rows: `out[r, offset .. offset + n] += b · (a · x[r])`,
    /// with `a` of shape `[rank, x_width]` and `b` of shape `[n, rank]` (scale folded in).
    #[allow(clippy::too_many_arguments)]
    fn lora(
        &self,
        x: &Self::Buf,
        x_width: usize,
        rows: &[u32],
        a: &Self::Weight,
        b: &Self::Weight,
        out: &mut Self::Buf,
        out_width: usize,
        out_offset: usize,
    );
    /// Gathers the step's `logits_rows` rows of `x` (row width `width`) into `out`.
    fn gather_logit_rows(
        &self,
        x: &Self::Buf,
        step: &Self::Step,
        width: usize,
        out: &mut Self::Buf,
    );
    /// The first `len` values on the host (the buffer is consumed).
    fn to_host(&self, buf: Self::Buf, len: usize) -> Result<Vec<f32>>;
    /// Gives a scratch buffer back for reuse by later `alloc`s (a step allocates the same
    /// sizes every time).
    fn recycle(&self, _buf: Self::Buf) {}
    /// Runs one forward pass. The CPU backend runs it on its thread pool, so the pass's
    /// hundreds of parallel ops fork and join among pool threads instead of each waking the
    /// pool from outside and sleeping until it finishes.
    fn run_forward<R: Send>(&self, forward: impl FnOnce() -> R + Send) -> R {
        forward()
    }
    /// Copies whole blocks `src → dst` in one layer's pool (copy-on-write of shared blocks).
    fn copy_blocks(&self, cache: &mut Self::Kv, cfg: &KvCacheConfig, pairs: &[(u32, u32)]);
}
