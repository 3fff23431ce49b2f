//! What the embedding and scoring tests share: the fixtures of tests/fixtures/embed/ (tiny
//! models written by sentence-transformers / transformers, with what those computed on them,
//! `reference.json`), and pool steps over their recorded ids.
#![allow(dead_code)]

use std::path::PathBuf;

use lmi_engine::SampleRequest;
use lmi_engine::engine::StepEngine;
use lmi_engine::sampling::SamplingParams;
use lmi_engine::{BLOCK_SIZE, LogitsWanted, PoolRequest, SeqChunk, StepBatch};

/// `tests/fixtures/embed/{name}`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/embed/{name}"))
}

pub fn reference(name: &str) -> serde_json::Value {
    let path = fixture(name).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// One input to pool: its ids and, for a pair, where its second segment starts.
#[derive(Debug, Clone)]
pub struct Input {
    pub ids: Vec<u32>,
    pub segment_b: Option<usize>,
}

impl Input {
    pub fn text(ids: Vec<u32>) -> Self {
        Input {
            ids,
            segment_b: None,
        }
    }

    /// A pair from its recorded token type ids (the first 1 starts the second segment).
    pub fn pair(ids: Vec<u32>, type_ids: &[u32]) -> Self {
        Input {
            ids,
            segment_b: type_ids.iter().position(|&t| t == 1),
        }
    }
}

/// Chunks for `inputs`, whole and from position 0, each with blocks of its own from `next`.
pub fn chunks(inputs: &[Input], next: &mut u32) -> Vec<SeqChunk> {
    inputs
        .iter()
        .map(|x| {
            let blocks = x.ids.len().div_ceil(BLOCK_SIZE) as u32;
            let table = (*next..*next + blocks).collect();
            *next += blocks;
            SeqChunk {
                tokens: x.ids.clone(),
                start_pos: 0,
                block_table: table,
                window_table: Vec::new(),
                logits: LogitsWanted::None,
                adapter: None,
            }
        })
        .collect()
}

/// The pooled outputs of `inputs`, all in one step.
pub fn pool_batch(e: &mut dyn StepEngine, inputs: &[Input]) -> Vec<Vec<f32>> {
    pool_step(e, None, inputs).1
}

/// One step: `prompt` as a generation chunk that draws its next token greedily, then
/// `inputs` pooled; the drawn token and the pooled outputs.
pub fn pool_beside_generation(
    e: &mut dyn StepEngine,
    prompt: &Input,
    inputs: &[Input],
) -> (u32, Vec<Vec<f32>>) {
    let (token, pooled) = pool_step(e, Some(prompt), inputs);
    (token.expect("the generation chunk's draw"), pooled)
}

fn pool_step(
    e: &mut dyn StepEngine,
    prompt: Option<&Input>,
    inputs: &[Input],
) -> (Option<u32>, Vec<Vec<f32>>) {
    let all: Vec<Input> = prompt.into_iter().chain(inputs).cloned().collect();
    let mut chunks = chunks(&all, &mut 0);
    let first = usize::from(prompt.is_some());
    if prompt.is_some() {
        chunks[0].logits = LogitsWanted::Last;
    }
    let greedy = SamplingParams::default();
    let samples = SampleRequest::at_each_last_token(&chunks[..first], &greedy);
    let pools: Vec<PoolRequest> = (first..all.len())
        .map(|chunk| PoolRequest {
            chunk,
            segment_b: all[chunk].segment_b,
        })
        .collect();
    let out = e
        .step(&StepBatch {
            chunks: &chunks,
            samples: &samples,
            prompt_logprobs: &[],
            media: &[],
            rope_deltas: &[],
            states: &[],
            pools: &pools,
            mtp: &[],
        })
        .unwrap();
    assert_eq!(out.samples.len(), first);
    assert_eq!(out.pooled.len(), inputs.len());
    (out.samples.first().map(|s| s.token), out.pooled)
}

/// Each input's pooled output, one step each.
pub fn pool_each(e: &mut dyn StepEngine, inputs: &[Input]) -> Vec<Vec<f32>> {
    inputs
        .iter()
        .map(|x| pool_batch(e, std::slice::from_ref(x)).remove(0))
        .collect()
}

pub fn normalized(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|&x| (x as f64 / n) as f32).collect()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

pub fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|x| x.iter().map(|f| f.to_bits()).collect())
        .collect()
}
