//! A checkpoint's multi-token-prediction (MTP) layer as a one-layer model: DeepSeek-V3's,
//! Kimi K2's, GLM-4.5–4.7's and GLM-4.7-Flash's `num_nextn_predict_layers` layers, stored past
//! the model's as `model.layers.{num_hidden_layers}.*` (vLLM's `DeepSeekMultiTokenPredictorLayer`
//! reads them the same way; transformers skips them).
//!
//! At position `p` the head reads the target's final-normed hidden state `h_p` and the next
//! token `t_{p+1}`: `x = eh_proj([enorm(embed(t_{p+1})), hnorm(h_p)])` (embedding first), then
//! one decoder layer of the model's kind over its own K/V, then `shared_head.norm` and
//! `shared_head.head`: logits for `t_{p+2}`. A further draft continues from the layer's output
//! at `p` (before `shared_head.norm`) and the draft token, at `p + 1`.

use std::path::Path;

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{HostData, HostTensor, WeightSource};

use super::load::{load_layer, note_format, open_weights, text_prefix};
use super::{LoadOptions, Model};
use crate::backend::Backend;
use crate::error::{EngineError, Result};

/// The head's input stage.
pub(crate) struct MtpFront<B: Backend> {
    enorm: B::Weight,
    hnorm: B::Weight,
    /// `eh_proj`'s columns for the embedding and for the hidden state, `[hidden, hidden]`
    /// each: `eh_proj · [e; h] = e_proj · e + h_proj · h`.
    e_proj: B::Weight,
    h_proj: B::Weight,
}

impl<B: Backend> MtpFront<B> {
    /// `residual` holds the rows' token embeddings; on return, the layer's input.
    pub(super) fn input(
        &self,
        backend: &B,
        residual: &mut B::Buf,
        hidden: &[f32],
        n: usize,
        (h, eps): (usize, f32),
        scratch: &mut B::Buf,
    ) -> Result<()> {
        if hidden.len() != n * h {
            return Err(EngineError::Batch(format!(
                "a multi-token-prediction step of {n} tokens needs {} hidden values, not {}",
                n * h,
                hidden.len()
            )));
        }
        let rows: Vec<u32> = (0..n as u32).collect();
        let mut prev = backend.alloc(n * h)?;
        backend.write_rows(&mut prev, h, &rows, hidden)?;
        let mut prev_normed = backend.alloc_matmul_input(n * h)?;
        backend.rms_norm(&prev, n, &self.hnorm, eps, &mut prev_normed)?;
        backend.rms_norm(residual, n, &self.enorm, eps, scratch)?;
        backend.linear(scratch, n, &self.e_proj, None, residual)?;
        backend.linear(&prev_normed, n, &self.h_proj, None, &mut prev)?;
        backend.add(residual, &prev, n * h)?;
        backend.recycle(prev);
        backend.recycle(prev_normed);
        Ok(())
    }
}

/// The MTP tensors' prefix, `{lm}layers.{num_layers}.`, where the checkpoint holds them.
pub fn mtp_prefix(c: &ModelConfig, st: &WeightSource) -> Option<String> {
    let p = format!("{}layers.{}.", text_prefix(st), c.num_layers);
    st.contains(&format!("{p}eh_proj.weight")).then_some(p)
}

