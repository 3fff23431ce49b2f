//! RoPE as config.json gives it: the rotated dimensions (`partial_rotary_factor`), M-RoPE's
//! sections and whether they interleave, and the scalings (Llama 3, linear, YaRN), whichever of
//! transformers' spellings (`rope_scaling`, transformers 5's `rope_parameters`) the file uses;
//! and the inverse frequencies they make.

use serde::Deserialize;

use super::vision::VisionVariant;
use super::{Architecture, ModelConfig};

/// YaRN's `rope_scaling` (gpt-oss): frequencies blended between interpolated and extrapolated
/// over a ramp of dimensions, and cos/sin scaled by the attention factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnScaling {
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub original_max_position_embeddings: f64,
    pub truncate: bool,
    /// Multiplies cos and sin, so q·k by its square.
    pub attention_factor: f64,
}

/// Llama 3's `rope_scaling` (`rope_type: "llama3"`); other types are rejected at load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

#[derive(Deserialize)]
pub(super) struct RawRopeScaling {
    #[serde(alias = "type")]
    pub(super) rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    pub(super) mrope_section: Option<Vec<usize>>,
    // YaRN.
    beta_fast: Option<f64>,
    beta_slow: Option<f64>,
    truncate: Option<bool>,
    attention_factor: Option<f64>,
    mscale: Option<f64>,
    mscale_all_dim: Option<f64>,
}

/// transformers 5 writes RoPE's settings as `rope_parameters` (`rope_theta`, `rope_type`,
/// `partial_rotary_factor`, M-RoPE's sections) where earlier versions wrote top-level fields
/// and `rope_scaling`: moved where the older names are read, unless those are given too.
pub(super) fn rope_parameters(top: &mut serde_json::Map<String, serde_json::Value>) {
    let Some(serde_json::Value::Object(mut rp)) = top.get("rope_parameters").cloned() else {
        return;
    };
    // Per layer type (Gemma 3, OLMo 3): the full-attention layers' settings are the model's;
    // the sliding layers' base is their own. Gemma 4 reads its per-type settings itself
    // (`config/gemma4.rs`: "proportional" RoPE, a partial factor for the global layers only).
    let gemma4 = top
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(|a| a.as_str())
        .is_some_and(|a| a.starts_with("Gemma4For"));
    if let Some(serde_json::Value::Object(full)) = rp.get("full_attention").cloned()
        && !gemma4
    {
        if let Some(theta) = rp
            .get("sliding_attention")
            .and_then(|s| s.get("rope_theta"))
        {
            top.entry("rope_local_base_freq".to_string())
                .or_insert_with(|| theta.clone());
        }
        rp = full;
    }
    for k in ["rope_theta", "partial_rotary_factor"] {
        if let Some(v) = rp.get(k) {
            top.entry(k.to_string()).or_insert_with(|| v.clone());
        }
    }
    let scaled = rp
        .get("rope_type")
        .and_then(|t| t.as_str())
        .is_some_and(|t| t != "default");
    if (scaled || rp.contains_key("mrope_section")) && !top.contains_key("rope_scaling") {
        top.insert("rope_scaling".into(), serde_json::Value::Object(rp));
    }
}

/// The RoPE fields of a [`ModelConfig`].
pub(super) struct Rope {
    pub rotary_dim: usize,
    pub mrope_section: Option<[usize; 3]>,
    pub mrope_interleaved: bool,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub rope_linear_factor: Option<f64>,
    pub rope_yarn: Option<YarnScaling>,
}

