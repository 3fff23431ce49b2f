//! Model hyper-parameters from `<arch>.*` metadata, and the HF `config.json` /
//! `generation_config.json` they become.

use serde_json::{Value, json};

use crate::dtype::DType;
use crate::error::{CheckpointError, Result};
use crate::gguf::dequant::dequantize;
use crate::gguf::hybrid::{self, LinearHparams};
use crate::gguf::reader::GgufFile;

/// The GGUF architectures we convert; they differ in Q/K permutation, biases and norms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufArch {
    /// llama.cpp's `LlamaModel` converter: Llama, SmolLM2, Mistral. Q/K rows are permuted.
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3's attention, mixture-of-experts MLPs (stacked `ffn_*_exps`).
    Qwen3Moe,
    /// Qwen2's attention, experts, and a shared expert (`ffn_*_shexp`, its gate
    /// `ffn_gate_inp_shexp`).
    Qwen2Moe,
    /// Gemma 3 (text). Norm weights are stored as 1 + w (llama.cpp's converter adds the 1).
    Gemma3,
    /// gpt-oss: biased attention with sinks, a window on alternate layers (llama.cpp's fixed
    /// pattern: even layers local), YaRN, experts with biases (MXFP4 as published).
    GptOss,
    /// Qwen3.5 / Qwen3.6 dense: Gated DeltaNet layers beside gated full attention
    /// (`ssm.*` metadata; the converter's rearrangements are undone in `gguf/hybrid.rs`).
    Qwen35,
    /// Qwen3.5 / Qwen3.6 with experts and a shared expert.
    Qwen35Moe,
    /// Qwen3-Next: the same hybrid layers (value heads kept in transformers' order), experts.
    Qwen3Next,
    /// DeepSeek-V2/V3, Kimi K2, GLM-4.7-Flash: latent attention, DeepSeek-style experts
    /// (`gguf/mla.rs`).
    Deepseek2,
    /// GLM-4.5/4.6/4.7: sigmoid-routed experts with shared ones, partial RoPE, q/k/v biases
    /// (`gguf/sigmoe.rs`).
    Glm4Moe,
    /// MiniMax-M2: sigmoid-routed experts, whole-projection q/k norms, partial RoPE.
    MiniMaxM2,
    /// SmolLM3: llama.cpp's `LlamaModel` converter (Q/K rows permuted); no RoPE on every
    /// fourth layer (llama.cpp's fixed `n_no_rope_layer_step`; the file has no key).
    SmolLM3,
    /// OLMo 2, and OLMo 3 when the file gives `attention.sliding_window` (llama.cpp reads both
    /// as `olmo2`): post-norm layers, whole-projection q/k norms.
    Olmo2,
    /// Gemma 4 (`gguf/gemma4.rs`): per-layer head counts and MLP widths, local and global
    /// layers of their own head widths.
    Gemma4,
}

