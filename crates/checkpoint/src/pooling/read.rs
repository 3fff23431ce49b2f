//! [`PoolerInfo::read`]: what a model directory says it computes — sentence-transformers'
//! module files, a sequence classifier's `config.json`, and `option.task`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{DenseSpec, PairInput, PoolerInfo, Pooling, ScoreHead, Task};
use crate::config::{Architecture, ModelConfig};
use crate::error::{CheckpointError, Result};

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Default)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    /// sentence-transformers 6's spelling: `"mean"`, `"cls"`, `"lasttoken"`, ...
    pooling_mode: Option<serde_json::Value>,
    include_prompt: Option<bool>,
}

#[derive(Deserialize)]
struct DenseConfig {
    in_features: usize,
    out_features: usize,
    #[serde(default = "yes")]
    bias: bool,
    activation_function: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Default)]
struct StConfig {
    #[serde(default)]
    prompts: std::collections::BTreeMap<String, String>,
    default_prompt_name: Option<String>,
    truncate_dim: Option<serde_json::Value>,
    matryoshka_dims: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
struct BertConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize, Default)]
struct TokenizerConfig {
    /// transformers writes a huge number (`VERY_LARGE_INTEGER`, 1e30) when it has none.
    model_max_length: Option<f64>,
}

/// What sentence-transformers' files describe.
struct StPipeline {
    pooling: Pooling,
    dense: Vec<DenseSpec>,
    normalize: bool,
}

fn config_err(path: &Path, msg: impl Into<String>) -> CheckpointError {
    CheckpointError::Config {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| config_err(path, e.to_string()))
}

/// `path` parsed when the file exists.
fn read_optional<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    match path.exists() {
        true => read_json(path).map(Some),
        false => Ok(None),
    }
}

