//! Gemma 4's image processor (transformers' `Gemma4ImageProcessorPil`): the image resized,
//! aspect ratio kept, to the largest size of sides that are multiples of `pooling_kernel_size
//! · patch_size` within `max_soft_tokens · pooling_kernel_size²` patches (Pillow's bicubic),
//! rescaled to [0, 1] (no normalisation: the tower maps to [-1, 1] itself), and cut into
//! patches row by row, each patch's values pixel by pixel with the channels innermost.

use crate::config::ProcessorConfig;
use crate::decode::RgbImage;
use crate::error::{MediaError, Result};
use crate::patches::Patches;
use crate::resize::resize_bicubic;

/// The numbers of soft tokens per image the processor accepts (`_SUPPORTED_SOFT_TOKENS`).
pub const SUPPORTED_SOFT_TOKENS: [usize; 5] = [70, 140, 280, 560, 1120];

/// Gemma 4's image settings (`max_soft_tokens`, `pooling_kernel_size`); the patch side is
/// [`ProcessorConfig::patch_size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemma4Image {
    /// The most language-model tokens an image becomes (280).
    pub max_soft_tokens: usize,
    /// Patches per side averaged into one token (3).
    pub pooling_kernel_size: usize,
}

/// `get_aspect_ratio_preserving_size`: the (height, width) an image of `height x width` is
/// resized to.
pub fn target_size(height: u32, width: u32, patch: usize, g: Gemma4Image) -> Result<(u32, u32)> {
    let k = g.pooling_kernel_size;
    let max_patches = g.max_soft_tokens * k * k;
    let target_px = (max_patches * patch * patch) as f64;
    let factor = (target_px / (f64::from(height) * f64::from(width))).sqrt();
    let side = (k * patch) as f64;
    let mut th = ((factor * f64::from(height)) / side).floor() * side;
    let mut tw = ((factor * f64::from(width)) / side).floor() * side;
    let max_side = ((max_patches / (k * k)) as f64) * side;
    if th == 0.0 && tw == 0.0 {
        return Err(MediaError::BadSize(format!(
            "a {width}x{height} image cannot be resized to sides that are multiples of {side}"
        )));
    }
    if th == 0.0 {
        th = side;
        tw = ((f64::from(width) / f64::from(height)).floor() * side).min(max_side);
    } else if tw == 0.0 {
        tw = side;
        th = ((f64::from(height) / f64::from(width)).floor() * side).min(max_side);
    }
    if th * tw > target_px {
        return Err(MediaError::BadSize(format!(
            "a {width}x{height} image resized to {tw}x{th} exceeds {max_patches} patches"
        )));
    }
    Ok((th as u32, tw as u32))
}

/// An image as `Gemma4ImageProcessorPil` prepares it: `grid_thw` is `[1, rows, columns]` of
/// patches, `pixels` `[rows · columns, patch · patch · 3]` (the processor's padding rows left
/// out: they carry nothing).
pub fn preprocess(img: &RgbImage, cfg: &ProcessorConfig, g: Gemma4Image) -> Result<Patches> {
    // numpy's `image.astype(float64) * rescale_factor`, then float32; mean and std as given.
    let map: ValueMaps = std::array::from_fn(|c| {
        std::array::from_fn(|x| {
            let mut v = match cfg.do_rescale {
                true => (x as f64 * cfg.rescale_factor) as f32,
                false => x as f32,
            };
            if cfg.do_normalize {
                v = (v - cfg.image_mean[c]) / cfg.image_std[c];
            }
            v
        })
    });
    let (pixels, rows, cols) = patchify(img, cfg.patch_size, g, cfg.do_resize, &map)?;
    Ok(Patches {
        pixels,
        grid_thw: [1, rows, cols],
    })
}

/// Per channel, the float each byte value becomes.
pub(crate) type ValueMaps = [[f32; 256]; 3];

/// One image (or video frame) resized as the processor sizes it (when `do_resize`), each
/// byte through its channel's `map`, cut into `patch`-pixel patches row by row: the values
/// and the (rows, columns) of patches.
pub(crate) fn patchify(
    img: &RgbImage,
    p: usize,
    g: Gemma4Image,
    do_resize: bool,
    map: &ValueMaps,
) -> Result<(Vec<f32>, usize, usize)> {
    let (height, width) = match do_resize {
        true => target_size(img.height, img.width, p, g)?,
        false => (img.height, img.width),
    };
    let resized;
    let img = if (height, width) == (img.height, img.width) {
        img
    } else {
        resized = resize_bicubic(img, width, height);
        &resized
    };
    let (h, w) = (height as usize, width as usize);
    let k = g.pooling_kernel_size;
    let (rows, cols) = (h / p, w / p);
    if rows * p != h || cols * p != w || !rows.is_multiple_of(k) || !cols.is_multiple_of(k) {
        return Err(MediaError::BadSize(format!(
            "{width}x{height} pixels do not split into {p}-pixel patches pooled {k} by {k}"
        )));
    }
    let dim = p * p * 3;
    let mut pixels = Vec::with_capacity(rows * cols * dim);
    for r in 0..rows {
        for c in 0..cols {
            for y in 0..p {
                let at = ((r * p + y) * w + c * p) * 3;
                for (i, &b) in img.data[at..at + 3 * p].iter().enumerate() {
                    pixels.push(map[i % 3][usize::from(b)]);
                }
            }
        }
    }
    Ok((pixels, rows, cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Gemma4Image = Gemma4Image {
        max_soft_tokens: 280,
        pooling_kernel_size: 3,
    };

    /// transformers' `get_aspect_ratio_preserving_size` at the published settings (patches of
    /// 16, pooling 3, 280 tokens), as it answers: 640x480 → factor √(2520·256/307200) = 1.449,
    /// 927.5 x 695.6 → multiples of 48: 912 x 672.
    #[test]
    fn target_sizes_are_transformers() {
        assert_eq!(target_size(480, 640, 16, G).unwrap(), (672, 912));
        // Thin: the short side rounds to 0 and becomes one kernel (48), the long one
        // floor(4000 / 10) kernels, at most 280 of them.
        assert_eq!(target_size(10, 4000, 16, G).unwrap(), (48, 280 * 48));
    }

    #[test]
    fn patches_are_rows_then_pixels_then_channels() {
        // 6x6 image, patch 2, pooling 3 (no resize): 3x3 patches.
        let data: Vec<u8> = (0..6 * 6 * 3).map(|i| i as u8).collect();
        let img = RgbImage::new(6, 6, data).unwrap();
        let cfg = ProcessorConfig {
            patch_size: 2,
            do_resize: false,
            do_rescale: false,
            do_normalize: false,
            ..ProcessorConfig::default()
        };
        let g = Gemma4Image {
            max_soft_tokens: 70,
            pooling_kernel_size: 3,
        };
        let p = preprocess(&img, &cfg, g).unwrap();
        assert_eq!(p.grid_thw, [1, 3, 3]);
        // Patch (0, 1): pixels (0,2) (0,3) (1,2) (1,3), RGB each.
        let want: Vec<f32> = [6, 7, 8, 9, 10, 11, 24, 25, 26, 27, 28, 29]
            .iter()
            .map(|&v| v as f32)
            .collect();
        assert_eq!(&p.pixels[12..24], &want[..]);
    }
}