impl GgufArch {
    pub fn from_gguf(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(GgufArch::Llama),
            "qwen2" => Ok(GgufArch::Qwen2),
            "qwen3" => Ok(GgufArch::Qwen3),
            "qwen3moe" => Ok(GgufArch::Qwen3Moe),
            "qwen2moe" => Ok(GgufArch::Qwen2Moe),
            "gemma3" => Ok(GgufArch::Gemma3),
            "gpt-oss" => Ok(GgufArch::GptOss),
            "qwen35" => Ok(GgufArch::Qwen35),
            "qwen35moe" => Ok(GgufArch::Qwen35Moe),
            "qwen3next" => Ok(GgufArch::Qwen3Next),
            "glm4moe" => Ok(GgufArch::Glm4Moe),
            "minimax-m2" => Ok(GgufArch::MiniMaxM2),
            "smollm3" => Ok(GgufArch::SmolLM3),
            "olmo2" => Ok(GgufArch::Olmo2),
            "deepseek2" => Ok(GgufArch::Deepseek2),
            "gemma4" => Ok(GgufArch::Gemma4),
            other => Err(CheckpointError::Gguf(format!(
                "general.architecture {other:?} is not supported (supported: llama (with or \
                 without experts), qwen2, qwen2moe, qwen3, qwen3moe, gemma3, gemma4, gpt-oss, \
                 qwen35, qwen35moe, qwen3next, glm4moe, minimax-m2, smollm3, olmo2, deepseek2)"
            ))),
        }
    }

    /// The HF class and model type; a llama file with experts is Mixtral.
    fn hf(self, experts: bool) -> (&'static str, &'static str) {
        match self {
            GgufArch::Llama if experts => ("MixtralForCausalLM", "mixtral"),
            GgufArch::Llama => ("LlamaForCausalLM", "llama"),
            GgufArch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            GgufArch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
            GgufArch::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
            GgufArch::Qwen2Moe => ("Qwen2MoeForCausalLM", "qwen2_moe"),
            GgufArch::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
            GgufArch::GptOss => ("GptOssForCausalLM", "gpt_oss"),
            GgufArch::Qwen35 => ("Qwen3_5ForCausalLM", "qwen3_5_text"),
            GgufArch::Qwen35Moe => ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"),
            GgufArch::Qwen3Next => ("Qwen3NextForCausalLM", "qwen3_next"),
            GgufArch::Deepseek2 => ("DeepseekV3ForCausalLM", "deepseek_v3"),
            GgufArch::Glm4Moe => ("Glm4MoeForCausalLM", "glm4_moe"),
            GgufArch::MiniMaxM2 => ("MiniMaxM2ForCausalLM", "minimax_m2"),
            GgufArch::SmolLM3 => ("SmolLM3ForCausalLM", "smollm3"),
            GgufArch::Olmo2 => ("Olmo2ForCausalLM", "olmo2"),
            GgufArch::Gemma4 => ("Gemma4ForCausalLM", "gemma4_text"),
        }
    }

    /// llama.cpp's `LlamaModel.permute` reordered the Q and K rows of these files.
    pub fn permutes_qk(self) -> bool {
        matches!(self, GgufArch::Llama | GgufArch::SmolLM3)
    }

    /// Gated DeltaNet hybrids (linear-attention layers, `ssm.*` metadata).
    pub fn is_hybrid(self) -> bool {
        matches!(
            self,
            GgufArch::Qwen35 | GgufArch::Qwen35Moe | GgufArch::Qwen3Next
        )
    }

    /// Architectures whose files must give an expert count.
    fn needs_experts(self) -> bool {
        matches!(
            self,
            GgufArch::Qwen3Moe
                | GgufArch::Qwen2Moe
                | GgufArch::GptOss
                | GgufArch::Qwen35Moe
                | GgufArch::Qwen3Next
                | GgufArch::Glm4Moe
                | GgufArch::MiniMaxM2
        )
    }

    /// Qwen3-MoE's expert names in config.json (`num_experts`, `moe_intermediate_size`...),
    /// not Mixtral's.
    fn qwen_experts(self) -> bool {
        matches!(
            self,
            GgufArch::Qwen3Moe | GgufArch::Qwen2Moe | GgufArch::Qwen35Moe | GgufArch::Qwen3Next
        )
    }
}

