//! Images (and video) in requests, for a vision-language model: each item is read (a `data:`
//! URL, or a file for `lmi infer`), decoded and preprocessed as the model's HF processor does,
//! and its one placeholder token in the tokenized prompt becomes a media span of as many
//! placeholders as the vision tower gives it tokens. Every refusal is a 400 that says what to
//! change, and nothing is decoded for a request that breaks a limit.

pub mod fetch;
mod frames;
pub mod gemma4_video;
pub mod markdown;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmi_api::ApiError;
use lmi_engine::ModelConfig;
use lmi_engine::vision::{MediaKind, VisionInput};
use lmi_media::{ImageLimits, ProcessorConfig};
use lmi_scheduler::{MediaSpan, Prompt, Span};

use crate::config::media::MediaOptions;
use frames::frame_items;
pub use frames::{FrameItem, FrameLayout};

/// What a vision-language model needs to take media: its processor, its placeholder tokens,
/// and the server's limits.
#[derive(Debug, Clone)]
pub struct VisionSetup {
    pub processor: ProcessorConfig,
    pub image_token: u32,
    pub video_token: u32,
    pub merge_size: usize,
    pub options: MediaOptions,
    pub image_limits: ImageLimits,
    pub video_limits: lmi_media::VideoLimits,
    /// Qwen2.5-VL: M-RoPE temporal positions per second of video (None: one per grid step,
    /// as Qwen2-VL).
    pub video_positions_per_second: Option<f32>,
    /// Files may be read (`lmi infer`, never the HTTP server), relative to this directory.
    pub files_from: Option<PathBuf>,
    /// What a markdown image in TGI `inputs` becomes: the chat template's image marker.
    pub image_marker: String,
    /// Qwen3-VL, Qwen3.5: videos are laid out a temporal patch at a time, each after its
    /// timestamp (None: a video is one run of placeholders).
    pub frames: Option<FrameLayout>,
    /// Gemma 4: the (begin, end) tokens an image's soft tokens go between, as its processor
    /// widens the template's one image token (`Gemma4Processor.replace_image_token`).
    pub image_wrap: Option<(u32, u32)>,
    /// Gemma 4: a video is written frame by frame into the prompt text before it is
    /// tokenized ([`gemma4_video`]).
    pub gemma4_video: Option<gemma4_video::VideoText>,
}

impl VisionSetup {
    /// The setup of a model directory whose config has a vision tower (None for text models).
    pub fn for_model(
        dir: &Path,
        config: &ModelConfig,
        tokenizer: &lmi_text::Tokenizer,
        options: &MediaOptions,
    ) -> anyhow::Result<Option<Self>> {
        let Some(v) = &config.vision else {
            return Ok(None);
        };
        let mut processor = ProcessorConfig::from_dir(dir)
            .map_err(|e| anyhow::anyhow!("the model's image processor ({}): {e}", dir.display()))?;
        if let Some(cap) = options.max_pixels {
            processor.max_pixels = processor.max_pixels.min(cap);
        }
        let video_processor = processor.video_processor;
        let gemma4_frames = processor.gemma4_video;
        Ok(Some(VisionSetup {
            processor,
            image_token: v.image_token_id,
            video_token: v.video_token_id,
            merge_size: v.spatial_merge_size,
            options: options.clone(),
            image_limits: ImageLimits::default(),
            // A server's share of video: 50 MiB, 64 M sampled pixels (192 MB of RGB); Gemma 4
            // keeps a fixed number of frames (32), as many 1080p ones as that.
            video_limits: lmi_media::VideoLimits {
                max_bytes: 50 << 20,
                max_total_pixels: gemma4_frames.map_or(64_000_000, |v| {
                    64_000_000u64.max(v.num_frames as u64 * 1920 * 1088)
                }),
                ..Default::default()
            },
            video_positions_per_second: (v.variant == lmi_engine::vision::VisionVariant::Qwen25Vl)
                .then_some(v.tokens_per_second),
            files_from: None,
            frames: match (
                video_processor,
                v.vision_start_token_id,
                v.vision_end_token_id,
            ) {
                (lmi_media::VideoProcessor::Qwen3Vl, Some(vision_start), Some(vision_end)) => {
                    Some(FrameLayout {
                        tokenizer: tokenizer.clone(),
                        vision_start,
                        vision_end,
                    })
                }
                _ => None,
            },
            image_wrap: v.gemma4.as_ref().map(|g| (g.boi_token_id, g.eoi_token_id)),
            gemma4_video: match (&v.gemma4, gemma4_frames) {
                (Some(g), Some(_)) => {
                    let text = |id: u32| {
                        tokenizer.id_to_token(id).ok_or_else(|| {
                            anyhow::anyhow!("Gemma 4's media token {id} is not in the tokenizer")
                        })
                    };
                    let video = text(v.video_token_id)?;
                    // transformers' processor adds `<|video|>` as a special token itself; a
                    // tokenizer that does not read it as one token takes no video here.
                    let one = tokenizer.encode(&video, false).ok() == Some(vec![v.video_token_id]);
                    match one {
                        true => Some(gemma4_video::VideoText {
                            video,
                            boi: text(g.boi_token_id)?,
                            eoi: text(g.eoi_token_id)?,
                        }),
                        false => None,
                    }
                }
                _ => None,
            },
            image_marker: [
                v.vision_start_token_id,
                Some(v.image_token_id),
                v.vision_end_token_id,
            ]
            .into_iter()
            .flatten()
            .filter_map(|id| tokenizer.id_to_token(id))
            .collect(),
        }))
    }
}

