//! `cargo bench -p lmi-engine --bench qlinear`: one matrix product per weight format at
//! decode-sized and prefill-sized batches, in GMAC/s and weight GB/s, beside bf16, on the
//! process's quantized path (`LMI_CPU_NO_LANES=1`: the int8 kernels instead of the lanes).
//!
//! A matrix that fits in the last-level cache is read from there on every repetition, which
//! flatters batch 1. The Llama-1B-shaped rows are therefore also run "from memory": copies of
//! the matrix past twice the L3 size, used in turn, as a model's layers are at decode.

use std::time::Instant;

use lmi_checkpoint::quant::{QMatrix, QType};
use lmi_checkpoint::testing::lcg;
use lmi_checkpoint::weights::HostTensor;
use lmi_engine_core::Backend;
use lmi_engine_cpu::CpuBackend;

/// Seconds per repetition of `run(0..reps)`, the best of five rounds: this machine is shared
/// and noisy.
fn best_of_five(reps: usize, mut run: impl FnMut(usize)) -> f64 {
    (0..5)
        .map(|_| {
            let t0 = Instant::now();
            (0..reps).for_each(&mut run);
            t0.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Bytes of copies that the "from memory" rows cycle through: past twice any L3 we run on.
const COLD_BYTES: usize = 256 << 20;

fn main() {
    let be = CpuBackend::new();
    eprintln!(
        "quantized products on {} (one row), {} (64 rows)",
        be.quant_kernel(1),
        be.quant_kernel(64)
    );
    // (rows n, cols k, from memory): SmolLM2's MLP up/gate, down, its tied LM head; Llama-3.2-1B's
    // gate/up, from cache and from memory.
    let shapes = [
        (3072usize, 576usize, false),
        (3072, 576, true),
        (576, 1536, false),
        (576, 1536, true),
        (49152, 576, false),
        (16384, 2048, false),
        (16384, 2048, true),
        (1024, 1024, true),
    ];
    // Filter with `cargo bench --bench qlinear -- <text>`: rows whose label contains it.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut seed = 1;
    println!("| matrix | format | m | ms | GMAC/s | weight GB/s |");
    println!("|---|---|---:|---:|---:|---:|");
    for &(n, k, cold) in &shapes {
        let wf: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed) * 0.1).collect();
        let mut formats: Vec<(String, HostTensor)> = vec![(
            "bf16".into(),
            HostTensor::f32(vec![n, k], wf.clone()).to_dtype(lmi_checkpoint::DType::BF16),
        )];
        for qt in [
            QType::Q8_0,
            QType::Q4_0,
            QType::Q4_1,
            QType::Q4_K,
            QType::Q6_K,
            QType::MXFP4,
            QType::I8,
        ] {
            if k.is_multiple_of(qt.block()) {
                let m = QMatrix::quantize(qt, n, k, &wf).unwrap();
                formats.push((qt.name().into(), HostTensor::quant(m)));
            }
        }
        let label = format!("{n}x{k}{}", if cold { " (memory)" } else { "" });
        for (name, t) in formats {
            let row = format!("| {label} | {name} |");
            if filter.as_ref().is_some_and(|f| !row.contains(f.as_str())) {
                continue;
            }
            let first = be.upload_weight(t.clone()).unwrap();
            let bytes = be.weight_bytes(&first);
            let copies = if cold {
                COLD_BYTES.div_ceil(bytes).max(2)
            } else {
                1
            };
            let mut ws = vec![first];
            for _ in 1..copies {
                ws.push(be.upload_weight(t.clone()).unwrap());
            }
            // 2 and 4 rows: a mixture's experts at 16 decode streams (about two rows each).
            for m in [1usize, 2, 3, 4, 8, 16, 32, 64] {
                let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
                let mut out = vec![0f32; m * n];
                for w in &ws {
                    be.linear(&x, m, w, None, &mut out).unwrap();
                }
                let reps = (1e9 / (m * n * k) as f64).clamp(2.0, 100.0) as usize;
                let reps = reps.div_ceil(copies) * copies;
                let s = best_of_five(reps, |r| {
                    be.linear(&x, m, &ws[r % copies], None, &mut out).unwrap();
                });
                println!(
                    "{row} {m} | {:.3} | {:.1} | {:.1} |",
                    s * 1e3,
                    (m * n * k) as f64 / s / 1e9,
                    bytes as f64 / s / 1e9
                );
            }
        }
    }
}
