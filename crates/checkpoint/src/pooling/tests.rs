//! [`PoolerInfo::read`] on directories laid out as sentence-transformers and transformers save
//! them (the files' contents as the published models have them).

use std::path::Path;

use super::*;
use crate::config::ModelConfig;

const BERT: &str = r#"{"architectures":["BertModel"],"vocab_size":30522,"hidden_size":384,
    "intermediate_size":1536,"num_hidden_layers":6,"num_attention_heads":12,"max_position_embeddings":512}"#;
const QWEN3: &str = r#"{"architectures":["Qwen3ForCausalLM"],"vocab_size":151669,"hidden_size":1024,
    "intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,
    "head_dim":128,"max_position_embeddings":32768,"tie_word_embeddings":true}"#;

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn model(config: &str) -> (tempfile::TempDir, ModelConfig) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "config.json", config);
    (dir, ModelConfig::from_json(config).unwrap())
}

/// all-MiniLM-L6-v2's module files as published.
fn minilm_modules(dir: &Path) {
    write(
        dir,
        "modules.json",
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
    );
    write(
        dir,
        "1_Pooling/config.json",
        r#"{"word_embedding_dimension":384,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":true,
        "pooling_mode_max_tokens":false,"pooling_mode_mean_sqrt_len_tokens":false}"#,
    );
    write(
        dir,
        "sentence_bert_config.json",
        r#"{"max_seq_length":256,"do_lower_case":false}"#,
    );
}

#[test]
fn minilm_mean_pools_and_normalizes() {
    let (dir, c) = model(BERT);
    minilm_modules(dir.path());
    let p = PoolerInfo::read(dir.path(), &c, None).unwrap().unwrap();
    assert_eq!(p.task, Task::Embed);
    assert_eq!(p.pooling, Pooling::Mean);
    assert!(p.normalize && p.dense.is_empty() && !p.matryoshka);
    assert_eq!((p.dimensions, p.max_input_tokens), (384, 256));
    assert_eq!(p.score_head, None);
    // option.task=text-generation on an encoder is refused in one line.
    let e = PoolerInfo::read(dir.path(), &c, Some(Task::Generate))
        .unwrap_err()
        .to_string();
    assert!(e.contains("BertModel is an encoder"), "{e}");
    let e = PoolerInfo::read(dir.path(), &c, Some(Task::Score))
        .unwrap_err()
        .to_string();
    assert!(e.contains("ForSequenceClassification"), "{e}");
}

#[test]
fn dense_modules_and_prompts_are_read() {
    let (dir, c) = model(BERT);
    let d = dir.path();
    write(
        d,
        "modules.json",
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Dense","type":"sentence_transformers.models.Dense"},
        {"idx":3,"name":"3","path":"3_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
    );
    write(
        d,
        "1_Pooling/config.json",
        r#"{"pooling_mode_cls_token":true}"#,
    );
    write(
        d,
        "2_Dense/config.json",
        r#"{"in_features":384,"out_features":24,"bias":true,
        "activation_function":"torch.nn.modules.activation.Tanh"}"#,
    );
    write(
        d,
        "config_sentence_transformers.json",
        r#"{"prompts":{"query":"Represent this sentence: ","document":""},"default_prompt_name":"query",
        "similarity_fn_name":"cosine"}"#,
    );
    // The Dense module's weights must be safetensors.
    let e = PoolerInfo::read(d, &c, None).unwrap_err().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    write(d, "2_Dense/model.safetensors", "");
    let p = PoolerInfo::read(d, &c, None).unwrap().unwrap();
    assert_eq!(p.pooling, Pooling::Cls);
    assert_eq!(p.dense.len(), 1);
    let dense = &p.dense[0];
    assert_eq!(
        (
            dense.in_features,
            dense.out_features,
            dense.bias,
            dense.tanh
        ),
        (384, 24, true, true)
    );
    assert_eq!(dense.dir, d.join("2_Dense"));
    assert_eq!(p.dimensions, 24);
    assert_eq!(p.prompt(None), Some("Represent this sentence: "));
    assert_eq!(p.prompt(Some("document")), Some(""));
    assert_eq!(p.prompt(Some("other")), None);
    assert_eq!(
        p.max_input_tokens, 512,
        "the position table without sentence_bert_config.json"
    );
}

