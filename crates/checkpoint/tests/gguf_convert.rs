//! GGUF → HF conversion against hand-built files: the test writes a tiny GGUF whose HF weights
//! it knows (quantized blocks built directly, Q/K permuted the way llama.cpp's converter does),
//! converts it, and checks the safetensors, config.json and tokenizer.json that come out.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use lmi_checkpoint::config::ModelConfig;
use lmi_checkpoint::dtype::DType;
use lmi_checkpoint::gguf::convert_gguf;
use safetensors::SafeTensors;
use serde_json::Value;

// ---------------------------------------------------------------- a minimal GGUF writer

enum Kv {
    U32(u32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(&'static str),
    Strs(Vec<String>),
    I32s(Vec<i32>),
    F32s(Vec<f32>),
}

struct GgufTensor {
    name: String,
    /// GGUF order: dims[0] is the row length.
    dims: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

fn write_gguf(path: &Path, kvs: &[(String, Kv)], tensors: &[GgufTensor]) {
    const ALIGN: usize = 32;
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (key, v) in kvs {
        put_str(&mut b, key);
        match v {
            Kv::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Kv::U64(x) => {
                b.extend(10u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Kv::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Kv::Bool(x) => {
                b.extend(7u32.to_le_bytes());
                b.push(u8::from(*x));
            }
            Kv::Str(s) => {
                b.extend(8u32.to_le_bytes());
                put_str(&mut b, s);
            }
            Kv::Strs(a) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((a.len() as u64).to_le_bytes());
                a.iter().for_each(|s| put_str(&mut b, s));
            }
            Kv::I32s(a) => {
                b.extend(9u32.to_le_bytes());
                b.extend(5u32.to_le_bytes());
                b.extend((a.len() as u64).to_le_bytes());
                a.iter().for_each(|x| b.extend(x.to_le_bytes()));
            }
            Kv::F32s(a) => {
                b.extend(9u32.to_le_bytes());
                b.extend(6u32.to_le_bytes());
                b.extend((a.len() as u64).to_le_bytes());
                a.iter().for_each(|x| b.extend(x.to_le_bytes()));
            }
        }
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut b, &t.name);
        b.extend((t.dims.len() as u32).to_le_bytes());
        t.dims.iter().for_each(|d| b.extend(d.to_le_bytes()));
        b.extend(t.ggml_type.to_le_bytes());
        b.extend((offset as u64).to_le_bytes());
        offset += t.data.len().div_ceil(ALIGN) * ALIGN;
    }
    b.resize(b.len().div_ceil(ALIGN) * ALIGN, 0);
    for t in tensors {
        b.extend(&t.data);
        b.resize(b.len().div_ceil(ALIGN) * ALIGN, 0);
    }
    std::fs::write(path, b).unwrap();
}

// ---------------------------------------------------------------- weights with known values

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn f32(&mut self) -> f32 {
        (self.next() % 20001) as f32 / 10000.0 - 1.0
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// An HF weight `[rows, cols]` together with its GGUF encoding (rows in HF order for now).
struct Weight {
    rows: usize,
    cols: usize,
    ggml_type: u32,
    /// Bytes of each row.
    row_bytes: Vec<Vec<u8>>,
    /// Exact f32 value of each element, computed from the block definitions.
    values: Vec<f32>,
}

const F32: u32 = 0;
const F16: u32 = 1;
const Q4_1: u32 = 3;
const Q8_0: u32 = 8;

fn weight(rng: &mut Rng, rows: usize, cols: usize, ggml_type: u32) -> Weight {
    let mut row_bytes = Vec::new();
    let mut values = Vec::new();
    for _ in 0..rows {
        let mut bytes = Vec::new();
        match ggml_type {
            F32 => (0..cols).for_each(|_| {
                let x = rng.f32();
                bytes.extend(x.to_le_bytes());
                values.push(x);
            }),
            F16 => (0..cols).for_each(|_| {
                let x = f16::from_f32(rng.f32());
                bytes.extend(x.to_le_bytes());
                values.push(x.to_f32());
            }),
            Q8_0 => (0..cols / 32).for_each(|_| {
                // Q8_0: f16 d, 32 × i8, x = q·d.
                let d = f16::from_f32(rng.f32() / 64.0);
                bytes.extend(d.to_le_bytes());
                for _ in 0..32 {
                    let q = rng.byte();
                    bytes.push(q);
                    values.push(q as i8 as f32 * d.to_f32());
                }
            }),
            Q4_1 => (0..cols / 32).for_each(|_| {
                // Q4_1: f16 d, f16 m, 16 bytes; element j = low nibble of qs[j],
                // element j + 16 = high nibble; x = q·d + m.
                let d = f16::from_f32(rng.f32().abs() / 8.0);
                let m = f16::from_f32(rng.f32());
                bytes.extend(d.to_le_bytes());
                bytes.extend(m.to_le_bytes());
                let qs: Vec<u8> = (0..16).map(|_| rng.byte()).collect();
                bytes.extend(&qs);
                let mut block = [0f32; 32];
                for (j, q) in qs.iter().enumerate() {
                    block[j] = (q & 15) as f32 * d.to_f32() + m.to_f32();
                    block[j + 16] = (q >> 4) as f32 * d.to_f32() + m.to_f32();
                }
                values.extend(block);
            }),
            other => panic!("test has no encoder for ggml type {other}"),
        }
        row_bytes.push(bytes);
    }
    Weight {
        rows,
        cols,
        ggml_type,
        row_bytes,
        values,
    }
}

/// llama.cpp `LlamaModel.permute`: GGUF row h·D + 2j + a holds HF row h·D + a·D/2 + j.
fn llama_cpp_row_order(rows: usize, n_heads: usize) -> Vec<usize> {
    let d = rows / n_heads;
    let mut src = vec![0; rows];
    for h in 0..n_heads {
        for j in 0..d / 2 {
            for a in 0..2 {
                src[h * d + 2 * j + a] = h * d + a * d / 2 + j;
            }
        }
    }
    src
}

impl Weight {
    fn to_gguf(&self, name: &str, permute_heads: Option<usize>) -> GgufTensor {
        let order: Vec<usize> = match permute_heads {
            Some(h) => llama_cpp_row_order(self.rows, h),
            None => (0..self.rows).collect(),
        };
        let dims = if self.rows == 1 {
            vec![self.cols as u64]
        } else {
            vec![self.cols as u64, self.rows as u64]
        };
        GgufTensor {
            name: name.to_string(),
            dims,
            ggml_type: self.ggml_type,
            data: order
                .iter()
                .flat_map(|&r| self.row_bytes[r].clone())
                .collect(),
        }
    }
}

/// A bias or norm vector: one row of f32.
fn vector(rng: &mut Rng, n: usize) -> Weight {
    weight(rng, 1, n, F32)
}

/// A bias whose permutation is per element: rows of one element each.
fn bias_rows(rng: &mut Rng, n: usize) -> Weight {
    weight(rng, n, 1, F32)
}

// ---------------------------------------------------------------- tiny models

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FFN: usize = 96;
const LAYERS: usize = 2;

fn vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3, 3, 3];
    for t in ["a", "b", "c", "Ġ", "ab", "Ġa", "1", "2", "Ġab"] {
        tokens.push(t.into());
        types.push(1);
    }
    while tokens.len() < 40 {
        tokens.push(format!("tok{}", tokens.len()));
        types.push(1);
    }
    let merges = ["a b", "Ġ a", "Ġ ab"].map(String::from).to_vec();
    (tokens, types, merges)
}

struct Model {
    arch: &'static str,
    tensors: Vec<GgufTensor>,
    /// HF name → (shape, exact values).
    expected: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

fn build_model(arch: &'static str, with_output: bool, seed: u64) -> Model {
    let mut rng = Rng(seed);
    let permute = arch == "llama";
    let mut tensors = Vec::new();
    let mut expected = HashMap::new();
    let mut add =
        |gguf_name: &str, hf_name: &str, w: Weight, heads: Option<usize>, shape: Vec<usize>| {
            tensors.push(w.to_gguf(gguf_name, heads.filter(|_| permute)));
            expected.insert(hf_name.to_string(), (shape, w.values));
        };
    let vocab = vocab().0.len();
    add(
        "token_embd.weight",
        "model.embed_tokens.weight",
        weight(&mut rng, vocab, HIDDEN, Q8_0),
        None,
        vec![vocab, HIDDEN],
    );
    for l in 0..LAYERS {
        let b = |s: &str| format!("blk.{l}.{s}");
        let hf = |s: &str| format!("model.layers.{l}.{s}");
        let (q_rows, kv_rows) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
        add(
            &b("attn_norm.weight"),
            &hf("input_layernorm.weight"),
            vector(&mut rng, HIDDEN),
            None,
            vec![HIDDEN],
        );
        add(
            &b("attn_q.weight"),
            &hf("self_attn.q_proj.weight"),
            weight(&mut rng, q_rows, HIDDEN, Q8_0),
            Some(HEADS),
            vec![q_rows, HIDDEN],
        );
        add(
            &b("attn_k.weight"),
            &hf("self_attn.k_proj.weight"),
            weight(&mut rng, kv_rows, HIDDEN, Q4_1),
            Some(KV_HEADS),
            vec![kv_rows, HIDDEN],
        );
        add(
            &b("attn_v.weight"),
            &hf("self_attn.v_proj.weight"),
            weight(&mut rng, kv_rows, HIDDEN, F32),
            None,
            vec![kv_rows, HIDDEN],
        );
        add(
            &b("attn_output.weight"),
            &hf("self_attn.o_proj.weight"),
            weight(&mut rng, HIDDEN, q_rows, F16),
            None,
            vec![HIDDEN, q_rows],
        );
        add(
            &b("ffn_norm.weight"),
            &hf("post_attention_layernorm.weight"),
            vector(&mut rng, HIDDEN),
            None,
            vec![HIDDEN],
        );
        add(
            &b("ffn_gate.weight"),
            &hf("mlp.gate_proj.weight"),
            weight(&mut rng, FFN, HIDDEN, Q4_1),
            None,
            vec![FFN, HIDDEN],
        );
        add(
            &b("ffn_up.weight"),
            &hf("mlp.up_proj.weight"),
            weight(&mut rng, FFN, HIDDEN, Q8_0),
            None,
            vec![FFN, HIDDEN],
        );
        add(
            &b("ffn_down.weight"),
            &hf("mlp.down_proj.weight"),
            weight(&mut rng, HIDDEN, FFN, F32),
            None,
            vec![HIDDEN, FFN],
        );
        if arch == "qwen3" {
            add(
                &b("attn_q_norm.weight"),
                &hf("self_attn.q_norm.weight"),
                vector(&mut rng, HEAD_DIM),
                None,
                vec![HEAD_DIM],
            );
            add(
                &b("attn_k_norm.weight"),
                &hf("self_attn.k_norm.weight"),
                vector(&mut rng, HEAD_DIM),
                None,
                vec![HEAD_DIM],
            );
        }
        if arch == "qwen2" {
            add(
                &b("attn_q.bias"),
                &hf("self_attn.q_proj.bias"),
                bias_rows(&mut rng, q_rows),
                Some(HEADS),
                vec![q_rows],
            );
            add(
                &b("attn_k.bias"),
                &hf("self_attn.k_proj.bias"),
                bias_rows(&mut rng, kv_rows),
                Some(KV_HEADS),
                vec![kv_rows],
            );
            add(
                &b("attn_v.bias"),
                &hf("self_attn.v_proj.bias"),
                bias_rows(&mut rng, kv_rows),
                None,
                vec![kv_rows],
            );
        }
    }
    add(
        "output_norm.weight",
        "model.norm.weight",
        vector(&mut rng, HIDDEN),
        None,
        vec![HIDDEN],
    );
    if with_output {
        add(
            "output.weight",
            "lm_head.weight",
            weight(&mut rng, vocab, HIDDEN, Q4_1),
            None,
            vec![vocab, HIDDEN],
        );
    }
    // Biases are stored as 1-D tensors: fix the dims written for the per-row bias weights.
    for t in &mut tensors {
        if t.name.ends_with(".bias") {
            t.dims = vec![t.dims.iter().product()];
        }
    }
    Model {
        arch,
        tensors,
        expected,
    }
}

fn write_model(m: &Model, path: &Path, pre: &'static str) {
    write_model_with(m, path, bpe_tokenizer(pre));
}

fn bpe_tokenizer(pre: &'static str) -> Vec<(String, Kv)> {
    let (tokens, types, merges) = vocab();
    vec![
        ("tokenizer.ggml.model".into(), Kv::Str("gpt2")),
        ("tokenizer.ggml.pre".into(), Kv::Str(pre)),
        ("tokenizer.ggml.tokens".into(), Kv::Strs(tokens)),
        ("tokenizer.ggml.token_type".into(), Kv::I32s(types)),
        ("tokenizer.ggml.merges".into(), Kv::Strs(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Kv::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Kv::U32(2)),
        ("tokenizer.ggml.padding_token_id".into(), Kv::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), Kv::Bool(false)),
        ("tokenizer.chat_template".into(), Kv::Str("{{ messages }}")),
    ]
}

fn write_model_with(m: &Model, path: &Path, tokenizer: Vec<(String, Kv)>) {
    let a = |k: &str| format!("{}.{k}", m.arch);
    let mut keys: Vec<(String, Kv)> = vec![
        ("general.architecture".into(), Kv::Str(m.arch)),
        (a("block_count"), Kv::U32(LAYERS as u32)),
        (a("context_length"), Kv::U64(2048)), // u64 on purpose: ints of any width are accepted
        (a("embedding_length"), Kv::U32(HIDDEN as u32)),
        (a("feed_forward_length"), Kv::U32(FFN as u32)),
        (a("attention.head_count"), Kv::U32(HEADS as u32)),
        (a("attention.head_count_kv"), Kv::U32(KV_HEADS as u32)),
        (a("attention.layer_norm_rms_epsilon"), Kv::F32(1e-5)),
        (a("rope.freq_base"), Kv::F32(100000.0)),
    ];
    if m.arch == "qwen3" {
        keys.push((a("attention.key_length"), Kv::U32(HEAD_DIM as u32)));
    }
    keys.extend(tokenizer);
    write_gguf(path, &keys, &m.tensors);
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn check_weights(m: &Model, dir: &Path, dtype: DType) {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(
        meta.metadata()
            .as_ref()
            .and_then(|m| m.get("format"))
            .map(String::as_str),
        Some("pt")
    );
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut want: Vec<String> = m.expected.keys().cloned().collect();
    want.sort();
    assert_eq!(names, want);
    for (name, (shape, values)) in &m.expected {
        let t = st.tensor(name).unwrap();
        assert_eq!(t.shape(), shape.as_slice(), "{name}");
        let got: Vec<f32> = match dtype {
            DType::F32 | DType::I8 => t
                .data()
                .chunks(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            DType::BF16 => t
                .data()
                .chunks(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => t
                .data()
                .chunks(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        };
        let want: Vec<f32> = match dtype {
            DType::F32 | DType::I8 => values.clone(),
            DType::BF16 => values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
            DType::F16 => values.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        };
        assert_eq!(got, want, "{name} differs");
    }
}

#[test]
fn llama_gguf_converts_with_qk_unpermuted_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let m = build_model("llama", false, 7);
    let gguf = tmp.path().join("tiny.gguf");
    write_model(&m, &gguf, "smollm");
    let out = tmp.path().join("hf");
    convert_gguf(&gguf, &out, DType::F32, false).unwrap();

    check_weights(&m, &out, DType::F32);
    assert!(!m.expected.contains_key("lm_head.weight"));

    let c = read_json(&out.join("config.json"));
    assert_eq!(c["architectures"][0], "LlamaForCausalLM");
    assert_eq!(c["model_type"], "llama");
    assert_eq!(c["vocab_size"], 40);
    assert_eq!(c["hidden_size"], HIDDEN);
    assert_eq!(c["intermediate_size"], FFN);
    assert_eq!(c["num_hidden_layers"], LAYERS);
    assert_eq!(c["num_attention_heads"], HEADS);
    assert_eq!(c["num_key_value_heads"], KV_HEADS);
    assert_eq!(c["head_dim"], HEAD_DIM);
    assert_eq!(c["rope_theta"], 100000.0);
    assert_eq!(c["max_position_embeddings"], 2048);
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["torch_dtype"], "float32");
    assert_eq!(c["bos_token_id"], 1);
    assert_eq!(c["eos_token_id"], 2);
    assert!((c["rms_norm_eps"].as_f64().unwrap() - 1e-5).abs() < 1e-9);
    let parsed = ModelConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!(parsed.num_kv_heads, KV_HEADS);
    assert!(parsed.tie_word_embeddings);

    let g = read_json(&out.join("generation_config.json"));
    assert_eq!(
        (g["bos_token_id"].as_u64(), g["eos_token_id"].as_u64()),
        (Some(1), Some(2))
    );

    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["pad_token"], "<|im_end|>");
    assert_eq!(tc["add_bos_token"], false);
    assert_eq!(tc["chat_template"], "{{ messages }}");
    assert_eq!(tc["model_max_length"], 2048);
    assert_eq!(tc["added_tokens_decoder"]["2"]["content"], "<|im_end|>");
    assert_eq!(tc["added_tokens_decoder"]["2"]["special"], true);

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    // "ab a" → "ab" + "Ġa" via merges; "12" split into single digits; specials kept whole.
    let enc = tok.encode("ab a12<|im_end|>", false).unwrap();
    assert_eq!(enc.get_ids(), &[7, 8, 9, 10, 2]);
    let enc = tok.encode("ab", true).unwrap();
    assert_eq!(enc.get_ids(), &[7], "no BOS: add_bos_token is false");
    assert_eq!(tok.decode(&[7, 8, 2], true).unwrap(), "ab a");

    // Left no temp directories behind.
    let entries: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
}

#[test]
fn llama_gguf_converts_to_bf16_and_f16() {
    let tmp = tempfile::tempdir().unwrap();
    let m = build_model("llama", true, 11);
    let gguf = tmp.path().join("tiny.gguf");
    // An end-of-turn token distinct from EOS (as Llama 3 instruct GGUFs have) joins the EOS list.
    let mut keys = bpe_tokenizer("gpt2");
    keys.push(("tokenizer.ggml.eot_token_id".into(), Kv::U32(0)));
    write_model_with(&m, &gguf, keys);
    for dtype in [DType::BF16, DType::F16] {
        let out = tmp.path().join(format!("hf-{dtype}"));
        convert_gguf(&gguf, &out, dtype, false).unwrap();
        check_weights(&m, &out, dtype);
        let c = read_json(&out.join("config.json"));
        assert_eq!(c["torch_dtype"], dtype.name());
        assert_eq!(c["tie_word_embeddings"], false);
        let parsed = ModelConfig::from_file(&out.join("config.json")).unwrap();
        assert_eq!(parsed.eos_token_ids, vec![2, 0]);
        let g = read_json(&out.join("generation_config.json"));
        assert_eq!(g["eos_token_id"], serde_json::json!([2, 0]));
    }
}

#[test]
fn qwen2_gguf_keeps_qk_order_and_biases() {
    let tmp = tempfile::tempdir().unwrap();
    let m = build_model("qwen2", true, 3);
    assert!(
        m.expected
            .contains_key("model.layers.1.self_attn.k_proj.bias")
    );
    let gguf = tmp.path().join("tiny.gguf");
    write_model(&m, &gguf, "qwen2");
    let out = tmp.path().join("hf");
    convert_gguf(&gguf, &out, DType::F32, false).unwrap();
    check_weights(&m, &out, DType::F32);
    let c = read_json(&out.join("config.json"));
    assert_eq!(c["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(c["tie_word_embeddings"], false);
    let parsed = ModelConfig::from_file(&out.join("config.json")).unwrap();
    assert!(parsed.architecture.has_qkv_bias());

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    assert_eq!(
        tok.encode("ab a12", false).unwrap().get_ids(),
        &[7, 8, 9, 10]
    );
}

#[test]
fn failed_conversion_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mut m = build_model("llama", false, 5);
    // Re-type one tensor as Q5_K, which lmi does not dequantize.
    let t = m
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.1.ffn_up.weight")
        .unwrap();
    t.ggml_type = 13;
    t.dims = vec![256, 1];
    t.data = vec![0; 176];
    let gguf = tmp.path().join("tiny.gguf");
    write_model(&m, &gguf, "smollm");
    let out = tmp.path().join("hf");
    let e = convert_gguf(&gguf, &out, DType::F32, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("blk.1.ffn_up.weight") && e.contains("Q5_K"),
        "{e}"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn unknown_architecture_and_pre_tokenizer_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut m = build_model("llama", false, 9);
    m.arch = "phi3";
    let gguf = tmp.path().join("phi.gguf");
    write_model(&m, &gguf, "smollm");
    let e = convert_gguf(&gguf, &tmp.path().join("a"), DType::F32, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("phi3"), "{e}");

    let m = build_model("llama", false, 9);
    write_model(&m, &gguf, "mystery-pre");
    let e = convert_gguf(&gguf, &tmp.path().join("b"), DType::F32, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("mystery-pre"), "{e}");
}

/// A SentencePiece ("llama") vocabulary whose merges must be rebuilt from scores. By llama.cpp's
/// algorithm (merge the adjacent pair with the best-scoring concatenation until none is left),
/// "▁hello▁world▁é" becomes ▁hello ▁wor l d ▁ <0xC3> <0xA9>:
/// ll(-1) → ▁h(-2) → llo(-4) → ▁he(-5) → ▁hello(-6); ▁w(-7) → or(-8) → ▁wor(-9); é is not in the
/// vocabulary and falls back to its UTF-8 bytes.
fn spm_tokenizer() -> Vec<(String, Kv)> {
    let entries: [(&str, f32, i32); 23] = [
        ("<unk>", 0.0, 2),
        ("<s>", 0.0, 3),
        ("</s>", 0.0, 3),
        ("<0xC3>", 0.0, 6),
        ("<0xA9>", 0.0, 6),
        ("▁", -100.0, 1),
        ("h", -101.0, 1),
        ("e", -102.0, 1),
        ("l", -103.0, 1),
        ("o", -104.0, 1),
        ("w", -105.0, 1),
        ("r", -106.0, 1),
        ("d", -107.0, 1),
        ("ll", -1.0, 1),
        ("▁h", -2.0, 1),
        ("he", -3.0, 1),
        ("llo", -4.0, 1),
        ("▁he", -5.0, 1),
        ("▁hello", -6.0, 1),
        ("▁w", -7.0, 1),
        ("or", -8.0, 1),
        ("▁wor", -9.0, 1),
        ("<|user|>", 0.0, 4),
    ];
    vec![
        ("tokenizer.ggml.model".into(), Kv::Str("llama")),
        (
            "tokenizer.ggml.tokens".into(),
            Kv::Strs(entries.iter().map(|e| e.0.to_string()).collect()),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Kv::F32s(entries.iter().map(|e| e.1).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Kv::I32s(entries.iter().map(|e| e.2).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Kv::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Kv::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), Kv::U32(0)),
    ]
}

#[test]
fn sentencepiece_vocabulary_becomes_byte_fallback_bpe() {
    let tmp = tempfile::tempdir().unwrap();
    let m = build_model("llama", false, 13);
    let gguf = tmp.path().join("spm.gguf");
    write_model_with(&m, &gguf, spm_tokenizer());
    let out = tmp.path().join("hf");
    convert_gguf(&gguf, &out, DType::F32, false).unwrap();

    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let enc = tok.encode("hello world é", false).unwrap();
    assert_eq!(enc.get_ids(), &[18, 21, 8, 12, 5, 3, 4]);
    // add_bos_token defaults to true for SentencePiece vocabularies.
    let enc = tok.encode("hello", true).unwrap();
    assert_eq!(enc.get_ids(), &[1, 18]);
    // Specials and user-defined tokens are matched on the raw text.
    let enc = tok.encode("<s>hello<|user|>", false).unwrap();
    assert_eq!(enc.get_ids(), &[1, 18, 22]);
    assert_eq!(
        tok.decode(&[1, 18, 21, 8, 12, 5, 3, 4], true).unwrap(),
        "hello world é"
    );

    let tc = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(tc["unk_token"], "<unk>");
    assert_eq!(tc["add_bos_token"], true);
    assert_eq!(tc["added_tokens_decoder"]["22"]["special"], false);
    assert_eq!(tc["added_tokens_decoder"]["0"]["special"], true);
    assert!(
        tc["added_tokens_decoder"].get("3").is_none(),
        "byte tokens are not added tokens"
    );
}

#[test]
fn sentencepiece_remove_extra_whitespaces_trims_and_collapses_spaces() {
    let tmp = tempfile::tempdir().unwrap();
    let m = build_model("llama", false, 13);
    let gguf = tmp.path().join("spm.gguf");
    let mut keys = spm_tokenizer();
    keys.push((
        "tokenizer.ggml.remove_extra_whitespaces".into(),
        Kv::Bool(true),
    ));
    write_model_with(&m, &gguf, keys);
    let out = tmp.path().join("hf");
    convert_gguf(&gguf, &out, DType::F32, false).unwrap();
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let enc = tok.encode("   hello    world  ", false).unwrap();
    assert_eq!(enc.get_ids(), &[18, 21, 8, 12]);
}

#[test]
fn unused_filler_tokens_are_not_matched_in_text() {
    let tmp = tempfile::tempdir().unwrap();
    let m = build_model("llama", false, 9);
    let gguf = tmp.path().join("tiny.gguf");
    let mut keys = bpe_tokenizer("gpt-2");
    // The converter fills ids missing from the HF vocabulary with "[PAD{i}]", type UNUSED (5).
    if let Some((_, Kv::Strs(tokens))) = keys.iter_mut().find(|(k, _)| k == "tokenizer.ggml.tokens")
    {
        tokens[39] = "[PAD39]".into();
    }
    if let Some((_, Kv::I32s(types))) = keys
        .iter_mut()
        .find(|(k, _)| k == "tokenizer.ggml.token_type")
    {
        types[39] = 5;
    }
    write_model_with(&m, &gguf, keys);
    let out = tmp.path().join("hf");
    convert_gguf(&gguf, &out, DType::F32, false).unwrap();
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let ids = tok.encode("[PAD39]", false).unwrap().get_ids().to_vec();
    assert!(!ids.contains(&39), "{ids:?}");
    assert_eq!(tok.decode(&[39], false).unwrap(), "[PAD39]");
}

#[test]
fn qwen3_gguf_maps_qk_norms() {
    let tmp = tempfile::tempdir().unwrap();
    let m = build_model("qwen3", false, 17);
    assert!(
        m.expected
            .contains_key("model.layers.0.self_attn.q_norm.weight")
    );
    let gguf = tmp.path().join("tiny.gguf");
    write_model(&m, &gguf, "qwen2");
    let out = tmp.path().join("hf");
    convert_gguf(&gguf, &out, DType::F32, false).unwrap();
    check_weights(&m, &out, DType::F32);
    let parsed = ModelConfig::from_file(&out.join("config.json")).unwrap();
    assert!(parsed.architecture.has_qk_norm());
    assert_eq!(parsed.head_dim, HEAD_DIM);
}

/// llama.cpp's `LlamaModel.generate_extra_tensors` for Llama 3.1 rope scaling, written out
/// here independently: the divisor applied to each RoPE frequency.
fn llama31_rope_freqs(factor: f64, orig: f64) -> Vec<f32> {
    let (low, high, theta) = (1.0f64, 4.0f64, 100000.0f64);
    (0..HEAD_DIM / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / HEAD_DIM as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < orig / high {
                1.0
            } else if wavelen > orig / low {
                factor as f32
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

#[test]
fn llama3_rope_freqs_become_rope_scaling() {
    let tmp = tempfile::tempdir().unwrap();
    // With the test's small head_dim, an original context of 4096 (given by the GGUF key)
    // puts one frequency in the smoothed band between the unscaled and fully scaled ones.
    let freqs = llama31_rope_freqs(8.0, 4096.0);
    assert!(freqs.contains(&1.0) && freqs.contains(&8.0));
    assert!(freqs.iter().any(|&f| f > 1.0 && f < 8.0));
    for (name, divisors, want_scaling) in [
        ("ok", freqs.clone(), true),
        (
            "odd",
            freqs.iter().map(|f| f * 1.5).collect::<Vec<f32>>(),
            false,
        ),
    ] {
        let mut m = build_model("llama", false, 19);
        m.tensors.push(GgufTensor {
            name: "rope_freqs.weight".into(),
            dims: vec![divisors.len() as u64],
            ggml_type: F32,
            data: divisors.iter().flat_map(|f| f.to_le_bytes()).collect(),
        });
        let gguf = tmp.path().join(format!("{name}.gguf"));
        let mut keys = bpe_tokenizer("llama-bpe");
        keys.push((
            "llama.rope.scaling.original_context_length".into(),
            Kv::U32(4096),
        ));
        write_model_with(&m, &gguf, keys);
        let out = tmp.path().join(name);
        convert_gguf(&gguf, &out, DType::F32, false).unwrap();
        // rope_freqs.weight is not a weight of the HF model.
        check_weights(&m, &out, DType::F32);
        let c = ModelConfig::from_file(&out.join("config.json")).unwrap();
        match c.rope_scaling {
            Some(s) if want_scaling => {
                assert_eq!(s.factor, 8.0);
                assert_eq!(s.low_freq_factor, 1.0);
                assert_eq!(s.high_freq_factor, 4.0);
                assert_eq!(s.original_max_position_embeddings, 4096.0);
            }
            None if !want_scaling => {}
            other => panic!("{name}: rope_scaling {other:?}"),
        }
    }
}
