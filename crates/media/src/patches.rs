//! Resized frames to the vision encoder's input: rescaled, normalised, cut into patches in the
//! order of the Qwen2-VL processors.
//!
//! Inside a patch the values run channel, frame (of `temporal_patch_size`), row, column. The
//! patches run by frame group, then by `merge_size x merge_size` window (rows of windows, then
//! windows along a row), then row and column inside the window: the processors' reshape to
//! `(grid_t, T, C, gh/m, m, p, gw/m, m, p)` and transpose `(0, 3, 6, 4, 7, 2, 1, 5, 8)`.

use crate::config::ProcessorConfig;
use crate::decode::RgbImage;
use crate::error::{MediaError, Result};
use crate::resize::resize_bicubic;
use crate::smart_resize::smart_resize;

/// The vision encoder's input for one image or video.
#[derive(Clone, Debug, PartialEq)]
pub struct Patches {
    /// `[num_patches, 3 * temporal_patch_size * patch_size * patch_size]`, row-major.
    pub pixels: Vec<f32>,
    /// Patches along time, height and width: `grid_thw[0] * grid_thw[1] * grid_thw[2]` patches.
    pub grid_thw: [usize; 3],
}

impl Patches {
    /// The number of patches (rows of `pixels`).
    pub fn num_patches(&self) -> usize {
        self.grid_thw.iter().product()
    }

    /// The values in one patch (columns of `pixels`).
    pub fn patch_dim(&self) -> usize {
        self.pixels
            .len()
            .checked_div(self.num_patches())
            .unwrap_or(0)
    }

    /// The tokens this input takes in the prompt: the patches over `merge_size` squared.
    pub fn num_tokens(&self, merge_size: usize) -> usize {
        self.num_patches() / (merge_size * merge_size).max(1)
    }
}

/// How `u8` values become the model's floats; the image and video processors differ in the
/// last bit.
#[derive(Clone, Copy)]
enum Arithmetic {
    /// numpy (the slow image processor): `f32(x * rescale_factor)` in `f64`, then
    /// `(v - mean) / std` in `f32`.
    Numpy,
    /// torch (the video processor): rescaling fused into the normalisation,
    /// `(x - mean * 255) / (std * 255)` in `f32`.
    Torch,
}

/// One image as `Qwen2VLImageProcessor` prepares it (the slow, PIL path): resized with
/// [`smart_resize`] and PIL's bicubic filter, rescaled, normalised, the one frame repeated
/// `temporal_patch_size` times, cut into patches. Gemma 4's processor ([`ProcessorConfig::gemma4`]) is
/// [`crate::gemma4::preprocess`].
pub fn preprocess_image(img: &RgbImage, cfg: &ProcessorConfig) -> Result<Patches> {
    check_image(img)?;
    if let Some(g) = cfg.gemma4 {
        return crate::gemma4::preprocess(img, cfg, g);
    }
    let (frame, height, width) = resize_frame(img, cfg, cfg.min_pixels, cfg.max_pixels)?;
    patchify(
        &[&frame],
        &value_maps(cfg, Arithmetic::Numpy),
        height,
        width,
        cfg,
    )
}

/// Sampled video frames as `Qwen2VLVideoProcessor` prepares them: every frame resized to the
/// same size (from the video pixel bounds), rescaled and normalised, the frames padded to a
/// multiple of `temporal_patch_size` by repeating the last, cut into patches.
///
/// Gemma 4's ([`ProcessorConfig::gemma4_video`]) is [`crate::gemma4_video::preprocess`].
///
/// The HF video processor resizes with torchvision on tensors; this uses PIL's filter, so a
/// resized frame can differ from the HF one by a unit here and there (frames already at a
/// multiple of 28 in the pixel bounds are not resized and match exactly).
pub fn preprocess_video(frames: &[RgbImage], cfg: &ProcessorConfig) -> Result<Patches> {
    let first = frames
        .first()
        .ok_or_else(|| MediaError::BadVideo("the video has no frames".to_string()))?;
    for (i, f) in frames.iter().enumerate() {
        check_image(f)?;
        if (f.width, f.height) != (first.width, first.height) {
            return Err(MediaError::BadVideo(format!(
                "frame {i} is {}x{} pixels but frame 0 is {}x{}: all frames must have one size",
                f.width, f.height, first.width, first.height
            )));
        }
    }
    if let Some(v) = cfg.gemma4_video {
        return crate::gemma4_video::preprocess(frames, cfg.patch_size, v);
    }
    let mut resized = Vec::with_capacity(frames.len());
    let mut size = (0, 0);
    // Qwen3-VL's processor sizes the frames from a budget over all of them.
    let qwen3 = (cfg.video_processor == crate::config::VideoProcessor::Qwen3Vl && cfg.do_resize)
        .then(|| crate::qwen3_video::smart_resize(frames.len(), first.height, first.width, cfg))
        .transpose()?;
    for f in frames {
        let (frame, height, width) = match qwen3 {
            Some((h, w)) if (h, w) == (f.height, f.width) => {
                (std::borrow::Cow::Borrowed(f), h as usize, w as usize)
            }
            Some((h, w)) => (
                std::borrow::Cow::Owned(resize_bicubic(f, w, h)),
                h as usize,
                w as usize,
            ),
            None => resize_frame(f, cfg, cfg.video_min_pixels, cfg.video_max_pixels)?,
        };
        size = (height, width);
        resized.push(frame);
    }
    let refs: Vec<&RgbImage> = resized.iter().map(|f| f.as_ref()).collect();
    let maps = value_maps(cfg, Arithmetic::Torch);
    patchify(&refs, &maps, size.0, size.1, cfg)
}

