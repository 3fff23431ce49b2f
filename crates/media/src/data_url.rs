//! `data:` URLs (RFC 2397): `data:[<media type>][;base64],<data>`.

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::decode::ImageLimits;
use crate::error::{MediaError, Result};

/// Standard base64, padding optional (clients differ).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The media type (lower case, without parameters; `text/plain` when absent, as RFC 2397 says)
/// and the bytes of a `data:` URL. The data is base64 (white space ignored) when the header ends
/// in `;base64`, percent-encoded text otherwise. More than `limits.max_bytes` bytes is refused,
/// before decoding when the length of the text already says so.
pub fn parse_data_url(url: &str, limits: &ImageLimits) -> Result<(String, Vec<u8>)> {
    let bad = |reason: &str| MediaError::DataUrl(reason.to_string());
    let rest = url
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("data:"))
        .map(|_| &url[5..])
        .ok_or_else(|| bad("it does not start with 'data:'"))?;
    let (header, data) = rest
        .split_once(',')
        .ok_or_else(|| bad("there is no ',' between the media type and the data"))?;
    let mime = header
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let is_base64 = header
        .rsplit_once(';')
        .is_some_and(|(_, last)| last.trim().eq_ignore_ascii_case("base64"));
    let mime = if mime.is_empty() {
        "text/plain".to_string()
    } else if mime
        .split_once('/')
        .is_none_or(|(t, s)| t.is_empty() || s.is_empty())
    {
        return Err(MediaError::DataUrl(format!(
            "'{mime}' is not a media type (type/subtype, e.g. image/png)"
        )));
    } else {
        mime
    };
    let bytes = if is_base64 {
        // Every 4 characters are 3 bytes: refuse what is surely too long before decoding.
        if data.len() / 4 * 3 > limits.max_bytes.saturating_add(3) {
            return Err(MediaError::TooManyBytes {
                what: "data URL's content",
                size: data.len() / 4 * 3,
                limit: limits.max_bytes,
            });
        }
        let compact: Vec<u8> = data.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        BASE64
            .decode(&compact)
            .map_err(|e| MediaError::DataUrl(format!("the data is not valid base64 ({e})")))?
    } else {
        if data.len() / 3 > limits.max_bytes {
            return Err(MediaError::TooManyBytes {
                what: "data URL's content",
                size: data.len() / 3,
                limit: limits.max_bytes,
            });
        }
        percent_decode(data)?
    };
    limits.check_bytes("data URL's content", bytes.len())?;
    Ok((mime, bytes))
}

fn percent_decode(s: &str) -> Result<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    MediaError::DataUrl(format!(
                        "a '%' at byte {i} is not followed by two hex digits"
                    ))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}
