//! `cargo run --release -p lmi-engine-cpu --example qprof -- N K FORMAT M SECONDS`: one matrix
//! product repeated for a while, for `perf record` (the bench spends most samples building).
use std::time::Instant;

use lmi_checkpoint::quant::{QMatrix, QType};
use lmi_checkpoint::testing::lcg;
use lmi_checkpoint::weights::HostTensor;
use lmi_engine_core::Backend;
use lmi_engine_cpu::CpuBackend;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let n: usize = arg(0, "3072").parse().expect("N");
    let k: usize = arg(1, "576").parse().expect("K");
    let fmt = arg(2, "q4_1");
    let m: usize = arg(3, "64").parse().expect("M");
    let secs: f64 = arg(4, "5").parse().expect("SECONDS");
    let mut seed = 1;
    let wf: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed) * 0.1).collect();
    let t = if fmt == "bf16" {
        HostTensor::f32(vec![n, k], wf).to_dtype(lmi_checkpoint::DType::BF16)
    } else {
        let qt = QType::ALL
            .into_iter()
            .find(|q| q.name() == fmt)
            .expect("format");
        HostTensor::quant(QMatrix::quantize(qt, n, k, &wf).expect("quantize"))
    };
    let be = CpuBackend::new();
    let w = be.upload_weight(t).expect("upload");
    let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
    let mut out = vec![0f32; m * n];
    let t0 = Instant::now();
    let mut reps = 0;
    while t0.elapsed().as_secs_f64() < secs {
        be.linear(&x, m, &w, None, &mut out).expect("linear");
        reps += 1;
    }
    println!(
        "{n}x{k} {fmt} m={m}: {:.4} ms",
        t0.elapsed().as_secs_f64() * 1e3 / reps as f64
    );
}
