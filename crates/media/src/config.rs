//! The preprocessor settings, read from a model's `preprocessor_config.json` (and
//! `video_preprocessor_config.json` where the model has one), with transformers' defaults for
//! `Qwen2VLImageProcessor` and `Qwen2VLVideoProcessor` where a key is absent.

use std::path::Path;

use serde::Deserialize;

use crate::error::{MediaError, Result};

/// OpenAI CLIP's mean, transformers' `OPENAI_CLIP_MEAN` (written as transformers writes it).
#[allow(clippy::excessive_precision)]
pub const OPENAI_CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// OpenAI CLIP's standard deviation, transformers' `OPENAI_CLIP_STD`.
#[allow(clippy::excessive_precision)]
pub const OPENAI_CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];

/// Which of transformers' Qwen video processors a model uses: they keep, size and lay out
/// frames differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VideoProcessor {
    /// `Qwen2VLVideoProcessor` (Qwen2-VL, Qwen2.5-VL): frames at `fps` a second, an even
    /// count; each frame's own pixel bounds; the video is one run of placeholders.
    Qwen2Vl,
    /// `Qwen3VLVideoProcessor` (Qwen3-VL, Qwen3.5): frames spread evenly (`np.linspace`); a
    /// pixel budget over all frames; each temporal patch its own run of placeholders after a
    /// `<t seconds>` timestamp ([`crate::qwen3_video`]).
    Qwen3Vl,
    /// `Gemma4VideoProcessor`: `num_frames` frames spread evenly, each sized and cut as an
    /// image of at most its own `max_soft_tokens`; each frame its own boi/eoi run after an
    /// `MM:SS` timestamp ([`crate::gemma4_video`], [`ProcessorConfig::gemma4_video`]).
    Gemma4,
}

/// How images and videos are turned into vision patches (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessorConfig {
    /// Images: the fewest pixels after resizing (`size.shortest_edge`, or `min_pixels`).
    pub min_pixels: u64,
    /// Images: the most pixels after resizing (`size.longest_edge`, or `max_pixels`).
    pub max_pixels: u64,
    /// The side of a vision patch in pixels (14).
    pub patch_size: usize,
    /// Frames per patch (2): an image is its one frame repeated.
    pub temporal_patch_size: usize,
    /// Patches merged into one token along each side (2).
    pub merge_size: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// 1/255.
    pub rescale_factor: f64,
    pub do_resize: bool,
    pub do_rescale: bool,
    pub do_normalize: bool,
    /// Informational: decoding here always gives RGB.
    pub do_convert_rgb: bool,
    /// Videos: the fewest pixels of a frame after resizing.
    pub video_min_pixels: u64,
    /// Videos: the most pixels of a frame after resizing.
    pub video_max_pixels: u64,
    /// Frames sampled per second of video by [`crate::sample_frame_indices`] (2, as the Qwen
    /// processors and qwen-vl-utils assume when the config says `null`).
    pub fps: f32,
    /// A fixed number of frames to sample instead of `fps` (rounded to `temporal_patch_size`).
    pub num_frames: Option<usize>,
    /// The fewest frames sampled (4).
    pub min_frames: usize,
    /// The most frames sampled (768).
    pub max_frames: usize,
    /// Informational: whether the HF video processor samples by itself (`false` for
    /// Qwen2-VL: the caller samples, as the server does with [`crate::sample_frame_indices`]).
    pub do_sample_frames: bool,
    /// The video processor's rules (from `video_processor_type` or `processor_class`).
    pub video_processor: VideoProcessor,
    /// Gemma 4's image processor (`image_processor_type` `Gemma4ImageProcessor`): its own
    /// resizing and patch order ([`crate::gemma4`]); None for the Qwen processors.
    pub gemma4: Option<crate::gemma4::Gemma4Image>,
    /// Gemma 4's video processor (`Gemma4VideoProcessor`), whose settings are its own (70
    /// soft tokens a frame, 32 frames, normalisation on by default); set with `gemma4`.
    pub gemma4_video: Option<crate::gemma4_video::Gemma4Video>,
}

