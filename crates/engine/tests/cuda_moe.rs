//! Mixture-of-experts layers on the CUDA backend (kernels/moe.cu), on the CPU emulator in both
//! thread orders and on the driver's device (or the fake driver):
//! - the op against the CPU backend's on random layers: Qwen3-MoE's routing (softmax, top-k,
//!   renormalized) and gpt-oss's (top-k then softmax, router and expert biases, clamped
//!   SwiGLU), Qwen2-MoE's shared expert; steps of one row, of more rows than a tile, and with
//!   K over two chunks; f32 and bf16 inputs;
//! - batch invariance: each row's output bit-identical alone and in the whole step;
//! - every fixture of `tests/fixtures/moe/` (Qwen3-MoE, with a dense layer, Mixtral, gpt-oss
//!   with its sinks, windows and YaRN, and its MXFP4 experts) in bf16 against transformers'
//!   f32 logits: the prompt, then 32 decode steps replayed from CUDA graphs.

mod cuda_common;
mod hf_fixture;

use std::sync::Arc;

use cuda_common::{assert_close, bf16_round, cpu, random, to_host};
use hf_fixture::{BF16_TOL, blocks, chunk, reference, rel_diff, sequence_logits};
use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::{Device, DeviceExt};
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::EngineOptions;
use lmi_engine::moe::{Expert, ExpertActivation, MoeLayer, Routing, SharedExpert};
use lmi_engine::{Backend, DType, Engine, LogitsWanted};

struct Case {
    experts: usize,
    top_k: usize,
    hidden: usize,
    width: usize,
    rows: usize,
    gpt_oss: bool,
    x_bf16: bool,
    /// A shared expert's width (Qwen2-MoE), 0 for none.
    shared: usize,
}

