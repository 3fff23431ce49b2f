use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::weights::{GgufWeights, HostData, HostTensor, SafetensorsDir, WeightSource};

use super::linear_attn::LinearAttn;
use super::mla::LatentAttn;
use super::{Attention, Layer, Mixer, Mlp, Model};
use crate::backend::{Backend, Feature};
use crate::error::{EngineError, Result};
use crate::moe::{Expert, MoeConfig, MoeLayer, SharedExpert};
use crate::pooler::{HeadWeights, HostHead};
use crate::vision::VisionTower;

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// dtype of matrices in memory; None keeps the checkpoint's: a GGUF's block formats as
    /// they are, else `torch_dtype` (f16 → f32).
    pub dtype: Option<DType>,
    /// Read the weights from this GGUF file (the directory still gives config.json).
    pub gguf: Option<PathBuf>,
    /// Keep a vision tower on the host (`EngineOptions::vision_on_host`).
    pub vision_on_host: bool,
    /// An embedding or scoring model's pooler: its host head is read with the weights.
    pub pooler: Option<lmi_checkpoint::pooling::PoolerInfo>,
}

impl<B: Backend> Model<B> {
    /// Loads an HF model directory (config.json + safetensors).
    pub fn load(backend: &B, dir: &Path, opts: &LoadOptions) -> Result<Self> {
        let mut config = ModelConfig::from_file(&dir.join("config.json"))?;
        if let Some(e) = &config.encoder {
            return Err(EngineError::Backend(format!(
                "{} is an encoder: it loads through lmi_engine::open (the encoder engine), not \
                 as a decoder",
                e.hf_name
            )));
        }
        if opts.gguf.is_some() && config.architecture.is_hybrid() && config.vision.is_some() {
            // A Qwen3.5 GGUF holds the language model only (llama.cpp keeps the tower in an
            // mmproj file): it is served as text, as it was before lmi read the tower.
            tracing::warn!("the GGUF holds no vision tower: serving the language model only");
            config.vision = None;
        }
        if let Some(&f) = Feature::needed_by(&config)
            .iter()
            .find(|&&f| !backend.supports(f))
        {
            return Err(crate::backend::refused(backend.name(), f));
        }
        let (st, dtype) = open_weights(dir, &config, opts)?;
        let head = match &opts.pooler {
            Some(info) => Some(HostHead::load(
                info,
                HeadWeights::Decoder {
                    st: &st,
                    head: &lm_head_name(&st, &config),
                    vocab: config.vocab_size,
                    hidden: config.hidden_size,
                },
            )?),
            None => None,
        };
        let mut model = Self::from_tensors(backend, config, &st, dtype)?;
        model.head = head;
        if let Some(t) = model.vision.as_ref().filter(|_| !opts.vision_on_host) {
            model.vision_device = backend.upload_vision(t)?;
        }
        Ok(model)
    }

