//! Gemma 4 with its vision tower on the CPU against HF transformers 5.25
//! (tests/fixtures/gemma4/vision, a tiny random `Gemma4ForConditionalGeneration` in
//! gemma-4-E2B's shape with a 2-layer tower, written by generate_vision.py):
//! - `lmi_media`'s Gemma 4 processor gives `Gemma4ImageProcessorPil`'s patches for two PNGs
//!   (one enlarged, one shrunk);
//! - the tower (patch and position embedding, 2-D RoPE, clamped projections, pooling,
//!   standardization, the multimodal embedder) gives transformers' soft-token features;
//! - three prompts with images between boi/eoi: every position's logits and 32 greedy tokens
//!   as transformers', alone, all three in one step, and with the prefill cut inside an image;
//! - the same on tests/fixtures/gemma4/vision_a4b (gemma-4-26B-A4B's layout with
//!   `use_bidirectional_attention: "vision"`: an image's soft tokens see each other both ways
//!   in the sliding layers), where a cut inside an image is refused and one before it is not.

mod gemma4_video;
mod hf_fixture;

use std::path::PathBuf;
use std::sync::Arc;

use hf_fixture::{F32_TOL, argmax, blocks, chunk, rel_diff};
use lmi_engine::vision::{MediaKind, VisionInput};
use lmi_engine::{ChunkMedia, DType, Engine, LogitsWanted};
use serde_json::Value;

/// What transformers' features and logits may differ from ours by (relative to the row's
/// largest value): f32, summed in another order.
const TOL: f32 = 2e-3;

struct Tensors(Vec<u8>);

impl Tensors {
    fn open(path: &std::path::Path) -> Self {
        Tensors(std::fs::read(path).unwrap())
    }

    fn f32(&self, name: &str) -> Vec<f32> {
        let st = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("no tensor {name}"));
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

/// The causal fixture (E2B's layout) and the one whose images attend both ways.
const CAUSAL: &str = "vision";
const BIDIRECTIONAL: &str = "vision_a4b";

fn dir_of(name: &str) -> PathBuf {
    hf_fixture::fixture("gemma4", name)
}

fn reference() -> (Value, Tensors) {
    reference_of(CAUSAL)
}

fn reference_of(name: &str) -> (Value, Tensors) {
    let d = dir_of(name);
    let r = serde_json::from_str(&std::fs::read_to_string(d.join("reference.json")).unwrap());
    (r.unwrap(), Tensors::open(&d.join("reference.safetensors")))
}

fn load() -> Engine<lmi_engine::cpu::CpuBackend> {
    load_of(CAUSAL)
}

fn load_of(name: &str) -> Engine<lmi_engine::cpu::CpuBackend> {
    hf_fixture::load(&dir_of(name), DType::F32)
}

/// Image `i` as the server reads it: the PNG decoded, then the model's processor.
fn image(i: usize) -> VisionInput {
    image_of(CAUSAL, i)
}

fn image_of(name: &str, i: usize) -> VisionInput {
    let d = dir_of(name);
    let cfg = lmi_media::ProcessorConfig::from_dir(&d).unwrap();
    assert!(cfg.gemma4.is_some(), "the processor config names Gemma 4's");
    let bytes = std::fs::read(d.join(format!("image{i}.png"))).unwrap();
    let img = lmi_media::decode_image(&bytes, &lmi_media::ImageLimits::default()).unwrap();
    let p = lmi_media::preprocess_image(&img, &cfg).unwrap();
    VisionInput {
        kind: MediaKind::Image,
        grid_thw: p.grid_thw,
        pixels: p.pixels,
        merge_size: cfg.merge_size,
        t_scale: 1.0,
    }
}

fn hash(inp: &VisionInput) -> u128 {
    let bytes: Vec<u8> = inp.pixels.iter().flat_map(|v| v.to_le_bytes()).collect();
    lmi_media::content_hash(&bytes)
}

struct Case {
    ids: Vec<u32>,
    /// Where each image's soft tokens start, and the image.
    media: Vec<(usize, Arc<VisionInput>)>,
    greedy: Vec<u32>,
    logits: Vec<f32>,
}

fn cases() -> Vec<Case> {
    cases_of(CAUSAL)
}

fn cases_of(name: &str) -> Vec<Case> {
    let (r, t) = reference_of(name);
    let images = [Arc::new(image_of(name, 0)), Arc::new(image_of(name, 1))];
    let token = r["image_token_id"].as_u64().unwrap() as u32;
    let prompts = r["prompts"].as_array().unwrap();
    prompts
        .iter()
        .enumerate()
        .map(|(p, ids)| {
            let ids: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
            let which: Vec<usize> = serde_json::from_value(r["prompt_images"][p].clone()).unwrap();
            let starts: Vec<usize> = (0..ids.len())
                .filter(|&i| ids[i] == token && (i == 0 || ids[i - 1] != token))
                .collect();
            assert_eq!(starts.len(), which.len());
            let media = starts
                .iter()
                .zip(&which)
                .map(|(&s, &w)| (s, images[w].clone()))
                .collect();
            Case {
                greedy: serde_json::from_value(r["greedies"][p].clone()).unwrap(),
                logits: t.f32(&format!("prompt_logits_{p}")),
                ids,
                media,
            }
        })
        .collect()
}

impl Case {
    /// The media runs of `[from, to)` of the prompt, for chunk `chunk` starting at `from`.
    fn runs(&self, chunk: usize, from: usize, to: usize) -> Vec<ChunkMedia> {
        self.media
            .iter()
            .filter_map(|(s, inp)| {
                let (a, b) = (*s.max(&from), (s + inp.tokens()).min(to));
                (a < b).then(|| ChunkMedia {
                    chunk,
                    offset: a - from,
                    len: b - a,
                    item_offset: a - s,
                    hash: hash(inp),
                    input: Some(inp.clone()),
                })
            })
            .collect()
    }

