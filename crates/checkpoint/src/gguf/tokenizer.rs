//! HF `tokenizer.json` / `tokenizer_config.json` built from `tokenizer.ggml.*` metadata.
//!
//! Two GGUF tokenizer models exist in the Llama family: `gpt2` (byte-level BPE with merges, the
//! pre-tokenizer chosen by `tokenizer.ggml.pre`) and `llama` (SentencePiece with scores, which
//! the HF `tokenizers` crate hosts as a byte-fallback BPE whose merges come from the scores).

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use crate::error::{CheckpointError, Result};
use crate::gguf::pretokenizers;
use crate::gguf::reader::GgufFile;

const TOKEN_NORMAL: i64 = 1;
const TOKEN_USER_DEFINED: i64 = 4;
/// Fillers the converter writes for ids the HF vocabulary lacks (`[PAD{i}]`).
const TOKEN_UNUSED: i64 = 5;
const TOKEN_BYTE: i64 = 6;

/// The two JSON files, ready to be written.
pub struct HfTokenizer {
    pub tokenizer_json: Value,
    pub tokenizer_config_json: Value,
}

struct Vocab {
    tokens: Vec<String>,
    types: Vec<i64>,
    scores: Vec<f32>,
}

fn gguf_err(msg: String) -> CheckpointError {
    CheckpointError::Gguf(msg)
}

fn read_vocab(g: &GgufFile) -> Result<Vocab> {
    let tokens = g
        .get_array("tokenizer.ggml.tokens")?
        .ok_or_else(|| gguf_err("missing key \"tokenizer.ggml.tokens\": this GGUF has no tokenizer; convert from a GGUF that embeds one".into()))?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| gguf_err(format!("tokenizer.ggml.tokens[{i}] is not a string")))
        })
        .collect::<Result<Vec<_>>>()?;
    let n = tokens.len();
    let types = match g.get_array("tokenizer.ggml.token_type")? {
        None => vec![TOKEN_NORMAL; n],
        Some(a) if a.len() == n => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_i64().ok_or_else(|| {
                    gguf_err(format!("tokenizer.ggml.token_type[{i}] is not an integer"))
                })
            })
            .collect::<Result<_>>()?,
        Some(a) => {
            return Err(gguf_err(format!(
                "tokenizer.ggml.token_type has {} entries but there are {n} tokens",
                a.len()
            )));
        }
    };
    let scores = match g.get_array("tokenizer.ggml.scores")? {
        None => Vec::new(),
        Some(a) if a.len() == n => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64()
                    .map(|s| s as f32)
                    .ok_or_else(|| gguf_err(format!("tokenizer.ggml.scores[{i}] is not a number")))
            })
            .collect::<Result<_>>()?,
        Some(a) => {
            return Err(gguf_err(format!(
                "tokenizer.ggml.scores has {} entries but there are {n} tokens",
                a.len()
            )));
        }
    };
    Ok(Vocab {
        tokens,
        types,
        scores,
    })
}

