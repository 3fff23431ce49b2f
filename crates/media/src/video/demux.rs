//! MP4 demuxing: the H.264 track's samples, in decode order, with the decoder configuration.
//!
//! `re_mp4` (Rerun's fork of the `mp4` crate, fuzzed) parses the boxes; it checks each table's
//! entry count against its box size but trusts a constant-size `stsz` for its sample count, and
//! indexes its tables without checks while building the sample list. So the sample counts are
//! read here first (a bomb of billions of samples is refused before any list is built) and the
//! parser runs under `catch_unwind`: malformed files are errors, not crashes.

use std::panic::{AssertUnwindSafe, catch_unwind};

use re_mp4::{Mp4, StsdBoxContent, TrackKind};

use crate::error::{MediaError, Result};

/// The H.264 video track of an MP4.
pub(crate) struct VideoTrack {
    pub width: u32,
    pub height: u32,
    /// Samples in decode order.
    pub samples: Vec<TrackSample>,
    /// Bytes of the NAL unit length prefix in samples (1, 2 or 4).
    pub nal_length_size: usize,
    /// SPS and PPS NAL units, without start codes.
    pub parameter_sets: Vec<Vec<u8>>,
    /// Frames a second, as FFmpeg computes `avg_frame_rate`.
    pub fps: f32,
    /// The summed frame durations, in seconds.
    pub duration_s: f32,
}

pub(crate) struct TrackSample {
    /// The sample's bytes in the file.
    pub range: std::ops::Range<usize>,
}

fn bad(reason: impl Into<String>) -> MediaError {
    MediaError::Decode {
        what: "video",
        format: "MP4".to_string(),
        reason: reason.into(),
    }
}

/// The first H.264 video track of `bytes`, refusing more than `max_samples` samples in any track.
pub(crate) fn video_track(bytes: &[u8], max_samples: u64) -> Result<VideoTrack> {
    check_sample_counts(bytes, max_samples, 0)?;
    let mp4 = catch_unwind(AssertUnwindSafe(|| Mp4::read_bytes(bytes)))
        .map_err(|_| bad("the MP4 structure is inconsistent"))?
        .map_err(|e| bad(format!("not a readable MP4 ({e})")))?;
    let track = mp4
        .tracks()
        .values()
        .find(|t| t.kind == Some(TrackKind::Video))
        .ok_or_else(|| bad("the file has no video track"))?;
    let trak = mp4
        .moov
        .traks
        .iter()
        .find(|trak| trak.tkhd.track_id == track.track_id)
        .ok_or_else(|| bad("the video track has no description"))?;
    let avc = match &trak.mdia.minf.stbl.stsd.contents {
        StsdBoxContent::Avc1(avc1) => &avc1.avcc,
        other => {
            return Err(MediaError::UnsupportedFormat {
                what: "video",
                detail: format!(
                    " (codec {})",
                    other
                        .codec_string()
                        .unwrap_or_else(|| "unknown".to_string())
                ),
                accepted: crate::video::ACCEPTED_VIDEO_FORMATS,
            });
        }
    };
    let nal_length_size = usize::from(avc.length_size_minus_one & 3) + 1;
    if nal_length_size == 3 {
        return Err(bad(
            "a NAL length size of 3 bytes is not valid H.264 in MP4",
        ));
    }
    let parameter_sets = avc
        .sequence_parameter_sets
        .iter()
        .chain(&avc.picture_parameter_sets)
        .map(|nal| nal.bytes.clone())
        .collect::<Vec<_>>();
    if parameter_sets.is_empty() {
        return Err(bad("the H.264 configuration has no SPS/PPS"));
    }
    let mut samples = Vec::with_capacity(track.samples.len());
    for s in &track.samples {
        let range = s.offset.try_into().ok().and_then(|start: usize| {
            let end = start.checked_add(usize::try_from(s.size).ok()?)?;
            (end <= bytes.len()).then_some(start..end)
        });
        let range = range.ok_or_else(|| bad("a sample lies outside the file (truncated?)"))?;
        samples.push(TrackSample { range });
    }
    if samples.is_empty() {
        return Err(bad("the video track has no frames"));
    }
    // The frame rate as FFmpeg gives it (PyAV's `average_rate`, what transformers reads): frames
    // over the summed `stts` deltas; a fragmented file has its durations in the fragments.
    let stbl = &trak.mdia.minf.stbl;
    let (frames_for_fps, mut ticks) = stbl.stts.entries.iter().fold((0u64, 0u64), |(n, t), e| {
        (
            n + u64::from(e.sample_count),
            t.saturating_add(u64::from(e.sample_count) * u64::from(e.sample_delta)),
        )
    });
    let mut counted = frames_for_fps;
    if frames_for_fps == 0 {
        ticks = track
            .samples
            .iter()
            .fold(0u64, |t, s| t.saturating_add(s.duration));
        counted = samples.len() as u64;
    }
    let timescale = u64::from(trak.mdia.mdhd.timescale).max(1);
    let duration_s = ticks as f64 / timescale as f64;
    let fps = if duration_s > 0.0 {
        (counted as f64 / duration_s) as f32
    } else {
        0.0
    };
    Ok(VideoTrack {
        width: u32::from(track.width),
        height: u32::from(track.height),
        samples,
        nal_length_size,
        parameter_sets,
        fps,
        duration_s: duration_s as f32,
    })
}

/// Walks the boxes down to every `stsz` (and `stz2`), refusing a sample count over `max`.
fn check_sample_counts(data: &[u8], max: u64, depth: u32) -> Result<()> {
    const CONTAINERS: [&[u8; 4]; 6] = [b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts"];
    let mut at = 0usize;
    while at + 8 <= data.len() && depth < 8 {
        let size32 = u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
        let kind = &data[at + 4..at + 8];
        let (header, size) = match size32 {
            0 => (8, (data.len() - at) as u64),
            1 => {
                let Some(large) = data.get(at + 8..at + 16) else {
                    return Ok(());
                };
                let mut b = [0u8; 8];
                b.copy_from_slice(large);
                (16, u64::from_be_bytes(b))
            }
            n => (8, u64::from(n)),
        };
        if size < header as u64 {
            return Ok(()); // malformed: the parser will say so
        }
        let end = at
            .saturating_add(usize::try_from(size).unwrap_or(usize::MAX))
            .min(data.len());
        let body = &data[(at + header).min(end)..end];
        if CONTAINERS.iter().any(|c| kind == *c) {
            check_sample_counts(body, max, depth + 1)?;
        } else if kind == b"stsz" || kind == b"stz2" {
            // version+flags (4), sample_size or reserved+field_size (4), sample_count (4)
            if let Some(count) = body.get(8..12) {
                let count = u64::from(u32::from_be_bytes([count[0], count[1], count[2], count[3]]));
                if count > max {
                    return Err(MediaError::BadVideo(format!(
                        "a track has {count} samples, more than the limit of {max}"
                    )));
                }
            }
        }
        if end <= at {
            break;
        }
        at = end;
    }
    Ok(())
}
