//! Gemma 4's text model (transformers' `Gemma4TextModel`): Gemma 3's sandwich of norms (plain
//! `x · w` norms here), local layers of `head_dim` and global ones of `global_head_dim` with
//! their own KV heads and "proportional" RoPE, V normalized without a weight (and on the global
//! layers of the larger models the K projection's output, `attention_k_eq_v`), attention scores
//! unscaled, per-layer embeddings, the last layers attending over an earlier layer's K/V, a
//! mixture of experts beside the dense MLP, each layer's output scaled by its `layer_scalar`,
//! and the final logits soft-capped.

use lmi_checkpoint::config::{Gemma4Config, ModelConfig};
use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{HostTensor, WeightSource};

use super::{KvCache, Model, PooledForward};
use crate::backend::{AttnScoring, Backend, QkNorm, QkvLayout};
use crate::batch::BatchLayout;
use crate::error::{EngineError, Result};
use crate::moe::{Expert, MoeLayer};

/// Per pool of a Gemma 4 cache: its (KV heads, head width), and whether it is local.
pub type KvPools = (Vec<(usize, usize)>, Vec<bool>);

/// Per-layer embeddings: a token's table row (`[ple_vocab, layers · ple_dim]`) and a
/// projection of its embedding, normed per layer, each layer gating its own slice.
pub(crate) struct Ple<W> {
    table: W,
    /// `[layers · ple_dim, hidden]`.
    proj: W,
    /// `[ple_dim]`.
    norm: W,
    /// The table's row of the pad token: an image's soft tokens take it in place of their
    /// placeholder's (transformers' `Gemma4Model` looks up `pad_token_id` there); None
    /// without a vision tower.
    media_row: Option<Vec<f32>>,
}

/// One layer's per-layer-input gate (`[ple_dim, hidden]`), projection back
/// (`[hidden, ple_dim]`) and the norm after it.
pub(crate) struct LayerPle<W> {
    gate: W,
    proj: W,
    norm: W,
}

/// The experts beside a layer's dense MLP ([`load_moe`]): router and experts both read the
/// residual's RMS norm times `input_norm`.
pub(crate) struct LayerMoe<W, X> {
    layer: MoeLayer<W>,
    index: X,
    input_norm: W,
    post_dense: W,
    post_experts: W,
}

pub(crate) struct Gemma4Layer<B: Backend> {
    local: bool,
    layout: QkvLayout,
    /// `[q; k; v]` rows (`[q; k; k]` where K = V; `[q; 0; 0]` where the layer reads another
    /// layer's K/V: the zero rows keep the fused row layout attention reads).
    qkv: B::Weight,
    q_norm: B::Weight,
    k_norm: B::Weight,
    o_proj: B::Weight,
    /// The pool this layer attends over, and whether it writes it.
    kv: usize,
    writes_kv: bool,
    input_norm: B::Weight,
    post_attn_norm: B::Weight,
    pre_mlp_norm: B::Weight,
    post_mlp_norm: B::Weight,
    gate_up: B::Weight,
    down: B::Weight,
    width: usize,
    moe: Option<LayerMoe<B::Weight, B::Experts>>,
    ple: Option<LayerPle<B::Weight>>,
    scalar: f32,
}

pub(crate) struct Gemma4Layers<B: Backend> {
    layers: Vec<Gemma4Layer<B>>,
    rope_global: B::Rope,
    ple: Option<Ple<B::Weight>>,
    /// Weights of ones: V's norm (local and global widths).
    ones_local: B::Weight,
    ones_global: B::Weight,
}

/// The config's Gemma 4 fields (present for every model this file loads).
fn g4(c: &ModelConfig) -> Result<&Gemma4Config> {
    c.gemma4
        .as_ref()
        .ok_or_else(|| EngineError::Backend("not a Gemma 4 config".into()))
}

fn layer_local(c: &ModelConfig, i: usize) -> bool {
    c.sliding_window.as_ref().is_some_and(|w| w.local[i])
}

