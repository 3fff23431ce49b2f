//! A tiny byte-level BPE tokenizer written to a temp dir, so tests need no download.
#![allow(dead_code)]

use std::path::Path;

use serde_json::{Value, json};

/// GPT-2's byte -> printable char table (the ByteLevel pre-tokenizer's alphabet).
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

fn symbols(s: &str) -> Vec<String> {
    s.bytes().map(|b| byte_char(b).to_string()).collect()
}

/// Merges chosen so that some tokens end or start in the middle of a multi-byte character
/// (CJK, emoji, accented latin) and some span two characters.
fn merges() -> Vec<(String, String)> {
    let mut m = Vec::new();
    let mut add = |a: String, b: String| m.push((a, b));
    for word in ["你", "好", "😀", "é", "🎉"] {
        let s = symbols(word);
        add(s[0].clone(), s[1].clone()); // first two bytes of the char
    }
    let s = symbols("好你");
    add(s[2].clone(), s[3].clone()); // last byte of 好 + first byte of 你
    let h = symbols("h");
    let e = symbols("e");
    add(h[0].clone(), e[0].clone());
    let l = symbols("l");
    add(l[0].clone(), l[0].clone());
    let sp = symbols(" ");
    let t = symbols("t");
    add(sp[0].clone(), t[0].clone());
    m
}

pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";

/// Writes tokenizer.json (and optionally the two config files) into `dir`.
/// Ids: 0..256 bytes, then merges, then `<|im_start|>`, `<|im_end|>` (special), `<tool>`
/// (added, not special).
pub fn write_tokenizer(dir: &Path) {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), json!(b as u32));
    }
    let merges = merges();
    for (a, b) in &merges {
        let id = vocab.len() as u32;
        vocab.entry(format!("{a}{b}")).or_insert(json!(id));
    }
    let base = vocab.len() as u32;
    let added = |id: u32, content: &str, special: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": special})
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(base, IM_START, true), added(base + 1, IM_END, true),
                         added(base + 2, "<tool>", false)],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Value::Object(vocab),
            "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>(),
        }
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}

/// Id of the first added token in the tiny tokenizer (`<|im_start|>`).
pub fn first_added_id() -> u32 {
    let merges = merges();
    let mut seen = std::collections::HashSet::new();
    for (a, b) in &merges {
        seen.insert(format!("{a}{b}"));
    }
    256 + seen.len() as u32
}

/// A small deterministic PRNG (splitmix64) so property tests need no extra crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Pieces of the SentencePiece-style tokenizer, after `<unk>`, `<s>`, `</s>` (ids 0..3) and
/// the 256 byte-fallback tokens `<0x00>`..`<0xFF>` (ids 3..259).
pub const SP_PIECES: [&str; 6] = ["▁Hello", "▁world", "!", "▁", "▁你", "好"];

/// Id of `SP_PIECES[i]`.
pub fn sp_id(piece: &str) -> u32 {
    259 + SP_PIECES.iter().position(|p| *p == piece).unwrap() as u32
}

/// Id of the byte-fallback token for `b`.
pub fn sp_byte(b: u8) -> u32 {
    3 + u32::from(b)
}

/// Writes a Llama-2-style (Metaspace + byte fallback) tokenizer.json into `dir`. Its decoder
/// strips the leading space of the first token decoded, which is what the prompt tail of the
/// incremental detokenizer is for.
pub fn write_sentencepiece_tokenizer(dir: &Path) {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert((*t).to_owned(), json!(i));
    }
    for b in 0..=255u8 {
        vocab.insert(format!("<0x{b:02X}>"), json!(sp_byte(b)));
    }
    for p in SP_PIECES {
        vocab.insert(p.to_owned(), json!(sp_id(p)));
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": Value::Object(vocab), "merges": []
        }
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
}