#[derive(Debug, Clone)]
pub struct Hparams {
    pub arch: GgufArch,
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    /// Decoder layers the model runs: `block_count` less the multi-token-prediction layers
    /// llama.cpp's converter appends (`nextn_predict_layers`; their tensors are not read).
    pub num_layers: u64,
    pub num_heads: u64,
    pub num_kv_heads: u64,
    pub head_dim: u64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub context_length: u64,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u64>,
    /// EOS first, then any distinct end-of-turn / end-of-message ids (Llama 3 instruct stops
    /// on `<|eot_id|>` as well as `<|end_of_text|>`).
    pub eos_token_ids: Vec<u64>,
    pub rope_scaling: Option<Value>,
    pub experts: Option<ExpertHparams>,
    pub gemma: Option<GemmaHparams>,
    /// Gemma 3's and gpt-oss's local layers and their window.
    pub windows: Option<Windows>,
    /// The Gated DeltaNet layers of a hybrid (`ssm.*`).
    pub linear: Option<LinearHparams>,
    /// Dimensions of each head that RoPE turns (`rope.dimension_count`), when fewer than
    /// head_dim (Qwen3.5's partial RoPE).
    pub rotary_dim: Option<u64>,
    /// Qwen3.5's M-RoPE sections (`rope.dimension_sections`, the first three).
    pub mrope_section: Option<[u64; 3]>,
    /// A deepseek2 file's latent attention and expert routing.
    pub mla: Option<crate::gguf::mla::MlaHparams>,
    /// GLM-4.5's and MiniMax-M2's DeepSeek-style routing (`gguf/sigmoe.rs`).
    pub sigmoid: Option<super::sigmoe::SigmoidRouting>,
    /// The local layers' RoPE base (`rope.freq_base_swa`, OLMo 3).
    pub rope_theta_swa: Option<f64>,
    /// Gemma 4: config.json's text config whole (`gguf/gemma4.rs`).
    pub gemma4_config: Option<Value>,
}

/// Which layers attend over a window, and its size (config.json's `layer_types` and
/// `sliding_window`).
#[derive(Debug, Clone)]
pub struct Windows {
    /// None: every layer global.
    pub size: Option<u64>,
    /// Per layer, whether it is local.
    pub local: Vec<bool>,
}

/// What a Gemma 3 file adds (`gemma3.*`), in config.json's terms.
#[derive(Debug, Clone)]
pub struct GemmaHparams {
    pub rope_local_base_freq: f64,
    pub query_pre_attn_scalar: u64,
    pub final_logit_softcapping: Option<f64>,
}

/// A mixture of experts' shape (`<arch>.expert_*`).
#[derive(Debug, Clone)]
pub struct ExpertHparams {
    pub count: u64,
    pub used: u64,
    /// Each expert's MLP width.
    pub feed_forward_length: u64,
    /// Layers with a dense MLP (no `blk.N.ffn_gate_inp.weight`).
    pub dense_layers: Vec<u64>,
    /// The shared expert's width (`expert_shared_feed_forward_length`, Qwen2-MoE).
    pub shared_feed_forward_length: Option<u64>,
}

