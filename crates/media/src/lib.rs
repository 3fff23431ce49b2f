//! Image and video input for vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), prepared exactly as
//! the HuggingFace processor prepares it, so that the model sees the numbers it was trained on.
//!
//! - [`decode_image`]: PNG, JPEG, WebP, GIF to RGB8, refusing oversize input from the header
//!   before decoding (decompression bombs), converting to RGB as the HF processor does.
//! - [`preprocess_image`], [`preprocess_video`]: [`smart_resize`], [`resize_bicubic`] (Pillow's
//!   bicubic filter, bit for bit), rescaling, normalisation, patches in the model's order.
//! - [`sample_frame_indices`]: which frames of a video the Qwen video processor keeps.
//! - [`decode_video`] (feature `video`): MP4/H.264 to sampled RGB frames.
//! - [`parse_data_url`], [`content_hash`], and [`policy`] for fetching media URLs safely.
//!
//! No I/O but reading a model's config files; no async runtime.
//!
//! Two dependencies compile C/C++ with `cc` (a C and C++ compiler is all they need: no nasm, no
//! cmake, no system library): MozJPEG (libjpeg-turbo's decoder, for JPEG decoded exactly as Pillow
//! decodes it) and, with the `video` feature (on by default), Cisco's OpenH264.

mod config;
mod data_url;
mod decode;
mod error;
pub mod gemma4;
pub mod gemma4_video;
mod hash;
mod jpeg;
mod patches;
pub mod policy;
pub mod qwen3_video;
mod resize;
mod sampling;
mod smart_resize;
mod to_rgb;
#[cfg(feature = "video")]
mod video;

pub use config::{OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ProcessorConfig, VideoProcessor};
pub use data_url::parse_data_url;
pub use decode::{ACCEPTED_IMAGE_FORMATS, ImageLimits, RgbImage, decode_image};
pub use error::{MediaError, Result};
pub use hash::content_hash;
pub use patches::{Patches, preprocess_image, preprocess_video};
pub use resize::resize_bicubic;
pub use sampling::sample_frame_indices;
pub use smart_resize::{MAX_ASPECT_RATIO, smart_resize};
#[cfg(feature = "video")]
pub use video::{
    ACCEPTED_VIDEO_FORMATS, DecodedVideo, VideoLimits, decode_video, decode_video_with,
};
