//! Embedding models on the CPU engine against sentence-transformers' `encode` on the same
//! ids (tests/fixtures/embed/): BERT with mean pooling (sentence-transformers 5's and 6's
//! files), BERT with CLS pooling and a Dense module, XLM-RoBERTa with CLS pooling, and
//! Qwen3-Embedding's last token on the decoder engine. The same inputs alone, together, and
//! beside a generation chunk give the same bits.

mod pool_common;

use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::sampling::SamplingParams;
use lmi_engine::{DType, PoolRequest, SampleRequest, SeqChunk, StepBatch};
use pool_common::*;

/// sentence-transformers computes in f32 too, its products summed in other orders.
const COSINE: f64 = 0.99999;
const MAX_DIFF: f32 = 2e-5;

/// The fixture's inputs (recorded ids) and reference vectors.
fn embed_refs(name: &str) -> (Vec<Input>, Vec<Vec<f32>>) {
    let r = reference(name);
    let inputs = r["inputs"].as_array().unwrap();
    (
        inputs.iter().map(|x| Input::text(ids(&x["ids"]))).collect(),
        inputs.iter().map(|x| floats(&x["embedding"])).collect(),
    )
}

/// Ours (normalized where the model's pipeline normalizes, as sentence-transformers'
/// reference is) against the reference, input by input.
fn assert_close(name: &str, normalize: bool, ours: &[Vec<f32>], refs: &[Vec<f32>], cos: f64) {
    for (i, (o, r)) in ours.iter().zip(refs).enumerate() {
        let o = if normalize { normalized(o) } else { o.clone() };
        assert_eq!(o.len(), r.len(), "{name} input {i}: dimensions");
        let c = cosine(&o, r);
        assert!(c >= cos, "{name} input {i}: cosine {c}");
        if cos >= COSINE {
            let d = o
                .iter()
                .zip(r)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(d <= MAX_DIFF, "{name} input {i}: max |Δ| {d}");
        }
    }
}

fn encoder(
    name: &str,
    dtype: Option<DType>,
) -> lmi_engine::encoder::EncoderEngine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype,
        ..Default::default()
    };
    lmi_engine::load_cpu_encoder(&fixture(name), &opts).unwrap()
}

#[test]
fn encoders_equal_sentence_transformers() {
    for (name, dims) in [
        ("bert_mean", 32),
        ("bert_mean_st6", 32),
        ("bert_cls_dense", 24),
        ("xlmr_cls", 64),
    ] {
        let mut e = encoder(name, None);
        let pooler = e.pooler().unwrap().clone();
        assert_eq!(pooler.task, lmi_checkpoint::pooling::Task::Embed, "{name}");
        assert!(pooler.normalize, "{name}: its pipeline ends in Normalize");
        assert_eq!(pooler.dimensions, dims, "{name}");
        let (inputs, refs) = embed_refs(name);
        let alone = pool_each(&mut e, &inputs);
        assert_close(name, true, &alone, &refs, COSINE);
        // Every input in one step: the same bits.
        let together = pool_batch(&mut e, &inputs);
        assert_eq!(bits(&together), bits(&alone), "{name}: batched");
        // Reversed, so each sits elsewhere in the step.
        let mut rev = inputs.clone();
        rev.reverse();
        let mut back = pool_batch(&mut e, &rev);
        back.reverse();
        assert_eq!(bits(&back), bits(&alone), "{name}: reversed");
    }
}

/// `--dtype bf16`: bf16 matrices (and their rounded inputs) through the bf16 product kernels.
#[test]
fn encoders_run_in_bf16() {
    for name in ["bert_mean", "bert_cls_dense", "xlmr_cls"] {
        let mut e = encoder(name, Some(DType::BF16));
        assert_eq!(e.weights_format(), "bf16");
        let (inputs, refs) = embed_refs(name);
        let alone = pool_each(&mut e, &inputs);
        assert_close(name, true, &alone, &refs, 0.9999);
        assert_eq!(
            bits(&pool_batch(&mut e, &inputs)),
            bits(&alone),
            "{name}: batched"
        );
    }
}

/// lmi_engine::open picks the encoder engine from config.json.
#[test]
fn open_picks_the_encoder_engine() {
    let opts = EngineOptions::default();
    let mut e = lmi_engine::open(lmi_engine::Device::Cpu, &fixture("xlmr_cls"), &opts).unwrap();
    assert_eq!(
        e.model_config().architecture,
        lmi_engine::Architecture::XlmRoberta
    );
    // XLM-R's positions start at pad + 1 = 2: the longest input is the table's 130 less 2.
    assert_eq!(e.model_config().max_position_embeddings, 128);
    assert!(e.num_blocks() >= 128 / lmi_engine::BLOCK_SIZE);
    let (inputs, refs) = embed_refs("xlmr_cls");
    let got = pool_batch(e.as_mut(), &inputs[..2]);
    assert_close("xlmr_cls via open", true, &got, &refs[..2], COSINE);
    // The decoder engine refuses an encoder in one line.
    let err = lmi_engine::load_cpu(&fixture("xlmr_cls"), &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("XLMRobertaModel is an encoder"), "{err}");
}