/// A media item as a request names it.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaRef {
    pub kind: MediaKind,
    pub url: String,
}

/// Media items of chat messages, in order.
pub fn refs_of_messages(messages: &[lmi_text::Message]) -> Vec<MediaRef> {
    let mut out = Vec::new();
    for m in messages {
        if let lmi_text::chat::Content::Parts(parts) = &m.content {
            for p in parts {
                match p {
                    lmi_text::chat::ContentPart::Image { image } => out.push(MediaRef {
                        kind: MediaKind::Image,
                        url: image.clone(),
                    }),
                    lmi_text::chat::ContentPart::Video { video } => out.push(MediaRef {
                        kind: MediaKind::Video,
                        url: video.clone(),
                    }),
                    lmi_text::chat::ContentPart::Text { .. } => {}
                }
            }
        }
    }
    out
}

/// An item read and preprocessed: what its placeholders become.
#[derive(Debug, Clone)]
pub struct LoadedItem {
    pub input: Arc<VisionInput>,
    pub hash: u128,
    /// A video laid out a temporal patch at a time ([`FrameLayout`]): each patch's timestamp
    /// tokens and its item; a Gemma 4 video's frames (empty otherwise: the item is `input`,
    /// one run).
    pub frames: Vec<FrameItem>,
    /// Gemma 4: the video's text in the prompt in place of its placeholder
    /// ([`gemma4_video::rewrite_text`]), one video token per frame of `frames`.
    pub text: Option<String>,
}

/// Checks the items against the model and the limits (before reading any), then reads them.
pub fn load_all(
    setup: Option<&VisionSetup>,
    refs: &[MediaRef],
) -> Result<Vec<LoadedItem>, ApiError> {
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    let setup = setup.ok_or_else(|| {
        ApiError::validation(
            "this model takes no images or video (Gemma 3's vision tower is not served yet: its \
             language model is): send text only, or serve a vision-language model (Qwen2-VL, \
             Qwen2.5-VL, Qwen3-VL, Qwen3.5, Gemma 4 with its vision_config)",
        )
        .with_param("messages")
    })?;
    check_counts(setup, refs.iter().map(|r| r.kind))?;
    let read = || refs.iter().map(|r| load(setup, r)).collect();
    // Decoding a large image or a video takes tens to hundreds of milliseconds: on a worker
    // of the server's multi-threaded runtime, tell tokio so that the worker's other tasks
    // (every connection it serves) move to another thread meanwhile.
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(read)
        }
        _ => read(),
    }
}

