//! Input that must be refused, each with the error that says why.

use std::path::Path;

use lmi_media::{ImageLimits, MediaError, decode_image};

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .expect("fixture")
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc_input = kind.to_vec();
    crc_input.extend_from_slice(data);
    out.extend_from_slice(&crc32(&crc_input).to_be_bytes());
    out
}

/// A PNG whose header declares `width x height` RGB pixels, with a few bytes of IDAT.
fn png_header_only(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    png.extend(chunk(b"IEND", &[]));
    png
}

#[test]
fn a_png_declaring_100000_squared_pixels_is_refused_from_its_header() {
    let png = png_header_only(100_000, 100_000);
    match decode_image(&png, &ImageLimits::default()) {
        Err(
            e @ MediaError::TooLarge {
                width: 100_000,
                height: 100_000,
                ..
            },
        ) => {
            assert!(e.is_client_error());
            assert!(e.to_string().contains("100000x100000"), "{e}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn the_pixel_count_limit_applies_below_the_side_limit() {
    let png = png_header_only(10_000, 10_000); // 100 MP, each side under 16384
    assert!(matches!(
        decode_image(&png, &ImageLimits::default()),
        Err(MediaError::TooLarge { .. })
    ));
    let tight = ImageLimits {
        max_pixels: 23 * 17 - 1,
        ..ImageLimits::default()
    };
    assert!(matches!(
        decode_image(&fixture("decode/rgb.png"), &tight),
        Err(MediaError::TooLarge {
            width: 23,
            height: 17,
            ..
        })
    ));
}

#[test]
fn truncated_files_are_decode_errors() {
    for name in [
        "decode/rgb.png",
        "decode/q90_420.jpg",
        "decode/progressive.jpg",
        "decode/palette.gif",
        "decode/lossy.webp",
        "decode/lossless.webp",
    ] {
        let bytes = fixture(name);
        let cut = &bytes[..bytes.len() * 2 / 3];
        match decode_image(cut, &ImageLimits::default()) {
            Err(e @ MediaError::Decode { .. }) => assert!(e.is_client_error()),
            other => panic!(
                "{name} cut to {} bytes: expected a decode error, got {other:?}",
                cut.len()
            ),
        }
    }
    let e = decode_image(
        &fixture("decode/q90_420.jpg")[..1000],
        &ImageLimits::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn no_truncation_or_corruption_panics() {
    for name in [
        "decode/rgb.png",
        "decode/palette_trns.png",
        "decode/q85_422.jpg",
        "decode/progressive.jpg",
        "decode/transparent.gif",
        "decode/lossy_alpha.webp",
        "decode/lossless_alpha.webp",
        "decode/rgb16.png",
    ] {
        let bytes = fixture(name);
        for len in (0..bytes.len()).step_by(7) {
            let _ = decode_image(&bytes[..len], &ImageLimits::default());
        }
        for at in (8..bytes.len()).step_by(13) {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= 0x5a;
            let _ = decode_image(&corrupt, &ImageLimits::default());
        }
    }
}

#[test]
fn svg_is_refused_naming_the_accepted_formats() {
    let svg =
        br#"<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>"#;
    match decode_image(svg, &ImageLimits::default()) {
        Err(e @ MediaError::UnsupportedFormat { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("SVG"), "{msg}");
            assert!(msg.contains("PNG, JPEG, WebP, GIF"), "{msg}");
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }
}

#[test]
fn garbage_empty_and_other_formats_are_unsupported() {
    for bytes in [
        &b"hello, this is not an image"[..],
        b"",
        b"II*\x00\x08\x00\x00\x00",
        b"BM\x00\x00",
    ] {
        match decode_image(bytes, &ImageLimits::default()) {
            Err(MediaError::UnsupportedFormat { .. }) => {}
            other => panic!("{bytes:?}: expected UnsupportedFormat, got {other:?}"),
        }
    }
    let e = decode_image(b"II*\x00\x08\x00\x00\x00", &ImageLimits::default()).unwrap_err();
    assert!(e.to_string().contains("tif"), "{e}");
}

#[test]
fn more_bytes_than_the_limit_are_refused_before_anything_else() {
    let bytes = fixture("decode/rgb.png");
    let limits = ImageLimits {
        max_bytes: bytes.len() - 1,
        ..ImageLimits::default()
    };
    match decode_image(&bytes, &limits) {
        Err(MediaError::TooManyBytes { size, limit, .. }) => {
            assert_eq!((size, limit), (bytes.len(), bytes.len() - 1));
        }
        other => panic!("expected TooManyBytes, got {other:?}"),
    }
    let limits = ImageLimits {
        max_bytes: bytes.len(),
        ..ImageLimits::default()
    };
    assert!(decode_image(&bytes, &limits).is_ok());
}
