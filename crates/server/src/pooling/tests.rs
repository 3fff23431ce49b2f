//! The pooling service on models loaded as `lmi serve` loads them (`load_model`, option.task,
//! the step budget), against sentence-transformers' vectors and transformers' yes/no logits
//! (tests/fixtures/embed/*/reference.json), and its refusals.

use std::path::PathBuf;
use std::sync::Arc;

use lmi_api::error::ErrorKind;
use serde_json::Value;

use super::*;
use crate::commands::serve::load_model;
use crate::config::{EnvVars, ServeArgs, ServingConfig};
use crate::metrics::ServerMetrics;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/embed")
        .join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The model in `dir` loaded as `lmi serve --model DIR --dtype fp32 -o KEY=VALUE...` loads it.
fn serve(dir: PathBuf, options: &[&str]) -> AppState {
    let cli = ServeArgs {
        model: Some(dir.to_string_lossy().into_owned()),
        dtype: Some("fp32".into()),
        kv_cache_bytes: Some("4M".into()),
        options: options.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    };
    let config = ServingConfig::load(&cli, &EnvVars::new(), None).unwrap();
    let metrics = Arc::new(ServerMetrics::new());
    let model = load_model(&config, &metrics).unwrap();
    let state = AppState::new(Arc::new(config), metrics, "m".into(), "m".into());
    assert!(state.set_loaded(model).is_ok());
    state
}

fn opts() -> EmbedOptions {
    EmbedOptions {
        truncation: Truncation::Refuse,
        prompt_name: None,
        normalize: None,
        dimensions: None,
    }
}

fn text(s: &str) -> PoolInput {
    PoolInput::Text(s.to_string())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt()
}

#[tokio::test]
async fn qwen3_embedding_vectors_match_sentence_transformers_with_their_prompts() {
    let name = "qwen3_embedding";
    let state = serve(fixture(name), &[]);
    let r = reference(name);
    let inputs = r["inputs"].as_array().unwrap();
    // Each input alone, with its prompt_name, cut to max_seq_length as sentence-transformers
    // cuts it.
    for (i, input) in inputs.iter().enumerate() {
        let o = EmbedOptions {
            prompt_name: input["prompt_name"].as_str().map(str::to_string),
            truncation: Truncation::Right,
            ..opts()
        };
        let got = embed(&state, vec![text(input["text"].as_str().unwrap())], &o)
            .await
            .unwrap();
        let want = floats(&input["embedding"]);
        let c = cosine(&got[0].values, &want);
        assert!(c >= 0.99999, "input {i}: cosine {c}");
        assert!((norm(&got[0].values) - 1.0).abs() < 1e-5, "normalized");
        assert_eq!(got[0].prompt_tokens, input["ids"].as_array().unwrap().len());
    }
    // Those without a prompt together, in order; and as token ids.
    let plain: Vec<&Value> = inputs
        .iter()
        .filter(|i| i["prompt_name"].is_null())
        .collect();
    assert!(!plain.is_empty());
    let texts = plain
        .iter()
        .map(|i| text(i["text"].as_str().unwrap()))
        .collect();
    let got = embed(&state, texts, &opts()).await.unwrap();
    let ids: Vec<PoolInput> = plain
        .iter()
        .map(|i| PoolInput::Ids(floats(&i["ids"]).iter().map(|&x| x as u32).collect()))
        .collect();
    let by_ids = embed(&state, ids, &opts()).await.unwrap();
    for (k, i) in plain.iter().enumerate() {
        assert!(cosine(&got[k].values, &floats(&i["embedding"])) >= 0.99999);
        assert_eq!(got[k], by_ids[k], "the same tokens as ids");
    }
    // Unnormalized when asked: the model's raw output, the reference up to its norm.
    let raw = embed(
        &state,
        vec![text(plain[0]["text"].as_str().unwrap())],
        &EmbedOptions {
            normalize: Some(false),
            ..opts()
        },
    )
    .await
    .unwrap();
    assert!((norm(&raw[0].values) - 1.0).abs() > 1e-3);
    assert!(cosine(&raw[0].values, &floats(&plain[0]["embedding"])) >= 0.99999);
    // Matryoshka: the leading dimensions, renormalized.
    let d = 16;
    let cut = embed(
        &state,
        vec![text(plain[0]["text"].as_str().unwrap())],
        &EmbedOptions {
            dimensions: Some(d),
            ..opts()
        },
    )
    .await
    .unwrap();
    assert_eq!(cut[0].values.len(), d);
    assert!((norm(&cut[0].values) - 1.0).abs() < 1e-5);
    assert!(cosine(&cut[0].values, &floats(&plain[0]["embedding"])[..d]) >= 0.99999);
    let m = state.handle().unwrap().metrics().snapshot();
    assert!(m.pooling_requests >= inputs.len() as u64);
}

