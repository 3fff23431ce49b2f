//! Gated DeltaNet hybrids as llama.cpp's converter writes them (`qwen35`, `qwen35moe`,
//! `qwen3next`): the linear-attention layers' shape from `ssm.*` metadata, their config.json
//! fields, and the tensors' HF names with the converter's rearrangements undone
//! (tests/fixtures/hybrid/README.md lists them), so that the engine reads HF's layout:
//!
//! - `attn_qkv` / `attn_gate` / `ssm_beta` / `ssm_alpha` are `in_proj_qkv` / `_z` / `_b` /
//!   `_a`; Qwen3-Next's `ssm_ba` (grouped per key head, as in `in_proj_ba`) is split into
//!   `in_proj_b` and `in_proj_a` by picking rows (its `attn_qkv` is already all q, all k,
//!   all v, Qwen3.5's order).
//! - `ssm_conv1d` `[channels, kernel]` gets its squeezed dimension back; `ssm_a` (-exp(A_log))
//!   becomes `A_log`; `ssm_dt.bias` is `dt_bias`; `ssm_norm` is the gated norm as it is.
//! - For `qwen35` / `qwen35moe` the value heads are put back from llama.cpp's tiled order
//!   (value head `v` of key head `g` at `v · key_heads + g`) into transformers' grouped one
//!   (at `g · r + v`): rows of the V part of `attn_qkv` and `ssm_conv1d`, of `attn_gate`,
//!   `ssm_beta`, `ssm_alpha`, entries of `ssm_a` and `ssm_dt.bias`, and the columns of
//!   `ssm_out`.
//! - The zero-centred norms stay 1 + w as stored: the engine holds them so (and adds the 1 to
//!   an HF checkpoint's w itself).
//! - MTP layers (`nextn_predict_layers` past the model's) are skipped.

use serde_json::{Value, json};

use super::hparams::{GgufArch, Hparams};
use super::layout::{Layout, Values};
use super::reader::GgufFile;
use super::tensor_names::Mapped;
use crate::error::{CheckpointError, Result};

/// The Gated DeltaNet layers' shape, in config.json's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearHparams {
    /// Per layer of the model (MTP layers excluded): true where it is linear attention.
    pub layers: Vec<bool>,
    /// `ssm.group_count`.
    pub num_k_heads: usize,
    /// `ssm.time_step_rank`.
    pub num_v_heads: usize,
    /// `ssm.state_size`.
    pub head_k_dim: usize,
    /// `ssm.inner_size / ssm.time_step_rank`.
    pub head_v_dim: usize,
    /// `ssm.conv_kernel`.
    pub conv_kernel: usize,
    /// The value heads are in llama.cpp's tiled order (`qwen35`, `qwen35moe`).
    pub tiled: bool,
}

impl LinearHparams {
    fn key_dim(&self) -> usize {
        self.num_k_heads * self.head_k_dim
    }

    fn value_dim(&self) -> usize {
        self.num_v_heads * self.head_v_dim
    }

    /// `order[hf] = gguf` over `num_v_heads` heads of `head_dim` rows (or entries or columns):
    /// HF's grouped head `g · r + v` is the file's `v · key_heads + g`. None where the file
    /// keeps HF's order (Qwen3-Next, or one value head per key head).
    fn value_heads(&self, head_dim: usize) -> Option<Vec<usize>> {
        let (nk, r) = (self.num_k_heads, self.num_v_heads / self.num_k_heads);
        if !self.tiled || r == 1 {
            return None;
        }
        let mut order = Vec::with_capacity(self.num_v_heads * head_dim);
        for g in 0..nk {
            for v in 0..r {
                let from = (v * nk + g) * head_dim;
                order.extend(from..from + head_dim);
            }
        }
        Some(order)
    }

    /// Rows of q, k, then v (`attn_qkv`, `ssm_conv1d`'s channels): q and k as stored.
    fn qkv_rows(&self) -> Option<Vec<usize>> {
        let qk = 2 * self.key_dim();
        let v = self.value_heads(self.head_v_dim)?;
        Some((0..qk).chain(v.into_iter().map(|r| qk + r)).collect())
    }
}

