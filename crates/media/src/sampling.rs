//! Which frames of a video are kept: `Qwen2VLVideoProcessor.sample_frames` (transformers 4.57
//! and 5.x alike) with the Qwen defaults (2 frames a second, 4 to 768 frames, a multiple of
//! `temporal_patch_size`), or Qwen3-VL's rule ([`crate::qwen3_video`]) where the config names
//! its processor.

use crate::config::ProcessorConfig;

/// The indices (ascending) of the frames to keep out of `total_frames` frames recorded at
/// `video_fps` frames a second.
///
/// With `cfg.num_frames`: that many, rounded (half to even) to a multiple of
/// `temporal_patch_size`. Otherwise `total_frames / video_fps * cfg.fps` frames, at least
/// `min_frames`, at most `max_frames` and `total_frames` (both floored to a multiple of
/// `temporal_patch_size`), floored to a multiple of `temporal_patch_size`. The frames are then
/// `torch.arange(0, total, total / n).int()`: evenly spaced from the first, each index truncated.
///
/// Where transformers raises instead, this returns something usable: fewer frames than
/// `temporal_patch_size` (or a bad `video_fps`) keep every frame (the patches then repeat the
/// last), and a `num_frames` above `total_frames` keeps every frame.
pub fn sample_frame_indices(
    total_frames: usize,
    video_fps: f32,
    cfg: &ProcessorConfig,
) -> Vec<usize> {
    if let Some(v) = cfg.gemma4_video {
        return crate::gemma4_video::sample_frame_indices(total_frames, v.num_frames);
    }
    if cfg.video_processor == crate::config::VideoProcessor::Qwen3Vl {
        return crate::qwen3_video::sample_frame_indices(total_frames, video_fps, cfg);
    }
    let t = cfg.temporal_patch_size.max(1);
    let all = || (0..total_frames).collect::<Vec<_>>();
    let num = match cfg.num_frames {
        Some(n) => ((n as f64 / t as f64).round_ties_even() as usize) * t,
        None => {
            if !(video_fps.is_finite() && video_fps > 0.0) {
                return all();
            }
            let max_frames = (cfg.max_frames.min(total_frames) / t * t) as f64;
            let n = total_frames as f64 / f64::from(video_fps) * f64::from(cfg.fps);
            let n = n
                .max(cfg.min_frames as f64)
                .min(max_frames)
                .min(total_frames as f64);
            ((n / t as f64).floor() as usize) * t
        }
    };
    if num == 0 || num > total_frames {
        return all();
    }
    torch_arange_int(total_frames, total_frames as f64 / num as f64)
}

/// `torch.arange(0, end, step).int()` on the CPU: `ceil(end / step)` values, each computed as
/// `step * i` in `f64`, stored as `f32`, truncated. Indices are clamped below `end` (a step that
/// rounds down could otherwise reach it).
fn torch_arange_int(end: usize, step: f64) -> Vec<usize> {
    let len = (end as f64 / step).ceil() as usize;
    (0..len)
        .map(|i| ((step * i as f64) as f32) as usize)
        .map(|i| i.min(end.saturating_sub(1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_frames_a_second_of_a_30_fps_clip() {
        let cfg = ProcessorConfig::default();
        // 10 s at 30 fps: 20 frames, every 15th.
        let idx = sample_frame_indices(300, 30.0, &cfg);
        assert_eq!(idx, (0..20).map(|i| i * 15).collect::<Vec<_>>());
    }

    #[test]
    fn short_clips_take_min_frames() {
        let cfg = ProcessorConfig::default();
        // 1 s at 10 fps: 2 frames by fps, raised to min_frames 4: 10 / 4 = 2.5 apart.
        assert_eq!(sample_frame_indices(10, 10.0, &cfg), vec![0, 2, 5, 7]);
        // Fewer frames than a temporal patch: all of them.
        assert_eq!(sample_frame_indices(1, 10.0, &cfg), vec![0]);
        assert_eq!(sample_frame_indices(3, 10.0, &cfg), vec![0, 1]);
    }
}