pub fn read(g: &GgufFile) -> Result<Hparams> {
    let arch_name = g.require_str("general.architecture")?;
    let arch = GgufArch::from_gguf(arch_name)?;
    let key = |k: &str| format!("{arch_name}.{k}");
    let hidden_size = g.require_u64(&key("embedding_length"))?;
    let num_heads = g.require_u64(&key("attention.head_count"))?;
    // Gemma 4 gives one per layer: the first layer's here (`gemma4::read` reads them all).
    let num_kv_heads = match first_of_array(g, &key("attention.head_count_kv")) {
        Some(n) => n,
        None => g
            .get_u64(&key("attention.head_count_kv"))?
            .unwrap_or(num_heads),
    };
    if num_heads == 0 || num_kv_heads == 0 {
        return Err(CheckpointError::Gguf(format!(
            "{arch_name}: head counts must be > 0"
        )));
    }
    let head_dim = match g.get_u64(&key("attention.key_length"))? {
        Some(d) => d,
        None => hidden_size / num_heads,
    };
    let embd = g.tensor("token_embd.weight").ok_or_else(|| {
        CheckpointError::Gguf("missing tensor \"token_embd.weight\" (the token embeddings)".into())
    })?;
    let output = g.tensor("output.weight");
    // The weights decide the vocabulary size the model computes over; the token list may be
    // shorter (padded embeddings) and then only decides the tokenizer.
    let rows = |t: &crate::gguf::reader::TensorInfo| t.dims.get(1).copied();
    let vocab_size = output
        .and_then(rows)
        .or_else(|| rows(embd))
        .or_else(|| {
            g.get_array("tokenizer.ggml.tokens")
                .ok()
                .flatten()
                .map(|a| a.len() as u64)
        })
        .ok_or_else(|| CheckpointError::Gguf("cannot tell the vocabulary size".into()))?;
    let context_length = g.get_u64(&key("context_length"))?.unwrap_or(4096);
    let block_count = g.require_u64(&key("block_count"))?;
    // Qwen3.5's and Qwen3-Next's converter appends the MTP block as layers past the model's.
    let mtp_layers = g.get_u64(&key("nextn_predict_layers"))?.unwrap_or(0);
    let num_layers = block_count.checked_sub(mtp_layers).ok_or_else(|| {
        CheckpointError::Gguf(format!(
            "{} ({mtp_layers}) exceeds {} ({block_count})",
            key("nextn_predict_layers"),
            key("block_count")
        ))
    })?;
    let experts = match g.get_u64(&key("expert_count"))?.filter(|&n| n > 0) {
        None if arch.needs_experts() => {
            return Err(CheckpointError::Gguf(format!(
                "{} is missing: a {arch_name} file needs its expert count",
                key("expert_count")
            )));
        }
        None => None,
        Some(count) => Some(ExpertHparams {
            count,
            used: g.require_u64(&key("expert_used_count"))?,
            feed_forward_length: match g.get_u64(&key("expert_feed_forward_length"))? {
                Some(n) => n,
                None => g.require_u64(&key("feed_forward_length"))?,
            },
            dense_layers: (0..num_layers)
                .filter(|i| g.tensor(&format!("blk.{i}.ffn_gate_inp.weight")).is_none())
                .collect(),
            shared_feed_forward_length: match arch {
                GgufArch::Qwen2Moe => {
                    Some(g.require_u64(&key("expert_shared_feed_forward_length"))?)
                }
                GgufArch::Qwen35Moe | GgufArch::Qwen3Next => g
                    .get_u64(&key("expert_shared_feed_forward_length"))?
                    .filter(|&n| n > 0),
                _ => None,
            },
        }),
    };
    // A file whose every layer holds experts may not give a dense width.
    let dense_width = match first_of_array(g, &key("feed_forward_length")) {
        Some(n) => Some(n),
        None => g.get_u64(&key("feed_forward_length"))?,
    };
    let intermediate_size = match (&experts, dense_width) {
        (_, Some(n)) => n,
        (Some(e), None) => e.feed_forward_length,
        (None, None) => g.require_u64(&key("feed_forward_length"))?,
    };
    let rope_theta = g.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0);
    let gemma = match arch {
        GgufArch::Gemma3 => Some(gemma_hparams(
            g,
            arch_name,
            num_layers,
            hidden_size,
            num_heads,
            head_dim,
        )?),
        _ => None,
    };
    let windows = windows(g, arch, arch_name, num_layers)?;
    let linear = match arch.is_hybrid() {
        true => Some(hybrid::read_linear(g, arch_name, num_layers, block_count)?),
        false => None,
    };
    // Only the hybrids' and GLM's / MiniMax-M2's configs carry partial RoPE.
    let rotary_dim = match arch.is_hybrid() || super::sigmoe::is_sigmoid_moe(arch) {
        true => g
            .get_u64(&key("rope.dimension_count"))?
            .filter(|&d| d < head_dim),
        false => None,
    };
    let mrope_section = match (arch, g.get_array(&key("rope.dimension_sections"))?) {
        (GgufArch::Qwen35 | GgufArch::Qwen35Moe, Some(s)) => {
            let s: Vec<u64> = s.iter().filter_map(|v| v.as_u64()).collect();
            match s[..] {
                [t, h, w, ..] => Some([t, h, w]),
                _ => None,
            }
        }
        _ => None,
    };
    let mla = match arch {
        GgufArch::Deepseek2 => Some(crate::gguf::mla::read(g, arch_name)?),
        _ => None,
    };
    let h = Hparams {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: g
            .get_f64(&key("attention.layer_norm_rms_epsilon"))?
            .map_or(1e-5, as_written),
        rope_theta,
        context_length,
        tie_word_embeddings: output.is_none(),
        bos_token_id: g.get_u64("tokenizer.ggml.bos_token_id")?,
        eos_token_ids: end_of_generation_ids(g, arch)?,
        rope_scaling: rope_scaling(g, arch, arch_name, head_dim, rope_theta)?,
        experts,
        gemma,
        windows,
        linear,
        rotary_dim,
        mrope_section,
        mla,
        sigmoid: super::sigmoe::read(g, arch, arch_name)?,
        rope_theta_swa: match arch {
            GgufArch::Olmo2 => g.get_f64(&key("rope.freq_base_swa"))?,
            _ => None,
        },
        gemma4_config: None,
    };
    match arch {
        GgufArch::Gemma4 => super::gemma4::read(g, h),
        _ => Ok(h),
    }
}

