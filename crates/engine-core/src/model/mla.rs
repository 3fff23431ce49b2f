//! A multi-head latent attention layer (DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash). Each token's
//! keys and values come from one compressed latent (`kv_lora_rank` values, RMS-normalized)
//! and one rotary key part shared by the heads: the cache holds only those
//! ([`MlaConfig::cache_width`] values a token and layer). Attention runs in the latent space
//! with kv_b_proj's up-projections absorbed, for prefill and decode alike: a head's score is
//! `(W_UKᵀ q_nope) · latent + q_rope · k_rope`, its output `W_UV · Σ p · latent`.
//!
//! The rotary parts are interleaved in the checkpoints (`rope_interleave`: pairs `(x0, x1),
//! (x2, x3), ...`). A dot product is unchanged when q and k are permuted alike, so the rows
//! of those parts are reordered at load (`[x0, x2, ..., x1, x3, ...]`) and turned with the
//! rotate-half RoPE of every other model.

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::config::mla::MlaConfig;
use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{HostTensor, WeightSource};

use super::KvCache;
use crate::backend::{Backend, MlaDims};
use crate::error::{EngineError, Result};

pub(crate) struct LatentAttn<B: Backend> {
    /// `q_a_proj` and `q_a_layernorm` (None: `q_b` is a plain `q_proj`).
    q_a: Option<(B::Weight, B::Weight)>,
    /// `q_b_proj` (or `q_proj`), `[heads · (nope + rope), q_lora or hidden]`.
    q_b: B::Weight,
    /// `kv_a_proj_with_mqa`, `[kv_lora + rope, hidden]`.
    kv_a: B::Weight,
    kv_norm: B::Weight,
    /// kv_b_proj's key rows per head, transposed: `[heads, kv_lora, nope]`, as
    /// [`Backend::mla_per_head`] asks (one matrix per head, or one flat f32 weight).
    w_uk: Vec<B::Weight>,
    /// kv_b_proj's value rows per head: `[heads, v, kv_lora]`, in the same form.
    w_uv: Vec<B::Weight>,
    o_proj: B::Weight,
    /// Which of the cache's K/V pools is this layer's.
    kv: usize,
}

/// The latent-attention layers' step scratch (none for a model without them).
pub(crate) struct Scratch<B: Backend> {
    qa: B::Buf,
    qa_normed: B::Buf,
    q: B::Buf,
    kva: B::Buf,
    qkv: B::Buf,
    attn: B::Buf,
}

/// The backend's view of a model's latent-attention shape.
pub(crate) fn dims(c: &ModelConfig, m: &MlaConfig) -> MlaDims {
    MlaDims {
        heads: c.num_heads,
        kv_lora: m.kv_lora_rank,
        nope: m.qk_nope_head_dim,
        rope: m.qk_rope_head_dim,
        v: m.v_head_dim,
        rope_factor: c.rope_yarn.map_or(1.0, |y| y.attention_factor) as f32,
    }
}

impl<B: Backend> Scratch<B> {
    pub fn new(backend: &B, c: &ModelConfig, n: usize) -> Result<Self> {
        let Some(m) = &c.mla else {
            return Ok(Scratch {
                qa: backend.alloc(1)?,
                qa_normed: backend.alloc(1)?,
                q: backend.alloc(1)?,
                kva: backend.alloc(1)?,
                qkv: backend.alloc(1)?,
                attn: backend.alloc(1)?,
            });
        };
        let d = dims(c, m);
        let q_lora = m.q_lora_rank.unwrap_or(1);
        Ok(Scratch {
            qa: backend.alloc(n * q_lora)?,
            qa_normed: backend.alloc_matmul_input(n * q_lora)?,
            q: backend.alloc(n * d.heads * m.qk_head_dim())?,
            kva: backend.alloc(n * d.cache_width())?,
            qkv: backend.alloc(n * d.row_width())?,
            attn: backend.alloc_matmul_input(n * d.heads * d.v)?,
        })
    }

    pub fn recycle(self, backend: &B) {
        for b in [
            self.qa,
            self.qa_normed,
            self.q,
            self.kva,
            self.qkv,
            self.attn,
        ] {
            backend.recycle(b);
        }
    }
}

