//! A checkpoint with a multi-token-prediction layer served end to end
//! (tests/fixtures/mla/deepseek_v3_mtp: DeepSeek-V3's layout, its MTP layer in a shard of its
//! own): the six prompts at once through `/v1/completions` give transformers' greedy text
//! with the head drafting (`lmi_spec_draft_tokens_total{source="mtp"}`), and the same text
//! with `option.speculative_mtp=false`, which drafts nothing.

mod common;

use std::path::Path;

use common::*;
use serde_json::{Value, json};

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mla/deepseek_v3_mtp")
}

/// The fixture's model (in `TMP/deepseek_v3_mtp`) with a byte-level tokenizer naming its ids.
fn model() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("deepseek_v3_mtp");
    std::fs::create_dir(&dir).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "model-mtp.safetensors",
        "model.safetensors.index.json",
    ] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    lmi_checkpoint::testing::write_tiny_tokenizer_for(&dir, 320).unwrap();
    (tmp, dir)
}

/// The `source="mtp"` sample of a labelled counter.
fn mtp_count(text: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{source=\"mtp\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_mtp_head_drafts_without_changing_the_text() {
    let (_tmp, dir) = model();
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap())
            .unwrap();
    let prompts: Vec<Vec<u32>> = serde_json::from_value(r["prompts"].clone()).unwrap();
    let greedies: Vec<Vec<u32>> = serde_json::from_value(r["greedies"].clone()).unwrap();
    let tok = lmi_text::Tokenizer::from_dir(&dir).unwrap();
    let want: Vec<String> = greedies
        .iter()
        .map(|g| tok.decode(g, true).unwrap())
        .collect();
    for (args, drafts) in [
        (&["--dtype", "f32"][..], true),
        (
            &["--dtype", "f32", "-o", "option.speculative_mtp=false"][..],
            false,
        ),
    ] {
        let mut s = start(&dir, args);
        wait_ready(&mut s, "deepseek_v3_mtp");
        let port = s.port;
        let got: Vec<String> = std::thread::scope(|sc| {
            let hs: Vec<_> = prompts
                .iter()
                .map(|p| {
                    sc.spawn(move || {
                        let body = json!({"prompt": p, "max_tokens": 32, "temperature": 0,
                                          "ignore_eos": true});
                        let r = post(port, "/v1/completions", &body.to_string());
                        assert_eq!(r.status, 200, "{}", r.body);
                        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            got, want,
            "{args:?}: greedy text differs from transformers'"
        );
        let m = get(port, "/metrics").body;
        let proposed = mtp_count(&m, "lmi_spec_draft_tokens_total");
        assert_eq!(
            proposed > 0.0,
            drafts,
            "{args:?}: {proposed} draft tokens\n{m}"
        );
    }
}
