//! Tiny random models for tests (here and in the scheduler and server crates).

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::config::Architecture;
use crate::error::{CheckpointError, Result};

/// Byte-level vocabulary of the tiny tokenizer: 256 byte symbols, then the specials.
pub const TINY_VOCAB: usize = 260;
pub const TINY_BOS: u32 = 256;
pub const TINY_EOS: u32 = 258;
const TINY_SPECIALS: [&str; 4] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"];

/// Shape of a generated model.
#[derive(Debug, Clone)]
pub struct TinySpec {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    /// Qwen3 uses an explicit head_dim different from hidden/heads.
    pub head_dim: Option<usize>,
    pub tie_word_embeddings: bool,
    pub rope_scaling_llama3: bool,
    pub seed: u64,
}

impl TinySpec {
    pub fn llama() -> Self {
        TinySpec {
            architecture: Architecture::Llama,
            vocab_size: TINY_VOCAB,
            hidden_size: 64,
            intermediate_size: 96,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: None,
            tie_word_embeddings: false,
            rope_scaling_llama3: true,
            seed: 1,
        }
    }

    pub fn qwen2() -> Self {
        TinySpec {
            architecture: Architecture::Qwen2,
            tie_word_embeddings: true,
            rope_scaling_llama3: false,
            seed: 2,
            ..Self::llama()
        }
    }

    pub fn qwen3() -> Self {
        TinySpec {
            architecture: Architecture::Qwen3,
            head_dim: Some(24),
            num_heads: 4,
            num_kv_heads: 1,
            rope_scaling_llama3: false,
            seed: 3,
            ..Self::llama()
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_heads)
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        // SplitMix64: deterministic across platforms.
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn tensor(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale + offset).collect()
    }
}

/// Writes f32 tensors `(name, shape, values)` as one safetensors file.
pub fn write_f32_safetensors(
    path: &Path,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
) -> Result<()> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: HashMap<String, TensorView<'_>> = bytes
        .iter()
        .map(|(n, s, b)| {
            let v = TensorView::new(Dtype::F32, s.clone(), b).map_err(|e| {
                CheckpointError::Safetensors {
                    path: path.to_path_buf(),
                    msg: e.to_string(),
                }
            })?;
            Ok((n.clone(), v))
        })
        .collect::<Result<_>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| CheckpointError::Safetensors {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// A PEFT LoRA adapter a test writes: `targets` (PEFT module names, e.g. `self_attn.q_proj`)
/// of every layer of a model of config `c`, rank `rank`, `lora_alpha` `alpha`, seeded values.
#[derive(Debug, Clone)]
pub struct PeftSpec {
    pub targets: Vec<&'static str>,
    pub rank: usize,
    pub alpha: f32,
    pub seed: u64,
    /// Magnitude of A and B entries.
    pub scale: f32,
}

impl PeftSpec {
    pub fn new(rank: usize, seed: u64) -> Self {
        PeftSpec {
            targets: vec!["self_attn.q_proj", "self_attn.v_proj"],
            rank,
            alpha: 2.0 * rank as f32,
            seed,
            scale: 0.1,
        }
    }
}

/// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` (f32).
pub fn write_peft_adapter(dir: &Path, c: &crate::ModelConfig, spec: &PeftSpec) -> Result<()> {
    use crate::peft::Target;
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let mut rng = Rng(spec.seed.wrapping_add(0x5EED));
    let mut tensors = Vec::new();
    for l in 0..c.num_layers {
        for &m in &spec.targets {
            let t = Target::ALL
                .into_iter()
                .find(|t| t.module() == m)
                .ok_or_else(|| CheckpointError::Adapter {
                    path: dir.to_path_buf(),
                    msg: format!("unknown LoRA target {m}"),
                })?;
            let (out, inp) = t.dims(c);
            let p = format!("base_model.model.model.layers.{l}.{m}");
            let r = spec.rank;
            tensors.push((
                format!("{p}.lora_A.weight"),
                vec![r, inp],
                rng.tensor(r * inp, spec.scale, 0.0),
            ));
            tensors.push((
                format!("{p}.lora_B.weight"),
                vec![out, r],
                rng.tensor(out * r, spec.scale, 0.0),
            ));
        }
    }
    write_f32_safetensors(&dir.join("adapter_model.safetensors"), tensors)?;
    let modules: Vec<&str> = spec
        .targets
        .iter()
        .map(|m| m.rsplit('.').next().unwrap_or(m))
        .collect();
    let config = serde_json::json!({
        "peft_type": "LORA",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    });
    let path = dir.join("adapter_config.json");
    std::fs::write(&path, config.to_string()).map_err(|e| CheckpointError::io(&path, e))
}

/// Copies the model at `base` to `out` with an adapter's deltas merged into its weights
/// (`W + B·A`, scale already folded into B): the reference a LoRA run must match.
pub fn write_merged_model(
    base: &Path,
    adapter: &crate::peft::LoraWeights,
    out: &Path,
) -> Result<()> {
    use crate::peft::Target;
    std::fs::create_dir_all(out).map_err(|e| CheckpointError::io(out, e))?;
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        let src = base.join(f);
        if src.is_file() {
            std::fs::copy(&src, out.join(f)).map_err(|e| CheckpointError::io(&src, e))?;
        }
    }
    let st = crate::weights::SafetensorsDir::open(base)?;
    let mut names: Vec<String> = st.names().map(str::to_string).collect();
    names.sort();
    let mut tensors = Vec::new();
    for name in names {
        let shape = st.shape(&name).unwrap_or_default();
        let mut v = st.load(&name, &shape, crate::DType::F32)?.to_f32_vec();
        for (l, row) in adapter.layers.iter().enumerate() {
            for t in Target::ALL {
                let Some((a, b)) = &row[t as usize] else {
                    continue;
                };
                if name != format!("model.layers.{l}.{}.weight", t.module()) {
                    continue;
                }
                let (out_dim, r, inp) = (b.shape[0], a.shape[0], a.shape[1]);
                let (a, b) = (a.to_f32_vec(), b.to_f32_vec());
                for o in 0..out_dim {
                    for k in 0..inp {
                        let d: f32 = (0..r).map(|j| b[o * r + j] * a[j * inp + k]).sum();
                        v[o * inp + k] += d;
                    }
                }
            }
        }
        tensors.push((name, shape, v));
    }
    write_f32_safetensors(&out.join("model.safetensors"), tensors)
}

