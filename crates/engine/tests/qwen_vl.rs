//! Qwen2.5-VL and Qwen2-VL against HF transformers (tests/fixtures/qwen_vl, written by its
//! generate.py from tiny random weights): vision embeddings from the processor's patches,
//! M-RoPE positions against `get_rope_index`, prompt logits, and 16 greedy tokens, in f32.

mod qwen_vl_common;

use lmi_engine::LogitsWanted;
use lmi_engine::vision::mrope::{RunAt, chunk_positions};
use qwen_vl_common::*;

fn check_vision(model: &str) {
    let dir = fixtures();
    let (pre, prep) = (
        Tensors::open(&dir.join("preprocess.safetensors")),
        json(&dir.join("preprocess.json")),
    );
    let refs = Tensors::open(&dir.join(model).join("reference.safetensors"));
    let engine = load(model);
    let tower = engine.model().vision.as_ref().expect("a vision tower");
    let mut checked = 0;
    let names: Vec<String> = prep["images"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    for name in names {
        let Some(inp) = input(&pre, &prep, "image", &name, 1.0) else {
            continue;
        };
        let got = lmi_engine::cpu::vision::forward(tower, &inp).unwrap();
        let d = max_rel_diff(&got, &refs.f32(&format!("image.{name}.embeds")));
        assert!(
            d < 1e-4,
            "{model} {name}: embeddings differ by {d} (relative)"
        );
        checked += 1;
    }
    let video = input(&pre, &prep, "video", "", 1.0).unwrap();
    let d = max_rel_diff(
        &lmi_engine::cpu::vision::forward(tower, &video).unwrap(),
        &refs.f32("video.embeds"),
    );
    assert!(d < 1e-4, "{model} video: embeddings differ by {d}");
    assert!(checked >= 4, "images checked: {checked}");
}

#[test]
fn qwen2_5_vl_vision_embeddings_match_hf() {
    check_vision("qwen2_5_vl");
}

#[test]
fn qwen2_vl_vision_embeddings_match_hf() {
    check_vision("qwen2_vl");
}

#[test]
fn mrope_positions_match_get_rope_index() {
    for model in ["qwen2_5_vl", "qwen2_vl"] {
        for case in prompts(model) {
            let want: Vec<Vec<u32>> =
                serde_json::from_value(case.reference["position_ids"].clone()).unwrap();
            let runs: Vec<RunAt<'_>> = case
                .media
                .iter()
                .map(|(start, inp)| RunAt {
                    offset: *start,
                    len: inp.tokens(),
                    item_offset: 0,
                    input: inp,
                })
                .collect();
            let mut got = Vec::new();
            chunk_positions(0, case.ids.len(), 0, &runs, &mut got);
            for (i, p) in got.chunks(3).enumerate() {
                assert_eq!(
                    p,
                    [want[0][i], want[1][i], want[2][i]],
                    "{model} prompt {} position {i}",
                    case.id
                );
            }
            let delta = case.delta();
            assert_eq!(
                delta,
                case.reference["rope_deltas"].as_i64().unwrap(),
                "{model} prompt {}",
                case.id
            );
        }
    }
}

fn check_logits_and_greedy(model: &str) {
    let refs = Tensors::open(&fixtures().join(model).join("reference.safetensors"));
    let mut engine = load(model);
    let mut cases = 0;
    for case in prompts(model) {
        let n = case.ids.len();
        let media = chunk_media(&case);
        let logits = engine
            .forward_logits_media(
                &[chunk(case.ids.clone(), 0, LogitsWanted::All)],
                &media,
                &[],
            )
            .unwrap();
        let (p, d) = case.worst_logits(&logits, &refs);
        assert!(
            d < 1e-4,
            "{model} prompt {}: logits at {p} differ by {d}",
            case.id
        );
        // The top 16 over the whole vocabulary at the same positions.
        let (p, d) = case.worst_top_logits(&logits, &refs);
        assert!(
            d < 1e-4,
            "{model} prompt {}: top-16 at {p} differ by {d}",
            case.id
        );

        // Greedy decoding, each token at its sequence index plus the prompt's M-RoPE delta.
        let delta = case.delta();
        let want = case.greedy();
        let mut got = vec![argmax(logits.row(n - 1))];
        while got.len() < want.len() {
            let pos = n + got.len() - 1;
            let step = chunk(vec![*got.last().unwrap()], pos, LogitsWanted::Last);
            let l = engine.forward_logits_media(&[step], &[], &[delta]).unwrap();
            got.push(argmax(l.row(0)));
        }
        assert_eq!(got, want, "{model} prompt {}: greedy tokens", case.id);
        cases += 1;
    }
    assert!(cases >= 3, "{model}: {cases} prompts checked");
}

#[test]
fn qwen2_5_vl_prompt_logits_and_greedy_tokens_match_hf() {
    check_logits_and_greedy("qwen2_5_vl");
}

#[test]
fn qwen2_vl_prompt_logits_and_greedy_tokens_match_hf() {
    check_logits_and_greedy("qwen2_vl");
}
