//! The vision tower's part of a Qwen-VL `config.json` (`vision_config` and the media token
//! ids), for Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5.

use serde::Deserialize;

/// Which vision tower a checkpoint has; they differ in norms, MLP and attention windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionVariant {
    /// Qwen2-VL: LayerNorm, a QuickGELU MLP (`fc1`, `fc2`), full attention per frame.
    Qwen2Vl,
    /// Qwen2.5-VL: RMSNorm, a SwiGLU MLP with biases, window attention except in the
    /// `fullatt_block_indexes` layers.
    Qwen25Vl,
    /// Qwen3-VL (and Qwen3.5's tower, which has no DeepStack): patches of 16 with a biased
    /// patch embedding, learned position embeddings interpolated to each grid, LayerNorm, a
    /// GELU (tanh) MLP, full attention per frame, and DeepStack mergers on some blocks.
    Qwen3Vl,
    /// Gemma 4: patches of 16 with a learned (x, y) position table, 2-D RoPE over q/k-normed
    /// heads, Gemma RMSNorm sandwiches, a GeGLU MLP, 3x3 average pooling, then the
    /// multimodal embedder (norm, projection) into the language model ([`Gemma4Vision`]).
    Gemma4,
}

/// Gemma 4's tower settings beyond the shared ones
/// ([`crate::config::gemma4_vision`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Vision {
    pub head_dim: usize,
    pub num_kv_heads: usize,
    /// Rows of each axis's position table.
    pub position_embedding_size: usize,
    /// The pooled features are standardized (`std_bias`, `std_scale`).
    pub standardize: bool,
    /// Every projection clamps its input and output (`use_clipped_linears`).
    pub clipped_linears: bool,
    pub rms_norm_eps: f64,
    /// The language model's pad token: an image's soft tokens take its per-layer embedding.
    pub pad_token_id: u32,
    /// The tokens around an image's soft tokens.
    pub boi_token_id: u32,
    pub eoi_token_id: u32,
    /// The language model's `use_bidirectional_attention` is "vision" (or "all"): an
    /// image's tokens attend to each other both ways in the sliding layers.
    pub bidirectional_images: bool,
}

/// The activation of a Qwen3-VL tower's block MLP (`vision_config.hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionAct {
    /// `gelu_pytorch_tanh`: GELU with the tanh approximation (every published Qwen3-VL).
    GeluTanh,
    /// `gelu`: GELU with the exact erf.
    Gelu,
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
    /// Qwen3-VL: rows of the learned position table (a square grid, interpolated to each
    /// item's grid); 0 for the towers without one.
    pub num_position_embeddings: usize,
    /// Qwen3-VL: the blocks whose output also goes through a merger of its own, added to the
    /// language model's hidden states after its first layers (DeepStack), in this order.
    pub deepstack_visual_indexes: Vec<usize>,
    /// Qwen3-VL: the block MLP's activation.
    pub act: VisionAct,
    /// Base of the 2D rotary embedding's frequencies.
    pub rope_theta: f64,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
    /// Gemma 4's own settings (None for the Qwen towers).
    pub gemma4: Option<Gemma4Vision>,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        match &self.gemma4 {
            Some(g) => g.head_dim,
            None => self.hidden_size / self.num_heads,
        }
    }

    /// Values per patch: channels × temporal patch × patch × patch.
    pub fn patch_dim(&self) -> usize {
        self.in_chans * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches merged into one language-model token.
    pub fn merge_unit(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }

    /// Side of the square learned position grid (Qwen3-VL's `num_grid_per_side`).
    pub fn position_grid_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt() as usize
    }

    /// Values per token the tower gives: the merger's output, then one more `out_hidden_size`
    /// of each DeepStack merger (Qwen3-VL), in layer order.
    pub fn output_width(&self) -> usize {
        self.out_hidden_size * (1 + self.deepstack_visual_indexes.len())
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
    num_position_embeddings: Option<usize>,
    deepstack_visual_indexes: Option<Vec<usize>>,
    hidden_act: Option<String>,
    rope_parameters: Option<RawVisionRope>,
    rope_theta: Option<f64>,
}

#[derive(Deserialize)]
struct RawVisionRope {
    rope_theta: Option<f64>,
}

/// Reads the vision tower of a Qwen-VL config; `top` is the whole config.json (text fields
/// merged), `lm_hidden` the language model's hidden size. `deepstack`: the DeepStack blocks
/// when the architecture fixes them (Qwen3.5's tower has none, whatever the config says).
pub(crate) fn parse(
    variant: VisionVariant,
    top: &serde_json::Map<String, serde_json::Value>,
    lm_hidden: usize,
    deepstack: Option<Vec<usize>>,
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
        VisionVariant::Qwen25Vl | VisionVariant::Qwen3Vl | VisionVariant::Gemma4 => (
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
    let depth = req(v.depth, "depth")?;
    let qwen3 = variant == VisionVariant::Qwen3Vl;
    // transformers' Qwen3VLVisionConfig defaults (Qwen3.5's config class has no DeepStack).
    let num_position_embeddings = match qwen3 {
        true => v.num_position_embeddings.unwrap_or(2304),
        false => 0,
    };
    let side = (num_position_embeddings as f64).sqrt() as usize;
    if qwen3 && (side < 2 || side * side != num_position_embeddings) {
        return Err(format!(
            "vision_config.num_position_embeddings ({num_position_embeddings}) must be a square of at least 4 (the learned position grid)"
        ));
    }
    let deepstack_visual_indexes = match qwen3 {
        true => deepstack.unwrap_or_else(|| v.deepstack_visual_indexes.clone().unwrap_or_default()),
        false => Vec::new(),
    };
    if let Some(&bad) = deepstack_visual_indexes.iter().find(|&&i| i >= depth) {
        return Err(format!(
            "vision_config.deepstack_visual_indexes names block {bad} of a {depth}-block tower"
        ));
    }
    let act = match v.hidden_act.as_deref() {
        None | Some("gelu_pytorch_tanh" | "gelu_tanh") => VisionAct::GeluTanh,
        Some("gelu") => VisionAct::Gelu,
        Some(other) if qwen3 => {
            return Err(format!(
                "vision_config.hidden_act {other:?} is not supported (supported: gelu_pytorch_tanh, gelu)"
            ));
        }
        // Qwen2-VL's and Qwen2.5-VL's MLPs are fixed by their variant.
        Some(_) => VisionAct::GeluTanh,
    };
    Ok(VisionConfig {
        variant,
        depth,
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
            VisionVariant::Qwen2Vl | VisionVariant::Qwen3Vl | VisionVariant::Gemma4 => 0,
        },
        fullatt_block_indexes: v.fullatt_block_indexes.unwrap_or_default(),
        tokens_per_second: v.tokens_per_second.unwrap_or(2.0),
        num_position_embeddings,
        deepstack_visual_indexes,
        act,
        rope_theta: v
            .rope_parameters
            .as_ref()
            .and_then(|r| r.rope_theta)
            .or(v.rope_theta)
            .unwrap_or(10_000.0),
        image_token_id,
        video_token_id: id("video_token_id").unwrap_or(image_token_id + 1),
        vision_start_token_id: id("vision_start_token_id"),
        vision_end_token_id: id("vision_end_token_id"),
        gemma4: None,
    })
}