/// Writes a complete random model directory: config.json, model.safetensors (f32) and the
/// tiny byte-level tokenizer.
pub fn write_tiny_model(dir: &Path, spec: &TinySpec) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    let h = spec.hidden_size;
    let d = spec.head_dim();
    let (q, kv) = (spec.num_heads * d, spec.num_kv_heads * d);
    let mut rng = Rng(spec.seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32, rng: &mut Rng| {
        let n = shape.iter().product();
        tensors.push((name, shape, rng.tensor(n, scale, offset)));
    };
    add(
        "model.embed_tokens.weight".into(),
        vec![spec.vocab_size, h],
        1.0,
        0.0,
        &mut rng,
    );
    if !spec.tie_word_embeddings {
        add(
            "lm_head.weight".into(),
            vec![spec.vocab_size, h],
            0.2,
            0.0,
            &mut rng,
        );
    }
    add("model.norm.weight".into(), vec![h], 0.1, 1.0, &mut rng);
    let ws = 1.0 / (h as f32).sqrt();
    for i in 0..spec.num_layers {
        let p = format!("model.layers.{i}");
        add(
            format!("{p}.input_layernorm.weight"),
            vec![h],
            0.1,
            1.0,
            &mut rng,
        );
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![h],
            0.1,
            1.0,
            &mut rng,
        );
        for (n, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            add(
                format!("{p}.self_attn.{n}.weight"),
                vec![rows, h],
                ws,
                0.0,
                &mut rng,
            );
            if spec.architecture.has_qkv_bias() {
                add(
                    format!("{p}.self_attn.{n}.bias"),
                    vec![rows],
                    0.1,
                    0.0,
                    &mut rng,
                );
            }
        }
        if spec.architecture.has_qk_norm() {
            add(
                format!("{p}.self_attn.q_norm.weight"),
                vec![d],
                0.1,
                1.0,
                &mut rng,
            );
            add(
                format!("{p}.self_attn.k_norm.weight"),
                vec![d],
                0.1,
                1.0,
                &mut rng,
            );
        }
        add(
            format!("{p}.self_attn.o_proj.weight"),
            vec![h, q],
            ws,
            0.0,
            &mut rng,
        );
        let wi = 1.0 / (spec.intermediate_size as f32).sqrt();
        add(
            format!("{p}.mlp.gate_proj.weight"),
            vec![spec.intermediate_size, h],
            ws,
            0.0,
            &mut rng,
        );
        add(
            format!("{p}.mlp.up_proj.weight"),
            vec![spec.intermediate_size, h],
            ws,
            0.0,
            &mut rng,
        );
        add(
            format!("{p}.mlp.down_proj.weight"),
            vec![h, spec.intermediate_size],
            wi,
            0.0,
            &mut rng,
        );
    }
    write_f32_safetensors(&dir.join("model.safetensors"), tensors)?;
    let mut config = serde_json::json!({
        "architectures": [spec.architecture.hf_name()],
        "vocab_size": spec.vocab_size,
        "hidden_size": h,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": d,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": "float32",
        "bos_token_id": TINY_BOS,
        "eos_token_id": TINY_EOS,
    });
    if spec.rope_scaling_llama3 {
        config["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64
        });
    }
    let cpath = dir.join("config.json");
    std::fs::write(
        &cpath,
        serde_json::to_string_pretty(&config).unwrap_or_default(),
    )
    .map_err(|e| CheckpointError::io(&cpath, e))?;
    write_tiny_tokenizer(dir)
}