impl PoolerInfo {
    /// The pooler of the model in `dir` whose config is `config`, with `task` (LMI's
    /// `option.task`) overriding what the files say; None for a generative model. A
    /// combination that cannot be served (an encoder asked to generate, a pooling mode or
    /// module we do not run) is refused in one line.
    pub fn read(dir: &Path, config: &ModelConfig, task: Option<Task>) -> Result<Option<Self>> {
        let here = dir.join("config.json");
        let labels = config.encoder.as_ref().and_then(|e| e.labels.clone());
        let encoder = config.architecture.is_encoder();
        let modules = dir.join("modules.json");
        let st = match modules.exists() && labels.is_none() {
            true => Some(read_pipeline(dir, &modules)?),
            false => None,
        };
        let task = match (task, &labels, &st) {
            (Some(t), _, _) => t,
            (None, Some(_), _) => Task::Score,
            (None, None, Some(_)) => Task::Embed,
            (None, None, None) if encoder => Task::Embed,
            (None, None, None) => Task::Generate,
        };
        let name = config
            .encoder
            .as_ref()
            .map_or(config.architecture.hf_name(), |e| e.hf_name.as_str());
        let st_config: StConfig =
            read_optional(&dir.join("config_sentence_transformers.json"))?.unwrap_or_default();
        let bert_config: BertConfig =
            read_optional(&dir.join("sentence_bert_config.json"))?.unwrap_or_default();
        // sentence-transformers' `max_seq_length`, else (as its Transformer module does, and
        // where sentence-transformers 6 keeps it) the tokenizer's `model_max_length`.
        // The tokenizer's own loader reports a broken tokenizer_config.json; here it only
        // lacks a limit.
        let tokenizer_config: TokenizerConfig = read_optional(&dir.join("tokenizer_config.json"))
            .ok()
            .flatten()
            .unwrap_or_default();
        let tokenizer_max = tokenizer_config
            .model_max_length
            .filter(|m| (1.0..1e9).contains(m))
            .map(|m| m as usize);
        let max_input_tokens = bert_config
            .max_seq_length
            .or(tokenizer_max)
            .map_or(config.max_position_embeddings, |m| {
                m.min(config.max_position_embeddings)
            });
        let base = PoolerInfo {
            task,
            pooling: Pooling::Cls,
            dense: Vec::new(),
            normalize: false,
            dimensions: config.hidden_size,
            matryoshka: false,
            prompts: st_config.prompts.clone().into_iter().collect(),
            default_prompt_name: st_config.default_prompt_name.clone(),
            max_input_tokens,
            score_head: None,
            labels: Vec::new(),
            pair_input: PairInput::Tokenizer,
        };
        match task {
            Task::Generate if encoder => Err(config_err(
                &here,
                format!(
                    "{name} is an encoder: it embeds or scores text and cannot generate (option.task \
                     text-embedding or rerank)"
                ),
            )),
            Task::Generate => Ok(None),
            Task::Embed => {
                if labels.is_some() {
                    return Err(config_err(
                        &here,
                        format!(
                            "{name} is a sequence classifier: serve it with option.task=rerank, \
                             not text-embedding"
                        ),
                    ));
                }
                let st = st.unwrap_or(StPipeline {
                    // What sentence-transformers builds around a plain checkpoint: mean
                    // pooling for an encoder; a decoder embeds with its last token,
                    // normalized (vLLM's default for a causal LM).
                    pooling: if encoder {
                        Pooling::Mean
                    } else {
                        Pooling::Last
                    },
                    dense: Vec::new(),
                    normalize: !encoder,
                });
                if !encoder && st.pooling != Pooling::Last {
                    return Err(config_err(
                        &dir.join("modules.json"),
                        format!(
                            "{name} is a causal decoder: only last-token pooling runs on it (its \
                             pooling config asks for {:?})",
                            st.pooling
                        ),
                    ));
                }
                let dimensions = st
                    .dense
                    .last()
                    .map_or(config.hidden_size, |d| d.out_features);
                if let Some(d) = st.dense.first()
                    && d.in_features != config.hidden_size
                {
                    return Err(config_err(
                        &d.dir.join("config.json"),
                        format!(
                            "in_features {} differs from the model's hidden_size {}",
                            d.in_features, config.hidden_size
                        ),
                    ));
                }
                if let Some(w) = st
                    .dense
                    .windows(2)
                    .find(|w| w[0].out_features != w[1].in_features)
                {
                    return Err(config_err(
                        &w[1].dir.join("config.json"),
                        format!(
                            "in_features {} differs from the previous Dense module's out_features {}",
                            w[1].in_features, w[0].out_features
                        ),
                    ));
                }
                // Qwen3-Embedding is trained with Matryoshka representation learning.
                let matryoshka = st_config.truncate_dim.is_some_and(|v| !v.is_null())
                    || st_config.matryoshka_dims.is_some_and(|v| !v.is_null())
                    || (config.architecture == Architecture::Qwen3 && st.pooling == Pooling::Last);
                Ok(Some(PoolerInfo {
                    pooling: st.pooling,
                    dense: st.dense,
                    normalize: st.normalize,
                    dimensions,
                    matryoshka,
                    ..base
                }))
            }
            Task::Score => match (labels, encoder) {
                (Some(labels), _) => Ok(Some(PoolerInfo {
                    pooling: Pooling::Cls,
                    dimensions: labels.len(),
                    score_head: Some(match config.architecture {
                        Architecture::Bert => ScoreHead::BertClassifier,
                        _ => ScoreHead::RobertaClassifier,
                    }),
                    labels,
                    prompts: Vec::new(),
                    default_prompt_name: None,
                    ..base
                })),
                (None, true) => Err(config_err(
                    &here,
                    format!(
                        "{name} has no classification head: option.task=rerank needs a \
                         *ForSequenceClassification checkpoint (a cross-encoder)"
                    ),
                )),
                (None, false) => {
                    let (yes, no) = yes_no_ids(dir)?;
                    Ok(Some(PoolerInfo {
                        pooling: Pooling::Last,
                        dimensions: 1,
                        score_head: Some(ScoreHead::YesNo { yes, no }),
                        pair_input: PairInput::Qwen3Reranker,
                        prompts: Vec::new(),
                        default_prompt_name: None,
                        ..base
                    }))
                }
            },
        }
    }
}

/// sentence-transformers' pipeline from `modules.json` and each module's files.
fn read_pipeline(dir: &Path, modules_path: &Path) -> Result<StPipeline> {
    let modules: Vec<Module> = read_json(modules_path)?;
    let mut pooling = None;
    let mut dense = Vec::new();
    let mut normalize = false;
    for m in &modules {
        let kind = m.kind.rsplit('.').next().unwrap_or_default();
        let mdir = dir.join(&m.path);
        match kind {
            "Transformer" => {}
            "Pooling" => pooling = Some(read_pooling(&mdir.join("config.json"))?),
            "Dense" => dense.push(read_dense(&mdir)?),
            "Normalize" => normalize = true,
            _ => {
                return Err(config_err(
                    modules_path,
                    format!(
                        "module {:?} is not supported (supported: Transformer, Pooling, Dense, Normalize)",
                        m.kind
                    ),
                ));
            }
        }
    }
    let pooling = pooling.ok_or_else(|| {
        config_err(
            modules_path,
            "no sentence_transformers.models.Pooling module",
        )
    })?;
    Ok(StPipeline {
        pooling,
        dense,
        normalize,
    })
}

