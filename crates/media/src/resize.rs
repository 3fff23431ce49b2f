//! `PIL.Image.resize(size, Image.BICUBIC)` on RGB8, bit for bit.
//!
//! A port of Pillow 13's `libImaging/Resample.c` (8 bits a channel): separable, the horizontal
//! pass first then the vertical one (the other way round when the height shrinks much more than
//! the width, see [`vertical_first`]), each skipped when that side keeps its size. Each output pixel's
//! weights come from the cubic convolution kernel (a = -0.5) stretched by the scale when
//! downscaling (support 2 * scale), normalised to sum to one in `f64`, then rounded to 22-bit
//! fixed point; the sums start at one half and are clipped to 0..=255.

use crate::decode::RgbImage;

#[cfg(target_arch = "x86_64")]
#[path = "resize_x86.rs"]
mod resize_x86;

/// Pillow's `PRECISION_BITS` for 8-bit images: 32 - 8 - 2.
const PRECISION_BITS: u32 = 22;
/// The bicubic filter's support at scale 1.
const BICUBIC_SUPPORT: f64 = 2.0;

/// `Image.resize((width, height), Image.BICUBIC)` of an RGB image, as Pillow computes it.
///
/// A zero `width` or `height` gives an empty image.
pub fn resize_bicubic(img: &RgbImage, width: u32, height: u32) -> RgbImage {
    resize_with(img, width, height, Kernel::best())
}

fn resize_with(img: &RgbImage, width: u32, height: u32, kernel: Kernel) -> RgbImage {
    if width == 0 || height == 0 || img.width == 0 || img.height == 0 {
        return RgbImage {
            width,
            height,
            data: vec![0; width as usize * height as usize * 3],
        };
    }
    let need_horizontal = width != img.width;
    let need_vertical = height != img.height;
    if !need_horizontal && !need_vertical {
        return img.clone();
    }
    let vertical = Coefficients::new(img.height, height);
    let data = if need_horizontal && need_vertical && vertical_first(img, width, height) {
        let rows = resample_vertical(&img.data, img.width, 0, &vertical, kernel);
        let horizontal = Coefficients::new(img.width, width);
        resample_horizontal(&rows, img.width, (0, height as usize), &horizontal, kernel)
    } else {
        // Pillow resamples horizontally only the rows that the vertical pass reads: the same
        // numbers, less work.
        let (data, offset) = if need_horizontal {
            let rows = if need_vertical {
                let first = vertical.bounds.first().map_or(0, |b| b.0);
                let last = vertical.bounds.last().map_or(0, |b| b.0 + b.1);
                (first, last)
            } else {
                (0, img.height as usize)
            };
            let horizontal = Coefficients::new(img.width, width);
            (
                resample_horizontal(&img.data, img.width, rows, &horizontal, kernel),
                rows.0,
            )
        } else {
            (img.data.clone(), 0)
        };
        if need_vertical {
            resample_vertical(&data, width, offset, &vertical, kernel)
        } else {
            data
        }
    };
    RgbImage {
        width,
        height,
        data,
    }
}

/// Pillow 13 (python-pillow/Pillow#9549) resamples vertically first when the height shrinks by
/// more than twice as many pixels as the width does; Pillow 12 and older always go horizontal
/// first. The passes round to 8 bits in between, so the order shows in the result.
fn vertical_first(img: &RgbImage, width: u32, height: u32) -> bool {
    let shrunk_rows = i64::from(img.height) - i64::from(height);
    let shrunk_cols = i64::from(img.width) - i64::from(width);
    height < img.height && shrunk_rows > 2 * shrunk_cols
}

/// Per output pixel: the first input index and count, and the fixed-point weights.
struct Coefficients {
    bounds: Vec<(usize, usize)>,
    ksize: usize,
    weights: Vec<i32>,
}

