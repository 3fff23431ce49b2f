//! MP4/H.264 decoding against PyAV (FFmpeg) on a clip made by fixtures/generate.py.
#![cfg(feature = "video")]

use std::path::Path;

use lmi_media::{
    ImageLimits, MediaError, ProcessorConfig, VideoLimits, decode_image, decode_video,
    decode_video_with, preprocess_video,
};
use serde_json::Value;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .expect("fixture")
}

#[test]
fn sampled_frames_match_pyav_within_the_colour_conversion() {
    let meta: Value = serde_json::from_slice(&fixture("video/moving.json")).unwrap();
    let v = decode_video(&fixture("video/moving.mp4"), &VideoLimits::default()).unwrap();
    assert_eq!(
        v.total_frames as u64,
        meta["total_frames"].as_u64().unwrap()
    );
    assert!(
        (f64::from(v.fps) - meta["fps"].as_f64().unwrap()).abs() < 1e-4,
        "{}",
        v.fps
    );
    let want: Vec<usize> = meta["sampled_indices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(v.frame_indices, want);
    assert_eq!(v.frames.len(), want.len());

    let strip = decode_image(
        &fixture("video/moving_sampled_pyav.png"),
        &ImageLimits::default(),
    )
    .unwrap();
    let frame_bytes = strip.data.len() / want.len();
    for (i, frame) in v.frames.iter().enumerate() {
        assert_eq!((frame.width, frame.height), (96, 64));
        let pyav = &strip.data[i * frame_bytes..(i + 1) * frame_bytes];
        let diffs: Vec<i32> = frame
            .data
            .iter()
            .zip(pyav)
            .map(|(a, b)| (i32::from(*a) - i32::from(*b)).abs())
            .collect();
        let max = diffs.iter().copied().max().unwrap_or(0);
        let mean = diffs.iter().sum::<i32>() as f64 / diffs.len() as f64;
        // A wrong frame or a misdecoded block differs by tens of levels; the BT.601 arithmetic of
        // swscale and ours by one or two.
        assert!(max <= 2 && mean < 1.0, "frame {i}: max {max}, mean {mean}");
    }

    let p = preprocess_video(&v.frames, &ProcessorConfig::default()).unwrap();
    assert_eq!(p.grid_thw[0], 3);
}

#[test]
fn decoding_stops_at_the_last_sampled_frame() {
    let cfg = ProcessorConfig {
        num_frames: Some(2),
        ..ProcessorConfig::default()
    };
    let v = decode_video_with(&fixture("video/moving.mp4"), &VideoLimits::default(), &cfg).unwrap();
    assert_eq!(v.frame_indices, [0, 15]);
    assert_eq!(v.frames.len(), 2);
}

#[test]
fn limits_are_checked_before_decoding() {
    let mp4 = fixture("video/moving.mp4");
    let limits = VideoLimits {
        max_bytes: mp4.len() - 1,
        ..VideoLimits::default()
    };
    assert!(matches!(
        decode_video(&mp4, &limits),
        Err(MediaError::TooManyBytes { .. })
    ));
    let limits = VideoLimits {
        max_frames: 29,
        ..VideoLimits::default()
    };
    let e = decode_video(&mp4, &limits).unwrap_err();
    assert!(e.to_string().contains("30 frames"), "{e}");
    let limits = VideoLimits {
        max_side: 95,
        ..VideoLimits::default()
    };
    assert!(matches!(
        decode_video(&mp4, &limits),
        Err(MediaError::TooLarge {
            width: 96,
            height: 64,
            ..
        })
    ));
    let limits = VideoLimits {
        max_total_pixels: 96 * 64 * 5,
        ..VideoLimits::default()
    };
    assert!(matches!(
        decode_video(&mp4, &limits),
        Err(MediaError::BadVideo(_))
    ));
}

#[test]
fn other_input_is_refused() {
    let png = fixture("decode/rgb.png");
    let e = decode_video(&png, &VideoLimits::default()).unwrap_err();
    assert!(matches!(e, MediaError::UnsupportedFormat { .. }));
    assert!(e.to_string().contains("MP4 with H.264"), "{e}");
    assert!(matches!(
        decode_video(b"", &VideoLimits::default()),
        Err(MediaError::UnsupportedFormat { .. })
    ));
}

#[test]
fn truncated_and_corrupt_files_are_errors_not_crashes() {
    let mp4 = fixture("video/moving.mp4");
    for len in [12, 40, mp4.len() / 3, mp4.len() / 2, mp4.len() - 100] {
        assert!(
            decode_video(&mp4[..len], &VideoLimits::default()).is_err(),
            "cut to {len}"
        );
    }
    for at in (8..mp4.len()).step_by(61) {
        let mut corrupt = mp4.clone();
        corrupt[at] ^= 0xa5;
        let _ = decode_video(&corrupt, &VideoLimits::default());
    }
}