/// `Qwen2VLImageProcessor`'s `min_pixels`: 56 * 56.
const IMAGE_MIN_PIXELS: u64 = 56 * 56;
/// `Qwen2VLImageProcessor`'s `max_pixels`: 28 * 28 * 1280.
const IMAGE_MAX_PIXELS: u64 = 28 * 28 * 1280;
/// `Qwen2VLVideoProcessor`'s `size.shortest_edge`: 128 * 28 * 28.
const VIDEO_MIN_PIXELS: u64 = 128 * 28 * 28;
/// `Qwen2VLVideoProcessor`'s `size.longest_edge`: 28 * 28 * 768.
const VIDEO_MAX_PIXELS: u64 = 28 * 28 * 768;
/// `Qwen3VLVideoProcessor`'s `size`: 128 * 32 * 32 and 32 * 32 * 768 pixels (over all frames).
const QWEN3_VIDEO_PIXELS: (u64, u64) = (128 * 32 * 32, 32 * 32 * 768);

impl Default for ProcessorConfig {
    /// transformers' defaults for `Qwen2VLImageProcessor` and `Qwen2VLVideoProcessor`.
    fn default() -> Self {
        Self {
            min_pixels: IMAGE_MIN_PIXELS,
            max_pixels: IMAGE_MAX_PIXELS,
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            image_mean: OPENAI_CLIP_MEAN,
            image_std: OPENAI_CLIP_STD,
            rescale_factor: 1.0 / 255.0,
            do_resize: true,
            do_rescale: true,
            do_normalize: true,
            do_convert_rgb: true,
            video_min_pixels: VIDEO_MIN_PIXELS,
            video_max_pixels: VIDEO_MAX_PIXELS,
            fps: 2.0,
            num_frames: None,
            min_frames: 4,
            max_frames: 768,
            do_sample_frames: false,
            video_processor: VideoProcessor::Qwen2Vl,
            gemma4: None,
            gemma4_video: None,
        }
    }
}

/// A mean or std: one number for all channels, or one per channel.
#[derive(Deserialize)]
#[serde(untagged)]
enum PerChannel {
    One(f64),
    Three([f64; 3]),
}

impl PerChannel {
    fn to_f32(&self) -> [f32; 3] {
        match self {
            PerChannel::One(v) => [*v as f32; 3],
            PerChannel::Three(v) => v.map(|x| x as f32),
        }
    }
}

#[derive(Deserialize, Default)]
struct Size {
    shortest_edge: Option<u64>,
    longest_edge: Option<u64>,
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
}

/// The keys read from a (video) preprocessor config; anything else is ignored.
#[derive(Deserialize, Default)]
struct RawConfig {
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    size: Option<Size>,
    patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    merge_size: Option<usize>,
    image_mean: Option<PerChannel>,
    image_std: Option<PerChannel>,
    rescale_factor: Option<f64>,
    do_resize: Option<bool>,
    do_rescale: Option<bool>,
    do_normalize: Option<bool>,
    do_convert_rgb: Option<bool>,
    fps: Option<f32>,
    num_frames: Option<usize>,
    min_frames: Option<usize>,
    max_frames: Option<usize>,
    do_sample_frames: Option<bool>,
    video_processor_type: Option<String>,
    processor_class: Option<String>,
    image_processor_type: Option<String>,
    max_soft_tokens: Option<usize>,
    pooling_kernel_size: Option<usize>,
}