/// Resolves `rope_scaling` for a model of `head_dim` (`partial`: its `partial_rotary_factor`);
/// the error names the field to fix.
pub(super) fn parse(
    mut rope_scaling: Option<RawRopeScaling>,
    partial: Option<f64>,
    head_dim: usize,
    architecture: Architecture,
    vision_variant: Option<VisionVariant>,
    max_position_embeddings: Option<usize>,
) -> std::result::Result<Rope, String> {
    let rotary_dim = match partial {
        None => head_dim,
        Some(f) if f > 0.0 && f <= 1.0 => {
            let d = (head_dim as f64 * f) as usize;
            if d == 0 || !d.is_multiple_of(2) {
                return Err(format!(
                    "partial_rotary_factor {f} leaves {d} rotary dimensions of {head_dim}: they must be even and > 0"
                ));
            }
            d
        }
        Some(f) => return Err(format!("partial_rotary_factor ({f}) must be in (0, 1]")),
    };
    if architecture.is_hybrid() && vision_variant.is_none() {
        // Without a vision tower (Qwen3_5ForCausalLM, Qwen3-Next) every position is a text
        // position, which turns every M-RoPE section alike: plain RoPE.
        if let Some(rs) = rope_scaling.as_mut() {
            rs.mrope_section = None;
            if matches!(rs.rope_type.as_deref(), Some("mrope")) {
                rs.rope_type = None;
            }
        }
    }
    // Qwen3-VL's and Qwen3.5's rotary embeddings interleave their sections whatever
    // `mrope_interleaved` says, and default them ([24, 20, 20]; Qwen3.5 [11, 11, 10]) when
    // the config gives none (transformers).
    let interleaved = vision_variant == Some(VisionVariant::Qwen3Vl);
    let default_section = match architecture.is_hybrid() {
        true => vec![11, 11, 10],
        false => vec![24, 20, 20],
    };
    let given_section = rope_scaling.as_ref().and_then(|r| r.mrope_section.clone());
    let mrope_section = match given_section.or(interleaved.then_some(default_section)) {
        None => None,
        Some(s) if s.len() == 3 && s.iter().sum::<usize>() == rotary_dim / 2 => {
            Some([s[0], s[1], s[2]])
        }
        Some(s) => {
            return Err(format!(
                "rope_scaling.mrope_section {s:?} must be three numbers summing to the rotary dimensions / 2 ({})",
                rotary_dim / 2
            ));
        }
    };
    let mut rope_linear_factor = None;
    let mut rope_yarn = None;
    let rope_scaling = match rope_scaling {
        None => None,
        Some(rs) if mrope_section.is_some() => {
            if !matches!(rs.rope_type.as_deref(), None | Some("mrope" | "default")) {
                return Err("rope_scaling: M-RoPE with a scaled type is not supported".into());
            }
            None
        }
        Some(rs) => match rs.rope_type.as_deref() {
            Some("llama3") => Some(Llama3RopeScaling {
                factor: rs.factor.ok_or("rope_scaling.factor is missing")?,
                low_freq_factor: rs.low_freq_factor.unwrap_or(1.0),
                high_freq_factor: rs.high_freq_factor.unwrap_or(4.0),
                original_max_position_embeddings: rs
                    .original_max_position_embeddings
                    .unwrap_or(8192.0),
            }),
            Some("linear") => {
                let f = rs.factor.ok_or("rope_scaling.factor is missing")?;
                if f <= 0.0 {
                    return Err(format!("rope_scaling.factor ({f}) must be > 0"));
                }
                rope_linear_factor = Some(f);
                None
            }
            Some("yarn") => {
                let factor = rs.factor.ok_or("rope_scaling.factor is missing")?;
                // transformers' get_mscale.
                let mscale = |m: f64| {
                    if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * factor.ln() + 1.0
                    }
                };
                let attention_factor = match (rs.attention_factor, rs.mscale, rs.mscale_all_dim) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                    _ => mscale(1.0),
                };
                rope_yarn = Some(YarnScaling {
                    factor,
                    beta_fast: rs.beta_fast.unwrap_or(32.0),
                    beta_slow: rs.beta_slow.unwrap_or(1.0),
                    original_max_position_embeddings: rs
                        .original_max_position_embeddings
                        .or(max_position_embeddings.map(|m| m as f64))
                        .unwrap_or(4096.0),
                    truncate: rs.truncate.unwrap_or(true),
                    attention_factor,
                });
                None
            }
            Some("default") | None => None,
            Some(other) => {
                return Err(format!(
                    "rope_scaling type {other:?} is not supported (supported: llama3, linear, yarn)"
                ));
            }
        },
    };
    Ok(Rope {
        rotary_dim,
        mrope_interleaved: interleaved && mrope_section.is_some(),
        mrope_section,
        rope_scaling,
        rope_linear_factor,
        rope_yarn,
    })
}

impl ModelConfig {
    /// Inverse RoPE frequencies of the local layers (their own base, never scaled).
    pub fn rope_inv_freq_local(&self) -> Option<Vec<f64>> {
        let theta = self.sliding_window.as_ref()?.rope_theta?;
        Some(self.unscaled_inv_freq(theta))
    }

    /// What the attention scores are multiplied by: 1 / sqrt(`attn_scalar`), times YaRN's
    /// attention factor squared (it scales q's and k's cos and sin alike).
    pub fn attention_scale(&self) -> f32 {
        let af = self.rope_yarn.map_or(1.0, |y| y.attention_factor);
        (af * af / self.attn_scalar.sqrt()) as f32
    }