    fn worst(&self, rows: impl Fn(usize) -> Vec<f32>) -> f32 {
        let vocab = self.logits.len() / self.ids.len();
        (0..self.ids.len())
            .map(|p| rel_diff(&rows(p), &self.logits[p * vocab..(p + 1) * vocab]))
            .fold(0f32, f32::max)
    }
}

#[test]
fn the_processor_gives_transformers_patches() {
    let (r, t) = reference();
    for i in 0..2 {
        let inp = image(i);
        let grid: Vec<usize> = serde_json::from_value(r["images"][i]["patches"].clone()).unwrap();
        assert_eq!(inp.grid_thw, [1, grid[0], grid[1]], "image {i}");
        let want = t.f32(&format!("image{i}.pixels"));
        assert_eq!(inp.pixels.len(), want.len());
        let worst = inp
            .pixels
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-7, "image {i}: pixels differ by {worst}");
        assert_eq!(
            inp.tokens(),
            r["images"][i]["soft_tokens"].as_u64().unwrap() as usize
        );
    }
}

#[test]
fn the_tower_gives_transformers_features() {
    let (r, t) = reference();
    // Clamping moves transformers' features by this much: a tower that skipped it would fail.
    assert!(r["clip_effect_max_abs"].as_f64().unwrap() > 0.5);
    let engine = load();
    let tower = engine.model().vision.as_ref().expect("a vision tower");
    for i in 0..2 {
        let inp = image(i);
        let got = lmi_engine::cpu::vision::forward(tower, &inp).unwrap();
        let want = t.f32(&format!("image{i}.features"));
        assert_eq!(got.len(), want.len(), "image {i}");
        let d = rel_diff(&got, &want);
        eprintln!("image {i}: features differ from transformers' by {d:.2e} (relative)");
        assert!(d < F32_TOL, "image {i}: features differ by {d}");
    }
}

#[test]
fn prompt_logits_and_greedy_tokens_match_hf() {
    let (r, _) = reference_of(BIDIRECTIONAL);
    // The both-ways mask moves transformers' logits this much: causal attention must fail.
    let effect = r["bidirectional_effect"].as_f64().unwrap();
    assert!(effect > 1.0, "{effect}");
    for name in [CAUSAL, BIDIRECTIONAL] {
        prompt_logits_and_greedy_tokens_of(name);
    }
}

fn prompt_logits_and_greedy_tokens_of(name: &str) {
    for (p, case) in cases_of(name).iter().enumerate() {
        logits_and_greedy_match(name, &format!("prompt {p}"), case);
    }
}

