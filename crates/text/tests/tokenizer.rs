mod common;

use common::{IM_END, IM_START, first_added_id, write_tokenizer};
use lmi_text::{TextError, Tokenizer};

fn dir_with_configs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::json!({
            "bos_token": {"content": IM_START, "special": true},
            "eos_token": IM_END,
            "add_bos_token": false,
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "{{ messages[0]['content'] }}"}
            ]
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [0, 33], "bos_token_id": 1}"#,
    )
    .unwrap();
    dir
}

#[test]
fn loads_configs() {
    let dir = dir_with_configs();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let start = first_added_id();
    assert_eq!(tok.vocab_size(), start as usize + 3);
    assert_eq!(tok.bos_token(), Some(IM_START));
    assert_eq!(tok.eos_token(), Some(IM_END));
    assert_eq!(tok.add_bos_token(), Some(false));
    // generation_config ids first, then the eos_token's id.
    assert_eq!(tok.eos_token_ids(), vec![0, 33, start + 1]);
    assert_eq!(tok.chat_template(), Some("{{ messages[0]['content'] }}"));
    assert_eq!(tok.token_to_id(IM_START), Some(start));
    assert_eq!(tok.id_to_token(start + 1).as_deref(), Some(IM_END));
    assert!(tok.is_special(start) && tok.is_special(start + 1));
    assert!(
        !tok.is_special(start + 2),
        "<tool> is added but not special"
    );
    assert!(!tok.is_special(104));
}

#[test]
fn without_configs() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.eos_token(), None);
    assert!(tok.eos_token_ids().is_empty());
    assert_eq!(tok.chat_template(), None);
}

#[test]
fn generation_config_single_eos_id() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": "<|im_end|>"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": 2}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.eos_token_ids(), vec![2, first_added_id() + 1]);
}

#[test]
fn encode_parses_special_tokens_in_text() {
    let dir = dir_with_configs();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let start = first_added_id();
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    // Bytes of "user\nhi" are ids equal to their byte values except merged pairs; none here
    // ("he" is a merge, but "hi" is not).
    let expected: Vec<u32> = std::iter::once(start)
        .chain("user\nhi".bytes().map(u32::from))
        .chain(std::iter::once(start + 1))
        .collect();
    assert_eq!(ids, expected);
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>user\nhi<|im_end|>"
    );
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi");
}

#[test]
fn encode_uses_merges_and_round_trips_unicode() {
    let dir = dir_with_configs();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let text = "hello 你好你 😀🎉 café the end";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() < text.len(), "merges should shorten {ids:?}");
    assert!(ids.iter().any(|&id| id >= 256));
    assert_eq!(tok.decode(&ids, true).unwrap(), text);
}

#[test]
fn missing_tokenizer_json_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, TextError::Io { .. }), "{err}");
    assert!(err.to_string().contains("tokenizer.json"));
}

#[test]
fn broken_tokenizer_config_is_a_json_error() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    std::fs::write(dir.path().join("tokenizer_config.json"), "{not json").unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    assert!(matches!(err, TextError::Json { .. }), "{err}");
}

#[test]
fn add_bos_token_prepends_bos_once() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer(dir.path());
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<|im_start|>", "add_bos_token": true}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let bos = first_added_id();
    assert_eq!(tok.bos_token_id(), Some(bos));
    assert_eq!(tok.encode("a", true).unwrap(), vec![bos, 97]);
    assert_eq!(tok.encode("a", false).unwrap(), vec![97]);
    assert_eq!(
        tok.encode("<|im_start|>a", true).unwrap(),
        vec![bos, 97],
        "no double BOS"
    );
}
