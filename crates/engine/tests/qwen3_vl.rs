//! Qwen3-VL and Qwen3.5 with its vision tower against HF transformers 5.25
//! (tests/fixtures/qwen3_vl, tiny random weights written by its generate.py): the vision
//! tower's embeddings and Qwen3-VL's DeepStack features from the processor's patches,
//! interleaved M-RoPE positions against `get_rope_index`, prompt logits (images, a video
//! between its timestamps, text only) and 32 greedy tokens, in f32. Qwen3.5's language model
//! is a Gated DeltaNet hybrid: its steps carry a recurrent-state slot.

mod qwen3_vl_common;
mod qwen_vl_common;

use lmi_engine::vision::mrope::{RunAt, chunk_positions};
use lmi_engine::{ChunkMedia, ChunkState, LogitsWanted, SeqChunk};
use qwen_vl_common::{argmax, chunk, max_rel_diff};
use qwen3_vl_common::*;

const MODEL: &str = "qwen3_vl";

const QWEN3_5: &str = "qwen3_5";

#[test]
fn vision_embeddings_and_deepstack_features_match_hf() {
    check_vision(MODEL, 2);
}

#[test]
fn qwen3_5_vision_embeddings_match_hf() {
    check_vision(QWEN3_5, 0);
}

fn check_vision(model: &str, deepstack: usize) {
    let (_, t) = refs(model);
    let engine = load(model);
    let tower = engine.model().vision.as_ref().expect("a vision tower");
    let cfg = tower.config();
    assert_eq!(cfg.deepstack_visual_indexes.len(), deepstack);
    let out = cfg.out_hidden_size;
    for (key, input) in [
        ("image.block", image(model, "block")),
        ("image.wide", image(model, "wide")),
        ("video", video(model)),
    ] {
        let got = lmi_engine::cpu::vision::forward(tower, &input).unwrap();
        let tokens = input.tokens();
        assert_eq!(got.len(), tokens * cfg.output_width(), "{key}");
        let width = cfg.output_width();
        let part = |d: usize| -> Vec<f32> {
            got.chunks(width)
                .flat_map(|row| row[d * out..(d + 1) * out].to_vec())
                .collect()
        };
        let d = max_rel_diff(&part(0), &t.f32(&format!("{key}.embeds")));
        eprintln!("{model} {key}: embeddings differ from transformers' by {d:.2e} (relative)");
        assert!(d < 1e-4, "{key}: embeddings differ by {d} (relative)");
        if deepstack == 0 {
            assert!(t.get(&format!("{key}.deepstack")).is_none());
            continue;
        }
        let deep = t.f32(&format!("{key}.deepstack"));
        for k in 0..deepstack {
            let want = &deep[k * tokens * out..(k + 1) * tokens * out];
            let d = max_rel_diff(&part(k + 1), want);
            eprintln!("{key}: DeepStack feature {k} differs by {d:.2e}");
            assert!(d < 1e-4, "{key}: DeepStack feature {k} differs by {d}");
        }
    }
    // A video's temporal patches encoded one at a time are the whole video's rows.
    let whole = lmi_engine::cpu::vision::forward(tower, &video(model)).unwrap();
    let parts: Vec<f32> = frames_of(&video(model))
        .iter()
        .flat_map(|f| lmi_engine::cpu::vision::forward(tower, f).unwrap())
        .collect();
    assert!(max_rel_diff(&parts, &whole) < 1e-6);
}

#[test]
fn interleaved_mrope_positions_match_get_rope_index() {
    check_positions(MODEL);
    check_positions(QWEN3_5);
}

fn check_positions(model: &str) {
    let mut checked = 0;
    for case in cases(model) {
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
                "prompt {} position {i}",
                case.id
            );
        }
        assert_eq!(
            case.delta(),
            case.reference["rope_deltas"].as_i64().unwrap(),
            "prompt {}",
            case.id
        );
        checked += 1;
    }
    assert_eq!(checked, 5);
}

#[test]
fn prompt_logits_and_greedy_tokens_match_hf() {
    check_logits_and_greedy(MODEL);
}

#[test]
fn qwen3_5_prompt_logits_and_greedy_tokens_match_hf() {
    check_logits_and_greedy(QWEN3_5);
}

