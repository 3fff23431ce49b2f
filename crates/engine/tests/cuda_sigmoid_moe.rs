//! DeepSeek-style sigmoid routing on the CUDA backend (kernels/moe.cu's `moe_route_sigmoid`,
//! and `MOE_ONE` for ungated shared experts), on the CPU emulator in both thread orders and on
//! the driver's device (or the fake driver):
//! - the op against the CPU backend's on random layers: the correction bias, the group limit,
//!   renormalized or not, the routed scaling, an ungated shared expert; one row, more rows
//!   than a tile, on CUDA cores and on tensor cores; f32 and bf16 inputs;
//! - batch invariance: each row's output bit-identical alone and in the whole step;
//! - the `glm4_moe` fixture (`tests/fixtures/sigmoid_moe/`) in bf16 against transformers' f32
//!   logits: the prompt, then 32 decode steps replayed from CUDA graphs;
//! - MiniMax-M2 likewise (its whole-projection q/k norms through `span_rms_norm`).

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use cuda_common::{assert_close, bf16_round, cpu, random, to_host};
use hf_fixture::{blocks, chunk, reference, rel_diff, sequence_logits};
use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::{Device, DeviceExt};
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::moe::{Expert, ExpertActivation, MoeLayer, Routing, SharedExpert};
use lmi_engine::{Backend, DType, Engine, LogitsWanted};

struct Case {
    experts: usize,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
    renormalize: bool,
    scaling: f32,
    hidden: usize,
    width: usize,
    rows: usize,
    x_bf16: bool,
    /// An ungated shared expert's width, 0 for none.
    shared: usize,
}

/// The first two on CUDA cores (sizes not multiples of 16), the others on tensor cores.
const CASES: [Case; 4] = [
    Case {
        experts: 8,
        top_k: 2,
        n_group: 4,
        topk_group: 2,
        renormalize: true,
        scaling: 2.5,
        hidden: 48,
        width: 24,
        rows: 1,
        x_bf16: false,
        shared: 24,
    },
    Case {
        experts: 8,
        top_k: 2,
        n_group: 4,
        topk_group: 2,
        renormalize: true,
        scaling: 2.5,
        hidden: 48,
        width: 24,
        rows: 23,
        x_bf16: true,
        shared: 24,
    },
    Case {
        experts: 64,
        top_k: 6,
        n_group: 8,
        topk_group: 3,
        renormalize: false,
        scaling: 1.0,
        hidden: 64,
        width: 32,
        rows: 41,
        x_bf16: false,
        shared: 0,
    },
    Case {
        experts: 16,
        top_k: 3,
        n_group: 1,
        topk_group: 1,
        renormalize: true,
        scaling: 1.0,
        hidden: 64,
        width: 32,
        rows: 19,
        x_bf16: true,
        shared: 64,
    },
];

/// The case's layer on `b`: bf16-exact weights, so both backends hold the same values.
fn layer<B: Backend>(b: &B, c: &Case, seed: u64) -> MoeLayer<B::Weight> {
    let (h, w) = (c.hidden, c.width);
    let matrix = |rows: usize, cols: usize, seed: u64, scale: f32| {
        let v = bf16_round(&random(rows * cols, seed, scale));
        b.upload_weight(HostTensor::f32(vec![rows, cols], v).to_dtype(DType::BF16))
            .unwrap()
    };
    let router = random(c.experts * h, seed, 1.0 / (h as f32).sqrt() * 4.0);
    let bias = random(c.experts, seed + 1, 0.2);
    MoeLayer {
        router: b
            .upload_router(HostTensor::f32(vec![c.experts, h], router))
            .unwrap(),
        router_bias: None,
        experts: (0..c.experts as u64)
            .map(|e| Expert {
                gate_up: matrix(2 * w, h, seed + 10 + 4 * e, 2.0 / (h as f32).sqrt()),
                down: matrix(h, w, seed + 11 + 4 * e, 2.0 / (w as f32).sqrt()),
                gate_up_bias: None,
                down_bias: None,
            })
            .collect(),
        top_k: c.top_k,
        width: w,
        routing: Routing::SigmoidGroupedTopK {
            n_group: c.n_group,
            topk_group: c.topk_group,
            renormalize: c.renormalize,
            scaling: c.scaling,
        },
        activation: ExpertActivation::Silu,
        shared: (c.shared > 0).then(|| SharedExpert {
            gate_up: matrix(2 * c.shared, h, seed + 3, 2.0 / (h as f32).sqrt()),
            down: matrix(h, c.shared, seed + 4, 2.0 / (c.shared as f32).sqrt()),
            gate: None,
            width: c.shared,
        }),
        correction_bias: Some(
            b.upload_weight(HostTensor::f32(vec![c.experts], bias))
                .unwrap(),
        ),
    }
}

