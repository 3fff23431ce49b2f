//! Qwen2.5-VL and Qwen2-VL on the CUDA engine, in bf16, on every device of `cuda_common` (the
//! emulator in both thread orders, then the real host code on a GPU or the fake driver):
//! - the device's vision tower (kernels/vision.cu and the language model's kernels): every
//!   fixture image's and the video's embeddings against HF's;
//! - the language model (M-RoPE in the rotary kernels, the encoder's rows scattered into the
//!   step's embeddings, decode graphs) against the CPU engine in bf16 on the same (host)
//!   embeddings: every prompt, then 15 decode steps along HF's greedy tokens;
//! - end to end against HF: prompt logits, and HF's 16 greedy tokens each the CUDA engine's
//!   argmax or within a bf16 tolerance of it;
//! - a prompt prefilled in two chunks cut inside its image gives the logits of one chunk.

mod cuda_common;
mod qwen_vl_common;

use std::sync::Arc;

use lmi_cuda::Device;
use lmi_engine::cpu::CpuBackend;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::engine::{EngineOptions, Logits};
use lmi_engine::{Backend, ChunkMedia, DType, Engine, LogitsWanted};
use qwen_vl_common::*;

/// Logits within 2% of the larger row's largest magnitude (bf16 weights and activations,
/// different summation orders), as `cuda_engine.rs`.
fn tolerance(row: &[f32]) -> f32 {
    2e-2 * row.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0)
}

fn assert_rows_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let tol = tolerance(want);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{what}: logit {i} is {g}, the CPU's {w} (tolerance {tol})"
        );
    }
}

fn best(row: &[f32]) -> usize {
    argmax(row) as usize
}

fn cuda_engine<D: Device>(
    dev: &Arc<D>,
    model: &str,
    vision_on_host: bool,
) -> Engine<CudaBackend<D>> {
    let b = CudaBackend::with_graphs(dev.clone(), true).unwrap();
    let opts = EngineOptions {
        vision_on_host,
        ..options(DType::BF16)
    };
    Engine::load(b, &fixtures().join(model), &opts).unwrap()
}

fn cpu_engine(model: &str) -> Engine<CpuBackend> {
    lmi_engine::load_cpu(&fixtures().join(model), &options(DType::BF16)).unwrap()
}

/// The last row of a one-sequence step.
fn last(l: &Logits) -> &[f32] {
    let rows: u32 = l.rows_per_seq.iter().sum();
    l.row(rows as usize - 1)
}

/// The language model on the device (M-RoPE in the rotary kernels, the tower's rows
/// scattered into the embeddings, graphs for decode) against the CPU engine in bf16, both
/// given the host tower's embeddings: every prompt's last logits, then 16 steps along HF's
/// greedy tokens.
fn check_language_model<D: Device>(dev: &Arc<D>, model: &str) {
    let mut gpu = cuda_engine(dev, model, true);
    let mut cpu = cpu_engine(model);
    let mut cases = 0;
    for case in prompts(model) {
        let what = format!("{model} prompt {}", case.id);
        let n = case.ids.len();
        let media = chunk_media(&case);
        let prompt = [chunk(case.ids.clone(), 0, LogitsWanted::Last)];
        let got = gpu.forward_logits_media(&prompt, &media, &[]).unwrap();
        let want = cpu.forward_logits_media(&prompt, &media, &[]).unwrap();
        assert_rows_close(&what, last(&got), last(&want));
        let delta = case.delta();
        let hf = case.greedy();
        for (k, &token) in hf.iter().enumerate().take(hf.len() - 1) {
            let step = [chunk(vec![token], n + k, LogitsWanted::Last)];
            let got = gpu.forward_logits_media(&step, &[], &[delta]).unwrap();
            let want = cpu.forward_logits_media(&step, &[], &[delta]).unwrap();
            assert_rows_close(&format!("{what} token {k}"), last(&got), last(&want));
        }
        cases += 1;
    }
    assert!(cases >= 4, "{model}: {cases} prompts checked");
}

/// bf16 through the whole model, the tower's activations too (HF's reference is f32), on a
/// tiny random model whose logits amplify small differences: prompt logits within this share
/// of the row's largest magnitude. Measured: 0.159 at worst (the CPU engine in bf16, whose
/// tower runs in f32: 0.056).
const HF_LOGITS_TOL: f32 = 0.2;
/// Along HF's greedy tokens, HF's token at most this share of the largest logit below the
/// CUDA engine's argmax. Measured: 0.053 at worst (the CPU engine in bf16: 0.030).
const HF_GAP_TOL: f32 = 0.08;

