//! Media options: how many items a prompt may carry, the processor's pixel cap, and the hosts
//! images may be fetched from.

use std::collections::BTreeMap;

use super::{Setting, source_of};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaOptions {
    /// Items per prompt (option.limit_mm_per_prompt, as vLLM: `image=4,video=1`).
    pub max_images: usize,
    pub max_videos: usize,
    /// Caps the processor's `max_pixels` (option.max_pixels): fewer patches per image.
    pub max_pixels: Option<u64>,
    /// Hosts http(s) media may be fetched from (option.allowed_media_domains, comma-separated,
    /// `*.example.com` for subdomains); empty: fetching is off, images come as data: URLs.
    pub allowed_media_domains: Vec<String>,
}

impl Default for MediaOptions {
    fn default() -> Self {
        MediaOptions {
            max_images: 8,
            max_videos: 1,
            max_pixels: None,
            allowed_media_domains: Vec::new(),
        }
    }
}

pub(super) fn parse(raw: &BTreeMap<String, Setting>) -> anyhow::Result<MediaOptions> {
    let mut m = MediaOptions::default();
    let get = |k: &str| {
        raw.get(k)
            .map(|s| s.value.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(v) = get("option.limit_mm_per_prompt") {
        let bad = |why: String| {
            anyhow::anyhow!(
                "option.limit_mm_per_prompt={v:?} ({}): {why}; expected e.g. image=4,video=1",
                source_of(raw, "option.limit_mm_per_prompt")
            )
        };
        // vLLM also takes JSON: {"image": 4, "video": 1}.
        let pairs: Vec<(String, String)> = if v.starts_with('{') {
            let map: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(&v).map_err(|e| bad(e.to_string()))?;
            map.into_iter().map(|(k, x)| (k, x.to_string())).collect()
        } else {
            v.split(',')
                .map(|kv| {
                    let (k, x) = kv
                        .split_once('=')
                        .ok_or_else(|| bad(format!("{kv:?} has no '='")))?;
                    Ok((k.trim().to_string(), x.trim().to_string()))
                })
                .collect::<anyhow::Result<_>>()?
        };
        for (k, x) in pairs {
            let n: usize = x
                .parse()
                .map_err(|_| bad(format!("{x:?} is not a count")))?;
            match k.as_str() {
                "image" => m.max_images = n,
                "video" => m.max_videos = n,
                other => return Err(bad(format!("unknown modality {other:?} (image, video)"))),
            }
        }
    }
    if let Some(v) = get("option.max_pixels") {
        let n: u64 = v.parse().ok().filter(|&n| n >= 3136).ok_or_else(|| {
            anyhow::anyhow!(
                "option.max_pixels={v:?} ({}): expected a pixel count of at least 3136 (56x56)",
                source_of(raw, "option.max_pixels")
            )
        })?;
        m.max_pixels = Some(n);
    }
    if let Some(v) = get("option.allowed_media_domains") {
        m.allowed_media_domains = v
            .split(',')
            .map(|d| d.trim().to_ascii_lowercase())
            .filter(|d| !d.is_empty())
            .collect();
    }
    Ok(m)
}
