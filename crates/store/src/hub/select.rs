//! Which of a repository's files a model needs: its config, generation config, tokenizer,
//! chat template and processor files, and the safetensors its index lists (never pickles,
//! never `original/`); or, for a GGUF repository, one quantization (llama.cpp's `-hf` rule)
//! with every shard of a split file.

/// A file of a repository, as the Hub's API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sibling {
    pub name: String,
    pub size: Option<u64>,
    /// The git blob id (a non-LFS file's ETag).
    pub blob_id: Option<String>,
    /// The LFS object's sha256 (an LFS file's ETag, and the check on its bytes).
    pub sha256: Option<String>,
}

/// Small files a model directory is read from, fetched whenever the repository has them.
const METADATA: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    INDEX,
];

pub const INDEX: &str = "model.safetensors.index.json";

/// The quantizations tried, in order, when a GGUF repository is named without one.
const GGUF_DEFAULTS: &[&str] = &["Q4_K_M", "Q8_0"];

fn top_level(name: &str) -> bool {
    !name.contains('/')
}

/// The small files to fetch first (the index among them, when there is one).
pub fn metadata(siblings: &[Sibling]) -> Vec<&Sibling> {
    siblings
        .iter()
        .filter(|s| {
            top_level(&s.name)
                && (METADATA.contains(&s.name.as_str()) || s.name.ends_with(".tiktoken"))
        })
        .collect()
}

/// The safetensors to fetch: the shards `index` (the index file's text) lists, else every
/// top-level `*.safetensors`. Errors name what the repository holds instead.
pub fn weights<'a>(
    repo: &str,
    siblings: &'a [Sibling],
    index: Option<&str>,
) -> Result<Vec<&'a Sibling>, String> {
    if let Some(index) = index {
        let v: serde_json::Value =
            serde_json::from_str(index).map_err(|e| format!("{repo}: {INDEX} is not JSON: {e}"))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| format!("{repo}: {INDEX} has no weight_map"))?;
        let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
        shards.sort_unstable();
        shards.dedup();
        return shards
            .into_iter()
            .map(|name| {
                siblings.iter().find(|s| s.name == name).ok_or_else(|| {
                    format!("{repo}: {INDEX} lists {name}, which the repository does not have")
                })
            })
            .collect();
    }
    let found: Vec<&Sibling> = siblings
        .iter()
        .filter(|s| top_level(&s.name) && s.name.ends_with(".safetensors"))
        .collect();
    if !found.is_empty() {
        return Ok(found);
    }
    let pickles = siblings
        .iter()
        .any(|s| [".bin", ".pt", ".pth"].iter().any(|x| s.name.ends_with(x)));
    Err(if pickles {
        format!(
            "{repo} has its weights only as PyTorch pickles (*.bin, *.pt, *.pth), which lmi does not load: name a repository with *.safetensors or GGUF files"
        )
    } else {
        format!("{repo} has no *.safetensors and no .gguf files: lmi needs one or the other")
    })
}

/// A LoRA adapter's files: `adapter_config.json` and its top-level safetensors.
pub fn adapter<'a>(repo: &str, siblings: &'a [Sibling]) -> Result<Vec<&'a Sibling>, String> {
    let files: Vec<&Sibling> = siblings
        .iter()
        .filter(|s| {
            top_level(&s.name)
                && (s.name == "adapter_config.json" || s.name.ends_with(".safetensors"))
        })
        .collect();
    let has = |f: &dyn Fn(&Sibling) -> bool| files.iter().any(|s| f(s));
    if !has(&|s| s.name == "adapter_config.json") || !has(&|s| s.name.ends_with(".safetensors")) {
        return Err(format!(
            "{repo} is not a LoRA adapter in PEFT's format (adapter_config.json and adapter_model.safetensors)"
        ));
    }
    Ok(files)
}

/// Whether a repository holds GGUF files and no safetensors model (so that `org/name`
/// without `:QUANT` picks a quantization).
pub fn is_gguf_repo(siblings: &[Sibling]) -> bool {
    let has = |ext: &str| siblings.iter().any(|s| s.name.ends_with(ext));
    has(".gguf") && !has(".safetensors")
}

