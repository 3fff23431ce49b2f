//! GGUF tensor names → HF names, and which tensors llama.cpp permuted.

use super::hparams::{GgufArch, Hparams};
use super::hybrid;
use super::layout::Layout;

/// What a GGUF tensor becomes in the HF checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    /// Written under this HF name.
    Hf { name: String, qk: Option<QkKind> },
    /// Consumed elsewhere (e.g. `rope_freqs.weight` becomes config.json's `rope_scaling`).
    Skip,
    /// Every expert's `proj` of a layer stacked in one tensor (`[experts, rows, cols]` in HF
    /// order, or `[experts, rows]` for biases): expert `e` is HF's
    /// `model.layers.{layer}.mlp.experts.{e}.{proj}.{suffix}`.
    Experts {
        layer: u32,
        proj: &'static str,
        suffix: &'static str,
    },
    /// One or more HF tensors read out of this one through a [`Layout`] (rows picked or
    /// permuted, columns permuted, a shape or values changed: the hybrids' tensors).
    Rearranged(Vec<(String, Layout)>),
}

/// Maps a GGUF tensor name of the file `h` describes: [`map`], after the names of the
/// hybrids' linear layers and the layers past the model's (MTP blocks, skipped).
pub fn map_in(gguf: &str, h: &Hparams) -> Option<Mapped> {
    if h.arch == GgufArch::Gemma4 {
        return super::gemma4::map(gguf);
    }
    if let Some(l) = &h.linear
        && let Some(m) = hybrid::map(gguf, h, l)
    {
        return Some(m);
    }
    if h.mla.is_some()
        && let Some(m) = super::mla::map(gguf)
    {
        return Some(m);
    }
    if let Some(m) = super::sigmoe::map(gguf, h) {
        return Some(m);
    }
    map(gguf, h.arch)
}

/// The HF name of expert `e`'s slice of a [`Mapped::Experts`] tensor.
pub fn expert_name(layer: u32, proj: &str, e: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{e}.{proj}.{suffix}")
}

/// Q and K projections are the tensors whose rows llama.cpp reorders for its RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkKind {
    Q,
    K,
}

