//! Mistral's `sliding_window`, which transformers applies to every layer (Mistral-7B-v0.1
//! publishes 4096): the fixture (`tests/fixtures/mistral/generate.py`, transformers 4.57.6) has
//! a window of 8, which the 14-token prompt and its 32 greedy tokens run far past.

mod hf_fixture;

use hf_fixture::{F32_TOL, check_greedy, load, reference, rel_diff, sequence_logits, with_config};
use lmi_engine::DType;

fn fixture() -> std::path::PathBuf {
    hf_fixture::fixture("mistral", "mistral_window")
}

#[test]
fn every_layer_is_windowed() {
    let c = lmi_engine::ModelConfig::from_file(&fixture().join("config.json")).unwrap();
    let w = c.sliding_window.as_ref().unwrap();
    assert_eq!((w.size, w.local.as_slice()), (8, [true; 3].as_slice()));
}

/// Every position of the prompt and its greedy continuation within f32 tolerance of
/// transformers', and the greedy tokens decoded one step at a time equal.
#[test]
fn logits_and_greedy_tokens_match_transformers() {
    let dir = fixture();
    let r = reference(&dir);
    let got = sequence_logits(&mut load(&dir, DType::F32), &r.sequence());
    let worst = got
        .iter()
        .zip(&r.full_logits)
        .map(|(g, w)| rel_diff(g, w))
        .fold(0f32, f32::max);
    eprintln!("mistral_window f32: within {worst:.2e} of transformers'");
    assert!(worst < F32_TOL, "logits differ by {worst}");
    check_greedy("mistral_window", &dir, F32_TOL);
}

/// The fixture decides the window: without it, the logits past position 8 leave transformers'.
#[test]
fn without_the_window_the_logits_differ() {
    let dir = fixture();
    let r = reference(&dir);
    let tmp = with_config(&dir, |c| c["sliding_window"] = serde_json::Value::Null);
    let got = sequence_logits(&mut load(tmp.path(), DType::F32), &r.sequence());
    assert!(rel_diff(&got[7], &r.full_logits[7]) < F32_TOL);
    let last = got.len() - 1;
    let d = rel_diff(&got[last], &r.full_logits[last]);
    assert!(d > 1e-2, "the window changed nothing ({d})");
}
