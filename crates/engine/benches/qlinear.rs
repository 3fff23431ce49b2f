//! `cargo bench -p lmi-engine --bench qlinear`: one matrix product per weight format at
//! decode-sized and prefill-sized batches, in GMAC/s and weight GB/s, beside bf16.

use std::time::Instant;

use lmi_engine::Backend;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::quant::{QMatrix, QType};
use lmi_engine::weights::HostTensor;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

fn main() {
    let be = CpuBackend::new();
    // (rows n, cols k): SmolLM2's MLP up/gate, its tied LM head; Llama-3.2-1B's gate/up.
    let shapes = [(3072usize, 576usize), (49152, 576), (16384, 2048)];
    let mut seed = 1;
    println!("| matrix | format | m | ms | GMAC/s | weight GB/s |");
    println!("|---|---|---:|---:|---:|---:|");
    for &(n, k) in &shapes {
        let wf: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed) * 0.1).collect();
        let mut formats: Vec<(String, HostTensor)> = vec![(
            "bf16".into(),
            HostTensor::f32(vec![n, k], wf.clone()).to_dtype(lmi_engine::DType::BF16),
        )];
        for qt in [
            QType::Q8_0,
            QType::Q4_0,
            QType::Q4_1,
            QType::Q4_K,
            QType::Q6_K,
            QType::I8,
        ] {
            if k.is_multiple_of(qt.block()) {
                let m = QMatrix::quantize(qt, n, k, &wf).unwrap();
                formats.push((qt.name().into(), HostTensor::quant(m)));
            }
        }
        for (name, t) in formats {
            let w = be.upload_weight(t).unwrap();
            let bytes = be.weight_bytes(&w);
            for m in [1usize, 16, 64] {
                let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
                let mut out = vec![0f32; m * n];
                be.linear(&x, m, &w, None, &mut out).unwrap();
                let reps = (2e9 / (m * n * k) as f64).clamp(3.0, 200.0) as usize;
                let t0 = Instant::now();
                for _ in 0..reps {
                    be.linear(&x, m, &w, None, &mut out).unwrap();
                }
                let s = t0.elapsed().as_secs_f64() / reps as f64;
                println!(
                    "| {n}x{k} | {name} | {m} | {:.3} | {:.1} | {:.1} |",
                    s * 1e3,
                    (m * n * k) as f64 / s / 1e9,
                    bytes as f64 / s / 1e9
                );
            }
        }
    }
}