#[test]
fn unsupported_pooling_and_modules_are_refused() {
    let (dir, c) = model(BERT);
    let d = dir.path();
    minilm_modules(d);
    write(
        d,
        "1_Pooling/config.json",
        r#"{"pooling_mode_max_tokens":true}"#,
    );
    let e = PoolerInfo::read(d, &c, None).unwrap_err().to_string();
    assert!(e.contains("max") && e.contains("mean_tokens"), "{e}");
    write(
        d,
        "1_Pooling/config.json",
        r#"{"pooling_mode_cls_token":true,"pooling_mode_mean_tokens":true}"#,
    );
    let e = PoolerInfo::read(d, &c, None).unwrap_err().to_string();
    assert!(e.contains("several pooling modes"), "{e}");
    write(
        d,
        "modules.json",
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.StaticEmbedding"}]"#,
    );
    let e = PoolerInfo::read(d, &c, None).unwrap_err().to_string();
    assert!(e.contains("StaticEmbedding"), "{e}");
}

#[test]
fn a_plain_encoder_embeds_with_mean_pooling() {
    let (dir, c) = model(BERT);
    let p = PoolerInfo::read(dir.path(), &c, None).unwrap().unwrap();
    assert_eq!(
        (p.task, p.pooling, p.normalize),
        (Task::Embed, Pooling::Mean, false)
    );
}

#[test]
fn sequence_classifiers_score_with_their_labels() {
    let (dir, c) = model(
        r#"{"architectures":["BertForSequenceClassification"],"vocab_size":30522,"hidden_size":384,
        "intermediate_size":1536,"num_hidden_layers":6,"num_attention_heads":12,
        "id2label":{"0":"negative","1":"neutral","2":"positive"}}"#,
    );
    let p = PoolerInfo::read(dir.path(), &c, None).unwrap().unwrap();
    assert_eq!(p.task, Task::Score);
    assert_eq!(p.score_head, Some(ScoreHead::BertClassifier));
    assert_eq!(p.labels, ["negative", "neutral", "positive"]);
    assert_eq!((p.dimensions, p.pooling), (3, Pooling::Cls));
    assert_eq!(p.pair_input, PairInput::Tokenizer);
    let e = PoolerInfo::read(dir.path(), &c, Some(Task::Embed))
        .unwrap_err()
        .to_string();
    assert!(e.contains("option.task=rerank"), "{e}");
    let (dir, c) = model(
        r#"{"architectures":["XLMRobertaForSequenceClassification"],"vocab_size":250002,"hidden_size":1024,
        "intermediate_size":4096,"num_hidden_layers":24,"num_attention_heads":16,"pad_token_id":1,
        "max_position_embeddings":8194,"type_vocab_size":1,"id2label":{"0":"LABEL_0"}}"#,
    );
    let p = PoolerInfo::read(dir.path(), &c, Some(Task::Score))
        .unwrap()
        .unwrap();
    assert_eq!(p.score_head, Some(ScoreHead::RobertaClassifier));
    assert_eq!((p.dimensions, p.max_input_tokens), (1, 8192));
}

/// Qwen3-Embedding's module files (its published ones, prompts shortened).
#[test]
fn qwen3_embedding_pools_its_last_token() {
    let (dir, c) = model(QWEN3);
    let d = dir.path();
    write(
        d,
        "modules.json",
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
    );
    write(
        d,
        "1_Pooling/config.json",
        r#"{"word_embedding_dimension":1024,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":false,
        "pooling_mode_max_tokens":false,"pooling_mode_mean_sqrt_len_tokens":false,
        "pooling_mode_weightedmean_tokens":false,"pooling_mode_lasttoken":true,"include_prompt":true}"#,
    );
    write(
        d,
        "config_sentence_transformers.json",
        r#"{"prompts":{"query":"Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:","document":""},
        "default_prompt_name":null,"similarity_fn_name":"cosine"}"#,
    );
    write(
        d,
        "sentence_bert_config.json",
        r#"{"max_seq_length":32768,"do_lower_case":false}"#,
    );
    let p = PoolerInfo::read(d, &c, None).unwrap().unwrap();
    assert_eq!((p.task, p.pooling), (Task::Embed, Pooling::Last));
    assert!(p.normalize && p.matryoshka);
    assert_eq!((p.dimensions, p.max_input_tokens), (1024, 32768));
    assert!(p.prompt(Some("query")).unwrap().ends_with("\nQuery:"));
    assert_eq!(p.prompt(None), None);
    // option.task=text-generation serves it as the causal LM it also is.
    assert_eq!(PoolerInfo::read(d, &c, Some(Task::Generate)).unwrap(), None);
    // Mean pooling would need every token's state, which a decoder step does not keep.
    write(
        d,
        "1_Pooling/config.json",
        r#"{"pooling_mode_mean_tokens":true}"#,
    );
    let e = PoolerInfo::read(d, &c, None).unwrap_err().to_string();
    assert!(e.contains("last-token"), "{e}");
}

