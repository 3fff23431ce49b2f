//! An encoder's weights from its HF directory, by transformers' names, with or without the
//! base model's prefix (sentence-transformers saves a `BertModel` without it; a
//! `*ForSequenceClassification` checkpoint keeps `bert.` / `roberta.`).

use std::path::Path;

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::pooling::PoolerInfo;
use lmi_checkpoint::weights::{HostTensor, SafetensorsDir, WeightSource};

use super::{Encoder, EncoderLayer};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::pooler::{HeadWeights, HostHead};

/// Where the base model's tensors sit.
fn prefix(st: &WeightSource) -> Result<&'static str> {
    ["", "bert.", "roberta."]
        .into_iter()
        .find(|p| st.contains(&format!("{p}embeddings.word_embeddings.weight")))
        .ok_or_else(|| {
            EngineError::Backend(
                "no embeddings.word_embeddings.weight (nor bert. / roberta. prefixed) in the \
                 checkpoint: not a BERT or XLM-RoBERTa encoder's weights"
                    .into(),
            )
        })
}

impl<B: Backend> Encoder<B> {
    /// Loads the encoder in `dir` (`config` its config.json) with matrices in `dtype` (None:
    /// the checkpoint's, f16 as f32), and the host head `pooler` describes.
    pub fn load(
        backend: &B,
        dir: &Path,
        config: ModelConfig,
        dtype: Option<DType>,
        pooler: &PoolerInfo,
    ) -> Result<Self> {
        let encoder = config.encoder.clone().ok_or_else(|| {
            EngineError::Backend(format!(
                "{} is not an encoder",
                config.architecture.hf_name()
            ))
        })?;
        let st = WeightSource::Safetensors(SafetensorsDir::open(dir)?);
        let dtype = match dtype {
            Some(DType::F16) => DType::F32,
            Some(d) => d,
            None if config.torch_dtype.as_deref() == Some("bfloat16") => DType::BF16,
            None => DType::F32,
        };
        let p = prefix(&st)?;
        let (h, inter) = (config.hidden_size, config.intermediate_size);
        let mat = |name: &str, shape: &[usize]| st.load(name, shape, dtype);
        let upload = |t: HostTensor| backend.upload_encoder_weight(t);
        let vec = |name: &str, len: usize| -> Result<B::Weight> {
            backend.upload_weight(st.load(name, &[len], DType::F32)?)
        };
        // LayerNorm's weight and bias (`gamma` / `beta` in checkpoints converted from TF).
        let norm = |at: &str| -> Result<(B::Weight, B::Weight)> {
            let (w, b) = match st.contains(&format!("{at}.weight")) {
                true => ("weight", "bias"),
                false => ("gamma", "beta"),
            };
            Ok((vec(&format!("{at}.{w}"), h)?, vec(&format!("{at}.{b}"), h)?))
        };
        let e = format!("{p}embeddings");
        let word = backend.upload_weight(mat(
            &format!("{e}.word_embeddings.weight"),
            &[config.vocab_size, h],
        )?)?;
        let table = |name: &str, rows: usize| -> Result<B::Weight> {
            let t = st.load(&format!("{e}.{name}.weight"), &[rows, h], DType::F32)?;
            backend.upload_router(t)
        };
        let position = table("position_embeddings", encoder.position_table)?;
        let token_type = table("token_type_embeddings", encoder.type_vocab_size)?;
        let embed_norm = norm(&format!("{e}.LayerNorm"))?;
        let layers = (0..config.num_layers)
            .map(|i| {
                let l = format!("{p}encoder.layer.{i}");
                let a = format!("{l}.attention");
                let qkv = ["query", "key", "value"]
                    .iter()
                    .map(|n| mat(&format!("{a}.self.{n}.weight"), &[h, h]))
                    .collect::<lmi_checkpoint::Result<Vec<_>>>()?;
                let qkv_bias = ["query", "key", "value"]
                    .iter()
                    .map(|n| st.load(&format!("{a}.self.{n}.bias"), &[h], DType::F32))
                    .collect::<lmi_checkpoint::Result<Vec<_>>>()?;
                Ok(EncoderLayer {
                    qkv: upload(HostTensor::concat_rows(qkv))?,
                    qkv_bias: backend.upload_weight(HostTensor::concat_rows(qkv_bias))?,
                    out: upload(mat(&format!("{a}.output.dense.weight"), &[h, h])?)?,
                    out_bias: vec(&format!("{a}.output.dense.bias"), h)?,
                    attn_norm: norm(&format!("{a}.output.LayerNorm"))?,
                    up: upload(mat(&format!("{l}.intermediate.dense.weight"), &[inter, h])?)?,
                    up_bias: vec(&format!("{l}.intermediate.dense.bias"), inter)?,
                    down: upload(mat(&format!("{l}.output.dense.weight"), &[h, inter])?)?,
                    down_bias: vec(&format!("{l}.output.dense.bias"), h)?,
                    mlp_norm: norm(&format!("{l}.output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head = HostHead::load(
            pooler,
            HeadWeights::Encoder {
                st: &st,
                prefix: p,
                hidden: h,
            },
        )?;
        Ok(Encoder {
            config,
            encoder,
            dtype,
            word,
            position,
            token_type,
            embed_norm,
            layers,
            head,
        })
    }
}
