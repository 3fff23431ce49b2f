//! What GLM-4.5 (`Glm4MoeForCausalLM`) and MiniMax-M2 configs spell their own way.

use super::Architecture;

/// The rotated share of each head: `partial_rotary_factor` where given; MiniMax-M2's
/// `rotary_dim` as a share of `head_dim`; GLM-4.5's default half (transformers'
/// `Glm4MoeConfig` sets 0.5 when the config omits it).
pub(super) fn partial_rotary_factor(
    architecture: Architecture,
    partial: Option<f64>,
    rotary_dim: Option<usize>,
    head_dim: usize,
) -> Option<f64> {
    match (architecture, partial, rotary_dim) {
        (_, Some(f), _) => Some(f),
        (Architecture::MiniMaxM2, None, Some(r)) => Some(r as f64 / head_dim as f64),
        (Architecture::Glm4Moe, None, _) => Some(0.5),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::ModelConfig;
    use super::super::moe::Routing;
    use super::*;

    /// zai-org/GLM-4.5's config.json (the fields that matter).
    const GLM45: &str = r#"{"architectures":["Glm4MoeForCausalLM"],"attention_bias":true,
        "head_dim":128,"hidden_act":"silu","hidden_size":5120,"partial_rotary_factor":0.5,
        "intermediate_size":12288,"max_position_embeddings":131072,"model_type":"glm4_moe",
        "moe_intermediate_size":1536,"norm_topk_prob":true,"num_attention_heads":96,
        "n_group":1,"topk_group":1,"n_routed_experts":160,"n_shared_experts":1,
        "routed_scaling_factor":2.5,"num_experts_per_tok":8,"first_k_dense_replace":3,
        "num_hidden_layers":92,"num_key_value_heads":8,"rms_norm_eps":1e-05,
        "rope_theta":1000000,"num_nextn_predict_layers":1,"tie_word_embeddings":false,
        "torch_dtype":"bfloat16","use_qk_norm":true,"vocab_size":151552,
        "eos_token_id":[151329,151336,151338]}"#;

    #[test]
    fn glm_4_5_routes_deepseek_style_after_three_dense_layers() {
        let c = ModelConfig::from_json(GLM45).unwrap();
        assert_eq!(c.architecture, Architecture::Glm4Moe);
        assert_eq!((c.head_dim, c.rotary_dim), (128, 64));
        let m = c.moe.unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate_size),
            (160, 8, 1536)
        );
        assert_eq!(m.dense_layers, [0, 1, 2]);
        assert_eq!(m.shared_width, Some(1536));
        assert!(!m.shared_gated() && m.correction_bias());
        assert_eq!(
            m.routing,
            Routing::SigmoidGroupedTopK {
                n_group: 1,
                topk_group: 1,
                renormalize: true,
                scaling: 2.5
            }
        );
        // Without partial_rotary_factor: transformers' default half.
        let c =
            ModelConfig::from_json(&GLM45.replace(r#""partial_rotary_factor":0.5,"#, "")).unwrap();
        assert_eq!(c.rotary_dim, 64);
    }

    /// DeepSeek-V3's group limit and shared experts as parse_deepseek reads them.
    #[test]
    fn groups_and_shared_experts_are_read_and_checked() {
        let grouped = GLM45
            .replace(
                r#""n_group":1,"topk_group":1"#,
                r#""n_group":8,"topk_group":4"#,
            )
            .replace(r#""n_shared_experts":1"#, r#""n_shared_experts":2"#);
        let m = ModelConfig::from_json(&grouped).unwrap().moe.unwrap();
        assert!(matches!(
            m.routing,
            Routing::SigmoidGroupedTopK {
                n_group: 8,
                topk_group: 4,
                ..
            }
        ));
        assert_eq!(m.shared_width, Some(2 * 1536));
        let bad = GLM45.replace(r#""n_group":1"#, r#""n_group":7"#);
        let e = ModelConfig::from_json(&bad).unwrap_err();
        assert!(e.contains("n_group (7) must divide"), "{e}");
        let softmax = GLM45.replace("{", r#"{"scoring_func":"softmax","#);
        let e = ModelConfig::from_json(&softmax).unwrap_err();
        assert!(e.contains("scoring_func"), "{e}");
    }

    /// MiniMaxAI/MiniMax-M2's config.json (the fields that matter).
    #[test]
    fn minimax_m2_rotates_rotary_dim_and_routes_without_groups() {
        let c = ModelConfig::from_json(
            r#"{"architectures":["MiniMaxM2ForCausalLM"],"head_dim":128,"hidden_size":3072,
            "intermediate_size":1536,"num_attention_heads":48,"num_key_value_heads":8,
            "num_hidden_layers":62,"num_local_experts":256,"num_experts_per_tok":8,
            "rotary_dim":64,"rope_theta":5000000,"scoring_func":"sigmoid",
            "use_routing_bias":true,"use_qk_norm":true,"qk_norm_type":"per_layer",
            "shared_intermediate_size":0,"vocab_size":200064,"rms_norm_eps":1e-06,
            "num_mtp_modules":3,"use_mtp":true}"#,
        )
        .unwrap();
        assert_eq!(c.architecture, Architecture::MiniMaxM2);
        assert_eq!(c.rotary_dim, 64);
        assert!(c.architecture.qk_norm_whole());
        let m = c.moe.unwrap();
        assert_eq!(
            (m.num_experts, m.top_k, m.expert_intermediate_size),
            (256, 8, 1536)
        );
        assert!(m.dense_layers.is_empty() && m.shared_width.is_none());
        assert_eq!(
            m.routing,
            Routing::SigmoidGroupedTopK {
                n_group: 1,
                topk_group: 1,
                renormalize: true,
                scaling: 1.0
            }
        );
    }
}
