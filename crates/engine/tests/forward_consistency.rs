//! The forward pass on tiny random Llama-, Qwen2- and Qwen3-shaped models:
//! - agrees with a plain dense f64 reference written here (no paging, no fusion);
//! - gives the same logits for one prefill, token-by-token decode, and the same sequence
//!   chunked inside a mixed ragged batch with scattered blocks (bit-identical: the CPU
//!   kernels are batch invariant).

use std::path::Path;

use lmi_checkpoint::testing::{TinySpec, write_tiny_model};
use lmi_checkpoint::weights::SafetensorsDir;
use lmi_engine::engine::EngineOptions;
use lmi_engine::{BLOCK_SIZE, DType, Engine, LogitsWanted, ModelConfig, SeqChunk};

fn tokens(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % vocab as u32)
        .collect()
}

fn load(dir: &Path, blocks: usize, dtype: DType) -> Engine<lmi_engine::cpu::CpuBackend> {
    let opts = EngineOptions {
        dtype: Some(dtype),
        kv_blocks: Some(blocks),
        ..Default::default()
    };
    lmi_engine::load_cpu(dir, &opts).unwrap()
}

/// Dense reference forward over one whole sequence, f64, straight from the checkpoint.
fn reference_logits(dir: &Path, ids: &[u32]) -> Vec<Vec<f64>> {
    let c = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let st = SafetensorsDir::open(dir).unwrap();
    let get = |name: &str| -> Vec<f64> {
        let shape: Vec<usize> = match name {
            _ if name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight") => {
                vec![c.head_dim]
            }
            _ if name.ends_with("layernorm.weight") || name == "model.norm.weight" => {
                vec![c.hidden_size]
            }
            _ if name.ends_with("q_proj.weight") => vec![c.q_size(), c.hidden_size],
            _ if name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight") => {
                vec![c.kv_size(), c.hidden_size]
            }
            _ if name.ends_with("q_proj.bias") => vec![c.q_size()],
            _ if name.ends_with("k_proj.bias") || name.ends_with("v_proj.bias") => {
                vec![c.kv_size()]
            }
            _ if name.ends_with("o_proj.weight") => vec![c.hidden_size, c.q_size()],
            _ if name.ends_with("gate_proj.weight") || name.ends_with("up_proj.weight") => {
                vec![c.intermediate_size, c.hidden_size]
            }
            _ if name.ends_with("down_proj.weight") => vec![c.hidden_size, c.intermediate_size],
            _ => vec![c.vocab_size, c.hidden_size],
        };
        st.load(name, &shape, DType::F32)
            .unwrap()
            .to_f32_vec()
            .into_iter()
            .map(|x| x as f64)
            .collect()
    };
    let (h, d, n) = (c.hidden_size, c.head_dim, ids.len());
    let eps = c.rms_norm_eps;
    let norm = |x: &[f64], w: &[f64]| -> Vec<f64> {
        let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
        x.iter().zip(w).map(|(v, g)| v * inv * g).collect()
    };
    let matvec = |w: &[f64], x: &[f64], rows: usize| -> Vec<f64> {
        (0..rows)
            .map(|r| (0..x.len()).map(|k| w[r * x.len() + k] * x[k]).sum())
            .collect()
    };
    let inv_freq = c.rope_inv_freq();
    let rope = |v: &mut [f64], pos: usize| {
        for i in 0..d / 2 {
            let (s, co) = (pos as f64 * inv_freq[i]).sin_cos();
            let (a, b) = (v[i], v[i + d / 2]);
            v[i] = a * co - b * s;
            v[i + d / 2] = b * co + a * s;
        }
    };
    let embed = get("model.embed_tokens.weight");
    let mut xs: Vec<Vec<f64>> = ids
        .iter()
        .map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec())
        .collect();
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        let wq = get(&format!("{p}.self_attn.q_proj.weight"));
        let wk = get(&format!("{p}.self_attn.k_proj.weight"));
        let wv = get(&format!("{p}.self_attn.v_proj.weight"));
        let wo = get(&format!("{p}.self_attn.o_proj.weight"));
        let bias = |n: &str| {
            c.architecture
                .has_qkv_bias()
                .then(|| get(&format!("{p}.self_attn.{n}.bias")))
        };
        let (bq, bk, bv) = (bias("q_proj"), bias("k_proj"), bias("v_proj"));
        let qk_norm = c.architecture.has_qk_norm().then(|| {
            (
                get(&format!("{p}.self_attn.q_norm.weight")),
                get(&format!("{p}.self_attn.k_norm.weight")),
            )
        });
        let ln1 = get(&format!("{p}.input_layernorm.weight"));
        let ln2 = get(&format!("{p}.post_attention_layernorm.weight"));
        let (mut qs, mut ks, mut vs) = (vec![], vec![], vec![]);
        for (pos, x) in xs.iter().enumerate() {
            let xn = norm(x, &ln1);
            let add = |mut v: Vec<f64>, b: &Option<Vec<f64>>| {
                if let Some(b) = b {
                    v.iter_mut().zip(b).for_each(|(v, b)| *v += b)
                }
                v
            };
            let mut q = add(matvec(&wq, &xn, c.q_size()), &bq);
            let mut k = add(matvec(&wk, &xn, c.kv_size()), &bk);
            let v = add(matvec(&wv, &xn, c.kv_size()), &bv);
            for hd in q.chunks_mut(d) {
                if let Some((qn, _)) = &qk_norm {
                    let t = norm(hd, qn);
                    hd.copy_from_slice(&t);
                }
                rope(hd, pos);
            }
            for hd in k.chunks_mut(d) {
                if let Some((_, kn)) = &qk_norm {
                    let t = norm(hd, kn);
                    hd.copy_from_slice(&t);
                }
                rope(hd, pos);
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        let group = c.num_heads / c.num_kv_heads;
        let wg = get(&format!("{p}.mlp.gate_proj.weight"));
        let wu = get(&format!("{p}.mlp.up_proj.weight"));
        let wd = get(&format!("{p}.mlp.down_proj.weight"));
        for t in 0..n {
            let mut att = vec![0.0; c.q_size()];
            for head in 0..c.num_heads {
                let g = head / group;
                let q = &qs[t][head * d..(head + 1) * d];
                let sc: Vec<f64> = (0..=t)
                    .map(|j| {
                        q.iter()
                            .zip(&ks[j][g * d..(g + 1) * d])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..=t {
                    for i in 0..d {
                        att[head * d + i] += e[j] / z * vs[j][g * d + i];
                    }
                }
            }
            let o = matvec(&wo, &att, h);
            xs[t].iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let xn = norm(&xs[t], &ln2);
            let gt = matvec(&wg, &xn, c.intermediate_size);
            let up = matvec(&wu, &xn, c.intermediate_size);
            let act: Vec<f64> = gt
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let dn = matvec(&wd, &act, h);
            xs[t].iter_mut().zip(&dn).for_each(|(x, o)| *x += o);
        }
    }
    let fnorm = get("model.norm.weight");
    let head = if c.tie_word_embeddings {
        embed.clone()
    } else {
        get("lm_head.weight")
    };
    xs.iter()
        .map(|x| matvec(&head, &norm(x, &fnorm), c.vocab_size))
        .collect()
}

fn table(first: u32, n_tokens: usize, stride: u32) -> Vec<u32> {
    (0..n_tokens.div_ceil(BLOCK_SIZE) as u32)
        .map(|i| first + i * stride)
        .collect()
}

/// With bf16 weights the matrix inputs and the KV cache are rounded to bf16 too, so only the
/// reference comparison loosens: the bit-identity of prefill, decode and chunked batches holds
/// for every dtype (and for the AMX and AVX-512 paths alike).
fn check(spec: TinySpec, dtype: DType) {
    let tolerance = match dtype {
        DType::BF16 => 3e-2,
        _ => 1e-4,
    };
    let tmp = tempfile::tempdir().unwrap();
    write_tiny_model(tmp.path(), &spec).unwrap();
    let v = spec.vocab_size;
    let a = tokens(37, 1, v);
    let b = tokens(21, 2, v);

    // 1. One prefill of all of A, logits for every position.
    let mut e = load(tmp.path(), 64, dtype);
    let prefill = e
        .forward_logits(&[SeqChunk {
            tokens: a.clone(),
            start_pos: 0,
            block_table: table(0, a.len(), 1),
            window_table: Vec::new(),
            logits: LogitsWanted::All,
            adapter: None,
        }])
        .unwrap();
    assert_eq!(prefill.num_rows(), a.len());

    // Against the dense f64 reference.
    let reference = reference_logits(tmp.path(), &a);
    for (t, r) in reference.iter().enumerate() {
        for (x, y) in prefill.row(t).iter().zip(r) {
            assert!(
                (*x as f64 - y).abs() < tolerance,
                "{:?} {dtype} token {t}: {x} vs reference {y}",
                spec.architecture
            );
        }
    }

    // 2. Token-by-token decode into other blocks.
    let mut e = load(tmp.path(), 64, dtype);
    let tbl = table(10, a.len(), 3);
    for (t, &tok) in a.iter().enumerate() {
        let out = e
            .forward_logits(&[SeqChunk {
                tokens: vec![tok],
                start_pos: t,
                block_table: tbl.clone(),
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            }])
            .unwrap();
        assert_eq!(
            out.row(0),
            prefill.row(t),
            "decode step {t} is not bit-identical to prefill"
        );
    }

    // 3. A prefilled in chunks of 10/10/17 while B decodes beside it, scattered blocks.
    let mut e = load(tmp.path(), 64, dtype);
    let (ta, tb) = (table(40, a.len(), 2), table(41, b.len() + 3, 2));
    let mut a_pos = 0;
    for (b_pos, chunk) in [10usize, 10, 17].into_iter().enumerate() {
        let out = e
            .forward_logits(&[
                SeqChunk {
                    tokens: vec![b[b_pos]],
                    start_pos: b_pos,
                    block_table: tb.clone(),
                    window_table: Vec::new(),
                    logits: LogitsWanted::Last,
                    adapter: None,
                },
                SeqChunk {
                    tokens: a[a_pos..a_pos + chunk].to_vec(),
                    start_pos: a_pos,
                    block_table: ta.clone(),
                    window_table: Vec::new(),
                    logits: LogitsWanted::All,
                    adapter: None,
                },
            ])
            .unwrap();
        assert_eq!(out.rows_per_seq, vec![1, chunk as u32]);
        for i in 0..chunk {
            assert_eq!(
                out.row(1 + i),
                prefill.row(a_pos + i),
                "chunked token {} is not bit-identical to prefill",
                a_pos + i
            );
        }
        a_pos += chunk;
    }
}

#[test]
fn llama_shaped_model_is_consistent() {
    check(TinySpec::llama(), DType::F32);
}

#[test]
fn bf16_weights_and_kv_are_consistent() {
    check(TinySpec::llama(), DType::BF16);
    check(TinySpec::qwen3(), DType::BF16);
}

#[test]
fn qwen2_shaped_model_is_consistent() {
    check(TinySpec::qwen2(), DType::F32);
}

#[test]
fn qwen3_shaped_model_is_consistent() {
    check(TinySpec::qwen3(), DType::F32);
}

#[test]
fn missing_tensor_and_bad_shape_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    // A Llama checkpoint declared as Qwen2: the q/k/v biases Qwen2 needs are missing.
    write_tiny_model(tmp.path(), &TinySpec::llama()).unwrap();
    let cfg = std::fs::read_to_string(tmp.path().join("config.json")).unwrap();
    std::fs::write(
        tmp.path().join("config.json"),
        cfg.replace("LlamaForCausalLM", "Qwen2ForCausalLM"),
    )
    .unwrap();
    let err = lmi_engine::load_cpu(tmp.path(), &EngineOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.layers.0.self_attn.q_proj.bias"),
        "{err}"
    );

    write_tiny_model(tmp.path(), &TinySpec::llama()).unwrap();
    let cfg = std::fs::read_to_string(tmp.path().join("config.json")).unwrap();
    std::fs::write(
        tmp.path().join("config.json"),
        cfg.replace("\"intermediate_size\": 96", "\"intermediate_size\": 95"),
    )
    .unwrap();
    let err = lmi_engine::load_cpu(tmp.path(), &EngineOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("gate_proj") && err.contains("95"), "{err}");

    std::fs::write(
        tmp.path().join("config.json"),
        cfg.replace("LlamaForCausalLM", "FalconForCausalLM"),
    )
    .unwrap();
    let err = lmi_engine::load_cpu(tmp.path(), &EngineOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("FalconForCausalLM"), "{err}");
}