fn check_image(img: &RgbImage) -> Result<()> {
    let expected = img.width as usize * img.height as usize * 3;
    if img.data.len() != expected {
        return Err(MediaError::BadSize(format!(
            "an RGB image of {}x{} pixels needs {expected} bytes, not {}",
            img.width,
            img.height,
            img.data.len()
        )));
    }
    Ok(())
}

/// The frame at the size the processor gives it, with that size as `(height, width)`.
fn resize_frame<'a>(
    img: &'a RgbImage,
    cfg: &ProcessorConfig,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(std::borrow::Cow<'a, RgbImage>, usize, usize)> {
    let factor = cfg.factor();
    if !cfg.do_resize {
        if !img.height.is_multiple_of(factor) || !img.width.is_multiple_of(factor) {
            return Err(MediaError::BadSize(format!(
                "without resizing, an image's sides must be multiples of {factor}; this one is {}x{}",
                img.width, img.height
            )));
        }
        return Ok((
            std::borrow::Cow::Borrowed(img),
            img.height as usize,
            img.width as usize,
        ));
    }
    let (height, width) = smart_resize(img.height, img.width, factor, min_pixels, max_pixels)?;
    Ok((
        std::borrow::Cow::Owned(resize_bicubic(img, width, height)),
        height as usize,
        width as usize,
    ))
}

/// Per channel, the float each byte value becomes.
type ValueMaps = [[f32; 256]; 3];

fn value_maps(cfg: &ProcessorConfig, arithmetic: Arithmetic) -> ValueMaps {
    std::array::from_fn(|c| value_map(cfg, arithmetic, c))
}

/// The float each of the 256 byte values of channel `c` becomes.
fn value_map(cfg: &ProcessorConfig, arithmetic: Arithmetic, c: usize) -> [f32; 256] {
    let (mean, std) = (cfg.image_mean[c], cfg.image_std[c]);
    std::array::from_fn(|x| {
        let x = x as f32;
        match (arithmetic, cfg.do_rescale, cfg.do_normalize) {
            (Arithmetic::Numpy, true, true) => {
                ((f64::from(x) * cfg.rescale_factor) as f32 - mean) / std
            }
            (Arithmetic::Numpy, true, false) => (f64::from(x) * cfg.rescale_factor) as f32,
            (Arithmetic::Torch, true, true) => {
                let scale = (1.0 / cfg.rescale_factor) as f32;
                (x - mean * scale) / (std * scale)
            }
            (Arithmetic::Torch, true, false) => x * cfg.rescale_factor as f32,
            (_, false, true) => (x - mean) / std,
            (_, false, false) => x,
        }
    })
}

/// RGB frames of `height x width` to patches, each byte through its channel's value map; the
/// frames are padded to a multiple of `temporal_patch_size` by repeating the last.
///
/// One pass in patch order: each patch's rows of `patch_size` pixels are read once and spread
/// to the three channels; a frame repeated within a temporal group (an image's one frame, a
/// video's padding) is copied rather than mapped again.
fn patchify(
    frames: &[&RgbImage],
    maps: &ValueMaps,
    height: usize,
    width: usize,
    cfg: &ProcessorConfig,
) -> Result<Patches> {
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let grid_h = height / p;
    let grid_w = width / p;
    if grid_h * p != height
        || grid_w * p != width
        || !grid_h.is_multiple_of(m)
        || !grid_w.is_multiple_of(m)
        || t == 0
    {
        return Err(MediaError::BadSize(format!(
            "{width}x{height} pixels do not split into {p}-pixel patches merged {m} by {m}"
        )));
    }
    let grid_t = frames.len().div_ceil(t);
    let patch_dim = 3 * t * p * p;
    let block = p * p;
    let mut pixels = vec![0f32; grid_t * grid_h * grid_w * patch_dim];
    // Each patch is made in a buffer that stays in L1, then written out once.
    let mut scratch = vec![0f32; patch_dim];
    let mut patches = pixels.chunks_exact_mut(patch_dim.max(1));
    for gt in 0..grid_t {
        let frame_of = |tt: usize| (gt * t + tt).min(frames.len() - 1);
        for bh in 0..grid_h / m {
            for bw in 0..grid_w / m {
                for mh in 0..m {
                    for mw in 0..m {
                        let Some(out) = patches.next() else {
                            break;
                        };
                        let patch = &mut scratch[..];
                        let y0 = (bh * m + mh) * p;
                        let x0 = (bw * m + mw) * p;
                        for tt in 0..t {
                            if tt > 0 && frame_of(tt) == frame_of(tt - 1) {
                                for c in 0..3 {
                                    let from = (c * t + tt - 1) * block;
                                    patch.copy_within(from..from + block, from + block);
                                }
                                continue;
                            }
                            let frame = &frames[frame_of(tt)].data;
                            // The three channels' blocks of this frame, `t * block` apart.
                            let (r, rest) = patch[tt * block..].split_at_mut(t * block);
                            let (g, b) = rest.split_at_mut(t * block);
                            for y in 0..p {
                                let at = ((y0 + y) * width + x0) * 3;
                                let src = &frame[at..at + 3 * p];
                                let row = y * p..(y + 1) * p;
                                let (r, g, b) =
                                    (&mut r[row.clone()], &mut g[row.clone()], &mut b[row]);
                                for (x, px) in src.chunks_exact(3).enumerate() {
                                    r[x] = maps[0][usize::from(px[0])];
                                    g[x] = maps[1][usize::from(px[1])];
                                    b[x] = maps[2][usize::from(px[2])];
                                }
                            }
                        }
                        write_out(out, &scratch);
                    }
                }
            }
        }
    }
    // Streaming stores are weakly ordered: make them visible before the pixels are handed on.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    Ok(Patches {
        pixels,
        grid_thw: [grid_t, grid_h, grid_w],
    })
}

