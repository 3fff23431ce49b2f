//! `config.json` of an HF checkpoint, reduced to what the Llama-family forward pass needs.

use std::path::Path;

use serde::Deserialize;

pub mod encoder;
pub mod gemma4;
pub mod gemma4_vision;
pub mod linear_attn;
pub mod mla;
pub mod moe;
pub mod quantization;
mod rope;
mod sigmoe;
pub mod vision;

use crate::error::{CheckpointError, Result};
use encoder::EncoderConfig;
pub use gemma4::Gemma4Config;
use linear_attn::LinearAttnConfig;
use mla::MlaConfig;
use moe::{ExpertActivation, MoeConfig, Routing};
use rope::RawRopeScaling;
pub use rope::{Llama3RopeScaling, YarnScaling};
use vision::{VisionConfig, VisionVariant};

/// Which member of the Llama family a checkpoint is; decides biases, norms and tensor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM2, TinyLlama and other `LlamaForCausalLM` checkpoints.
    Llama,
    Mistral,
    /// q/k/v projections carry biases.
    Qwen2,
    /// RMSNorm over each q and k head before RoPE; explicit head_dim.
    Qwen3,
    /// Qwen3's attention with mixture-of-experts MLPs (`mlp.experts.N`, router `mlp.gate`).
    Qwen3Moe,
    /// Qwen2's attention (q/k/v biases) with Qwen3-MoE's experts and a shared expert beside
    /// them (`mlp.shared_expert`, scaled by `σ(mlp.shared_expert_gate · x)`).
    Qwen2Moe,
    /// Mistral's attention with mixture-of-experts MLPs (`block_sparse_moe`, w1/w2/w3).
    Mixtral,
    /// Gemma 3 (text): GeGLU, the embedding scaled by sqrt(hidden), RMSNorms of `x · (1 + w)`
    /// before and after attention and MLP, q/k norms, local (sliding-window) and global layers
    /// with their own RoPE bases.
    Gemma3,
    /// Gemma 4 (text): Gemma 3's layout with plain `x · w` norms, local and global layers of
    /// their own head widths, K = V, V norms, per-layer embeddings, K/V shared by the last
    /// layers, experts beside the MLP, soft-capped logits ([`ModelConfig::gemma4`]).
    Gemma4,
    /// gpt-oss: experts (top-k then softmax, biases, clamped SwiGLU), attention with biases
    /// and per-head sinks, a sliding window on alternate layers, YaRN RoPE.
    GptOss,
    /// Qwen3.5 / Qwen3.6, dense and mixture-of-experts: three of every four layers Gated
    /// DeltaNet linear attention (a recurrent state per sequence), the others gated full
    /// attention (a sigmoid output gate, q/k norms, partial RoPE); RMSNorms of `x · (1 + w)`.
    Qwen35,
    /// Qwen3-Next: Qwen3.5's hybrid layers (its linear projections grouped per key head) with
    /// mixtures of experts and a shared expert.
    Qwen3Next,
    /// BERT encoders (`BertModel`, `BertForSequenceClassification`, ...): bidirectional,
    /// absolute positions, token types, post-LN layers ([`ModelConfig::encoder`]).
    Bert,
    /// XLM-RoBERTa and RoBERTa encoders: BERT's layers, positions from `pad_token_id + 1`.
    XlmRoberta,
    /// DeepSeek-V3 / Kimi K2 (and DeepSeek-V2-Lite, Moonlight: `q_lora_rank` null):
    /// multi-head latent attention ([`ModelConfig::mla`]), the first layers dense.
    DeepseekV3,
    /// GLM-4.7-Flash: DeepSeek-V3's latent attention and layers (`mlp_layer_types`).
    Glm4MoeLite,
    /// GLM-4.5 / 4.6 / 4.7 (`Glm4MoeForCausalLM`): full attention with partial RoPE (half of
    /// each head by default), q/k/v biases (`attention_bias`) and per-head q/k norms
    /// (`use_qk_norm`) where the config sets them; DeepSeek-style mixtures
    /// ([`moe::Routing::SigmoidGroupedTopK`]) after `first_k_dense_replace` dense layers.
    Glm4Moe,
    /// MiniMax-M2: full attention with partial RoPE (`rotary_dim`) and one RMSNorm over each
    /// whole q and k projection (not per head); sigmoid-routed experts in every layer.
    MiniMaxM2,
    /// SmolLM3: Llama's layers, with no RoPE on the layers `no_rope_layers` marks (every
    /// fourth by default: [`ModelConfig::no_rope`]).
    SmolLM3,
    /// OLMo 2: no norm before attention or the MLP, an RMSNorm of each one's output before
    /// its residual add; q and k RMS-normalized over the whole projection (every head at
    /// once) before RoPE.
    Olmo2,
    /// OLMo 3: OLMo 2 with sliding-window layers (`layer_types`); its RoPE scaling (YaRN)
    /// on the full-attention layers only.
    Olmo3,
}