/// The first four run on CUDA cores (a size not a multiple of 16), the others on tensor cores.
const CASES: [Case; 8] = [
    // One decode row; then more rows than a tile (8), so busy experts take two tiles.
    Case {
        experts: 6,
        top_k: 2,
        hidden: 48,
        width: 24,
        rows: 1,
        gpt_oss: false,
        x_bf16: false,
        shared: 0,
    },
    Case {
        experts: 6,
        top_k: 2,
        hidden: 48,
        width: 24,
        rows: 23,
        gpt_oss: false,
        x_bf16: true,
        shared: 40,
    },
    Case {
        experts: 8,
        top_k: 3,
        hidden: 40,
        width: 16,
        rows: 19,
        gpt_oss: true,
        x_bf16: true,
        shared: 0,
    },
    // K past one 2048-wide chunk in both products.
    Case {
        experts: 4,
        top_k: 2,
        hidden: 2056,
        width: 2056,
        rows: 5,
        gpt_oss: true,
        x_bf16: false,
        shared: 0,
    },
    // Tensor cores: one row; more rows than a tile (16); gpt-oss's routing; K over three
    // 256-wide chunks in both products.
    Case {
        experts: 6,
        top_k: 2,
        hidden: 64,
        width: 32,
        rows: 1,
        gpt_oss: false,
        x_bf16: true,
        shared: 0,
    },
    Case {
        experts: 6,
        top_k: 2,
        hidden: 64,
        width: 32,
        rows: 41,
        gpt_oss: false,
        x_bf16: false,
        shared: 48,
    },
    Case {
        experts: 8,
        top_k: 3,
        hidden: 48,
        width: 16,
        rows: 23,
        gpt_oss: true,
        x_bf16: true,
        shared: 0,
    },
    Case {
        experts: 4,
        top_k: 2,
        hidden: 528,
        width: 560,
        rows: 5,
        gpt_oss: true,
        x_bf16: false,
        shared: 0,
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
    let vector = |len: usize, seed: u64| {
        c.gpt_oss.then(|| {
            b.upload_weight(HostTensor::f32(vec![len], random(len, seed, 0.5)))
                .unwrap()
        })
    };
    let router = random(c.experts * h, seed, 1.0 / (h as f32).sqrt() * 4.0);
    MoeLayer {
        router: b
            .upload_router(HostTensor::f32(vec![c.experts, h], router))
            .unwrap(),
        router_bias: vector(c.experts, seed + 1),
        experts: (0..c.experts as u64)
            .map(|e| Expert {
                gate_up: matrix(2 * w, h, seed + 10 + 4 * e, 2.0 / (h as f32).sqrt()),
                down: matrix(h, w, seed + 11 + 4 * e, 2.0 / (w as f32).sqrt()),
                gate_up_bias: vector(2 * w, seed + 12 + 4 * e),
                down_bias: vector(h, seed + 13 + 4 * e),
            })
            .collect(),
        top_k: c.top_k,
        width: w,
        routing: if c.gpt_oss {
            Routing::TopKSoftmax
        } else {
            Routing::SoftmaxTopK { renormalize: true }
        },
        activation: if c.gpt_oss {
            ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: 7.0,
            }
        } else {
            ExpertActivation::Silu
        },
        shared: (c.shared > 0).then(|| {
            let sw = c.shared;
            SharedExpert {
                gate_up: matrix(2 * sw, h, seed + 3, 2.0 / (h as f32).sqrt()),
                down: matrix(h, sw, seed + 4, 2.0 / (sw as f32).sqrt()),
                gate: Some(
                    b.upload_router(HostTensor::f32(vec![1, h], random(h, seed + 5, 0.3)))
                        .unwrap(),
                ),
                width: sw,
            }
        }),
        correction_bias: None,
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

fn check_moe_op<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    for (i, case) in CASES.iter().enumerate() {
        let what = format!(
            "mixture {i} ({} experts, top {}, [{} -> {}], {} rows)",
            case.experts, case.top_k, case.hidden, case.width, case.rows
        );
        let seed = 100 * i as u64;
        let (cl, gl) = (layer(&c, case, seed), layer(g, case, seed));
        let gi = g.index_experts(&gl).unwrap();
        assert_eq!(gi.tensor_cores(), i >= 4, "{what}: which kernels");
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
        // The CPU keeps the activations in f32; the device rounds them to bf16 before the
        // down projection, as its dense MLP does.
        assert_close(&what, &all, &want, 2e-2, 2e-2);

        for r in 0..case.rows {
            let alone = run(&x[r * h..(r + 1) * h], 1);
            assert_eq!(alone, all[r * h..(r + 1) * h], "{what}: row {r} alone");
        }
    }
}

#[test]
fn mixture_of_experts_op_matches_the_cpu_and_is_batch_invariant() {
    on_every_device!(check_moe_op);
}

/// `qwen3_moe_mixed` has a dense layer among its sparse ones; `qwen2_moe` a shared expert;
/// `gpt_oss` brings top-k-then-
/// softmax routing, expert and router biases, clamped SwiGLU, attention sinks, a window on
/// alternate layers and YaRN; `gpt_oss_mxfp4` its experts as published (MXFP4, dequantized
/// at load).
const FIXTURES: [&str; 6] = [
    "qwen3_moe",
    "qwen3_moe_mixed",
    "qwen2_moe",
    "mixtral",
    "gpt_oss",
    "gpt_oss_mxfp4",
];
/// bf16 against f32: the median position within `BF16_TOL`, and at most one position in
/// eight beyond this bound (nor its greedy token different). bf16 rounding upstream of a
/// router flips a token between two experts whose logits are close, and such a flip moves
/// the logits by far more than rounding does: transformers itself in bf16 moves `gpt_oss`'s
/// positions 4, 9, 31, 36, 37, 40 and 42 by 0.05 to 0.55 (`tests/fixtures/moe/bf16_flips.py`;
/// we move 4, 36, 37 and 40), and
/// `qwen3_moe`'s position 41 moves by 0.15 on the CPU in bf16 as here. A wrong expert,
/// weight, activation or sink would move every position.
const BF16_FLIP_TOL: f32 = 1e-1;

fn check_fixtures<D: Device>(dev: &Arc<D>) {
    for name in FIXTURES {
        let dir = hf_fixture::fixture("moe", name);
        let r = reference(&dir);
        let opts = EngineOptions {
            dtype: Some(DType::BF16),
            kv_blocks: Some(64),
            ..Default::default()
        };
        let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
        let mut e = Engine::load(backend, &dir, &opts).unwrap();
        let mut ours = sequence_logits(&mut e, &r.prompt);
        // Then decode, one token a step, each fed transformers' greedy token.
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
            "{name}: decode steps replay from graphs"
        );

        let mut diffs: Vec<f32> = ours
            .iter()
            .zip(&r.full_logits)
            .map(|(ours, theirs)| rel_diff(ours, theirs))
            .collect();
        let flips: Vec<usize> = (0..diffs.len())
            .filter(|&p| diffs[p] > BF16_FLIP_TOL)
            .collect();
        diffs.sort_by(f32::total_cmp);
        let median = diffs[diffs.len() / 2];
        eprintln!(
            "{name}: CUDA bf16 logits: median difference {median:.2e} from transformers' f32; \
             positions beyond {BF16_FLIP_TOL}: {flips:?}; greedy tokens differing: {wrong_tokens}"
        );
        assert!(median < BF16_TOL, "{name}: median difference {median}");
        let allowed = diffs.len() / 8;
        assert!(
            flips.len() <= allowed,
            "{name}: positions {flips:?} differ by more than {BF16_FLIP_TOL}"
        );
        assert!(
            wrong_tokens <= allowed,
            "{name}: {wrong_tokens} greedy tokens differ"
        );
    }
}

#[test]
fn mixture_of_experts_fixtures_in_bf16_match_transformers() {
    on_every_raw_device!(check_fixtures);
}
