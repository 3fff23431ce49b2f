//! JPEG decoding with libjpeg-turbo's decoder (as MozJPEG), the one Pillow uses.
//!
//! Pure-Rust JPEG decoders differ from libjpeg-turbo by a unit here and there (the inverse DCT,
//! chroma upsampling): after normalisation that is 0.015, far from the HF numbers. libjpeg's
//! defaults are Pillow's: the accurate integer DCT, fancy upsampling, its YCbCr to RGB tables.
//!
//! libjpeg reports errors by calling `error_exit`, which must not return: the handler here
//! unwinds (`resume_unwind`, which runs no panic hook) through the C code (built with
//! `-fexceptions` by mozjpeg-sys's `unwinding` feature) to a `catch_unwind`. Running out of data
//! is only a warning for libjpeg (it pads the image with grey); Pillow refuses a truncated file,
//! and so does this. Other warnings (corrupt data that libjpeg recovers from) pass, as in Pillow.

use std::os::raw::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use mozjpeg_sys::{J_COLOR_SPACE, jpeg_common_struct, jpeg_error_mgr};

use crate::decode::RgbImage;

/// Why a JPEG could not be decoded here.
pub(crate) enum JpegFailure {
    /// libjpeg's message.
    Error(String),
    /// The data ends before the image does.
    Truncated,
    /// CMYK or YCCK: not decoded by this path.
    ColorSpace,
}

/// The payload of the unwinding from the error handlers.
struct Unwound(JpegFailure);

/// Decodes a JPEG (greyscale, YCbCr or RGB) to RGB8 exactly as Pillow does.
pub(crate) fn decode_jpeg(bytes: &[u8]) -> Result<RgbImage, JpegFailure> {
    match catch_unwind(AssertUnwindSafe(|| decode_unwinding(bytes))) {
        Ok(result) => result,
        Err(payload) => Err(match payload.downcast::<Unwound>() {
            Ok(unwound) => unwound.0,
            Err(other) => match other.downcast::<String>() {
                Ok(msg) => JpegFailure::Error(*msg),
                Err(_) => JpegFailure::Error("the JPEG decoder failed".to_string()),
            },
        }),
    }
}

fn decode_unwinding(bytes: &[u8]) -> Result<RgbImage, JpegFailure> {
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => JpegFailure::Truncated,
        _ => JpegFailure::Error(e.to_string()),
    };
    let d = mozjpeg::Decompress::with_err(error_mgr())
        .from_mem(bytes)
        .map_err(io)?;
    match d.color_space() {
        J_COLOR_SPACE::JCS_GRAYSCALE | J_COLOR_SPACE::JCS_YCbCr | J_COLOR_SPACE::JCS_RGB => {}
        _ => return Err(JpegFailure::ColorSpace),
    }
    let mut started = d.rgb().map_err(io)?;
    let (width, height) = (started.width(), started.height());
    let data: Vec<u8> = started.read_scanlines().map_err(io)?;
    started.finish().map_err(io)?;
    RgbImage::new(width as u32, height as u32, data).ok_or(JpegFailure::Truncated)
}

fn error_mgr() -> jpeg_error_mgr {
    // SAFETY: jpeg_error_mgr is plain C data (numbers, function pointers that may be null);
    // jpeg_std_error fills in every field.
    let mut err: jpeg_error_mgr = unsafe { std::mem::zeroed() };
    // SAFETY: `err` is a valid, writable jpeg_error_mgr.
    unsafe { mozjpeg_sys::jpeg_std_error(&mut err) };
    err.error_exit = Some(unwind_on_error);
    err.emit_message = Some(unwind_on_eof);
    err
}

/// `error_exit`: libjpeg's message, unwound to `decode_jpeg`.
extern "C-unwind" fn unwind_on_error(cinfo: &mut jpeg_common_struct) {
    // SAFETY: `err` is the manager set in `error_mgr`, alive while libjpeg runs.
    let format = unsafe { cinfo.err.as_ref() }.and_then(|err| err.format_message);
    let message = match format {
        Some(format) => {
            let mut buffer = [0u8; 80];
            // SAFETY: format_message writes at most JMSG_LENGTH_MAX (80) bytes, NUL-terminated;
            // the binding declares the buffer as `&[u8; 80]` though libjpeg writes to it.
            unsafe {
                let format: unsafe extern "C-unwind" fn(&mut jpeg_common_struct, *mut u8) =
                    std::mem::transmute(format);
                format(cinfo, buffer.as_mut_ptr());
            }
            let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
            String::from_utf8_lossy(&buffer[..end]).into_owned()
        }
        None => "libjpeg error".to_string(),
    };
    resume_unwind(Box::new(Unwound(JpegFailure::Error(message))));
}

/// `emit_message`: a warning that the data ran out ends the decoding; the rest are ignored.
extern "C-unwind" fn unwind_on_eof(cinfo: &mut jpeg_common_struct, level: c_int) {
    // SAFETY: `err` is the manager set above, alive while libjpeg runs.
    let code = unsafe { cinfo.err.as_ref().map(|e| e.msg_code) };
    if level < 0 && code == Some(mozjpeg_sys::JWRN_JPEG_EOF as c_int) {
        resume_unwind(Box::new(Unwound(JpegFailure::Truncated)));
    }
}