impl<B: Backend> Gemma4Layers<B> {
    /// Per pool (layers that keep K/V, in order): its geometry, and whether it is local.
    pub(crate) fn pools(&self, c: &ModelConfig) -> KvPools {
        let local = self
            .layers
            .iter()
            .filter(|l| l.writes_kv)
            .map(|l| l.local)
            .collect();
        (c.kv_pool_geometry(), local)
    }

    /// Bytes of the layers' matrices a step of `tokens` tokens reads (None: all).
    pub(crate) fn bytes(&self, w: &impl Fn(&B::Weight) -> usize, tokens: Option<usize>) -> usize {
        let mut total = self.ple.as_ref().map_or(0, |p| w(&p.proj) + w(&p.norm));
        for l in &self.layers {
            total += w(&l.qkv) + w(&l.o_proj) + w(&l.gate_up) + w(&l.down);
            total += [
                &l.q_norm,
                &l.k_norm,
                &l.input_norm,
                &l.post_attn_norm,
                &l.pre_mlp_norm,
                &l.post_mlp_norm,
            ]
            .into_iter()
            .map(w)
            .sum::<usize>();
            if let Some(p) = &l.ple {
                total += w(&p.gate) + w(&p.proj) + w(&p.norm);
            }
            if let Some(m) = &l.moe {
                let x = &m.layer;
                let all: usize = x.experts.iter().map(|e| w(&e.gate_up) + w(&e.down)).sum();
                // Experts a step of `t` tokens reads, each picking `top_k` of `E` at random.
                let read = match tokens {
                    None => all,
                    Some(t) => {
                        let e = x.experts.len().max(1) as f64;
                        let hit = e * (1.0 - (1.0 - x.top_k as f64 / e).powi(t as i32));
                        (all as f64 / e * hit).round() as usize
                    }
                };
                total +=
                    w(&x.router) + read + w(&m.input_norm) + w(&m.post_dense) + w(&m.post_experts);
            }
        }
        total
    }

