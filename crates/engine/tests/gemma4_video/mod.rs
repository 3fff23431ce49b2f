//! The Gemma 4 vision fixtures' video (`tests/fixtures/gemma4/vision*/video/`), as the server
//! reads it: shared by the CPU's and the CUDA engine's tests.

use std::path::Path;
use std::sync::Arc;

use lmi_engine::vision::{MediaKind, VisionInput};

/// The video's sampled frames: the PNG frames decoded, the frames `Gemma4VideoProcessor`
/// keeps (their indices), through the model's video processor; each frame an item of its own
/// (`grid_thw` `[1, rows, columns]`).
pub fn frames(d: &Path) -> (Vec<usize>, Vec<Arc<VisionInput>>) {
    let cfg = lmi_media::ProcessorConfig::from_dir(d).unwrap();
    assert!(
        cfg.gemma4_video.is_some(),
        "the config names Gemma 4's video processor"
    );
    let frames: Vec<_> = (0..8)
        .map(|i| {
            let bytes = std::fs::read(d.join(format!("video/frame_{i:03}.png"))).unwrap();
            lmi_media::decode_image(&bytes, &lmi_media::ImageLimits::default()).unwrap()
        })
        .collect();
    let indices = lmi_media::sample_frame_indices(frames.len(), 2.0, &cfg);
    let kept: Vec<_> = indices.iter().map(|&i| frames[i].clone()).collect();
    let p = lmi_media::preprocess_video(&kept, &cfg).unwrap();
    let [n, rows, cols] = p.grid_thw;
    let per = p.pixels.len() / n;
    let items = (0..n)
        .map(|k| {
            Arc::new(VisionInput {
                kind: MediaKind::Video,
                grid_thw: [1, rows, cols],
                pixels: p.pixels[k * per..(k + 1) * per].to_vec(),
                merge_size: cfg.merge_size,
                t_scale: 1.0,
            })
        })
        .collect();
    (indices, items)
}

/// The video prompt of `reference.json` (`r`): its ids, and where each frame's run of video
/// tokens starts.
pub fn prompt(r: &serde_json::Value) -> (Vec<u32>, Vec<usize>) {
    let v = &r["video"];
    let ids: Vec<u32> = serde_json::from_value(v["input_ids"].clone()).unwrap();
    let token = r["video_token_id"].as_u64().unwrap() as u32;
    let starts = (0..ids.len())
        .filter(|&i| ids[i] == token && (i == 0 || ids[i - 1] != token))
        .collect();
    (ids, starts)
}