/// The per-prompt limits (option.limit_mm_per_prompt), checked before anything is read.
pub fn check_counts(
    setup: &VisionSetup,
    kinds: impl Iterator<Item = MediaKind>,
) -> Result<(), ApiError> {
    let (mut images, mut videos) = (0, 0);
    for k in kinds {
        match k {
            MediaKind::Image => images += 1,
            MediaKind::Video => videos += 1,
        }
    }
    for (kind, n, max) in [
        ("image", images, setup.options.max_images),
        ("video", videos, setup.options.max_videos),
    ] {
        if n > max {
            return Err(ApiError::validation(format!(
                "the prompt has {n} {kind} items, more than the {max} this server takes per \
                 prompt (option.limit_mm_per_prompt): send fewer"
            ))
            .with_param("messages"));
        }
    }
    Ok(())
}

/// TGI's markdown images at http(s) URLs in `inputs`, fetched into `data:` URLs when this
/// server fetches (limits first, as for chat messages).
pub async fn inline_remote_markdown(
    setup: Option<&VisionSetup>,
    inputs: &mut String,
) -> Result<(), ApiError> {
    let Some(setup) = setup.filter(|s| !s.options.allowed_media_domains.is_empty()) else {
        return Ok(());
    };
    let (_, urls) = markdown::extract_images(inputs, "");
    check_counts(setup, urls.iter().map(|_| MediaKind::Image))
        .map_err(|e| e.with_param("inputs"))?;
    let mut fetched: Vec<String> = urls.clone();
    let max_bytes = setup.image_limits.max_bytes;
    fetch::inline(
        fetched.iter_mut().collect(),
        &setup.options.allowed_media_domains,
        max_bytes,
    )
    .await
    .map_err(|(url, e)| {
        ApiError::validation(format!("{}: {e}", describe(&url))).with_param("inputs")
    })?;
    for (url, data) in urls.iter().zip(&fetched) {
        if url != data {
            *inputs = inputs.replace(&format!("]({url})"), &format!("]({data})"));
        }
    }
    Ok(())
}

/// Fetches the remote (http/https) items of OpenAI chat messages into `data:` URLs, when
/// this server fetches (option.allowed_media_domains); limits are checked first, so nothing
/// is fetched for a request that breaks them.
pub async fn inline_remote_chat(
    setup: Option<&VisionSetup>,
    messages: &mut [lmi_api::openai::ChatMessage],
) -> Result<(), ApiError> {
    use lmi_api::openai::{ContentPart as P, MessageContent};
    let Some(setup) = setup.filter(|s| !s.options.allowed_media_domains.is_empty()) else {
        return Ok(());
    };
    let mut urls = Vec::new();
    let mut kinds = Vec::new();
    for m in messages.iter_mut() {
        if let Some(MessageContent::Parts(parts)) = &mut m.content {
            for p in parts.iter_mut() {
                match p {
                    P::ImageUrl { image_url } => {
                        kinds.push(MediaKind::Image);
                        urls.push(&mut image_url.url);
                    }
                    P::VideoUrl { video_url } => {
                        kinds.push(MediaKind::Video);
                        urls.push(&mut video_url.url);
                    }
                    P::Text { .. } => {}
                }
            }
        }
    }
    check_counts(setup, kinds.into_iter())?;
    let max_bytes = setup
        .image_limits
        .max_bytes
        .max(setup.video_limits.max_bytes);
    fetch::inline(urls, &setup.options.allowed_media_domains, max_bytes)
        .await
        .map_err(|(url, e)| {
            ApiError::validation(format!("{}: {e}", describe(&url))).with_param("messages")
        })
}

