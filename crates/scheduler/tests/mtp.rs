//! Drafts from the checkpoint's multi-token-prediction layer (`EngineOptions::mtp_draft`)
//! change speed, never output: the DeepSeek-V3 and GLM-4.5 MTP fixtures' six prompts, greedy
//! and sampled, batched, prefilled whole or in chunks of 7 (the head then reads each chunk's
//! rows with the prompt token after them), and again from the prefix cache, give the tokens
//! and logprobs they give without the head, and transformers' greedy tokens; a sequence whose
//! drafts keep missing (these heads are random) stops drafting.

mod common;

use std::path::{Path, PathBuf};

use common::{cfg, request, run_to_end};
use lmi_engine::DType;
use lmi_engine::engine::EngineOptions;
use lmi_scheduler::{DraftSource, GenerateRequest, Scheduler, SchedulerConfig};
use lmi_text::Tokenizer;

const FIXTURES: [(&str, &str); 2] = [("mla", "deepseek_v3_mtp"), ("sigmoid_moe", "glm4_moe_mtp")];

fn fixture(group: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/{group}/{name}"))
}

/// The fixture's model (its MTP layer in a shard of its own) beside a byte-level tokenizer
/// naming its 320 ids.
fn model(group: &str, name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "model-mtp.safetensors",
        "model.safetensors.index.json",
    ] {
        std::fs::copy(fixture(group, name).join(f), tmp.path().join(f)).unwrap();
    }
    lmi_checkpoint::testing::write_tiny_tokenizer_for(tmp.path(), 320).unwrap();
    tmp
}

fn reference(group: &str, name: &str) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(group, name).join("reference.json")).unwrap(),
    )
    .unwrap();
    let lists = |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(json[k].clone()).unwrap() };
    (lists("prompts"), lists("greedies"))
}

fn scheduler(dir: &Path, mtp: bool, config: SchedulerConfig) -> Scheduler {
    let opts = EngineOptions {
        dtype: Some(DType::F32),
        kv_blocks: Some(96),
        mtp_draft: mtp,
        ..Default::default()
    };
    let engine = lmi_engine::load_cpu(dir, &opts).unwrap();
    assert_eq!(lmi_engine::engine::StepEngine::mtp(&engine), mtp);
    Scheduler::new(Box::new(engine), Tokenizer::from_dir(dir).unwrap(), config)
}

/// Greedy requests for the even prompts, seeded sampled ones for the odd.
fn requests(prompts: &[Vec<u32>]) -> Vec<GenerateRequest> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| request(p.clone(), 24, (i % 2 == 1).then_some(7 + i as u64)))
        .collect()
}

#[test]
fn mtp_drafts_never_change_the_output() {
    for (group, name) in FIXTURES {
        let dir = model(group, name);
        let (prompts, greedies) = reference(group, name);
        let plain = run_to_end(
            &mut scheduler(dir.path(), false, cfg(6, 512)),
            requests(&prompts),
            1,
        );
        for (i, r) in plain.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
            assert_eq!(
                r[0].0,
                greedies[i][..24],
                "{name}: prompt {i} against transformers"
            );
        }
        for budget in [512, 7] {
            let mut s = scheduler(dir.path(), true, cfg(6, budget));
            let out = run_to_end(&mut s, requests(&prompts), 1);
            assert_eq!(
                out, plain,
                "{name}, budget {budget}: the head changed the output"
            );
            // The prompts again: their blocks (and the head's K/V in them) from the cache.
            let before = s.metrics().snapshot().prefix_cached_tokens;
            let again = run_to_end(&mut s, requests(&prompts), 10);
            assert_eq!(
                again, plain,
                "{name}, budget {budget}: from the prefix cache"
            );
            let m = s.metrics().snapshot();
            assert!(m.prefix_cached_tokens > before, "{name}: no prefix hit");
            let k = DraftSource::Mtp as usize;
            assert!(
                m.spec_proposed[k] > 0,
                "{name}, budget {budget}: nothing drafted"
            );
            // The random heads keep almost nothing: each of the 12 sequences stops drafting
            // after 16 draft tokens (and at most one draft of a few more in flight).
            assert!(
                m.spec_proposed[k] <= 12 * 18,
                "{name}: {} draft tokens: a missing head kept drafting",
                m.spec_proposed[k]
            );
            eprintln!(
                "{name}, budget {budget}: {} of {} draft tokens kept",
                m.spec_accepted[k], m.spec_proposed[k]
            );
        }
    }
}