/// End to end with the device tower against HF: prompt logits at the reference's positions,
/// and 16 steps along HF's greedy tokens, each HF's token the CUDA engine's argmax or within
/// [`HF_GAP_TOL`] of it.
fn check_against_hf<D: Device>(dev: &Arc<D>, model: &str) {
    let refs = Tensors::open(&fixtures().join(model).join("reference.safetensors"));
    let mut gpu = cuda_engine(dev, model, false);
    let mut cases = 0;
    for case in prompts(model) {
        if case.media.is_empty() {
            continue;
        }
        let what = format!("{model} prompt {}", case.id);
        let n = case.ids.len();
        let logits = gpu
            .forward_logits_media(
                &[chunk(case.ids.clone(), 0, LogitsWanted::All)],
                &chunk_media(&case),
                &[],
            )
            .unwrap();
        let (p, d) = case.worst_logits(&logits, &refs);
        assert!(
            d < HF_LOGITS_TOL,
            "{what}: logits at {p} differ by {d} (relative to the largest)"
        );
        let (delta, hf) = (case.delta(), case.greedy());
        let mut row = logits.row(n - 1).to_vec();
        for (k, &token) in hf.iter().enumerate() {
            let top = row.iter().fold(0f32, |m, x| m.max(x.abs())).max(1.0);
            let gap = (row[best(&row)] - row[token as usize]) / top;
            assert!(
                gap <= HF_GAP_TOL,
                "{what}: at token {k} HF drew {token}, the CUDA engine {} (gap {gap} of the \
                 largest logit)",
                best(&row)
            );
            if k + 1 == hf.len() {
                break;
            }
            let step = [chunk(vec![token], n + k, LogitsWanted::Last)];
            row = last(&gpu.forward_logits_media(&step, &[], &[delta]).unwrap()).to_vec();
        }
        cases += 1;
    }
    assert!(cases >= 3, "{model}: {cases} prompts with media checked");
}

/// Prompt 1 (one image) prefilled in two chunks cut through the image, on a fresh engine:
/// the second chunk's last logits equal those of the whole prompt in one chunk.
fn check_chunked<D: Device>(dev: &Arc<D>, model: &str) {
    let case = prompts(model)
        .into_iter()
        .find(|c| c.media.len() == 1)
        .expect("a prompt with one image");
    let (start, inp) = &case.media[0];
    let cut = start + inp.tokens() / 2 + 1;
    let media = chunk_media(&case);
    let whole = {
        let mut e = cuda_engine(dev, model, false);
        let l = e
            .forward_logits_media(
                &[chunk(case.ids.clone(), 0, LogitsWanted::Last)],
                &media,
                &[],
            )
            .unwrap();
        last(&l).to_vec()
    };
    let mut e = cuda_engine(dev, model, false);
    let first = ChunkMedia {
        len: cut - start,
        ..media[0].clone()
    };
    e.forward_logits_media(
        &[chunk(case.ids[..cut].to_vec(), 0, LogitsWanted::None)],
        &[first],
        &[],
    )
    .unwrap();
    let second = ChunkMedia {
        offset: 0,
        len: start + inp.tokens() - cut,
        item_offset: cut - start,
        ..media[0].clone()
    };
    let l = e
        .forward_logits_media(
            &[chunk(case.ids[cut..].to_vec(), cut, LogitsWanted::Last)],
            &[second],
            &[],
        )
        .unwrap();
    let got = last(&l);
    let tol = tolerance(&whole) / 10.0;
    for (i, (g, w)) in got.iter().zip(&whole).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "{model}: chunked logit {i} is {g}, {w} in one chunk"
        );
    }
}

/// bf16 weights and activations through the tower's blocks, against HF in f32: relative to
/// the largest embedding value (measured: 0.008 at worst).
const EMBED_TOL: f32 = 2e-2;

fn check_vision<D: Device>(dev: &Arc<D>, model: &str) {
    let dir = fixtures();
    let (pre, prep) = (
        Tensors::open(&dir.join("preprocess.safetensors")),
        json(&dir.join("preprocess.json")),
    );
    let refs = Tensors::open(&dir.join(model).join("reference.safetensors"));
    let engine = cuda_engine(dev, model, false);
    let tower = engine.model().vision.as_ref().expect("a vision tower");
    let on_device = engine
        .model()
        .vision_device
        .as_ref()
        .expect("the CUDA engine runs the tower on the device");
    let encode = |inp: &lmi_engine::vision::VisionInput| {
        engine
            .backend()
            .encode_vision(Some(on_device), tower, inp)
            .unwrap()
    };
    let mut checked = 0;
    for name in prep["images"].as_object().unwrap().keys() {
        let Some(inp) = input(&pre, &prep, "image", name, 1.0) else {
            continue;
        };
        let d = max_rel_diff(&encode(&inp), &refs.f32(&format!("image.{name}.embeds")));
        assert!(
            d < EMBED_TOL,
            "{model} {name}: embeddings differ by {d} (relative)"
        );
        checked += 1;
    }
    let video = input(&pre, &prep, "video", "", 1.0).unwrap();
    let d = max_rel_diff(&encode(&video), &refs.f32("video.embeds"));
    assert!(d < EMBED_TOL, "{model} video: embeddings differ by {d}");
    assert!(checked >= 4, "images checked: {checked}");
}

fn check_all<D: Device>(b: &CudaBackend<D>) {
    let dev = b.device();
    check_vision(dev, "qwen2_5_vl");
    check_vision(dev, "qwen2_vl");
    check_language_model(dev, "qwen2_5_vl");
    check_language_model(dev, "qwen2_vl");
    check_against_hf(dev, "qwen2_5_vl");
    check_against_hf(dev, "qwen2_vl");
    check_chunked(dev, "qwen2_5_vl");
}

#[test]
fn qwen_vl_on_cuda_matches_the_cpu_and_hf() {
    on_every_device!(check_all);
}
