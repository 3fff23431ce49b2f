//! H.264 decoding with OpenH264 (Cisco's decoder, compiled from the source bundled in
//! `openh264-sys2` by `cc`: no system library).

use openh264::decoder::{DecodedYUV, Decoder, DecoderConfig, Flush};
use openh264::formats::YUVSource;

use crate::decode::RgbImage;
use crate::error::{MediaError, Result};
use crate::video::demux::VideoTrack;
use crate::video::yuv::{Plane, yuv420_to_rgb};

fn bad(reason: impl Into<String>) -> MediaError {
    MediaError::Decode {
        what: "video",
        format: "H.264".to_string(),
        reason: reason.into(),
    }
}

/// Decodes the track's frames in order, converting to RGB the ones in `keep` (ascending
/// display indices) and stopping after the last of them. `check` sees each frame's size first.
pub(crate) fn decode_frames(
    bytes: &[u8],
    track: &VideoTrack,
    keep: &[usize],
    check: &dyn Fn(u32, u32) -> Result<()>,
) -> Result<Vec<RgbImage>> {
    let config = DecoderConfig::new().flush_after_decode(Flush::NoFlush);
    let mut decoder = Decoder::with_api_config(openh264::OpenH264API::from_source(), config)
        .map_err(|e| bad(format!("cannot start the decoder: {e}")))?;
    let mut out = Frames {
        keep,
        next_index: 0,
        frames: Vec::with_capacity(keep.len()),
        check,
    };
    let mut annex_b = Vec::new();
    for ps in &track.parameter_sets {
        annex_b.extend_from_slice(&[0, 0, 0, 1]);
        annex_b.extend_from_slice(ps);
    }
    for sample in &track.samples {
        if out.done() {
            break;
        }
        to_annex_b(
            &bytes[sample.range.clone()],
            track.nal_length_size,
            &mut annex_b,
        )?;
        let decoded = decoder
            .decode(&annex_b)
            .map_err(|e| bad(format!("corrupt bitstream: {e}")))?;
        annex_b.clear();
        if let Some(yuv) = decoded {
            out.push(&yuv)?;
        }
    }
    if !out.done() {
        let rest = decoder
            .flush_remaining()
            .map_err(|e| bad(format!("corrupt bitstream: {e}")))?;
        for yuv in rest {
            if out.done() {
                break;
            }
            out.push(&yuv)?;
        }
    }
    if !out.done() {
        return Err(bad(format!(
            "{} frames decoded, fewer than the {} the file lists",
            out.next_index,
            track.samples.len()
        )));
    }
    Ok(out.frames)
}

struct Frames<'a> {
    keep: &'a [usize],
    next_index: usize,
    frames: Vec<RgbImage>,
    check: &'a dyn Fn(u32, u32) -> Result<()>,
}

impl Frames<'_> {
    fn done(&self) -> bool {
        self.frames.len() == self.keep.len()
    }

    fn push(&mut self, yuv: &DecodedYUV) -> Result<()> {
        let index = self.next_index;
        self.next_index += 1;
        if self.keep.get(self.frames.len()) != Some(&index) {
            return Ok(());
        }
        let (width, height) = yuv.dimensions();
        (self.check)(width as u32, height as u32)?;
        let (sy, su, sv) = yuv.strides();
        let data = yuv420_to_rgb(
            &Plane {
                data: yuv.y(),
                stride: sy,
            },
            &Plane {
                data: yuv.u(),
                stride: su,
            },
            &Plane {
                data: yuv.v(),
                stride: sv,
            },
            width,
            height,
        );
        self.frames.push(RgbImage {
            width: width as u32,
            height: height as u32,
            data,
        });
        Ok(())
    }
}

/// Length-prefixed NAL units (MP4) to start-code-prefixed ones (Annex B), appended to `out`.
fn to_annex_b(sample: &[u8], length_size: usize, out: &mut Vec<u8>) -> Result<()> {
    let mut at = 0;
    while at < sample.len() {
        let len_bytes = sample
            .get(at..at + length_size)
            .ok_or_else(|| bad("a NAL unit length is cut off"))?;
        let len = len_bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        at += length_size;
        let nal = sample
            .get(at..at.saturating_add(len))
            .ok_or_else(|| bad("a NAL unit runs past its sample"))?;
        out.extend_from_slice(&[0, 0, 0, 1]);
        out.extend_from_slice(nal);
        at += len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefixes_become_start_codes() {
        let mut out = Vec::new();
        to_annex_b(&[0, 0, 0, 2, 0x65, 0xaa, 0, 0, 0, 1, 0x41], 4, &mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 1, 0x65, 0xaa, 0, 0, 0, 1, 0x41]);
        assert!(to_annex_b(&[0, 0, 0, 9, 0x65], 4, &mut Vec::new()).is_err());
        assert!(to_annex_b(&[0, 0], 4, &mut Vec::new()).is_err());
    }
}