    /// Loads the layers of a Gemma 4 checkpoint (`lm`: its text model's tensor prefix), noting
    /// the formats its matrices are held in into `formats`.
    pub(crate) fn load(
        backend: &B,
        c: &ModelConfig,
        st: &WeightSource,
        lm: &str,
        dtype: DType,
        formats: &std::cell::RefCell<std::collections::BTreeSet<&'static str>>,
    ) -> Result<Self> {
        let g = g4(c)?;
        if let Some(most) = backend.max_head_dim() {
            let widest = c.head_dim.max(g.global_head_dim);
            if widest > most {
                return Err(EngineError::Backend(format!(
                    "the {} engine does not run this Gemma 4 yet: its attention takes heads of \
                     up to {most} dimensions, and this model's global layers have {} (local \
                     {}): use --device cpu",
                    backend.name(),
                    g.global_head_dim,
                    c.head_dim
                )));
            }
        }
        let h = c.hidden_size;
        let mat = |name: &str, shape: &[usize]| -> Result<HostTensor> {
            let t = st.load(name, shape, dtype)?;
            super::load::note_format(&mut formats.borrow_mut(), &t);
            Ok(t)
        };
        let up = |t: HostTensor| backend.upload_weight(t);
        let norm = |name: &str, len: usize| up(st.load(name, &[len], DType::F32)?);
        let ones = |len: usize| up(HostTensor::f32(vec![len], vec![1.0; len]));
        let mut layers = Vec::with_capacity(c.num_layers);
        // Pool of each layer that keeps K/V.
        let mut pool_of = vec![usize::MAX; c.num_layers];
        let mut pools = 0;
        for i in 0..c.num_layers {
            let p = format!("{lm}layers.{i}");
            let a = format!("{p}.self_attn");
            let local = layer_local(c, i);
            let (kv_heads, d) = match local {
                true => (c.num_kv_heads, c.head_dim),
                false => (g.global_kv_heads, g.global_head_dim),
            };
            let layout = QkvLayout {
                q_heads: c.num_heads,
                kv_heads,
                head_dim: d,
            };
            let (qs, kvs) = (c.num_heads * d, kv_heads * d);
            let q = mat(&format!("{a}.q_proj.weight"), &[qs, h])?;
            let writes_kv = !g.shares_kv(i);
            let (qkv, k_norm, kv) = if writes_kv {
                pool_of[i] = pools;
                pools += 1;
                let k = mat(&format!("{a}.k_proj.weight"), &[kvs, h])?;
                let v = match g.k_eq_v && !local {
                    true => k.clone(),
                    false => mat(&format!("{a}.v_proj.weight"), &[kvs, h])?,
                };
                let k_norm = norm(&format!("{a}.k_norm.weight"), d)?;
                (HostTensor::concat_rows(vec![q, k, v]), k_norm, pool_of[i])
            } else {
                let zeros = zero_rows(&q, 2 * kvs, h, dtype);
                let k_norm = ones(d)?;
                (
                    HostTensor::concat_rows(vec![q, zeros]),
                    k_norm,
                    pool_of[g.kv_source[i]],
                )
            };
            let width = match g.double_wide_mlp && !writes_kv {
                true => 2 * c.intermediate_size,
                false => c.intermediate_size,
            };
            let m = format!("{p}.mlp");
            let gate_up = HostTensor::concat_rows(vec![
                mat(&format!("{m}.gate_proj.weight"), &[width, h])?,
                mat(&format!("{m}.up_proj.weight"), &[width, h])?,
            ]);
            let moe = match &c.moe {
                Some(cfg) => {
                    let note =
                        |t: &HostTensor| super::load::note_format(&mut formats.borrow_mut(), t);
                    Some(load_moe(backend, cfg, st, &p, h, dtype, &note)?)
                }
                None => None,
            };
            let ple = match g.ple_dim {
                0 => None,
                pd => Some(LayerPle {
                    gate: up(mat(&format!("{p}.per_layer_input_gate.weight"), &[pd, h])?)?,
                    proj: up(mat(&format!("{p}.per_layer_projection.weight"), &[h, pd])?)?,
                    norm: norm(&format!("{p}.post_per_layer_input_norm.weight"), h)?,
                }),
            };
            let scalar = st
                .load(&format!("{p}.layer_scalar"), &[1], DType::F32)?
                .to_f32_vec()[0];
            layers.push(Gemma4Layer {
                local,
                layout,
                qkv: up(qkv)?,
                q_norm: norm(&format!("{a}.q_norm.weight"), d)?,
                k_norm,
                o_proj: up(mat(&format!("{a}.o_proj.weight"), &[h, qs])?)?,
                kv,
                writes_kv,
                input_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                post_attn_norm: norm(&format!("{p}.post_attention_layernorm.weight"), h)?,
                pre_mlp_norm: norm(&format!("{p}.pre_feedforward_layernorm.weight"), h)?,
                post_mlp_norm: norm(&format!("{p}.post_feedforward_layernorm.weight"), h)?,
                gate_up: up(gate_up)?,
                down: up(mat(&format!("{m}.down_proj.weight"), &[h, width])?)?,
                width,
                moe,
                ple,
                scalar,
            });
        }
        let ple = match g.ple_dim {
            0 => None,
            pd => {
                let all = c.num_layers * pd;
                Some(Ple {
                    table: up(mat(
                        &format!("{lm}embed_tokens_per_layer.weight"),
                        &[g.ple_vocab, all],
                    )?)?,
                    proj: up(mat(
                        &format!("{lm}per_layer_model_projection.weight"),
                        &[all, h],
                    )?)?,
                    norm: norm(&format!("{lm}per_layer_projection_norm.weight"), pd)?,
                    media_row: match c.vision.as_ref().and_then(|v| v.gemma4.as_ref()) {
                        Some(v) => st
                            .load_rows(
                                &format!("{lm}embed_tokens_per_layer.weight"),
                                [g.ple_vocab, all],
                                &[v.pad_token_id as usize],
                            )?
                            .pop(),
                        None => None,
                    },
                })
            }
        };
        Ok(Gemma4Layers {
            layers,
            rope_global: backend.rope_table(&g.global_inv_freq(c.rope_theta))?,
            ple,
            ones_local: ones(c.head_dim)?,
            ones_global: ones(g.global_head_dim)?,
        })
    }