#[tokio::test]
async fn embedding_refusals_name_what_to_fix() {
    let state = serve(
        fixture("qwen3_embedding"),
        &["option.max_client_batch_size=3"],
    );
    let p = pooler(&state).unwrap();
    let (dims, max_input) = (p.dimensions, p.max_input_tokens);
    let err = |r: Result<Vec<Embedding>, ApiError>| r.unwrap_err();
    let e = err(embed(&state, vec![text("a"); 4], &opts()).await);
    assert_eq!(e.kind, ErrorKind::BatchSizeExceeded);
    assert!(e.message.contains("max_client_batch_size") && e.message.contains('3'));
    let e = err(embed(&state, vec![], &opts()).await);
    assert!(e.message.contains("no inputs"), "{}", e.message);
    let e = err(embed(&state, vec![text("a"), text("")], &opts()).await);
    assert!(e.message.contains("input 1 is empty"), "{}", e.message);
    let vocab = state.handle().unwrap().limits().vocab_size as u32;
    let e = err(embed(&state, vec![PoolInput::Ids(vec![1, vocab])], &opts()).await);
    assert!(e.message.contains("vocabulary"), "{}", e.message);
    let big = EmbedOptions {
        dimensions: Some(dims + 1),
        ..opts()
    };
    let e = err(embed(&state, vec![text("a")], &big).await);
    let (asked, have) = ((dims + 1).to_string(), dims.to_string());
    assert!(
        e.message.contains(&asked) && e.message.contains(&have),
        "{}",
        e.message
    );
    let unknown = EmbedOptions {
        prompt_name: Some("passage".into()),
        ..opts()
    };
    let e = err(embed(&state, vec![text("a")], &unknown).await);
    assert!(
        e.message.contains("query"),
        "names the known prompts: {}",
        e.message
    );

    // Longer than the model's max_seq_length: refused with both numbers, or cut keeping the
    // appended EOS.
    let long = "word ".repeat(3 * max_input);
    let e = err(embed(&state, vec![text(&long)], &opts()).await);
    assert!(
        e.message.contains(&format!("of {max_input} tokens")) && e.message.contains("has "),
        "{}",
        e.message
    );
    for truncation in [Truncation::Right, Truncation::Left] {
        let o = EmbedOptions {
            truncation,
            ..opts()
        };
        let got = embed(&state, vec![text(&long)], &o).await.unwrap();
        assert_eq!(got[0].prompt_tokens, max_input);
    }
    // An embedding model is not a scoring or a generative one.
    let so = ScoreOptions {
        truncation: Truncation::Refuse,
        instruction: None,
    };
    let e = rerank(&state, "q", &["d".into()], &so).await.unwrap_err();
    assert!(e.message.contains("/v1/embeddings"), "{}", e.message);
    let e = require_generative(&state).unwrap_err();
    assert!(e.message.contains("/v1/embeddings") && e.message.contains("not text generation"));
}

#[tokio::test]
async fn qwen3_reranker_scores_are_the_yes_no_logit_difference() {
    let name = "qwen3_reranker";
    let state = serve(fixture(name), &["option.task=rerank"]);
    let r = reference(name);
    let pairs = r["pairs"].as_array().unwrap();
    let so = ScoreOptions {
        truncation: Truncation::Refuse,
        instruction: None,
    };
    let query = pairs[0]["query"].as_str().unwrap();
    let same_query: Vec<&Value> = pairs.iter().filter(|p| p["query"] == query).collect();
    let docs: Vec<String> = same_query
        .iter()
        .map(|p| p["document"].as_str().unwrap().to_string())
        .collect();
    let got = rerank(&state, query, &docs, &so).await.unwrap();
    for (p, s) in same_query.iter().zip(&got) {
        let want = p["yes_logit"].as_f64().unwrap() - p["no_logit"].as_f64().unwrap();
        assert_eq!(s.values.len(), 1);
        assert!(
            (f64::from(s.values[0]) - want).abs() < 1e-4,
            "{} vs {want}",
            s.values[0]
        );
        assert_eq!(s.prompt_tokens, p["ids"].as_array().unwrap().len());
    }
    // Every pair through classify_pairs, in order.
    let all: Vec<(String, String)> = pairs
        .iter()
        .map(|p| {
            let s = |k: &str| p[k].as_str().unwrap().to_string();
            (s("query"), s("document"))
        })
        .collect();
    let got = classify_pairs(&state, all, &so).await.unwrap();
    for (p, s) in pairs.iter().zip(&got) {
        let want = p["yes_logit"].as_f64().unwrap() - p["no_logit"].as_f64().unwrap();
        assert!((f64::from(s.values[0]) - want).abs() < 1e-4);
    }
    // Single inputs have no pair to judge; generation routes are refused.
    let e = classify(&state, vec![text("q")], &so).await.unwrap_err();
    assert!(e.message.contains("/rerank"), "{}", e.message);
    let e = require_generative(&state).unwrap_err();
    assert!(e.message.contains("/rerank"), "{}", e.message);
    let e = embed(&state, vec![text("q")], &opts()).await.unwrap_err();
    assert!(e.message.contains("/rerank"), "{}", e.message);
}