impl Coefficients {
    /// Pillow's `precompute_coeffs` for the bicubic filter and the whole input (box 0..in_size),
    /// then `normalize_coeffs_8bpc`.
    fn new(in_size: u32, out_size: u32) -> Self {
        // box[2] - box[0] is a float subtraction in Pillow: exact for sizes below 2^24.
        let in0 = 0.0f32;
        let in1 = in_size as f32;
        let scale = f64::from(in1 - in0) / f64::from(out_size);
        let filterscale = scale.max(1.0);
        let support = BICUBIC_SUPPORT * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let inv_filterscale = 1.0 / filterscale;
        let out_size = out_size as usize;
        let in_size = in_size as i64;

        let mut bounds = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = f64::from(in0) + (xx as f64 + 0.5) * scale;
            // C's (int) truncates toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(in_size) - xmin;
            let xmax = xmax.max(0) as usize;
            let mut ww = 0.0f64;
            for (x, kx) in k.iter_mut().enumerate().take(xmax) {
                let w = bicubic((((x as i64 + xmin) as f64) - center + 0.5) * inv_filterscale);
                *kx = w;
                ww += w;
            }
            if ww != 0.0 {
                for kx in k.iter_mut().take(xmax) {
                    *kx /= ww;
                }
            }
            for (x, out) in weights[xx * ksize..xx * ksize + xmax]
                .iter_mut()
                .enumerate()
            {
                let v = k[x] * f64::from(1u32 << PRECISION_BITS);
                *out = if k[x] < 0.0 {
                    (-0.5 + v) as i32
                } else {
                    (0.5 + v) as i32
                };
            }
            bounds.push((xmin as usize, xmax));
        }
        Self {
            bounds,
            ksize,
            weights,
        }
    }

    fn of(&self, out: usize) -> (usize, &[i32]) {
        let (min, count) = self.bounds[out];
        (
            min,
            &self.weights[out * self.ksize..out * self.ksize + count],
        )
    }
}

/// Pillow's `bicubic_filter` with a = -0.5, in the same operation order.
#[inline]
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Pillow's `clip8`: the sum shifted down, clipped to 0..=255.
#[inline]
fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Which code runs the passes: the vectorized one where the CPU has it, else the scalar port.
/// Both give the same bytes (tests compare them).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernel {
    fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        if resize_x86::available() {
            return Kernel::Avx2;
        }
        Kernel::Scalar
    }
}

/// The horizontal pass over rows `rows.0..rows.1` of an RGB image `in_width` wide.
fn resample_horizontal(
    data: &[u8],
    in_width: u32,
    rows: (usize, usize),
    coeffs: &Coefficients,
    kernel: Kernel,
) -> Vec<u8> {
    let in_stride = in_width as usize * 3;
    let out_stride = coeffs.bounds.len() * 3;
    let n_rows = rows.1 - rows.0;
    let mut out = vec![0u8; n_rows * out_stride];
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2
        && let Some(pairs) = resize_x86::PairWeights::new(coeffs)
    {
        // The vector loads may read past the last row needed, so the input runs to the end.
        resize_x86::horizontal(
            &data[rows.0 * in_stride..],
            in_stride,
            coeffs,
            &pairs,
            &mut out,
            |row, out_row| horizontal_row(row, coeffs, out_row),
        );
        return out;
    }
    let _ = kernel;
    let input = &data[rows.0 * in_stride..rows.1 * in_stride];
    for (row, out_row) in input
        .chunks_exact(in_stride)
        .zip(out.chunks_exact_mut(out_stride))
    {
        horizontal_row(row, coeffs, out_row);
    }
    out
}

/// One row of the horizontal pass, as Pillow computes it.
fn horizontal_row(row: &[u8], coeffs: &Coefficients, out_row: &mut [u8]) {
    for (xx, o) in out_row.chunks_exact_mut(3).enumerate() {
        let (xmin, k) = coeffs.of(xx);
        // The taps' pixels as one slice: no bounds check per tap.
        let px = &row[xmin * 3..(xmin + k.len()) * 3];
        let (mut s0, mut s1, mut s2) = (HALF, HALF, HALF);
        for (p, &w) in px.chunks_exact(3).zip(k) {
            s0 = s0.wrapping_add(i32::from(p[0]) * w);
            s1 = s1.wrapping_add(i32::from(p[1]) * w);
            s2 = s2.wrapping_add(i32::from(p[2]) * w);
        }
        o[0] = clip8(s0);
        o[1] = clip8(s1);
        o[2] = clip8(s2);
    }
}