/// The first entry of an array-valued key (a per-layer list), if it is one.
fn first_of_array(g: &GgufFile, key: &str) -> Option<u64> {
    g.get(key)?.as_array()?.first()?.as_u64()
}

/// A value the converter stored as f32 (1e-6 read back as 9.99999997e-7) as the decimal it
/// was written from, the shortest that rounds to that f32, so that config.json says what the
/// HF config said.
pub(crate) fn as_written(x: f64) -> f64 {
    let f = x as f32;
    match f64::from(f) == x {
        true => f.to_string().parse().unwrap_or(x),
        false => x,
    }
}

/// The local layers as llama.cpp reads them: a window when `attention.sliding_window` is
/// given; Gemma 3's local layers from `attention.sliding_window_pattern` (per-layer flags,
/// or every n-th layer global; 6 when absent), gpt-oss's every other layer from the first
/// (llama.cpp's fixed pattern; the file has no key).
fn windows(g: &GgufFile, arch: GgufArch, name: &str, num_layers: u64) -> Result<Option<Windows>> {
    let key = |k: &str| format!("{name}.{k}");
    let local: Vec<bool> = match arch {
        GgufArch::Gemma3 => {
            local_layers(g, &key("attention.sliding_window_pattern"), num_layers, 6)?
        }
        GgufArch::GptOss => (0..num_layers).map(|i| i % 2 == 0).collect(),
        // OLMo 3 (`llama_model_olmo2::load_arch_hparams`): only with a window; every fourth
        // layer global when the flags are absent.
        GgufArch::Olmo2
            if g.get_u64(&key("attention.sliding_window"))?
                .is_some_and(|w| w > 0) =>
        {
            local_layers(g, &key("attention.sliding_window_pattern"), num_layers, 4)?
        }
        _ => return Ok(None),
    };
    let size = g
        .get_u64(&key("attention.sliding_window"))?
        .filter(|&w| w > 0);
    Ok(Some(Windows { size, local }))
}

/// Per-layer flags, or every `every`-th layer global (the key a number, or absent).
fn local_layers(g: &GgufFile, pattern_key: &str, num_layers: u64, every: u64) -> Result<Vec<bool>> {
    Ok(match g.get_array(pattern_key).ok().flatten() {
        Some(flags) => {
            let v: Vec<bool> = flags.iter().filter_map(|f| f.as_bool()).collect();
            if v.len() as u64 != num_layers {
                return Err(CheckpointError::Gguf(format!(
                    "{pattern_key} has {} flags for {num_layers} layers",
                    v.len()
                )));
            }
            v
        }
        None => {
            let n = g.get_u64(pattern_key)?.unwrap_or(every).max(1);
            (0..num_layers).map(|i| (i + 1) % n != 0).collect()
        }
    })
}

