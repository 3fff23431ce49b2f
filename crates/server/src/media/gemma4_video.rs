//! Gemma 4's video layout: its processor writes a video frame by frame, `MM:SS <boi>` + the
//! frame's soft tokens + `<eoi>`, the frames joined by spaces, in place of the chat
//! template's `<|video|>` (`Gemma4Processor.replace_video_token`), and tokenizes the text
//! after that. The timestamps are text that may merge with what surrounds them, so this
//! rewrites the rendered prompt text the same way (one `<|video|>` per frame) before it is
//! tokenized; [`super::expand`] then widens each frame's one token to the frame's soft
//! tokens. Each frame is an item of its own (the tower encodes frames apart, and in the
//! models whose images attend both ways a frame's tokens do so as an image's: transformers'
//! `mm_token_type_ids` groups by run, and a frame's run ends at its `<eoi>`).

use std::borrow::Cow;
use std::sync::Arc;

use lmi_api::ApiError;
use lmi_engine::vision::VisionInput;

use super::frames::FrameItem;
use super::{LoadedItem, VisionSetup};

/// The token texts a Gemma 4 video is written with.
#[derive(Debug, Clone)]
pub struct VideoText {
    /// `<|video|>`: the template's placeholder, and each soft token.
    pub video: String,
    /// `<|image>`, `<image|>`: around each frame's soft tokens.
    pub boi: String,
    pub eoi: String,
}

/// A video's frames (patches `[frames, rows, columns]`) as items of their own, and the text
/// its placeholder becomes: each frame's timestamp (of `frame_indices` at `fps`), `boi`, one
/// video token, `eoi`. Each frame is keyed by the video's hash and its index.
pub(super) fn frames(
    t: &VideoText,
    video: &VisionInput,
    frame_indices: &[usize],
    fps: f32,
    hash: u128,
) -> Result<(Vec<FrameItem>, String), ApiError> {
    let [n, h, w] = video.grid_thw;
    if frame_indices.len() != n {
        return Err(ApiError::validation(format!(
            "the video has {n} frames but {} frame indices",
            frame_indices.len()
        )));
    }
    let per = video.pixels.len() / n.max(1);
    let mut text = Vec::with_capacity(n);
    let items = (0..n)
        .map(|k| {
            let stamp = lmi_media::gemma4_video::timestamp_text(frame_indices[k], fps);
            text.push(format!("{stamp} {}{}{}", t.boi, t.video, t.eoi));
            let key = [hash.to_le_bytes(), (k as u128).to_le_bytes()].concat();
            FrameItem {
                timestamp: Vec::new(),
                input: Arc::new(VisionInput {
                    kind: video.kind,
                    grid_thw: [1, h, w],
                    pixels: video.pixels[k * per..(k + 1) * per].to_vec(),
                    merge_size: video.merge_size,
                    t_scale: video.t_scale,
                }),
                hash: lmi_media::content_hash(&key),
            }
        })
        .collect();
    Ok((items, text.join(" ")))
}

/// The rendered prompt text with each Gemma 4 video's placeholder (in the order of the
/// videos) replaced by its frames' text; unchanged when no item is such a video.
pub fn rewrite_text<'a>(
    setup: Option<&VisionSetup>,
    text: &'a str,
    items: &[LoadedItem],
) -> Result<Cow<'a, str>, ApiError> {
    let (Some(t), true) = (
        setup.and_then(|s| s.gemma4_video.as_ref()),
        items.iter().any(|i| i.text.is_some()),
    ) else {
        return Ok(Cow::Borrowed(text));
    };
    let videos: Vec<&str> = items.iter().filter_map(|i| i.text.as_deref()).collect();
    let parts: Vec<&str> = text.split(t.video.as_str()).collect();
    if parts.len() != videos.len() + 1 {
        return Err(ApiError::validation(format!(
            "the prompt has {} {} placeholders for {} videos: the chat template writes one per \
             video; do not type placeholder tokens in the text",
            parts.len() - 1,
            t.video,
            videos.len()
        ))
        .with_param("messages"));
    }
    let mut out = String::with_capacity(text.len() + videos.iter().map(|v| v.len()).sum::<usize>());
    for (k, part) in parts.iter().enumerate() {
        out.push_str(part);
        if let Some(v) = videos.get(k) {
            out.push_str(v);
        }
    }
    Ok(Cow::Owned(out))
}