/// Every `architectures` name a checkpoint may give, and what it loads as. The multimodal
/// Gemma 3 checkpoints (gemma-3-4b-it and up) serve their text model (their SigLIP tower is not
/// read); Qwen2-VL's and Qwen2.5-VL's language model is Qwen2's (with M-RoPE), Qwen3-VL's is
/// Qwen3's (with interleaved M-RoPE and DeepStack inputs).
const HF_NAMES: &[(&str, Architecture)] = &[
    ("LlamaForCausalLM", Architecture::Llama),
    ("MistralForCausalLM", Architecture::Mistral),
    ("Qwen2ForCausalLM", Architecture::Qwen2),
    ("Qwen3ForCausalLM", Architecture::Qwen3),
    ("Qwen3MoeForCausalLM", Architecture::Qwen3Moe),
    ("Qwen2MoeForCausalLM", Architecture::Qwen2Moe),
    ("MixtralForCausalLM", Architecture::Mixtral),
    ("Gemma3ForCausalLM", Architecture::Gemma3),
    ("Gemma3ForConditionalGeneration", Architecture::Gemma3),
    ("Gemma4ForCausalLM", Architecture::Gemma4),
    ("Gemma4ForConditionalGeneration", Architecture::Gemma4),
    ("GptOssForCausalLM", Architecture::GptOss),
    ("Qwen2VLForConditionalGeneration", Architecture::Qwen2),
    ("Qwen2_5_VLForConditionalGeneration", Architecture::Qwen2),
    ("Qwen3VLForConditionalGeneration", Architecture::Qwen3),
    ("Qwen3_5ForConditionalGeneration", Architecture::Qwen35),
    ("Qwen3_5ForCausalLM", Architecture::Qwen35),
    ("Qwen3_5MoeForConditionalGeneration", Architecture::Qwen35),
    ("Qwen3_5MoeForCausalLM", Architecture::Qwen35),
    ("Qwen3NextForCausalLM", Architecture::Qwen3Next),
    ("DeepseekV3ForCausalLM", Architecture::DeepseekV3),
    ("Glm4MoeLiteForCausalLM", Architecture::Glm4MoeLite),
    ("Glm4MoeForCausalLM", Architecture::Glm4Moe),
    ("MiniMaxM2ForCausalLM", Architecture::MiniMaxM2),
    ("SmolLM3ForCausalLM", Architecture::SmolLM3),
    ("Olmo2ForCausalLM", Architecture::Olmo2),
    ("Olmo3ForCausalLM", Architecture::Olmo3),
];

/// The architecture names that load, for the error that refuses another.
pub fn supported_architectures() -> String {
    let names: Vec<&str> = all_names().map(|&(n, _)| n).collect();
    names.join(", ")
}

fn all_names() -> impl Iterator<Item = &'static (&'static str, Architecture)> {
    HF_NAMES.iter().chain(encoder::ENCODER_NAMES)
}

impl Architecture {
    pub fn from_hf_name(name: &str) -> Result<Self> {
        all_names()
            .find(|&&(n, _)| n == name)
            .map(|&(_, a)| a)
            .ok_or_else(|| CheckpointError::UnknownArchitecture {
                name: name.to_string(),
                supported: supported_architectures(),
            })
    }

    pub fn hf_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Qwen3Moe => "Qwen3MoeForCausalLM",
            Architecture::Qwen2Moe => "Qwen2MoeForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
            Architecture::Gemma3 => "Gemma3ForCausalLM",
            Architecture::Gemma4 => "Gemma4ForCausalLM",
            Architecture::GptOss => "GptOssForCausalLM",
            Architecture::Qwen35 => "Qwen3_5ForCausalLM",
            Architecture::Qwen3Next => "Qwen3NextForCausalLM",
            Architecture::Bert => "BertModel",
            Architecture::XlmRoberta => "XLMRobertaModel",
            Architecture::DeepseekV3 => "DeepseekV3ForCausalLM",
            Architecture::Glm4MoeLite => "Glm4MoeLiteForCausalLM",
            Architecture::Glm4Moe => "Glm4MoeForCausalLM",
            Architecture::MiniMaxM2 => "MiniMaxM2ForCausalLM",
            Architecture::SmolLM3 => "SmolLM3ForCausalLM",
            Architecture::Olmo2 => "Olmo2ForCausalLM",
            Architecture::Olmo3 => "Olmo3ForCausalLM",
        }
    }

    /// A bidirectional encoder (BERT, XLM-RoBERTa): run by the encoder engine, never
    /// generating.
    pub fn is_encoder(self) -> bool {
        matches!(self, Architecture::Bert | Architecture::XlmRoberta)
    }

    /// The vision tower a checkpoint's architecture name implies.
    pub fn vision_variant(name: &str) -> Option<VisionVariant> {
        match name {
            "Qwen2VLForConditionalGeneration" => Some(VisionVariant::Qwen2Vl),
            "Qwen2_5_VLForConditionalGeneration" => Some(VisionVariant::Qwen25Vl),
            "Qwen3VLForConditionalGeneration"
            | "Qwen3_5ForConditionalGeneration"
            | "Qwen3_5MoeForConditionalGeneration" => Some(VisionVariant::Qwen3Vl),
            _ => None,
        }
    }

    pub fn has_qkv_bias(self) -> bool {
        matches!(
            self,
            Architecture::Qwen2 | Architecture::Qwen2Moe | Architecture::GptOss
        )
    }

    /// The output projection has a bias and the attention a learned per-head sink logit in
    /// its softmax (gpt-oss).
    pub fn has_sinks(self) -> bool {
        self == Architecture::GptOss
    }

    pub fn has_qk_norm(self) -> bool {
        matches!(
            self,
            Architecture::Qwen3
                | Architecture::Qwen3Moe
                | Architecture::Gemma3
                | Architecture::Qwen35
                | Architecture::Qwen3Next
        )
    }

    /// Multi-head latent attention in every layer ([`ModelConfig::mla`]).
    pub fn is_mla(self) -> bool {
        matches!(self, Architecture::DeepseekV3 | Architecture::Glm4MoeLite)
    }

    /// q/k/v biases and per-head q/k norms are read where the checkpoint holds them: GLM-4.5's
    /// `attention_bias` and `use_qk_norm` differ between its checkpoints, and transformers
    /// makes these tensors exactly when the config sets the flag.
    pub fn optional_qkv_bias_and_norms(self) -> bool {
        self == Architecture::Glm4Moe
    }

    /// q and k RMS-normalized over their whole projections (one weight of `num_heads ·
    /// head_dim`, one of `num_kv_heads · head_dim`), not head by head (OLMo 2, OLMo 3,
    /// MiniMax-M2).
    pub fn qk_norm_whole(self) -> bool {
        self.is_olmo() || self == Architecture::MiniMaxM2
    }

    /// OLMo 2 and 3: norms after attention and after the MLP (before each residual add), none
    /// before them.
    pub fn is_olmo(self) -> bool {
        matches!(self, Architecture::Olmo2 | Architecture::Olmo3)
    }

    /// Linear-attention layers beside the full-attention ones (Gated DeltaNet hybrids).
    pub fn is_hybrid(self) -> bool {
        matches!(self, Architecture::Qwen35 | Architecture::Qwen3Next)
    }

    /// RMSNorms of `x · (1 + w)` whose HF checkpoints hold w (Gemma, the Qwen3.5 family).
    pub fn norms_add_one(self) -> bool {
        self.is_gemma() || self.is_hybrid()
    }

    /// The full-attention layers' q projection also gives a per-channel output gate
    /// (`attn_output · σ(gate)`), interleaved with q head by head.
    pub fn attn_output_gate(self) -> bool {
        self.is_hybrid()
    }

    /// Gemma's norms: RMSNorm of `x · (1 + w)` (HF checkpoints hold w; llama.cpp's GGUF files
    /// hold 1 + w), a norm after attention and after the MLP as well as before each, and the
    /// token embeddings scaled by sqrt(hidden).
    pub fn is_gemma(self) -> bool {
        self == Architecture::Gemma3
    }
}

