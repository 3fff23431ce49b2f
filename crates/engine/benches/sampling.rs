//! `cargo bench -p lmi-engine --bench sampling`: a decode step's host sampling of 64 rows of the
//! default model's vocabulary (49152), greedy and at temperature 0.7, with the sampled token's
//! logprob wanted and without (`SamplingParams::logprob`: the row's log-normalizer skipped).

use std::time::Instant;

use lmi_engine::sampling::{SamplingParams, SequenceContext, sample_batch};

const ROWS: usize = 64;
const VOCAB: usize = 49152;
const REPS: usize = 50;

fn main() {
    let mut seed = 7u64;
    let logits: Vec<f32> = (0..ROWS * VOCAB)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 20.0
        })
        .collect();
    println!("| sampling | logprob | ms per step of {ROWS} rows | vs with logprob |");
    println!("|---|---|---:|---:|");
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
                let mut buf = logits.clone();
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
            println!(
                "| {kind} | {} | {best:.3} | {:.2}x |",
                if logprob { "wanted" } else { "not wanted" },
                with_ms / best
            );
        }
    }
}