/// Builds both tokenizer files; `model_max_length` is the context length.
pub fn build(g: &GgufFile, model_max_length: u64) -> Result<HfTokenizer> {
    let vocab = read_vocab(g)?;
    let model = g.require_str("tokenizer.ggml.model")?;
    let token_id = |key: &str| -> Result<Option<u32>> {
        match g.get_u64(key)? {
            None => Ok(None),
            Some(id) if (id as usize) < vocab.tokens.len() => Ok(Some(id as u32)),
            Some(id) => Err(gguf_err(format!(
                "{key} = {id} is out of range for a vocabulary of {} tokens",
                vocab.tokens.len()
            ))),
        }
    };
    let bos = token_id("tokenizer.ggml.bos_token_id")?;
    let eos = token_id("tokenizer.ggml.eos_token_id")?;
    let unk = token_id("tokenizer.ggml.unknown_token_id")?;
    let pad = token_id("tokenizer.ggml.padding_token_id")?;
    let is_spm = match model {
        // Gemma 4's: SentencePiece's pieces and byte fallback, its BPE merges stored.
        "llama" | "gemma4" => true,
        "gpt2" => false,
        other => {
            return Err(gguf_err(format!(
                "tokenizer.ggml.model {other:?} is not supported (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece); serve the model from its original HF directory instead"
            )));
        }
    };
    // The byte-level pre-tokenizer, looked up before anything else is built so that an unknown
    // name is refused in one line.
    let pre = if is_spm {
        None
    } else {
        let name = g.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
        Some(pretokenizers::lookup(name).map_err(gguf_err)?)
    };
    // llama.cpp defaults: SPM adds BOS, BPE only for a few pre-tokenizers, unless told.
    let add_bos = g
        .get_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(is_spm || pre.is_some_and(|p| p.add_bos_default));
    let add_eos = g.get_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let tok_str = |id: Option<u32>| id.map(|i| vocab.tokens[i as usize].clone());

    let added_tokens: Vec<Value> = vocab
        .types
        .iter()
        .enumerate()
        // Control, user-defined and unknown tokens are matched on the raw text, as in llama.cpp;
        // unused fillers and bytes are plain vocabulary entries that text never produces.
        .filter(|&(_, &t)| t != TOKEN_NORMAL && t != TOKEN_BYTE && t != TOKEN_UNUSED)
        .map(|(id, &t)| {
            json!({
                "id": id,
                "content": vocab.tokens[id],
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": t != TOKEN_USER_DEFINED,
            })
        })
        .collect();

    let mut tokenizer = Map::new();
    tokenizer.insert("version".into(), json!("1.0"));
    tokenizer.insert("truncation".into(), Value::Null);
    tokenizer.insert("padding".into(), Value::Null);
    tokenizer.insert("added_tokens".into(), Value::Array(added_tokens.clone()));

    let template = template_processor(
        add_bos
            .then_some(bos)
            .flatten()
            .map(|id| (id, vocab.tokens[id as usize].as_str())),
        add_eos
            .then_some(eos)
            .flatten()
            .map(|id| (id, vocab.tokens[id as usize].as_str())),
    );
    match pre {
        None => {
            let add_space_prefix = g
                .get_bool("tokenizer.ggml.add_space_prefix")?
                .unwrap_or(true);
            let mut normalizers = Vec::new();
            // SentencePiece's own normalizer: trim, and collapse runs of spaces into one.
            if g.get_bool("tokenizer.ggml.remove_extra_whitespaces")?
                .unwrap_or(false)
            {
                normalizers.push(
                    json!({"type": "Replace", "pattern": {"Regex": "^ +| +$"}, "content": ""}),
                );
                normalizers.push(
                    json!({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}),
                );
            }
            if add_space_prefix {
                normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
            }
            normalizers
                .push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if add_space_prefix {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            tokenizer.insert(
                "normalizer".into(),
                json!({"type": "Sequence", "normalizers": normalizers}),
            );
            tokenizer.insert("pre_tokenizer".into(), Value::Null);
            tokenizer.insert("post_processor".into(), template.unwrap_or(Value::Null));
            tokenizer.insert(
                "decoder".into(),
                json!({"type": "Sequence", "decoders": decoders}),
            );
            tokenizer.insert(
                "model".into(),
                bpe_model(
                    vocab_map(&vocab.tokens),
                    Value::Array(match (model, g.get_array("tokenizer.ggml.merges")?) {
                        ("gemma4", Some(m)) => m
                            .iter()
                            .filter_map(|v| v.as_str().map(|s| Value::String(s.to_string())))
                            .collect(),
                        _ => spm_merges(&vocab)?,
                    }),
                    tok_str(unk).or_else(|| Some("<unk>".into())),
                    true,
                    false,
                ),
            );
        }
        Some(pre) => {
            let merges = g
                .get_array("tokenizer.ggml.merges")?
                .ok_or_else(|| {
                    gguf_err(
                        "missing key \"tokenizer.ggml.merges\" (required for a gpt2 tokenizer)"
                            .into(),
                    )
                })?
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .filter(|s| s.split(' ').count() == 2)
                        .map(|s| Value::String(s.to_string()))
                        .ok_or_else(|| {
                            gguf_err(format!(
                                "tokenizer.ggml.merges[{i}] is not a \"left right\" string"
                            ))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            let byte_level_post = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
            let post = match template {
                Some(t) => json!({"type": "Sequence", "processors": [byte_level_post, t]}),
                None => byte_level_post,
            };
            tokenizer.insert("normalizer".into(), pre.normalizer_json());
            tokenizer.insert("pre_tokenizer".into(), pre.pre_tokenizer_json());
            tokenizer.insert("post_processor".into(), post);
            tokenizer.insert(
            "decoder".into(),
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
        );
            tokenizer.insert(
                "model".into(),
                bpe_model(
                    vocab_map(&vocab.tokens),
                    Value::Array(merges),
                    None,
                    false,
                    pre.ignore_merges,
                ),
            );
        }
    }

    let added_tokens_decoder: Map<String, Value> = added_tokens
        .iter()
        .map(|t| {
            let mut t = t.clone();
            let id = t
                .as_object_mut()
                .and_then(|o| o.remove("id"))
                .unwrap_or(Value::Null);
            (id.to_string(), t)
        })
        .collect();
    let mut config = json!({
        "bos_token": tok_str(bos),
        "eos_token": tok_str(eos),
        "unk_token": tok_str(unk),
        "pad_token": tok_str(pad),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": false,
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens_decoder,
    });
    if let Some(t) = g.get_str("tokenizer.chat_template")? {
        config["chat_template"] = json!(t);
    }
    Ok(HfTokenizer {
        tokenizer_json: Value::Object(tokenizer),
        tokenizer_config_json: config,
    })
}

fn bpe_model(
    vocab: Map<String, Value>,
    merges: Value,
    unk: Option<String>,
    spm: bool,
    ignore_merges: bool,
) -> Value {
    json!({
        "type": "BPE",
        "dropout": null,
        "unk_token": unk,
        "continuing_subword_prefix": null,
        "end_of_word_suffix": null,
        "fuse_unk": spm,
        "byte_fallback": spm,
        "ignore_merges": ignore_merges,
        "vocab": vocab,
        "merges": merges,
    })
}

/// token → id; on duplicate strings the first id wins (later ones stay reachable as added tokens
/// or not at all, as in llama.cpp, which also maps text to the first id).
fn vocab_map(tokens: &[String]) -> Map<String, Value> {
    let mut map = Map::new();
    let mut dups = 0usize;
    for (id, t) in tokens.iter().enumerate() {
        if map.contains_key(t) {
            dups += 1;
        } else {
            map.insert(t.clone(), json!(id));
        }
    }
    if dups > 0 {
        tracing::warn!(
            duplicates = dups,
            "GGUF vocabulary has duplicate token strings; the first id of each is kept"
        );
    }
    map
}

/// SentencePiece merges rebuilt from scores, as transformers' `SentencePieceExtractor` does:
/// every split of a normal token into two tokens that are both in the vocabulary is a merge,
/// ranked by the merged token's score (descending), then by the pieces' ids.
fn spm_merges(v: &Vocab) -> Result<Vec<Value>> {
    if v.scores.is_empty() {
        return Err(gguf_err(
            "missing key \"tokenizer.ggml.scores\" (required for a SentencePiece \"llama\" tokenizer)".into(),
        ));
    }
    let mergeable = |id: usize| v.types[id] == TOKEN_NORMAL || v.types[id] == TOKEN_USER_DEFINED;
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(v.tokens.len());
    for (id, t) in v.tokens.iter().enumerate() {
        if mergeable(id) {
            ids.entry(t.as_str()).or_insert(id);
        }
    }
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, t) in v.tokens.iter().enumerate() {
        if !mergeable(id) {
            continue;
        }
        for (split, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(split);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((v.scores[id], id, li, ri));
            }
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    Ok(merges
        .into_iter()
        .map(|(_, _, l, r)| json!([v.tokens[l], v.tokens[r]]))
        .collect())
}

/// A TemplateProcessing that adds BOS in front and/or EOS at the end, or None for neither.
fn template_processor(bos: Option<(u32, &str)>, eos: Option<(u32, &str)>) -> Option<Value> {
    if bos.is_none() && eos.is_none() {
        return None;
    }
    let special =
        |tok: &str, type_id: u32| json!({"SpecialToken": {"id": tok, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut special_tokens = Map::new();
    for (type_id, seq_id) in [(0u32, "A"), (1u32, "B")] {
        let part = if type_id == 0 { &mut single } else { &mut pair };
        if let Some((_, b)) = bos {
            part.push(special(b, type_id));
        }
        part.push(seq(seq_id, type_id));
        if let Some((_, e)) = eos {
            part.push(special(e, type_id));
        }
    }
    let pair: Vec<Value> = single.iter().cloned().chain(pair).collect();
    for (id, tok) in bos.into_iter().chain(eos) {
        special_tokens.insert(
            tok.to_string(),
            json!({"id": tok, "ids": [id], "tokens": [tok]}),
        );
    }
    Some(json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": special_tokens,
    }))
}