/// `<arch>.ssm.*` and the layer pattern: `attention.recurrent_layers` (one flag per block,
/// MTP blocks included), else every `full_attention_interval`-th layer full (4 when absent),
/// as llama.cpp reads them.
pub(crate) fn read_linear(
    g: &GgufFile,
    arch: &str,
    num_layers: u64,
    block_count: u64,
) -> Result<LinearHparams> {
    let key = |k: &str| format!("{arch}.{k}");
    let positive = |k: &str| -> Result<usize> {
        match g.require_u64(&key(k))? {
            0 => Err(CheckpointError::Gguf(format!("{} must be > 0", key(k)))),
            v => Ok(v as usize),
        }
    };
    let num_k_heads = positive("ssm.group_count")?;
    let num_v_heads = positive("ssm.time_step_rank")?;
    let inner = positive("ssm.inner_size")?;
    if !num_v_heads.is_multiple_of(num_k_heads) || !inner.is_multiple_of(num_v_heads) {
        return Err(CheckpointError::Gguf(format!(
            "{arch}: ssm.time_step_rank ({num_v_heads}) must be a multiple of ssm.group_count \
             ({num_k_heads}), and ssm.inner_size ({inner}) of ssm.time_step_rank"
        )));
    }
    let n = num_layers as usize;
    let layers = match g.get(&key("attention.recurrent_layers")) {
        Some(v) => {
            let flags: Vec<bool> = match v.as_array() {
                Some(a) => a.iter().filter_map(|f| f.as_bool()).collect(),
                None => v.as_bool().map(|b| vec![b; n]).unwrap_or_default(),
            };
            if flags.len() != n && flags.len() as u64 != block_count {
                return Err(CheckpointError::Gguf(format!(
                    "{} has {} flags for {block_count} blocks",
                    key("attention.recurrent_layers"),
                    flags.len()
                )));
            }
            flags[..n].to_vec()
        }
        None => {
            let every = g
                .get_u64(&key("full_attention_interval"))?
                .unwrap_or(4)
                .max(1) as usize;
            (0..n).map(|i| (i + 1) % every != 0).collect()
        }
    };
    Ok(LinearHparams {
        layers,
        num_k_heads,
        num_v_heads,
        head_k_dim: positive("ssm.state_size")?,
        head_v_dim: inner / num_v_heads,
        conv_kernel: positive("ssm.conv_kernel")?,
        tiled: arch != "qwen3next",
    })
}

/// The hybrid's fields of config.json, as transformers' configs name them: `linear_*`,
/// `layer_types`, partial RoPE (Qwen3.5's in `rope_parameters` with its M-RoPE sections,
/// Qwen3-Next's at the top level), and the MoE's sparse step.
pub(crate) fn config_json(h: &Hparams, l: &LinearHparams, c: &mut Value) {
    let types: Vec<&str> = l
        .layers
        .iter()
        .map(|&lin| match lin {
            true => "linear_attention",
            false => "full_attention",
        })
        .collect();
    c["layer_types"] = json!(types);
    c["linear_num_key_heads"] = json!(l.num_k_heads);
    c["linear_num_value_heads"] = json!(l.num_v_heads);
    c["linear_key_head_dim"] = json!(l.head_k_dim);
    c["linear_value_head_dim"] = json!(l.head_v_dim);
    c["linear_conv_kernel_dim"] = json!(l.conv_kernel);
    c["attention_bias"] = json!(false);
    let partial = h.rotary_dim.map(|d| d as f64 / h.head_dim as f64);
    if h.arch == GgufArch::Qwen3Next {
        c["partial_rotary_factor"] = json!(partial.unwrap_or(1.0));
    } else {
        let mut rp = json!({
            "rope_type": "default",
            "rope_theta": h.rope_theta,
            "partial_rotary_factor": partial.unwrap_or(1.0),
        });
        if let Some(s) = h.mrope_section {
            rp["mrope_section"] = json!(s);
            rp["mrope_interleaved"] = json!(true);
        }
        c["rope_parameters"] = rp;
        // transformers 5 reads `rope_parameters`; a null `rope_scaling` beside it would hide
        // it from readers of the older name.
        if c["rope_scaling"].is_null()
            && let Some(o) = c.as_object_mut()
        {
            o.remove("rope_scaling");
        }
    }
    if h.experts.is_some() {
        c["decoder_sparse_step"] = json!(1);
    }
}

