//! `lmi bench engine`: prefill and decode throughput of the engine alone at several batch
//! sizes, and batch-1 decode against the memory roofline (weight bytes per step over a
//! bandwidth measured here).

use std::time::Instant;

use lmi_engine::engine::{EngineOptions, StepEngine};
use lmi_engine::sampling::SamplingParams;
use lmi_engine::{
    BLOCK_SIZE, ChunkState, DType, Device, LogitsWanted, SampleRequest, SeqChunk, StepBatch,
};
use rayon::prelude::*;

use crate::args::ModelArgs;

#[derive(clap::Args)]
pub struct EngineArgs {
    #[command(flatten)]
    m: ModelArgs,
    /// Batch sizes to measure (default 1,4,16,64 on the CPU; 1,8,64,256 on a GPU).
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Decode steps measured per batch size (after one warm-up step).
    #[arg(long, default_value_t = 16)]
    decode_steps: usize,
    /// On a GPU, the ceilings' sizes: MiB copied for the bandwidth, side of the square bf16
    /// products for the matrix rate (small ones for a rehearsal on the fake driver).
    #[arg(long, value_delimiter = ',', default_values_t = [1024, 8192])]
    ceiling_sizes: Vec<usize>,
}

/// Read bandwidth of main memory: the best of a few parallel passes over a 1 GiB buffer.
fn measure_read_bandwidth() -> f64 {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let threads = rayon::current_num_threads();
    let mut best = 0.0f64;
    for _ in 0..4 {
        let t = Instant::now();
        let sum: u64 = buf
            .par_chunks(words.div_ceil(threads))
            .map(|c| {
                let mut acc = [0u64; 8];
                for w in c.chunks_exact(8) {
                    for i in 0..8 {
                        acc[i] = acc[i].wrapping_add(w[i]);
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t.elapsed().as_secs_f64());
    }
    best
}

pub fn run(a: EngineArgs) -> anyhow::Result<()> {
    let &[copy_mib, side] = a.ceiling_sizes.as_slice() else {
        anyhow::bail!("--ceiling-sizes takes two numbers: MiB copied, product side");
    };
    let (dir, dtype, gguf) = a.m.resolve()?;
    let batches = match (a.batch.is_empty(), a.m.device) {
        (false, _) => a.batch.clone(),
        (true, Device::Cpu) => vec![1, 4, 16, 64],
        (true, Device::Cuda(_)) => vec![1, 8, 64, 256],
    };
    let max_batch = batches.iter().copied().max().unwrap_or(1);
    let per_seq = (a.prompt_len + a.decode_steps + 1).div_ceil(BLOCK_SIZE);
    let opts = EngineOptions {
        dtype,
        gguf: gguf.clone(),
        kv_blocks: Some(per_seq * max_batch),
        // The bench lays out its own block tables, one per sequence (and state slots).
        window_pools: false,
        state_slots: Some(max_batch),
        ..Default::default()
    };
    let mut engine = lmi_engine::open(a.m.device, &dir, &opts)?;
    let vocab = engine.model_config().vocab_size as u32;
    let (bw, what) = match a.m.device {
        Device::Cpu => (
            measure_read_bandwidth(),
            "memory read bandwidth".to_string(),
        ),
        Device::Cuda(ordinal) => {
            let c = lmi_engine::cuda::ceilings::measure(ordinal, copy_mib << 20, side)?;
            let what = format!(
                "device copy bandwidth (read + written; bf16 product rate {:.0} TFLOP/s)",
                c.bf16_flops / 1e12
            );
            (c.copy_bandwidth, what)
        }
    };
    let weight_bytes = engine.weight_bytes();
    let c = engine.model_config();
    let kv_elem = if dtype == Some(DType::F32) && a.m.device == Device::Cpu {
        4
    } else {
        2
    };
    // What the pools hold a token: K and V of every head, or a latent-attention layer's
    // record (the latent and the rotary key part).
    let kv_per_token = lmi_engine::kv::KvCacheConfig::block_bytes(c, kv_elem) / BLOCK_SIZE;
    // Linear-attention layers read their state once per sequence and step, whatever the
    // context (added to the weights as a per-sequence constant).
    let state_bytes = engine.state_config().map_or(0, |s| s.slot_bytes());
    // A decode step reads every weight once and every sequence's K/V (mean context).
    let context = a.prompt_len + a.decode_steps / 2;
    // A mixture of experts reads more experts for more tokens.
    let roofline = |b: usize, weights: usize| {
        (weights + b * (context * kv_per_token + 2 * state_bytes)) as f64 / bw
    };
    println!(
        "model {} on {} ({} weights, {:.1} MB held; {:.1} MB of weights and {:.1} KB of K/V per token of context read per decode step), {} host threads, {what} {:.2} GB/s",
        dir.display(),
        a.m.device,
        ModelArgs::dtype_name(dtype),
        engine.resident_weight_bytes() as f64 / 1e6,
        weight_bytes as f64 / 1e6,
        kv_per_token as f64 / 1e3,
        rayon::current_num_threads(),
        bw / 1e9
    );
    println!(
        "batch-1 decode roofline: {:.2} ms/token ({:.1} tok/s)\n",
        roofline(1, weight_bytes) * 1e3,
        1.0 / roofline(1, weight_bytes)
    );
    // Rates use the median step: on a shared machine a neighbour's burst lands on a few steps
    // and would otherwise decide the mean (printed beside it).
    println!(
        "| batch | prefill tok/s | decode step ms (median) | (mean) | decode tok/s | vs batch 1 | roofline ms | of roofline | decode products on |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut base = None;
    for &b in &batches {
        let limit = roofline(b, engine.step_weight_bytes(b));
        let mut chunks: Vec<SeqChunk> = (0..b)
            .map(|s| SeqChunk {
                tokens: (0..a.prompt_len)
                    .map(|i| ((s * 7919 + i * 104729) as u32) % vocab)
                    .collect(),
                start_pos: 0,
                block_table: ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect(),
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            })
            .collect();
        let t = Instant::now();
        greedy_step(engine.as_mut(), &chunks)?;
        let prefill = (b * a.prompt_len) as f64 / t.elapsed().as_secs_f64();
        let mut step = |chunks: &mut Vec<SeqChunk>| -> anyhow::Result<()> {
            for c in chunks.iter_mut() {
                c.start_pos += c.tokens.len();
                c.tokens = vec![(c.start_pos as u32 * 31) % vocab];
            }
            greedy_step(engine.as_mut(), chunks)?;
            Ok(())
        };
        step(&mut chunks)?; // warm-up
        let mut steps = Vec::with_capacity(a.decode_steps);
        for _ in 0..a.decode_steps.max(1) {
            let t = Instant::now();
            step(&mut chunks)?;
            steps.push(t.elapsed().as_secs_f64());
        }
        let mean = steps.iter().sum::<f64>() / steps.len() as f64;
        steps.sort_by(f64::total_cmp);
        let per_step = steps[steps.len() / 2];
        let tps = b as f64 / per_step;
        let base_tps = *base.get_or_insert(tps);
        println!(
            "| {b} | {prefill:.0} | {:.2} | {:.2} | {tps:.1} | {:.2}x | {:.2} | {:.0}% | {} |",
            per_step * 1e3,
            mean * 1e3,
            tps / base_tps,
            limit * 1e3,
            limit / per_step * 100.0,
            engine.product_kernel(b)
        );
    }
    Ok(())
}

/// One engine step that draws the next token of every chunk greedily (as serving does: the
/// step includes the draw). A model with recurrent layers keeps chunk `k`'s state in slot `k`.
fn greedy_step(engine: &mut dyn StepEngine, chunks: &[SeqChunk]) -> anyhow::Result<()> {
    let params = SamplingParams::default();
    let samples = SampleRequest::at_each_last_token(chunks, &params);
    let states: Vec<ChunkState> = match engine.state_config() {
        Some(_) => (0..chunks.len() as u32).map(ChunkState::in_slot).collect(),
        None => Vec::new(),
    };
    engine.step(&StepBatch {
        chunks,
        samples: &samples,
        prompt_logprobs: &[],
        media: &[],
        rope_deltas: &[],
        states: &states,
        pools: &[],
        mtp: &[],
    })?;
    Ok(())
}
