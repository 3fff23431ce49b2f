//! Shared by the Qwen3-VL tests: the fixture (tests/fixtures/qwen3_vl, written by its
//! generate.py with HF transformers 5.25), its prompts with their media made into items by
//! `lmi_media` (a video becomes one item per temporal patch, as the Qwen3-VL processor lays it
//! out between timestamps).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmi_engine::vision::mrope::item_delta;
use lmi_engine::vision::{MediaKind, VisionInput};
use lmi_engine::{ChunkMedia, DType};
use serde_json::Value;

use crate::qwen_vl_common::{Tensors, json, options, pixel_hash};

pub fn fixtures() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_vl");
    if built.is_dir() {
        built
    } else {
        PathBuf::from("tests/fixtures/qwen3_vl")
    }
}

pub fn load(model: &str) -> lmi_engine::Engine<lmi_engine::cpu::CpuBackend> {
    lmi_engine::load_cpu(&fixtures().join(model), &options(DType::F32)).unwrap()
}

pub fn refs(model: &str) -> (Value, Tensors) {
    let d = fixtures().join(model);
    (
        json(&d.join("reference.json")),
        Tensors::open(&d.join("reference.safetensors")),
    )
}

fn read(file: &str) -> lmi_media::RgbImage {
    let bytes = std::fs::read(fixtures().join(file)).unwrap();
    lmi_media::decode_image(&bytes, &lmi_media::ImageLimits::default()).unwrap()
}

/// An image of the fixture as the model's processor makes it.
pub fn image(model: &str, name: &str) -> VisionInput {
    let cfg = lmi_media::ProcessorConfig::from_dir(&fixtures().join(model)).unwrap();
    let p = lmi_media::preprocess_image(&read(&format!("media/{name}.png")), &cfg).unwrap();
    VisionInput {
        kind: MediaKind::Image,
        grid_thw: p.grid_thw,
        pixels: p.pixels,
        merge_size: 2,
        t_scale: 1.0,
    }
}

/// The fixture's video (8 PNG frames) as one item of all its temporal patches.
pub fn video(model: &str) -> VisionInput {
    let cfg = lmi_media::ProcessorConfig::from_dir(&fixtures().join(model)).unwrap();
    let frames: Vec<_> = (0..8)
        .map(|i| read(&format!("media/video/frame_{i:03}.png")))
        .collect();
    let p = lmi_media::preprocess_video(&frames, &cfg).unwrap();
    VisionInput {
        kind: MediaKind::Video,
        grid_thw: p.grid_thw,
        pixels: p.pixels,
        merge_size: 2,
        t_scale: 1.0,
    }
}

/// A video's temporal patches as items of one each (grid `[1, h, w]`).
pub fn frames_of(v: &VisionInput) -> Vec<VisionInput> {
    let [t, h, w] = v.grid_thw;
    let per = v.pixels.len() / t.max(1);
    (0..t)
        .map(|k| VisionInput {
            grid_thw: [1, h, w],
            pixels: v.pixels[k * per..(k + 1) * per].to_vec(),
            ..v.clone()
        })
        .collect()
}

/// One prompt of the fixture: its token ids, and its media runs (each an item) at their
/// first placeholder.
pub struct Case {
    pub id: u64,
    pub ids: Vec<u32>,
    pub media: Vec<(usize, Arc<VisionInput>)>,
    pub reference: Value,
}

impl Case {
    pub fn delta(&self) -> i64 {
        self.media.iter().map(|(_, m)| item_delta(m)).sum()
    }

    pub fn greedy(&self) -> Vec<u32> {
        serde_json::from_value(self.reference["greedy_tokens"].clone()).unwrap()
    }

    pub fn chunk_media(&self, chunk: usize, from: usize, to: usize) -> Vec<ChunkMedia> {
        self.media
            .iter()
            .filter(|(s, _)| *s >= from && *s < to)
            .map(|(start, inp)| ChunkMedia {
                chunk,
                offset: start - from,
                len: inp.tokens(),
                item_offset: 0,
                hash: pixel_hash(inp),
                input: Some(inp.clone()),
            })
            .collect()
    }
}

pub fn cases(model: &str) -> Vec<Case> {
    let (r, _) = refs(model);
    let mut out = Vec::new();
    for p in r["prompts"].as_array().unwrap() {
        let mut items: Vec<VisionInput> = Vec::new();
        for part in p["content"].as_array().unwrap() {
            match (part[0].as_str().unwrap(), part[1].as_str().unwrap()) {
                ("image", file) => items.push(image(model, file.trim_end_matches(".png"))),
                ("video", _) => items.extend(frames_of(&video(model))),
                _ => {}
            }
        }
        let runs = p["media"].as_array().unwrap();
        assert_eq!(runs.len(), items.len(), "prompt {}", p["id"]);
        let media = runs
            .iter()
            .zip(items)
            .map(|(run, inp)| {
                let start = run["pad_start"].as_u64().unwrap() as usize;
                let end = run["pad_end"].as_u64().unwrap() as usize;
                assert_eq!(end - start, inp.tokens(), "prompt {}", p["id"]);
                (start, Arc::new(inp))
            })
            .collect();
        out.push(Case {
            id: p["id"].as_u64().unwrap(),
            ids: serde_json::from_value(p["input_ids"].clone()).unwrap(),
            media,
            reference: p.clone(),
        });
    }
    out
}
