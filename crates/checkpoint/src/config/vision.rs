//! The vision tower's part of a Qwen-VL `config.json` (`vision_config` and the media token
//! ids), for Qwen2-VL and Qwen2.5-VL.

use serde::Deserialize;

/// Which vision tower a checkpoint has; they differ in norms, MLP and attention windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionVariant {
    /// Qwen2-VL: LayerNorm, a QuickGELU MLP (`fc1`, `fc2`), full attention per frame.
    Qwen2Vl,
    /// Qwen2.5-VL: RMSNorm, a SwiGLU MLP with biases, window attention except in the
    /// `fullatt_block_indexes` layers.
    Qwen25Vl,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub variant: VisionVariant,
    pub depth: usize,
    /// Width of the tower's blocks.
    pub hidden_size: usize,
    pub num_heads: usize,
    /// Width of each block's MLP.
    pub intermediate_size: usize,
    /// Width of the merger's output: the language model's hidden size.
    pub out_hidden_size: usize,
    pub in_chans: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    /// Qwen2.5-VL: side of an attention window in pixels (0: no windows).
    pub window_size: usize,
    pub fullatt_block_indexes: Vec<usize>,
    /// Qwen2.5-VL: M-RoPE temporal positions per second of video.
    pub tokens_per_second: f32,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Values per patch: channels × temporal patch × patch × patch.
    pub fn patch_dim(&self) -> usize {
        self.in_chans * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches merged into one language-model token.
    pub fn merge_unit(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }
}

#[derive(Deserialize)]
struct RawVision {
    depth: Option<usize>,
    hidden_size: Option<usize>,
    embed_dim: Option<usize>,
    num_heads: Option<usize>,
    intermediate_size: Option<usize>,
    mlp_ratio: Option<f64>,
    out_hidden_size: Option<usize>,
    in_chans: Option<usize>,
    in_channels: Option<usize>,
    patch_size: Option<usize>,
    spatial_patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    spatial_merge_size: Option<usize>,
    window_size: Option<usize>,
    fullatt_block_indexes: Option<Vec<usize>>,
    tokens_per_second: Option<f32>,
}

/// Reads the vision tower of a Qwen-VL config; `top` is the whole config.json (text fields
/// merged), `lm_hidden` the language model's hidden size.
pub(crate) fn parse(
    variant: VisionVariant,
    top: &serde_json::Map<String, serde_json::Value>,
    lm_hidden: usize,
) -> Result<VisionConfig, String> {
    let raw = top
        .get("vision_config")
        .ok_or("field \"vision_config\" is missing")?;
    let v: RawVision =
        serde_json::from_value(raw.clone()).map_err(|e| format!("vision_config: {e}"))?;
    let id = |k: &str| top.get(k).and_then(|x| x.as_u64()).map(|x| x as u32);
    let req = |x: Option<usize>, name: &str| match x {
        Some(0) | None => Err(format!("vision_config.{name} is missing or 0")),
        Some(x) => Ok(x),
    };
    let (hidden_size, intermediate_size, out_hidden_size) = match variant {
        // Qwen2-VL's `hidden_size` is the merger's output; the blocks are `embed_dim` wide.
        VisionVariant::Qwen2Vl => {
            let dim = req(v.embed_dim, "embed_dim")?;
            let ratio = v.mlp_ratio.unwrap_or(4.0);
            (
                dim,
                (dim as f64 * ratio) as usize,
                v.hidden_size.unwrap_or(lm_hidden),
            )
        }
        VisionVariant::Qwen25Vl => (
            req(v.hidden_size, "hidden_size")?,
            req(v.intermediate_size, "intermediate_size")?,
            v.out_hidden_size.unwrap_or(lm_hidden),
        ),
    };
    if out_hidden_size != lm_hidden {
        return Err(format!(
            "the vision merger's output ({out_hidden_size}) must equal the language model's hidden size ({lm_hidden})"
        ));
    }
    let num_heads = req(v.num_heads, "num_heads")?;
    if hidden_size % num_heads != 0 || (hidden_size / num_heads) % 4 != 0 {
        return Err(format!(
            "vision_config: hidden size {hidden_size} over {num_heads} heads must give a head size that is a multiple of 4 (2D rotary embedding)"
        ));
    }
    let image_token_id = id("image_token_id").ok_or("field \"image_token_id\" is missing")?;
    Ok(VisionConfig {
        variant,
        depth: req(v.depth, "depth")?,
        hidden_size,
        num_heads,
        intermediate_size,
        out_hidden_size,
        in_chans: v.in_chans.or(v.in_channels).unwrap_or(3),
        patch_size: req(v.patch_size.or(v.spatial_patch_size), "patch_size")?,
        temporal_patch_size: v.temporal_patch_size.unwrap_or(2),
        spatial_merge_size: v.spatial_merge_size.unwrap_or(2),
        window_size: match variant {
            VisionVariant::Qwen25Vl => v.window_size.unwrap_or(112),
            VisionVariant::Qwen2Vl => 0,
        },
        fullatt_block_indexes: v.fullatt_block_indexes.unwrap_or_default(),
        tokens_per_second: v.tokens_per_second.unwrap_or(2.0),
        image_token_id,
        video_token_id: id("video_token_id").unwrap_or(image_token_id + 1),
        vision_start_token_id: id("vision_start_token_id"),
        vision_end_token_id: id("vision_end_token_id"),
    })
}
