//! Reading and validating LoRA adapters: a PEFT directory (`adapter_config.json` +
//! `adapter_model.safetensors`), or a bare `.safetensors` file (TensorRT Edge-LLM's
//! `available_lora_weights`; an `adapter_config.json` beside it is read when present, else the
//! scale is 1). [`inspect`] checks everything but the weights' values (the config, every
//! tensor's name, layer and shape against the base model, the rank limit) from the file
//! header; [`LoraWeights::load`] then reads the weights, scale folded into B.

use std::path::{Path, PathBuf};

use crate::config::ModelConfig;
use crate::dtype::DType;
use crate::error::{CheckpointError, Result};
use crate::weights::{HostTensor, SafetensorsDir};

/// Projections an adapter may target, with (output rows, input width) in model terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The PEFT module name (`self_attn.q_proj`, ...).
    pub fn module(self) -> &'static str {
        match self {
            Target::Q => "self_attn.q_proj",
            Target::K => "self_attn.k_proj",
            Target::V => "self_attn.v_proj",
            Target::O => "self_attn.o_proj",
            Target::Gate => "mlp.gate_proj",
            Target::Up => "mlp.up_proj",
            Target::Down => "mlp.down_proj",
        }
    }

    /// (out, in) of the base projection.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let h = c.hidden_size;
        match self {
            Target::Q => (c.q_size(), h),
            Target::K | Target::V => (c.kv_size(), h),
            Target::O => (h, c.q_size()),
            Target::Gate | Target::Up => (c.intermediate_size, h),
            Target::Down => (h, c.intermediate_size),
        }
    }
}

/// What an adapter must satisfy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraLimits {
    /// Largest rank accepted (LMI's `option.max_lora_rank`).
    pub max_rank: usize,
    /// Refuse a bare `.safetensors` file: only the PEFT directory layout.
    pub require_peft_dir: bool,
}

impl Default for LoraLimits {
    fn default() -> Self {
        LoraLimits {
            max_rank: 64,
            require_peft_dir: false,
        }
    }
}

/// One projection's low-rank pair, as found in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairInfo {
    pub layer: usize,
    pub target: Target,
    pub a: String,
    pub b: String,
    pub rank: usize,
}

/// An adapter checked against a base model, weights not read yet.
#[derive(Debug, Clone)]
pub struct AdapterInfo {
    pub weights: PathBuf,
    /// The projections it changes, every layer's.
    pub pairs: Vec<PairInfo>,
    /// Largest rank of its pairs.
    pub rank: usize,
    /// `lora_alpha / r` (or `/ sqrt(r)` with rsLoRA); 1 without a config.
    pub scale_for: ScaleRule,
    /// Bytes of its weights in f32.
    pub bytes: usize,
}

/// How the scale of a pair follows from its rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleRule {
    /// None: the rank itself (scale 1).
    pub alpha: Option<f64>,
    pub rslora: bool,
}

impl ScaleRule {
    pub fn scale(self, rank: usize) -> f32 {
        let r = rank as f64;
        let alpha = self.alpha.unwrap_or(r);
        (if self.rslora {
            alpha / r.sqrt()
        } else {
            alpha / r
        }) as f32
    }
}

