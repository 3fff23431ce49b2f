//! Every `tokenizer.ggml.pre` name llama.cpp's converter writes for a byte-level BPE vocabulary,
//! as data: what HF `tokenizers` pipeline each stands for. Names that llama.cpp splits with the
//! same regexes share a row; a row differs from another only where the original models'
//! tokenizer.json files differ (normalizer, `ignore_merges`, whether BOS is added by default).
//!
//! Regexes are the originals from the models' tokenizer.json (llama.cpp keeps them in comments
//! beside its own adapted copies), since the ids must equal HF's.

use serde_json::{Value, json};

/// One step of the pre-tokenizer, in order.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// `Split` with `Isolated` behaviour: matches and the text between them become pieces.
    Split(&'static str),
    /// `Digits`: runs of digits, or each digit alone.
    Digits { individual: bool },
    /// `Punctuation` with `Contiguous` behaviour.
    Punctuation,
    /// `ByteLevel` with GPT-2's own regex; without this step a `ByteLevel` that only maps bytes
    /// ends the sequence.
    ByteLevelGpt2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalizer {
    None,
    Nfc,
}

#[derive(Debug)]
pub struct PreTokenizer {
    pub names: &'static [&'static str],
    pub normalizer: Normalizer,
    pub steps: &'static [Step],
    /// A word found whole in the vocabulary is one token (tiktoken-style), merges or not.
    pub ignore_merges: bool,
    /// llama.cpp adds BOS for these when the GGUF has no `tokenizer.ggml.add_bos_token`.
    pub add_bos_default: bool,
}

/// Names llama.cpp knows but whose pre-tokenizer the `tokenizers` crate cannot reproduce.
pub struct Refused {
    pub names: &'static [&'static str],
    pub why: &'static str,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k (GPT-4o).
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const CJK_KANA: &str = r"[一-龥぀-ゟ゠-ヿ]+";
const CJK_HANGUL: &str = r"[一-龥ࠀ-一가-퟿]+";
/// BLOOM's: everything up to whitespace or sentence punctuation, with one leading space.
const BLOOM: &str = r" ?[^(\s|[.,!?…。，、।۔،])]+";

use Normalizer::{Nfc, None as NoNorm};
use Step::{ByteLevelGpt2, Digits, Punctuation, Split};

const fn row(
    names: &'static [&'static str],
    normalizer: Normalizer,
    steps: &'static [Step],
    ignore_merges: bool,
    add_bos_default: bool,
) -> PreTokenizer {
    PreTokenizer {
        names,
        normalizer,
        steps,
        ignore_merges,
        add_bos_default,
    }
}