/// Gemma 4's video settings: `Gemma4VideoProcessor`'s defaults under what `raw` (its own
/// file, or the image processor's when the model has none) gives; the patch side is the
/// image processor's (`patch_size`), which the file must not contradict.
fn gemma4_video(
    raw: &RawConfig,
    patch_size: usize,
    path: Option<&Path>,
) -> Result<crate::gemma4_video::Gemma4Video> {
    let bad = |reason: String| MediaError::Config {
        path: path.map(Path::to_path_buf),
        reason,
    };
    let frame = crate::gemma4::Gemma4Image {
        max_soft_tokens: raw
            .max_soft_tokens
            .unwrap_or(crate::gemma4_video::DEFAULT_MAX_SOFT_TOKENS),
        pooling_kernel_size: raw.pooling_kernel_size.unwrap_or(3),
    };
    if !crate::gemma4::SUPPORTED_SOFT_TOKENS.contains(&frame.max_soft_tokens)
        || frame.pooling_kernel_size == 0
    {
        return Err(bad(format!(
            "the video processor's max_soft_tokens {} must be one of {:?} and \
             pooling_kernel_size ({}) positive",
            frame.max_soft_tokens,
            crate::gemma4::SUPPORTED_SOFT_TOKENS,
            frame.pooling_kernel_size
        )));
    }
    if raw.patch_size.is_some_and(|p| p != patch_size) {
        return Err(bad(format!(
            "the video processor's patch_size {:?} differs from the image processor's {patch_size}: \
             the vision tower takes one patch size",
            raw.patch_size
        )));
    }
    let num_frames = raw
        .num_frames
        .unwrap_or(crate::gemma4_video::DEFAULT_NUM_FRAMES);
    if num_frames == 0 {
        return Err(bad("the video processor's num_frames is 0".to_string()));
    }
    let v = crate::gemma4_video::Gemma4Video {
        frame,
        num_frames,
        do_resize: raw.do_resize.unwrap_or(true),
        do_rescale: raw.do_rescale.unwrap_or(true),
        rescale_factor: raw.rescale_factor.unwrap_or(1.0 / 255.0),
        do_normalize: raw.do_normalize.unwrap_or(true),
        image_mean: raw.image_mean.as_ref().map_or([0.0; 3], PerChannel::to_f32),
        image_std: raw.image_std.as_ref().map_or([1.0; 3], PerChannel::to_f32),
    };
    if v.image_std.iter().any(|s| *s == 0.0 || !s.is_finite())
        || v.image_mean.iter().any(|m| !m.is_finite())
        || !v.rescale_factor.is_finite()
    {
        return Err(bad(format!(
            "the video processor's image_mean {:?}, image_std {:?} and rescale_factor {} must \
             be finite, the std non-zero",
            v.image_mean, v.image_std, v.rescale_factor
        )));
    }
    Ok(v)
}