/// The rest of llama.cpp's reading of a gemma3 file (`llama_model_gemma3::load_arch_hparams`):
/// the local RoPE base from `rope.freq_base_swa` (10,000 when absent), and the attention scale
/// of head_dim, or of hidden / heads for the 27B (62 layers), as Google's code does.
fn gemma_hparams(
    g: &GgufFile,
    arch: &str,
    num_layers: u64,
    hidden: u64,
    heads: u64,
    head_dim: u64,
) -> Result<GemmaHparams> {
    let key = |k: &str| format!("{arch}.{k}");
    Ok(GemmaHparams {
        rope_local_base_freq: g.get_f64(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0),
        query_pre_attn_scalar: if num_layers == 62 {
            hidden / heads
        } else {
            head_dim
        },
        final_logit_softcapping: g.get_f64(&key("final_logit_softcapping"))?,
    })
}

/// EOS, EOT and EOM; and for gpt-oss, harmony's `<|return|>` and `<|call|>` by their text, as
/// llama.cpp finds them (the converter stores one EOS; a reply that calls a tool ends at
/// `<|call|>`, which transformers' generation_config lists beside it).
fn end_of_generation_ids(g: &GgufFile, arch: GgufArch) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = g.get_u64(key)?
            && !ids.contains(&id)
        {
            ids.push(id);
        }
    }
    if arch == GgufArch::GptOss
        && let Some(tokens) = g.get_array("tokenizer.ggml.tokens")?
    {
        for (id, t) in tokens.iter().enumerate() {
            let id = id as u64;
            if matches!(t.as_str(), Some("<|return|>" | "<|call|>")) && !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

/// `eos_token_id` as HF writes it: absent, one id, or a list.
fn eos_json(ids: &[u64]) -> Value {
    match ids {
        [] => Value::Null,
        [one] => json!(one),
        many => json!(many),
    }
}

/// Linear and YaRN scaling from `rope.scaling.*`; Llama 3.1-style scaling, which llama.cpp
/// stores only as the `rope_freqs` tensor (per-frequency divisors), recovered by checking the
/// divisors against the llama3 formula with the factor from the tensor and the published
/// Llama 3.1 defaults (or `rope.scaling.*`).
fn rope_scaling(
    g: &GgufFile,
    gguf_arch: GgufArch,
    arch: &str,
    head_dim: u64,
    theta: f64,
) -> Result<Option<Value>> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let ty = g.get_str(&key("type"))?;
    let factor_key = g.get_f64(&key("factor"))?;
    match ty {
        None | Some("none") => {}
        Some(_) if factor_key.is_none_or(|f| f == 1.0) => {}
        Some("linear") => return Ok(Some(json!({"rope_type": "linear", "factor": factor_key}))),
        Some("yarn") => {
            let mut y = json!({
                "rope_type": "yarn",
                "factor": factor_key,
                "original_max_position_embeddings": g.get_u64(&key("original_context_length"))?,
                "beta_fast": g.get_f64(&key("yarn_beta_fast"))?.unwrap_or(32.0),
                "beta_slow": g.get_f64(&key("yarn_beta_slow"))?.unwrap_or(1.0),
            });
            if let Some(a) = g.get_f64(&key("yarn_attn_factor"))? {
                y["attention_factor"] = json!(as_written(a));
            }
            // gpt-oss's published setting (not in the file): the correction range is not
            // rounded to whole dimensions.
            if gguf_arch == GgufArch::GptOss {
                y["truncate"] = json!(false);
            }
            return Ok(Some(y));
        }
        Some(other) => {
            return Err(CheckpointError::Gguf(format!(
                "{} = {other:?} (factor {factor_key:?}) is not supported: only linear, YaRN and Llama 3 rope scaling can be converted",
                key("type")
            )));
        }
    }
    // Gemma 4's `rope_freqs` marks its global layers' unturned pairs ("proportional" RoPE),
    // read by `gguf/gemma4.rs`: not a Llama 3 scaling.
    let Some(info) = g
        .tensor("rope_freqs.weight")
        .filter(|_| gguf_arch != GgufArch::Gemma4)
    else {
        return Ok(None);
    };
    let data = g.tensor_data(info)?;
    let divisors = dequantize(&info.name, info.ggml_type, data, info.n_elements() as usize)?;
    let dim = g
        .get_u64(&format!("{arch}.rope.dimension_count"))?
        .unwrap_or(head_dim) as f64;
    let factor =
        factor_key.unwrap_or_else(|| divisors.iter().copied().fold(1.0f32, f32::max) as f64);
    let low = g.get_f64(&key("low_freq_factor"))?.unwrap_or(1.0);
    let high = g.get_f64(&key("high_freq_factor"))?.unwrap_or(4.0);
    let orig = g
        .get_f64(&key("original_context_length"))?
        .unwrap_or(8192.0);
    let expected = llama3_divisors(dim, theta, factor, low, high, orig);
    let matches = expected.len() == divisors.len()
        && expected
            .iter()
            .zip(&divisors)
            .all(|(&e, &d)| ((e - d as f64) / e).abs() < 1e-3);
    if !matches {
        tracing::warn!(
            "rope_freqs.weight does not match Llama 3 rope scaling with factor {factor}, low_freq_factor {low}, high_freq_factor {high}, original context {orig}; ignoring it (long-context outputs may differ from llama.cpp)"
        );
        return Ok(None);
    }
    Ok(Some(json!({
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": orig,
    })))
}

/// llama.cpp's `LlamaModel.generate_extra_tensors`: the divisor applied to each RoPE frequency.
fn llama3_divisors(dim: f64, theta: f64, factor: f64, low: f64, high: f64, orig: f64) -> Vec<f64> {
    let low_wavelen = orig / low;
    let high_wavelen = orig / high;
    (0..(dim as usize) / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / dim);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

pub fn config_json(h: &Hparams, dtype: DType) -> Value {
    if let Some(c) = &h.gemma4_config {
        let mut c = c.clone();
        c["torch_dtype"] = json!(dtype.name());
        return c;
    }
    let (class, model_type) = match h.arch {
        GgufArch::Olmo2 if h.windows.is_some() => ("Olmo3ForCausalLM", "olmo3"),
        a => a.hf(h.experts.is_some()),
    };
    let mut c = json!({
        "architectures": [class],
        "model_type": model_type,
        "vocab_size": h.vocab_size,
        "hidden_size": h.hidden_size,
        "intermediate_size": h.intermediate_size,
        "num_hidden_layers": h.num_layers,
        "num_attention_heads": h.num_heads,
        "num_key_value_heads": h.num_kv_heads,
        "head_dim": h.head_dim,
        "hidden_act": if h.gemma.is_some() { "gelu_pytorch_tanh" } else { "silu" },
        "rms_norm_eps": h.rms_norm_eps,
        "rope_theta": h.rope_theta,
        "max_position_embeddings": h.context_length,
        "tie_word_embeddings": h.tie_word_embeddings,
        "torch_dtype": dtype.name(),
        "bos_token_id": h.bos_token_id,
        "eos_token_id": eos_json(&h.eos_token_ids),
        "rope_scaling": h.rope_scaling,
    });
    if h.arch == GgufArch::Llama {
        c["attention_bias"] = json!(false);
        c["mlp_bias"] = json!(false);
    }
    if let Some(w) = &h.windows {
        let types: Vec<&str> = w
            .local
            .iter()
            .map(|&l| {
                if l {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        c["sliding_window"] = json!(w.size);
        c["layer_types"] = json!(types);
    }
    if let Some(gm) = &h.gemma {
        c["rope_local_base_freq"] = json!(gm.rope_local_base_freq);
        c["query_pre_attn_scalar"] = json!(gm.query_pre_attn_scalar);
        c["final_logit_softcapping"] = json!(gm.final_logit_softcapping);
    }
    if h.arch == GgufArch::GptOss {
        c["attention_bias"] = json!(true);
    }
    if h.arch == GgufArch::SmolLM3 {
        c["no_rope_layer_interval"] = json!(4);
    }
    if let Some(base) = h.rope_theta_swa.filter(|_| h.windows.is_some()) {
        c["rope_local_base_freq"] = json!(base);
    }
    if let Some(r) = &h.sigmoid {
        super::sigmoe::config_json(h, r, &mut c);
    } else if let Some(e) = h.experts.as_ref().filter(|_| h.mla.is_none()) {
        c["num_experts_per_tok"] = json!(e.used);
        if h.arch.qwen_experts() {
            // llama.cpp renormalizes the top-k weights of Qwen3-MoE and the hybrids, not
            // Qwen2-MoE's (each family's published setting).
            c["num_experts"] = json!(e.count);
            c["moe_intermediate_size"] = json!(e.feed_forward_length);
            c["norm_topk_prob"] = json!(h.arch != GgufArch::Qwen2Moe);
            c["mlp_only_layers"] = json!(e.dense_layers);
            if let Some(w) = e.shared_feed_forward_length {
                c["shared_expert_intermediate_size"] = json!(w);
            }
        } else {
            c["num_local_experts"] = json!(e.count);
            c["intermediate_size"] = json!(e.feed_forward_length);
        }
    }
    if let Some(l) = &h.linear {
        hybrid::config_json(h, l, &mut c);
    }
    if let Some(m) = &h.mla {
        crate::gguf::mla::config_json(h, m, &mut c);
    }
    c
}

pub fn generation_config_json(h: &Hparams) -> Value {
    json!({
        "bos_token_id": h.bos_token_id,
        "eos_token_id": eos_json(&h.eos_token_ids),
        "_from_model_config": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gpt-oss file names one EOS; `<|return|>` and `<|call|>` end replies too, found by text.
    #[test]
    fn gpt_oss_stops_at_return_and_call() {
        use crate::gguf::GgmlType;
        use crate::gguf::reader::GgufValue as V;
        use crate::gguf::writer::{TensorOut, write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let tokens = ["a", "<|end|>", "<|return|>", "b", "<|call|>"];
        let u = |k: &str, v: u32| (k.to_string(), V::U32(v));
        let meta = vec![
            (
                "general.architecture".to_string(),
                V::String("gpt-oss".into()),
            ),
            u("gpt-oss.embedding_length", 2),
            u("gpt-oss.attention.head_count", 1),
            u("gpt-oss.block_count", 1),
            u("gpt-oss.feed_forward_length", 2),
            u("gpt-oss.expert_count", 2),
            u("gpt-oss.expert_used_count", 1),
            u("tokenizer.ggml.eos_token_id", 2),
            (
                "tokenizer.ggml.tokens".to_string(),
                V::Array(tokens.iter().map(|t| V::String(t.to_string())).collect()),
            ),
        ];
        let embd = TensorOut {
            name: "token_embd.weight".into(),
            dims: vec![2, 5],
            ggml_type: GgmlType::F32,
            data: vec![0; 40],
        };
        write(&path, &meta, &[embd]).unwrap();
        let h = read(&GgufFile::open(&path).unwrap()).unwrap();
        assert_eq!(h.eos_token_ids, [2, 4], "<|end|> does not end a reply");
    }

    #[test]
    fn f32_metadata_reads_as_the_decimal_written() {
        assert_eq!(as_written(f64::from(1e-6f32)), 1e-6);
        assert_eq!(as_written(f64::from(1e-5f32)), 1e-5);
        // A value f32 cannot hold came from an f64 key: as it is.
        assert_eq!(as_written(0.1), 0.1);
    }

    #[test]
    fn llama3_divisors_match_llama31_shape() {
        // Llama 3.1 8B: theta 5e5, head_dim 128, factor 8. Highest frequency untouched,
        // lowest divided by the factor, values in between monotone.
        let d = llama3_divisors(128.0, 500000.0, 8.0, 1.0, 4.0, 8192.0);
        assert_eq!(d.len(), 64);
        assert_eq!(d[0], 1.0);
        assert_eq!(d[63], 8.0);
        assert!(d.windows(2).all(|w| w[0] <= w[1]));
    }
}
