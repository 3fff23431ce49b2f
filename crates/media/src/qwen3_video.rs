//! What transformers' `Qwen3VLVideoProcessor` (Qwen3-VL, Qwen3.5) does differently from
//! Qwen2-VL's: which frames it keeps (`sample_frames`: evenly over the clip with
//! `np.linspace`, any count), the size it gives them (a `smart_resize` whose pixel budget
//! counts every frame), and the timestamp its processor writes before each temporal patch
//! (`Qwen3VLProcessor._calculate_timestamps`).

use crate::config::ProcessorConfig;
use crate::error::{MediaError, Result};
use crate::smart_resize::MAX_ASPECT_RATIO;

/// The frame rate transformers assumes when a video's is unknown.
const DEFAULT_VIDEO_FPS: f64 = 24.0;

/// The indices of the frames kept out of `total_frames` recorded at `video_fps`:
/// `cfg.num_frames`, else `int(total / video_fps * cfg.fps)` at least `min_frames`, at most
/// `max_frames` and `total_frames`; then `np.linspace(0, total - 1, n).round()` (half to even).
pub fn sample_frame_indices(
    total_frames: usize,
    video_fps: f32,
    cfg: &ProcessorConfig,
) -> Vec<usize> {
    if total_frames == 0 {
        return Vec::new();
    }
    let video_fps = match f64::from(video_fps) {
        f if f.is_finite() && f > 0.0 => f,
        _ => DEFAULT_VIDEO_FPS,
    };
    let n = match cfg.num_frames {
        Some(n) => n,
        None => {
            let by_fps = (total_frames as f64 / video_fps * f64::from(cfg.fps)) as usize;
            by_fps
                .max(cfg.min_frames)
                .min(cfg.max_frames)
                .min(total_frames)
        }
    };
    linspace_round(total_frames - 1, n.max(1))
}

/// `np.linspace(0, last, n).round().astype(int)`: `i · step` in f64 (the last exactly
/// `last`), rounded half to even.
fn linspace_round(last: usize, n: usize) -> Vec<usize> {
    if n == 1 {
        return vec![0];
    }
    let step = last as f64 / (n - 1) as f64;
    (0..n)
        .map(|i| match i + 1 == n {
            true => last,
            false => (i as f64 * step).round_ties_even() as usize,
        })
        .collect()
}

/// Seconds of each temporal patch as the processor prints them: the frame indices padded to
/// a multiple of `temporal_patch_size` with the last, `index / fps` each, the mean of each
/// patch's first and last.
pub fn timestamps(frame_indices: &[usize], video_fps: f32, temporal_patch_size: usize) -> Vec<f64> {
    let fps = match f64::from(video_fps) {
        f if f.is_finite() && f > 0.0 => f,
        _ => DEFAULT_VIDEO_FPS,
    };
    let t = temporal_patch_size.max(1);
    let mut idx = frame_indices.to_vec();
    if let Some(&last) = idx.last() {
        while !idx.len().is_multiple_of(t) {
            idx.push(last);
        }
    }
    idx.chunks(t)
        .map(|c| (c[0] as f64 / fps + c[c.len() - 1] as f64 / fps) / 2.0)
        .collect()
}

/// The text the processor writes before a temporal patch's `<|vision_start|>`.
pub fn timestamp_text(seconds: f64) -> String {
    // Rust's `{:.1}` rounds as Python's `f"{x:.1f}"` does (the exact binary value, ties to even).
    format!("<{seconds:.1} seconds>")
}

/// The size `(height, width)` every frame of a `frames`-frame video of `height x width` is
/// resized to: `Qwen3VLVideoProcessor`'s `smart_resize`. Sides below `factor` are first scaled
/// up (truncated), each side rounded to a multiple of `factor`; then, if the frames padded to
/// whole temporal patches hold more than `max_pixels` or fewer than `min_pixels` pixels in
/// all, both sides are scaled by the square root of the ratio over the unpadded frames,
/// floored (too many) or ceiled (too few) to multiples of `factor`.
pub fn smart_resize(
    frames: usize,
    height: u32,
    width: u32,
    cfg: &ProcessorConfig,
) -> Result<(u32, u32)> {
    let f = f64::from(cfg.factor());
    let (mut h, mut w) = (f64::from(height), f64::from(width));
    if h == 0.0 || w == 0.0 || f == 0.0 {
        return Err(MediaError::BadSize(format!(
            "cannot resize {width}x{height} frames to multiples of {f}"
        )));
    }
    if h < f || w < f {
        let scale = (f / h).max(f / w);
        (h, w) = ((h * scale).trunc(), (w * scale).trunc());
    }
    let ratio = h.max(w) / h.min(w);
    if ratio > MAX_ASPECT_RATIO {
        return Err(MediaError::BadSize(format!(
            "absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {ratio} \
             ({width}x{height} frames): crop or pad the video"
        )));
    }
    // transformers refuses fewer frames than a temporal patch; they are padded here.
    let t = cfg.temporal_patch_size.max(1) as f64;
    let n = (frames as f64).max(t);
    let t_bar = (n / t).round_ties_even() * t;
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    let (min, max) = (cfg.video_min_pixels as f64, cfg.video_max_pixels as f64);
    if t_bar * h_bar * w_bar > max {
        let beta = (n * h * w / max).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if t_bar * h_bar * w_bar < min {
        let beta = (min / (n * h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar < 1.0 || w_bar < 1.0 || h_bar > f64::from(u32::MAX) || w_bar > f64::from(u32::MAX) {
        return Err(MediaError::BadSize(format!(
            "{width}x{height} frames resize to {w_bar}x{h_bar}: no usable size"
        )));
    }
    Ok((h_bar as u32, w_bar as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_rounds_half_to_even() {
        // np.linspace(0, 7, 4) = 0, 2.333, 4.667, 7.
        assert_eq!(linspace_round(7, 4), [0, 2, 5, 7]);
        // np.linspace(0, 9, 7) = 0, 1.5, 3, 4.5, 6, 7.5, 9 → 0, 2, 3, 4, 6, 8, 9.
        assert_eq!(linspace_round(9, 7), [0, 2, 3, 4, 6, 8, 9]);
    }

    #[test]
    fn timestamps_average_each_temporal_patch() {
        let t = timestamps(&[0, 2, 5], 4.0, 2);
        assert_eq!(t, [0.25, 1.25]);
        assert_eq!(timestamp_text(t[0]), "<0.2 seconds>");
        assert_eq!(timestamp_text(t[1]), "<1.2 seconds>");
    }
}
