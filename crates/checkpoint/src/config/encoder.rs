//! Bidirectional encoders' `config.json` (BERT, XLM-RoBERTa, RoBERTa): what their embeddings,
//! post-LN layers and heads need beside the shared fields of [`ModelConfig`].

use serde::Deserialize;

use super::{Activation, Architecture, ModelConfig};

/// An encoder's own fields ([`ModelConfig::encoder`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    /// `architectures[0]` as the checkpoint names it (`BertModel`, `XLMRobertaForSequenceClassification`, ...).
    pub hf_name: String,
    pub layer_norm_eps: f64,
    /// `gelu_new` / `gelu_pytorch_tanh` / `gelu_fast` (the tanh approximation); else BERT's
    /// erf `gelu`.
    pub gelu_tanh: bool,
    /// Rows of the token-type table (BERT 2, XLM-R 1).
    pub type_vocab_size: usize,
    /// Rows of the position table (`max_position_embeddings`).
    pub position_table: usize,
    /// The first token's position id: RoBERTa's family numbers positions from
    /// `pad_token_id + 1` (HF `create_position_ids_from_input_ids`); BERT from 0.
    pub position_offset: usize,
    /// RoBERTa's family: a pad token inside an input takes position `pad_token_id`.
    pub pad_token_id: Option<u32>,
    /// `*ForSequenceClassification`: each output's label (`id2label`, in id order).
    pub labels: Option<Vec<String>>,
}

impl EncoderConfig {
    /// Position ids of an input (no padding in our batches: every token is real, except a
    /// pad id the input itself holds, which RoBERTa's family places at `pad_token_id`).
    pub fn position_ids(&self, tokens: &[u32], out: &mut Vec<u32>) {
        out.clear();
        let mut real = 0u32;
        for &t in tokens {
            match self.pad_token_id {
                Some(pad) if self.position_offset > 0 && t == pad => out.push(pad),
                _ => {
                    out.push(self.position_offset as u32 + real);
                    real += 1;
                }
            }
        }
    }
}

/// `architectures` names that load as encoders.
pub(super) const ENCODER_NAMES: &[(&str, Architecture)] = &[
    ("BertModel", Architecture::Bert),
    ("BertForMaskedLM", Architecture::Bert),
    ("BertForPreTraining", Architecture::Bert),
    ("BertForSequenceClassification", Architecture::Bert),
    ("XLMRobertaModel", Architecture::XlmRoberta),
    (
        "XLMRobertaForSequenceClassification",
        Architecture::XlmRoberta,
    ),
    ("RobertaModel", Architecture::XlmRoberta),
    ("RobertaForSequenceClassification", Architecture::XlmRoberta),
];

#[derive(Deserialize)]
struct RawEncoder {
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    hidden_act: Option<String>,
    layer_norm_eps: Option<f64>,
    type_vocab_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    position_embedding_type: Option<String>,
    pad_token_id: Option<u32>,
    bos_token_id: Option<u32>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    num_labels: Option<usize>,
    id2label: Option<std::collections::BTreeMap<String, String>>,
    is_decoder: Option<bool>,
}

