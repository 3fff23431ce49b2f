//! Gemma 4's video processor (transformers' `Gemma4VideoProcessor`) and the text its
//! processor writes for a video (`Gemma4Processor.replace_video_token`): `num_frames` frames
//! kept evenly over the clip (`default_sample_indices_fn`: frame `i · total // n`), each sized
//! as an image of at most `max_soft_tokens` soft tokens (70 by default, not the images' 280)
//! and cut into patches as an image is ([`crate::gemma4`]); in the prompt each frame is
//! `MM:SS <boi>` + its soft tokens + `<eoi>`, the frames joined by spaces.
//!
//! transformers resizes video frames with torchvision (bicubic, antialiased) on tensors; this
//! uses Pillow's filter, so a resized frame can differ from transformers' by a unit here and
//! there (frames already at their target size are not resized and match exactly). Its values
//! are torch's: rescaling fused into the normalisation, in f32.

use crate::decode::RgbImage;
use crate::error::{MediaError, Result};
use crate::gemma4::{Gemma4Image, ValueMaps, patchify};
use crate::patches::Patches;

/// `Gemma4VideoProcessor.num_frames`.
pub const DEFAULT_NUM_FRAMES: usize = 32;
/// `Gemma4VideoProcessor.max_soft_tokens`.
pub const DEFAULT_MAX_SOFT_TOKENS: usize = 70;
/// The frame rate transformers assumes when a video's is unknown.
const DEFAULT_VIDEO_FPS: f64 = 24.0;

/// `Gemma4VideoProcessor`'s settings (its own, beside the image processor's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemma4Video {
    /// Each frame's soft-token budget and pooling.
    pub frame: Gemma4Image,
    /// Frames kept (32).
    pub num_frames: usize,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    /// On by default, with mean 0 and std 1: `x / 255` in f32.
    pub do_normalize: bool,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
}

/// The indices of the frames kept out of `total_frames`: `i · total // n` for `n` =
/// `num_frames`. transformers refuses a clip of fewer frames than `num_frames`; here such a
/// clip keeps every frame.
pub fn sample_frame_indices(total_frames: usize, num_frames: usize) -> Vec<usize> {
    let n = num_frames.min(total_frames);
    (0..n).map(|i| i * total_frames / n).collect()
}

/// A frame's timestamp as the processor writes it: `f"{int(s // 60):02d}:{int(s % 60):02d}"`
/// of `s = index / fps` (24 fps when the video's is unknown).
pub fn timestamp_text(frame_index: usize, video_fps: f32) -> String {
    let fps = match f64::from(video_fps) {
        f if f.is_finite() && f > 0.0 => f,
        _ => DEFAULT_VIDEO_FPS,
    };
    let s = frame_index as f64 / fps;
    format!(
        "{:02}:{:02}",
        (s / 60.0).floor() as u64,
        (s % 60.0).floor() as u64
    )
}

/// The sampled frames (all of one size) as `Gemma4VideoProcessor` prepares them: `grid_thw`
/// is `[frames, rows, columns]` of patches, `pixels` the frames' patches one frame after
/// another (each as [`crate::gemma4::preprocess`] orders an image's; padding rows left out).
pub fn preprocess(frames: &[RgbImage], patch_size: usize, v: Gemma4Video) -> Result<Patches> {
    let map = value_maps(&v);
    let mut pixels = Vec::new();
    let mut grid = None;
    for (i, f) in frames.iter().enumerate() {
        let (p, rows, cols) = patchify(f, patch_size, v.frame, v.do_resize, &map)?;
        if grid.is_some_and(|g| g != (rows, cols)) {
            return Err(MediaError::BadVideo(format!(
                "frame {i} makes a different patch grid from frame 0: all frames must have one size"
            )));
        }
        grid = Some((rows, cols));
        pixels.extend_from_slice(&p);
    }
    let (rows, cols) =
        grid.ok_or_else(|| MediaError::BadVideo("the video has no frames".to_string()))?;
    Ok(Patches {
        pixels,
        grid_thw: [frames.len(), rows, cols],
    })
}

/// torch's arithmetic (`rescale_and_normalize` on f32 tensors): with both steps, the mean and
/// std scaled by `1 / rescale_factor` and `(x - mean) / std`.
fn value_maps(v: &Gemma4Video) -> ValueMaps {
    std::array::from_fn(|c| {
        let (mean, std) = (v.image_mean[c], v.image_std[c]);
        std::array::from_fn(|x| {
            let x = x as f32;
            match (v.do_rescale, v.do_normalize) {
                (true, true) => {
                    let scale = (1.0 / v.rescale_factor) as f32;
                    (x - mean * scale) / (std * scale)
                }
                (true, false) => x * v.rescale_factor as f32,
                (false, true) => (x - mean) / std,
                (false, false) => x,
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_spread_as_transformers_spreads_them() {
        // np.arange(4) * 8 // 4.
        assert_eq!(sample_frame_indices(8, 4), [0, 2, 4, 6]);
        // np.arange(32) * 100 // 32: 0, 3, 6, 9, 12, 15, 18, 21, 25, ...
        let idx = sample_frame_indices(100, 32);
        assert_eq!(idx.len(), 32);
        assert_eq!(&idx[..9], &[0, 3, 6, 9, 12, 15, 18, 21, 25]);
        // Fewer frames than num_frames: all of them.
        assert_eq!(sample_frame_indices(3, 32), [0, 1, 2]);
        assert!(sample_frame_indices(0, 32).is_empty());
    }

    #[test]
    fn timestamps_are_minutes_and_seconds() {
        assert_eq!(timestamp_text(0, 2.0), "00:00");
        assert_eq!(timestamp_text(3, 2.0), "00:01");
        assert_eq!(timestamp_text(125 * 30 + 29, 30.0), "02:05");
        // Unknown rate: 24 frames a second.
        assert_eq!(timestamp_text(48, 0.0), "00:02");
    }

    #[test]
    fn values_are_x_over_255_in_f32() {
        let v = Gemma4Video {
            frame: Gemma4Image {
                max_soft_tokens: 70,
                pooling_kernel_size: 3,
            },
            num_frames: 32,
            do_resize: true,
            do_rescale: true,
            rescale_factor: 1.0 / 255.0,
            do_normalize: true,
            image_mean: [0.0; 3],
            image_std: [1.0; 3],
        };
        let m = value_maps(&v);
        for (x, v) in m[1].iter().enumerate() {
            assert_eq!(*v, x as f32 / 255.0);
        }
    }
}
