//! Inputs of embedding and scoring models against what sentence-transformers and transformers
//! fed the fixture models (tests/fixtures/embed/*/reference.json): single inputs with their
//! prompts, pair encodings with their token types, truncation that keeps the special tokens,
//! and Qwen3-Reranker's prompt.

use std::path::PathBuf;

use lmi_text::{Tokenizer, Truncate, TruncationSide, qwen3_reranker};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/embed")
        .join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn right(max_tokens: usize) -> Truncate {
    Truncate {
        max_tokens,
        side: TruncationSide::Right,
    }
}

/// The prompt sentence-transformers prepends for `prompt_name` (config_sentence_transformers.json).
fn st_prompt(name: &str, prompt_name: &Value) -> String {
    let Some(p) = prompt_name.as_str() else {
        return String::new();
    };
    let path = fixture(name).join("config_sentence_transformers.json");
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    cfg["prompts"][p].as_str().unwrap().to_string()
}

#[test]
fn single_inputs_match_sentence_transformers_truncated_to_max_seq_length() {
    let mut cut = 0;
    for name in ["bert_mean", "bert_cls_dense", "xlmr_cls", "qwen3_embedding"] {
        let tok = Tokenizer::from_dir(fixture(name)).unwrap();
        let r = reference(name);
        let max = r["max_seq_length"].as_u64().unwrap() as usize;
        for input in r["inputs"].as_array().unwrap() {
            let text = format!(
                "{}{}",
                st_prompt(name, &input["prompt_name"]),
                input["text"].as_str().unwrap()
            );
            let want = ids(&input["ids"]);
            let got = tok.encode_truncated(&text, true, right(max)).unwrap();
            assert_eq!(got, want, "{name}: {text:?}");
            let whole = tok.encode(&text, true).unwrap();
            if whole.len() > max {
                cut += 1;
                // The special tokens stay at both ends of the cut input.
                assert_eq!(got[0], whole[0], "{name}");
                assert_eq!(got.last(), whole.last(), "{name}");
            } else {
                assert_eq!(whole, want, "{name}");
            }
        }
    }
    assert!(
        cut > 0,
        "some reference input is longer than max_seq_length"
    );
}

#[test]
fn pairs_match_the_cross_encoders_inputs_and_token_types() {
    let mut cut = 0;
    for name in ["bert_cross", "xlmr_rerank"] {
        let tok = Tokenizer::from_dir(fixture(name)).unwrap();
        let r = reference(name);
        let max = r["max_length"].as_u64().unwrap() as usize;
        for p in r["pairs"].as_array().unwrap() {
            let (q, d) = (
                p["query"].as_str().unwrap(),
                p["document"].as_str().unwrap(),
            );
            let want = ids(&p["ids"]);
            let types = ids(&p["type_ids"]);
            let segment = types.iter().position(|&t| t == 1);
            let got = tok.encode_pair_truncated(q, d, true, right(max)).unwrap();
            assert_eq!(got, (want.clone(), segment), "{name}: {q:?} / {d:?}");
            let whole = tok.encode_pair(q, d, true).unwrap();
            if whole.0.len() > max {
                cut += 1;
            } else {
                assert_eq!(whole, (want, segment), "{name}");
            }
        }
    }
    assert!(cut > 0, "some reference pair is longer than max_length");
    // BERT's second segment takes token type 1; XLM-RoBERTa's tokens are all type 0.
    let bert = Tokenizer::from_dir(fixture("bert_cross")).unwrap();
    assert!(bert.encode_pair("hello", "hi", true).unwrap().1.is_some());
    let xlmr = Tokenizer::from_dir(fixture("xlmr_rerank")).unwrap();
    assert_eq!(xlmr.encode_pair("hello", "hi", true).unwrap().1, None);
}

#[test]
fn left_truncation_keeps_the_ends_of_both_segments_and_the_special_tokens() {
    let tok = Tokenizer::from_dir(fixture("bert_cross")).unwrap();
    let (q, d) = ("what is the capital of france?", "paris is the capital");
    let (whole, seg) = tok.encode_pair(q, d, true).unwrap();
    let seg = seg.unwrap();
    let (qa, db) = (&whole[1..seg - 1], &whole[seg..whole.len() - 1]);
    assert_eq!(tok.num_special_tokens(true), 3);
    // Cut 4 tokens, longest first as the HF tokenizer does: the query (7 tokens) and the
    // document (4) share the 7 left, the longer one taking the odd token: 4 and 3.
    assert_eq!((qa.len(), db.len()), (7, 4));
    let max = whole.len() - 4;
    let t = Truncate {
        max_tokens: max,
        side: TruncationSide::Left,
    };
    let (got, gseg) = tok.encode_pair_truncated(q, d, true, t).unwrap();
    assert_eq!(got.len(), max);
    let gseg = gseg.unwrap();
    assert_eq!(got[0], whole[0]);
    assert_eq!(got[gseg - 1], whole[seg - 1]);
    assert_eq!(got.last(), whole.last());
    let (ga, gb) = (&got[1..gseg - 1], &got[gseg..got.len() - 1]);
    assert_eq!(ga, &qa[3..], "the query's last 4 tokens");
    assert_eq!(gb, &db[1..], "the document's last 3 tokens");
    // A limit the special tokens alone exceed is an error, not a longer input.
    assert!(tok.encode_pair_truncated(q, d, true, right(2)).is_err());
    assert!(tok.encode_truncated(q, true, right(1)).is_err());
}

#[test]
fn qwen3_reranker_prompt_is_the_model_cards() {
    let name = "qwen3_reranker";
    let tok = Tokenizer::from_dir(fixture(name)).unwrap();
    let r = reference(name);
    assert_eq!(r["prefix"].as_str().unwrap(), qwen3_reranker::PREFIX);
    assert_eq!(r["suffix"].as_str().unwrap(), qwen3_reranker::SUFFIX);
    let instruction = r["instruction"].as_str().unwrap();
    assert_eq!(instruction, qwen3_reranker::DEFAULT_INSTRUCTION);
    for p in r["pairs"].as_array().unwrap() {
        let (q, d) = (
            p["query"].as_str().unwrap(),
            p["document"].as_str().unwrap(),
        );
        assert_eq!(
            qwen3_reranker::prompt(None, q, d),
            p["prompt"].as_str().unwrap()
        );
        let want = ids(&p["ids"]);
        let got = qwen3_reranker::encode(&tok, None, q, d, None).unwrap();
        assert_eq!(got.as_deref(), Some(&want[..]), "{q:?} / {d:?}");
        // Cut: the frame stays whole around the body's first tokens.
        let max = want.len() - 7;
        let cut = qwen3_reranker::encode(&tok, None, q, d, Some(right(max)))
            .unwrap()
            .unwrap();
        let prefix = tok.encode(qwen3_reranker::PREFIX, false).unwrap();
        let suffix = tok.encode(qwen3_reranker::SUFFIX, false).unwrap();
        assert_eq!(cut.len(), max);
        assert_eq!(&cut[..max - suffix.len()], &want[..max - suffix.len()]);
        assert!(cut.ends_with(&suffix) && cut.starts_with(&prefix));
        assert_eq!(
            qwen3_reranker::encode(&tok, None, q, d, Some(right(prefix.len()))).unwrap(),
            None
        );
    }
    // Another instruction replaces the default in the body.
    let p = qwen3_reranker::prompt(Some("Find the answer"), "q", "d");
    assert!(p.contains("<Instruct>: Find the answer\n<Query>: q\n<Document>: d<|im_end|>"));
}