/// The HF tensors of hybrid GGUF tensor `gguf`, for the names this family rearranges (a
/// linear layer's tensors; a full-attention layer's `attn_qkv` when the converter fused q,
/// k and v, `--fuse-qkv`) and the MTP block's (skipped); None for the names every
/// architecture shares (norms, attention, MLPs, experts).
pub(crate) fn map(gguf: &str, h: &Hparams, l: &LinearHparams) -> Option<Mapped> {
    let (layer, part) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if part.starts_with("nextn.") || layer >= l.layers.len() {
        return Some(Mapped::Skip);
    }
    let p = format!("model.layers.{layer}");
    let ranges = |parts: &[(&str, usize)]| {
        let mut start = 0;
        let out = parts
            .iter()
            .map(|&(name, n)| {
                let rows = Layout::rows((start..start + n).collect());
                start += n;
                (format!("{p}.{name}"), rows)
            })
            .collect();
        Some(Mapped::Rearranged(out))
    };
    if !l.layers[layer] {
        return match part {
            // Gated attention's q rows hold each head's query and gate (2 · q_size).
            "attn_qkv.weight" => {
                let q = 2 * (h.num_heads * h.head_dim) as usize;
                let kv = (h.num_kv_heads * h.head_dim) as usize;
                ranges(&[
                    ("self_attn.q_proj.weight", q),
                    ("self_attn.k_proj.weight", kv),
                    ("self_attn.v_proj.weight", kv),
                ])
            }
            _ => None,
        };
    }
    let one = |name: &str, layout: Layout| {
        Some(Mapped::Rearranged(vec![(
            format!("{p}.linear_attn.{name}"),
            layout,
        )]))
    };
    let rows = |order: Option<Vec<usize>>| Layout {
        rows: order,
        ..Layout::default()
    };
    match part {
        "attn_qkv.weight" => one("in_proj_qkv.weight", rows(l.qkv_rows())),
        "attn_gate.weight" => one("in_proj_z.weight", rows(l.value_heads(l.head_v_dim))),
        "ssm_beta.weight" => one("in_proj_b.weight", rows(l.value_heads(1))),
        "ssm_alpha.weight" => one("in_proj_a.weight", rows(l.value_heads(1))),
        // Qwen3-Next: per key head g, its r value heads' b rows then their a rows.
        "ssm_ba.weight" => {
            let r = l.num_v_heads / l.num_k_heads;
            let pick = |second: usize| -> Vec<usize> {
                (0..l.num_k_heads)
                    .flat_map(|g| (0..r).map(move |v| g * 2 * r + second * r + v))
                    .collect()
            };
            let b = (
                format!("{p}.linear_attn.in_proj_b.weight"),
                Layout::rows(pick(0)),
            );
            let a = (
                format!("{p}.linear_attn.in_proj_a.weight"),
                Layout::rows(pick(1)),
            );
            Some(Mapped::Rearranged(vec![b, a]))
        }
        "ssm_conv1d.weight" => {
            let channels = 2 * l.key_dim() + l.value_dim();
            let layout = Layout {
                rows: l.qkv_rows(),
                shape: Some(vec![channels, 1, l.conv_kernel]),
                ..Layout::default()
            };
            one("conv1d.weight", layout)
        }
        "ssm_a" => {
            let layout = Layout {
                rows: l.value_heads(1),
                values: Values::LnOfNegated,
                ..Layout::default()
            };
            one("A_log", layout)
        }
        "ssm_dt.bias" => one("dt_bias", rows(l.value_heads(1))),
        "ssm_norm.weight" => one("norm.weight", Layout::default()),
        "ssm_out.weight" => {
            let layout = Layout {
                cols: l.value_heads(l.head_v_dim),
                ..Layout::default()
            };
            one("out_proj.weight", layout)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(tiled: bool) -> LinearHparams {
        LinearHparams {
            layers: vec![true, false],
            num_k_heads: 2,
            num_v_heads: 4,
            head_k_dim: 3,
            head_v_dim: 2,
            conv_kernel: 4,
            tiled,
        }
    }

    /// 2 key heads, 2 value heads each: HF's [g0v0, g0v1, g1v0, g1v1] are the file's
    /// [0, 2, 1, 3] (tiled: [g0v0, g1v0, g0v1, g1v1]).
    #[test]
    fn tiled_value_heads_go_back_to_grouped() {
        let l = dims(true);
        assert_eq!(l.value_heads(1), Some(vec![0, 2, 1, 3]));
        assert_eq!(l.value_heads(2), Some(vec![0, 1, 4, 5, 2, 3, 6, 7]));
        // q and k (2 · 6 rows) stay; v's 8 rows follow them.
        let qkv = l.qkv_rows().unwrap();
        assert_eq!(&qkv[..12], &(0..12).collect::<Vec<_>>()[..]);
        assert_eq!(&qkv[12..], &[12, 13, 16, 17, 14, 15, 18, 19]);
        assert_eq!(dims(false).value_heads(2), None);
    }

    #[test]
    fn qwen3_next_ba_splits_per_key_head() {
        let h = hparams(dims(false));
        let Some(Mapped::Rearranged(v)) = map("blk.0.ssm_ba.weight", &h, &dims(false)) else {
            panic!("ssm_ba is rearranged")
        };
        // Key head 0: b rows 0, 1 and a rows 2, 3; key head 1: b 4, 5 and a 6, 7.
        assert_eq!(v[0].0, "model.layers.0.linear_attn.in_proj_b.weight");
        assert_eq!(v[0].1.rows, Some(vec![0, 1, 4, 5]));
        assert_eq!(v[1].0, "model.layers.0.linear_attn.in_proj_a.weight");
        assert_eq!(v[1].1.rows, Some(vec![2, 3, 6, 7]));
    }

    #[test]
    fn full_attention_and_mtp_names() {
        let l = dims(true);
        let h = hparams(l.clone());
        // Layer 1 is full attention: its norms and projections are every architecture's.
        assert_eq!(map("blk.1.attn_q.weight", &h, &l), None);
        assert_eq!(map("blk.0.attn_norm.weight", &h, &l), None);
        let Some(Mapped::Rearranged(v)) = map("blk.1.attn_qkv.weight", &h, &l) else {
            panic!("a fused qkv splits")
        };
        let names: Vec<&str> = v.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.layers.1.self_attn.q_proj.weight",
                "model.layers.1.self_attn.k_proj.weight",
                "model.layers.1.self_attn.v_proj.weight"
            ]
        );
        // 4 heads of 8: q and gate 64 rows; 1 KV head: 8 rows each.
        assert_eq!(v[1].1.rows, Some((64..72).collect()));
        // The MTP block (layer 2 of a 2-layer model) and its nextn tensors.
        assert_eq!(map("blk.2.attn_q.weight", &h, &l), Some(Mapped::Skip));
        assert_eq!(
            map("blk.2.nextn.eh_proj.weight", &h, &l),
            Some(Mapped::Skip)
        );
    }

    fn hparams(l: LinearHparams) -> Hparams {
        Hparams {
            arch: GgufArch::Qwen35,
            vocab_size: 8,
            hidden_size: 8,
            intermediate_size: 8,
            num_layers: l.layers.len() as u64,
            num_heads: 4,
            num_kv_heads: 1,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 1e4,
            context_length: 64,
            tie_word_embeddings: false,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            rope_scaling: None,
            experts: None,
            gemma: None,
            windows: None,
            rope_theta_swa: None,
            linear: Some(l),
            rotary_dim: Some(2),
            mrope_section: None,
            mla: None,
            sigmoid: None,
            gemma4_config: None,
        }
    }
}