/// Maps a GGUF tensor name of a file of architecture `arch`; None when the name is not one we
/// know.
pub fn map(gguf: &str, arch: GgufArch) -> Option<Mapped> {
    let hf = |name: String| Some(Mapped::Hf { name, qk: None });
    match gguf {
        "token_embd.weight" => return hf("model.embed_tokens.weight".into()),
        "output_norm.weight" => return hf("model.norm.weight".into()),
        "output.weight" => return hf("lm_head.weight".into()),
        "rope_freqs.weight" => return Some(Mapped::Skip),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let suffix = match suffix {
        "weight" => "weight",
        "bias" => "bias",
        _ => return None,
    };
    let experts = |proj| {
        Some(Mapped::Experts {
            layer,
            proj,
            suffix,
        })
    };
    match part {
        "ffn_gate_exps" => return experts("gate_proj"),
        "ffn_up_exps" => return experts("up_proj"),
        "ffn_down_exps" => return experts("down_proj"),
        // gpt-oss's sinks are a parameter of their own (no `.weight` in HF).
        "attn_sinks" => return hf(format!("model.layers.{layer}.self_attn.sinks")),
        _ => {}
    }
    let gemma = arch == GgufArch::Gemma3;
    let gpt_oss = arch == GgufArch::GptOss;
    // The hybrids' norm before the MLP (HF's post_attention_layernorm) has Gemma's name.
    let olmo = arch == GgufArch::Olmo2;
    let post_attention = gemma || gpt_oss || olmo || arch.is_hybrid();
    let (hf_part, qk) = match part {
        "attn_norm" => ("input_layernorm", None),
        // Gemma norms the attention's output as well: its HF post_attention_layernorm.
        "ffn_norm" if gemma => ("pre_feedforward_layernorm", None),
        "post_attention_norm" if post_attention => ("post_attention_layernorm", None),
        "ffn_gate_inp" if gpt_oss => ("mlp.router", None),
        "post_ffw_norm" if gemma || olmo => ("post_feedforward_layernorm", None),
        "ffn_norm" => ("post_attention_layernorm", None),
        "attn_q" => ("self_attn.q_proj", Some(QkKind::Q)),
        "attn_k" => ("self_attn.k_proj", Some(QkKind::K)),
        "attn_v" => ("self_attn.v_proj", None),
        "attn_output" => ("self_attn.o_proj", None),
        "attn_q_norm" => ("self_attn.q_norm", None),
        "attn_k_norm" => ("self_attn.k_norm", None),
        "ffn_gate" => ("mlp.gate_proj", None),
        "ffn_up" => ("mlp.up_proj", None),
        "ffn_down" => ("mlp.down_proj", None),
        // A mixture of experts' router.
        "ffn_gate_inp" => ("mlp.gate", None),
        // Qwen2-MoE's shared expert and its gate (`[1, hidden]`).
        "ffn_gate_inp_shexp" => ("mlp.shared_expert_gate", None),
        "ffn_gate_shexp" => ("mlp.shared_expert.gate_proj", None),
        "ffn_up_shexp" => ("mlp.shared_expert.up_proj", None),
        "ffn_down_shexp" => ("mlp.shared_expert.down_proj", None),
        _ => return None,
    };
    Some(Mapped::Hf {
        name: format!("model.layers.{layer}.{hf_part}.{suffix}"),
        qk,
    })
}

/// Undoes llama.cpp's `LlamaModel.permute` on a row-major [rows, row_len] tensor (or a bias,
/// row_len 1): per head h with head_dim D, `gguf[h·D + 2j + a] = hf[h·D + a·D/2 + j]`.
pub fn unpermute_rows(data: &[f32], n_heads: usize, row_len: usize) -> Vec<f32> {
    let rows = data.len() / row_len;
    let d = rows / n_heads;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_heads {
        for j in 0..d / 2 {
            for a in 0..2 {
                let src = (h * d + 2 * j + a) * row_len;
                let dst = (h * d + a * d / 2 + j) * row_len;
                out[dst..dst + row_len].copy_from_slice(&data[src..src + row_len]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_llama(name: &str) -> Option<Mapped> {
        map(name, GgufArch::Llama)
    }

    #[test]
    fn gemma_norms_keep_their_places() {
        let hf = |g: &str| match map(g, GgufArch::Gemma3) {
            Some(Mapped::Hf { name, .. }) => name,
            other => panic!("{g}: {other:?}"),
        };
        assert_eq!(
            hf("blk.1.ffn_norm.weight"),
            "model.layers.1.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            hf("blk.1.post_attention_norm.weight"),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf("blk.1.post_ffw_norm.weight"),
            "model.layers.1.post_feedforward_layernorm.weight"
        );
        assert_eq!(map_llama("blk.1.post_ffw_norm.weight"), None);
    }

    #[test]
    fn maps_layer_tensors() {
        assert_eq!(
            map_llama("blk.12.attn_k.bias"),
            Some(Mapped::Hf {
                name: "model.layers.12.self_attn.k_proj.bias".into(),
                qk: Some(QkKind::K)
            })
        );
        assert_eq!(
            map_llama("blk.0.ffn_norm.weight"),
            Some(Mapped::Hf {
                name: "model.layers.0.post_attention_layernorm.weight".into(),
                qk: None
            })
        );
        assert_eq!(
            map_llama("blk.3.ffn_up_exps.weight"),
            Some(Mapped::Experts {
                layer: 3,
                proj: "up_proj",
                suffix: "weight"
            })
        );
        let gpt_oss = |g: &str| map(g, GgufArch::GptOss);
        assert_eq!(
            gpt_oss("blk.1.ffn_down_exps.bias"),
            Some(Mapped::Experts {
                layer: 1,
                proj: "down_proj",
                suffix: "bias"
            })
        );
        for (g, hf) in [
            ("blk.1.attn_sinks.weight", "model.layers.1.self_attn.sinks"),
            ("blk.1.ffn_gate_inp.bias", "model.layers.1.mlp.router.bias"),
            (
                "blk.1.post_attention_norm.weight",
                "model.layers.1.post_attention_layernorm.weight",
            ),
        ] {
            let name = hf.to_string();
            assert_eq!(gpt_oss(g), Some(Mapped::Hf { name, qk: None }), "{g}");
        }
        assert_eq!(
            map_llama("blk.3.ffn_gate_inp.weight"),
            Some(Mapped::Hf {
                name: "model.layers.3.mlp.gate.weight".into(),
                qk: None
            })
        );
        assert_eq!(map_llama("blk.0.attn_rot_embd"), None);
        assert_eq!(map_llama("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn unpermute_one_head_of_four_rows() {
        // HF rows [r0 r1 r2 r3] (rotate-half: pairs (r0,r2), (r1,r3)) are stored by llama.cpp
        // interleaved as [r0 r2 r1 r3].
        let gguf = [0.0, 2.0, 1.0, 3.0];
        assert_eq!(unpermute_rows(&gguf, 1, 1), vec![0.0, 1.0, 2.0, 3.0]);
        // Two heads, rows of length 2.
        let gguf: Vec<f32> = [0, 2, 1, 3, 4, 6, 5, 7]
            .iter()
            .flat_map(|&r| [r as f32, r as f32 + 0.5])
            .collect();
        let hf: Vec<f32> = (0..8).flat_map(|r| [r as f32, r as f32 + 0.5]).collect();
        assert_eq!(unpermute_rows(&gguf, 2, 2), hf);
    }
}