    fn from_tensors(
        backend: &B,
        config: ModelConfig,
        st: &WeightSource,
        dtype: DType,
    ) -> Result<Self> {
        if config.gemma4.is_some() {
            return Self::load_gemma4(backend, config, st, dtype);
        }
        let c = &config;
        let h = c.hidden_size;
        let formats = std::cell::RefCell::new(BTreeSet::new());
        let mat = |name: &str, shape: &[usize]| -> Result<HostTensor> {
            let t = st.load(name, shape, dtype)?;
            note_format(&mut formats.borrow_mut(), &t);
            Ok(t)
        };
        let gemma = c.architecture.is_gemma();
        let add_one = c.architecture.norms_add_one();
        // Gemma's and Qwen3.5's RMSNorms multiply by 1 + w: HF checkpoints hold w, llama.cpp's
        // GGUF files 1 + w (its converter adds the 1). Held as 1 + w, in f32 as HF computes it.
        let norm = |name: &str, len: usize| -> Result<B::Weight> {
            let mut t = st.load(name, &[len], DType::F32)?;
            if add_one
                && !matches!(st, WeightSource::Gguf(_))
                && let HostData::F32(v) = &mut t.data
            {
                v.iter_mut().for_each(|x| *x += 1.0);
            }
            backend.upload_weight(t)
        };
        let lm = text_prefix(st);
        let embed_t = mat(&format!("{lm}embed_tokens.weight"), &[c.vocab_size, h])?;
        let lm_head = if st.contains("lm_head.weight") && !c.tie_word_embeddings {
            Some(backend.upload_weight(mat("lm_head.weight", &[c.vocab_size, h])?)?)
        } else {
            None
        };
        let embed = backend.upload_weight(embed_t)?;
        super::sigmoe::note_skipped_mtp(c, st, lm);
        let mut layers = Vec::with_capacity(c.num_layers);
        let (mut kv_layers, mut state_layers) = (0, 0);
        for i in 0..c.num_layers {
            let linear = c.linear_attn.as_ref().is_some_and(|l| l.layers[i]);
            let pools = (kv_layers, state_layers);
            if linear {
                state_layers += 1;
            } else {
                kv_layers += 1;
            }
            let p = format!("{lm}layers.{i}");
            layers.push(load_layer(
                backend, c, st, &p, i, pools, &mat, &norm, dtype,
            )?);
        }
        let final_norm = norm(&format!("{lm}norm.weight"), h)?;
        let rope = match c.mrope_components() {
            Some(components) => backend.mrope_table(&c.rope_inv_freq(), &components)?,
            None => backend.rope_table(&c.rope_inv_freq())?,
        };
        let rope_local = match c.rope_inv_freq_local() {
            Some(f) => Some(backend.rope_table(&f)?),
            None => None,
        };
        let rope_none = match c.no_rope.iter().any(|&x| x) {
            true => Some(backend.rope_table(&vec![0.0; c.rotary_dim / 2])?),
            false => None,
        };
        let vision = match (&c.vision, st) {
            (None, _) => None,
            (Some(v), WeightSource::Safetensors(_)) => Some(VisionTower::load(v, st)?),
            (Some(_), WeightSource::Gguf(_)) => {
                return Err(EngineError::Backend(
                    "a vision-language model's vision tower is not in its GGUF file (llama.cpp \
                     keeps it in a separate mmproj file, which lmi does not read): serve the \
                     HF directory"
                        .into(),
                ));
            }
        };
        let (weights, dtype) = held(formats.into_inner(), dtype);
        Ok(Model {
            config,
            dtype,
            weights,
            embed,
            lm_head,
            final_norm,
            layers,
            rope,
            rope_local,
            rope_none,
            // HF multiplies by the scale rounded to the weights' dtype; f32 here (the
            // activations are f32 whatever the weights).
            embed_scale: gemma.then(|| (h as f32).sqrt()),
            vision,
            vision_device: None,
            head: None,
            gemma4: None,
            mtp_front: None,
        })
    }
}

/// The checkpoint's weights and the dtype its matrices are held in: a GGUF's blocks as stored
/// (float matrices in bf16) unless `opts.dtype` asks otherwise; safetensors in `opts.dtype`,
/// else `torch_dtype` (bf16) or f32. f16 is computed in f32 on the CPU.
pub(super) fn open_weights(
    dir: &Path,
    config: &ModelConfig,
    opts: &LoadOptions,
) -> Result<(WeightSource, DType)> {
    let (st, dtype) = match (&opts.gguf, opts.dtype) {
        (Some(path), None) => (
            WeightSource::Gguf(GgufWeights::open(path, true)?),
            DType::BF16,
        ),
        (Some(path), Some(d)) => (WeightSource::Gguf(GgufWeights::open(path, false)?), d),
        (None, d) => {
            let d = match d {
                Some(d) => d,
                None if config.torch_dtype.as_deref() == Some("bfloat16") => DType::BF16,
                None => DType::F32,
            };
            (WeightSource::Safetensors(SafetensorsDir::open(dir)?), d)
        }
    };
    let dtype = if dtype == DType::F16 {
        DType::F32
    } else {
        dtype
    };
    Ok((st, dtype))
}

/// Where the text model's tensors sit. Newer transformers save a vision-language model's
/// text weights under `model.language_model.`; the published checkpoints under `model.`, or
/// (Gemma 3's) `language_model.model.`; an embedding model saved from the base model
/// (Qwen3-Embedding) with no prefix.
pub(super) fn text_prefix(st: &WeightSource) -> &'static str {
    [
        "model.",
        "model.language_model.",
        "language_model.model.",
        "",
    ]
    .into_iter()
    .find(|p| st.contains(&format!("{p}embed_tokens.weight")))
    .unwrap_or("model.")
}