/// `x` on the device, as f32 or (exactly, its values being bf16) as bf16.
fn upload_x<D: Device>(g: &CudaBackend<D>, x: &[f32], bf16: bool) -> lmi_engine::cuda::CudaBuf {
    if !bf16 {
        return g.upload_f32(x).unwrap();
    }
    let buf = g.alloc_matmul_input(x.len()).unwrap();
    let bits: Vec<u16> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    g.device().htod_slice(&bits, buf.ptr).unwrap();
    buf
}

fn check_sigmoid_moe_op<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    for (i, case) in CASES.iter().enumerate() {
        let what = format!(
            "sigmoid mixture {i} ({} experts in {} groups, top {}, [{} -> {}], {} rows)",
            case.experts, case.n_group, case.top_k, case.hidden, case.width, case.rows
        );
        let seed = 300 + 100 * i as u64;
        let (cl, gl) = (layer(&c, case, seed), layer(g, case, seed));
        let gi = g.index_experts(&gl).unwrap();
        assert_eq!(gi.tensor_cores(), i >= 2, "{what}: which kernels");
        let h = case.hidden;
        let x = bf16_round(&random(case.rows * h, seed + 7, 2.0));

        let mut want = c.alloc(case.rows * h).unwrap();
        c.moe(&x, case.rows, h, &cl, &(), &mut want).unwrap();
        let run = |x: &[f32], rows: usize| {
            let gx = upload_x(g, x, case.x_bf16);
            let mut out = g.alloc(rows * h).unwrap();
            g.moe(&gx, rows, h, &gl, &gi, &mut out).unwrap();
            to_host(g, &out)
        };
        let all = run(&x, case.rows);
        // The device rounds the activations to bf16 before the down projection.
        assert_close(&what, &all, &want, 2e-2, 2e-2);
        for r in 0..case.rows {
            let alone = run(&x[r * h..(r + 1) * h], 1);
            assert_eq!(alone, all[r * h..(r + 1) * h], "{what}: row {r} alone");
        }
    }
}

#[test]
fn sigmoid_routing_matches_the_cpu_and_is_batch_invariant() {
    on_every_device!(check_sigmoid_moe_op);
}

/// bf16 against transformers' f32 with routing: the device's router reads the bf16-rounded
/// hidden state (the CPU's reads f32), which moves sigmoid scores by ~1e-4 to 1e-3, as much
/// as this fixture's routing margins (4.5e-4): a token's experts flip, and its K/V then move
/// every later position of the next layer. Measured on the emulator: median 3.5e-2, 2 of 31
/// greedy tokens; a wrong weight, group or bias would move every position by the logits' own
/// size (1), which [`glm4_moe_layers_match_the_cpu_without_routing_choices`] pins down.
const ROUTED_MEDIAN_TOL: f32 = 1e-1;

fn check_glm<D: Device>(dev: &Arc<D>) {
    let dir = hf_fixture::fixture("sigmoid_moe", "glm4_moe");
    let r = reference(&dir);
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(64),
        ..Default::default()
    };
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let mut e = Engine::load(backend, &dir, &opts).unwrap();
    let mut ours = sequence_logits(&mut e, &r.prompt);
    let table = blocks(3, r.prompt.len() + r.greedy.len());
    e.forward_logits(&[chunk(&r.prompt, 0, &table, LogitsWanted::None)])
        .unwrap();
    let mut wrong_tokens = 0;
    for (step, &tok) in r.greedy.iter().enumerate() {
        let pos = r.prompt.len() + step;
        let out = e
            .forward_logits(&[chunk(&[tok], pos, &table, LogitsWanted::Last)])
            .unwrap();
        if let Some(&next) = r.greedy.get(step + 1) {
            wrong_tokens += usize::from(lmi_checkpoint::testing::argmax(out.row(0)) != next);
        }
        ours.push(out.row(0).to_vec());
    }
    assert!(
        e.backend().graphs_captured() > 0,
        "decode steps replay from graphs"
    );
    let mut diffs: Vec<f32> = ours
        .iter()
        .zip(&r.full_logits)
        .map(|(ours, theirs)| rel_diff(ours, theirs))
        .collect();
    diffs.sort_by(f32::total_cmp);
    let median = diffs[diffs.len() / 2];
    eprintln!(
        "glm4_moe: CUDA bf16 logits: median difference {median:.2e} from transformers' f32; \
         greedy tokens differing: {wrong_tokens}"
    );
    assert!(median < ROUTED_MEDIAN_TOL, "median difference {median}");
    assert!(
        wrong_tokens <= r.greedy.len() / 8,
        "{wrong_tokens} greedy tokens differ"
    );
}

