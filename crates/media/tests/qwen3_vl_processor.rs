//! lmi-media against transformers 5.25's Qwen3-VL processing (tests/fixtures/qwen3_vl, its
//! generate.py): `Qwen2VLImageProcessorPil` with Qwen3-VL's settings (patches of 16, mean and
//! std 0.5) and `Qwen3VLVideoProcessor`, bit for bit on the fixture's images and video frames.

use std::path::{Path, PathBuf};

use lmi_media::{ImageLimits, ProcessorConfig, decode_image, preprocess_image, preprocess_video};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_vl")
}

fn sha_f32le(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode(file: &str) -> lmi_media::RgbImage {
    let bytes = std::fs::read(dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    decode_image(&bytes, &ImageLimits::default()).unwrap()
}

fn reference() -> Value {
    let text = std::fs::read_to_string(dir().join("qwen3_vl/reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn images_and_video_frames_match_the_processor_bit_for_bit() {
    let cfg = ProcessorConfig::from_dir(&dir().join("qwen3_vl")).unwrap();
    assert_eq!((cfg.patch_size, cfg.merge_size, cfg.factor()), (16, 2, 32));
    assert_eq!(cfg.image_mean, [0.5; 3]);
    let pre = &reference()["preprocess"];
    let images = pre["images"].as_object().unwrap();
    assert_eq!(images.len(), 2);
    for (name, want) in images {
        let p = preprocess_image(&decode(want["file"].as_str().unwrap()), &cfg).unwrap();
        let grid: Vec<usize> = serde_json::from_value(want["image_grid_thw"].clone()).unwrap();
        assert_eq!(p.grid_thw.to_vec(), grid, "{name}");
        assert_eq!(
            sha_f32le(&p.pixels),
            want["pixel_values_sha256_f32le"],
            "{name}: pixel values"
        );
    }
    let video = &pre["video"];
    let frames: Vec<_> = video["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| decode(f.as_str().unwrap()))
        .collect();
    let p = preprocess_video(&frames, &cfg).unwrap();
    let grid: Vec<usize> = serde_json::from_value(video["video_grid_thw"].clone()).unwrap();
    assert_eq!(p.grid_thw.to_vec(), grid);
    assert_eq!(sha_f32le(&p.pixels), video["pixel_values_sha256_f32le"]);
}

/// `Qwen3VLVideoProcessor.sample_frames`, its `smart_resize` and `Qwen3VLProcessor`'s
/// timestamps, on the clips the generator tabled (`reference.json` → `video_rules`).
#[test]
fn video_sampling_sizes_and_timestamps_match_transformers() {
    let cfg = ProcessorConfig::from_dir(&dir().join("qwen3_vl")).unwrap();
    assert_eq!(cfg.video_processor, lmi_media::VideoProcessor::Qwen3Vl);
    let rules = &reference()["video_rules"];
    for case in rules["sampling"].as_array().unwrap() {
        let total = case["total_frames"].as_u64().unwrap() as usize;
        let fps = case["fps"].as_f64().unwrap() as f32;
        let idx = lmi_media::sample_frame_indices(total, fps, &cfg);
        let want: Vec<usize> = serde_json::from_value(case["indices"].clone()).unwrap();
        assert_eq!(idx, want, "{case}");
        let stamps = lmi_media::qwen3_video::timestamps(&idx, fps, cfg.temporal_patch_size);
        let texts: Vec<String> = stamps
            .iter()
            .map(|&s| lmi_media::qwen3_video::timestamp_text(s))
            .collect();
        let want: Vec<String> = serde_json::from_value(case["texts"].clone()).unwrap();
        assert_eq!(texts, want, "{case}");
    }
    for case in rules["smart_resize"].as_array().unwrap() {
        let n = |k: &str| case[k].as_u64().unwrap();
        let got = lmi_media::qwen3_video::smart_resize(
            n("frames") as usize,
            n("height") as u32,
            n("width") as u32,
            &cfg,
        )
        .unwrap();
        let want: Vec<u32> = serde_json::from_value(case["resized"].clone()).unwrap();
        assert_eq!([got.0, got.1].to_vec(), want, "{case}");
    }
}
