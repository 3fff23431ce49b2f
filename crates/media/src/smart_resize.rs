//! transformers' `qwen2_vl.image_processing_qwen2_vl.smart_resize`.

use crate::error::{MediaError, Result};

/// The largest aspect ratio the Qwen2-VL processors accept.
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// The size `(height, width)` an image of `height x width` is resized to: both sides multiples
/// of `factor` (rounded to the nearest multiple), then, if the area is outside
/// `min_pixels..=max_pixels`, scaled by the square root of the ratio with the sides floored
/// (too large) or ceiled (too small) to multiples of `factor`. Python's arithmetic throughout:
/// `round` halves to even, divisions in `f64`.
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32)> {
    if height == 0 || width == 0 || factor == 0 {
        return Err(MediaError::BadSize(format!(
            "cannot resize {width}x{height} pixels to multiples of {factor}"
        )));
    }
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    let ratio = h.max(w) / h.min(w);
    if ratio > MAX_ASPECT_RATIO {
        return Err(MediaError::BadSize(format!(
            "absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {ratio} \
             ({width}x{height} pixels): crop or pad the image"
        )));
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    if h_bar < 1.0 || w_bar < 1.0 || h_bar > f64::from(u32::MAX) || w_bar > f64::from(u32::MAX) {
        return Err(MediaError::BadSize(format!(
            "{width}x{height} pixels resize to {w_bar}x{h_bar} with min_pixels {min_pixels} \
             and max_pixels {max_pixels}: no usable size"
        )));
    }
    Ok((h_bar as u32, w_bar as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiples_of_the_factor_stay() {
        assert_eq!(smart_resize(56, 84, 28, 3136, 1_003_520).unwrap(), (56, 84));
    }

    #[test]
    fn aspect_ratio_over_200_is_refused() {
        let e = smart_resize(1, 201, 28, 3136, 1_003_520).unwrap_err();
        assert!(e.to_string().contains("aspect ratio"), "{e}");
        assert!(smart_resize(1, 200, 28, 3136, 1_003_520).is_ok());
    }
}
