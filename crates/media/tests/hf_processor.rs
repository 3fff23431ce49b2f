//! lmi-media against the HF processors themselves: transformers 4.57.6 `Qwen2VLImageProcessor`
//! (slow, PIL) and `Qwen2VLVideoProcessor` on the shared fixtures in tests/fixtures/qwen_vl
//! (see its README.md: generate.py, torch on CPU).

use std::path::{Path, PathBuf};

use lmi_media::{
    ImageLimits, Patches, ProcessorConfig, RgbImage, decode_image, preprocess_image,
    preprocess_video,
};
use safetensors::SafeTensors;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen_vl")
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn f32_le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array, got {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

struct Fixtures {
    json: Value,
    tensors: Vec<u8>,
}

impl Fixtures {
    fn load() -> Self {
        let json = std::fs::read_to_string(dir().join("preprocess.json")).expect("preprocess.json");
        Self {
            json: serde_json::from_str(&json).expect("valid JSON"),
            tensors: std::fs::read(dir().join("preprocess.safetensors"))
                .expect("preprocess.safetensors"),
        }
    }

    /// The tensor's shape and values as f32 (from F32 or U8), if stored.
    fn tensor(&self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        let st = SafeTensors::deserialize(&self.tensors).expect("safetensors");
        let t = st.tensor(name).ok()?;
        let values = match t.dtype() {
            safetensors::Dtype::F32 => t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            safetensors::Dtype::U8 => t.data().iter().map(|&b| f32::from(b)).collect(),
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        Some((t.shape().to_vec(), values))
    }
}

fn decode(file: &str) -> RgbImage {
    let bytes = std::fs::read(dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    decode_image(&bytes, &ImageLimits::default()).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Max |a - b|, after checking the lengths agree.
fn max_abs_diff(what: &str, got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

fn check_patches(
    what: &str,
    p: &Patches,
    entry: &Value,
    grid_key: &str,
    fx: &Fixtures,
    tensor: &str,
) {
    assert_eq!(
        p.grid_thw.to_vec(),
        usizes(&entry[grid_key]),
        "{what}: grid_thw"
    );
    let shape = usizes(&entry["pixel_values_shape"]);
    assert_eq!(
        [p.num_patches(), p.patch_dim()].to_vec(),
        shape,
        "{what}: shape"
    );
    if let Some((stored_shape, want)) = fx.tensor(tensor) {
        assert_eq!(stored_shape, shape, "{what}: stored shape");
        let diff = max_abs_diff(what, &p.pixels, &want);
        assert!(
            diff <= 1e-5,
            "{what}: max abs diff {diff} from HF pixel_values"
        );
    }
}

fn configs() -> Vec<(&'static str, ProcessorConfig)> {
    ["qwen2_5_vl", "qwen2_vl"]
        .into_iter()
        .map(|m| {
            (
                m,
                ProcessorConfig::from_dir(&dir().join(m)).unwrap_or_else(|e| panic!("{m}: {e}")),
            )
        })
        .collect()
}

#[test]
fn the_model_configs_are_read_as_transformers_reads_them() {
    let fx = Fixtures::load();
    let ip = &fx.json["image_processor"];
    for (model, cfg) in configs() {
        assert_eq!(
            cfg.min_pixels,
            ip["min_pixels"].as_u64().unwrap(),
            "{model}"
        );
        assert_eq!(
            cfg.max_pixels,
            ip["max_pixels"].as_u64().unwrap(),
            "{model}"
        );
        assert_eq!(
            cfg.video_min_pixels,
            fx.json["video"]["min_pixels"].as_u64().unwrap(),
            "{model}"
        );
        assert_eq!(
            cfg.video_max_pixels,
            fx.json["video"]["max_pixels"].as_u64().unwrap(),
            "{model}"
        );
        assert_eq!(cfg.patch_size as u64, ip["patch_size"].as_u64().unwrap());
        assert_eq!(cfg.merge_size as u64, ip["merge_size"].as_u64().unwrap());
        assert_eq!(
            cfg.temporal_patch_size as u64,
            ip["temporal_patch_size"].as_u64().unwrap()
        );
    }
}

#[test]
fn every_image_matches_the_hf_image_processor() {
    let fx = Fixtures::load();
    let images = fx.json["images"].as_object().expect("images");
    assert!(
        images.len() >= 5,
        "expected the fixture images, found {}",
        images.len()
    );
    for (model, cfg) in configs() {
        for (name, entry) in images {
            let what = format!("{model} {name}");
            let img = decode(entry["file"].as_str().unwrap());
            assert_eq!(
                [img.width as usize, img.height as usize].to_vec(),
                usizes(&entry["size_wh"]),
                "{what}: size"
            );
            assert_eq!(
                hex(&img.data),
                entry["decoded_rgb_sha256"].as_str().unwrap(),
                "{what}: decoded RGB differs from PIL's"
            );
            let p = preprocess_image(&img, &cfg).unwrap_or_else(|e| panic!("{what}: {e}"));
            check_patches(
                &what,
                &p,
                entry,
                "image_grid_thw",
                &fx,
                &format!("image.{name}.pixel_values"),
            );
            // Beyond the tolerance: the numpy arithmetic is reproduced bit for bit.
            assert_eq!(
                hex(&f32_le(&p.pixels)),
                entry["pixel_values_sha256_f32le"].as_str().unwrap(),
                "{what}: pixel_values not bit-identical"
            );
            if let Some((shape, resized)) = fx.tensor(&format!("image.{name}.resized")) {
                let (h, w) = (shape[0] as u32, shape[1] as u32);
                assert_eq!(
                    usizes(&entry["resized_hw"]),
                    [h as usize, w as usize].to_vec()
                );
                let ours = lmi_media::resize_bicubic(&img, w, h);
                let ours: Vec<f32> = ours.data.iter().map(|&b| f32::from(b)).collect();
                assert_eq!(ours, resized, "{what}: resized pixels differ from PIL's");
            }
        }
    }
}

#[test]
fn the_video_frames_match_the_hf_video_processor() {
    let fx = Fixtures::load();
    let video = &fx.json["video"];
    let frames: Vec<RgbImage> = video["frames"]
        .as_array()
        .expect("video frames")
        .iter()
        .map(|f| decode(f.as_str().unwrap()))
        .collect();
    assert!(frames.len() >= 2);
    for (model, cfg) in configs() {
        let p = preprocess_video(&frames, &cfg).unwrap_or_else(|e| panic!("{model}: {e}"));
        check_patches(
            &format!("{model} video"),
            &p,
            video,
            "video_grid_thw",
            &fx,
            "video.pixel_values",
        );
    }
}
