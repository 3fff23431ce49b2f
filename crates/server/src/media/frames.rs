//! Qwen3-VL's (and Qwen3.5's) video layout: the processor writes a video one temporal patch
//! at a time, `<t seconds><|vision_start|>` + the patch's placeholders + `<|vision_end|>`, in
//! place of the chat template's `<|vision_start|><|video_pad|><|vision_end|>`. Each patch is a
//! media item of its own (the tower encodes frames apart anyway), so the scheduler, the
//! prefix cache and M-RoPE see what they see for images.

use std::sync::Arc;

use lmi_api::ApiError;
use lmi_engine::vision::VisionInput;

/// What a model needs to lay a video out by temporal patch.
#[derive(Debug, Clone)]
pub struct FrameLayout {
    /// Tokenizes the timestamps.
    pub tokenizer: lmi_text::Tokenizer,
    pub vision_start: u32,
    pub vision_end: u32,
}

/// One temporal patch of a video, as its own media item after its timestamp.
#[derive(Debug, Clone)]
pub struct FrameItem {
    pub timestamp: Vec<u32>,
    pub input: Arc<VisionInput>,
    pub hash: u128,
}

/// A video's temporal patches as items of their own, each with its timestamp's tokens
/// (`seconds`, one per patch); each keyed by the video's hash and its index, so the prefix
/// cache and the encoder cache tell them apart.
pub(super) fn frame_items(
    layout: &FrameLayout,
    video: &VisionInput,
    seconds: &[f64],
    hash: u128,
) -> Result<Vec<FrameItem>, ApiError> {
    let [t, h, w] = video.grid_thw;
    if seconds.len() != t {
        return Err(ApiError::validation(format!(
            "the video has {t} temporal patches but {} timestamps",
            seconds.len()
        )));
    }
    let per = video.pixels.len() / t.max(1);
    (0..t)
        .map(|k| {
            // Tokenized alone: in the prompt a timestamp follows a special token or the
            // template's newline, where the pre-tokenizer splits anyway.
            let text = lmi_media::qwen3_video::timestamp_text(seconds[k]);
            let timestamp = layout
                .tokenizer
                .encode(&text, false)
                .map_err(|e| ApiError::validation(format!("tokenizing a video timestamp: {e}")))?;
            let key = [hash.to_le_bytes(), (k as u128).to_le_bytes()].concat();
            Ok(FrameItem {
                timestamp,
                input: Arc::new(VisionInput {
                    kind: video.kind,
                    grid_thw: [1, h, w],
                    pixels: video.pixels[k * per..(k + 1) * per].to_vec(),
                    merge_size: video.merge_size,
                    t_scale: video.t_scale,
                }),
                hash: lmi_media::content_hash(&key),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use lmi_engine::ModelConfig;

    use super::super::{VisionSetup, expand, video_item};
    use crate::config::media::MediaOptions;

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen3_vl")
    }

    /// The fixture's video prompt (8 PNG frames at 4 fps) laid out as transformers' Qwen3-VL
    /// processor lays it out: the same token ids, each temporal patch an item of its own.
    #[test]
    fn a_video_becomes_the_processors_timestamps_and_runs() {
        let model = dir().join("qwen3_vl");
        let config = ModelConfig::from_file(&model.join("config.json")).unwrap();
        let tok = lmi_text::Tokenizer::from_dir(&model).unwrap();
        let setup = VisionSetup::for_model(&model, &config, &tok, &MediaOptions::default())
            .unwrap()
            .unwrap();
        assert!(setup.frames.is_some());
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(model.join("reference.json")).unwrap())
                .unwrap();
        let p = &reference["prompts"][3];
        let frames: Vec<_> = (0..8)
            .map(|i| {
                let bytes = std::fs::read(dir().join(format!("media/video/frame_{i:03}.png")));
                lmi_media::decode_image(&bytes.unwrap(), &Default::default()).unwrap()
            })
            .collect();
        let patches = lmi_media::preprocess_video(&frames, &setup.processor).unwrap();
        let indices: Vec<usize> = (0..8).collect();
        let item = video_item(&setup, patches, &indices, 4.0, 7).unwrap();
        assert_eq!(item.frames.len(), 4);
        let ids = tok.encode(p["text"].as_str().unwrap(), false).unwrap();
        let prompt = expand(Some(&setup), ids, vec![item]).unwrap();
        let want: Vec<u32> = serde_json::from_value(p["input_ids"].clone()).unwrap();
        assert_eq!(prompt.to_vec(), want);
        let runs: Vec<(usize, usize)> = p["media"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let (a, b) = (m["pad_start"].as_u64(), m["pad_end"].as_u64());
                (a.unwrap() as usize, b.unwrap() as usize)
            })
            .collect();
        let got: Vec<(usize, usize)> = prompt.media().iter().map(|m| (m.start, m.end())).collect();
        let hashes: std::collections::HashSet<u128> =
            prompt.media().iter().map(|m| m.item.hash).collect();
        assert_eq!(got, runs);
        assert_eq!(hashes.len(), 4, "each temporal patch has its own hash");
    }
}
