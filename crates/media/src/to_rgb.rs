//! Any decoded image to RGB8 the way the HF processor sees it.
//!
//! transformers 4.57 (the version the reference fixtures come from, and what serving stacks pin)
//! converts with `image_transforms.convert_to_rgb`: `Image.convert("RGB")` for any PIL image
//! whose mode is not RGB. That **drops alpha** (RGBA, LA), looks palettes up ignoring their
//! transparency, and repeats grey. (transformers 5 composites transparency onto white instead;
//! this crate follows 4.57 until the models' reference moves.) The `image` crate has already
//! expanded palettes and `tRNS` into an alpha channel, keeping each pixel's colour; what is left is
//! how Pillow reads 16-bit PNGs:
//! - 16-bit RGB and RGBA (and grey+alpha, which Pillow opens as RGBA): the high byte;
//! - 16-bit grey (Pillow's mode `I;16`): `convert("RGB")` clips to 255, it does not scale.

use image::DynamicImage;

use crate::decode::RgbImage;

pub(crate) fn to_rgb_like_hf(image: DynamicImage) -> RgbImage {
    let (width, height) = (image.width(), image.height());
    let data = match image {
        DynamicImage::ImageRgb8(buf) => buf.into_raw(),
        DynamicImage::ImageLuma8(buf) => buf.into_raw().iter().flat_map(|&l| [l, l, l]).collect(),
        DynamicImage::ImageRgba8(buf) => buf
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        DynamicImage::ImageLumaA8(buf) => buf
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0]])
            .collect(),
        DynamicImage::ImageLuma16(buf) => buf
            .into_raw()
            .iter()
            .flat_map(|&l| {
                let l = l.min(255) as u8;
                [l, l, l]
            })
            .collect(),
        DynamicImage::ImageRgb16(buf) => buf.into_raw().iter().map(|&v| high_byte(v)).collect(),
        DynamicImage::ImageRgba16(buf) => buf
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [high_byte(p[0]), high_byte(p[1]), high_byte(p[2])])
            .collect(),
        DynamicImage::ImageLumaA16(buf) => buf
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| {
                let l = high_byte(p[0]);
                [l, l, l]
            })
            .collect(),
        // Float images come from no decoder enabled here (HDR, EXR); keep a sane fallback.
        other => other.to_rgb8().into_raw(),
    };
    RgbImage {
        width,
        height,
        data,
    }
}

#[inline]
fn high_byte(v: u16) -> u8 {
    (v >> 8) as u8
}