/// The tensor the LM head multiplies by: `lm_head.weight`, or the tied embedding.
fn lm_head_name(st: &WeightSource, c: &ModelConfig) -> String {
    match st.contains("lm_head.weight") && !c.tie_word_embeddings {
        true => "lm_head.weight".into(),
        false => format!("{}embed_tokens.weight", text_prefix(st)),
    }
}

/// Layer `{p}.self_attn`: q, k and v fused, their biases and norms where the architecture has
/// them, and gated attention's output gate taken out of q's rows (Qwen3.5's `q_proj` holds
/// each head's q and then its gate).
#[allow(clippy::too_many_arguments)]
fn self_attention<B: Backend>(
    backend: &B,
    c: &ModelConfig,
    st: &WeightSource,
    p: &str,
    (layer, kv): (usize, usize),
    mat: &dyn Fn(&str, &[usize]) -> Result<HostTensor>,
    norm: &dyn Fn(&str, usize) -> Result<B::Weight>,
) -> Result<Attention<B>> {
    let h = c.hidden_size;
    let a = format!("{p}.self_attn");
    let sinks = c.architecture.has_sinks();
    let (q, gate) = if c.architecture.attn_output_gate() {
        // Whole rows picked out, so a quantized q_proj (a GGUF's) keeps its blocks.
        let both = mat(&format!("{a}.q_proj.weight"), &[2 * c.q_size(), h])?;
        let d = c.head_dim;
        let (q, g): (Vec<usize>, Vec<usize>) = (0..2 * c.q_size()).partition(|r| r % (2 * d) < d);
        (
            both.select_rows(&q),
            Some(backend.upload_weight(both.select_rows(&g))?),
        )
    } else {
        (mat(&format!("{a}.q_proj.weight"), &[c.q_size(), h])?, None)
    };
    let qkv = HostTensor::concat_rows(vec![
        q,
        mat(&format!("{a}.k_proj.weight"), &[c.kv_size(), h])?,
        mat(&format!("{a}.v_proj.weight"), &[c.kv_size(), h])?,
    ]);
    // GLM-4.5: as the checkpoint holds them (`Architecture::optional_qkv_bias_and_norms`).
    let held =
        |n: &str| c.architecture.optional_qkv_bias_and_norms() && st.contains(&format!("{a}.{n}"));
    let qkv_bias = if c.architecture.has_qkv_bias() || held("q_proj.bias") {
        let b = |n: &str, len| st.load(&format!("{a}.{n}.bias"), &[len], DType::F32);
        Some(backend.upload_weight(HostTensor::concat_rows(vec![
            b("q_proj", c.q_size())?,
            b("k_proj", c.kv_size())?,
            b("v_proj", c.kv_size())?,
        ]))?)
    } else {
        None
    };
    let whole = c.architecture.qk_norm_whole();
    let (q_norm, k_norm) = if whole {
        (
            Some(norm(&format!("{a}.q_norm.weight"), c.q_size())?),
            Some(norm(&format!("{a}.k_norm.weight"), c.kv_size())?),
        )
    } else if c.architecture.has_qk_norm() || held("q_norm.weight") {
        (
            Some(norm(&format!("{a}.q_norm.weight"), c.head_dim)?),
            Some(norm(&format!("{a}.k_norm.weight"), c.head_dim)?),
        )
    } else {
        (None, None)
    };
    let f32_opt = |on: bool, name: &str, len: usize| -> Result<Option<B::Weight>> {
        on.then(|| backend.upload_weight(st.load(&format!("{a}.{name}"), &[len], DType::F32)?))
            .transpose()
    };
    Ok(Attention {
        qkv: backend.upload_weight(qkv)?,
        qkv_bias,
        q_norm,
        k_norm,
        qk_norm_whole: whole,
        no_rope: c.no_rope.get(layer).copied().unwrap_or(false),
        o_proj: backend.upload_weight(mat(&format!("{a}.o_proj.weight"), &[h, c.q_size()])?)?,
        o_bias: f32_opt(sinks, "o_proj.bias", h)?,
        sinks: f32_opt(sinks, "sinks", c.num_heads)?,
        gate,
        kv,
    })
}