    /// One step (see [`Model::forward_pooled`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        model: &Model<B>,
        backend: &B,
        layout: &BatchLayout,
        step: &B::Step,
        kv: &mut KvCache<B>,
        embeds: Option<&super::InputEmbeds>,
        pool_rows: usize,
    ) -> Result<PooledForward<B>> {
        let c = &model.config;
        let g = g4(c)?;
        if !layout.adapter_rows.is_empty() {
            return Err(EngineError::Batch(
                "LoRA adapters are not supported for Gemma 4 yet".into(),
            ));
        }
        let media = embeds.filter(|e| !e.rows.is_empty());
        // Per token, the last position the sliding layers let it see (an image's soft
        // tokens see the whole image where the model attends both ways).
        let through = match media {
            Some(e) => super::gemma4_media::check(c, backend, e, layout)?,
            None => None,
        };
        let n = layout.num_tokens();
        let h = c.hidden_size;
        let eps = c.rms_norm_eps as f32;
        let window = c.sliding_window.as_ref().map(|w| w.size);
        let window_step = backend.window_step(step);
        let rope_local = model
            .rope_local
            .as_ref()
            .ok_or_else(|| EngineError::Backend("Gemma 4 without its local RoPE".into()))?;
        let max_qkv = self
            .layers
            .iter()
            .map(|l| l.layout.row_width())
            .max()
            .unwrap_or(1);
        let max_q = self
            .layers
            .iter()
            .map(|l| l.layout.q_heads * l.layout.head_dim)
            .max()
            .unwrap_or(1);
        let max_width = self.layers.iter().map(|l| l.width).max().unwrap_or(1);

        let mut residual = backend.alloc(n * h)?;
        let mut normed = backend.alloc_matmul_input(n * h)?;
        let mut qkv = backend.alloc(n * max_qkv)?;
        let mut attn = backend.alloc_matmul_input(n * max_q)?;
        let mut proj = backend.alloc(n * h)?;
        let mut post = backend.alloc(n * h)?;
        let mut gate_up = backend.alloc(n * 2 * max_width)?;
        let mut act = backend.alloc_matmul_input(n * max_width)?;
        let moe = c.moe.is_some();
        let mut experts_out = backend.alloc(if moe { n * h } else { 1 })?;
        let mut experts_post = backend.alloc(if moe { n * h } else { 1 })?;

        backend.embedding(&model.embed, step, &mut residual)?;
        backend.scale(&mut residual, n * h, (h as f32).sqrt())?;
        // An image's embeddings replace its soft tokens' rows (unscaled), before the
        // per-layer inputs project them.
        if let Some(e) = media {
            backend.write_rows(&mut residual, h, &e.rows, &e.data)?;
        }
        let ple = match (&self.ple, g.ple_dim) {
            (Some(p), pd) if pd > 0 => Some(self.per_layer_inputs(
                backend,
                p,
                &residual,
                step,
                (n, c.num_layers, pd, h),
                eps,
                media,
            )?),
            _ => None,
        };
        let mut ple_gate = backend.alloc(n * g.ple_dim.max(1))?;

        for (i, l) in self.layers.iter().enumerate() {
            let ql = l.layout;
            backend.rms_norm(&residual, n, &l.input_norm, eps, &mut normed)?;
            backend.linear(&normed, n, &l.qkv, None, &mut qkv)?;
            let attn_step = match &window_step {
                Some(w) if l.local && kv.in_window_pool(l.kv) => w,
                _ => step,
            };
            let rope = if l.local {
                rope_local
            } else {
                &self.rope_global
            };
            let (k_cache, v_cache) = &mut kv.layers[l.kv];
            if l.writes_kv {
                let ones = if l.local {
                    &self.ones_local
                } else {
                    &self.ones_global
                };
                let first_v = ql.q_heads + ql.kv_heads;
                backend.head_rms_norm(&mut qkv, n, ql, first_v, ql.kv_heads, ones, eps)?;
                let norm = QkNorm {
                    q: &l.q_norm,
                    k: &l.k_norm,
                    eps,
                };
                backend.qk_norm_rope_write_kv(
                    &mut qkv,
                    n,
                    attn_step,
                    ql,
                    Some(norm),
                    rope,
                    k_cache,
                    v_cache,
                )?;
            } else {
                // q only: the layer reads the K/V an earlier layer wrote.
                backend.head_rms_norm(&mut qkv, n, ql, 0, ql.q_heads, &l.q_norm, eps)?;
                backend.rope(&mut qkv, attn_step, ql, rope)?;
            }
            let scoring = AttnScoring {
                scale: 1.0,
                window: window.filter(|_| l.local),
                sinks: None,
                through: through.as_deref().filter(|_| l.local),
            };
            backend.attention(&qkv, attn_step, ql, k_cache, v_cache, scoring, &mut attn)?;
            backend.linear(&attn, n, &l.o_proj, None, &mut proj)?;
            backend.rms_norm(&proj, n, &l.post_attn_norm, eps, &mut post)?;
            backend.add_rms_norm(&mut residual, &post, n, &l.pre_mlp_norm, eps, &mut normed)?;
            backend.linear(&normed, n, &l.gate_up, None, &mut gate_up)?;
            backend.gelu_tanh_mul(&gate_up, n, l.width, &mut act)?;
            backend.linear(&act, n, &l.down, None, &mut proj)?;
            if let Some(m) = &l.moe {
                backend.rms_norm(&proj, n, &m.post_dense, eps, &mut post)?;
                backend.rms_norm(&residual, n, &m.input_norm, eps, &mut normed)?;
                backend.moe(&normed, n, h, &m.layer, &m.index, &mut experts_out)?;
                backend.rms_norm(&experts_out, n, &m.post_experts, eps, &mut experts_post)?;
                backend.add(&mut post, &experts_post, n * h)?;
                std::mem::swap(&mut proj, &mut post);
            }
            backend.rms_norm(&proj, n, &l.post_mlp_norm, eps, &mut post)?;
            backend.add(&mut residual, &post, n * h)?;
            if let (Some(p), Some(all)) = (&l.ple, &ple) {
                let pd = g.ple_dim;
                backend.linear(&residual, n, &p.gate, None, &mut ple_gate)?;
                backend.gelu_tanh_mul_slice(
                    &mut ple_gate,
                    all,
                    n,
                    pd,
                    c.num_layers * pd,
                    i * pd,
                )?;
                backend.linear(&ple_gate, n, &p.proj, None, &mut proj)?;
                backend.rms_norm(&proj, n, &p.norm, eps, &mut post)?;
                backend.add(&mut residual, &post, n * h)?;
            }
            if l.scalar != 1.0 {
                backend.scale(&mut residual, n * h, l.scalar)?;
            }
        }
        for b in [
            normed,
            qkv,
            attn,
            gate_up,
            act,
            post,
            experts_out,
            experts_post,
        ] {
            backend.recycle(b);
        }
        backend.recycle(ple_gate);
        if let Some(p) = ple {
            backend.recycle(p);
        }

        let rows = layout.logits_rows.len();
        if rows == 0 {
            backend.recycle(residual);
            backend.recycle(proj);
            return Ok((None, None));
        }
        let mut picked = backend.alloc(rows * h)?;
        backend.gather_logit_rows(&residual, step, h, &mut picked)?;
        let lm_rows = rows.saturating_sub(pool_rows);
        let logits = match lm_rows {
            0 => None,
            _ => {
                let mut picked_normed = backend.alloc_matmul_input(lm_rows * h)?;
                backend.rms_norm(&picked, lm_rows, &model.final_norm, eps, &mut picked_normed)?;
                let mut logits = backend.alloc(lm_rows * c.vocab_size)?;
                let head = model.lm_head.as_ref().unwrap_or(&model.embed);
                backend.linear(&picked_normed, lm_rows, head, None, &mut logits)?;
                if let Some(cap) = g.final_logit_softcapping {
                    backend.softcap(&mut logits, lm_rows * c.vocab_size, cap as f32)?;
                }
                backend.recycle(picked_normed);
                Some(logits)
            }
        };
        let pooled = match pool_rows {
            0 => None,
            _ => {
                let mut normed = backend.alloc(rows * h)?;
                backend.rms_norm(&picked, rows, &model.final_norm, eps, &mut normed)?;
                Some(normed)
            }
        };
        for b in [residual, proj, picked] {
            backend.recycle(b);
        }
        Ok((logits, pooled))
    }

    /// The per-layer inputs `[tokens, layers · ple_dim]`: (norm(embeds · W / √hidden) per layer
    /// + table[token] · √ple_dim) / √2, `embeds` the scaled token embeddings.
    ///
    /// At an image's soft tokens: its embeddings, and the pad token's table row.
    #[allow(clippy::too_many_arguments)]
    fn per_layer_inputs(
        &self,
        backend: &B,
        p: &Ple<B::Weight>,
        embeds: &B::Buf,
        step: &B::Step,
        (n, layers, pd, h): (usize, usize, usize, usize),
        eps: f32,
        media: Option<&super::InputEmbeds>,
    ) -> Result<B::Buf> {
        let all = layers * pd;
        let mut tok = backend.alloc(n * all)?;
        backend.embedding(&p.table, step, &mut tok)?;
        if let Some(e) = media {
            super::gemma4_media::pad_rows(backend, &mut tok, all, e, p.media_row.as_deref())?;
        }
        backend.scale(&mut tok, n * all, (pd as f32).sqrt())?;
        let mut projected = backend.alloc(n * all)?;
        backend.linear(embeds, n, &p.proj, None, &mut projected)?;
        backend.scale(&mut projected, n * all, (h as f64).powf(-0.5) as f32)?;
        let mut out = backend.alloc(n * all)?;
        backend.rms_norm(&projected, n * layers, &p.norm, eps, &mut out)?;
        backend.add(&mut out, &tok, n * all)?;
        backend.scale(&mut out, n * all, std::f32::consts::FRAC_1_SQRT_2)?;
        backend.recycle(tok);
        backend.recycle(projected);
        Ok(out)
    }
}