fn load(setup: &VisionSetup, r: &MediaRef) -> Result<LoadedItem, ApiError> {
    let max_bytes = match r.kind {
        MediaKind::Image => setup.image_limits.max_bytes,
        MediaKind::Video => setup.video_limits.max_bytes,
    };
    let bytes = read(setup, &r.url, max_bytes)?;
    let bad = |e: lmi_media::MediaError| {
        ApiError::validation(format!("{}: {e}", describe(&r.url))).with_param("messages")
    };
    let hash = lmi_media::content_hash(&bytes);
    match r.kind {
        MediaKind::Image => {
            let img = lmi_media::decode_image(&bytes, &setup.image_limits).map_err(bad)?;
            let patches = lmi_media::preprocess_image(&img, &setup.processor).map_err(bad)?;
            Ok(LoadedItem {
                input: Arc::new(VisionInput {
                    kind: MediaKind::Image,
                    grid_thw: patches.grid_thw,
                    pixels: patches.pixels,
                    merge_size: setup.merge_size,
                    t_scale: 1.0,
                }),
                hash,
                frames: Vec::new(),
                text: None,
            })
        }
        MediaKind::Video if setup.image_wrap.is_some() && setup.gemma4_video.is_none() => {
            Err(ApiError::validation(
                "this Gemma 4 model takes no video here: its tokenizer does not read the video \
                 token as one token; send the video's frames as images",
            )
            .with_param("messages"))
        }
        MediaKind::Video => {
            // Frames kept at the processor's rate (2 a second by default), as vLLM does;
            // Gemma 4's processor keeps `num_frames` (32) spread over the clip.
            let cfg = &setup.processor;
            let v = lmi_media::decode_video_with(&bytes, &setup.video_limits, cfg).map_err(bad)?;
            let patches = lmi_media::preprocess_video(&v.frames, cfg).map_err(bad)?;
            video_item(setup, patches, &v.frame_indices, v.fps, hash)
        }
    }
}

/// A video's item from its patches, the indices of its sampled frames and its frame rate:
/// one run of placeholders, (Qwen3-VL) one item per temporal patch after its timestamp, or
/// (Gemma 4) one item per frame after its timestamp.
pub fn video_item(
    setup: &VisionSetup,
    patches: lmi_media::Patches,
    frame_indices: &[usize],
    fps: f32,
    hash: u128,
) -> Result<LoadedItem, ApiError> {
    let cfg = &setup.processor;
    // Qwen2.5-VL: seconds per temporal patch, as the HF processor computes it from its fps.
    let seconds = cfg.temporal_patch_size as f32 / cfg.fps.max(f32::MIN_POSITIVE);
    let t_scale = setup
        .video_positions_per_second
        .map_or(1.0, |tps| seconds * tps);
    let input = VisionInput {
        kind: MediaKind::Video,
        grid_thw: patches.grid_thw,
        pixels: patches.pixels,
        merge_size: setup.merge_size,
        t_scale,
    };
    let (frames, text) = match (&setup.frames, &setup.gemma4_video) {
        (Some(layout), _) => {
            let stamps =
                lmi_media::qwen3_video::timestamps(frame_indices, fps, cfg.temporal_patch_size);
            (frame_items(layout, &input, &stamps, hash)?, None)
        }
        (None, Some(t)) => {
            let (frames, text) = gemma4_video::frames(t, &input, frame_indices, fps, hash)?;
            (frames, Some(text))
        }
        (None, None) => (Vec::new(), None),
    };
    Ok(LoadedItem {
        input: Arc::new(input),
        hash,
        frames,
        text,
    })
}

/// The bytes an item names: a `data:` URL, or (in `lmi infer`) a file.
fn read(setup: &VisionSetup, url: &str, max_bytes: usize) -> Result<Vec<u8>, ApiError> {
    let err = |msg: String| ApiError::validation(msg).with_param("messages");
    if url.starts_with("data:") {
        let limits = ImageLimits {
            max_bytes,
            ..setup.image_limits.clone()
        };
        return lmi_media::parse_data_url(url, &limits)
            .map(|(_, b)| b)
            .map_err(|e| err(format!("{}: {e}", describe(url))));
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        // Fetched before preparing when the server fetches (`fetch::inline`).
        return Err(err(format!(
            "{}: fetching media over http(s) is off on this server (option.allowed_media_domains \
             names the hosts it may fetch from): send the image inline as a data: URL \
             (data:image/png;base64,...)",
            describe(url)
        )));
    }
    let Some(base) = &setup.files_from else {
        return Err(err(format!(
            "{}: media must be a data: URL (data:image/png;base64,...); files are read only \
             by lmi infer",
            describe(url)
        )));
    };
    let path = url.strip_prefix("file://").unwrap_or(url);
    let path = if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        base.join(path)
    };
    let meta =
        std::fs::metadata(&path).map_err(|e| err(format!("media file {}: {e}", path.display())))?;
    if meta.len() as usize > max_bytes {
        return Err(err(format!(
            "media file {} is {} bytes, more than the {max_bytes} allowed",
            path.display(),
            meta.len(),
        )));
    }
    std::fs::read(&path).map_err(|e| err(format!("media file {}: {e}", path.display())))
}

