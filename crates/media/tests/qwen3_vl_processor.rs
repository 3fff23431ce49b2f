//! lmi-media against transformers 5.25's Qwen3-VL processing (tests/fixtures/qwen3_vl, its
//! generate.py): `Qwen2VLImageProcessorPil` with Qwen3-VL's settings (patches of 16, mean and
//! std 0.5) and `Qwen3VLVideoProcessor`, bit for bit on the fixture's images and video frames
//! (not resized: what the video processor does beyond lmi's Qwen2-VL rules does not show).

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