fn invalid(path: &Path, msg: impl Into<String>) -> CheckpointError {
    CheckpointError::Adapter {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Checks the adapter at `path` against the base model `c`: the layout, the config (PEFT
/// features this engine does not implement are refused by name), every tensor's name, layer
/// and shape, and the rank limit. Reads the config and the safetensors header only.
pub fn inspect(path: &Path, c: &ModelConfig, limits: LoraLimits) -> Result<AdapterInfo> {
    let (weights, config_path) = if path.is_dir() {
        let w = path.join("adapter_model.safetensors");
        if !w.is_file() {
            let hint = if path.join("adapter_model.bin").is_file() {
                ": adapter_model.bin (PyTorch pickle) is not read; save the adapter with safetensors"
            } else {
                ""
            };
            return Err(invalid(
                path,
                format!("not a PEFT adapter directory: adapter_model.safetensors is missing{hint}"),
            ));
        }
        let cfg = path.join("adapter_config.json");
        if !cfg.is_file() {
            return Err(invalid(
                path,
                "not a PEFT adapter directory: adapter_config.json is missing",
            ));
        }
        (w, Some(cfg))
    } else if path.is_file() && path.extension().is_some_and(|e| e == "safetensors") {
        if limits.require_peft_dir {
            return Err(invalid(
                path,
                "give a PEFT adapter directory (adapter_config.json + adapter_model.safetensors), not a file",
            ));
        }
        let cfg = path.with_file_name("adapter_config.json");
        (path.to_path_buf(), cfg.is_file().then_some(cfg))
    } else if path.exists() {
        return Err(invalid(
            path,
            "give a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) or a .safetensors file",
        ));
    } else {
        return Err(invalid(path, "no such file or directory"));
    };

    let scale_for = match &config_path {
        Some(p) => read_config(p)?,
        None => ScaleRule {
            alpha: None,
            rslora: false,
        },
    };
    let st = SafetensorsDir::open_file(&weights)?;
    let mut names: Vec<&str> = st.names().collect();
    names.sort_unstable();
    let mut pairs = Vec::new();
    let mut bytes = 0usize;
    for &name in &names {
        let Some((layer, target)) = parse_name(name, "lora_A") else {
            if name.contains("lora_B") && parse_name(name, "lora_B").is_some() {
                continue; // checked with its A
            }
            return Err(invalid(&weights, unsupported_tensor(name)));
        };
        let b = name.replacen("lora_A", "lora_B", 1);
        if !st.contains(&b) {
            return Err(invalid(&weights, format!("{name} has no matching {b}")));
        }
        if layer >= c.num_layers {
            return Err(invalid(
                &weights,
                format!(
                    "{name}: layer {layer}, but the base model has {} layers",
                    c.num_layers
                ),
            ));
        }
        if matches!(target, Target::Gate | Target::Up | Target::Down)
            && c.moe.as_ref().is_some_and(|m| m.is_sparse(layer))
        {
            return Err(invalid(&weights, experts_refused(name)));
        }
        let (out, inp) = target.dims(c);
        let sa = st.shape(name).unwrap_or_default();
        let sb = st.shape(&b).unwrap_or_default();
        let rank = sa.first().copied().unwrap_or(0);
        if sa.len() != 2 || sa[1] != inp || rank == 0 {
            return Err(invalid(
                &weights,
                format!(
                    "{name} has shape {sa:?}; the base model's {} takes [rank, {inp}]",
                    target.module()
                ),
            ));
        }
        if sb != [out, rank] {
            return Err(invalid(
                &weights,
                format!(
                    "{b} has shape {sb:?}; expected [{out}, {rank}] for the base model's {}",
                    target.module()
                ),
            ));
        }
        if rank > limits.max_rank {
            return Err(invalid(
                &weights,
                format!(
                    "{name} has rank {rank}, above the limit of {} (option.max_lora_rank)",
                    limits.max_rank
                ),
            ));
        }
        bytes += 4 * rank * (inp + out);
        pairs.push(PairInfo {
            layer,
            target,
            a: name.to_string(),
            b,
            rank,
        });
    }
    // Every B must have its A (a lone B would be silently unused).
    for &name in &names {
        if let Some((..)) = parse_name(name, "lora_B") {
            let a = name.replacen("lora_B", "lora_A", 1);
            if !st.contains(&a) {
                return Err(invalid(&weights, format!("{name} has no matching {a}")));
            }
        }
    }
    if pairs.is_empty() {
        return Err(invalid(
            &weights,
            "no LoRA tensors (…layers.N.<module>.lora_A/lora_B.weight) for this model's projections",
        ));
    }
    let rank = pairs.iter().map(|p| p.rank).max().unwrap_or(0);
    Ok(AdapterInfo {
        weights,
        pairs,
        rank,
        scale_for,
        bytes,
    })
}

/// `(layer, target)` of a tensor named `…layers.<N>.<module>.<ab>.weight`.
fn parse_name(name: &str, ab: &str) -> Option<(usize, Target)> {
    let rest = name.strip_suffix(&format!(".{ab}.weight"))?;
    let at = rest.rfind("layers.")?;
    if at > 0 && !rest[..at].ends_with('.') {
        return None;
    }
    let (layer, module) = rest[at + "layers.".len()..].split_once('.')?;
    let layer = layer.parse().ok()?;
    let target = Target::ALL.into_iter().find(|t| t.module() == module)?;
    Some((layer, target))
}

fn unsupported_tensor(name: &str) -> String {
    if name.contains("lora_magnitude_vector") {
        format!("{name}: DoRA adapters are not supported")
    } else if name.contains("lora_embedding")
        || name.contains("embed_tokens")
        || name.contains("lm_head")
    {
        format!(
            "{name}: LoRA on the embeddings or the LM head is not supported (only the attention and MLP projections)"
        )
    } else if name.contains(".experts.") || name.contains("block_sparse_moe") {
        experts_refused(name)
    } else if name.ends_with(".bias") {
        format!("{name}: LoRA biases (PEFT bias=\"all\"/\"lora_only\") are not supported")
    } else {
        format!(
            "{name}: not a LoRA tensor of a supported projection (q/k/v/o_proj, gate/up/down_proj)"
        )
    }
}

fn experts_refused(name: &str) -> String {
    format!(
        "{name}: LoRA on a mixture-of-experts MLP (its experts or router) is not supported; \
         adapters on these models may change the attention projections (q/k/v/o_proj)"
    )
}

/// The scale rule of an `adapter_config.json`, refusing the PEFT features this engine does
/// not implement.
fn read_config(path: &Path) -> Result<ScaleRule> {
    let text = std::fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
    let cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(path, e.to_string()))?;
    let refuse = |what: &str| Err(invalid(path, format!("{what} is not supported")));
    let truthy = |k: &str| cfg.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
    let non_empty = |k: &str| match cfg.get(k) {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        Some(serde_json::Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    };
    if let Some(t) = cfg.get("peft_type").and_then(|v| v.as_str())
        && t != "LORA"
    {
        return refuse(&format!("peft_type {t:?} (only LORA)"));
    }
    if truthy("use_dora") {
        return refuse("use_dora (DoRA)");
    }
    if non_empty("modules_to_save") {
        return refuse("modules_to_save (fully trained modules beside the LoRA)");
    }
    if non_empty("rank_pattern") || non_empty("alpha_pattern") {
        return refuse("rank_pattern / alpha_pattern (per-module ranks)");
    }
    if truthy("fan_in_fan_out") {
        return refuse("fan_in_fan_out (Conv1D-style weights)");
    }
    if let Some(b) = cfg.get("bias").and_then(|v| v.as_str())
        && b != "none"
    {
        return refuse(&format!("bias {b:?} (LoRA biases)"));
    }
    if let Some(targets) = cfg.get("target_modules").and_then(|v| v.as_array()) {
        for t in targets.iter().filter_map(|t| t.as_str()) {
            let short = t.rsplit('.').next().unwrap_or(t);
            if !Target::ALL.iter().any(|x| x.module().ends_with(short)) {
                return refuse(&format!(
                    "target module {t:?} (only q/k/v/o_proj and gate/up/down_proj)"
                ));
            }
        }
    }
    Ok(ScaleRule {
        alpha: cfg.get("lora_alpha").and_then(|v| v.as_f64()),
        rslora: truthy("use_rslora"),
    })
}

/// An adapter's weights on the host (the host tier of the adapter cache): each pair's A
/// `[rank, in]` and scaled B `[out, rank]`, f32.
#[derive(Debug, Clone)]
pub struct LoraWeights {
    pub rank: usize,
    /// `[layer][target]`.
    pub layers: Vec<[Option<(HostTensor, HostTensor)>; 7]>,
    /// Bytes held.
    pub bytes: usize,
}

impl LoraWeights {
    /// Inspects and reads the adapter at `path` for the base model `c`.
    pub fn load(path: &Path, c: &ModelConfig, limits: LoraLimits) -> Result<Self> {
        Self::read(&inspect(path, c, limits)?, c)
    }

    /// Reads the weights of an adapter [`inspect`] accepted.
    pub fn read(info: &AdapterInfo, c: &ModelConfig) -> Result<Self> {
        let st = SafetensorsDir::open_file(&info.weights)?;
        let mut layers: Vec<[Option<(HostTensor, HostTensor)>; 7]> =
            (0..c.num_layers).map(|_| Default::default()).collect();
        for p in &info.pairs {
            let (out, inp) = p.target.dims(c);
            let a = st.load(&p.a, &[p.rank, inp], DType::F32)?;
            let scale = info.scale_for.scale(p.rank);
            let b = st.load(&p.b, &[out, p.rank], DType::F32)?;
            let b = HostTensor::f32(
                vec![out, p.rank],
                b.to_f32_vec().into_iter().map(|x| x * scale).collect(),
            );
            layers[p.layer][p.target as usize] = Some((a, b));
        }
        Ok(LoraWeights {
            rank: info.rank,
            layers,
            bytes: info.bytes,
        })
    }
}
