//! Decoder pooling on the CUDA engine (bf16), on the CPU emulator (and on the driver's device
//! when there is one): Qwen3-Embedding's last-token vectors and Qwen3-Reranker's yes − no
//! difference against sentence-transformers' / transformers' f32 references
//! (tests/fixtures/embed/), in a step beside a generation chunk. Pool steps run off the decode
//! graphs; a decode step after them still replays from one.

mod cuda_common;
mod pool_common;

use std::sync::Arc;

use lmi_checkpoint::pooling::Task;
use lmi_cuda::Device;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::{DType, Engine, LogitsWanted};
use pool_common::*;

/// bf16 weights and activations against f32 references.
const BF16_COSINE: f64 = 0.9998;
const BF16_SCORE: f32 = 5e-2;

fn engine<D: Device>(dev: &Arc<D>, name: &str, task: Option<Task>) -> Engine<CudaBackend<D>> {
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(256),
        task,
        ..Default::default()
    };
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    Engine::load(backend, &fixture(name), &opts).unwrap()
}

/// `inputs` pooled in one step beside a one-token decode chunk that draws greedily.
fn beside_decode(e: &mut dyn StepEngine, inputs: &[Input]) -> Vec<Vec<f32>> {
    pool_beside_generation(e, &Input::text(vec![7]), inputs).1
}

fn check_pooling<D: Device>(dev: &Arc<D>) {
    let mut e = engine(dev, "qwen3_embedding", None);
    let r = reference("qwen3_embedding");
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
        .map(|x| floats(&x["embedding"]))
        .collect();
    for got in [pool_batch(&mut e, &inputs), beside_decode(&mut e, &inputs)] {
        for (i, (g, want)) in got.iter().zip(&refs).enumerate() {
            let c = cosine(&normalized(g), want);
            assert!(c >= BF16_COSINE, "qwen3_embedding input {i}: cosine {c}");
        }
    }

    let mut e = engine(dev, "qwen3_reranker", Some(Task::Score));
    let r = reference("qwen3_reranker");
    let pairs = r["pairs"].as_array().unwrap();
    let inputs: Vec<Input> = pairs.iter().map(|x| Input::text(ids(&x["ids"]))).collect();
    let got = beside_decode(&mut e, &inputs);
    for (i, (g, x)) in got.iter().zip(pairs).enumerate() {
        let want = (x["yes_logit"].as_f64().unwrap() - x["no_logit"].as_f64().unwrap()) as f32;
        assert!(
            (g[0] - want).abs() <= BF16_SCORE,
            "pair {i}: {} vs {want}",
            g[0]
        );
    }
    // Decode steps still replay from their graph after pool steps.
    let captured = e.backend().graphs_captured();
    let table: Vec<u32> = (200..201).collect();
    for pos in 0..3 {
        let chunk = lmi_engine::SeqChunk {
            tokens: vec![5],
            start_pos: pos,
            block_table: table.clone(),
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter: None,
        };
        e.forward_logits(std::slice::from_ref(&chunk)).unwrap();
    }
    assert!(e.backend().graphs_captured() >= captured.max(1));
}

#[test]
fn decoder_pooling_on_cuda() {
    on_every_raw_device!(check_pooling);
}