#[test]
fn a_causal_lm_reranks_with_its_yes_and_no_logits() {
    let (dir, c) = model(QWEN3);
    let d = dir.path();
    // A chat model with no sentence-transformers files generates.
    assert_eq!(PoolerInfo::read(d, &c, None).unwrap(), None);
    write(
        d,
        "tokenizer.json",
        r#"{"version":"1.0","added_tokens":[{"id":151643,"content":"<|endoftext|>","special":true}],
        "model":{"type":"BPE","vocab":{"!":0,"no":2152,"yes":9693,"Yes":9454}}}"#,
    );
    let p = PoolerInfo::read(d, &c, Some(Task::Score)).unwrap().unwrap();
    assert_eq!(
        p.score_head,
        Some(ScoreHead::YesNo {
            yes: 9693,
            no: 2152
        })
    );
    assert_eq!((p.pooling, p.dimensions), (Pooling::Last, 1));
    assert_eq!(p.pair_input, PairInput::Qwen3Reranker);
    // option.task=text-embedding on a chat model: its last token, normalized.
    let p = PoolerInfo::read(d, &c, Some(Task::Embed)).unwrap().unwrap();
    assert_eq!(
        (p.pooling, p.normalize, p.dimensions),
        (Pooling::Last, true, 1024)
    );
    write(
        d,
        "tokenizer.json",
        r#"{"model":{"type":"BPE","vocab":{"yes":1}}}"#,
    );
    let e = PoolerInfo::read(d, &c, Some(Task::Score))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"no\""), "{e}");
}

/// sentence-transformers 6's files: module types under `sentence_transformers.base`,
/// `pooling_mode` as a string, `max_seq_length` as the tokenizer's `model_max_length`.
#[test]
fn sentence_transformers_6_files_are_read() {
    let (dir, c) = model(BERT);
    let d = dir.path();
    write(
        d,
        "modules.json",
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.base.modules.transformer.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.base.modules.normalize.Normalize"}]"#,
    );
    write(
        d,
        "1_Pooling/config.json",
        r#"{"embedding_dimension":384,"pooling_mode":"mean","include_prompt":true}"#,
    );
    write(
        d,
        "sentence_bert_config.json",
        r#"{"transformer_task":"feature-extraction"}"#,
    );
    write(
        d,
        "tokenizer_config.json",
        r#"{"model_max_length":64,"do_lower_case":true}"#,
    );
    let p = PoolerInfo::read(d, &c, None).unwrap().unwrap();
    assert_eq!(
        (p.pooling, p.normalize, p.max_input_tokens),
        (Pooling::Mean, true, 64)
    );
    write(d, "1_Pooling/config.json", r#"{"pooling_mode":"max"}"#);
    let e = PoolerInfo::read(d, &c, None).unwrap_err().to_string();
    assert!(e.contains("\"max\""), "{e}");
    // transformers' stand-in for "no limit" leaves the position table's.
    write(d, "1_Pooling/config.json", r#"{"pooling_mode":"cls"}"#);
    write(
        d,
        "tokenizer_config.json",
        r#"{"model_max_length":1000000000000000019884624838656}"#,
    );
    let p = PoolerInfo::read(d, &c, None).unwrap().unwrap();
    assert_eq!((p.pooling, p.max_input_tokens), (Pooling::Cls, 512));
}