impl<B: Backend> LatentAttn<B> {
    pub fn bytes(&self, w: &impl Fn(&B::Weight) -> usize) -> usize {
        self.q_a.as_ref().map_or(0, |(a, n)| w(a) + w(n))
            + w(&self.q_b)
            + w(&self.kv_a)
            + w(&self.kv_norm)
            + self.w_uk.iter().chain(&self.w_uv).map(w).sum::<usize>()
            + w(&self.o_proj)
    }

    /// The layer's output for the step's `tokens` rows of `normed`, into `out` (`hidden` wide).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        backend: &B,
        c: &ModelConfig,
        normed: &B::Buf,
        tokens: usize,
        step: &B::Step,
        kv: &mut KvCache<B>,
        rope: &B::Rope,
        s: &mut Scratch<B>,
        out: &mut B::Buf,
    ) -> Result<()> {
        let m = c.mla.as_ref().ok_or_else(|| {
            EngineError::Backend("a latent-attention layer without MLA config".into())
        })?;
        let d = dims(c, m);
        let eps = c.rms_norm_eps as f32;
        match &self.q_a {
            Some((q_a, q_norm)) => {
                backend.linear(normed, tokens, q_a, None, &mut s.qa)?;
                backend.rms_norm(&s.qa, tokens, q_norm, eps, &mut s.qa_normed)?;
                backend.linear(&s.qa_normed, tokens, &self.q_b, None, &mut s.q)?;
            }
            None => backend.linear(normed, tokens, &self.q_b, None, &mut s.q)?,
        }
        backend.linear(normed, tokens, &self.kv_a, None, &mut s.kva)?;
        backend.mla_qkv(
            &s.q,
            &s.kva,
            step,
            d,
            &self.kv_norm,
            &self.w_uk,
            eps,
            rope,
            &mut s.qkv,
        )?;
        let (k_cache, v_cache) = &mut kv.layers[self.kv];
        backend.write_kv(&s.qkv, step, d.kv_layout(), k_cache, v_cache)?;
        let scale = m.softmax_scale as f32;
        backend.mla_attention(
            &s.qkv,
            step,
            d,
            k_cache,
            v_cache,
            &self.w_uv,
            scale,
            &mut s.attn,
        )?;
        backend.linear(&s.attn, tokens, &self.o_proj, None, out)
    }

    /// Layer `{p}.self_attn`; `kv` is its index among the cache's layers. `mat` loads a
    /// matrix in the model's dtype, `norm` an RMSNorm's weights.
    pub fn load(
        backend: &B,
        c: &ModelConfig,
        st: &WeightSource,
        p: &str,
        kv: usize,
        mat: &dyn Fn(&str, &[usize]) -> Result<HostTensor>,
        norm: &dyn Fn(&str, usize) -> Result<B::Weight>,
    ) -> Result<Self> {
        let m = c.mla.as_ref().ok_or_else(|| {
            EngineError::Backend("a latent-attention layer without MLA config".into())
        })?;
        let (h, heads) = (c.hidden_size, c.num_heads);
        let (nope, rope, lora, v) = (
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.kv_lora_rank,
            m.v_head_dim,
        );
        let a = format!("{p}.self_attn");
        let qk = nope + rope;
        // Rows of each head's rotary part in rotate-half order (`rope_interleave`).
        let turn = |start: usize| -> Vec<usize> {
            match m.rope_interleave {
                true => (0..rope / 2)
                    .map(|i| start + 2 * i)
                    .chain((0..rope / 2).map(|i| start + 2 * i + 1))
                    .collect(),
                false => (start..start + rope).collect(),
            }
        };
        let q_rows: Vec<usize> = (0..heads)
            .flat_map(|hd| (hd * qk..hd * qk + nope).chain(turn(hd * qk + nope)))
            .collect();
        let (q_a, q_b) = match m.q_lora_rank {
            Some(r) => {
                let q_a = backend.upload_weight(mat(&format!("{a}.q_a_proj.weight"), &[r, h])?)?;
                let q_norm = norm(&format!("{a}.q_a_layernorm.weight"), r)?;
                let q_b = mat(&format!("{a}.q_b_proj.weight"), &[heads * qk, r])?;
                (Some((q_a, q_norm)), q_b)
            }
            None => (None, mat(&format!("{a}.q_proj.weight"), &[heads * qk, h])?),
        };
        let kv_rows: Vec<usize> = (0..lora).chain(turn(lora)).collect();
        let kv_a = mat(&format!("{a}.kv_a_proj_with_mqa.weight"), &[lora + rope, h])?;
        let kv_b_name = format!("{a}.kv_b_proj.weight");
        let (uk_name, uv_name) = (
            format!("{a}.k_b_proj.weight"),
            format!("{a}.v_b_proj.weight"),
        );
        let (uk_shape, uv_shape) = ([heads, lora, nope], [heads, v, lora]);
        let split = st.contains(&kv_b_name).then(|| -> Result<_> {
            let kv_b = st.load(&kv_b_name, &[heads * (nope + v), lora], DType::F32)?;
            Ok(split_kv_b(&kv_b.to_f32_vec(), heads, nope, v, lora))
        });
        let (w_uk, w_uv) = if backend.mla_per_head() {
            // One matrix per head: a GGUF's `attn_k_b` / `attn_v_b` (split and turned by
            // llama.cpp's converter) in the model's form, quantized blocks as stored; the
            // split kv_b_proj in f32, as the CUDA engine holds it (a bf16 checkpoint's values
            // exactly; holding those in bf16 would halve their reads).
            let f32_heads = |shape: [usize; 3], x: Vec<f32>| HostTensor::f32(shape.to_vec(), x);
            let (uk, uv) = match split {
                Some(s) => {
                    let (uk, uv) = s?;
                    (f32_heads(uk_shape, uk), f32_heads(uv_shape, uv))
                }
                None => (mat(&uk_name, &uk_shape)?, mat(&uv_name, &uv_shape)?),
            };
            let each = |t: HostTensor| -> Result<Vec<B::Weight>> {
                t.unstack()
                    .into_iter()
                    .map(|m| backend.upload_weight(m))
                    .collect()
            };
            (each(uk)?, each(uv)?)
        } else {
            let (uk, uv) = match split {
                Some(s) => s?,
                None => (
                    st.load(&uk_name, &uk_shape, DType::F32)?.to_f32_vec(),
                    st.load(&uv_name, &uv_shape, DType::F32)?.to_f32_vec(),
                ),
            };
            let flat = |x: Vec<f32>| backend.upload_weight(HostTensor::f32(vec![x.len()], x));
            (vec![flat(uk)?], vec![flat(uv)?])
        };
        Ok(LatentAttn {
            q_a,
            q_b: backend.upload_weight(q_b.select_rows(&q_rows))?,
            kv_a: backend.upload_weight(kv_a.select_rows(&kv_rows))?,
            kv_norm: norm(&format!("{a}.kv_a_layernorm.weight"), lora)?,
            w_uk,
            w_uv,
            o_proj: backend.upload_weight(mat(&format!("{a}.o_proj.weight"), &[h, heads * v])?)?,
            kv,
        })
    }
}