/// An encoder keeps no K/V: a chunk that does not start its sequence, a chunk without a pool
/// request, a draw, are refused with what is wrong.
#[test]
fn encoder_steps_refuse_what_they_cannot_run() {
    let mut e = encoder("bert_mean", None);
    let (inputs, _) = embed_refs("bert_mean");
    let mut chunks = pool_common::chunks(&inputs[..2], &mut 0);
    let pools = [PoolRequest {
        chunk: 0,
        segment_b: None,
    }];
    let step = |e: &mut dyn StepEngine, chunks: &[SeqChunk], pools: &[PoolRequest]| {
        e.step(&StepBatch {
            chunks,
            samples: &[],
            prompt_logprobs: &[],
            media: &[],
            rope_deltas: &[],
            states: &[],
            pools,
            mtp: &[],
        })
        .map(|o| o.pooled)
    };
    let err = step(&mut e, &chunks, &pools).unwrap_err().to_string();
    assert!(err.contains("1 pool requests for 2 chunks"), "{err}");
    chunks[0].start_pos = 16;
    chunks[0].block_table.push(9);
    let err = step(&mut e, &chunks[..1], &pools).unwrap_err().to_string();
    assert!(err.contains("starts at position 16"), "{err}");
    let too_long = Input::text(vec![5; 65 + 64]);
    let long = pool_common::chunks(&[too_long], &mut 0);
    let err = step(&mut e, &long, &pools).unwrap_err().to_string();
    assert!(err.contains("128 positions"), "{err}");
    // A draw on an encoder's chunk.
    let params = SamplingParams::default();
    let ok = pool_common::chunks(&inputs[..1], &mut 0);
    let samples = SampleRequest::at_each_last_token(&ok, &params);
    let err = e
        .step(&StepBatch {
            chunks: &ok,
            samples: &samples,
            prompt_logprobs: &[],
            media: &[],
            rope_deltas: &[],
            states: &[],
            pools: &pools,
            mtp: &[],
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("draws no tokens"), "{err}");
}

fn qwen3_embedding() -> lmi_engine::Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        kv_blocks: Some(256),
        ..Default::default()
    };
    lmi_engine::load_cpu(&fixture("qwen3_embedding"), &opts).unwrap()
}

#[test]
fn qwen3_embedding_equals_sentence_transformers() {
    let mut e = qwen3_embedding();
    let p = e.pooler().unwrap().clone();
    assert_eq!(p.pooling, lmi_checkpoint::pooling::Pooling::Last);
    assert!(p.normalize && p.matryoshka);
    assert_eq!((p.dimensions, p.max_input_tokens), (64, 128));
    assert!(p.prompt(Some("query")).unwrap().starts_with("Instruct: "));
    let (inputs, refs) = embed_refs("qwen3_embedding");
    let alone = pool_each(&mut e, &inputs);
    assert_close("qwen3_embedding", true, &alone, &refs, COSINE);
    let together = pool_batch(&mut e, &inputs);
    assert_eq!(bits(&together), bits(&alone), "batched");
}

/// Pool chunks beside a generation chunk (a prompt's prefill wanting its next token): the
/// vectors are the same bits, and so is the generation's greedy token.
#[test]
fn qwen3_embedding_beside_generation() {
    let mut e = qwen3_embedding();
    let (inputs, _) = embed_refs("qwen3_embedding");
    let alone = pool_each(&mut e, &inputs[..3]);
    let prompt = Input::text(inputs[3].ids.clone());
    let gen_step = |e: &mut dyn StepEngine, with_pools: bool| {
        let pools = if with_pools { &inputs[..3] } else { &[][..] };
        pool_beside_generation(e, &prompt, pools)
    };
    let (token_alone, none) = gen_step(&mut e, false);
    assert!(none.is_empty());
    let (token, pooled) = gen_step(&mut e, true);
    assert_eq!(token, token_alone, "the generation's token");
    assert_eq!(bits(&pooled), bits(&alone), "the pooled vectors");
    // A pool chunk cannot also be drawn from.
    let chunks = pool_common::chunks(&inputs[..1], &mut 0);
    let greedy = SamplingParams::default();
    let samples = SampleRequest::at_each_last_token(&chunks, &greedy);
    let err = e
        .step(&StepBatch {
            chunks: &chunks,
            samples: &samples,
            prompt_logprobs: &[],
            media: &[],
            rope_deltas: &[],
            states: &[],
            pools: &[PoolRequest {
                chunk: 0,
                segment_b: None,
            }],
            mtp: &[],
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("pooled"), "{err}");
}

/// A chat model (no sentence-transformers files) has no pooler; option.task=text-embedding
/// gives it one (its last token, normalized).
#[test]
fn a_chat_model_pools_only_when_asked() {
    let dir = fixture("qwen3_reranker");
    let opts = EngineOptions {
        kv_blocks: Some(64),
        ..Default::default()
    };
    let e = lmi_engine::load_cpu(&dir, &opts).unwrap();
    assert!(e.pooler().is_none());
    let opts = EngineOptions {
        task: Some(lmi_checkpoint::pooling::Task::Embed),
        ..opts
    };
    let e = lmi_engine::load_cpu(&dir, &opts).unwrap();
    let p = e.pooler().unwrap();
    assert_eq!(
        (p.pooling, p.normalize),
        (lmi_checkpoint::pooling::Pooling::Last, true)
    );
}