/// GPT-2's byte → printable-char map used by byte-level BPE vocabularies.
fn byte_level_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut by_byte = vec!['\0'; 256];
    for (b, c) in printable.iter().zip(chars) {
        by_byte[*b as usize] = char::from_u32(c).unwrap_or('?');
    }
    by_byte
}

/// Writes a byte-level tokenizer for the tiny models (id = byte value, no merges; specials
/// `<|endoftext|>` 256, `<|im_start|>` 257, `<|im_end|>` 258 = EOS, `<|pad|>` 259), plus
/// tokenizer_config.json with a ChatML template and generation_config.json.
pub fn write_tiny_tokenizer(dir: &Path) -> Result<()> {
    let chars = byte_level_chars();
    let mut vocab = serde_json::Map::new();
    for (b, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), serde_json::json!(b));
    }
    let added: Vec<serde_json::Value> = TINY_SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    for (i, t) in TINY_SPECIALS.iter().enumerate() {
        vocab.insert(t.to_string(), serde_json::json!(256 + i));
    }
    let tok = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    });
    let template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let files = [
        ("tokenizer.json", tok),
        (
            "tokenizer_config.json",
            serde_json::json!({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                "add_bos_token": false, "chat_template": template}),
        ),
        (
            "generation_config.json",
            serde_json::json!({"bos_token_id": TINY_BOS, "eos_token_id": TINY_EOS}),
        ),
    ];
    for (name, v) in files {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_string(&v).unwrap_or_default())
            .map_err(|e| CheckpointError::io(&p, e))?;
    }
    Ok(())
}

