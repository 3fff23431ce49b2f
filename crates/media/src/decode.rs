//! Image decoding with limits checked before anything is decoded.
//!
//! The order matters against decompression bombs: the byte size first, then the format from the
//! magic bytes, then the dimensions from the header alone (no pixel buffer is allocated), and only
//! then the decode, with the `image` crate's own limits set as a second guard.

use std::io::Cursor;

use image::{ImageFormat, ImageReader};

use crate::error::{MediaError, Result};
use crate::jpeg::{JpegFailure, decode_jpeg};
use crate::to_rgb::to_rgb_like_hf;

/// The formats [`decode_image`] accepts, as named in its errors.
pub const ACCEPTED_IMAGE_FORMATS: &str = "PNG, JPEG, WebP, GIF (first frame)";

/// An 8-bit RGB image, row-major, 3 bytes a pixel, no padding.
#[derive(Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    /// `width * height * 3` bytes.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for RgbImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RgbImage {{ {}x{}, {} bytes }}",
            self.width,
            self.height,
            self.data.len()
        )
    }
}

impl RgbImage {
    /// An image from its pixels; `None` when `data` is not `width * height * 3` bytes.
    pub fn new(width: u32, height: u32, data: Vec<u8>) -> Option<Self> {
        let expected = (width as usize)
            .checked_mul(height as usize)?
            .checked_mul(3)?;
        (data.len() == expected).then_some(Self {
            width,
            height,
            data,
        })
    }
}

/// What an input image may be: checked before decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageLimits {
    /// The most encoded bytes (after base64 decoding for a data URL).
    pub max_bytes: usize,
    /// The most decoded pixels, `width * height`.
    pub max_pixels: u64,
    /// The longest side in pixels.
    pub max_side: u32,
}

impl Default for ImageLimits {
    /// 20 MiB, 40 megapixels, 16384 pixels a side.
    fn default() -> Self {
        Self {
            max_bytes: 20 << 20,
            max_pixels: 40_000_000,
            max_side: 16384,
        }
    }
}

impl ImageLimits {
    /// Refuses `width x height` when over the limits (or with a zero side).
    pub fn check_dimensions(&self, what: &'static str, width: u32, height: u32) -> Result<()> {
        if width == 0 || height == 0 {
            return Err(MediaError::BadSize(format!(
                "the {what} is {width}x{height} pixels: it has no pixels"
            )));
        }
        if width > self.max_side
            || height > self.max_side
            || u64::from(width) * u64::from(height) > self.max_pixels
        {
            return Err(MediaError::TooLarge {
                what,
                width,
                height,
                max_side: self.max_side,
                max_pixels: self.max_pixels,
            });
        }
        Ok(())
    }

    /// Refuses more than `max_bytes` bytes.
    pub fn check_bytes(&self, what: &'static str, size: usize) -> Result<()> {
        if size > self.max_bytes {
            return Err(MediaError::TooManyBytes {
                what,
                size,
                limit: self.max_bytes,
            });
        }
        Ok(())
    }
}

/// Decodes a PNG, JPEG, WebP or GIF (its first frame) to RGB8, as `PIL.Image.open` followed by the
/// HF processor's `convert_to_rgb` does: transparency composited onto white, grayscale and palette
/// expanded, no EXIF rotation, no colour management.
pub fn decode_image(bytes: &[u8], limits: &ImageLimits) -> Result<RgbImage> {
    limits.check_bytes("image", bytes.len())?;
    let format = image_format(bytes)?;
    let name = format_name(format);

    let mut header = ImageReader::with_format(Cursor::new(bytes), format);
    header.no_limits(); // the header alone: nothing is allocated for the pixels here
    let (width, height) = header
        .into_dimensions()
        .map_err(|e| decode_error(name, &e))?;
    limits.check_dimensions("image", width, height)?;

    if format == ImageFormat::Jpeg {
        match decode_jpeg(bytes) {
            Ok(img) => return check_decoded(img, name, width, height),
            Err(JpegFailure::Truncated) => {
                return Err(MediaError::Decode {
                    what: "image",
                    format: name.to_string(),
                    reason: "the file is truncated".to_string(),
                });
            }
            Err(JpegFailure::Error(reason)) => {
                return Err(MediaError::Decode {
                    what: "image",
                    format: name.to_string(),
                    reason,
                });
            }
            // CMYK and YCCK: the image crate's decoder below (not bit-exact with Pillow).
            Err(JpegFailure::ColorSpace) => {}
        }
    }

    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut image_limits = image::Limits::default();
    image_limits.max_image_width = Some(limits.max_side);
    image_limits.max_image_height = Some(limits.max_side);
    // 8 bytes a pixel (RGBA16), twice over for the decoders' working buffers.
    image_limits.max_alloc = Some(limits.max_pixels.saturating_mul(16));
    reader.limits(image_limits);
    let decoded = reader.decode().map_err(|e| decode_error(name, &e))?;
    check_decoded(to_rgb_like_hf(decoded), name, width, height)
}