/// The vertical pass: input row `ymin + i - offset` of an RGB image `width` wide.
fn resample_vertical(
    data: &[u8],
    width: u32,
    offset: usize,
    coeffs: &Coefficients,
    kernel: Kernel,
) -> Vec<u8> {
    let stride = width as usize * 3;
    let out_height = coeffs.bounds.len();
    let mut out = vec![0u8; out_height * stride];
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2 {
        resize_x86::vertical(data, stride, offset, coeffs, &mut out);
        return out;
    }
    let _ = kernel;
    let mut sums = vec![0i32; stride];
    for (yy, out_row) in out.chunks_exact_mut(stride).enumerate() {
        let (ymin, k) = coeffs.of(yy);
        sums.fill(HALF);
        for (i, &w) in k.iter().enumerate() {
            let y = ymin + i - offset;
            let in_row = &data[y * stride..(y + 1) * stride];
            for (s, &p) in sums.iter_mut().zip(in_row) {
                *s = s.wrapping_add(i32::from(p) * w);
            }
        }
        for (o, &s) in out_row.iter_mut().zip(&sums) {
            *o = clip8(s);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (inp, out) in [(10, 3), (3, 10), (100, 97), (7, 7)] {
            let c = Coefficients::new(inp, out);
            for xx in 0..out as usize {
                let sum: i32 = c.of(xx).1.iter().sum();
                assert!(
                    (sum - (1 << PRECISION_BITS)).abs() <= 8,
                    "{inp}->{out} at {xx}: {sum}"
                );
            }
        }
    }

    /// Noise: every tap's weight shows in the sums.
    fn noise(width: u32, height: u32, seed: u32) -> RgbImage {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        let data = (0..width * height * 3)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        RgbImage {
            width,
            height,
            data,
        }
    }

    #[test]
    fn the_vectorized_passes_give_the_scalar_bytes() {
        let best = Kernel::best();
        if best == Kernel::Scalar {
            eprintln!("no vectorized resize on this CPU: nothing to compare");
            return;
        }
        // Up and down by small and large factors, both pass orders, rows not a multiple of
        // four, widths too narrow for a whole vector, one-pixel sides, extremes of black and
        // white that the negative lobes push past 0..=255.
        let sizes = [
            ((1280, 800), (1260, 784)),
            ((640, 480), (644, 476)),
            ((97, 61), (29, 203)),
            ((300, 40), (56, 13)),
            ((4, 4), (17, 9)),
            ((1, 7), (5, 3)),
            ((33, 1), (2, 1)),
            ((256, 255), (31, 250)),
            ((50, 400), (48, 37)),
        ];
        for (i, ((w, h), (ow, oh))) in sizes.into_iter().enumerate() {
            let mut img = noise(w, h, i as u32 + 1);
            if i % 2 == 1 {
                for b in img.data.iter_mut() {
                    *b = if *b > 127 { 255 } else { 0 };
                }
            }
            let scalar = resize_with(&img, ow, oh, Kernel::Scalar);
            let fast = resize_with(&img, ow, oh, best);
            assert!(
                scalar == fast,
                "{w}x{h} -> {ow}x{oh}: {best:?} differs from scalar"
            );
        }
    }

    #[test]
    fn same_size_is_a_copy() {
        let img = RgbImage {
            width: 2,
            height: 2,
            data: (0..12).collect(),
        };
        assert_eq!(resize_bicubic(&img, 2, 2), img);
    }

    #[test]
    fn a_flat_image_stays_flat() {
        let img = RgbImage {
            width: 5,
            height: 4,
            data: [10u8, 200, 255].repeat(20),
        };
        let out = resize_bicubic(&img, 13, 2);
        assert_eq!(out.data, [10u8, 200, 255].repeat(26));
    }
}