impl RawConfig {
    fn parse(json: &str, path: Option<&Path>) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| MediaError::Config {
            path: path.map(Path::to_path_buf),
            reason: format!("not a valid preprocessor config: {e}"),
        })
    }

    /// (min, max) pixels as transformers reads them: `size` first, then the older
    /// `min_pixels`/`max_pixels` keys override it (the processors' backward compatibility).
    fn pixels(&self) -> (Option<u64>, Option<u64>) {
        let size = self.size.as_ref();
        let min = self
            .min_pixels
            .or(size.and_then(|s| s.shortest_edge.or(s.min_pixels)));
        let max = self
            .max_pixels
            .or(size.and_then(|s| s.longest_edge.or(s.max_pixels)));
        (min, max)
    }

    /// The settings that images and videos share, over `base`.
    fn apply_shared(&self, base: &mut ProcessorConfig) {
        let c = base;
        c.patch_size = self.patch_size.unwrap_or(c.patch_size);
        c.temporal_patch_size = self.temporal_patch_size.unwrap_or(c.temporal_patch_size);
        c.merge_size = self.merge_size.unwrap_or(c.merge_size);
        if let Some(m) = &self.image_mean {
            c.image_mean = m.to_f32();
        }
        if let Some(s) = &self.image_std {
            c.image_std = s.to_f32();
        }
        c.rescale_factor = self.rescale_factor.unwrap_or(c.rescale_factor);
        c.do_resize = self.do_resize.unwrap_or(c.do_resize);
        c.do_rescale = self.do_rescale.unwrap_or(c.do_rescale);
        c.do_normalize = self.do_normalize.unwrap_or(c.do_normalize);
        c.do_convert_rgb = self.do_convert_rgb.unwrap_or(c.do_convert_rgb);
    }

    /// Whether the file names Qwen3-VL's processors (`Qwen3VLVideoProcessor`, or the
    /// `Qwen3VLProcessor` that Qwen3-VL's and Qwen3.5's files name).
    fn names_qwen3(&self) -> bool {
        self.video_processor_type.as_deref() == Some("Qwen3VLVideoProcessor")
            || self.processor_class.as_deref() == Some("Qwen3VLProcessor")
    }

    /// Whether the file names Gemma 4's image processor (or its `Gemma4Processor`).
    fn names_gemma4(&self) -> bool {
        let gemma4 = |s: &Option<String>| s.as_deref().is_some_and(|s| s.starts_with("Gemma4"));
        gemma4(&self.image_processor_type)
            || gemma4(&self.processor_class)
            || gemma4(&self.video_processor_type)
    }

    /// The video-only settings over `c`.
    fn apply_video(&self, c: &mut ProcessorConfig) {
        if self.names_qwen3() {
            c.video_processor = VideoProcessor::Qwen3Vl;
        }
        let (min, max) = self.pixels();
        let (dmin, dmax) = match c.video_processor {
            VideoProcessor::Qwen2Vl | VideoProcessor::Gemma4 => {
                (VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS)
            }
            VideoProcessor::Qwen3Vl => QWEN3_VIDEO_PIXELS,
        };
        c.video_min_pixels = min.unwrap_or(dmin);
        c.video_max_pixels = max.unwrap_or(dmax);
        c.fps = self.fps.unwrap_or(c.fps);
        c.num_frames = self.num_frames.or(c.num_frames);
        c.min_frames = self.min_frames.unwrap_or(c.min_frames);
        c.max_frames = self.max_frames.unwrap_or(c.max_frames);
        c.do_sample_frames = self.do_sample_frames.unwrap_or(c.do_sample_frames);
    }
}

impl ProcessorConfig {
    /// From the text of a `preprocessor_config.json`. Without a video config of its own, a model's
    /// video processor is built by transformers from this same file: its pixel bounds and frame
    /// settings apply to videos too (with the video processor's defaults where absent).
    pub fn from_json(preprocessor_config: &str) -> Result<Self> {
        Self::from_json_at(preprocessor_config, None)
    }

    fn from_json_at(json: &str, path: Option<&Path>) -> Result<Self> {
        let raw = RawConfig::parse(json, path)?;
        let mut c = ProcessorConfig::default();
        if raw.names_gemma4() {
            gemma4_defaults(&raw, &mut c, path)?;
        }
        raw.apply_shared(&mut c);
        if c.gemma4.is_some() {
            // Without a file of its own, transformers builds the video processor from this one.
            c.gemma4_video = Some(gemma4_video(&raw, c.patch_size, path)?);
            c.video_processor = VideoProcessor::Gemma4;
        }
        let (min, max) = raw.pixels();
        c.min_pixels = min.unwrap_or(IMAGE_MIN_PIXELS);
        c.max_pixels = max.unwrap_or(IMAGE_MAX_PIXELS);
        raw.apply_video(&mut c);
        c.validate(path)?;
        Ok(c)
    }