impl<B: Backend> Model<B> {
    /// The checkpoint's first multi-token-prediction layer (the one every draft step uses, as
    /// vLLM does with one layer) as a one-layer model whose config says `num_layers: 1`; None
    /// where the checkpoint holds none. A GGUF file holds it where llama.cpp's converter kept
    /// it (GLM-4.5's `glm4moe`: `blk.{n}.nextn.*` beside the layer's tensors).
    pub fn load_mtp(
        backend: &B,
        dir: &Path,
        target: &ModelConfig,
        opts: &LoadOptions,
    ) -> Result<Option<Model<B>>> {
        if target.gemma4.is_some() || target.linear_attn.is_some() {
            return Ok(None);
        }
        // As the model's own weights are read (`Model::load`).
        let (st, dtype) = open_weights(dir, target, opts)?;
        let Some(p) = mtp_prefix(target, &st) else {
            return Ok(None);
        };
        let c = target;
        let h = c.hidden_size;
        let formats = std::cell::RefCell::new(std::collections::BTreeSet::new());
        let mat = |name: &str, shape: &[usize]| -> Result<HostTensor> {
            let t = st.load(name, shape, dtype)?;
            note_format(&mut formats.borrow_mut(), &t);
            Ok(t)
        };
        let norm = |name: &str, len: usize| -> Result<B::Weight> {
            backend.upload_weight(st.load(name, &[len], DType::F32)?)
        };
        // The layer as the model's layer `num_layers` (its experts, its kind), writing the
        // head's own K/V pool 0.
        let layer = load_layer(
            backend,
            c,
            &st,
            p.trim_end_matches('.'),
            c.num_layers,
            (0, 0),
            &mat,
            &norm,
            dtype,
        )?;
        let lm = text_prefix(&st);
        // The head's own embedding and output matrices where it holds them (DeepSeek-V3
        // does), else the model's.
        let own = |n: &str, fallback: String| match st.contains(&format!("{p}{n}")) {
            true => format!("{p}{n}"),
            false => fallback,
        };
        let embed = own("embed_tokens.weight", format!("{lm}embed_tokens.weight"));
        let head = match st.contains("lm_head.weight") && !c.tie_word_embeddings {
            true => "lm_head.weight".to_string(),
            false => format!("{lm}embed_tokens.weight"),
        };
        let head = own("shared_head.head.weight", head);
        let (e_proj, h_proj) =
            split_columns(st.load(&format!("{p}eh_proj.weight"), &[h, 2 * h], DType::F32)?)?;
        let front = MtpFront {
            enorm: norm(&format!("{p}enorm.weight"), h)?,
            hnorm: norm(&format!("{p}hnorm.weight"), h)?,
            e_proj: backend.upload_weight(e_proj.to_dtype(dtype))?,
            h_proj: backend.upload_weight(h_proj.to_dtype(dtype))?,
        };
        let embed = backend.upload_weight(mat(&embed, &[c.vocab_size, h])?)?;
        let lm_head = Some(backend.upload_weight(mat(&head, &[c.vocab_size, h])?)?);
        let final_norm = norm(&format!("{p}shared_head.norm.weight"), h)?;
        let mut config = c.clone();
        config.num_layers = 1;
        let (weights, dtype) = super::load::held(formats.into_inner(), dtype);
        let rope = backend.rope_table(&c.rope_inv_freq())?;
        Ok(Some(Model {
            dtype,
            config,
            weights,
            embed,
            lm_head,
            final_norm,
            layers: vec![layer],
            rope,
            rope_local: None,
            rope_none: None,
            embed_scale: None,
            vision: None,
            vision_device: None,
            head: None,
            gemma4: None,
            mtp_front: Some(front),
        }))
    }
}

/// `[rows, 2 · half]` as its left and right halves, `[rows, half]` each.
fn split_columns(t: HostTensor) -> Result<(HostTensor, HostTensor)> {
    let (rows, cols) = match t.shape[..] {
        [r, c] if c % 2 == 0 => (r, c),
        _ => {
            return Err(EngineError::Backend(format!(
                "eh_proj is {:?}, expected [hidden, 2 · hidden]",
                t.shape
            )));
        }
    };
    let HostData::F32(v) = t.data else {
        return Err(EngineError::Backend("eh_proj was not read as f32".into()));
    };
    let half = cols / 2;
    let part = |k: usize| -> Vec<f32> {
        v.chunks_exact(cols)
            .flat_map(|r| r[k * half..(k + 1) * half].iter().copied())
            .collect()
    };
    Ok((
        HostTensor::f32(vec![rows, half], part(0)),
        HostTensor::f32(vec![rows, half], part(1)),
    ))
}