/// kv_b_proj (`[heads · (nope + v), kv_lora]`, each head's key rows then its value rows) as
/// the absorbed products read it: the key rows of each head transposed (`[heads, kv_lora,
/// nope]`), the value rows as they are (`[heads, v, kv_lora]`).
fn split_kv_b(
    kv_b: &[f32],
    heads: usize,
    nope: usize,
    v: usize,
    lora: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut uk = vec![0.0; heads * lora * nope];
    let mut uv = Vec::with_capacity(heads * v * lora);
    for h in 0..heads {
        let head = &kv_b[h * (nope + v) * lora..(h + 1) * (nope + v) * lora];
        for i in 0..nope {
            for j in 0..lora {
                uk[(h * lora + j) * nope + i] = head[i * lora + j];
            }
        }
        uv.extend_from_slice(&head[nope * lora..]);
    }
    (uk, uv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_b_splits_into_transposed_keys_and_values() {
        // 2 heads, nope 2, v 1, lora 3: rows [k0 k1 v0] per head, values r*10 + c.
        let kv_b: Vec<f32> = (0..6)
            .flat_map(|r| (0..3).map(move |c| (r * 10 + c) as f32))
            .collect();
        let (uk, uv) = split_kv_b(&kv_b, 2, 2, 1, 3);
        // Head 0: uk[j][i] = kv_b[i][j].
        assert_eq!(&uk[..6], &[0.0, 10.0, 1.0, 11.0, 2.0, 12.0]);
        assert_eq!(&uk[6..], &[30.0, 40.0, 31.0, 41.0, 32.0, 42.0]);
        assert_eq!(uv, vec![20.0, 21.0, 22.0, 50.0, 51.0, 52.0]);
    }
}