/// Refuses an image whose size is not the one its header declared.
fn check_decoded(img: RgbImage, format: &str, width: u32, height: u32) -> Result<RgbImage> {
    if (img.width, img.height) != (width, height) {
        return Err(MediaError::Decode {
            what: "image",
            format: format.to_string(),
            reason: format!(
                "the header says {width}x{height} but {}x{} pixels were decoded",
                img.width, img.height
            ),
        });
    }
    Ok(img)
}

/// The format of `bytes` from its magic bytes, refusing all but the accepted ones.
fn image_format(bytes: &[u8]) -> Result<ImageFormat> {
    match image::guess_format(bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif)) => {
            Ok(f)
        }
        Ok(other) => Err(unsupported(format!(" ({})", other.extensions_str()[0]))),
        Err(_) if looks_like_svg(bytes) => Err(unsupported(" (SVG)".to_string())),
        Err(_) => Err(unsupported(String::new())),
    }
}

fn unsupported(detail: String) -> MediaError {
    MediaError::UnsupportedFormat {
        what: "image",
        detail,
        accepted: ACCEPTED_IMAGE_FORMATS,
    }
}

/// Whether the bytes start (after a BOM and white space) like XML or an `<svg` element.
fn looks_like_svg(bytes: &[u8]) -> bool {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let head = &bytes[start..bytes.len().min(start + 512)];
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    head.starts_with("<svg") || (head.starts_with("<?xml") && head.contains("<svg"))
}

fn format_name(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "PNG",
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::WebP => "WebP",
        ImageFormat::Gif => "GIF",
        _ => "image",
    }
}

fn decode_error(format: &str, e: &image::ImageError) -> MediaError {
    let reason = match e {
        image::ImageError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the file is truncated".to_string()
        }
        image::ImageError::Limits(l) => format!("over the decoder's limits ({l})"),
        other => other.to_string(),
    };
    MediaError::Decode {
        what: "image",
        format: format.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_is_recognised_as_such() {
        assert!(looks_like_svg(
            b"  <svg xmlns='http://www.w3.org/2000/svg'/>"
        ));
        assert!(looks_like_svg(b"<?xml version=\"1.0\"?>\n<svg/>"));
        assert!(!looks_like_svg(b"<?xml version=\"1.0\"?><html/>"));
    }

    #[test]
    fn limits_refuse_each_dimension() {
        let l = ImageLimits {
            max_bytes: 10,
            max_pixels: 100,
            max_side: 20,
        };
        assert!(l.check_dimensions("image", 10, 10).is_ok());
        assert!(matches!(
            l.check_dimensions("image", 21, 1),
            Err(MediaError::TooLarge { .. })
        ));
        assert!(matches!(
            l.check_dimensions("image", 11, 10),
            Err(MediaError::TooLarge { .. })
        ));
        assert!(matches!(
            l.check_dimensions("image", 0, 10),
            Err(MediaError::BadSize(_))
        ));
        assert!(l.check_bytes("image", 10).is_ok());
        assert!(matches!(
            l.check_bytes("image", 11),
            Err(MediaError::TooManyBytes { .. })
        ));
    }
}