/// The items with each Gemma 4 video split into its frames, one item per video token.
pub(super) fn split_frames(items: Vec<LoadedItem>) -> Vec<LoadedItem> {
    items
        .into_iter()
        .flat_map(|item| match item.text {
            Some(_) => item
                .frames
                .into_iter()
                .map(|f| LoadedItem {
                    input: f.input,
                    hash: f.hash,
                    frames: Vec::new(),
                    text: None,
                })
                .collect(),
            None => vec![item],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use lmi_engine::ModelConfig;

    use super::super::{VisionSetup, expand, video_item};
    use super::*;
    use crate::config::media::MediaOptions;

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gemma4/vision")
    }

    /// The fixture's video chat prompt (8 PNG frames at 2 fps, 4 kept) laid out as
    /// transformers' `Gemma4Processor` lays it out: the same token ids, each frame an item
    /// of its own over its run of soft tokens.
    #[test]
    fn a_video_becomes_the_processors_frames() {
        let model = dir();
        let config = ModelConfig::from_file(&model.join("config.json")).unwrap();
        let tok = lmi_text::Tokenizer::from_dir(&model).unwrap();
        let setup = VisionSetup::for_model(&model, &config, &tok, &MediaOptions::default())
            .unwrap()
            .unwrap();
        assert!(setup.gemma4_video.is_some());
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(model.join("reference.json")).unwrap())
                .unwrap();
        let v = &r["video"];
        let frames: Vec<_> = (0..8)
            .map(|i| {
                let bytes = std::fs::read(model.join(format!("video/frame_{i:03}.png")));
                lmi_media::decode_image(&bytes.unwrap(), &Default::default()).unwrap()
            })
            .collect();
        let indices = lmi_media::sample_frame_indices(8, 2.0, &setup.processor);
        let want: Vec<usize> = serde_json::from_value(v["frame_indices"].clone()).unwrap();
        assert_eq!(indices, want);
        let kept: Vec<_> = indices.iter().map(|&i| frames[i].clone()).collect();
        let patches = lmi_media::preprocess_video(&kept, &setup.processor).unwrap();
        let item = video_item(&setup, patches, &indices, 2.0, 7).unwrap();
        assert_eq!(item.frames.len(), 4);
        let items = vec![item];
        let text = rewrite_text(Some(&setup), v["text"].as_str().unwrap(), &items).unwrap();
        let ids = tok.encode(&text, false).unwrap();
        let prompt = expand(Some(&setup), ids, items).unwrap();
        let want: Vec<u32> = serde_json::from_value(v["input_ids"].clone()).unwrap();
        assert_eq!(prompt.to_vec(), want);
        // Each frame one run of soft tokens where transformers' mm_token_type_ids has one.
        let types: Vec<u32> = serde_json::from_value(v["mm_token_type_ids"].clone()).unwrap();
        let runs: Vec<(usize, usize)> = (0..types.len())
            .filter(|&i| types[i] != 0 && (i == 0 || types[i - 1] == 0))
            .map(|s| (s, (s..types.len()).find(|&j| types[j] == 0).unwrap()))
            .collect();
        let got: Vec<(usize, usize)> = prompt.media().iter().map(|m| (m.start, m.end())).collect();
        assert_eq!(got, runs);
        let hashes: std::collections::HashSet<u128> =
            prompt.media().iter().map(|m| m.item.hash).collect();
        assert_eq!(hashes.len(), 4, "each frame has its own hash");
    }

    /// A prompt whose placeholders do not match its videos is refused, saying what to fix.
    #[test]
    fn a_typed_placeholder_is_refused() {
        let model = dir();
        let config = ModelConfig::from_file(&model.join("config.json")).unwrap();
        let tok = lmi_text::Tokenizer::from_dir(&model).unwrap();
        let setup = VisionSetup::for_model(&model, &config, &tok, &MediaOptions::default())
            .unwrap()
            .unwrap();
        let frame = lmi_media::RgbImage::new(108, 84, vec![9; 108 * 84 * 3]).unwrap();
        let patches = lmi_media::preprocess_video(&[frame], &setup.processor).unwrap();
        let item = video_item(&setup, patches, &[0], 2.0, 1).unwrap();
        let err = rewrite_text(Some(&setup), "a <|video|> b <|video|>", &[item]).unwrap_err();
        assert!(
            err.message
                .contains("2 <|video|> placeholders for 1 videos"),
            "{}",
            err.message
        );
    }
}