/// The gated MLP's activation (`hidden_act` / `hidden_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) · up` (GeGLU with the tanh approximation, `gelu_pytorch_tanh`).
    GeluTanh,
}

/// Interleaved local (sliding-window) and global attention layers (Gemma 3).
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Keys a local layer's query sees: its own position and the `size - 1` before it.
    pub size: usize,
    /// Per layer: true where it is local.
    pub local: Vec<bool>,
    /// The local layers' own RoPE base (unscaled: Gemma); None: the global layers' RoPE
    /// (gpt-oss).
    pub rope_theta: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Leading dimensions of each head that RoPE turns (`partial_rotary_factor`): head_dim
    /// unless the model rotates only part of each head (Qwen3.5: a quarter).
    pub rotary_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// `rope_scaling` of type `linear`: positions divided by this factor.
    pub rope_linear_factor: Option<f64>,
    pub rope_yarn: Option<YarnScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// `torch_dtype` of the checkpoint, when given.
    pub torch_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    /// Every id listed as `eos_token_id` (an int or a list in HF configs).
    pub eos_token_ids: Vec<u32>,
    /// M-RoPE (Qwen-VL): how many of the head's rotary frequencies follow each token's
    /// temporal, height and width position, in that order.
    pub mrope_section: Option<[usize; 3]>,
    /// M-RoPE's frequencies go to (time, row, column) in turn rather than in three contiguous
    /// sections (Qwen3-VL, Qwen3.5: [`Self::mrope_components`]).
    pub mrope_interleaved: bool,
    /// The vision tower of a vision-language model.
    pub vision: Option<VisionConfig>,
    /// Mixture-of-experts MLPs (Qwen3-MoE, Mixtral).
    pub moe: Option<MoeConfig>,
    pub activation: Activation,
    /// Local attention layers, where the model has them.
    pub sliding_window: Option<SlidingWindow>,
    /// Linear-attention layers (Gated DeltaNet), where the model has them.
    pub linear_attn: Option<LinearAttnConfig>,
    /// Multi-head latent attention (DeepSeek-V3, GLM-4.7-Flash): then `head_dim` is the
    /// rotary part's (`qk_rope_head_dim`, as transformers sets it) and the KV cache holds
    /// [`MlaConfig::cache_width`] values a token and layer.
    pub mla: Option<MlaConfig>,
    /// Attention scores are scaled by `1 / sqrt(this)`: `query_pre_attn_scalar` (Gemma),
    /// else head_dim.
    pub attn_scalar: f64,
    /// An encoder's own fields (BERT, XLM-RoBERTa); None for decoders.
    pub encoder: Option<EncoderConfig>,
    /// Per layer, true where it applies no RoPE (SmolLM3's NoPE layers); empty when every
    /// layer does.
    pub no_rope: Vec<bool>,
    /// Gemma 4's own fields; None for other models.
    pub gemma4: Option<Gemma4Config>,
}