/// An encoder's config.json (already a JSON object); `name` is its `architectures[0]`.
pub(super) fn parse(
    top: &serde_json::Map<String, serde_json::Value>,
    name: &str,
    architecture: Architecture,
) -> Result<ModelConfig, String> {
    let raw: RawEncoder = serde_json::from_value(serde_json::Value::Object(top.clone()))
        .map_err(|e| e.to_string())?;
    let req = |v: Option<usize>, field: &str| match v {
        Some(0) => Err(format!("field {field:?} must be > 0")),
        Some(x) => Ok(x),
        None => Err(format!("field {field:?} is missing")),
    };
    let hidden_size = req(raw.hidden_size, "hidden_size")?;
    let num_heads = req(raw.num_attention_heads, "num_attention_heads")?;
    if hidden_size % num_heads != 0 {
        return Err(format!(
            "hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_heads})"
        ));
    }
    if let Some(t) = raw.position_embedding_type.as_deref()
        && t != "absolute"
    {
        return Err(format!(
            "position_embedding_type {t:?} is not supported (only \"absolute\")"
        ));
    }
    if raw.is_decoder == Some(true) {
        return Err(format!(
            "{name} with is_decoder: true is not supported (encoders only)"
        ));
    }
    let gelu_tanh = match raw.hidden_act.as_deref() {
        None | Some("gelu") => false,
        Some("gelu_new" | "gelu_pytorch_tanh" | "gelu_fast") => true,
        Some(other) => {
            return Err(format!(
                "hidden_act {other:?} is not supported for encoders (supported: gelu, gelu_new, gelu_pytorch_tanh)"
            ));
        }
    };
    let roberta = architecture == Architecture::XlmRoberta;
    // transformers' defaults: BertConfig pad 0, XLMRobertaConfig / RobertaConfig pad 1.
    let pad = raw.pad_token_id.unwrap_or(if roberta { 1 } else { 0 });
    let position_offset = if roberta { pad as usize + 1 } else { 0 };
    let position_table = raw.max_position_embeddings.unwrap_or(512);
    if position_table <= position_offset {
        return Err(format!(
            "max_position_embeddings ({position_table}) leaves no position after pad_token_id + 1 ({position_offset})"
        ));
    }
    let labels: Option<Vec<String>> = name.ends_with("ForSequenceClassification").then(|| {
        match &raw.id2label {
            Some(m) if !m.is_empty() => {
                let mut v: Vec<(usize, String)> = m
                    .iter()
                    .map(|(k, l)| (k.parse().unwrap_or(usize::MAX), l.clone()))
                    .collect();
                v.sort();
                v.into_iter().map(|(_, l)| l).collect()
            }
            // PretrainedConfig's default: two labels.
            _ => (0..raw.num_labels.unwrap_or(2))
                .map(|i| format!("LABEL_{i}"))
                .collect(),
        }
    });
    if let Some(l) = &labels
        && let Some(n) = raw.num_labels.filter(|&n| n != l.len())
    {
        return Err(format!(
            "num_labels ({n}) differs from id2label's {} entries",
            l.len()
        ));
    }
    Ok(ModelConfig {
        architecture,
        vocab_size: req(raw.vocab_size, "vocab_size")?,
        hidden_size,
        intermediate_size: req(raw.intermediate_size, "intermediate_size")?,
        num_layers: req(raw.num_hidden_layers, "num_hidden_layers")?,
        num_heads,
        num_kv_heads: num_heads,
        head_dim: hidden_size / num_heads,
        rotary_dim: 0,
        rms_norm_eps: raw.layer_norm_eps.unwrap_or(1e-12),
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_linear_factor: None,
        rope_yarn: None,
        // The longest input: the position table less RoBERTa's offset.
        max_position_embeddings: position_table - position_offset,
        tie_word_embeddings: false,
        torch_dtype: raw.torch_dtype.or(raw.dtype),
        bos_token_id: raw.bos_token_id,
        eos_token_ids: Vec::new(),
        mrope_section: None,
        mrope_interleaved: false,
        vision: None,
        moe: None,
        // Unused: an encoder's MLP is not gated (`EncoderConfig::gelu_tanh`).
        activation: Activation::Silu,
        sliding_window: None,
        linear_attn: None,
        mla: None,
        attn_scalar: (hidden_size / num_heads) as f64,
        no_rope: Vec::new(),
        encoder: Some(EncoderConfig {
            hf_name: name.to_string(),
            layer_norm_eps: raw.layer_norm_eps.unwrap_or(1e-12),
            gelu_tanh,
            type_vocab_size: raw.type_vocab_size.unwrap_or(2),
            position_table,
            position_offset,
            pad_token_id: roberta.then_some(pad),
            labels,
        }),
        gemma4: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_json(text: &str) -> Result<ModelConfig, String> {
        ModelConfig::from_json(text)
    }

    /// all-MiniLM-L6-v2's config.json as published.
    const MINILM: &str = r#"{"_name_or_path":"nreimers/MiniLM-L6-H384-uncased","architectures":["BertModel"],
        "attention_probs_dropout_prob":0.1,"gradient_checkpointing":false,"hidden_act":"gelu",
        "hidden_dropout_prob":0.1,"hidden_size":384,"initializer_range":0.02,"intermediate_size":1536,
        "layer_norm_eps":1e-12,"max_position_embeddings":512,"model_type":"bert","num_attention_heads":12,
        "num_hidden_layers":6,"pad_token_id":0,"position_embedding_type":"absolute",
        "transformers_version":"4.8.2","type_vocab_size":2,"use_cache":true,"vocab_size":30522}"#;

    #[test]
    fn minilm_is_a_bert_encoder() {
        let c = parse_json(MINILM).unwrap();
        assert_eq!(c.architecture, Architecture::Bert);
        assert!(c.architecture.is_encoder());
        assert_eq!((c.hidden_size, c.num_heads, c.head_dim), (384, 12, 32));
        assert_eq!(
            (c.num_layers, c.intermediate_size, c.vocab_size),
            (6, 1536, 30522)
        );
        assert_eq!(c.max_position_embeddings, 512);
        let e = c.encoder.unwrap();
        assert_eq!(
            (e.type_vocab_size, e.position_offset, e.gelu_tanh),
            (2, 0, false)
        );
        assert_eq!(e.layer_norm_eps, 1e-12);
        assert!(e.labels.is_none());
        let mut pos = Vec::new();
        e.position_ids(&[101, 0, 102], &mut pos);
        assert_eq!(pos, [0, 1, 2], "BERT numbers every token, pad ids too");
    }

    /// bge-reranker-v2-m3's config.json (XLMRobertaForSequenceClassification, one label).
    #[test]
    fn bge_reranker_is_an_xlmr_classifier() {
        let c = parse_json(
            r#"{"architectures":["XLMRobertaForSequenceClassification"],"attention_probs_dropout_prob":0.1,
            "bos_token_id":0,"classifier_dropout":null,"eos_token_id":2,"hidden_act":"gelu",
            "hidden_dropout_prob":0.1,"hidden_size":1024,"id2label":{"0":"LABEL_0"},"initializer_range":0.02,
            "intermediate_size":4096,"label2id":{"LABEL_0":0},"layer_norm_eps":1e-05,
            "max_position_embeddings":8194,"model_type":"xlm-roberta","num_attention_heads":16,
            "num_hidden_layers":24,"output_past":true,"pad_token_id":1,"position_embedding_type":"absolute",
            "torch_dtype":"float32","transformers_version":"4.38.1","type_vocab_size":1,"use_cache":true,
            "vocab_size":250002}"#,
        )
        .unwrap();
        assert_eq!(c.architecture, Architecture::XlmRoberta);
        assert_eq!(c.max_position_embeddings, 8192);
        let e = c.encoder.unwrap();
        assert_eq!((e.position_offset, e.type_vocab_size), (2, 1));
        assert_eq!(e.labels.as_deref(), Some(&["LABEL_0".to_string()][..]));
        let mut pos = Vec::new();
        e.position_ids(&[0, 33, 1, 2], &mut pos);
        assert_eq!(pos, [2, 3, 1, 4], "a pad id sits at pad_token_id");
    }

    #[test]
    fn every_encoder_name_loads_and_labels_keep_id_order() {
        for &(name, arch) in ENCODER_NAMES {
            let json = format!(
                r#"{{"architectures":["{name}"],"vocab_size":50,"hidden_size":32,"intermediate_size":64,
                "num_hidden_layers":2,"num_attention_heads":4,"hidden_act":"gelu_new",
                "id2label":{{"10":"c","2":"b","0":"a"}}}}"#
            );
            let c = parse_json(&json).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(c.architecture, arch, "{name}");
            let e = c.encoder.unwrap();
            assert!(e.gelu_tanh);
            match name.ends_with("ForSequenceClassification") {
                true => assert_eq!(e.labels.unwrap(), ["a", "b", "c"], "{name}"),
                false => assert!(e.labels.is_none(), "{name}"),
            }
        }
    }

    #[test]
    fn refusals_name_what_is_unsupported() {
        let with = |extra: &str| {
            parse_json(&format!(
                r#"{{"architectures":["BertModel"],"vocab_size":50,"hidden_size":32,
                "intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4{extra}}}"#
            ))
        };
        assert!(with("").is_ok());
        let e = with(r#","position_embedding_type":"relative_key""#).unwrap_err();
        assert!(e.contains("relative_key") && e.contains("absolute"), "{e}");
        let e = with(r#","hidden_act":"relu""#).unwrap_err();
        assert!(e.contains("relu"), "{e}");
        let e = with(r#","num_attention_heads":5"#).unwrap_err();
        assert!(e.contains("multiple"), "{e}");
        let e = parse_json(r#"{"architectures":["DistilBertModel"]}"#).unwrap_err();
        assert!(
            e.contains("DistilBertModel") && e.contains("XLMRobertaModel"),
            "{e}"
        );
    }
}