/// HF's names of a gated MLP's gate, up and down projections (Llama's, Qwen's, Gemma's).
const QWEN: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// A gated MLP's matrices `{x}.{gate, up, down}.weight`: gate and up fused into one
/// `[2 · width, hidden]` (gate rows first), down `[hidden, width]`.
fn gated_mlp<B: Backend>(
    backend: &B,
    mat: &dyn Fn(&str, &[usize]) -> Result<HostTensor>,
    x: &str,
    [gate, up, down]: [&str; 3],
    h: usize,
    width: usize,
) -> Result<(B::Weight, B::Weight)> {
    let gate_up = HostTensor::concat_rows(vec![
        mat(&format!("{x}.{gate}.weight"), &[width, h])?,
        mat(&format!("{x}.{up}.weight"), &[width, h])?,
    ]);
    Ok((
        backend.upload_weight(gate_up)?,
        backend.upload_weight(mat(&format!("{x}.{down}.weight"), &[h, width])?)?,
    ))
}

/// A sparse layer's router and experts under `{prefix}` (`model.layers.N`), by the names the
/// checkpoint uses: Mixtral's `block_sparse_moe.gate` and `block_sparse_moe.experts.E.{w1,w3,w2}`
/// (gate, up, down), gpt-oss's stacked `mlp.experts.{gate_up_proj,down_proj}` (and biases), else
/// Qwen3-MoE's `mlp.gate` and `mlp.experts.E.{gate,up,down}_proj` (also what a GGUF's experts
/// are read as, whatever the model; a gpt-oss GGUF's router is `mlp.router`, and its experts
/// have `.bias` beside each `.weight`).
fn load_experts<B: Backend>(
    backend: &B,
    c: &ModelConfig,
    moe: &MoeConfig,
    prefix: &str,
    st: &WeightSource,
    mat: &dyn Fn(&str, &[usize]) -> Result<HostTensor>,
    dtype: DType,
) -> Result<MoeLayer<B::Weight>> {
    let (h, width) = (c.hidden_size, moe.expert_intermediate_size);
    let stacked = st.contains(&format!("{prefix}.mlp.experts.gate_up_proj"));
    if c.architecture == lmi_checkpoint::config::Architecture::GptOss
        && (stacked || st.contains(&format!("{prefix}.mlp.experts.gate_up_proj_blocks")))
    {
        return load_stacked_experts(backend, moe, h, width, prefix, st, dtype);
    }
    let (block, [gate, up, down]) =
        if st.contains(&format!("{prefix}.block_sparse_moe.gate.weight")) {
            ("block_sparse_moe", ["w1", "w3", "w2"])
        } else {
            ("mlp", QWEN)
        };
    let m = format!("{prefix}.{block}");
    // A gpt-oss GGUF: the router under gpt-oss's HF name, and biases (`moe.biases`).
    let router_name = if st.contains(&format!("{m}.router.weight")) {
        "router"
    } else {
        "gate"
    };
    let bias = |name: &str, len: usize| -> Result<Vec<f32>> {
        Ok(st.load(name, &[len], DType::F32)?.to_f32_vec())
    };
    let upload_bias = |v: Vec<f32>| backend.upload_weight(HostTensor::f32(vec![v.len()], v));
    // The router stays f32 whatever the load's dtype (llama.cpp's files keep it so too): a
    // rounded router logit can flip a token between two close experts.
    let router = st.load(
        &format!("{m}.{router_name}.weight"),
        &[moe.num_experts, h],
        DType::F32,
    )?;
    let router_bias = match moe.biases {
        true => Some(upload_bias(bias(
            &format!("{m}.{router_name}.bias"),
            moe.num_experts,
        )?)?),
        false => None,
    };
    // transformers 5's fused experts (Qwen3.5-MoE): `experts.gate_up_proj` `[E, 2 · width,
    // hidden]`, gate rows then up rows, and `experts.down_proj` `[E, hidden, width]`, each
    // expert already in the dense MLP's layout.
    let fused = match stacked {
        true => Some((
            mat(
                &format!("{m}.experts.gate_up_proj"),
                &[moe.num_experts, 2 * width, h],
            )?,
            mat(
                &format!("{m}.experts.down_proj"),
                &[moe.num_experts, h, width],
            )?,
        )),
        false => None,
    };
    if let Some((gate_up, down)) = fused {
        let split = |t: HostTensor, rows: usize, cols: usize| -> Vec<HostTensor> {
            let v = t.to_f32_vec();
            v.chunks(rows * cols)
                .map(|x| HostTensor::f32(vec![rows, cols], x.to_vec()).to_dtype(dtype))
                .collect()
        };
        let experts = split(gate_up, 2 * width, h)
            .into_iter()
            .zip(split(down, h, width))
            .map(|(gu, d)| {
                Ok(Expert {
                    gate_up: backend.upload_weight(gu)?,
                    down: backend.upload_weight(d)?,
                    gate_up_bias: None,
                    down_bias: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        return finish_moe(
            backend,
            st,
            moe,
            &m,
            h,
            width,
            mat,
            router,
            router_bias,
            experts,
        );
    }
    let experts = (0..moe.num_experts)
        .map(|e| {
            let x = format!("{m}.experts.{e}");
            let (gate_up_bias, down_bias) = match moe.biases {
                true => {
                    let mut gu = bias(&format!("{x}.{gate}.bias"), width)?;
                    gu.extend(bias(&format!("{x}.{up}.bias"), width)?);
                    let d = bias(&format!("{x}.{down}.bias"), h)?;
                    (Some(upload_bias(gu)?), Some(upload_bias(d)?))
                }
                false => (None, None),
            };
            let (gate_up, down) = gated_mlp(backend, mat, &x, [gate, up, down], h, width)?;
            Ok(Expert {
                gate_up,
                down,
                gate_up_bias,
                down_bias,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    finish_moe(
        backend,
        st,
        moe,
        &m,
        h,
        width,
        mat,
        router,
        router_bias,
        experts,
    )
}

/// A sparse layer from its router and experts, with Qwen2-MoE's shared expert where the model
/// has one: a SwiGLU MLP of its own width, and its gate `[1, hidden]` (f32, as the router);
/// or DeepSeek's ungated `shared_experts` and the router's `e_score_correction_bias`
/// (`{m}.gate.e_score_correction_bias`; MiniMax-M2's `{m}.e_score_correction_bias`).
#[allow(clippy::too_many_arguments)]
fn finish_moe<B: Backend>(
    backend: &B,
    st: &WeightSource,
    moe: &MoeConfig,
    m: &str,
    h: usize,
    width: usize,
    mat: &dyn Fn(&str, &[usize]) -> Result<HostTensor>,
    router: HostTensor,
    router_bias: Option<B::Weight>,
    experts: Vec<Expert<B::Weight>>,
) -> Result<MoeLayer<B::Weight>> {
    let shared = match moe.shared_width {
        Some(sw) if !moe.shared_gated() => {
            let (gate_up, down) =
                gated_mlp(backend, mat, &format!("{m}.shared_experts"), QWEN, h, sw)?;
            Some(SharedExpert {
                gate_up,
                down,
                gate: None,
                width: sw,
            })
        }
        Some(sw) => {
            let (gate_up, down) =
                gated_mlp(backend, mat, &format!("{m}.shared_expert"), QWEN, h, sw)?;
            Some(SharedExpert {
                gate_up,
                down,
                gate: Some(backend.upload_router(st.load(
                    &format!("{m}.shared_expert_gate.weight"),
                    &[1, h],
                    DType::F32,
                )?)?),
                width: sw,
            })
        }
        None => None,
    };
    let correction_bias = match moe.correction_bias() {
        true => {
            let under_gate = format!("{m}.gate.e_score_correction_bias");
            let name = match st.contains(&under_gate) {
                true => under_gate,
                false => format!("{m}.e_score_correction_bias"),
            };
            let b = st.load(&name, &[moe.num_experts], DType::F32)?;
            Some(backend.upload_weight(b)?)
        }
        false => None,
    };
    Ok(MoeLayer {
        router: backend.upload_router(router)?,
        router_bias,
        experts,
        top_k: moe.top_k,
        width,
        routing: moe.routing,
        activation: moe.activation,
        shared,
        correction_bias,
    })
}

/// gpt-oss's experts, stacked: `gate_up_proj` `[E, hidden, 2 · width]` (`x · W` form) with gate
/// and up in alternate columns, `down_proj` `[E, width, hidden]`, or both in MXFP4 as the
/// published checkpoints hold them (`*_blocks` `[E, rows, cols / 32, 16]` and `*_scales`, in
/// `W · x` form: [`stacked_rows`]); their biases, and the router `mlp.router` with its bias.
/// Each expert becomes the dense MLP's layout: gate rows then up rows `[2 · width, hidden]`,
/// down `[hidden, width]` (MXFP4 dequantized exactly, then held in the load's dtype).
fn load_stacked_experts<B: Backend>(
    backend: &B,
    moe: &MoeConfig,
    h: usize,
    width: usize,
    prefix: &str,
    st: &WeightSource,
    dtype: DType,
) -> Result<MoeLayer<B::Weight>> {
    let n = moe.num_experts;
    let m = format!("{prefix}.mlp");
    let f32s = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        Ok(st
            .load(&format!("{m}.{name}"), shape, DType::F32)?
            .to_f32_vec())
    };
    // Both as `[E, rows, cols]` (W · x form): gate_up's rows interleave gate and up.
    let gate_up = stacked_rows(st, &format!("{m}.experts.gate_up_proj"), n, 2 * width, h)?;
    let gate_up_bias = f32s("experts.gate_up_proj_bias", &[n, 2 * width])?;
    let down = stacked_rows(st, &format!("{m}.experts.down_proj"), n, h, width)?;
    let down_bias = f32s("experts.down_proj_bias", &[n, h])?;
    let upload = |shape: Vec<usize>, v: Vec<f32>, d: DType| {
        backend.upload_weight(HostTensor::f32(shape, v).to_dtype(d))
    };
    let experts = (0..n)
        .map(|e| {
            let w = &gate_up[e * h * 2 * width..(e + 1) * h * 2 * width];
            // Row j of gate is row 2j, row j of up row 2j + 1.
            let mut gu = Vec::with_capacity(2 * width * h);
            for first in [0, 1] {
                for j in 0..width {
                    gu.extend_from_slice(&w[(2 * j + first) * h..(2 * j + first + 1) * h]);
                }
            }
            let bias = &gate_up_bias[e * 2 * width..(e + 1) * 2 * width];
            let gub: Vec<f32> = (0..width)
                .map(|j| bias[2 * j])
                .chain((0..width).map(|j| bias[2 * j + 1]))
                .collect();
            let dt = down[e * width * h..(e + 1) * width * h].to_vec();
            Ok(Expert {
                gate_up: upload(vec![2 * width, h], gu, dtype)?,
                down: upload(vec![h, width], dt, dtype)?,
                gate_up_bias: Some(upload(vec![2 * width], gub, DType::F32)?),
                down_bias: Some(upload(
                    vec![h],
                    down_bias[e * h..(e + 1) * h].to_vec(),
                    DType::F32,
                )?),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let router = st.load(&format!("{m}.router.weight"), &[n, h], DType::F32)?;
    Ok(MoeLayer {
        router: backend.upload_router(router)?,
        router_bias: Some(backend.upload_weight(st.load(
            &format!("{m}.router.bias"),
            &[n],
            DType::F32,
        )?)?),
        experts,
        top_k: moe.top_k,
        width,
        routing: moe.routing,
        activation: moe.activation,
        shared: None,
        correction_bias: None,
    })
}

/// An expert stack `name` of gpt-oss as `[experts, rows, cols]` f32 (each expert's matrix in
/// `W · x` form): from MXFP4 `{name}_blocks` / `{name}_scales` (already in that form), else
/// transposed from the dense `{name}` `[experts, cols, rows]`.
fn stacked_rows(
    st: &WeightSource,
    name: &str,
    experts: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>> {
    use lmi_checkpoint::quant::{MXFP4_BLOCK, dequantize_mxfp4};
    let blocks_name = format!("{name}_blocks");
    if st.contains(&blocks_name) {
        if !cols.is_multiple_of(MXFP4_BLOCK) {
            return Err(EngineError::Backend(format!(
                "{name}: {cols} columns are not whole MXFP4 blocks of {MXFP4_BLOCK}"
            )));
        }
        let g = cols / MXFP4_BLOCK;
        let blocks = st.load_u8(&blocks_name, &[experts, rows, g, 16])?;
        let scales = st.load_u8(&format!("{name}_scales"), &[experts, rows, g])?;
        let mut out = vec![0f32; experts * rows * cols];
        dequantize_mxfp4(&blocks, &scales, &mut out);
        return Ok(out);
    }
    let dense = st
        .load(name, &[experts, cols, rows], DType::F32)?
        .to_f32_vec();
    let mut out = vec![0f32; experts * rows * cols];
    for e in 0..experts {
        let (src, dst) = (&dense[e * rows * cols..], &mut out[e * rows * cols..]);
        for c in 0..cols {
            for r in 0..rows {
                dst[r * cols + c] = src[c * rows + r];
            }
        }
    }
    Ok(out)
}

/// Adds the formats a matrix is held in (its block formats, or bf16 / f32) to `formats`, from
/// which a model's `weights` label is made (`q4_k+q6_k`, `bf16`).
pub(super) fn note_format(formats: &mut BTreeSet<&'static str>, t: &HostTensor) {
    match &t.data {
        HostData::Quant(parts) => parts.iter().for_each(|p| {
            formats.insert(p.qtype.name());
        }),
        HostData::BF16(_) => {
            formats.insert("bf16");
        }
        HostData::F32(_) => {
            formats.insert("f32");
        }
    }
}

/// The label of the formats the matrices are held in (`formats` joined by `+`) and the
/// model's dtype: a load with quantized matrices counts as int8 (they compute in f32 beside
/// bf16 K/V and bf16 LoRA adapters) unless it asked for f32.
pub(super) fn held(formats: BTreeSet<&'static str>, dtype: DType) -> (String, DType) {
    let weights = formats.into_iter().collect::<Vec<_>>().join("+");
    let quantized = weights.split('+').any(|f| f != "bf16" && f != "f32");
    let dtype = match quantized && dtype != DType::F32 {
        true => DType::I8,
        false => dtype,
    };
    (weights, dtype)
}

/// Decoder layer `i` from `p` (`{lm}layers.{i}`; a multi-token-prediction layer past the
/// model's takes the same form): its mixer writes K/V pool `kv` or recurrent state `state`
/// (`pools`), as the model counts them.
#[allow(clippy::too_many_arguments)]
pub(super) fn load_layer<B: Backend>(
    backend: &B,
    c: &ModelConfig,
    st: &WeightSource,
    p: &str,
    i: usize,
    (kv, state): (usize, usize),
    mat: &dyn Fn(&str, &[usize]) -> Result<HostTensor>,
    norm: &dyn Fn(&str, usize) -> Result<B::Weight>,
    dtype: DType,
) -> Result<Layer<B>> {
    let h = c.hidden_size;
    let linear = c
        .linear_attn
        .as_ref()
        .is_some_and(|l| l.layers.get(i) == Some(&true));
    let mixer = if linear {
        Mixer::Linear(LinearAttn::load(backend, c, st, p, state, mat, dtype)?)
    } else if c.mla.is_some() {
        Mixer::Latent(LatentAttn::load(backend, c, st, p, kv, mat, norm)?)
    } else {
        Mixer::Attention(self_attention(backend, c, st, p, (i, kv), mat, norm)?)
    };
    let mlp = match c.moe.as_ref().filter(|m| m.is_sparse(i)) {
        Some(moe) => {
            let layer = load_experts(backend, c, moe, p, st, mat, dtype)?;
            let index = backend.index_experts(&layer)?;
            Mlp::Moe(layer, index)
        }
        None => {
            let (gate_up, down) = gated_mlp(
                backend,
                mat,
                &format!("{p}.mlp"),
                QWEN,
                h,
                c.intermediate_size,
            )?;
            Mlp::Dense { gate_up, down }
        }
    };
    let gemma = c.architecture.is_gemma();
    let olmo = c.architecture.is_olmo();
    let sandwich = |n: &str| -> Result<Option<B::Weight>> {
        (gemma || olmo)
            .then(|| norm(&format!("{p}.{n}.weight"), h))
            .transpose()
    };
    let pre_mlp = if gemma {
        "pre_feedforward_layernorm"
    } else {
        "post_attention_layernorm"
    };
    Ok(Layer {
        input_norm: (!olmo)
            .then(|| norm(&format!("{p}.input_layernorm.weight"), h))
            .transpose()?,
        mixer,
        post_norm: (!olmo)
            .then(|| norm(&format!("{p}.{pre_mlp}.weight"), h))
            .transpose()?,
        attn_out_norm: sandwich("post_attention_layernorm")?,
        mlp_out_norm: sandwich("post_feedforward_layernorm")?,
        local: c
            .sliding_window
            .as_ref()
            .is_some_and(|w| w.local.get(i) == Some(&true)),
        mlp,
    })
}