    /// From a model directory: `preprocessor_config.json`, and `video_preprocessor_config.json`
    /// for the video settings when present (which must then agree on the shared settings: patch
    /// sizes, mean, std, rescaling). Without them, transformers 5's `processor_config.json`,
    /// which holds both (`image_processor`, `video_processor`).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let image_path = dir.join("preprocessor_config.json");
        let video_path = dir.join("video_preprocessor_config.json");
        let combined = dir.join("processor_config.json");
        let (image, video, image_at, video_at) = if image_path.exists() || !combined.exists() {
            let video = match video_path.exists() {
                true => Some(read(&video_path)?),
                false => None,
            };
            (read(&image_path)?, video, image_path, video_path)
        } else {
            let (image, video) = split_processor_config(&read(&combined)?, &combined)?;
            (image, video, combined.clone(), combined)
        };
        let mut c = Self::from_json_at(&image, Some(&image_at))?;
        let Some(video) = video else {
            return Ok(c);
        };
        let raw = RawConfig::parse(&video, Some(&video_at))?;
        if c.gemma4.is_some() {
            // Gemma 4's video processor keeps settings of its own (its normalisation too).
            c.gemma4_video = Some(gemma4_video(&raw, c.patch_size, Some(&video_at))?);
            return Ok(c);
        }
        let mut shared = c.clone();
        raw.apply_shared(&mut shared);
        if shared != c {
            return Err(MediaError::Config {
                path: Some(video_at),
                reason: "its patch sizes, mean, std or rescaling differ from \
                         preprocessor_config.json's; one set of these is supported"
                    .to_string(),
            });
        }
        raw.apply_video(&mut c);
        c.validate(Some(&video_at))?;
        Ok(c)
    }

    /// `patch_size * merge_size`: the multiple each resized side is rounded to.
    pub fn factor(&self) -> u32 {
        (self.patch_size * self.merge_size) as u32
    }

    fn validate(&self, path: Option<&Path>) -> Result<()> {
        let bad = |reason: String| MediaError::Config {
            path: path.map(Path::to_path_buf),
            reason,
        };
        for (name, v) in [
            ("patch_size", self.patch_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("merge_size", self.merge_size),
        ] {
            if v == 0 || v > 1024 {
                return Err(bad(format!("{name} is {v}: it must be 1 to 1024")));
            }
        }
        for (what, min, max) in [
            ("", self.min_pixels, self.max_pixels),
            ("video ", self.video_min_pixels, self.video_max_pixels),
        ] {
            if min > max || max == 0 {
                return Err(bad(format!(
                    "{what}min_pixels {min} and max_pixels {max}: the minimum must not exceed a non-zero maximum"
                )));
            }
        }
        if self.image_std.iter().any(|s| *s == 0.0 || !s.is_finite())
            || self.image_mean.iter().any(|m| !m.is_finite())
        {
            return Err(bad(format!(
                "image_mean {:?} and image_std {:?} must be finite, the std non-zero",
                self.image_mean, self.image_std
            )));
        }
        if !self.rescale_factor.is_finite() {
            return Err(bad("rescale_factor must be finite".to_string()));
        }
        if !(self.fps.is_finite() && self.fps > 0.0) {
            return Err(bad(format!("fps is {}: it must be positive", self.fps)));
        }
        if self.min_frames > self.max_frames {
            return Err(bad(format!(
                "min_frames {} exceeds max_frames {}",
                self.min_frames, self.max_frames
            )));
        }
        Ok(())
    }
}

/// `Gemma4ImageProcessor`'s defaults (patches of 16, pooling 3, 280 soft tokens, rescaling
/// without normalisation) under what the file gives.
fn gemma4_defaults(raw: &RawConfig, c: &mut ProcessorConfig, path: Option<&Path>) -> Result<()> {
    let g = crate::gemma4::Gemma4Image {
        max_soft_tokens: raw.max_soft_tokens.unwrap_or(280),
        pooling_kernel_size: raw.pooling_kernel_size.unwrap_or(3),
    };
    if !crate::gemma4::SUPPORTED_SOFT_TOKENS.contains(&g.max_soft_tokens)
        || g.pooling_kernel_size == 0
    {
        return Err(MediaError::Config {
            path: path.map(Path::to_path_buf),
            reason: format!(
                "max_soft_tokens {} must be one of {:?} and pooling_kernel_size ({}) positive",
                g.max_soft_tokens,
                crate::gemma4::SUPPORTED_SOFT_TOKENS,
                g.pooling_kernel_size
            ),
        });
    }
    c.patch_size = 16;
    c.temporal_patch_size = 1;
    c.merge_size = g.pooling_kernel_size;
    c.image_mean = [0.0; 3];
    c.image_std = [1.0; 3];
    c.do_normalize = false;
    c.gemma4 = Some(g);
    Ok(())
}

