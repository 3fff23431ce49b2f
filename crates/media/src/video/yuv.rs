//! YUV 4:2:0 to RGB8: BT.601, limited ("TV") range, the colour conversion that FFmpeg's swscale
//! applies by default for H.264 without colour metadata (and so torchvision's and PyAV's video
//! readers, which the HF pipelines use). Each chroma sample serves its 2x2 block of luma samples,
//! as swscale's unscaled yuv420p to rgb24 converter does, and the result is truncated, not rounded
//! (swscale's tables truncate too). swscale's exact numbers depend on its code path (C tables, or
//! 13-bit SIMD on x86) and so on the machine: this 16-bit fixed point stays within 2 levels of
//! PyAV's output (mean difference under 1) on the test video.

/// One plane of 8-bit samples.
pub(crate) struct Plane<'a> {
    pub data: &'a [u8],
    pub stride: usize,
}

impl Plane<'_> {
    #[inline]
    fn at(&self, x: usize, y: usize) -> i32 {
        i32::from(self.data.get(y * self.stride + x).copied().unwrap_or(128))
    }
}

/// BT.601 coefficients scaled by 2^16 for limited-range input: 255/219 for luma, 255/224 for
/// chroma times the matrix entries (1.402, 0.344136, 0.714136, 1.772).
const Y_SCALE: i32 = 76_309; // 1.164383 * 65536
const V_TO_R: i32 = 104_597; // 1.596027
const U_TO_G: i32 = 25_675; // 0.391762
const V_TO_G: i32 = 53_279; // 0.812968
const U_TO_B: i32 = 132_201; // 2.017232

/// Converts a `width x height` 4:2:0 picture to RGB8 (3 bytes a pixel, no padding).
pub(crate) fn yuv420_to_rgb(
    y: &Plane,
    u: &Plane,
    v: &Plane,
    width: usize,
    height: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(width * height * 3);
    for row in 0..height {
        for col in 0..width {
            let l = (y.at(col, row) - 16) * Y_SCALE;
            let cb = u.at(col / 2, row / 2) - 128;
            let cr = v.at(col / 2, row / 2) - 128;
            let r = l + V_TO_R * cr;
            let g = l - U_TO_G * cb - V_TO_G * cr;
            let b = l + U_TO_B * cb;
            out.extend_from_slice(&[clamp(r), clamp(g), clamp(b)]);
        }
    }
    out
}

#[inline]
fn clamp(v: i32) -> u8 {
    (v >> 16).clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(yv: u8, uv: u8, vv: u8) -> [u8; 3] {
        let (yd, ud, vd) = ([yv; 4], [uv], [vv]);
        let out = yuv420_to_rgb(
            &Plane {
                data: &yd,
                stride: 2,
            },
            &Plane {
                data: &ud,
                stride: 1,
            },
            &Plane {
                data: &vd,
                stride: 1,
            },
            2,
            2,
        );
        [out[0], out[1], out[2]]
    }

    #[test]
    fn limited_range_extremes() {
        assert_eq!(convert(16, 128, 128), [0, 0, 0]);
        // 219 * 1.164383 = 254.99...: truncated, as swscale's tables truncate.
        assert_eq!(convert(235, 128, 128), [254, 254, 254]);
        assert_eq!(convert(240, 128, 128), [255, 255, 255]);
        assert_eq!(convert(126, 128, 128), [128, 128, 128]);
        // BT.601 limited red (Y 81, Cb 90, Cr 240) is (255, 0, 0) within a unit.
        let [r, g, b] = convert(81, 90, 240);
        assert!(r >= 254 && g <= 1 && b <= 1, "{r} {g} {b}");
    }
}