#[tokio::test]
async fn a_generative_model_serves_no_pooling_routes() {
    let dir = tempfile::tempdir().unwrap();
    lmi_checkpoint::testing::write_tiny_model(
        dir.path(),
        &lmi_checkpoint::testing::TinySpec::llama(),
    )
    .unwrap();
    let state = serve(dir.path().to_path_buf(), &[]);
    assert!(require_generative(&state).is_ok());
    let e = pooler(&state).unwrap_err();
    assert!(e.message.contains("/v1/chat/completions"), "{}", e.message);
    let e = embed(&state, vec![text("a")], &opts()).await.unwrap_err();
    assert!(e.message.contains("option.task"), "{}", e.message);
}

#[tokio::test]
async fn encoder_embeddings_match_sentence_transformers() {
    for name in ["bert_mean", "bert_cls_dense", "xlmr_cls"] {
        let state = serve(fixture(name), &[]);
        let r = reference(name);
        let inputs = r["inputs"].as_array().unwrap();
        // The inputs of each prompt (and those with none) in one request, cut to
        // max_seq_length as sentence-transformers cuts them.
        let mut prompts: Vec<Option<&str>> =
            inputs.iter().map(|i| i["prompt_name"].as_str()).collect();
        prompts.sort_unstable();
        prompts.dedup();
        let mut checked = 0;
        for prompt in prompts {
            let these: Vec<&Value> = inputs
                .iter()
                .filter(|i| i["prompt_name"].as_str() == prompt)
                .collect();
            let texts = these
                .iter()
                .map(|i| text(i["text"].as_str().unwrap()))
                .collect();
            let o = EmbedOptions {
                truncation: Truncation::Right,
                prompt_name: prompt.map(str::to_string),
                ..opts()
            };
            let got = embed(&state, texts, &o).await.unwrap();
            assert_eq!(got.len(), these.len());
            for (input, e) in these.iter().zip(&got) {
                let c = cosine(&e.values, &floats(&input["embedding"]));
                assert!(c >= 0.99999, "{name} {:?}: cosine {c}", input["text"]);
                assert_eq!(e.prompt_tokens, input["ids"].as_array().unwrap().len());
                checked += 1;
            }
        }
        assert_eq!(
            checked,
            inputs.len(),
            "{name}: each prompt's inputs in a row"
        );
        // These models declare no Matryoshka dimensions.
        let cut = EmbedOptions {
            dimensions: Some(8),
            ..opts()
        };
        let e = embed(&state, vec![text("a")], &cut).await.unwrap_err();
        assert!(e.message.contains("Matryoshka"), "{name}: {}", e.message);
    }
}

#[tokio::test]
async fn cross_encoder_and_classifier_logits_match_transformers() {
    let so = ScoreOptions {
        truncation: Truncation::Right,
        instruction: None,
    };
    for name in ["bert_cross", "xlmr_rerank"] {
        let state = serve(fixture(name), &[]);
        let r = reference(name);
        assert_eq!(
            pooler(&state).unwrap().max_input_tokens as u64,
            r["max_length"].as_u64().unwrap()
        );
        let pairs: Vec<(String, String)> = r["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let s = |k: &str| p[k].as_str().unwrap().to_string();
                (s("query"), s("document"))
            })
            .collect();
        let got = classify_pairs(&state, pairs.clone(), &so).await.unwrap();
        for (i, (p, s)) in r["pairs"].as_array().unwrap().iter().zip(&got).enumerate() {
            let want = floats(&p["logits"]);
            assert_eq!(s.values.len(), want.len());
            let d = (s.values[0] - want[0]).abs();
            assert!(d < 1e-4, "{name} pair {i}: {} vs {}", s.values[0], want[0]);
            assert_eq!(s.prompt_tokens, p["ids"].as_array().unwrap().len());
        }
        // One pair alone scores as it does among the others.
        let (q, _) = &pairs[0];
        let docs: Vec<String> = pairs.iter().map(|(_, d)| d.clone()).collect();
        let one = rerank(&state, q, &docs[..1], &so).await.unwrap();
        assert_eq!(one[0], got[0]);
        let e = require_generative(&state).unwrap_err();
        assert!(e.message.contains("/rerank"), "{}", e.message);
    }
    let name = "bert_classify";
    let state = serve(fixture(name), &[]);
    let r = reference(name);
    let inputs = r["inputs"].as_array().unwrap();
    let texts = inputs
        .iter()
        .map(|i| text(i["text"].as_str().unwrap()))
        .collect();
    let got = classify(&state, texts, &so).await.unwrap();
    assert_eq!(pooler(&state).unwrap().labels.len(), 3);
    for (i, (input, s)) in inputs.iter().zip(&got).enumerate() {
        let want = floats(&input["logits"]);
        assert_eq!(s.values.len(), 3);
        for (a, b) in s.values.iter().zip(&want) {
            assert!(
                (a - b).abs() < 1e-4,
                "{name} input {i}: {:?} vs {want:?}",
                s.values
            );
        }
    }
}

/// (`query`, document) for each of `docs`, through the service's pair scoring.
async fn rerank(
    state: &AppState,
    query: &str,
    docs: &[String],
    so: &ScoreOptions,
) -> Result<Vec<Scored>, ApiError> {
    let pairs = docs
        .iter()
        .map(|d| (query.to_string(), d.clone()))
        .collect();
    classify_pairs(state, pairs, so).await
}
