//! A Gated DeltaNet layer (Qwen3.5 / Qwen3.6, Qwen3-Next): one fused input projection, the
//! backend's [`Backend::gated_delta_net`] over each sequence's recurrent state, the output
//! projection. Loaded from either checkpoint layout into one: Qwen3.5's separate
//! `in_proj_{qkv,z,b,a}`, or Qwen3-Next's `in_proj_qkvz` / `in_proj_ba` grouped per key head.

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::config::linear_attn::LinearAttnConfig;
use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{HostTensor, WeightSource};

use super::KvCache;
use crate::backend::{Backend, DeltaNet};
use crate::error::{EngineError, Result};

pub(crate) struct LinearAttn<B: Backend> {
    /// `[q k v | z | b | a]` rows: [`LinearAttnConfig::proj_dim`] × hidden.
    proj: B::Weight,
    /// The depthwise convolution, `conv_dim × conv_kernel` f32 values, flat.
    conv: B::Weight,
    a_log: B::Weight,
    dt_bias: B::Weight,
    norm: B::Weight,
    out_proj: B::Weight,
    /// Which of the cache's state layers is this layer's.
    state: usize,
}

/// The linear-attention layers' step scratch (none for a model without them).
pub(crate) struct Scratch<B: Backend> {
    proj: B::Buf,
    out: B::Buf,
}

impl<B: Backend> Scratch<B> {
    pub fn new(backend: &B, dims: Option<&LinearAttnConfig>, tokens: usize) -> Result<Self> {
        let (p, o) = dims.map_or((1, 1), |d| (d.proj_dim(), d.value_dim()));
        Ok(Scratch {
            proj: backend.alloc(tokens * p)?,
            out: backend.alloc_matmul_input(tokens * o)?,
        })
    }

    pub fn recycle(self, backend: &B) {
        backend.recycle(self.proj);
        backend.recycle(self.out);
    }
}

impl<B: Backend> LinearAttn<B> {
    pub fn bytes(&self, w: &impl Fn(&B::Weight) -> usize) -> usize {
        w(&self.proj)
            + w(&self.conv)
            + w(&self.a_log)
            + w(&self.dt_bias)
            + w(&self.norm)
            + w(&self.out_proj)
    }

    /// The layer's output for the step's `tokens` rows of `normed`, into `out` (`hidden` wide).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        backend: &B,
        normed: &B::Buf,
        tokens: usize,
        step: &B::Step,
        kv: &mut KvCache<B>,
        dims: &LinearAttnConfig,
        eps: f32,
        scratch: &mut Scratch<B>,
        out: &mut B::Buf,
    ) -> Result<()> {
        backend.linear(normed, tokens, &self.proj, None, &mut scratch.proj)?;
        let state = kv.states.get_mut(self.state).ok_or_else(|| {
            EngineError::Batch("the linear-attention layers have no state slots".into())
        })?;
        let layer = DeltaNet {
            dims,
            conv: &self.conv,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            norm: &self.norm,
            eps,
        };
        backend.gated_delta_net(&scratch.proj, step, layer, state, &mut scratch.out)?;
        backend.linear(&scratch.out, tokens, &self.out_proj, None, out)
    }

    /// Layer `{p}.linear_attn` of either checkpoint layout; `state` is its index among the
    /// model's linear layers. `mat` loads a matrix in the model's dtype.
    pub fn load(
        backend: &B,
        c: &ModelConfig,
        st: &WeightSource,
        p: &str,
        state: usize,
        mat: &dyn Fn(&str, &[usize]) -> Result<HostTensor>,
        dtype: DType,
    ) -> Result<Self> {
        let d = c.linear_attn.as_ref().ok_or_else(|| {
            EngineError::Backend("a linear-attention layer without linear_* config".into())
        })?;
        let h = c.hidden_size;
        let a = format!("{p}.linear_attn");
        let (nv, kd, vd) = (d.num_v_heads, d.key_dim(), d.value_dim());
        let proj = if st.contains(&format!("{a}.in_proj_qkvz.weight")) {
            let qkvz = st.load(
                &format!("{a}.in_proj_qkvz.weight"),
                &[2 * kd + 2 * vd, h],
                DType::F32,
            )?;
            let ba = st.load(&format!("{a}.in_proj_ba.weight"), &[2 * nv, h], DType::F32)?;
            let rows = grouped_rows(d);
            let (qkvz, ba) = (qkvz.to_f32_vec(), ba.to_f32_vec());
            let mut v = Vec::with_capacity(d.proj_dim() * h);
            for r in rows {
                let src = match r {
                    Row::Qkvz(i) => &qkvz[i * h..(i + 1) * h],
                    Row::Ba(i) => &ba[i * h..(i + 1) * h],
                };
                v.extend_from_slice(src);
            }
            HostTensor::f32(vec![d.proj_dim(), h], v).to_dtype(dtype)
        } else {
            HostTensor::concat_rows(vec![
                mat(&format!("{a}.in_proj_qkv.weight"), &[d.conv_dim(), h])?,
                mat(&format!("{a}.in_proj_z.weight"), &[vd, h])?,
                mat(&format!("{a}.in_proj_b.weight"), &[nv, h])?,
                mat(&format!("{a}.in_proj_a.weight"), &[nv, h])?,
            ])
        };
        let f32w = |name: &str, shape: &[usize]| -> Result<B::Weight> {
            let t = st.load(&format!("{a}.{name}"), shape, DType::F32)?;
            backend.upload_weight(t)
        };
        let conv = st.load(
            &format!("{a}.conv1d.weight"),
            &[d.conv_dim(), 1, d.conv_kernel],
            DType::F32,
        )?;
        // Flat, so that every backend keeps it in f32 (the CUDA backend rounds matrices to
        // bf16): the CPU's and the device's convolutions then use the same taps.
        let conv = HostTensor::f32(vec![d.conv_dim() * d.conv_kernel], conv.to_f32_vec());
        Ok(LinearAttn {
            proj: backend.upload_weight(proj)?,
            conv: backend.upload_weight(conv)?,
            a_log: f32w("A_log", &[nv])?,
            dt_bias: f32w("dt_bias", &[nv])?,
            norm: f32w("norm.weight", &[d.head_v_dim])?,
            out_proj: backend.upload_weight(mat(&format!("{a}.out_proj.weight"), &[h, vd])?)?,
            state,
        })
    }
}

