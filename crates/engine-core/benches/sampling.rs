//! `cargo bench -p lmi-engine --bench sampling`: a decode step's host sampling of 64 rows of the
//! default model's vocabulary (49152), greedy and at temperature 0.7, with the sampled token's
//! logprob wanted and without (`SamplingParams::logprob`: the row's log-normalizer skipped).
//! Two kinds of rows: flat (uniform in [-10, 10): the worst case for the draw, whose mass is
//! spread over half the vocabulary) and peaked (a bell of width about 2 with 20 tokens 8 to 12
//! above it, closer to a language model's).

use std::time::Instant;

use lmi_engine_core::sampling::{SamplingParams, SequenceContext, sample_batch};

const ROWS: usize = 64;
const VOCAB: usize = 49152;
const REPS: usize = 50;

fn main() {
    let mut seed = 7u64;
    let mut uniform = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 40) as f32 / (1u64 << 24) as f32
    };
    let flat: Vec<f32> = (0..ROWS * VOCAB)
        .map(|_| (uniform() - 0.5) * 20.0)
        .collect();
    let mut peaked: Vec<f32> = (0..ROWS * VOCAB)
        .map(|_| (0..4).map(|_| uniform() - 0.5).sum::<f32>() * 3.5)
        .collect();
    for row in peaked.chunks_mut(VOCAB) {
        for j in 0..20 {
            let at = (uniform() * VOCAB as f32) as usize % VOCAB;
            row[at] = 8.0 + j as f32 * 0.2;
        }
    }
    println!("| rows | sampling | logprob | ms per step of {ROWS} rows | vs with logprob |");
    println!("|---|---|---|---:|---:|");
    for (kind, logits) in [("flat", &flat), ("peaked", &peaked)] {
        run(kind, logits);
    }
}

fn run(rows_kind: &str, logits: &[f32]) {
    for temperature in [0.0f32, 0.7] {
        let mut with_ms = 0.0;
        for logprob in [true, false] {
            let params = SamplingParams {
                temperature,
                logprob,
                seed: 3,
                ..SamplingParams::default()
            };
            let rows: Vec<(&SamplingParams, SequenceContext)> = (0..ROWS)
                .map(|_| (&params, SequenceContext::default()))
                .collect();
            let mut best = f64::INFINITY;
            for _ in 0..REPS {
                let mut buf = logits.to_vec();
                let t = Instant::now();
                std::hint::black_box(sample_batch(&mut buf, VOCAB, &rows));
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            if logprob {
                with_ms = best;
            }
            let kind = if temperature == 0.0 {
                "greedy"
            } else {
                "T 0.7"
            };
            let wanted = if logprob { "wanted" } else { "not wanted" };
            println!(
                "| {rows_kind} | {kind} | {wanted} | {best:.3} | {:.2}x |",
                with_ms / best
            );
        }
    }
}