/// A layer's experts (`{p}.router.*`, `{p}.experts.*`, stacked as transformers writes them)
/// in the file's form (a GGUF's blocks as stored), the norm of their input and of the two
/// outputs ([`LayerMoe`]).
///
/// transformers' router reads `norm(x) · scale · hidden^-0.5` and the experts read
/// `norm(x) · pre` (`pre_feedforward_layernorm_2`); both are given `norm(x) · pre`, the router
/// with its rows times `scale · hidden^-0.5 / pre`. Each expert's `per_expert_scale`, a factor
/// on its routing weight, scales its down projection (a block format's scales, exactly
/// enough: `HostTensor::scaled`). Where `pre` has a zero (the router could not see that
/// channel) or the blocks cannot be scaled (MXFP4), the factors are folded into the experts'
/// values instead, held in the load's dtype. `note` hears each expert matrix's held format.
fn load_moe<B: Backend>(
    backend: &B,
    cfg: &crate::moe::MoeConfig,
    st: &WeightSource,
    p: &str,
    h: usize,
    dtype: DType,
    note: &dyn Fn(&HostTensor),
) -> Result<LayerMoe<B::Weight, B::Experts>> {
    let (e, w) = (cfg.num_experts, cfg.expert_intermediate_size);
    let f32s = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        Ok(st.load(name, shape, DType::F32)?.to_f32_vec())
    };
    let scale = f32s(&format!("{p}.router.scale"), &[h])?;
    let root = (h as f64).powf(-0.5) as f32;
    let per_expert = f32s(&format!("{p}.router.per_expert_scale"), &[e])?;
    let pre = f32s(&format!("{p}.pre_feedforward_layernorm_2.weight"), &[h])?;
    let gate_up = st
        .load(&format!("{p}.experts.gate_up_proj"), &[e, 2 * w, h], dtype)?
        .unstack();
    let down = st
        .load(&format!("{p}.experts.down_proj"), &[e, h, w], dtype)?
        .unstack();
    let scaled: Option<Vec<HostTensor>> = down
        .iter()
        .zip(&per_expert)
        .map(|(d, &s)| d.scaled(s))
        .collect();
    let divisible = pre.iter().all(|&v| v != 0.0 && v.is_finite());
    let (experts, router_cols, input_norm) = match (scaled, divisible) {
        (Some(down), true) => {
            let cols: Vec<f32> = scale.iter().zip(&pre).map(|(s, v)| s * root / v).collect();
            // A stack of floats loads unquantized whatever the dtype (only matrices take
            // int8 at load): each expert takes it here. Blocks stay as they are.
            let held = |t: HostTensor| match t.data {
                lmi_checkpoint::weights::HostData::Quant(_) => t,
                _ => t.to_dtype(dtype),
            };
            let experts = gate_up
                .into_iter()
                .zip(down)
                .map(|(gu, d)| (held(gu), held(d)))
                .collect::<Vec<_>>();
            (experts, cols, pre)
        }
        _ => {
            let folded = gate_up
                .into_iter()
                .zip(down)
                .zip(&per_expert)
                .map(|((gu, d), &s)| {
                    let mut gu_v = gu.to_f32_vec();
                    for row in gu_v.chunks_exact_mut(h) {
                        row.iter_mut().zip(&pre).for_each(|(v, s)| *v *= s);
                    }
                    let d_v = d.to_f32_vec().into_iter().map(|v| v * s).collect();
                    (
                        HostTensor::f32(vec![2 * w, h], gu_v).to_dtype(dtype),
                        HostTensor::f32(vec![h, w], d_v).to_dtype(dtype),
                    )
                })
                .collect();
            let cols = scale.iter().map(|s| s * root).collect();
            (folded, cols, vec![1.0; h])
        }
    };
    let experts = experts
        .into_iter()
        .map(|(gu, d)| {
            note(&gu);
            note(&d);
            Ok(Expert {
                gate_up: backend.upload_weight(gu)?,
                down: backend.upload_weight(d)?,
                gate_up_bias: None,
                down_bias: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut router = f32s(&format!("{p}.router.proj.weight"), &[e, h])?;
    for row in router.chunks_exact_mut(h) {
        for (x, c) in row.iter_mut().zip(&router_cols) {
            *x *= c;
        }
    }
    let layer = MoeLayer {
        router: backend.upload_router(HostTensor::f32(vec![e, h], router))?,
        router_bias: None,
        experts,
        top_k: cfg.top_k,
        width: w,
        routing: cfg.routing,
        activation: cfg.activation,
        shared: None,
        correction_bias: None,
    };
    let index = backend.index_experts(&layer)?;
    let norm = |name: &str| {
        backend.upload_weight(st.load(&format!("{p}.{name}.weight"), &[h], DType::F32)?)
    };
    Ok(LayerMoe {
        layer,
        index,
        input_norm: backend.upload_weight(HostTensor::f32(vec![h], input_norm))?,
        post_dense: norm("post_feedforward_layernorm_1")?,
        post_experts: norm("post_feedforward_layernorm_2")?,
    })
}

impl<B: Backend> Model<B> {
    /// A Gemma 4 checkpoint's text model (a vision or audio tower beside it is not read).
    pub(super) fn load_gemma4(
        backend: &B,
        config: ModelConfig,
        st: &WeightSource,
        dtype: DType,
    ) -> Result<Self> {
        let c = &config;
        let h = c.hidden_size;
        let lm = super::load::text_prefix(st);
        let formats = std::cell::RefCell::new(std::collections::BTreeSet::new());
        let embed = st.load(
            &format!("{lm}embed_tokens.weight"),
            &[c.vocab_size, h],
            dtype,
        )?;
        super::load::note_format(&mut formats.borrow_mut(), &embed);
        let embed = backend.upload_weight(embed)?;
        let lm_head = match st.contains("lm_head.weight") && !c.tie_word_embeddings {
            true => Some(backend.upload_weight(st.load(
                "lm_head.weight",
                &[c.vocab_size, h],
                dtype,
            )?)?),
            false => None,
        };
        let gemma4 = Gemma4Layers::load(backend, c, st, lm, dtype, &formats)?;
        // The formats the matrices are held in (a GGUF's blocks stay as stored), as the other
        // models' `weights` label them, and the dtype that follows.
        let (weights, dtype) = super::load::held(formats.into_inner(), dtype);
        let final_norm =
            backend.upload_weight(st.load(&format!("{lm}norm.weight"), &[h], DType::F32)?)?;
        let local = c
            .rope_inv_freq_local()
            .ok_or_else(|| EngineError::Backend("Gemma 4 without local layers' RoPE".into()))?;
        let vision = match &c.vision {
            Some(v) => Some(crate::vision::VisionTower::load(v, st)?),
            None => None,
        };
        Ok(Model {
            weights,
            dtype,
            embed,
            lm_head,
            final_norm,
            layers: Vec::new(),
            rope: backend.rope_table(&local)?,
            rope_local: Some(backend.rope_table(&local)?),
            rope_none: None,
            embed_scale: None,
            vision,
            vision_device: None,
            head: None,
            gemma4: Some(gemma4),
            mtp_front: None,
            config,
        })
    }
}

/// Gemma 4's KV cache: pools of each layer's own geometry (`geometry`, per pool; `local` marks
/// the local ones), the local ones sized for their window (as [`crate::kv::KvWindow`] does for
/// Gemma 3) where the backend and `opts` keep window pools, the global ones from what the budget
/// leaves (`cfg.num_blocks` when the blocks are given or a warm-up sizes them).
pub fn geometry_kv<B: Backend>(
    backend: &B,
    c: &ModelConfig,
    opts: &crate::engine::EngineOptions,
    device_share: bool,
    cfg: crate::kv::KvCacheConfig,
    geometry: Vec<(usize, usize)>,
    local: Vec<bool>,
) -> Result<KvCache<B>> {
    let bytes = |&(h, d): &(usize, usize)| 2 * h * d * crate::kv::BLOCK_SIZE * cfg.dtype.size();
    let window = c
        .sliding_window
        .as_ref()
        .filter(|_| opts.window_pools && backend.window_pools() && local.iter().any(|&l| l));
    let window = window.and_then(|w| {
        let shape = opts.max_step;
        let blocks =
            crate::kv::KvWindow::blocks_for_step(w.size, shape.seqs.max(1), shape.tokens.max(1));
        (blocks < cfg.num_blocks || device_share).then_some(crate::kv::KvWindow {
            blocks,
            size: w.size,
        })
    });
    let Some(w) = window else {
        return KvCache::with_geometry(backend, cfg, None, geometry);
    };
    let (mut window_bytes, mut global_bytes) = (0, 0);
    for (g, &l) in geometry.iter().zip(&local) {
        match l {
            true => window_bytes += w.blocks * bytes(g),
            false => global_bytes += bytes(g),
        }
    }
    let num_blocks = match (opts.kv_blocks, device_share) {
        (None, false) => (opts.kv_cache_bytes.saturating_sub(window_bytes) / global_bytes.max(1))
            .max(cfg.num_blocks),
        _ => cfg.num_blocks,
    };
    let cfg = crate::kv::KvCacheConfig { num_blocks, ..cfg };
    KvCache::with_geometry(backend, cfg, Some((w, local)), geometry)
}

/// `rows` zero rows in `like`'s form: its block format where it is quantized (so a GGUF's q
/// projection stays quantized beside them), else `dtype`.
fn zero_rows(like: &HostTensor, rows: usize, cols: usize, dtype: DType) -> HostTensor {
    use lmi_checkpoint::weights::HostData;
    let zeros = vec![0.0; rows * cols];
    if let HostData::Quant(parts) = &like.data
        && let [part] = &parts[..]
        && let Ok(m) = lmi_checkpoint::quant::QMatrix::quantize(part.qtype, rows, cols, &zeros)
    {
        return HostTensor {
            shape: vec![rows, cols],
            data: HostData::Quant(vec![m]),
        };
    }
    HostTensor::f32(vec![rows, cols], zeros).to_dtype(dtype)
}