/// One forward over the case's prompt gives transformers' logits at every position, and
/// greedy decoding after it its tokens.
fn logits_and_greedy_match(name: &str, p: &str, case: &Case) {
    let mut e = load_of(name);
    let n = case.ids.len();
    let table = blocks(0, n + case.greedy.len());
    let out = e
        .forward_logits_media(
            &[chunk(&case.ids, 0, &table, LogitsWanted::All)],
            &case.runs(0, 0, n),
            &[],
        )
        .unwrap();
    let worst = case.worst(|r| out.row(r).to_vec());
    eprintln!("{name} {p}: logits differ from transformers' by {worst:.2e} (relative)");
    assert!(worst < TOL, "{name} {p}: logits differ by {worst}");
    let mut got = vec![argmax(out.row(n - 1))];
    while got.len() < case.greedy.len() {
        let pos = n + got.len() - 1;
        let step = chunk(&[*got.last().unwrap()], pos, &table, LogitsWanted::Last);
        let l = e.forward_logits(&[step]).unwrap();
        got.push(argmax(l.row(0)));
    }
    assert_eq!(got, case.greedy, "{name} {p}: greedy tokens");
}

/// The video's sampled frames as the server reads them (`gemma4_video::frames`).
fn video_frames(name: &str) -> (Vec<usize>, Vec<Arc<VisionInput>>) {
    gemma4_video::frames(&dir_of(name))
}

/// The video prompt of `reference.json`: each frame's run of video tokens one item.
fn video_case(name: &str) -> Case {
    let (r, t) = reference_of(name);
    let v = &r["video"];
    let (ids, starts) = gemma4_video::prompt(&r);
    let (_, frames) = video_frames(name);
    assert_eq!(starts.len(), frames.len());
    Case {
        media: starts.into_iter().zip(frames).collect(),
        greedy: serde_json::from_value(v["greedy"].clone()).unwrap(),
        logits: t.f32("video_prompt_logits"),
        ids,
    }
}

#[test]
fn the_video_processor_gives_transformers_frames_and_patches() {
    let (r, t) = reference();
    let v = &r["video"];
    let (indices, frames) = video_frames(CAUSAL);
    let want: Vec<usize> = serde_json::from_value(v["frame_indices"].clone()).unwrap();
    assert_eq!(indices, want);
    let grid: Vec<usize> = serde_json::from_value(v["patches"].clone()).unwrap();
    let want = t.f32("video.pixels");
    let per = want.len() / frames.len();
    for (k, f) in frames.iter().enumerate() {
        assert_eq!(f.grid_thw, [1, grid[0], grid[1]], "frame {k}");
        assert_eq!(
            f.tokens(),
            v["soft_tokens_per_frame"].as_u64().unwrap() as usize
        );
        assert_eq!(f.pixels.len(), per);
        let worst = f.pixels.iter().zip(&want[k * per..(k + 1) * per]);
        let worst = worst.fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-7, "frame {k}: pixels differ by {worst}");
    }
}

/// The video prompt (4 frames, each `MM:SS <boi>` + 63 soft tokens + `<eoi>`): every
/// position's logits and 32 greedy tokens as transformers', causal and (26B-A4B's layout)
/// with each frame's tokens attending to each other both ways, as transformers groups them.
#[test]
fn video_prompt_logits_and_greedy_tokens_match_hf() {
    let (r, _) = reference_of(BIDIRECTIONAL);
    let effect = r["video"]["bidirectional_effect"].as_f64().unwrap();
    assert!(effect > 1.0, "{effect}");
    for name in [CAUSAL, BIDIRECTIONAL] {
        logits_and_greedy_match(name, "video prompt", &video_case(name));
    }
}

/// Each case's logits at every position, alone in one step.
fn each_alone(name: &str, cases: &[Case]) -> Vec<Vec<Vec<f32>>> {
    cases
        .iter()
        .map(|c| {
            let mut e = load_of(name);
            let n = c.ids.len();
            let out = e
                .forward_logits_media(
                    &[chunk(&c.ids, 0, &blocks(0, n), LogitsWanted::All)],
                    &c.runs(0, 0, n),
                    &[],
                )
                .unwrap();
            (0..n).map(|r| out.row(r).to_vec()).collect()
        })
        .collect()
}

