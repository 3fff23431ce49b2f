//! lmi-media against numbers computed by Pillow 13 and transformers 4.57 (fixtures/generate.py).

use std::path::{Path, PathBuf};

use lmi_media::{
    ImageLimits, ProcessorConfig, RgbImage, decode_image, resize_bicubic, sample_frame_indices,
    smart_resize,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn json(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name)).expect("fixture JSON");
    serde_json::from_str(&text).expect("valid JSON")
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn load(name: &str) -> RgbImage {
    let bytes = std::fs::read(fixture(name)).expect("fixture image");
    decode_image(&bytes, &ImageLimits::default()).expect("decodes")
}

#[test]
fn bicubic_resize_is_byte_for_byte_pillow() {
    let fx = json("resize.json");
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() >= 15);
    let mut failures = Vec::new();
    for case in cases {
        let src = load(case["source"].as_str().unwrap());
        let (w, h) = (
            case["width"].as_u64().unwrap() as u32,
            case["height"].as_u64().unwrap() as u32,
        );
        let out = resize_bicubic(&src, w, h);
        assert_eq!((out.width, out.height), (w, h));
        if sha256_hex(&out.data) != case["sha256"].as_str().unwrap() {
            failures.push(format!(
                "{} {}x{} -> {w}x{h}",
                case["source"], src.width, src.height
            ));
        }
    }
    assert!(failures.is_empty(), "differs from PIL: {failures:#?}");
}

#[test]
fn smart_resize_matches_transformers() {
    let fx = json("smart_resize.json");
    let cases = fx["cases"].as_array().unwrap();
    assert!(cases.len() > 300);
    for case in cases {
        let get = |k: &str| case[k].as_u64().unwrap();
        let got = smart_resize(
            get("height") as u32,
            get("width") as u32,
            get("factor") as u32,
            get("min_pixels"),
            get("max_pixels"),
        );
        match (&case["out"], got) {
            (Value::Array(hw), Ok((h, w))) => assert_eq!(
                [u64::from(h), u64::from(w)],
                [hw[0].as_u64().unwrap(), hw[1].as_u64().unwrap()],
                "{case}"
            ),
            (Value::Null, Err(e)) => {
                let expected = case["error"].as_str().unwrap();
                // transformers: "absolute aspect ratio must be smaller than 200, got 201.0"
                assert!(expected.contains("aspect ratio"), "{case}");
                assert!(
                    e.to_string()
                        .contains("aspect ratio must be smaller than 200"),
                    "{e}"
                );
            }
            (want, got) => panic!("{case}: expected {want}, got {got:?}"),
        }
    }
}

#[test]
fn decoding_gives_what_the_hf_processor_sees() {
    let fx = json("decode.json");
    let cases = fx["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let file = case["file"].as_str().unwrap();
        let img = load(&format!("decode/{file}"));
        assert_eq!(
            (u64::from(img.width), u64::from(img.height)),
            (
                case["width"].as_u64().unwrap(),
                case["height"].as_u64().unwrap()
            ),
            "{file}"
        );
        if sha256_hex(&img.data) != case["sha256"].as_str().unwrap() {
            failures.push(file.to_string());
        }
    }
    assert!(failures.is_empty(), "differs from PIL: {failures:?}");
}

#[test]
fn frame_sampling_matches_the_qwen_video_processor() {
    let fx = json("sampling.json");
    let cfg = ProcessorConfig::default();
    for case in fx["cases"].as_array().unwrap() {
        let total = case["total_frames"].as_u64().unwrap() as usize;
        let fps = case["video_fps"].as_f64().unwrap() as f32;
        let want: Vec<usize> = case["indices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(sample_frame_indices(total, fps, &cfg), want, "{case}");
    }
}