pub static TABLE: &[PreTokenizer] = &[
    row(
        &[
            "gpt-2",
            "gpt2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
            "jais",
            "trillion",
            "granite-docling",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
        ],
        NoNorm,
        &[ByteLevelGpt2],
        false,
        false,
    ),
    // GPT-NeoX's tokenizer (MPT, OLMo) normalizes to NFC before GPT-2's split.
    row(&["mpt", "olmo"], Nfc, &[ByteLevelGpt2], false, false),
    // No HF original: llama.cpp's own fallback, written for vocabularies it cannot place.
    row(
        &["default"],
        NoNorm,
        &[
            Split(r"[\p{P}\$\+<=>\^~\|]+"),
            Split(GPT2),
            Split(r"\p{N}+"),
            Split(r"[0-9][0-9][0-9]"),
        ],
        false,
        false,
    ),
    row(
        &[
            "starcoder",
            "refact",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        NoNorm,
        &[Digits { individual: true }, ByteLevelGpt2],
        false,
        false,
    ),
    row(
        &["command-r"],
        Nfc,
        &[Digits { individual: true }, ByteLevelGpt2],
        false,
        false,
    ),
    row(
        &["falcon"],
        NoNorm,
        &[
            Punctuation,
            ByteLevelGpt2,
            Digits { individual: false },
            Split(r"[0-9][0-9][0-9]"),
        ],
        false,
        false,
    ),
    row(
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        NoNorm,
        &[Split(LLAMA3)],
        true,
        true,
    ),
    row(&["glm4", "glm5"], NoNorm, &[Split(LLAMA3)], true, false),
    row(
        &["dbrx", "smaug-bpe", "chatglm-bpe"],
        NoNorm,
        &[Split(LLAMA3)],
        false,
        false,
    ),
    row(
        &["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"],
        Nfc,
        &[Split(QWEN2)],
        false,
        false,
    ),
    row(
        &["stablelm2", "hunyuan", "solar-open", "grok-2"],
        NoNorm,
        &[Split(QWEN2)],
        false,
        false,
    ),
    row(&["qwen35"], Nfc, &[Split(QWEN35)], false, false),
    row(
        &["ufakzeka"],
        NoNorm,
        &[Split(
            r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        )],
        false,
        false,
    ),
    row(
        &["seed-coder"],
        NoNorm,
        &[Split(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        )],
        false,
        false,
    ),
    row(
        &["bailingmoe", "bailingmoe2", "llada-moe"],
        NoNorm,
        &[Split(
            r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        )],
        false,
        false,
    ),
    row(
        &["laguna"],
        NoNorm,
        &[Split(r"[^\n]+|[\n]+"), Split(QWEN2)],
        false,
        false,
    ),
    row(
        &["exaone-moe"],
        NoNorm,
        &[Split(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        )],
        false,
        false,
    ),
    row(
        &["minicpm5"],
        NoNorm,
        &[
            Split(r"\p{N}{1,3}"),
            Split(
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ),
        ],
        true,
        false,
    ),
    row(
        &["jais-2"],
        NoNorm,
        &[Split(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
        )],
        false,
        false,
    ),
    row(
        &["deepseek-llm"],
        NoNorm,
        &[
            Split(r"[\r\n]"),
            Split(
                r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            ),
            Split(r"\s?[!-/:-~！-／：-～‘-‟　-。]+"),
            Split(r"\s+$"),
            Split(CJK_HANGUL),
            Digits { individual: false },
        ],
        false,
        false,
    ),
    row(
        &["deepseek-coder"],
        NoNorm,
        &[
            Split(r"[\r\n]"),
            Split(r"\s?\p{L}+"),
            Split(r"\s?\p{P}+"),
            Split(CJK_HANGUL),
            Digits { individual: true },
        ],
        false,
        false,
    ),
    row(
        &["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"],
        NoNorm,
        &[Split(r"\p{N}{1,3}"), Split(CJK_KANA), Split(DEEPSEEK3)],
        false,
        false,
    ),
    row(
        &["spark2_5"],
        NoNorm,
        &[
            Split(r"\p{N}{1,3}"),
            Split(CJK_KANA),
            Split(
                r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
            ),
            Split(r"\p{N}"),
        ],
        false,
        false,
    ),
    row(
        &["youtu"],
        NoNorm,
        &[
            Split(r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"),
            Split(
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ),
        ],
        true,
        false,
    ),
    row(&["tekken"], NoNorm, &[Split(TEKKEN)], true, true),
    row(
        &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        NoNorm,
        &[Split(GPT4O)],
        false,
        false,
    ),
    row(
        &["granite-embed-multi-97m"],
        NoNorm,
        &[Split(GPT4O)],
        true,
        false,
    ),
    row(
        &["tiny_aya", "cohere2moe"],
        NoNorm,
        &[Split(r"\d{1,3}(?=(?:\d{3})*\b)"), Split(GPT4O)],
        false,
        false,
    ),
    row(
        &["kimi-k2"],
        NoNorm,
        &[Split(
            r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        )],
        false,
        false,
    ),
    row(
        &["poro-chat", "bloom", "gpt3-finnish"],
        NoNorm,
        &[Split(BLOOM)],
        false,
        false,
    ),
    row(
        &["viking"],
        NoNorm,
        &[Split(BLOOM), Digits { individual: true }],
        false,
        false,
    ),
    row(
        &["chameleon"],
        NoNorm,
        &[
            Split(r"<sentinel:[0-9]+>"),
            Split(r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"),
            Split(r"([\t\n]|    |  )"),
            Digits { individual: true },
            Split(r"[\p{P}!-/:-@\[-`{-~]"),
            Split(GPT2),
        ],
        false,
        true,
    ),
];

pub static REFUSED: &[Refused] = &[
    Refused {
        names: &["afmoe"],
        why: "its digits are grouped by a custom splitter in llama.cpp that no regex expresses",
    },
    Refused {
        names: &["superbpe"],
        why: "its zero-width digit split has no exact tokenizers equivalent",
    },
    Refused {
        names: &[
            "gemma4",
            "granite-embed-multi-311m",
            "sarvam-moe",
            "whitespace",
        ],
        why: "it is not a byte-level BPE (raw UTF-8 pieces), which this importer does not build",
    },
];

/// The row for `name`, or a one-line refusal that says what to do instead.
pub fn lookup(name: &str) -> Result<&'static PreTokenizer, String> {
    if let Some(row) = TABLE.iter().find(|r| r.names.contains(&name)) {
        return Ok(row);
    }
    const SERVE_HF: &str =
        "serve the model from its original HF directory (tokenizer.json) instead of the GGUF";
    if let Some(r) = REFUSED.iter().find(|r| r.names.contains(&name)) {
        return Err(format!(
            "tokenizer.ggml.pre {name:?} is not supported: {}; {SERVE_HF}",
            r.why
        ));
    }
    Err(format!(
        "tokenizer.ggml.pre {name:?} is not a pre-tokenizer this importer knows ({} names are supported, see README); refusing to guess its split: {SERVE_HF}",
        supported_count()
    ))
}

pub fn supported_count() -> usize {
    TABLE.iter().map(|r| r.names.len()).sum()
}

impl PreTokenizer {
    pub fn normalizer_json(&self) -> Value {
        match self.normalizer {
            Normalizer::None => Value::Null,
            Normalizer::Nfc => json!({"type": "NFC"}),
        }
    }

    /// The `pre_tokenizer` of tokenizer.json: the steps, then a byte mapping unless a step did it.
    pub fn pre_tokenizer_json(&self) -> Value {
        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
        let mut steps: Vec<Value> = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Split(re) => json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false}),
                Step::Digits { individual } => json!({"type": "Digits", "individual_digits": individual}),
                Step::Punctuation => json!({"type": "Punctuation", "behavior": "Contiguous"}),
                Step::ByteLevelGpt2 => byte_level(true),
            })
            .collect();
        if !self.steps.iter().any(|s| matches!(s, Step::ByteLevelGpt2)) {
            steps.push(byte_level(false));
        }
        if steps.len() == 1 {
            return steps.remove(0);
        }
        json!({"type": "Sequence", "pretokenizers": steps})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_regex_compiles() {
        let mut seen = std::collections::HashSet::new();
        let refused = REFUSED.iter().flat_map(|r| r.names.iter());
        for name in TABLE.iter().flat_map(|r| r.names.iter()).chain(refused) {
            assert!(seen.insert(*name), "{name} appears twice");
        }
        for row in TABLE {
            let json = serde_json::json!({
                "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
                "normalizer": row.normalizer_json(), "pre_tokenizer": row.pre_tokenizer_json(),
                "post_processor": null, "decoder": null,
                "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
            });
            if let Err(e) = json.to_string().parse::<tokenizers::Tokenizer>() {
                panic!("{:?} does not build: {e}", row.names);
            }
        }
    }

    #[test]
    fn unknown_and_refused_names_say_what_to_do() {
        let e = lookup("mystery").unwrap_err();
        assert!(
            e.contains("\"mystery\"") && e.contains("original HF directory"),
            "{e}"
        );
        let e = lookup("afmoe").unwrap_err();
        assert!(
            e.contains("\"afmoe\"") && e.contains("original HF directory"),
            "{e}"
        );
        assert!(lookup("gpt-2").is_ok());
    }
}