    /// [`Self::attention_scale`] for the local layers: without YaRN's attention factor when
    /// they have RoPE of their own (unscaled: OLMo 3 scales its global layers only).
    pub fn attention_scale_local(&self) -> f32 {
        match self.sliding_window.as_ref().and_then(|w| w.rope_theta) {
            Some(_) => (1.0 / self.attn_scalar.sqrt()) as f32,
            None => self.attention_scale(),
        }
    }

    /// The rotary frequencies, one per pair of the `rotary_dim` turned dimensions.
    fn unscaled_inv_freq(&self, theta: f64) -> Vec<f64> {
        let d = self.rotary_dim as f64;
        (0..self.rotary_dim / 2)
            .map(|i| 1.0 / theta.powf(2.0 * i as f64 / d))
            .collect()
    }

    /// Inverse RoPE frequencies (length head_dim/2), Llama 3 or linear scaling applied;
    /// computed in f64.
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        let base = self.unscaled_inv_freq(self.rope_theta);
        if let Some(f) = self.rope_linear_factor {
            return base.into_iter().map(|x| x / f).collect();
        }
        if let Some(y) = self.rope_yarn {
            return yarn_inv_freq(&base, self.rope_theta, self.rotary_dim, y);
        }
        let Some(s) = self.rope_scaling else {
            return base;
        };
        let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / s.factor
                } else {
                    let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * f / s.factor + smooth * f
                }
            })
            .collect()
    }
}

/// transformers' `_compute_yarn_parameters`: each frequency blends its interpolated (divided
/// by the factor) and extrapolated (unchanged) values by a linear ramp over the dimensions
/// between the corrections for `beta_fast` and `beta_slow` rotations.
fn yarn_inv_freq(base: &[f64], theta: f64, head_dim: usize, y: YarnScaling) -> Vec<f64> {
    let dim = head_dim as f64;
    let correction = |rotations: f64| {
        dim * (y.original_max_position_embeddings / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction(y.beta_fast), correction(y.beta_slow));
    if y.truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    base.iter()
        .enumerate()
        .map(|(i, &f)| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            f / y.factor * (1.0 - extrapolation) + f * extrapolation
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama3_rope_scaling_and_eos_list() {
        let c = ModelConfig::from_json(
            r#"{"architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":4096,
            "intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,
            "num_key_value_heads":8,"rope_theta":500000.0,"eos_token_id":[128001,128008,128009],
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#,
        )
        .unwrap();
        assert_eq!(c.head_dim, 128);
        assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
        let f = c.rope_inv_freq();
        // Highest frequency is untouched, lowest is divided by the factor.
        assert_eq!(f[0], 1.0);
        let unscaled_last = 1.0 / 500000f64.powf(126.0 / 128.0);
        assert!((f[63] - unscaled_last / 8.0).abs() < 1e-15);
    }

    /// gpt-oss's published RoPE (head_dim 64, θ 150,000, YaRN factor 32 over 4,096 positions,
    /// β 32 and 1, not truncated) against transformers' `_compute_yarn_parameters` (torch f32):
    /// the untouched, blended and interpolated ends of the frequencies, and the attention factor.
    #[test]
    fn yarn_matches_transformers_for_gpt_oss() {
        let c = ModelConfig::from_json(
            r#"{"architectures":["GptOssForCausalLM"],"vocab_size":201088,"hidden_size":2880,
            "intermediate_size":2880,"num_hidden_layers":36,"num_attention_heads":64,
            "num_key_value_heads":8,"head_dim":64,"num_local_experts":128,"num_experts_per_tok":4,
            "sliding_window":128,"rope_theta":150000,"max_position_embeddings":131072,
            "rope_scaling":{"rope_type":"yarn","factor":32.0,"beta_fast":32.0,"beta_slow":1.0,
            "truncate":false,"original_max_position_embeddings":4096}}"#,
        )
        .unwrap();
        let f = c.rope_inv_freq();
        let want = [
            (0, 1.0),
            (8, 0.050_813_272_595_405_58),
            (12, 0.006_794_959_306_716_919),
            (16, 0.000_456_483_918_242_156_5),
            (20, 1.818_833_698_052_913e-5),
            (24, 4.099_978_468_730_114e-6),
            (31, 3.023_511_396_804_679e-7),
        ];
        for (i, w) in want {
            assert!(
                (f[i] - w).abs() <= 1e-6 * w,
                "frequency {i}: {} vs {w}",
                f[i]
            );
        }
        let af = c.rope_yarn.unwrap().attention_factor;
        assert!((af - 1.346_573_590_279_972_7).abs() < 1e-12, "{af}");
        // No layer of its own RoPE: the local layers use this one.
        assert!(c.rope_inv_freq_local().is_none());
    }
}
