//! A Gated DeltaNet hybrid served end to end: the tiny random Qwen3.5 and Qwen3-Next of
//! tests/fixtures/hybrid (made by HF transformers, whose greedy tokens they record) through
//! `/v1/completions` with token-id prompts, all six at once, then again from the prefix cache
//! (state snapshots), with the recurrent-state gauges in `/metrics`.

mod common;

use std::path::Path;

use common::*;
use serde_json::{Value, json};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/hybrid/{name}"))
}

/// The fixture's model (in `TMP/name`) with a byte-level tokenizer naming all of its 320 ids.
fn model(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(name).join(f), dir.join(f)).unwrap();
    }
    lmi_checkpoint::testing::write_tiny_tokenizer_for(&dir, 320).unwrap();
    // Qwen3.5's checkpoints come with their tower's image processor (the server reads it at
    // load); the fixture's tower has patches of 4.
    let processor = json!({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen3VLProcessor",
        "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 3,
        "rescale_factor": 1.0 / 255.0, "patch_size": 4, "merge_size": 2,
        "temporal_patch_size": 2, "size": {"shortest_edge": 64, "longest_edge": 4096}
    });
    std::fs::write(dir.join("preprocessor_config.json"), processor.to_string()).unwrap();
    (tmp, dir)
}

fn complete(port: u16, prompt: &[u32]) -> String {
    let body = json!({"prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": true});
    let r = post(port, "/v1/completions", &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn hybrids_serve_transformers_tokens_and_reuse_state_snapshots() {
    for name in ["qwen3_5", "qwen3_next"] {
        let (_tmp, dir) = model(name);
        let r: Value = serde_json::from_str(
            &std::fs::read_to_string(fixture(name).join("reference.json")).unwrap(),
        )
        .unwrap();
        let prompts: Vec<Vec<u32>> = serde_json::from_value(r["prompts"].clone()).unwrap();
        let greedies: Vec<Vec<u32>> = serde_json::from_value(r["greedies"].clone()).unwrap();
        let tok = lmi_text::Tokenizer::from_dir(&dir).unwrap();
        let want: Vec<String> = greedies
            .iter()
            .map(|g| tok.decode(g, true).unwrap())
            .collect();

        let mut s = start(&dir, &["--dtype", "f32"]);
        wait_ready(&mut s, name);
        let port = s.port;
        // All six at once: they share steps.
        let got: Vec<String> = std::thread::scope(|sc| {
            let hs: Vec<_> = prompts
                .iter()
                .map(|p| sc.spawn(move || complete(port, p)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got, want, "{name}: greedy text differs from transformers'");
        let m = get(port, "/metrics").body;
        assert!(metric(&m, "lmi_state_slots_total").unwrap() > 0.0, "{m}");
        assert!(
            metric(&m, "lmi_state_prefix_snapshots").unwrap() > 0.0,
            "{m}"
        );
        // Again: the prompts of 21 tokens and more resume from their snapshots.
        let before = metric(&m, "lmi_prefix_cache_hit_tokens_total").unwrap_or(0.0);
        for (p, w) in prompts.iter().zip(&want) {
            assert_eq!(
                &complete(port, p),
                w,
                "{name}: a prefix hit changed the text"
            );
        }
        let after = metric(
            &get(port, "/metrics").body,
            "lmi_prefix_cache_hit_tokens_total",
        );
        assert!(
            after.unwrap_or(0.0) - before >= 80.0,
            "{name}: {before} -> {after:?}"
        );
        sigterm_and_wait(&mut s);
    }
}