fn read_pooling(path: &Path) -> Result<Pooling> {
    let c: PoolingConfig = read_json(path)?;
    if c.pooling_mode_max_tokens
        || c.pooling_mode_mean_sqrt_len_tokens
        || c.pooling_mode_weightedmean_tokens
    {
        return Err(config_err(
            path,
            "max, mean_sqrt_len and weightedmean pooling are not supported (supported: cls_token, \
             mean_tokens, lasttoken)",
        ));
    }
    if c.include_prompt == Some(false) {
        return Err(config_err(
            path,
            "include_prompt: false (pooling without the prompt's tokens) is not supported",
        ));
    }
    if let Some(mode) = &c.pooling_mode {
        let one = match mode {
            serde_json::Value::String(m) => Some(m.as_str()),
            serde_json::Value::Array(v) if v.len() == 1 => v[0].as_str(),
            _ => None,
        };
        return match one {
            Some("cls" | "cls_token") => Ok(Pooling::Cls),
            Some("mean" | "mean_tokens") => Ok(Pooling::Mean),
            Some("lasttoken" | "last_token") => Ok(Pooling::Last),
            _ => Err(config_err(
                path,
                format!(
                    "pooling_mode {mode} is not supported (supported: \"cls\", \"mean\", \"lasttoken\")"
                ),
            )),
        };
    }
    match (
        c.pooling_mode_cls_token,
        c.pooling_mode_mean_tokens,
        c.pooling_mode_lasttoken,
    ) {
        (true, false, false) => Ok(Pooling::Cls),
        (false, true, false) => Ok(Pooling::Mean),
        (false, false, true) => Ok(Pooling::Last),
        (false, false, false) => Err(config_err(path, "no pooling mode is set")),
        _ => Err(config_err(
            path,
            "several pooling modes at once (concatenated vectors) are not supported",
        )),
    }
}

fn read_dense(dir: &Path) -> Result<DenseSpec> {
    let path = dir.join("config.json");
    let c: DenseConfig = read_json(&path)?;
    let tanh = match c.activation_function.as_deref() {
        None => false,
        Some(a) if a.ends_with(".Identity") => false,
        Some(a) if a.ends_with(".Tanh") => true,
        Some(a) => {
            return Err(config_err(
                &path,
                format!("Dense activation {a:?} is not supported (supported: Identity, Tanh)"),
            ));
        }
    };
    if !dir.join("model.safetensors").exists() {
        return Err(config_err(
            &path,
            format!(
                "{} has no model.safetensors (a pytorch_model.bin is not read: re-save the model with \
                 safetensors)",
                dir.display()
            ),
        ));
    }
    Ok(DenseSpec {
        dir: PathBuf::from(dir),
        in_features: c.in_features,
        out_features: c.out_features,
        bias: c.bias,
        tanh,
    })
}

/// The ids of the tokens `yes` and `no` in `dir/tokenizer.json`'s vocabulary (Qwen3-Reranker's
/// score reads their logits).
pub fn yes_no_ids(dir: &Path) -> Result<(u32, u32)> {
    let path = dir.join("tokenizer.json");
    let v: serde_json::Value = read_json(&path)?;
    let lookup = |token: &str| -> Option<u32> {
        let from_vocab = v
            .pointer("/model/vocab")
            .and_then(|m| m.get(token))
            .and_then(|id| id.as_u64());
        let from_added = || {
            v.get("added_tokens")?
                .as_array()?
                .iter()
                .find(|t| t.get("content").and_then(|c| c.as_str()) == Some(token))?
                .get("id")?
                .as_u64()
        };
        from_vocab.or_else(from_added).map(|id| id as u32)
    };
    match (lookup("yes"), lookup("no")) {
        (Some(y), Some(n)) => Ok((y, n)),
        _ => Err(config_err(
            &path,
            "option.task=rerank on a causal LM scores with the logits of the tokens \"yes\" and \
             \"no\" (Qwen3-Reranker), but the vocabulary lacks them",
        )),
    }
}