/// One step of one sequence; a hybrid model's recurrent state lives in slot 0 (reset by the
/// step that starts the sequence).
fn run(
    engine: &mut lmi_engine::Engine<lmi_engine::cpu::CpuBackend>,
    c: SeqChunk,
    media: &[ChunkMedia],
    delta: i64,
) -> lmi_engine::engine::Logits {
    use lmi_engine::engine::StepEngine;
    let states = match engine.state_config() {
        Some(_) => vec![ChunkState::in_slot(0)],
        None => Vec::new(),
    };
    engine
        .forward_logits_media_states(&[c], media, &[delta], &states)
        .unwrap()
}

fn check_logits_and_greedy(model: &str) {
    let (_, t) = refs(model);
    let mut engine = load(model);
    let vision = engine.model().config.vision.as_ref().unwrap();
    let deepstack = !vision.deepstack_visual_indexes.is_empty();
    let mut checked = 0;
    for case in cases(model) {
        let n = case.ids.len();
        let media = case.chunk_media(0, 0, n);
        let logits = run(
            &mut engine,
            chunk(case.ids.clone(), 0, LogitsWanted::All),
            &media,
            0,
        );
        let positions: Vec<usize> =
            serde_json::from_value(case.reference["logits_positions"].clone()).unwrap();
        // What DeepStack moves the logits by in transformers (0 without media): a model that
        // skipped it would fail the comparison below.
        let effect = case.reference["deepstack_logit_change_max_abs"]
            .as_f64()
            .unwrap();
        assert!(
            case.media.is_empty() || !deepstack || effect > 0.5,
            "prompt {}: {effect}",
            case.id
        );
        let want = t.f32(&format!("prompt.{}.logits", case.id));
        let vocab = want.len() / positions.len();
        let mut worst = 0f32;
        for (k, &p) in positions.iter().enumerate() {
            let d = max_rel_diff(logits.row(p), &want[k * vocab..(k + 1) * vocab]);
            assert!(d < 1e-4, "prompt {}: logits at {p} differ by {d}", case.id);
            worst = worst.max(d);
        }
        eprintln!(
            "prompt {}: logits differ by at most {worst:.2e} (relative)",
            case.id
        );
        // Greedy decoding: each new token at its index plus the prompt's M-RoPE delta.
        let delta = case.delta();
        let want = case.greedy();
        let mut got = vec![argmax(logits.row(n - 1))];
        while got.len() < want.len() {
            let pos = n + got.len() - 1;
            let step = chunk(vec![*got.last().unwrap()], pos, LogitsWanted::Last);
            let l = run(&mut engine, step, &[], delta);
            got.push(argmax(l.row(0)));
        }
        assert_eq!(got, want, "{model} prompt {}: greedy tokens", case.id);
        checked += 1;
    }
    assert_eq!(checked, 5);
}

/// DeepStack adds features at a media item's rows in whichever step computes them: a prefill
/// cut between prompt 2's two images gives the logits of the uncut one.
#[test]
fn a_prefill_cut_between_items_gives_the_same_logits() {
    let case = cases(MODEL).into_iter().find(|c| c.id == 2).unwrap();
    let n = case.ids.len();
    let cut = case.media[1].0 - 1;
    let mut engine = load(MODEL);
    let whole = engine
        .forward_logits_media(
            &[chunk(case.ids.clone(), 0, LogitsWanted::All)],
            &case.chunk_media(0, 0, n),
            &[],
        )
        .unwrap();
    let mut engine = load(MODEL);
    let first = chunk(case.ids[..cut].to_vec(), 0, LogitsWanted::All);
    let a = engine
        .forward_logits_media(&[first], &case.chunk_media(0, 0, cut), &[])
        .unwrap();
    let delta = lmi_engine::vision::mrope::item_delta(&case.media[0].1);
    let mut second = chunk(case.ids[cut..].to_vec(), cut, LogitsWanted::All);
    second.block_table = (0..n.div_ceil(16) as u32).collect();
    let b = engine
        .forward_logits_media(&[second], &case.chunk_media(0, cut, n), &[delta])
        .unwrap();
    for p in 0..n {
        let got = if p < cut { a.row(p) } else { b.row(p - cut) };
        let d = max_rel_diff(got, whole.row(p));
        assert!(d < 1e-5, "position {p}: {d}");
    }
}