/// A short name for an item in errors (a data: URL without its payload).
fn describe(url: &str) -> String {
    match url.split_once(',') {
        Some((head, _)) if url.starts_with("data:") => format!("{head},..."),
        _ if url.chars().count() > 120 => {
            format!("{}...", url.chars().take(120).collect::<String>())
        }
        _ => url.to_string(),
    }
}

/// The tokenized prompt with each item's single placeholder token widened to its span (a
/// Gemma 4 video's text, [`gemma4_video::rewrite_text`], holds one placeholder per frame).
pub fn expand(
    setup: Option<&VisionSetup>,
    ids: Vec<u32>,
    items: Vec<LoadedItem>,
) -> Result<Prompt, ApiError> {
    let Some(setup) = setup.filter(|_| !items.is_empty()) else {
        return Ok(Prompt::text(ids));
    };
    let items = gemma4_video::split_frames(items);
    let is_pad = |t: u32| t == setup.image_token || t == setup.video_token;
    let pads = ids.iter().filter(|&&t| is_pad(t)).count();
    if pads != items.len() {
        return Err(ApiError::validation(format!(
            "the prompt has {pads} image/video placeholder tokens for {} media items: the chat \
             template writes one per item; do not type placeholder tokens in the text",
            items.len()
        ))
        .with_param("messages"));
    }
    let mut spans = Vec::new();
    let mut text = Vec::new();
    let mut items = items.into_iter();
    let mut ids = ids.into_iter().peekable();
    while let Some(t) = ids.next() {
        if !is_pad(t) {
            text.push(t);
            continue;
        }
        let Some(item) = items.next() else { break };
        let want = match item.input.kind {
            MediaKind::Image => setup.image_token,
            MediaKind::Video => setup.video_token,
        };
        if t != want {
            return Err(ApiError::validation(
                "the prompt's image and video placeholders are not in the order of its media items",
            )
            .with_param("messages"));
        }
        if let (Some(layout), false) = (&setup.frames, item.frames.is_empty()) {
            // The template's `<|vision_start|>` and `<|vision_end|>` around the placeholder
            // give way to each temporal patch's own, as the Qwen3-VL processor writes them.
            if text.last() == Some(&layout.vision_start) {
                text.pop();
            }
            if ids.peek() == Some(&layout.vision_end) {
                ids.next();
            }
            for f in item.frames {
                text.extend_from_slice(&f.timestamp);
                text.push(layout.vision_start);
                spans.push(Span::Text(std::mem::take(&mut text)));
                spans.push(Span::Media(MediaSpan {
                    placeholder: t,
                    len: f.input.tokens(),
                    hash: f.hash,
                    input: Some(f.input),
                }));
                text.push(layout.vision_end);
            }
            continue;
        }
        let wrap = setup
            .image_wrap
            .filter(|_| item.input.kind == MediaKind::Image);
        if let Some((begin, _)) = wrap {
            text.push(begin);
        }
        if !text.is_empty() {
            spans.push(Span::Text(std::mem::take(&mut text)));
        }
        spans.push(Span::Media(MediaSpan {
            placeholder: t,
            len: item.input.tokens(),
            hash: item.hash,
            input: Some(item.input),
        }));
        if let Some((_, end)) = wrap {
            text.push(end);
        }
    }
    if !text.is_empty() {
        spans.push(Span::Text(text));
    }
    Ok(Prompt::from_spans(spans))
}
