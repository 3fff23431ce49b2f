//! Bidirectional encoders (BERT, XLM-RoBERTa, RoBERTa), written once against [`Backend`]:
//! word + position + token-type embeddings and their LayerNorm, then post-LN layers (fused
//! QKV, attention over each whole sequence, output projection, residual, LayerNorm; GELU
//! MLP, residual, LayerNorm). No K/V is kept: every sequence runs whole in one step. The
//! pooled state's head runs on the host ([`crate::pooler`]); [`EncoderEngine`] is the step
//! boundary.

mod engine;
mod load;

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::config::encoder::EncoderConfig;
use lmi_checkpoint::dtype::DType;

use crate::backend::Backend;
use crate::error::Result;
use crate::pooler::HostHead;

pub use engine::EncoderEngine;

/// One post-LN layer.
pub(crate) struct EncoderLayer<W> {
    /// query, key and value fused `[3 · hidden, hidden]`, and their biases.
    qkv: W,
    qkv_bias: W,
    /// `attention.output.dense`.
    out: W,
    out_bias: W,
    /// `attention.output.LayerNorm`.
    attn_norm: (W, W),
    /// `intermediate.dense` `[intermediate, hidden]`.
    up: W,
    up_bias: W,
    /// `output.dense` `[hidden, intermediate]`.
    down: W,
    down_bias: W,
    /// `output.LayerNorm`.
    mlp_norm: (W, W),
}

pub struct Encoder<B: Backend> {
    pub config: ModelConfig,
    pub encoder: EncoderConfig,
    /// Element type of the matrices (and the word embeddings) in memory.
    pub dtype: DType,
    word: B::Weight,
    /// Positions and token types, kept in f32 on every backend (`Backend::upload_router`).
    position: B::Weight,
    token_type: B::Weight,
    embed_norm: (B::Weight, B::Weight),
    layers: Vec<EncoderLayer<B::Weight>>,
    /// The pooled state's Dense modules or classifier, on the host.
    pub head: HostHead,
}

/// A step's host-side inputs beside its layout: each token's position and type ids.
pub struct EncoderInputs<'a> {
    pub positions: &'a [u32],
    pub types: &'a [u32],
    /// Per sequence its first token, and the total (`BatchLayout::cu_tokens`).
    pub cu: &'a [u32],
}

impl<B: Backend> Encoder<B> {
    /// Bytes of the matrices a step reads (not the tables it gathers rows from).
    pub fn weight_bytes(&self, backend: &B) -> usize {
        let w = |x: &B::Weight| backend.weight_bytes(x);
        self.layers
            .iter()
            .map(|l| {
                w(&l.qkv)
                    + w(&l.qkv_bias)
                    + w(&l.out)
                    + w(&l.out_bias)
                    + w(&l.attn_norm.0)
                    + w(&l.attn_norm.1)
                    + w(&l.up)
                    + w(&l.up_bias)
                    + w(&l.down)
                    + w(&l.down_bias)
                    + w(&l.mlp_norm.0)
                    + w(&l.mlp_norm.1)
            })
            .sum()
    }

    /// Bytes of every weight held on the device.
    pub fn resident_bytes(&self, backend: &B) -> usize {
        let w = |x: &B::Weight| backend.weight_bytes(x);
        self.weight_bytes(backend)
            + w(&self.word)
            + w(&self.position)
            + w(&self.token_type)
            + w(&self.embed_norm.0)
            + w(&self.embed_norm.1)
    }

    /// The final hidden states `[tokens, hidden]` (f32) of every token of the step, whose
    /// sequences are `inputs.cu`'s, uploaded as `step` (its token ids).
    pub fn forward(
        &self,
        backend: &B,
        step: &B::Step,
        inputs: &EncoderInputs<'_>,
    ) -> Result<B::Buf> {
        let c = &self.config;
        let n = inputs.positions.len();
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let eps = self.encoder.layer_norm_eps as f32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();

        let mut x = backend.alloc(n * h)?;
        let mut hidden = backend.alloc(n * h)?;
        let mut qkv = backend.alloc(n * 3 * h)?;
        let mut ctx = backend.alloc_matmul_input(n * h)?;
        let mut proj = backend.alloc(n * h)?;
        let mut up = backend.alloc(n * inter)?;

        backend.embedding(&self.word, step, &mut x)?;
        backend.gather_add(&self.position, inputs.positions, &mut x)?;
        backend.gather_add(&self.token_type, inputs.types, &mut x)?;
        let (w, b) = &self.embed_norm;
        backend.layer_norm(&x, n, w, b, eps, &mut hidden)?;
        for l in &self.layers {
            backend.linear(&hidden, n, &l.qkv, Some(&l.qkv_bias), &mut qkv)?;
            backend.encoder_attention(&qkv, inputs.cu, c.num_heads, c.head_dim, scale, &mut ctx)?;
            backend.linear(&ctx, n, &l.out, Some(&l.out_bias), &mut proj)?;
            backend.add(&mut proj, &hidden, n * h)?;
            backend.layer_norm(&proj, n, &l.attn_norm.0, &l.attn_norm.1, eps, &mut hidden)?;
            backend.linear(&hidden, n, &l.up, Some(&l.up_bias), &mut up)?;
            backend.gelu(&mut up, n * inter, self.encoder.gelu_tanh)?;
            backend.linear(&up, n, &l.down, Some(&l.down_bias), &mut proj)?;
            backend.add(&mut proj, &hidden, n * h)?;
            backend.layer_norm(&proj, n, &l.mlp_norm.0, &l.mlp_norm.1, eps, &mut hidden)?;
        }
        for buf in [x, qkv, ctx, proj, up] {
            backend.recycle(buf);
        }
        Ok(hidden)
    }
}