/// transformers 5's `processor_config.json`: its image and video processors' settings as
/// the JSON of the two older files (each given the file's `processor_class`).
fn split_processor_config(json: &str, path: &Path) -> Result<(String, Option<String>)> {
    let bad = |reason: String| MediaError::Config {
        path: Some(path.to_path_buf()),
        reason,
    };
    let top: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json)
        .map_err(|e| bad(format!("not a valid processor config: {e}")))?;
    let part = |key: &str| -> Option<String> {
        let mut p = top.get(key)?.as_object()?.clone();
        if let Some(class) = top.get("processor_class") {
            p.entry("processor_class").or_insert_with(|| class.clone());
        }
        Some(serde_json::Value::Object(p).to_string())
    };
    let image = part("image_processor")
        .ok_or_else(|| bad("it has no \"image_processor\" settings".to_string()))?;
    Ok((image, part("video_processor")))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| MediaError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_json_gives_transformers_defaults() {
        let c = ProcessorConfig::from_json("{}").unwrap();
        assert_eq!(c, ProcessorConfig::default());
        assert_eq!((c.min_pixels, c.max_pixels), (3136, 1_003_520));
        assert_eq!((c.video_min_pixels, c.video_max_pixels), (100_352, 602_112));
        assert_eq!(c.factor(), 28);
    }

    #[test]
    fn clip_constants_are_the_f32_of_transformers_values() {
        let mean = [0.48145466f64, 0.4578275, 0.40821073].map(|v| v as f32);
        let std = [0.26862954f64, 0.26130258, 0.27577711].map(|v| v as f32);
        assert_eq!((OPENAI_CLIP_MEAN, OPENAI_CLIP_STD), (mean, std));
    }

    #[test]
    fn min_max_pixels_override_size() {
        let c = ProcessorConfig::from_json(
            r#"{"size": {"shortest_edge": 100, "longest_edge": 5000}, "max_pixels": 9000, "fps": null}"#,
        )
        .unwrap();
        assert_eq!((c.min_pixels, c.max_pixels), (100, 9000));
        assert_eq!((c.video_min_pixels, c.video_max_pixels), (100, 9000));
        assert_eq!(c.fps, 2.0);
    }

    #[test]
    fn a_scalar_mean_applies_to_every_channel() {
        let c =
            ProcessorConfig::from_json(r#"{"image_mean": 0.5, "image_std": [1, 2, 3]}"#).unwrap();
        assert_eq!(c.image_mean, [0.5; 3]);
        assert_eq!(c.image_std, [1.0, 2.0, 3.0]);
    }

    #[test]
    fn qwen3_vl_files_name_their_video_processor() {
        // Qwen3-VL's video_preprocessor_config.json; without sizes, the class defaults (a
        // budget over all frames).
        let c = ProcessorConfig::from_json(
            r#"{"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": 16}"#,
        )
        .unwrap();
        assert_eq!(c.video_processor, VideoProcessor::Qwen3Vl);
        assert_eq!((c.video_min_pixels, c.video_max_pixels), QWEN3_VIDEO_PIXELS);
        // Qwen3.5's preprocessor_config.json names the processor class only.
        let c = ProcessorConfig::from_json(r#"{"processor_class": "Qwen3VLProcessor"}"#).unwrap();
        assert_eq!(c.video_processor, VideoProcessor::Qwen3Vl);
        let c =
            ProcessorConfig::from_json(r#"{"processor_class": "Qwen2_5_VLProcessor"}"#).unwrap();
        assert_eq!(c.video_processor, VideoProcessor::Qwen2Vl);
    }

    #[test]
    fn transformers_5s_combined_processor_config_is_read() {
        let dir = std::env::temp_dir().join(format!("lmi-media-pc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("processor_config.json"),
            r#"{"processor_class": "Qwen3VLProcessor",
                "image_processor": {"patch_size": 16, "image_mean": [0.5, 0.5, 0.5],
                    "image_std": [0.5, 0.5, 0.5], "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
                "video_processor": {"patch_size": 16, "image_mean": [0.5, 0.5, 0.5],
                    "image_std": [0.5, 0.5, 0.5], "size": {"shortest_edge": 4096, "longest_edge": 25165824}}}"#,
        )
        .unwrap();
        let c = ProcessorConfig::from_dir(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let c = c.unwrap();
        assert_eq!(
            (c.patch_size, c.min_pixels, c.max_pixels),
            (16, 65536, 16_777_216)
        );
        assert_eq!((c.video_min_pixels, c.video_max_pixels), (4096, 25_165_824));
        assert_eq!(c.video_processor, VideoProcessor::Qwen3Vl);
    }

    /// Gemma 4's published layout: one `processor_config.json` whose video processor keeps
    /// settings of its own (70 soft tokens a frame, 32 frames, normalisation on) beside the
    /// image processor's (280, off).
    #[test]
    fn gemma4s_video_processor_keeps_its_own_settings() {
        let dir = std::env::temp_dir().join(format!("lmi-media-g4v-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |video: &str| {
            std::fs::write(
                dir.join("processor_config.json"),
                format!(
                    r#"{{"processor_class": "Gemma4Processor",
                    "image_processor": {{"image_processor_type": "Gemma4ImageProcessor",
                        "do_normalize": false, "max_soft_tokens": 280, "patch_size": 16}},
                    "video_processor": {video}}}"#
                ),
            )
            .unwrap();
            ProcessorConfig::from_dir(&dir)
        };
        let c = write(r#"{"video_processor_type": "Gemma4VideoProcessor", "patch_size": 16}"#);
        let bad = write(r#"{"patch_size": 14, "max_soft_tokens": 70}"#);
        let soft = write(r#"{"max_soft_tokens": 100}"#);
        std::fs::remove_dir_all(&dir).unwrap();
        let c = c.unwrap();
        assert_eq!(c.video_processor, VideoProcessor::Gemma4);
        assert_eq!(c.gemma4.unwrap().max_soft_tokens, 280);
        let v = c.gemma4_video.unwrap();
        assert_eq!((v.frame.max_soft_tokens, v.num_frames), (70, 32));
        assert!(v.do_normalize && !c.do_normalize);
        let e = bad.unwrap_err().to_string();
        assert!(e.contains("patch_size Some(14) differs"), "{e}");
        let e = soft.unwrap_err().to_string();
        assert!(e.contains("max_soft_tokens 100 must be one of"), "{e}");
        // Without a video file, transformers builds the video processor from the image one.
        let c = ProcessorConfig::from_json(
            r#"{"image_processor_type": "Gemma4ImageProcessor", "max_soft_tokens": 140}"#,
        )
        .unwrap();
        let v = c.gemma4_video.unwrap();
        assert_eq!((v.frame.max_soft_tokens, v.num_frames), (140, 32));
    }

    #[test]
    fn bad_values_say_what_to_fix() {
        let e = ProcessorConfig::from_json(r#"{"patch_size": 0}"#).unwrap_err();
        assert!(e.to_string().contains("patch_size is 0"), "{e}");
        let e = ProcessorConfig::from_json(r#"{"min_pixels": 10, "max_pixels": 5}"#).unwrap_err();
        assert!(e.to_string().contains("must not exceed"), "{e}");
        let e = ProcessorConfig::from_json("[1]").unwrap_err();
        assert!(
            e.to_string().contains("not a valid preprocessor config"),
            "{e}"
        );
        let e = ProcessorConfig::from_dir(Path::new("/nonexistent-dir")).unwrap_err();
        assert!(matches!(e, MediaError::Io { .. }), "{e}");
    }
}
