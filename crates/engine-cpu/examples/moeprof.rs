//! `cargo run --release -p lmi-engine-cpu --example moeprof -- ROWS [FORMAT] [SECONDS]`: a
//! Qwen3-MoE-shaped stack of mixture layers (hidden 1024, 64 experts of width 512, 8 per row,
//! 16 layers: past the caches, as at decode) run on `ROWS` random rows for a while; prints
//! ms per layer and the experts' weight bytes read per second. For `perf record` and for
//! comparing builds of the expert path without the rest of a step.
use std::time::Instant;

use lmi_checkpoint::quant::{QMatrix, QType};
use lmi_checkpoint::testing::lcg;
use lmi_checkpoint::weights::HostTensor;
use lmi_engine_core::Backend;
use lmi_engine_core::moe::{Expert, ExpertActivation, MoeLayer, Routing};
use lmi_engine_cpu::CpuBackend;

const HIDDEN: usize = 1024;
const EXPERTS: usize = 64;
const WIDTH: usize = 512;
const TOP_K: usize = 8;
const LAYERS: usize = 16;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let rows: usize = arg(0, "16").parse().expect("ROWS");
    let fmt = arg(1, "q4_k");
    let secs: f64 = arg(2, "5").parse().expect("SECONDS");
    let qt = QType::ALL
        .into_iter()
        .find(|q| q.name() == fmt)
        .expect("format");
    let be = CpuBackend::new();
    let mut seed = 1;
    let mut wseed = 7;
    let mut quant = |n: usize, k: usize| {
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut wseed) * 0.05).collect();
        let m = QMatrix::quantize(qt, n, k, &w).expect("quantize");
        be.upload_weight(HostTensor::quant(m)).expect("upload")
    };
    let mut layers = Vec::with_capacity(LAYERS);
    for _ in 0..LAYERS {
        let experts = (0..EXPERTS)
            .map(|_| Expert {
                gate_up: quant(2 * WIDTH, HIDDEN),
                down: quant(HIDDEN, WIDTH),
                gate_up_bias: None,
                down_bias: None,
            })
            .collect();
        let router: Vec<f32> = (0..EXPERTS * HIDDEN).map(|_| lcg(&mut seed)).collect();
        layers.push(MoeLayer {
            router: be
                .upload_weight(HostTensor::f32(vec![EXPERTS, HIDDEN], router))
                .expect("router"),
            router_bias: None,
            experts,
            top_k: TOP_K,
            width: WIDTH,
            routing: Routing::SoftmaxTopK { renormalize: true },
            activation: ExpertActivation::Silu,
            shared: None,
            correction_bias: None,
        });
    }
    let expert_bytes = be.weight_bytes(&layers[0].experts[0].gate_up)
        + be.weight_bytes(&layers[0].experts[0].down);
    // Each layer its own random rows, so that its routes spread as a batch's do.
    let xs: Vec<Vec<f32>> = (0..LAYERS)
        .map(|_| (0..rows * HIDDEN).map(|_| lcg(&mut seed)).collect())
        .collect();
    let mut hit = 0;
    for (layer, x) in layers.iter().zip(&xs) {
        let mut logits = vec![0f32; rows * EXPERTS];
        be.linear(x, rows, &layer.router, None, &mut logits)
            .expect("router");
        let routes = lmi_engine_core::moe::route(&logits, EXPERTS, TOP_K, layer.routing, None);
        let mut seen = [false; EXPERTS];
        routes.iter().for_each(|&(e, _)| seen[e as usize] = true);
        hit += seen.iter().filter(|&&s| s).count();
    }
    let mut out = vec![0f32; rows * HIDDEN];
    let mut calls = 0usize;
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        for (layer, x) in layers.iter().zip(&xs) {
            be.moe(x, rows, HIDDEN, layer, &(), &mut out).expect("moe");
        }
        calls += 1;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "{rows} rows {fmt}: {:.3} ms a layer, {:.1} experts hit a layer, {:.1} GB/s of expert weights",
        dt * 1e3 / (calls * LAYERS) as f64,
        hit as f64 / LAYERS as f64,
        (hit * expert_bytes) as f64 * calls as f64 / dt / 1e9
    );
}