/// [`write_tiny_tokenizer`] for a model of `vocab` ids: the ids after the byte-level ones and
/// the specials are named `<|tN|>` (ordinary added tokens), so every id the model can draw
/// decodes.
pub fn write_tiny_tokenizer_for(dir: &Path, vocab: u32) -> Result<()> {
    write_tiny_tokenizer(dir)?;
    let path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))?;
    let mut t: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let first = 256 + TINY_SPECIALS.len() as u32;
    for id in first..vocab {
        let content = format!("<|t{id}|>");
        t["model"]["vocab"][&content] = id.into();
        if let Some(added) = t["added_tokens"].as_array_mut() {
            added.push(
                serde_json::json!({"id": id, "content": content, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": false}),
            );
        }
    }
    std::fs::write(&path, t.to_string()).map_err(|e| CheckpointError::io(&path, e))
}

/// Writes the llama-architecture model in `hf_dir` (from [`write_tiny_model`]) as a GGUF
/// whose matrices are all `qtype`, laid out as llama.cpp's converter does (GGUF names, Q/K
/// rows interleaved per head), with the hyper-parameters the engine reads (no tokenizer: the
/// directory keeps that).
pub fn write_tiny_gguf(
    hf_dir: &Path,
    spec: &TinySpec,
    path: &Path,
    qtype: crate::quant::QType,
) -> Result<()> {
    use crate::dtype::DType;
    use crate::gguf::writer::{TensorOut, write};
    use crate::gguf::{GgmlType, GgufValue};
    use crate::quant::QMatrix;
    use crate::weights::SafetensorsDir;

    assert_eq!(spec.architecture, Architecture::Llama, "llama only");
    let st = SafetensorsDir::open(hf_dir)?;
    let h = spec.hidden_size;
    let d = spec.head_dim();
    let mut tensors = Vec::new();
    let mut add = |gguf: String, hf: String, shape: Vec<usize>, heads: Option<usize>| {
        let x = st.load(&hf, &shape, DType::F32)?.to_f32_vec();
        let (rows, cols) = (shape[0], shape.get(1).copied().unwrap_or(1));
        let x = match heads {
            // llama.cpp's permute: gguf[h·D + 2j + a] = hf[h·D + a·D/2 + j].
            Some(n) => {
                let dd = rows / n;
                let mut out = vec![0f32; x.len()];
                for hh in 0..n {
                    for j in 0..dd / 2 {
                        for a in 0..2 {
                            let (g, f) = (hh * dd + 2 * j + a, hh * dd + a * dd / 2 + j);
                            out[g * cols..(g + 1) * cols]
                                .copy_from_slice(&x[f * cols..(f + 1) * cols]);
                        }
                    }
                }
                out
            }
            None => x,
        };
        let (ggml_type, data) = if shape.len() == 2 {
            let m = QMatrix::quantize(qtype, rows, cols, &x).map_err(CheckpointError::Gguf)?;
            (qtype.ggml().expect("a GGUF block type"), m.data)
        } else {
            (
                GgmlType::F32,
                x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        };
        tensors.push(TensorOut {
            name: gguf,
            dims: shape.iter().rev().map(|&v| v as u64).collect(),
            ggml_type,
            data,
        });
        Ok::<(), CheckpointError>(())
    };
    add(
        "token_embd.weight".into(),
        "model.embed_tokens.weight".into(),
        vec![spec.vocab_size, h],
        None,
    )?;
    if !spec.tie_word_embeddings {
        add(
            "output.weight".into(),
            "lm_head.weight".into(),
            vec![spec.vocab_size, h],
            None,
        )?;
    }
    add(
        "output_norm.weight".into(),
        "model.norm.weight".into(),
        vec![h],
        None,
    )?;
    let (q, kv, inter) = (
        spec.num_heads * d,
        spec.num_kv_heads * d,
        spec.intermediate_size,
    );
    for i in 0..spec.num_layers {
        let (g, p) = (format!("blk.{i}"), format!("model.layers.{i}"));
        let pairs = [
            ("attn_norm", "input_layernorm", vec![h], None),
            ("ffn_norm", "post_attention_layernorm", vec![h], None),
            (
                "attn_q",
                "self_attn.q_proj",
                vec![q, h],
                Some(spec.num_heads),
            ),
            (
                "attn_k",
                "self_attn.k_proj",
                vec![kv, h],
                Some(spec.num_kv_heads),
            ),
            ("attn_v", "self_attn.v_proj", vec![kv, h], None),
            ("attn_output", "self_attn.o_proj", vec![h, q], None),
            ("ffn_gate", "mlp.gate_proj", vec![inter, h], None),
            ("ffn_up", "mlp.up_proj", vec![inter, h], None),
            ("ffn_down", "mlp.down_proj", vec![h, inter], None),
        ];
        for (gn, hn, shape, heads) in pairs {
            add(
                format!("{g}.{gn}.weight"),
                format!("{p}.{hn}.weight"),
                shape,
                heads,
            )?;
        }
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(hf_dir.join("config.json"))
            .map_err(|e| CheckpointError::io(hf_dir, e))?,
    )
    .map_err(|e| CheckpointError::Gguf(e.to_string()))?;
    let num = |k: &str| config[k].as_f64().unwrap_or(0.0);
    let u = |v: usize| GgufValue::U32(v as u32);
    let meta = vec![
        (
            "general.architecture".to_string(),
            GgufValue::String("llama".into()),
        ),
        ("llama.embedding_length".into(), u(h)),
        ("llama.feed_forward_length".into(), u(inter)),
        ("llama.block_count".into(), u(spec.num_layers)),
        ("llama.attention.head_count".into(), u(spec.num_heads)),
        ("llama.attention.head_count_kv".into(), u(spec.num_kv_heads)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            GgufValue::F32(num("rms_norm_eps") as f32),
        ),
        (
            "llama.rope.freq_base".into(),
            GgufValue::F32(num("rope_theta") as f32),
        ),
        (
            "llama.context_length".into(),
            u(num("max_position_embeddings") as usize),
        ),
    ];
    write(path, &meta, &tensors)
}

/// Deterministic inputs for tests and benches: a 64-bit LCG, uniform in [-0.5, 0.5).
pub fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

/// The greedy pick of a logits row: the largest logit, the lowest id on ties (the engine's
/// rule), for tests that decode outside the sampler.
pub fn argmax(row: &[f32]) -> u32 {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0 as u32
}