/// All cases in one step give each one's bits alone.
fn batch_gives_each_alone(name: &str, cases: &[Case], alone: &[Vec<Vec<f32>>]) {
    let mut e = load_of(name);
    let (mut chunks, mut media, mut first_block) = (Vec::new(), Vec::new(), 0);
    for (k, c) in cases.iter().enumerate() {
        let n = c.ids.len();
        chunks.push(chunk(&c.ids, 0, &blocks(first_block, n), LogitsWanted::All));
        media.extend(c.runs(k, 0, n));
        first_block += n.div_ceil(lmi_engine::BLOCK_SIZE) as u32;
    }
    let out = e.forward_logits_media(&chunks, &media, &[]).unwrap();
    let mut row = 0;
    for (k, rows) in alone.iter().enumerate() {
        for (p, want) in rows.iter().enumerate() {
            assert!(
                out.row(row) == &want[..],
                "{name} prompt {k} position {p} in a batch"
            );
            row += 1;
        }
    }
}

/// Case `k`'s prefill in two steps cut at `cut` gives its bits alone.
fn cut_gives_alone(name: &str, c: &Case, k: usize, cut: usize, alone: &[Vec<f32>]) {
    let n = c.ids.len();
    let table = blocks(0, n);
    let mut e = load_of(name);
    let a = e
        .forward_logits_media(
            &[chunk(&c.ids[..cut], 0, &table, LogitsWanted::All)],
            &c.runs(0, 0, cut),
            &[],
        )
        .unwrap();
    let b = e
        .forward_logits_media(
            &[chunk(&c.ids[cut..], cut, &table, LogitsWanted::All)],
            &c.runs(0, cut, n),
            &[],
        )
        .unwrap();
    for (p, want) in alone.iter().enumerate() {
        let got = if p < cut { a.row(p) } else { b.row(p - cut) };
        assert!(
            got == &want[..],
            "{name} prompt {k} cut at {cut}: position {p}"
        );
    }
}

/// All three prompts in one step, and each cut inside its first image: the logits of each
/// alone and whole (the same bits on the CPU).
#[test]
fn a_batch_and_a_cut_inside_an_image_give_the_same_logits() {
    let cases = cases();
    let alone = each_alone(CAUSAL, &cases);
    batch_gives_each_alone(CAUSAL, &cases, &alone);
    for (k, c) in cases.iter().enumerate() {
        cut_gives_alone(CAUSAL, c, k, c.media[0].0 + 7, &alone[k]);
    }
}

/// Where an image's tokens attend both ways, all prompts in one step give each one's bits
/// alone; the prefill cut just before an image (its tokens whole in the second chunk) too,
/// and a step from inside an image to the end over K/V already computed (a prefix-cache hit
/// ending inside the image); a step ending inside an image is refused, saying why (the
/// scheduler never makes one).
#[test]
fn both_ways_an_image_is_computed_whole() {
    let cases = cases_of(BIDIRECTIONAL);
    let alone = each_alone(BIDIRECTIONAL, &cases);
    batch_gives_each_alone(BIDIRECTIONAL, &cases, &alone);
    for (k, c) in cases.iter().enumerate() {
        let n = c.ids.len();
        let table = blocks(0, n);
        let inside = c.media[0].0 + 7;
        let mut e = load_of(BIDIRECTIONAL);
        let err = e
            .forward_logits_media(
                &[chunk(&c.ids[..inside], 0, &table, LogitsWanted::All)],
                &c.runs(0, 0, inside),
                &[],
            )
            .expect_err("a cut inside an image");
        assert!(err.to_string().contains("one step"), "{err}");
        // The whole prompt, then its tail from inside the image again over the same blocks.
        let mut e = load_of(BIDIRECTIONAL);
        e.forward_logits_media(
            &[chunk(&c.ids, 0, &table, LogitsWanted::Last)],
            &c.runs(0, 0, n),
            &[],
        )
        .unwrap();
        let tail = e
            .forward_logits_media(
                &[chunk(&c.ids[inside..], inside, &table, LogitsWanted::All)],
                &c.runs(0, inside, n),
                &[],
            )
            .unwrap();
        for (p, want) in alone[k].iter().enumerate().skip(inside) {
            assert!(
                tail.row(p - inside) == &want[..],
                "prompt {k} from {inside} over cached K/V: position {p}"
            );
        }
        cut_gives_alone(BIDIRECTIONAL, c, k, c.media[0].0, &alone[k]);
    }
}
