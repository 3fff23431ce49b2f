//! Scoring models on the CPU engine against transformers on the same ids
//! (tests/fixtures/embed/): BERT and XLM-RoBERTa cross-encoders (`CrossEncoder.predict`'s raw
//! logits), a three-label BERT classifier, and Qwen3-Reranker's `logit(yes) − logit(no)` at
//! its last token on the decoder engine. The same inputs alone and together give the same
//! bits.

mod pool_common;

use lmi_checkpoint::pooling::{PairInput, ScoreHead, Task};
use lmi_engine::engine::{EngineOptions, StepEngine};
use pool_common::*;

/// Logits against transformers' in f32.
const TOL: f32 = 1e-4;

fn assert_logits(name: &str, ours: &[Vec<f32>], refs: &[Vec<f32>]) {
    for (i, (o, r)) in ours.iter().zip(refs).enumerate() {
        assert_eq!(o.len(), r.len(), "{name} input {i}: labels");
        for (a, b) in o.iter().zip(r) {
            assert!((a - b).abs() <= TOL, "{name} input {i}: {o:?} vs {r:?}");
        }
    }
}

fn encoder(name: &str) -> lmi_engine::encoder::EncoderEngine<lmi_engine::cpu::CpuBackend> {
    lmi_engine::load_cpu_encoder(&fixture(name), &EngineOptions::default()).unwrap()
}

#[test]
fn cross_encoders_equal_transformers() {
    for (name, head) in [
        ("bert_cross", ScoreHead::BertClassifier),
        ("xlmr_rerank", ScoreHead::RobertaClassifier),
    ] {
        let mut e = encoder(name);
        let p = e.pooler().unwrap().clone();
        assert_eq!(p.task, Task::Score, "{name}");
        assert_eq!(p.score_head, Some(head), "{name}");
        assert_eq!(
            (p.dimensions, p.pair_input),
            (1, PairInput::Tokenizer),
            "{name}"
        );
        // transformers' tokenizer_config.json model_max_length.
        assert_eq!(p.max_input_tokens, 128, "{name}");
        let r = reference(name);
        let pairs = r["pairs"].as_array().unwrap();
        let inputs: Vec<Input> = pairs
            .iter()
            .map(|x| Input::pair(ids(&x["ids"]), &ids(&x["type_ids"])))
            .collect();
        if name == "bert_cross" {
            assert!(
                inputs.iter().all(|x| x.segment_b.is_some()),
                "BERT pairs have types"
            );
        }
        let refs: Vec<Vec<f32>> = pairs.iter().map(|x| floats(&x["logits"])).collect();
        let alone = pool_each(&mut e, &inputs);
        assert_logits(name, &alone, &refs);
        let together = pool_batch(&mut e, &inputs);
        assert_eq!(bits(&together), bits(&alone), "{name}: batched");
    }
}

/// Token types matter to a BERT cross-encoder: without the second segment's the logits move
/// (so the test above checks `segment_b`).
#[test]
fn bert_pairs_need_their_token_types() {
    let mut e = encoder("bert_cross");
    let r = reference("bert_cross");
    let x = &r["pairs"][0];
    let pair = Input::pair(ids(&x["ids"]), &ids(&x["type_ids"]));
    let flat = Input::text(pair.ids.clone());
    let want = floats(&x["logits"])[0];
    let got = pool_batch(&mut e, &[pair, flat]);
    assert!((got[0][0] - want).abs() <= TOL);
    assert!((got[1][0] - want).abs() > 10.0 * TOL, "{got:?} vs {want}");
}

#[test]
fn a_classifier_gives_every_labels_logit() {
    let mut e = encoder("bert_classify");
    let p = e.pooler().unwrap().clone();
    assert_eq!(p.labels, ["negative", "neutral", "positive"]);
    assert_eq!(p.dimensions, 3);
    let r = reference("bert_classify");
    let inputs: Vec<Input> = r["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| Input::text(ids(&x["ids"])))
        .collect();
    let refs: Vec<Vec<f32>> = r["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| floats(&x["logits"]))
        .collect();
    let alone = pool_each(&mut e, &inputs);
    assert_logits("bert_classify", &alone, &refs);
    assert_eq!(bits(&pool_batch(&mut e, &inputs)), bits(&alone));
    // A classifier does not embed.
    let opts = EngineOptions {
        task: Some(Task::Embed),
        ..Default::default()
    };
    let err = lmi_engine::load_cpu_encoder(&fixture("bert_classify"), &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("option.task=rerank"), "{err}");
}

fn qwen3_reranker() -> lmi_engine::Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        kv_blocks: Some(256),
        task: Some(Task::Score),
        ..Default::default()
    };
    lmi_engine::load_cpu(&fixture("qwen3_reranker"), &opts).unwrap()
}

#[test]
fn qwen3_reranker_scores_its_yes_no_difference() {
    let mut e = qwen3_reranker();
    let r = reference("qwen3_reranker");
    let (yes, no) = (
        r["yes_id"].as_u64().unwrap() as u32,
        r["no_id"].as_u64().unwrap() as u32,
    );
    let p = e.pooler().unwrap().clone();
    assert_eq!(p.score_head, Some(ScoreHead::YesNo { yes, no }));
    assert_eq!(p.pair_input, PairInput::Qwen3Reranker);
    let pairs = r["pairs"].as_array().unwrap();
    let inputs: Vec<Input> = pairs.iter().map(|x| Input::text(ids(&x["ids"]))).collect();
    let refs: Vec<Vec<f32>> = pairs
        .iter()
        .map(|x| {
            let d = x["yes_logit"].as_f64().unwrap() - x["no_logit"].as_f64().unwrap();
            vec![d as f32]
        })
        .collect();
    let alone = pool_each(&mut e, &inputs);
    assert_logits("qwen3_reranker", &alone, &refs);
    assert_eq!(bits(&pool_batch(&mut e, &inputs)), bits(&alone), "batched");

    // Beside a decode-sized generation chunk that wants its next token: the same scores.
    let prompt = Input::text(inputs[0].ids[..9].to_vec());
    let (_, pooled) = pool_beside_generation(&mut e, &prompt, &inputs[1..4]);
    assert_eq!(bits(&pooled), bits(&alone[1..4]), "beside generation");
}

/// option.task=rerank on a model whose vocabulary lacks "yes" / "no" is refused at load.
#[test]
fn rerank_needs_yes_and_no_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("qwen3_reranker");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(
        dir.path().join("tokenizer.json"),
        r#"{"model":{"type":"BPE","vocab":{"a":0}}}"#,
    )
    .unwrap();
    let opts = EngineOptions {
        kv_blocks: Some(16),
        task: Some(Task::Score),
        ..Default::default()
    };
    let err = lmi_engine::load_cpu(dir.path(), &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("\"yes\" and \"no\""), "{err}");
}
