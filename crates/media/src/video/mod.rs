//! MP4 (H.264) video to the RGB frames the Qwen video processor samples.
//!
//! The file's size is checked first, then the sample counts in its tables, then the track's
//! declared size, before a frame is decoded; each decoded frame's size is checked again. Frames
//! are decoded in order (H.264 frames depend on earlier ones) up to the last sampled one; only the
//! sampled ones are converted to RGB and kept.

mod demux;
mod h264;
mod yuv;

use crate::config::ProcessorConfig;
use crate::decode::RgbImage;
use crate::error::{MediaError, Result};
use crate::sampling::sample_frame_indices;

/// The formats [`decode_video`] accepts, as named in its errors.
pub const ACCEPTED_VIDEO_FORMATS: &str = "MP4 with H.264 video";

/// What an input video may be: checked before decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VideoLimits {
    /// The most encoded bytes.
    pub max_bytes: usize,
    /// The most frames in the video track (before sampling).
    pub max_frames: usize,
    /// The most pixels in a frame, `width * height`.
    pub max_pixels_per_frame: u64,
    /// The longest side of a frame in pixels.
    pub max_side: u32,
    /// The most pixels in all sampled frames together (the RGB kept in memory is three bytes a
    /// pixel).
    pub max_total_pixels: u64,
}

impl Default for VideoLimits {
    /// 100 MiB; 36 000 frames (20 minutes at 30 fps); 3840x2160 a frame; 4096 a side; 300 M
    /// sampled pixels (900 MB of RGB: 768 frames of 640x480, or 144 of 1920x1080).
    fn default() -> Self {
        Self {
            max_bytes: 100 << 20,
            max_frames: 36_000,
            max_pixels_per_frame: 3840 * 2160,
            max_side: 4096,
            max_total_pixels: 300_000_000,
        }
    }
}

/// The sampled frames of a video and what they were sampled from.
#[derive(Clone, Debug)]
pub struct DecodedVideo {
    /// The sampled frames, in display order.
    pub frames: Vec<RgbImage>,
    /// Which frames (display order) these are, as [`sample_frame_indices`] chose them.
    pub frame_indices: Vec<usize>,
    /// The frame rate of the file: frames over duration.
    pub fps: f32,
    /// The frames in the file's video track.
    pub total_frames: usize,
    /// The video's duration in seconds.
    pub duration_s: f32,
}

/// Decodes an MP4's H.264 track, keeping the frames that the default Qwen processor config
/// samples (2 frames a second, 4 to 768, an even count). See [`decode_video_with`].
pub fn decode_video(bytes: &[u8], limits: &VideoLimits) -> Result<DecodedVideo> {
    decode_video_with(bytes, limits, &ProcessorConfig::default())
}

/// Decodes an MP4's H.264 track, keeping the frames [`sample_frame_indices`] chooses with `cfg`.
///
/// Colour: BT.601 limited range (see the `yuv` module), what FFmpeg-based readers (PyAV,
/// torchvision, decord) give for H.264 without colour metadata.
pub fn decode_video_with(
    bytes: &[u8],
    limits: &VideoLimits,
    cfg: &ProcessorConfig,
) -> Result<DecodedVideo> {
    if bytes.len() > limits.max_bytes {
        return Err(MediaError::TooManyBytes {
            what: "video",
            size: bytes.len(),
            limit: limits.max_bytes,
        });
    }
    if bytes.get(4..8).is_none_or(|b| b != b"ftyp") {
        return Err(MediaError::UnsupportedFormat {
            what: "video",
            detail: String::new(),
            accepted: ACCEPTED_VIDEO_FORMATS,
        });
    }
    // Audio tracks have more samples than video ones (AAC: about 47 a second).
    let max_samples = (limits.max_frames as u64).saturating_mul(4).max(10_000);
    let track = demux::video_track(bytes, max_samples)?;
    let total_frames = track.samples.len();
    if total_frames > limits.max_frames {
        return Err(MediaError::BadVideo(format!(
            "the video has {total_frames} frames, more than the limit of {}",
            limits.max_frames
        )));
    }
    let check_size = |width: u32, height: u32| check_frame(limits, width, height);
    if track.width > 0 && track.height > 0 {
        check_size(track.width, track.height)?;
    }
    let frame_indices = sample_frame_indices(total_frames, track.fps, cfg);
    let declared = u64::from(track.width) * u64::from(track.height);
    if declared.saturating_mul(frame_indices.len() as u64) > limits.max_total_pixels {
        return Err(MediaError::BadVideo(format!(
            "{} sampled frames of {}x{} pixels are more than the limit of {} pixels in all: send a shorter or smaller video",
            frame_indices.len(),
            track.width,
            track.height,
            limits.max_total_pixels
        )));
    }
    let frames = h264::decode_frames(bytes, &track, &frame_indices, &check_size)?;
    if let Some(first) = frames.first() {
        if frames
            .iter()
            .any(|f| (f.width, f.height) != (first.width, first.height))
        {
            return Err(MediaError::BadVideo(
                "the frames change size mid-stream".to_string(),
            ));
        }
        let all = u64::from(first.width) * u64::from(first.height) * frames.len() as u64;
        if all > limits.max_total_pixels {
            return Err(MediaError::BadVideo(format!(
                "the sampled frames have {all} pixels in all, more than the limit of {}",
                limits.max_total_pixels
            )));
        }
    }
    Ok(DecodedVideo {
        frames,
        frame_indices,
        fps: track.fps,
        total_frames,
        duration_s: track.duration_s,
    })
}

fn check_frame(limits: &VideoLimits, width: u32, height: u32) -> Result<()> {
    if width == 0 || height == 0 {
        return Err(MediaError::BadVideo(format!(
            "a frame of {width}x{height} pixels has no pixels"
        )));
    }
    if width > limits.max_side
        || height > limits.max_side
        || u64::from(width) * u64::from(height) > limits.max_pixels_per_frame
    {
        return Err(MediaError::TooLarge {
            what: "video frame",
            width,
            height,
            max_side: limits.max_side,
            max_pixels: limits.max_pixels_per_frame,
        });
    }
    Ok(())
}
