//! Sliding windows that transformers applies from a model's config
//! (`tests/fixtures/mistral/generate.py`, transformers 4.57.6), each of 8 keys, which the
//! 14-token prompt and its 32 greedy tokens run far past:
//! - Mistral's `sliding_window`, on every layer (Mistral-7B-v0.1 publishes 4096);
//! - Qwen2's, only with `use_sliding_window` (off in the published configs) and from layer
//!   `max_window_layers` on: here layers 1 and 2, layer 0 attending to everything.

mod hf_fixture;

use hf_fixture::{
    F32_TOL, blocks, check_greedy, chunk, load, load_windowed, reference, rel_diff,
    run_on_window_pools, sequence_logits, with_config,
};
use lmi_engine::engine::StepEngine;
use lmi_engine::{DType, KvWindow, LogitsWanted};

fn fixture(name: &str) -> std::path::PathBuf {
    hf_fixture::fixture("mistral", name)
}

#[test]
fn the_windowed_layers_are_transformers() {
    let local = |name: &str| {
        let c = lmi_engine::ModelConfig::from_file(&fixture(name).join("config.json")).unwrap();
        let w = c.sliding_window.unwrap();
        assert_eq!(w.size, 8, "{name}");
        w.local
    };
    assert_eq!(local("mistral_window"), [true; 3]);
    assert_eq!(local("qwen2_window"), [false, true, true]);
}

/// Every position of the prompt and its greedy continuation within f32 tolerance of
/// transformers', and the greedy tokens decoded one step at a time equal.
#[test]
fn logits_and_greedy_tokens_match_transformers() {
    for name in ["mistral_window", "qwen2_window"] {
        let dir = fixture(name);
        let r = reference(&dir);
        let got = sequence_logits(&mut load(&dir, DType::F32), &r.sequence());
        let worst = got
            .iter()
            .zip(&r.full_logits)
            .map(|(g, w)| rel_diff(g, w))
            .fold(0f32, f32::max);
        eprintln!("{name} f32: within {worst:.2e} of transformers'");
        assert!(worst < F32_TOL, "{name}: logits differ by {worst}");
        check_greedy(name, &dir, F32_TOL);
    }
}

/// The config decides the window: without it (Mistral: no `sliding_window`; Qwen2:
/// `use_sliding_window` off) the logits past position 8 leave transformers'. Qwen2 without
/// `layer_types` (configs written before transformers listed them) falls back to
/// `max_window_layers` and gives the same logits.
#[test]
fn the_config_switches_the_window() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, bool); 3] = [
        (
            "mistral_window",
            |c| c["sliding_window"] = serde_json::Value::Null,
            false,
        ),
        (
            "qwen2_window",
            |c| c["use_sliding_window"] = false.into(),
            false,
        ),
        (
            "qwen2_window",
            |c| {
                c.as_object_mut().unwrap().remove("layer_types");
            },
            true,
        ),
    ];
    for (name, edit, same) in cases {
        let dir = fixture(name);
        let r = reference(&dir);
        let tmp = with_config(&dir, edit);
        let got = sequence_logits(&mut load(tmp.path(), DType::F32), &r.sequence());
        assert!(rel_diff(&got[7], &r.full_logits[7]) < F32_TOL, "{name}");
        let last = got.len() - 1;
        let d = rel_diff(&got[last], &r.full_logits[last]);
        if same {
            assert!(
                d < F32_TOL,
                "{name}: without layer_types the logits moved by {d}"
            );
        } else {
            assert!(d > 1e-2, "{name}: the window changed nothing ({d})");
        }
    }
}

/// A model whose every layer is local (Mistral's window) keeps all its K/V in window pools:
/// blocks go back once out of every later token's window, and every position's logits are
/// the bits of the engine with one table, in chunks of a prompt and one token at a time.
#[test]
fn every_layer_local_runs_on_window_pools_alone() {
    let dir = fixture("mistral_window");
    let r = reference(&dir);
    let seq = r.sequence();
    let alone = load(&dir, DType::F32)
        .forward_logits(&[chunk(&seq, 0, &blocks(0, seq.len()), LogitsWanted::All)])
        .unwrap();
    let mut e = load_windowed(&dir);
    let w = e.kv_window().expect("window pools for Mistral's window");
    assert_eq!(w, KvWindow { blocks: 8, size: 8 });
    run_on_window_pools(&mut e, w, &seq, &alone, &[r.prompt.len()]);
}
