//! Gemma 4's vision tower (`vision_config` of a `Gemma4ForConditionalGeneration`, transformers'
//! `Gemma4VisionConfig`) and its media token ids, as a [`VisionConfig`] of variant
//! [`VisionVariant::Gemma4`] with [`Gemma4Vision`] beside it.

use serde::Deserialize;

use super::vision::{Gemma4Vision, VisionAct, VisionConfig, VisionVariant};

#[derive(Deserialize)]
struct Raw {
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_activation: Option<String>,
    rms_norm_eps: Option<f64>,
    rope_parameters: Option<RawRope>,
    pooling_kernel_size: Option<usize>,
    patch_size: Option<usize>,
    position_embedding_size: Option<usize>,
    use_clipped_linears: Option<bool>,
    standardize: Option<bool>,
}

#[derive(Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
}

/// The tower of a Gemma 4 config (`top`: config.json with the text fields merged); None
/// without one (`vision_config` absent or null). Defaults are `Gemma4VisionConfig`'s.
pub(crate) fn parse(
    top: &serde_json::Map<String, serde_json::Value>,
    lm_hidden: usize,
) -> Result<Option<VisionConfig>, String> {
    let Some(raw) = top.get("vision_config").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let v: Raw = serde_json::from_value(raw.clone()).map_err(|e| format!("vision_config: {e}"))?;
    let id = |k: &str, default: u32| {
        top.get(k)
            .and_then(|x| x.as_u64())
            .map_or(default, |x| x as u32)
    };
    let hidden_size = v.hidden_size.unwrap_or(768);
    let num_heads = v.num_attention_heads.unwrap_or(12);
    let head_dim = v.head_dim.unwrap_or(64);
    let num_kv_heads = v.num_key_value_heads.unwrap_or(num_heads);
    if !head_dim.is_multiple_of(4) || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
        return Err(format!(
            "vision_config: head_dim {head_dim} must be a multiple of 4 (2-D RoPE) and \
             num_attention_heads {num_heads} a multiple of num_key_value_heads {num_kv_heads}"
        ));
    }
    let rope = v.rope_parameters.as_ref();
    if let Some(t) = rope.and_then(|r| r.rope_type.as_deref())
        && t != "axial"
    {
        return Err(format!(
            "vision_config.rope_parameters.rope_type {t:?} is not supported (Gemma 4's tower is \"axial\")"
        ));
    }
    let act = match v.hidden_activation.as_deref() {
        None | Some("gelu_pytorch_tanh" | "gelu_tanh") => VisionAct::GeluTanh,
        Some("gelu") => VisionAct::Gelu,
        Some(other) => {
            return Err(format!(
                "vision_config.hidden_activation {other:?} is not supported (supported: gelu_pytorch_tanh, gelu)"
            ));
        }
    };
    let pooling = v.pooling_kernel_size.unwrap_or(3);
    let patch_size = v.patch_size.unwrap_or(16);
    if pooling == 0 || patch_size == 0 {
        return Err("vision_config: pooling_kernel_size and patch_size must be positive".into());
    }
    let image_token_id = id("image_token_id", 258_880);
    Ok(Some(VisionConfig {
        variant: VisionVariant::Gemma4,
        depth: v.num_hidden_layers.unwrap_or(16),
        hidden_size,
        num_heads,
        intermediate_size: v.intermediate_size.unwrap_or(3072),
        out_hidden_size: lm_hidden,
        in_chans: 3,
        patch_size,
        temporal_patch_size: 1,
        spatial_merge_size: pooling,
        window_size: 0,
        fullatt_block_indexes: Vec::new(),
        tokens_per_second: 0.0,
        num_position_embeddings: 0,
        deepstack_visual_indexes: Vec::new(),
        act,
        rope_theta: rope.and_then(|r| r.rope_theta).unwrap_or(100.0),
        image_token_id,
        video_token_id: id("video_token_id", 258_884),
        vision_start_token_id: None,
        vision_end_token_id: None,
        gemma4: Some(Gemma4Vision {
            head_dim,
            num_kv_heads,
            position_embedding_size: v.position_embedding_size.unwrap_or(10 * 1024),
            standardize: v.standardize.unwrap_or(false),
            clipped_linears: v.use_clipped_linears.unwrap_or(false),
            rms_norm_eps: v.rms_norm_eps.unwrap_or(1e-6),
            pad_token_id: id("pad_token_id", 0),
            boi_token_id: id("boi_token_id", 255_999),
            eoi_token_id: id("eoi_token_id", 258_882),
            bidirectional_images: top
                .get("use_bidirectional_attention")
                .and_then(|x| x.as_str())
                .is_some_and(|s| s == "vision" || s == "all"),
        }),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_config_reads() {
        let text = include_str!("../../../../tests/fixtures/gemma4/vision/config.json");
        let c = crate::config::ModelConfig::from_json(text).unwrap();
        let v = c.vision.as_ref().unwrap();
        assert_eq!(v.variant, VisionVariant::Gemma4);
        assert_eq!((v.hidden_size, v.num_heads, v.depth), (32, 2, 2));
        assert_eq!(
            (v.patch_size, v.spatial_merge_size, v.out_hidden_size),
            (4, 3, 64)
        );
        assert_eq!(v.image_token_id, 300);
        let g = v.gemma4.as_ref().unwrap();
        assert_eq!((g.boi_token_id, g.eoi_token_id), (301, 302));
        assert!(g.standardize && g.clipped_linears && !g.bidirectional_images);
        assert_eq!((g.head_dim, g.position_embedding_size), (16, 64));
        // The text model's fixture (no vision_config) has none.
        let e2b = include_str!("../../../../tests/fixtures/gemma4/e2b/config.json");
        assert!(
            crate::config::ModelConfig::from_json(e2b)
                .unwrap()
                .vision
                .is_none()
        );
    }
}