/// transformers' `Gemma3TextConfig` defaults (4.57), for the fields a Hub config may omit.
const GEMMA3_DEFAULTS: [(&str, &str); 14] = [
    ("vocab_size", "262208"),
    ("hidden_size", "2304"),
    ("intermediate_size", "9216"),
    ("num_hidden_layers", "26"),
    ("num_attention_heads", "8"),
    ("num_key_value_heads", "4"),
    ("head_dim", "256"),
    ("query_pre_attn_scalar", "256"),
    ("sliding_window", "4096"),
    ("rope_theta", "1000000.0"),
    ("rope_local_base_freq", "10000.0"),
    ("max_position_embeddings", "131072"),
    ("rms_norm_eps", "1e-6"),
    ("tie_word_embeddings", "true"),
];

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<u32> {
        match self {
            OneOrMany::One(x) => vec![x],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRopeScaling>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    torch_dtype: Option<String>,
    /// What transformers 4.56 and later write for `torch_dtype`.
    dtype: Option<String>,
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
    // Mixture of experts: Qwen3-MoE's names, then Mixtral's.
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    shared_expert_intermediate_size: Option<usize>,
    qkv_bias: Option<bool>,
    // Gemma 3.
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    query_pre_attn_scalar: Option<f64>,
    sliding_window: Option<usize>,
    /// Qwen2's and Qwen3's switch for `sliding_window` (off in their published configs), and
    /// the layers from which it applies when `layer_types` does not list them.
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    sliding_window_pattern: Option<usize>,
    layer_types: Option<Vec<String>>,
    rope_local_base_freq: Option<f64>,
    partial_rotary_factor: Option<f64>,
    /// MiniMax-M2's spelling of the rotated dimensions.
    rotary_dim: Option<usize>,
    swiglu_limit: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    // SmolLM3 (1 where a layer uses RoPE), OLMo.
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
        Self::from_json(&text).map_err(|msg| CheckpointError::Config {
            path: path.to_path_buf(),
            msg,
        })
    }

    /// Parses config.json text; the error names the missing or invalid field.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let mut top: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|e| e.to_string())?;
        // Newer transformers nest a composite model's text fields under `text_config`.
        if let Some(serde_json::Value::Object(tc)) = top.get("text_config").cloned() {
            for (k, v) in tc {
                if k != "architectures" {
                    top.insert(k, v);
                }
            }
        }
        rope::rope_parameters(&mut top);
        quantization::check(&top)?;
        let first_arch = top
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
            .unwrap_or_default()
            .to_string();
        let gemma4 = first_arch.starts_with("Gemma4For");
        if gemma4 {
            for (k, v) in gemma4::DEFAULTS {
                top.entry(k.to_string())
                    .or_insert_with(|| serde_json::from_str(v).unwrap_or_default());
            }
        }
        if first_arch.starts_with("Gemma3For") {
            // The Hub's Gemma 3 configs leave out what equals Gemma3TextConfig's defaults.
            for (k, v) in GEMMA3_DEFAULTS {
                top.entry(k.to_string())
                    .or_insert_with(|| serde_json::from_str(v).unwrap_or_default());
            }
        }
        let mut raw: RawConfig = serde_json::from_value(serde_json::Value::Object(top.clone()))
            .map_err(|e| e.to_string())?;
        let arch_name = raw
            .architectures
            .as_ref()
            .and_then(|a| a.first())
            .ok_or("field \"architectures\" is missing or empty")?;
        let architecture = Architecture::from_hf_name(arch_name).map_err(|e| e.to_string())?;
        if architecture.is_encoder() {
            return encoder::parse(&top, arch_name, architecture);
        }
        fn req(v: Option<usize>, name: &str) -> std::result::Result<usize, String> {
            match v {
                Some(0) => Err(format!("field {name:?} must be > 0")),
                Some(x) => Ok(x),
                None => Err(format!("field {name:?} is missing")),
            }
        }
        let hidden_size = req(raw.hidden_size, "hidden_size")?;
        let num_heads = req(raw.num_attention_heads, "num_attention_heads")?;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
            ));
        }
        let mla = match architecture.is_mla() {
            true => Some(MlaConfig::parse(&top)?),
            false => None,
        };
        let head_dim = match (&mla, raw.head_dim) {
            // transformers' `head_dim` of a latent-attention model: what its RoPE turns.
            (Some(m), _) => m.qk_rope_head_dim,
            (None, Some(d)) => d,
            (None, None) => {
                if hidden_size % num_heads != 0 {
                    return Err(format!(
                        "hidden_size ({hidden_size}) is not a multiple of num_attention_heads ({num_heads}) and head_dim is not given"
                    ));
                }
                hidden_size / num_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(format!("head_dim ({head_dim}) must be even for RoPE"));
        }
        let vision_variant = Architecture::vision_variant(arch_name);
        let rope::Rope {
            rotary_dim,
            mrope_section,
            mrope_interleaved,
            rope_scaling,
            rope_linear_factor,
            rope_yarn,
        } = rope::parse(
            raw.rope_scaling.take(),
            sigmoe::partial_rotary_factor(
                architecture,
                raw.partial_rotary_factor,
                raw.rotary_dim,
                head_dim,
            ),
            head_dim,
            architecture,
            vision_variant,
            raw.max_position_embeddings,
        )?;
        // Qwen3.5's tower is Qwen3-VL's without DeepStack.
        let deepstack = architecture.is_hybrid().then(Vec::new);
        let vision = match vision_variant {
            Some(v) => Some(vision::parse(v, &top, hidden_size, deepstack)?),
            None => None,
        };
        if vision.is_some() && mrope_section.is_none() {
            return Err("a Qwen-VL config needs rope_scaling.mrope_section".into());
        }
        // Qwen3.5-MoE's configs give no dense width (every layer holds experts).
        let dense_width = match architecture.is_hybrid() && raw.num_experts.is_some() {
            true => raw.intermediate_size.or(raw.moe_intermediate_size),
            false => raw.intermediate_size,
        };
        let intermediate_size = req(dense_width, "intermediate_size")?;
        let num_layers = req(raw.num_hidden_layers, "num_hidden_layers")?;
        if raw.qkv_bias == Some(false) && architecture == Architecture::Qwen2Moe {
            return Err("qkv_bias: false is not supported (Qwen2-MoE's q/k/v carry biases)".into());
        }
        let moe = match architecture {
            Architecture::Qwen3Moe | Architecture::Qwen2Moe => {
                let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
                let only = raw.mlp_only_layers.clone().unwrap_or_default();
                let shared_width = match architecture {
                    Architecture::Qwen2Moe => Some(req(
                        raw.shared_expert_intermediate_size,
                        "shared_expert_intermediate_size",
                    )?)
                    .filter(|&w| w > 0),
                    _ => None,
                };
                Some(MoeConfig {
                    num_experts: req(raw.num_experts, "num_experts")?,
                    top_k: req(raw.num_experts_per_tok, "num_experts_per_tok")?,
                    expert_intermediate_size: req(
                        raw.moe_intermediate_size,
                        "moe_intermediate_size",
                    )?,
                    routing: Routing::SoftmaxTopK {
                        renormalize: raw.norm_topk_prob.unwrap_or(false),
                    },
                    activation: ExpertActivation::Silu,
                    biases: false,
                    dense_layers: (0..num_layers)
                        .filter(|i| only.contains(i) || (i + 1) % step != 0)
                        .collect(),
                    shared_width,
                })
            }
            // Qwen3.5-MoE and Qwen3-Next: Qwen3-MoE's experts with Qwen2-MoE's shared expert.
            Architecture::Qwen35 | Architecture::Qwen3Next if raw.num_experts.is_some() => {
                let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
                let only = raw.mlp_only_layers.clone().unwrap_or_default();
                Some(MoeConfig {
                    num_experts: req(raw.num_experts, "num_experts")?,
                    top_k: req(raw.num_experts_per_tok, "num_experts_per_tok")?,
                    expert_intermediate_size: req(
                        raw.moe_intermediate_size,
                        "moe_intermediate_size",
                    )?,
                    routing: Routing::SoftmaxTopK {
                        renormalize: raw.norm_topk_prob.unwrap_or(true),
                    },
                    activation: ExpertActivation::Silu,
                    biases: false,
                    dense_layers: (0..num_layers)
                        .filter(|i| only.contains(i) || (i + 1) % step != 0)
                        .collect(),
                    shared_width: raw.shared_expert_intermediate_size.filter(|&w| w > 0),
                })
            }
            Architecture::Mixtral => Some(MoeConfig {
                num_experts: req(raw.num_local_experts, "num_local_experts")?,
                top_k: req(raw.num_experts_per_tok, "num_experts_per_tok")?,
                expert_intermediate_size: intermediate_size,
                routing: Routing::SoftmaxTopK { renormalize: true },
                activation: ExpertActivation::Silu,
                biases: false,
                dense_layers: Vec::new(),
                shared_width: None,
            }),
            Architecture::Glm4Moe => Some(moe::parse_deepseek(&top, num_layers)?),
            Architecture::MiniMaxM2 => Some(moe::parse_minimax_m2(&top)?),
            // The constants of transformers' GptOssExperts.
            Architecture::GptOss => Some(MoeConfig {
                num_experts: req(raw.num_local_experts, "num_local_experts")?,
                top_k: req(raw.num_experts_per_tok, "num_experts_per_tok")?,
                expert_intermediate_size: intermediate_size,
                routing: Routing::TopKSoftmax,
                activation: ExpertActivation::ClampedSwiGlu {
                    alpha: 1.702,
                    limit: raw.swiglu_limit.unwrap_or(7.0) as f32,
                },
                biases: true,
                dense_layers: Vec::new(),
                shared_width: None,
            }),
            _ => None,
        };
        // DeepSeek-style experts after the dense layers (transformers' defaults: DeepSeek-V3's
        // first 3, GLM-4.7-Flash's first 1), or none at all.
        let moe = match &mla {
            Some(_) => {
                let default_dense = match architecture {
                    Architecture::DeepseekV3 => 3,
                    _ => 1,
                };
                let sparse = mla::sparse_layers(&top, num_layers, default_dense)?;
                match sparse.iter().any(|&s| s) {
                    false => None,
                    true => {
                        let mut m = moe::parse_deepseek(&top, num_layers)?;
                        m.dense_layers = (0..num_layers).filter(|&i| !sparse[i]).collect();
                        Some(m)
                    }
                }
            }
            None => moe,
        };
        let gemma = architecture.is_gemma();
        let act_name = raw
            .hidden_activation
            .as_deref()
            .or(raw.hidden_act.as_deref());
        let activation = match act_name {
            None if gemma || gemma4 => Activation::GeluTanh,
            None | Some("silu" | "swish") => Activation::Silu,
            Some("gelu_pytorch_tanh" | "gelu_tanh") => Activation::GeluTanh,
            Some(other) => {
                return Err(format!(
                    "hidden activation {other:?} is not supported (supported: silu, gelu_pytorch_tanh)"
                ));
            }
        };
        // Gemma 4 soft-caps its final logits (`Gemma4Config`); attention scores stay uncapped.
        if raw.final_logit_softcapping.is_some_and(|c| c > 0.0) && !gemma4
            || raw.attn_logit_softcapping.is_some_and(|c| c > 0.0)
        {
            return Err("logit soft-capping (Gemma 2's) is not supported".into());
        }
        // transformers applies `sliding_window` for these (Mistral and Mixtral to every layer
        // when set: Mistral-7B-v0.1's 4096); for Qwen2, Qwen3 and Qwen3-MoE only when
        // `use_sliding_window` (off in the published configs), from layer `max_window_layers`
        // on; Llama has none.
        let qwen = matches!(
            architecture,
            Architecture::Qwen2
                | Architecture::Qwen3
                | Architecture::Qwen3Moe
                | Architecture::Qwen2Moe
        );
        let smollm3 = architecture == Architecture::SmolLM3;
        let no_rope = match (smollm3, &raw.no_rope_layers) {
            (false, _) => Vec::new(),
            (true, Some(v)) if v.len() != num_layers => {
                return Err(format!(
                    "no_rope_layers has {} entries for {num_layers} layers",
                    v.len()
                ));
            }
            (true, Some(v)) => v.iter().map(|&r| r == 0).collect(),
            // transformers' SmolLM3Config: every `no_rope_layer_interval`-th layer has none.
            (true, None) => {
                let every = raw.no_rope_layer_interval.unwrap_or(4).max(1);
                (0..num_layers).map(|i| (i + 1) % every == 0).collect()
            }
        };
        let olmo = architecture.is_olmo();
        if (olmo || smollm3) && raw.attention_bias == Some(true) {
            return Err(format!(
                "attention_bias: true is not supported for {arch_name}"
            ));
        }
        if smollm3 && raw.mlp_bias == Some(true) {
            return Err(format!("mlp_bias: true is not supported for {arch_name}"));
        }
        let windowed = gemma
            || gemma4
            || (qwen || smollm3) && raw.use_sliding_window == Some(true)
            || architecture == Architecture::Olmo3
            || matches!(
                architecture,
                Architecture::GptOss | Architecture::Mistral | Architecture::Mixtral
            );
        let sliding_window = match (windowed, raw.sliding_window) {
            (true, Some(size)) if size > 0 => {
                let local: Vec<bool> = match (&raw.layer_types, raw.sliding_window_pattern) {
                    (Some(types), _) => {
                        if types.len() != num_layers {
                            return Err(format!(
                                "layer_types has {} entries for {num_layers} layers",
                                types.len()
                            ));
                        }
                        types
                            .iter()
                            .map(|t| match t.as_str() {
                                "sliding_attention" => Ok(true),
                                "full_attention" => Ok(false),
                                other => Err(format!("layer type {other:?} is not supported")),
                            })
                            .collect::<std::result::Result<_, _>>()?
                    }
                    // Every `pattern`-th layer is global (Gemma 3 publishes 6).
                    (None, p) if gemma => {
                        let p = p.unwrap_or(6).max(1);
                        (0..num_layers).map(|i| (i + 1) % p != 0).collect()
                    }
                    // transformers' SmolLM3Config: the NoPE layers slide.
                    (None, _) if smollm3 => no_rope.clone(),
                    // transformers' Olmo3Config: every fourth layer is global.
                    (None, _) if architecture == Architecture::Olmo3 => {
                        (0..num_layers).map(|i| (i + 1) % 4 != 0).collect()
                    }
                    // gpt-oss alternates, local first.
                    (None, _) if architecture == Architecture::GptOss => {
                        (0..num_layers).map(|i| i % 2 == 0).collect()
                    }
                    // transformers' Qwen2Config default is 28.
                    (None, _) if qwen => {
                        let from = raw.max_window_layers.unwrap_or(28);
                        (0..num_layers).map(|i| i >= from).collect()
                    }
                    (None, _) => vec![true; num_layers],
                };
                Some(SlidingWindow {
                    size,
                    local,
                    rope_theta: match architecture {
                        _ if gemma => Some(raw.rope_local_base_freq.unwrap_or(10_000.0)),
                        // OLMo 3's local layers turn by the global base, unscaled.
                        Architecture::Olmo3 => Some(
                            raw.rope_local_base_freq
                                .or(raw.rope_theta)
                                .unwrap_or(500_000.0),
                        ),
                        _ => None,
                    },
                })
            }
            _ => None,
        };
        let linear_attn = match architecture.is_hybrid() {
            true => Some(
                LinearAttnConfig::parse(&top, num_layers)?
                    .ok_or("a Qwen3.5 / Qwen3-Next config needs its linear_* fields")?,
            ),
            false => None,
        };
        if let Some(m) = &moe
            && m.top_k > m.num_experts
        {
            return Err(format!(
                "num_experts_per_tok ({}) is more than the {} experts",
                m.top_k, m.num_experts
            ));
        }
        let mut config = ModelConfig {
            architecture,
            vocab_size: req(raw.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rotary_dim,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: raw.rope_theta.unwrap_or(match architecture {
                Architecture::Olmo3 => 500_000.0,
                Architecture::SmolLM3 => 2_000_000.0,
                _ => 10_000.0,
            }),
            rope_scaling,
            rope_linear_factor,
            rope_yarn,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            torch_dtype: raw.torch_dtype.or(raw.dtype),
            bos_token_id: raw.bos_token_id.and_then(|b| b.into_vec().first().copied()),
            eos_token_ids: raw
                .eos_token_id
                .map(OneOrMany::into_vec)
                .unwrap_or_default(),
            mrope_section,
            mrope_interleaved,
            vision,
            moe,
            activation,
            sliding_window,
            linear_attn,
            mla,
            attn_scalar: raw.query_pre_attn_scalar.unwrap_or(head_dim as f64),
            encoder: None,
            no_rope,
            gemma4: None,
        };
        if gemma4 {
            config.apply_gemma4(&top)?;
        }
        Ok(config)
    }

    /// Gemma 4's fields ([`gemma4::parse`]) on a config parsed as far as Gemma 3's.
    fn apply_gemma4(
        &mut self,
        top: &serde_json::Map<String, serde_json::Value>,
    ) -> std::result::Result<(), String> {
        let local = gemma4::local_layers(top, self.num_layers)?;
        let p = gemma4::parse(top, &local, self.num_kv_heads)?;
        let size = self.sliding_window.as_ref().map_or(512, |w| w.size);
        self.sliding_window = Some(SlidingWindow {
            size,
            local,
            rope_theta: Some(p.local_theta),
        });
        self.rope_theta = p.global_theta;
        // Scores are q·k unscaled (transformers' `scaling = 1.0`).
        self.attn_scalar = 1.0;
        self.moe = p.moe;
        self.gemma4 = Some(p.config);
        self.vision = gemma4_vision::parse(top, self.hidden_size)?;
        Ok(())
    }

    /// Per layer that keeps K/V (in the order of the cache's pools): its (KV heads, head
    /// width). Gemma 4's global layers have their own; its layers that share K/V keep none.
    pub fn kv_pool_geometry(&self) -> Vec<(usize, usize)> {
        let Some(g) = &self.gemma4 else {
            // A latent-attention layer's record, split in halves between its K and V pools
            // (engine-core's `KvCacheConfig::geometry`).
            let geometry = match &self.mla {
                Some(m) => (1, m.cache_width() / 2),
                None => (self.num_kv_heads, self.head_dim),
            };
            return vec![geometry; self.num_attention_layers()];
        };
        let local = self.sliding_window.as_ref().map(|w| &w.local);
        (0..self.num_layers)
            .filter(|&i| !g.shares_kv(i))
            .map(|i| match local.is_some_and(|l| l[i]) {
                true => (self.num_kv_heads, self.head_dim),
                false => (g.global_kv_heads, g.global_head_dim),
            })
            .collect()
    }

    /// K and V elements one token keeps across every layer's pool.
    pub fn kv_elems_per_token(&self) -> usize {
        2 * self
            .kv_pool_geometry()
            .iter()
            .map(|&(h, d)| h * d)
            .sum::<usize>()
    }

    /// Layers that keep K/V: every layer but the linear-attention ones.
    pub fn num_attention_layers(&self) -> usize {
        let shared = self.gemma4.as_ref().map_or(0, |g| {
            (0..self.num_layers).filter(|&i| g.shares_kv(i)).count()
        });
        self.num_layers
            - shared
            - self
                .linear_attn
                .as_ref()
                .map_or(0, LinearAttnConfig::num_linear_layers)
    }

    /// M-RoPE: which component of a token's (time, row, column) position each rotary
    /// frequency turns with (0, 1, 2). Contiguous sections (Qwen2-VL), or transformers'
    /// `apply_interleaved_mrope` (Qwen3-VL): frequency `i` follows the row when `i % 3 == 1`
    /// and `i < 3 · section[1]`, the column when `i % 3 == 2` and `i < 3 · section[2]`, time
    /// otherwise (so `section[0]` only counts what is left).
    pub fn mrope_components(&self) -> Option<Vec<u8>> {
        let s = self.mrope_section?;
        let n = self.rotary_dim / 2;
        Some(
            (0..n)
                .map(|i| match self.mrope_interleaved {
                    true if i % 3 == 1 && i < 3 * s[1] => 1,
                    true if i % 3 == 2 && i < 3 * s[2] => 2,
                    true => 0,
                    false if i < s[0] => 0,
                    false if i < s[0] + s[1] => 1,
                    false => 2,
                })
                .collect(),
        )
    }

    pub fn q_size(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_size(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_architecture_is_named() {
        let e = ModelConfig::from_json(r#"{"architectures":["GPT2LMHeadModel"]}"#).unwrap_err();
        assert!(e.contains("GPT2LMHeadModel"), "{e}");
        // The refusal names every architecture that loads.
        for &(name, _) in all_names() {
            assert!(e.contains(name), "{name} missing from: {e}");
        }
    }

    /// Qwen1.5-MoE-A2.7B's shape: a shared expert beside 60 routed ones, weights not
    /// renormalized, q/k/v biases.
    #[test]
    fn qwen2_moe_has_a_shared_expert() {
        let json = |extra: &str| {
            format!(
                r#"{{"architectures":["Qwen2MoeForCausalLM"],"vocab_size":151936,"hidden_size":2048,
                "intermediate_size":5632,"num_hidden_layers":24,"num_attention_heads":16,
                "num_key_value_heads":16,"moe_intermediate_size":1408,"num_experts":60,
                "num_experts_per_tok":4,"norm_topk_prob":false,"decoder_sparse_step":1,
                "mlp_only_layers":[]{extra}}}"#
            )
        };
        let c =
            ModelConfig::from_json(&json(r#","shared_expert_intermediate_size":5632"#)).unwrap();
        assert!(c.architecture.has_qkv_bias() && !c.architecture.has_qk_norm());
        let m = c.moe.unwrap();
        assert_eq!(m.shared_width, Some(5632));
        assert_eq!(m.routing, Routing::SoftmaxTopK { renormalize: false });
        assert!((0..24).all(|l| m.is_sparse(l)));
        let e = ModelConfig::from_json(&json("")).unwrap_err();
        assert!(e.contains("shared_expert_intermediate_size"), "{e}");
        let e = ModelConfig::from_json(&json(
            r#","shared_expert_intermediate_size":5632,"qkv_bias":false"#,
        ))
        .unwrap_err();
        assert!(e.contains("qkv_bias"), "{e}");
    }

    /// Qwen3-VL-8B-Instruct's config (text fields nested, transformers 4.57's `rope_scaling`):
    /// Qwen3's attention, interleaved M-RoPE, the tower with its DeepStack blocks.
    #[test]
    fn qwen3_vl_reads_its_tower_and_interleaves_mrope() {
        let c = ModelConfig::from_json(
            r#"{"architectures":["Qwen3VLForConditionalGeneration"],"image_token_id":151655,
            "video_token_id":151656,"vision_start_token_id":151652,"vision_end_token_id":151653,
            "text_config":{"head_dim":128,"hidden_size":4096,"intermediate_size":12288,
            "num_attention_heads":32,"num_hidden_layers":36,"num_key_value_heads":8,
            "rope_scaling":{"mrope_interleaved":true,"mrope_section":[24,20,20],"rope_type":"default"},
            "rope_theta":5000000,"vocab_size":151936,"tie_word_embeddings":false},
            "vision_config":{"deepstack_visual_indexes":[8,16,24],"depth":27,"hidden_act":"gelu_pytorch_tanh",
            "hidden_size":1152,"in_channels":3,"intermediate_size":4304,"num_heads":16,
            "num_position_embeddings":2304,"out_hidden_size":4096,"patch_size":16,
            "spatial_merge_size":2,"temporal_patch_size":2}}"#,
        )
        .unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3);
        let v = c.vision.as_ref().unwrap();
        assert_eq!(v.variant, VisionVariant::Qwen3Vl);
        assert_eq!(v.deepstack_visual_indexes, [8, 16, 24]);
        assert_eq!((v.position_grid_side(), v.output_width()), (48, 4 * 4096));
        assert_eq!(v.patch_dim(), 3 * 2 * 16 * 16);
        // transformers' apply_interleaved_mrope: rows at 1, 4, ..., 58, columns at 2, 5,
        // ..., 59, time at the others (0, 3, ..., 57 and 60..63).
        let comp = c.mrope_components().unwrap();
        assert_eq!(comp.len(), 64);
        assert_eq!(&comp[..7], &[0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(&comp[57..], &[0, 1, 2, 0, 0, 0, 0]);
        assert_eq!(comp.iter().filter(|&&x| x == 0).count(), 24);
        assert_eq!(comp.iter().filter(|&&x| x == 1).count(), 20);
    }

    /// Qwen3.5's configs: with its vision tower (no DeepStack) M-RoPE stays, interleaved over
    /// the partial rotary pairs; the text-only class turns it into plain RoPE.
    #[test]
    fn qwen3_5_reads_its_tower_without_deepstack() {
        let json = |arch: &str| {
            format!(
                r#"{{"architectures":["{arch}"],"image_token_id":248056,
                "text_config":{{"hidden_size":64,"intermediate_size":96,"num_hidden_layers":4,
                "num_attention_heads":4,"num_key_value_heads":2,"head_dim":256,"vocab_size":320,
                "layer_types":["linear_attention","linear_attention","linear_attention","full_attention"],
                "linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":16,
                "linear_value_head_dim":16,"linear_conv_kernel_dim":4,
                "rope_parameters":{{"rope_type":"default","rope_theta":10000000,
                "partial_rotary_factor":0.25,"mrope_interleaved":true}}}},
                "vision_config":{{"depth":2,"hidden_size":32,"num_heads":2,"intermediate_size":64,
                "out_hidden_size":64,"patch_size":16,"num_position_embeddings":64,
                "deepstack_visual_indexes":[0]}}}}"#
            )
        };
        let c = ModelConfig::from_json(&json("Qwen3_5ForConditionalGeneration")).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen35);
        let v = c.vision.as_ref().unwrap();
        assert_eq!(v.variant, VisionVariant::Qwen3Vl);
        assert!(v.deepstack_visual_indexes.is_empty());
        // transformers' default sections for Qwen3.5, over 256 * 0.25 / 2 = 32 pairs.
        assert_eq!(c.mrope_section, Some([11, 11, 10]));
        let comp = c.mrope_components().unwrap();
        assert_eq!((comp.len(), &comp[..4]), (32, &[0, 1, 2, 0][..]));
        let c = ModelConfig::from_json(&json("Qwen3_5ForCausalLM")).unwrap();
        assert!(c.vision.is_none() && c.mrope_section.is_none());
    }

    #[test]
    fn qwen2_vl_sections_stay_contiguous() {
        let c = ModelConfig::from_json(
            r#"{"architectures":["Qwen2VLForConditionalGeneration"],"image_token_id":5,
            "vocab_size":10,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":1,
            "num_attention_heads":2,"rope_scaling":{"type":"mrope","mrope_section":[2,3,3]},
            "vision_config":{"depth":1,"embed_dim":32,"num_heads":2,"hidden_size":32,"patch_size":14}}"#,
        )
        .unwrap();
        assert!(!c.mrope_interleaved);
        assert_eq!(c.mrope_components().unwrap(), [0, 0, 1, 1, 1, 2, 2, 2]);
        assert!(c.vision.unwrap().deepstack_visual_indexes.is_empty());
    }

    #[test]
    fn missing_field_is_named() {
        let e = ModelConfig::from_json(
            r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,"num_attention_heads":2}"#,
        )
        .unwrap_err();
        assert!(e.contains("intermediate_size"), "{e}");
    }
}