/// A row of the fused projection, from Qwen3-Next's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Row {
    Qkvz(usize),
    Ba(usize),
}

/// Where each row of the fused `[q k v | z | b | a]` projection sits in Qwen3-Next's
/// `in_proj_qkvz` and `in_proj_ba`, which group the rows per key head: for key head `g`,
/// `[q_g, k_g, v_g, z_g]` (`v_g` and `z_g` its `num_v_heads / num_k_heads` value heads) and
/// `[b_g, a_g]` (transformers' `fix_query_key_value_ordering`).
fn grouped_rows(d: &LinearAttnConfig) -> Vec<Row> {
    let (nk, dk, dv) = (d.num_k_heads, d.head_k_dim, d.head_v_dim);
    let r = d.num_v_heads / nk;
    let group = 2 * dk + 2 * r * dv;
    let mut rows = Vec::with_capacity(d.proj_dim());
    // q, then k, of every key head.
    for part in 0..2 {
        for g in 0..nk {
            rows.extend((0..dk).map(|i| Row::Qkvz(g * group + part * dk + i)));
        }
    }
    // v, then z, of every value head (in key-head groups).
    for part in 0..2 {
        for g in 0..nk {
            let from = g * group + 2 * dk + part * r * dv;
            rows.extend((0..r * dv).map(|i| Row::Qkvz(from + i)));
        }
    }
    // b, then a.
    for part in 0..2 {
        for g in 0..nk {
            rows.extend((0..r).map(|i| Row::Ba(g * 2 * r + part * r + i)));
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_next_rows_regroup_into_qwen3_5s_order() {
        // 2 key heads of 2, 4 value heads of 3 (2 per key head).
        let d = LinearAttnConfig {
            layers: vec![true],
            num_k_heads: 2,
            num_v_heads: 4,
            head_k_dim: 2,
            head_v_dim: 3,
            conv_kernel: 4,
        };
        let rows = grouped_rows(&d);
        assert_eq!(rows.len(), d.proj_dim());
        // Group 0: q 0..2, k 2..4, v 4..10, z 10..16; group 1 from 16.
        let q: Vec<Row> = [0, 1, 16, 17].map(Row::Qkvz).to_vec();
        assert_eq!(&rows[..4], &q[..]);
        assert_eq!(rows[4], Row::Qkvz(2));
        assert_eq!(rows[6], Row::Qkvz(18));
        assert_eq!(rows[8], Row::Qkvz(4));
        assert_eq!(rows[14], Row::Qkvz(20));
        assert_eq!(rows[20], Row::Qkvz(10));
        // b: 0, 1 of group 0, then 4, 5; a: 2, 3, 6, 7.
        let ba: Vec<Row> = [0, 1, 4, 5, 2, 3, 6, 7].map(Row::Ba).to_vec();
        assert_eq!(&rows[d.proj_dim() - 8..], &ba[..]);
    }
}