/// The fixture with every expert picked by every token (`num_experts_per_tok` 8, no group
/// limit: no choice left to flip) in bf16 on the device and on the CPU (whose f32 run of the
/// fixture equals transformers'): every prompt position within bf16's error (measured 1e-3
/// to 4.4e-3 on the emulator). The partial RoPE, q/k/v biases, q/k norms, renormalized and
/// scaled weights and the ungated shared expert all run here.
fn check_glm_without_choices<D: Device>(dev: &Arc<D>) {
    let dir = hf_fixture::fixture("sigmoid_moe", "glm4_moe");
    let r = reference(&dir);
    let tmp = hf_fixture::with_config(&dir, |c| {
        c["num_experts_per_tok"] = 8.into();
        c["n_group"] = 1.into();
        c["topk_group"] = 1.into();
    });
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(64),
        ..Default::default()
    };
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let mut e = Engine::load(backend, tmp.path(), &opts).unwrap();
    let ours = sequence_logits(&mut e, &r.prompt);
    let mut c = lmi_engine::load_cpu(tmp.path(), &opts).unwrap();
    let cpu = sequence_logits(&mut c, &r.prompt);
    for (t, (a, b)) in ours.iter().zip(&cpu).enumerate() {
        let d = rel_diff(a, b);
        assert!(d < 1e-2, "position {t}: {d} from the CPU's bf16 logits");
    }
}

#[test]
fn glm4_moe_layers_match_the_cpu_without_routing_choices() {
    on_every_raw_device!(check_glm_without_choices);
}

#[test]
fn glm4_moe_in_bf16_matches_transformers() {
    on_every_raw_device!(check_glm);
}

/// MiniMax-M2 (whole-projection q/k norms through `span_rms_norm`, `rotary_dim`, every layer
/// sparse) with every expert picked, in bf16 on the device and on the CPU: every prompt
/// position within bf16's error.
fn check_minimax_without_choices<D: Device>(dev: &Arc<D>) {
    let dir = hf_fixture::fixture("sigmoid_moe", "minimax_m2");
    let r = reference(&dir);
    let tmp = hf_fixture::with_config(&dir, |c| c["num_experts_per_tok"] = 8.into());
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(64),
        ..Default::default()
    };
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let mut e = Engine::load(backend, tmp.path(), &opts).unwrap();
    let ours = sequence_logits(&mut e, &r.prompt);
    let mut c = lmi_engine::load_cpu(tmp.path(), &opts).unwrap();
    let cpu = sequence_logits(&mut c, &r.prompt);
    for (t, (a, b)) in ours.iter().zip(&cpu).enumerate() {
        let d = rel_diff(a, b);
        assert!(d < 1e-2, "position {t}: {d} from the CPU's bf16 logits");
    }
}

#[test]
fn minimax_m2_layers_match_the_cpu_without_routing_choices() {
    on_every_raw_device!(check_minimax_without_choices);
}

/// MiniMax-M2 as published on the device in bf16 against transformers' f32 logits, with the
/// routed fixture's allowance ([`ROUTED_MEDIAN_TOL`]).
fn check_minimax<D: Device>(dev: &Arc<D>) {
    let dir = hf_fixture::fixture("sigmoid_moe", "minimax_m2");
    let r = reference(&dir);
    let opts = EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(64),
        ..Default::default()
    };
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let mut e = Engine::load(backend, &dir, &opts).unwrap();
    let ours = sequence_logits(&mut e, &r.sequence());
    let mut diffs: Vec<f32> = ours
        .iter()
        .zip(&r.full_logits)
        .map(|(ours, theirs)| rel_diff(ours, theirs))
        .collect();
    diffs.sort_by(f32::total_cmp);
    let median = diffs[diffs.len() / 2];
    eprintln!("minimax_m2: CUDA bf16 logits: median difference {median:.2e} from transformers'");
    assert!(median < ROUTED_MEDIAN_TOL, "median difference {median}");
}

#[test]
fn minimax_m2_in_bf16_matches_transformers() {
    on_every_raw_device!(check_minimax);
}
