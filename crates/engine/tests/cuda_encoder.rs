//! Encoders (BERT, XLM-RoBERTa) on the CUDA engine (bf16) for the fixtures of
//! `tests/fixtures/embed/`, on the CPU emulator in both thread orders and on the driver's
//! device (a GPU, or the fake driver): every input of a fixture in one ragged step, pooled,
//! - against sentence-transformers' / transformers' f32 outputs in the fixture's
//!   `reference.json` (embeddings by cosine, a cross-encoder's logits by their difference),
//!   judged as the CPU engine in bf16 is judged, and against that CPU engine;
//! - each input run alone gives its row of the batch (bit for bit where the products are
//!   batch invariant: the emulator and the fake driver; on a GPU within bf16 rounding).
//!
//! The fixtures are tiny (hidden 32, four heads of 8, two layers), so this checks the ops'
//! wiring and numerics in a whole model; `cuda_encoder_ops.rs` checks each op at real sizes.

mod cuda_common;
mod pool_common;

use std::sync::Arc;

use lmi_cuda::Device;
use lmi_engine::DType;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::encoder::EncoderEngine;
use lmi_engine::engine::EngineOptions;
use pool_common::{Input, cosine, fixture, floats, ids, pool_batch, reference};

/// Embedders (pooled vectors) and cross-encoders (logits), BERT and XLM-RoBERTa each.
const EMBEDDERS: [&str; 3] = ["bert_mean", "bert_cls_dense", "xlmr_cls"];
const CROSS_ENCODERS: [&str; 2] = ["bert_cross", "xlmr_rerank"];
/// How far a bf16 model's output may be from another's: an embedding's cosine to it at
/// least `1 − cosine`, a cross-encoder's logits within `logit` of it relative to
/// max(1, |logit|).
struct Tol {
    cosine: f64,
    logit: f32,
}
/// bf16 against the reference's f32 (seen on the emulator, and for the CPU engine in bf16:
/// 1.8e-5 and 3.2e-3).
const REFERENCE: Tol = Tol {
    cosine: 1e-4,
    logit: 1e-2,
};
/// The device against the CPU engine in bf16: both round at the same places and differ by
/// summation order (seen on the emulator: 7.5e-7 and 3e-7).
const CPU: Tol = Tol {
    cosine: 1e-5,
    logit: 2e-3,
};

/// A fixture's inputs (ids, and a pair's second segment) and the reference's outputs (an
/// embedding, or a cross-encoder's logits).
fn inputs(name: &str) -> (Vec<Input>, Vec<Vec<f32>>) {
    let r = reference(name);
    if let Some(items) = r["inputs"].as_array() {
        return items
            .iter()
            .map(|i| (Input::text(ids(&i["ids"])), floats(&i["embedding"])))
            .unzip();
    }
    r["pairs"]
        .as_array()
        .expect("inputs or pairs")
        .iter()
        .map(|p| {
            let input = Input::pair(ids(&p["ids"]), &ids(&p["type_ids"]));
            (input, floats(&p["logits"]))
        })
        .unzip()
}

fn options() -> EngineOptions {
    EngineOptions {
        dtype: Some(DType::BF16),
        kv_blocks: Some(64),
        ..Default::default()
    }
}

/// The largest logit difference relative to max(1, |logit|).
fn logit_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "logit counts");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// Asserts `got` is within `tol` of `want`.
#[track_caller]
fn assert_agrees(what: &str, embedding: bool, got: &[f32], want: &[f32], tol: &Tol) {
    if embedding {
        let c = cosine(got, want);
        assert!(c >= 1.0 - tol.cosine, "{what}: cosine {c}");
    } else {
        let d = logit_diff(got, want);
        assert!(d <= tol.logit, "{what}: logits {got:?}, expected {want:?}");
    }
}

fn check_fixture<D: Device>(dev: &Arc<D>, name: &str, cpu: &[Vec<f32>]) {
    let embedding = EMBEDDERS.contains(&name);
    let (inputs, want) = inputs(name);
    let backend = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let mut e = EncoderEngine::load(backend, &fixture(name), &options()).unwrap();
    let got = pool_batch(&mut e, &inputs);
    for (i, (g, input)) in got.iter().zip(&inputs).enumerate() {
        let what = format!("{name} input {i} ({} tokens)", input.ids.len());
        let against = |whom: &str| format!("{what} against the {whom}");
        assert_agrees(&against("reference"), embedding, g, &want[i], &REFERENCE);
        assert_agrees(&against("CPU"), embedding, g, &cpu[i], &CPU);
    }
    let exact = dev.info().emulated || cuda_common::on_fake_driver();
    for (i, input) in inputs.iter().enumerate() {
        let alone = pool_batch(&mut e, std::slice::from_ref(input));
        let what = format!("{name} input {i} alone");
        match exact {
            true => assert_eq!(alone[0], got[i], "{what}: the bits of the batch"),
            false => assert_agrees(&what, embedding, &alone[0], &got[i], &CPU),
        }
    }
}

/// The CPU engine's outputs in bf16, checked against the reference as the device's are.
fn cpu_outputs(name: &str) -> Vec<Vec<f32>> {
    let (inputs, want) = inputs(name);
    let mut e = EncoderEngine::load(CpuBackend::new(), &fixture(name), &options()).unwrap();
    let out = pool_batch(&mut e, &inputs);
    for (i, (o, w)) in out.iter().zip(&want).enumerate() {
        let what = format!("{name} input {i} on the CPU in bf16");
        assert_agrees(&what, EMBEDDERS.contains(&name), o, w, &REFERENCE);
    }
    out
}

fn check_all<D: Device>(dev: &Arc<D>) {
    for name in EMBEDDERS.iter().chain(&CROSS_ENCODERS) {
        check_fixture(dev, name, &cpu_outputs(name));
    }
}

#[test]
fn encoders_pool_as_the_reference_and_the_cpu() {
    on_every_raw_device!(check_all);
}