/// `out = patch`. The patches of a megapixel are 24 MB, more than the caches hold and written
/// once: on x86-64 they bypass the caches (streaming stores), which saves reading each line
/// in before it is overwritten.
fn write_out(out: &mut [f32], patch: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if out.len() == patch.len()
        && out.len().is_multiple_of(4)
        && (out.as_ptr() as usize).is_multiple_of(16)
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        for (o, p) in out.chunks_exact_mut(4).zip(patch.chunks_exact(4)) {
            // SAFETY: SSE is part of x86-64; `o` is four floats at a 16-byte boundary (the
            // slice starts at one and runs in steps of 16 bytes), `p` four readable floats.
            unsafe { _mm_stream_ps(o.as_mut_ptr(), _mm_loadu_ps(p.as_ptr())) };
        }
        return;
    }
    out.copy_from_slice(patch);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_cfg() -> ProcessorConfig {
        ProcessorConfig {
            patch_size: 1,
            merge_size: 2,
            temporal_patch_size: 2,
            do_resize: false,
            do_rescale: false,
            do_normalize: false,
            ..ProcessorConfig::default()
        }
    }

    #[test]
    fn patch_order_is_merge_windows_then_channel_frame_row_column() {
        // 4x2 image (width 4, height 2), value = 10 * x + y in red, +100 in green, +200 in blue.
        let mut data = Vec::new();
        for y in 0..2u8 {
            for x in 0..4u8 {
                let v = 10 * x + y;
                data.extend_from_slice(&[v, v + 100, v + 200]);
            }
        }
        let img = RgbImage::new(4, 2, data).unwrap();
        let p = preprocess_image(&img, &tiny_cfg()).unwrap();
        assert_eq!(p.grid_thw, [1, 2, 4]);
        assert_eq!(p.patch_dim(), 6);
        // Patches: window (0,0): (y0,x0) (y0,x1) (y1,x0) (y1,x1); window (0,1): x2, x3.
        let reds: Vec<f32> = p.pixels.chunks(6).map(|c| c[0]).collect();
        assert_eq!(reds, [0., 10., 1., 11., 20., 30., 21., 31.]);
        // Inside a patch: R R G G B B (two frames of each channel).
        assert_eq!(&p.pixels[6..12], &[10., 10., 110., 110., 210., 210.]);
    }

    #[test]
    fn odd_frame_counts_repeat_the_last_frame() {
        let frames: Vec<RgbImage> = (0..3u8)
            .map(|i| RgbImage::new(2, 2, vec![i; 12]).unwrap())
            .collect();
        let p = preprocess_video(&frames, &tiny_cfg()).unwrap();
        assert_eq!(p.grid_thw, [2, 2, 2]);
        // Second temporal group: frame 2 then frame 2 again.
        let second = &p.pixels[4 * 6..5 * 6];
        assert_eq!(second, &[2.; 6]);
        assert_eq!(&p.pixels[..6], &[0., 1., 0., 1., 0., 1.]);
    }

    #[test]
    fn frames_of_different_sizes_are_refused() {
        let frames = [
            RgbImage::new(2, 2, vec![0; 12]).unwrap(),
            RgbImage::new(4, 2, vec![0; 24]).unwrap(),
        ];
        let e = preprocess_video(&frames, &tiny_cfg()).unwrap_err();
        assert!(e.to_string().contains("frame 1 is 4x2"), "{e}");
    }
}