/// The GGUF file(s) for `quant` (case-insensitive, as part of the file name), else Q4_K_M,
/// else Q8_0, else the first; a split file comes with all its shards, in order. Projector
/// files (`mmproj`) are never the model.
pub fn gguf<'a>(
    repo: &str,
    siblings: &'a [Sibling],
    quant: Option<&str>,
) -> Result<Vec<&'a Sibling>, String> {
    let mut ggufs: Vec<&Sibling> = siblings
        .iter()
        .filter(|s| {
            s.name.ends_with(".gguf") && !base(&s.name).to_ascii_lowercase().contains("mmproj")
        })
        .collect();
    ggufs.sort_by(|a, b| a.name.cmp(&b.name));
    let matching = |tag: &str| {
        let tag = tag.to_ascii_uppercase();
        ggufs
            .iter()
            .copied()
            .find(|s| s.name.to_ascii_uppercase().contains(&tag))
    };
    let chosen = match quant {
        Some(q) => matching(q).ok_or_else(|| {
            let names: Vec<&str> = ggufs.iter().map(|s| s.name.as_str()).collect();
            format!(
                "{repo} has no GGUF file for {q}; it has: {}",
                if names.is_empty() {
                    "no .gguf files".to_string()
                } else {
                    names.join(", ")
                }
            )
        })?,
        None => GGUF_DEFAULTS
            .iter()
            .find_map(|q| matching(q))
            .or_else(|| ggufs.first().copied())
            .ok_or_else(|| format!("{repo} has no .gguf files"))?,
    };
    let Some((prefix, _, count)) = split_parts(&chosen.name) else {
        return Ok(vec![chosen]);
    };
    let mut shards: Vec<&Sibling> = ggufs
        .iter()
        .copied()
        .filter(|s| split_parts(&s.name).is_some_and(|(p, _, n)| p == prefix && n == count))
        .collect();
    shards.sort_by_key(|s| split_parts(&s.name).map(|(_, k, _)| k));
    if shards.len() != count as usize {
        return Err(format!(
            "{repo}: {} is shard of {count}, but the repository has {} of them",
            chosen.name,
            shards.len()
        ));
    }
    Ok(shards)
}

fn base(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// `prefix-0000k-of-0000N.gguf` → (prefix, k, N).
pub fn split_parts(name: &str) -> Option<(&str, u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (prefix, k) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(k) || !digits(n) {
        return None;
    }
    Some((prefix, k.parse().ok()?, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<Sibling> {
        names
            .iter()
            .map(|n| Sibling {
                name: n.to_string(),
                size: Some(1),
                blob_id: None,
                sha256: None,
            })
            .collect()
    }

    fn names(v: Vec<&Sibling>) -> Vec<&str> {
        v.into_iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn safetensors_by_the_index_never_pickles_or_original() {
        let repo = files(&[
            "config.json",
            "tokenizer.json",
            "qwen.tiktoken",
            "README.md",
            INDEX,
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "consolidated.safetensors",
            "pytorch_model.bin",
            "original/consolidated.00.pth",
            "original/tokenizer.json",
        ]);
        assert_eq!(
            names(metadata(&repo)),
            ["config.json", "tokenizer.json", "qwen.tiktoken", INDEX]
        );
        let index = r#"{"metadata": {}, "weight_map": {"a": "model-00002-of-00002.safetensors",
            "b": "model-00001-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}"#;
        assert_eq!(
            names(weights("o/r", &repo, Some(index)).unwrap()),
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        // Without an index: every top-level safetensors file.
        assert_eq!(weights("o/r", &repo, None).unwrap().len(), 3);
        let e = weights(
            "o/r",
            &repo,
            Some(r#"{"weight_map": {"a": "gone.safetensors"}}"#),
        )
        .unwrap_err();
        assert!(e.contains("gone.safetensors"), "{e}");
        let e = weights("o/r", &files(&["config.json", "pytorch_model.bin"]), None).unwrap_err();
        assert!(e.contains("pickles"), "{e}");
        assert!(!is_gguf_repo(&repo));
    }

    #[test]
    fn gguf_follows_llama_cpp() {
        let repo = files(&[
            "m-Q2_K.gguf",
            "m-Q8_0.gguf",
            "m-Q4_K_M.gguf",
            "mmproj-m-Q4_K_M.gguf",
            "BF16/m-BF16-00002-of-00003.gguf",
            "BF16/m-BF16-00001-of-00003.gguf",
            "BF16/m-BF16-00003-of-00003.gguf",
        ]);
        assert!(is_gguf_repo(&repo));
        assert_eq!(names(gguf("o/r", &repo, None).unwrap()), ["m-Q4_K_M.gguf"]);
        assert_eq!(
            names(gguf("o/r", &repo, Some("q2_k")).unwrap()),
            ["m-Q2_K.gguf"]
        );
        assert_eq!(
            names(gguf("o/r", &repo, Some("BF16")).unwrap()),
            [
                "BF16/m-BF16-00001-of-00003.gguf",
                "BF16/m-BF16-00002-of-00003.gguf",
                "BF16/m-BF16-00003-of-00003.gguf"
            ]
        );
        let e = gguf("o/r", &repo, Some("IQ1_S")).unwrap_err();
        assert!(e.contains("m-Q8_0.gguf"), "{e}");
        let no_q4 = files(&["m-Q2_K.gguf", "m-Q8_0.gguf"]);
        assert_eq!(names(gguf("o/r", &no_q4, None).unwrap()), ["m-Q8_0.gguf"]);
        let other = files(&["z-F16.gguf", "a-IQ4_XS.gguf"]);
        assert_eq!(names(gguf("o/r", &other, None).unwrap()), ["a-IQ4_XS.gguf"]);
        let missing = files(&["m-00001-of-00002.gguf"]);
        assert!(
            gguf("o/r", &missing, None)
                .unwrap_err()
                .contains("1 of them")
        );
        assert_eq!(split_parts("a/m-00002-of-00010.gguf"), Some(("a/m", 2, 10)));
        assert_eq!(split_parts("m-2-of-3.gguf"), None);
    }
}
