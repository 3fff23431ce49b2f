//! Every CUDA backend op (kernels/*.cu and their launches) against the CPU backend's, through
//! the `Backend` trait: on the CPU emulator in both thread orders, and on a GPU when present.
//! Inputs are rounded to bf16 where the GPU keeps bf16, so the two sides see the same values
//! and differ only by summation order.

mod cuda_common;

use cuda_common::{assert_close, bf16_round, cpu, random, to_host};
use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::{Device, DeviceExt};
use lmi_cuda_emu::EmuDevice;
use lmi_engine::backend::{LoraGroup, LoraLayer, LoraRegistration, LoraSite, QkNorm, QkvLayout};
use lmi_engine::cpu::{CpuBackend, CpuKv};
use lmi_engine::cuda::{CudaBackend, CudaWeight};
use lmi_engine::lora::Target;
use lmi_engine::{Backend, BatchLayout, DType, KvCacheConfig, LogitsWanted, ModelConfig, SeqChunk};

fn bf16_matrix(rows: usize, cols: usize, seed: u64, scale: f32) -> (Vec<f32>, HostTensor) {
    let v = bf16_round(&random(rows * cols, seed, scale));
    let t = HostTensor::f32(vec![rows, cols], v.clone()).to_dtype(DType::BF16);
    (v, t)
}

fn vector(v: &[f32]) -> HostTensor {
    HostTensor::f32(vec![v.len()], v.to_vec())
}

/// Two sequences: a 20-token prefill from position 0 and a 3-token chunk at position 30.
fn layout(adapter: Option<u64>) -> BatchLayout {
    let chunks = [
        SeqChunk {
            tokens: (0..20).map(|i| (i * 7 + 3) % 250).collect(),
            start_pos: 0,
            block_table: vec![5, 2],
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter,
        },
        SeqChunk {
            tokens: vec![11, 12, 13],
            start_pos: 30,
            block_table: vec![0, 7, 3],
            window_table: Vec::new(),
            logits: LogitsWanted::All,
            adapter: None,
        },
    ];
    BatchLayout::new(&chunks, 8).unwrap()
}

fn check_embedding<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let (_, t) = bf16_matrix(260, 96, 1, 2.0);
    let (cw, gw) = (
        c.upload_weight(t.clone()).unwrap(),
        g.upload_weight(t).unwrap(),
    );
    let l = layout(None);
    let n = l.num_tokens() * 96;
    let mut want = c.alloc(n).unwrap();
    c.embedding(&cw, &c.upload_step(&l).unwrap(), &mut want)
        .unwrap();
    let mut out = g.alloc(n).unwrap();
    g.embedding(&gw, &g.upload_step(&l).unwrap(), &mut out)
        .unwrap();
    assert_eq!(to_host(g, &out), want, "embedding rows are copied exactly");
}

fn check_rms_norms<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    for (rows, width) in [(1, 64), (3, 576), (2, 4096)] {
        let x = random(rows * width, 3, 3.0);
        let d = random(rows * width, 4, 1.0);
        let w = random(width, 5, 1.0);
        let (cw, gw) = (
            c.upload_weight(vector(&w)).unwrap(),
            g.upload_weight(vector(&w)).unwrap(),
        );
        let mut want = c.alloc(rows * width).unwrap();
        c.rms_norm(&x, rows, &cw, 1e-5, &mut want).unwrap();
        let gx = g.upload_f32(&x).unwrap();
        let mut out = g.alloc(rows * width).unwrap();
        g.rms_norm(&gx, rows, &gw, 1e-5, &mut out).unwrap();
        assert_close("rms_norm", &to_host(g, &out), &want, 1e-5, 1e-5);
        let mut out16 = g.alloc_matmul_input(rows * width).unwrap();
        g.rms_norm(&gx, rows, &gw, 1e-5, &mut out16).unwrap();
        assert_close(
            "rms_norm to bf16",
            &to_host(g, &out16),
            &bf16_round(&want),
            1e-6,
            1.0 / 128.0,
        );

        // residual += delta, then the norm.
        let mut cres = x.clone();
        let mut want = c.alloc(rows * width).unwrap();
        c.add_rms_norm(&mut cres, &d, rows, &cw, 1e-6, &mut want)
            .unwrap();
        let mut gres = g.upload_f32(&x).unwrap();
        let gd = g.upload_f32(&d).unwrap();
        let mut out16 = g.alloc_matmul_input(rows * width).unwrap();
        g.add_rms_norm(&mut gres, &gd, rows, &gw, 1e-6, &mut out16)
            .unwrap();
        assert_eq!(to_host(g, &gres), cres, "add_rms_norm residual");
        assert_close(
            "add_rms_norm",
            &to_host(g, &out16),
            &bf16_round(&want),
            1e-6,
            1.0 / 128.0,
        );
    }
}

fn qkv_layout() -> QkvLayout {
    QkvLayout {
        q_heads: 6,
        kv_heads: 2,
        head_dim: 64,
    }
}

/// Whole-projection q and k norms (OLMo 2/3): a span of each QKV row, the rest untouched.
fn check_span_rms_norm<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let ql = qkv_layout();
    let rows = layout(None).num_tokens();
    let (width, qs, kvs) = (ql.row_width(), ql.k_offset(), ql.v_offset() - ql.k_offset());
    let qkv = random(rows * width, 8, 2.0);
    let (wq, wk) = (random(qs, 9, 1.0), random(kvs, 10, 1.0));
    let mut want = qkv.clone();
    let mut got = g.upload_f32(&qkv).unwrap();
    for (offset, w) in [(0, &wq), (qs, &wk)] {
        let (cw, gw) = (
            c.upload_weight(vector(w)).unwrap(),
            g.upload_weight(vector(w)).unwrap(),
        );
        c.span_rms_norm(&mut want, rows, width, offset, &cw, 1e-6)
            .unwrap();
        g.span_rms_norm(&mut got, rows, width, offset, &gw, 1e-6)
            .unwrap();
    }
    let got = to_host(g, &got);
    assert_close("span_rms_norm", &got, &want, 1e-5, 1e-5);
    // v is left as it was, bit for bit.
    for r in 0..rows {
        let v = r * width + qs + kvs..(r + 1) * width;
        assert_eq!(got[v.clone()], qkv[v], "row {r}: v changed");
    }
    // A span past the row is refused.
    let gw = g.upload_weight(vector(&wk)).unwrap();
    let mut buf = g.upload_f32(&qkv).unwrap();
    let e = g
        .span_rms_norm(&mut buf, rows, width, width - 1, &gw, 1e-6)
        .unwrap_err()
        .to_string();
    assert!(e.contains("span_rms_norm"), "{e}");
}

fn check_head_norm_and_rope<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let ql = qkv_layout();
    let l = layout(None);
    let n = l.num_tokens() * ql.row_width();
    let qkv = random(n, 6, 2.0);
    let w = random(ql.head_dim, 7, 1.0);
    let (cw, gw) = (
        c.upload_weight(vector(&w)).unwrap(),
        g.upload_weight(vector(&w)).unwrap(),
    );
    let mut want = qkv.clone();
    c.head_rms_norm(&mut want, l.num_tokens(), ql, 0, ql.q_heads, &cw, 1e-6)
        .unwrap();
    c.head_rms_norm(
        &mut want,
        l.num_tokens(),
        ql,
        ql.q_heads,
        ql.kv_heads,
        &cw,
        1e-6,
    )
    .unwrap();
    let mut got = g.upload_f32(&qkv).unwrap();
    g.head_rms_norm(&mut got, l.num_tokens(), ql, 0, ql.q_heads, &gw, 1e-6)
        .unwrap();
    g.head_rms_norm(
        &mut got,
        l.num_tokens(),
        ql,
        ql.q_heads,
        ql.kv_heads,
        &gw,
        1e-6,
    )
    .unwrap();
    assert_close("head_rms_norm", &to_host(g, &got), &want, 1e-5, 1e-5);

    // RoPE at small and very large positions (angles in f64 on both sides).
    let inv_freq: Vec<f64> = (0..ql.head_dim / 2)
        .map(|i| 1.0 / 500000f64.powf(2.0 * i as f64 / ql.head_dim as f64))
        .collect();
    let far = BatchLayout::new(
        &[SeqChunk {
            tokens: vec![1, 2],
            start_pos: 131_000,
            block_table: vec![0; 8200],
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter: None,
        }],
        8200,
    )
    .unwrap();
    for l in [layout(None), far] {
        let n = l.num_tokens() * ql.row_width();
        let qkv = random(n, 8, 2.0);
        let mut want = qkv.clone();
        c.rope(
            &mut want,
            &c.upload_step(&l).unwrap(),
            ql,
            &c.rope_table(&inv_freq).unwrap(),
        )
        .unwrap();
        let step = g.upload_step(&l).unwrap();
        let mut got = g.upload_f32(&qkv).unwrap();
        g.rope(&mut got, &step, ql, &g.rope_table(&inv_freq).unwrap())
            .unwrap();
        assert_close("rope", &to_host(g, &got), &want, 2e-6, 2e-6);
    }
    // Partial RoPE: 12 of the 32 pairs turn; the rest of every head is left as it was.
    let l = layout(None);
    let qkv = random(l.num_tokens() * ql.row_width(), 10, 2.0);
    let partial = partial_freqs(12);
    let mut want = qkv.clone();
    c.rope(
        &mut want,
        &c.upload_step(&l).unwrap(),
        ql,
        &c.rope_table(&partial).unwrap(),
    )
    .unwrap();
    let step = g.upload_step(&l).unwrap();
    let mut got = g.upload_f32(&qkv).unwrap();
    g.rope(&mut got, &step, ql, &g.rope_table(&partial).unwrap())
        .unwrap();
    let got = to_host(g, &got);
    assert_close("partial rope", &got, &want, 2e-6, 2e-6);
    let (row, hd) = (ql.row_width(), ql.head_dim);
    for t in 0..l.num_tokens() {
        for h in 0..ql.q_heads + 2 * ql.kv_heads {
            let tail = t * row + h * hd + 24..t * row + (h + 1) * hd;
            assert_eq!(
                got[tail.clone()],
                qkv[tail],
                "token {t} head {h}: unturned dims"
            );
        }
    }
}

fn pools(cfg: &KvCacheConfig, c: &CpuKv) -> Vec<u16> {
    match c {
        CpuKv::BF16(v) => v.to_vec(),
        CpuKv::F32(_) => panic!("bf16 pools expected ({cfg:?})"),
    }
}

fn check_kv_writes_and_copies<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let ql = qkv_layout();
    let cfg = KvCacheConfig {
        num_blocks: 8,
        num_layers: 1,
        num_kv_heads: ql.kv_heads,
        head_dim: ql.head_dim,
        dtype: DType::BF16,
    };
    let l = layout(None);
    let qkv = random(l.num_tokens() * ql.row_width(), 9, 2.0);
    let (mut ck, mut cv) = (c.alloc_kv(&cfg).unwrap(), c.alloc_kv(&cfg).unwrap());
    c.write_kv(&qkv, &c.upload_step(&l).unwrap(), ql, &mut ck, &mut cv)
        .unwrap();
    let (mut gk, mut gv) = (g.alloc_kv(&cfg).unwrap(), g.alloc_kv(&cfg).unwrap());
    // Device pools start uninitialized (poisoned here), the CPU's zeroed: compared whole.
    for p in [gk.ptr(), gv.ptr()] {
        g.device().memset_zero(p, cfg.layer_elems() * 2).unwrap();
    }
    let step = g.upload_step(&l).unwrap();
    let gq = g.upload_f32(&qkv).unwrap();
    g.write_kv(&gq, &step, ql, &mut gk, &mut gv).unwrap();
    let read = |p| g.device().dtoh_vec::<u16>(p, cfg.layer_elems()).unwrap();
    assert_eq!(read(gk.ptr()), pools(&cfg, &ck), "K pool");
    assert_eq!(read(gv.ptr()), pools(&cfg, &cv), "V pool");

    let pairs = [(5, 6), (2, 1)];
    c.copy_blocks(&mut ck, &cfg, &pairs).unwrap();
    g.copy_blocks(&mut gk, &cfg, &pairs).unwrap();
    assert_eq!(read(gk.ptr()), pools(&cfg, &ck), "K pool after copies");
}

/// Llama 3.1 8B's RoPE: θ = 500,000, head_dim 128 and its rope_scaling (from its config).
fn llama31_inv_freq() -> Vec<f64> {
    ModelConfig::from_json(
        r#"{"architectures":["LlamaForCausalLM"],"vocab_size":128256,"hidden_size":4096,
        "intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,
        "num_key_value_heads":8,"rope_theta":500000.0,
        "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
        "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#,
    )
    .unwrap()
    .rope_inv_freq()
}

fn rope_freqs(head_dim: usize) -> Vec<f64> {
    if head_dim == 128 {
        return llama31_inv_freq();
    }
    (0..head_dim / 2)
        .map(|i| 1.0 / 1_000_000f64.powf(2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// A pool's values as f32 (bf16 pools).
fn pool_values(c: &CpuKv) -> Vec<f32> {
    match c {
        CpuKv::BF16(v) => v
            .iter()
            .map(|&b| f32::from_bits((b as u32) << 16))
            .collect(),
        CpuKv::F32(_) => panic!("bf16 pools expected"),
    }
}

fn read_pool<D: Device>(g: &CudaBackend<D>, p: lmi_cuda::DevPtr, elems: usize) -> Vec<f32> {
    let bits = g.device().dtoh_vec::<u16>(p, elems).unwrap();
    bits.iter()
        .map(|&b| f32::from_bits((b as u32) << 16))
        .collect()
}

/// The fused op of the CUDA backend (one launch) against the CPU's separate ops (the trait's
/// default: head norms, RoPE, K/V write): the q heads in `qkv` and both pools. `pad` runs the
/// GPU on the layout padded as a graph's (rows of slot NO_SLOT that must write nothing).
/// `inv_freq`: the table, `head_dim / 2` frequencies or fewer (partial RoPE).
fn fused_case<D: Device>(
    g: &CudaBackend<D>,
    ql: QkvLayout,
    norm: bool,
    l: &BatchLayout,
    pad: bool,
    inv_freq: &[f64],
) {
    let c = cpu();
    let what = format!(
        "{ql:?}, {} of {} pairs turn, q/k norms {norm}, padded {pad}",
        inv_freq.len(),
        ql.head_dim / 2
    );
    let cfg = KvCacheConfig {
        num_blocks: 8,
        num_layers: 1,
        num_kv_heads: ql.kv_heads,
        head_dim: ql.head_dim,
        dtype: DType::BF16,
    };
    let n = l.num_tokens();
    let w = ql.row_width();
    let qkv = random(n * w, 21 + ql.head_dim as u64, 3.0);
    let (qw, kw) = (random(ql.head_dim, 22, 1.5), random(ql.head_dim, 23, 1.5));
    let (cq, ck_w) = (
        c.upload_weight(vector(&qw)).unwrap(),
        c.upload_weight(vector(&kw)).unwrap(),
    );
    let (gq, gk_w) = (
        g.upload_weight(vector(&qw)).unwrap(),
        g.upload_weight(vector(&kw)).unwrap(),
    );

    let mut want = qkv.clone();
    let (mut ck, mut cv) = (c.alloc_kv(&cfg).unwrap(), c.alloc_kv(&cfg).unwrap());
    let cnorm = norm.then_some(QkNorm {
        q: &cq,
        k: &ck_w,
        eps: 1e-6,
    });
    c.qk_norm_rope_write_kv(
        &mut want,
        n,
        &c.upload_step(l).unwrap(),
        ql,
        cnorm,
        &c.rope_table(inv_freq).unwrap(),
        &mut ck,
        &mut cv,
    )
    .unwrap();

    let gl = if pad {
        g.prepare_layout(l.clone())
    } else {
        l.clone()
    };
    let gn = gl.num_tokens();
    assert!(!pad || gn > n, "{what}: the layout was not padded");
    // Padding rows hold their own values (they must stay as they are).
    let mut gqkv_host = qkv.clone();
    gqkv_host.extend(random((gn - n) * w, 24, 3.0));
    let (mut gk, mut gv) = (g.alloc_kv(&cfg).unwrap(), g.alloc_kv(&cfg).unwrap());
    for p in [gk.ptr(), gv.ptr()] {
        g.device().memset_zero(p, cfg.layer_elems() * 2).unwrap();
    }
    let step = g.upload_step(&gl).unwrap();
    let mut got = g.upload_f32(&gqkv_host).unwrap();
    let gnorm = norm.then_some(QkNorm {
        q: &gq,
        k: &gk_w,
        eps: 1e-6,
    });
    let rope = g.rope_table(inv_freq).unwrap();
    let launches = launch_count(g);
    g.qk_norm_rope_write_kv(&mut got, gn, &step, ql, gnorm, &rope, &mut gk, &mut gv)
        .unwrap();
    if let Some(after) = launch_count(g) {
        assert_eq!(after - launches.unwrap(), 1, "{what}: one launch");
    }
    let got = to_host(g, &got);
    let q = ql.q_heads * ql.head_dim;
    for t in 0..n {
        assert_close(
            &format!("{what}: q heads of token {t}"),
            &got[t * w..t * w + q],
            &want[t * w..t * w + q],
            2e-5,
            2e-5,
        );
    }
    assert_eq!(&got[n * w..], &gqkv_host[n * w..], "{what}: padding rows");
    // K went through f32 math in another order, then bf16: within one bf16 rounding.
    let elems = cfg.layer_elems();
    assert_close(
        &format!("{what}: K pool"),
        &read_pool(g, gk.ptr(), elems),
        &pool_values(&ck),
        1e-6,
        1.0 / 128.0,
    );
    assert_eq!(
        read_pool(g, gv.ptr(), elems),
        pool_values(&cv),
        "{what}: V pool"
    );
}

fn check_fused_qk_norm_rope_write_kv<D: Device>(g: &CudaBackend<D>) {
    let near = layout(None);
    // The same tokens and slots at positions past 128k.
    let mut far = layout(None);
    for (i, p) in far.positions.iter_mut().enumerate() {
        *p = 131_000 + 7 * i as u32;
    }
    // Three decode tokens (a padded batch of 4 on the GPU).
    let decode = BatchLayout::new(
        &(0..3)
            .map(|s| SeqChunk {
                tokens: vec![s + 1],
                start_pos: 17 + 9 * s as usize,
                block_table: vec![2 * s, 2 * s + 1, 6],
                window_table: Vec::new(),
                logits: LogitsWanted::Last,
                adapter: None,
            })
            .collect::<Vec<_>>(),
        8,
    )
    .unwrap();
    let shapes = [
        // Llama 3 8B's grouping at head_dim 128, Qwen3-like at 64, MHA, one KV head.
        (32, 8, 128),
        (6, 2, 64),
        (4, 4, 128),
        (3, 1, 64),
    ];
    for (q_heads, kv_heads, head_dim) in shapes {
        let ql = QkvLayout {
            q_heads,
            kv_heads,
            head_dim,
        };
        let inv_freq = rope_freqs(head_dim);
        for norm in [false, true] {
            fused_case(g, ql, norm, &near, false, &inv_freq);
            fused_case(g, ql, norm, &far, false, &inv_freq);
            fused_case(g, ql, norm, &decode, true, &inv_freq);
        }
    }
    // Partial RoPE (Qwen3.5, Qwen3-Next: a quarter of each head turns, pairing i with
    // i + pairs; the rest normalized and stored but not turned): their published head of 256
    // with 32 pairs, the fixtures' 32 with 4, and 64 with 24 (a tail that is not a multiple
    // of the warp).
    // Gemma 4's global heads of 512: 256 pairs (i, i + 256), the first 64 turning.
    let gemma4: Vec<f64> = (0..256)
        .map(|i| match i < 64 {
            true => 1.0 / 1e6f64.powf(2.0 * i as f64 / 512.0),
            false => 0.0,
        })
        .collect();
    let ql = QkvLayout {
        q_heads: 2,
        kv_heads: 1,
        head_dim: 512,
    };
    for norm in [false, true] {
        fused_case(g, ql, norm, &near, false, &gemma4);
        fused_case(g, ql, norm, &decode, true, &gemma4);
    }
    for (q_heads, kv_heads, head_dim, pairs) in [(8, 2, 256, 32), (4, 2, 32, 4), (6, 2, 64, 24)] {
        let ql = QkvLayout {
            q_heads,
            kv_heads,
            head_dim,
        };
        let inv_freq = partial_freqs(pairs);
        for norm in [false, true] {
            fused_case(g, ql, norm, &near, false, &inv_freq);
            fused_case(g, ql, norm, &decode, true, &inv_freq);
        }
    }
}

/// `pairs` frequencies of a rotary dimension of `2 · pairs` (θ 10,000), as a config with a
/// `partial_rotary_factor` makes them.
fn partial_freqs(pairs: usize) -> Vec<f64> {
    (0..pairs)
        .map(|i| 1.0 / 10_000f64.powf(i as f64 / pairs as f64))
        .collect()
}

/// cos and sin as the kernels compute them (q = [1…1 | 0…0] rotated by the fused op) against
/// f64, at every position to 4,096 and then every 61st to 131,072 (Llama 3.1's frequencies).
fn check_rope_accuracy<D: Device>(g: &CudaBackend<D>) {
    let ql = QkvLayout {
        q_heads: 1,
        kv_heads: 1,
        head_dim: 128,
    };
    let inv_freq = llama31_inv_freq();
    let positions: Vec<u32> = (0..4096).chain((4096..=131_072).step_by(61)).collect();
    let n = positions.len();
    let blocks = n.div_ceil(16);
    let mut l = BatchLayout::new(
        &[SeqChunk {
            tokens: vec![1; n],
            start_pos: 0,
            block_table: (0..blocks as u32).collect(),
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter: None,
        }],
        blocks,
    )
    .unwrap();
    l.positions = positions.clone();
    let cfg = KvCacheConfig {
        num_blocks: blocks,
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 128,
        dtype: DType::BF16,
    };
    let w = ql.row_width();
    let mut qkv = vec![0.0f32; n * w];
    for t in 0..n {
        qkv[t * w..t * w + 64].fill(1.0);
    }
    let step = g.upload_step(&l).unwrap();
    let mut buf = g.upload_f32(&qkv).unwrap();
    let (mut k, mut v) = (g.alloc_kv(&cfg).unwrap(), g.alloc_kv(&cfg).unwrap());
    let rope = g.rope_table(&inv_freq).unwrap();
    g.qk_norm_rope_write_kv(&mut buf, n, &step, ql, None, &rope, &mut k, &mut v)
        .unwrap();
    let got = to_host(g, &buf);
    let (mut worst, mut at) = (0f64, (0, 0));
    for (t, &p) in positions.iter().enumerate() {
        for (i, f) in inv_freq.iter().enumerate() {
            let (s, c) = (p as f64 * f).sin_cos();
            let e = (got[t * w + i] as f64 - c)
                .abs()
                .max((got[t * w + 64 + i] as f64 - s).abs());
            if e > worst {
                (worst, at) = (e, (p, i));
            }
        }
    }
    eprintln!(
        "RoPE cos/sin vs f64 over {n} positions to 131,072: max error {worst:.3e} \
         (position {}, pair {})",
        at.0, at.1
    );
    // An f32 ulp at 1 is 1.19e-7; the f64 value rounded to f32 is already 6e-8 off.
    assert!(worst <= 1.2e-7, "max error {worst} at {at:?}");
}

fn check_silu_add_gather<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let (rows, width) = (5, 200);
    let gu = random(rows * 2 * width, 10, 8.0);
    let mut want = c.alloc(rows * width).unwrap();
    c.silu_mul(&gu, rows, width, &mut want).unwrap();
    let ggu = g.upload_f32(&gu).unwrap();
    let mut out = g.alloc(rows * width).unwrap();
    g.silu_mul(&ggu, rows, width, &mut out).unwrap();
    assert_close("silu_mul", &to_host(g, &out), &want, 1e-6, 2e-6);
    let mut out16 = g.alloc_matmul_input(rows * width).unwrap();
    g.silu_mul(&ggu, rows, width, &mut out16).unwrap();
    assert_close(
        "silu_mul to bf16",
        &to_host(g, &out16),
        &bf16_round(&want),
        1e-6,
        1.0 / 128.0,
    );

    // Gemma's GeGLU (tanh) and embedding scale.
    let mut want = c.alloc(rows * width).unwrap();
    c.gelu_tanh_mul(&gu, rows, width, &mut want).unwrap();
    let mut out = g.alloc(rows * width).unwrap();
    g.gelu_tanh_mul(&ggu, rows, width, &mut out).unwrap();
    assert_close("gelu_tanh_mul", &to_host(g, &out), &want, 1e-6, 2e-6);
    let mut out16 = g.alloc_matmul_input(rows * width).unwrap();
    g.gelu_tanh_mul(&ggu, rows, width, &mut out16).unwrap();
    assert_close(
        "gelu_tanh_mul to bf16",
        &to_host(g, &out16),
        &bf16_round(&want),
        1e-6,
        1.0 / 128.0,
    );
    let mut want = gu.clone();
    c.scale(&mut want, 333, 33.94).unwrap();
    let mut gx = g.upload_f32(&gu).unwrap();
    g.scale(&mut gx, 333, 33.94).unwrap();
    assert_eq!(to_host(g, &gx), want, "scale");

    let (a, d) = (random(1000, 11, 1.0), random(1000, 12, 1.0));
    let mut want = a.clone();
    c.add(&mut want, &d, 1000).unwrap();
    let mut ga = g.upload_f32(&a).unwrap();
    g.add(&mut ga, &g.upload_f32(&d).unwrap(), 1000).unwrap();
    assert_eq!(to_host(g, &ga), want, "add");

    let l = layout(None);
    let x = random(l.num_tokens() * 32, 13, 1.0);
    let rows = l.logits_rows.len();
    let mut want = c.alloc(rows * 32).unwrap();
    c.gather_logit_rows(&x, &c.upload_step(&l).unwrap(), 32, &mut want)
        .unwrap();
    let step = g.upload_step(&l).unwrap();
    let mut out = g.alloc(rows * 32).unwrap();
    g.gather_logit_rows(&g.upload_f32(&x).unwrap(), &step, 32, &mut out)
        .unwrap();
    assert_eq!(to_host(g, &out), want, "gather_logit_rows");
}

/// The down projection fused with SwiGLU (kernels/mlp_down.cu, up to 8 rows) against the
/// same device's silu_mul then cuBLAS, and the CPU's: K over two 2048-wide chunks (2056) and
/// within one (40), N not a multiple of a block's 16 columns; the activations kept for a LoRA
/// only when asked; 9 rows take the unfused path.
fn check_silu_mul_down<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    for (rows, k, n) in [(1, 2056, 37), (8, 2056, 37), (3, 40, 16), (9, 40, 21)] {
        let what = format!("down projection of {rows} rows [{k} -> {n}]");
        let gu = random(rows * 2 * k, 20 + rows as u64, 4.0);
        let (_, w) = bf16_matrix(n, k, 21, 0.5);
        let (cw, gw) = (
            c.upload_weight(w.clone()).unwrap(),
            g.upload_weight(w).unwrap(),
        );
        let mut want = c.alloc(rows * n).unwrap();
        let mut cact = c.alloc_matmul_input(rows * k).unwrap();
        c.silu_mul_linear(&gu, rows, k, &cw, &mut cact, true, &mut want)
            .unwrap();
        let ggu = g.upload_f32(&gu).unwrap();
        let run = |fused_rows: usize, keep_act: bool| {
            g.set_fused_down_rows(fused_rows);
            let mut act = g.alloc_matmul_input(rows * k).unwrap();
            // bf16 NaNs, so an activation the kernel should not write shows.
            g.device()
                .htod_slice(&vec![0x7fc0u16; rows * k], act.ptr)
                .unwrap();
            let mut out = g.alloc(rows * n).unwrap();
            g.silu_mul_linear(&ggu, rows, k, &gw, &mut act, keep_act, &mut out)
                .unwrap();
            (to_host(g, &out), to_host(g, &act))
        };
        let (unfused, unfused_act) = run(0, true);
        let (fused, fused_act) = run(8, true);
        let (fused_alone, untouched) = run(8, false);
        g.set_fused_down_rows(8);
        // The same activation bits on this device; sums in another order than cuBLAS's.
        assert_eq!(fused_act, unfused_act, "{what}: activations kept");
        assert_close(&what, &fused, &unfused, 1e-4, 1e-5);
        assert_eq!(fused_alone, fused, "{what}: without the activations");
        if rows <= 8 {
            assert!(untouched.iter().all(|v| v.is_nan()), "{what}: act written");
        }
        // The CPU's f32 SwiGLU may round a few activations to the neighbouring bf16.
        assert_close(&what, &fused, &want, 2e-2, 2e-3);
    }
}

fn check_linear_and_lora<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let (k, n) = (192, 80);
    let l = layout(None);
    let rows = l.num_tokens();
    let x = bf16_round(&random(rows * k, 14, 1.0));
    let (_, w) = bf16_matrix(n, k, 15, 0.5);
    let bias = random(n, 16, 1.0);
    let (cw, gw) = (
        c.upload_weight(w.clone()).unwrap(),
        g.upload_weight(w).unwrap(),
    );
    let (cb, gb) = (
        c.upload_weight(vector(&bias)).unwrap(),
        g.upload_weight(vector(&bias)).unwrap(),
    );
    let mut want = c.alloc(rows * n).unwrap();
    c.linear(&x, rows, &cw, Some(&cb), &mut want).unwrap();
    let gx = g.upload_f32(&x).unwrap();
    let mut out = g.alloc(rows * n).unwrap();
    g.linear(&gx, rows, &gw, Some(&gb), &mut out).unwrap();
    assert_close("linear", &to_host(g, &out), &want, 1e-4, 1e-4);

    check_lora_mixed_batch(g);
}

/// One site's pair of a test adapter: A `[rank, in]` and B `[out, rank]`, bf16-exact values.
struct TestPair {
    rank: usize,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// A LoRA test adapter: a pair per site of `LORA_SITES`, None where it leaves one alone.
struct TestAdapter {
    id: u64,
    pairs: Vec<Option<TestPair>>,
}

/// (target, input width, output width, output row width, column offset): the three sites of
/// the mixed-batch check. 192 is one K split on the vector path; 2056 two splits; 2100 two
/// splits on the element-by-element path (not a multiple of 8), with an odd output width.
const LORA_SITES: [(Target, usize, usize, usize, usize); 3] = [
    (Target::Q, 192, 80, 96, 16),
    (Target::Gate, 2056, 64, 64, 0),
    (Target::Down, 2100, 75, 80, 3),
];

fn test_adapters() -> Vec<TestAdapter> {
    // Ranks differ between adapters and between an adapter's sites (1..16, two rank tiles);
    // adapter 12 leaves the last site alone.
    let ranks: [(u64, [usize; 3]); 3] = [(10, [4, 4, 8]), (11, [12, 1, 0]), (12, [16, 9, 5])];
    ranks
        .iter()
        .map(|&(id, r)| TestAdapter {
            id,
            pairs: LORA_SITES
                .iter()
                .zip(r)
                .enumerate()
                .map(|(s, (&(_, k, n, _, _), rank))| {
                    let seed = 100 + 10 * id + s as u64;
                    (rank > 0).then(|| {
                        let (a, _) = bf16_matrix(rank, k, seed, 0.5);
                        let (b, _) = bf16_matrix(n, rank, seed + 5, 0.5);
                        TestPair { rank, a, b }
                    })
                })
                .collect(),
        })
        .collect()
}

/// Uploads `adapter`'s pairs to `backend` as one layer's sites (A, B in that backend's layout).
fn upload_pairs<B: Backend>(
    backend: &B,
    adapter: &TestAdapter,
    dtype: DType,
) -> Vec<Option<(B::Weight, B::Weight)>> {
    let host = |v: &Vec<f32>, rows, cols| HostTensor::f32(vec![rows, cols], v.clone());
    adapter
        .pairs
        .iter()
        .zip(LORA_SITES)
        .map(|(p, (_, k, n, _, _))| {
            p.as_ref().map(|p| {
                backend
                    .upload_lora_pair(host(&p.a, p.rank, k), host(&p.b, n, p.rank), dtype)
                    .unwrap()
            })
        })
        .collect()
}

/// Registers one layer of `pairs` (at `LORA_SITES`' targets) under `id`.
fn register<D: Device>(
    g: &CudaBackend<D>,
    id: u64,
    pairs: &[Option<(CudaWeight<D>, CudaWeight<D>)>],
) -> Option<LoraRegistration> {
    let mut layer: LoraLayer<'_, CudaWeight<D>> = Default::default();
    for (p, (t, ..)) in pairs.iter().zip(LORA_SITES) {
        layer[t as usize] = p.as_ref().map(|(a, b)| (a, b));
    }
    g.register_lora(id, &[layer]).unwrap()
}

/// A ragged batch mixing three adapters of different ranks (one in two sequences, so its rows
/// are not contiguous) with rows that have none.
fn mixed_layout() -> BatchLayout {
    let chunk = |tokens: usize, start_pos: usize, block: u32, adapter| SeqChunk {
        tokens: (0..tokens as u32).map(|i| (i * 5 + block) % 250).collect(),
        start_pos,
        block_table: (block..block + 3).collect(),
        window_table: Vec::new(),
        logits: LogitsWanted::Last,
        adapter,
    };
    let chunks = [
        chunk(20, 0, 0, Some(10)),
        chunk(3, 30, 3, None),
        chunk(5, 4, 6, Some(12)),
        chunk(1, 40, 9, Some(11)),
        chunk(2, 7, 12, Some(10)),
        chunk(1, 9, 15, None),
    ];
    BatchLayout::new(&chunks, 18).unwrap()
}

/// Decode steps of four sequences, padded to a graph size: adapters 12, none, 10, 11, 12.
fn decode_layout() -> BatchLayout {
    let chunks: Vec<SeqChunk> = [Some(12), None, Some(10), Some(11), Some(12)]
        .into_iter()
        .enumerate()
        .map(|(s, adapter)| SeqChunk {
            tokens: vec![s as u32 + 1],
            start_pos: 17 + s,
            block_table: vec![2 * s as u32, 2 * s as u32 + 1],
            window_table: Vec::new(),
            logits: LogitsWanted::Last,
            adapter,
        })
        .collect();
    BatchLayout::new(&chunks, 18).unwrap()
}

/// LoRA through the `Backend` trait on mixed batches: every row gets its own adapter's delta
/// (or none) at each site, as the CPU computes it; columns outside the projection's slice,
/// rows without an adapter and padding rows are left alone. On the GPU every site is one
/// shrink and one expand launch whatever the mix.
fn check_lora_mixed_batch<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let adapters = test_adapters();
    let cpu_pairs: Vec<_> = adapters
        .iter()
        .map(|a| upload_pairs(&c, a, DType::F32))
        .collect();
    let gpu_pairs: Vec<_> = adapters
        .iter()
        .map(|a| upload_pairs(g, a, DType::BF16))
        .collect();
    let registrations: Vec<_> = adapters
        .iter()
        .zip(&gpu_pairs)
        .map(|(a, p)| register(g, a.id, p))
        .collect();
    assert!(registrations.iter().all(Option::is_some));

    for (name, layout) in [
        ("ragged", mixed_layout()),
        ("padded decode", g.prepare_layout(decode_layout())),
    ] {
        let rows = layout.num_tokens();
        let adapter_of = |r: usize| {
            layout
                .adapter_rows
                .iter()
                .find(|(_, rs)| rs.contains(&(r as u32)))
                .map(|(id, _)| *id)
        };
        let gstep = g.upload_step(&layout).unwrap();
        let cstep = c.upload_step(&layout).unwrap();
        for (s, &(target, k, n, width, offset)) in LORA_SITES.iter().enumerate() {
            let what = format!("{name} LoRA, {target:?} [{k} -> {n}]");
            let site = LoraSite { layer: 0, target };
            let x = bf16_round(&random(rows * k, 20 + s as u64, 1.0));
            let base = random(rows * width, 30 + s as u64, 1.0);
            // (group, adapter): group i is adapter_rows[i]; an adapter without a pair here
            // has no group.
            let picked: Vec<(usize, usize)> = layout
                .adapter_rows
                .iter()
                .enumerate()
                .filter_map(|(gi, (id, _))| {
                    let ai = adapters.iter().position(|a| a.id == *id).unwrap();
                    adapters[ai].pairs[s].is_some().then_some((gi, ai))
                })
                .collect();
            let cgroups: Vec<LoraGroup<'_, CpuBackend>> = picked
                .iter()
                .map(|&(gi, ai)| {
                    let (a, b) = cpu_pairs[ai][s].as_ref().unwrap();
                    LoraGroup { group: gi, a, b }
                })
                .collect();
            let ggroups: Vec<LoraGroup<'_, CudaBackend<D>>> = picked
                .iter()
                .map(|&(gi, ai)| {
                    let (a, b) = gpu_pairs[ai][s].as_ref().unwrap();
                    LoraGroup { group: gi, a, b }
                })
                .collect();
            let mut want = base.clone();
            c.lora(&x, k, &cstep, site, &cgroups, &mut want, width, offset)
                .unwrap();
            let gx = g.upload_f32(&x).unwrap();
            let mut out = g.upload_f32(&base).unwrap();
            let launches = launch_count(g);
            g.lora(&gx, k, &gstep, site, &ggroups, &mut out, width, offset)
                .unwrap();
            if let Some(before) = launches {
                assert_eq!(launch_count(g).unwrap() - before, 2, "{what}: launches");
            }
            let got = to_host(g, &out);
            assert_close(&what, &got, &want, 1e-4, 1e-4);
            let mut changed = 0;
            for r in 0..rows {
                let (row, base_row) = (&got[r * width..][..width], &base[r * width..][..width]);
                let outside = row[..offset].iter().chain(&row[offset + n..]);
                let base_outside = base_row[..offset].iter().chain(&base_row[offset + n..]);
                assert!(
                    outside.eq(base_outside),
                    "{what}: row {r} outside the slice"
                );
                let has_pair = adapter_of(r)
                    .is_some_and(|id| adapters.iter().any(|a| a.id == id && a.pairs[s].is_some()));
                if has_pair {
                    changed += usize::from(row != base_row);
                } else {
                    assert_eq!(row, base_row, "{what}: row {r} has no adapter here");
                }
            }
            assert!(changed > 0, "{what}: no row changed");
        }
    }

    // An adapter's pair the table does not hold, and an unknown adapter, are refused.
    let layout = mixed_layout();
    let gstep = g.upload_step(&layout).unwrap();
    let (k, width) = (LORA_SITES[0].1, LORA_SITES[0].3);
    let x = g.upload_f32(&vec![0.0; layout.num_tokens() * k]).unwrap();
    let mut out = g
        .upload_f32(&vec![0.0; layout.num_tokens() * width])
        .unwrap();
    let (a, b) = gpu_pairs[1][0].as_ref().unwrap();
    let wrong = [LoraGroup { group: 0, a, b }];
    let site = LoraSite {
        layer: 0,
        target: Target::Q,
    };
    let e = g
        .lora(&x, k, &gstep, site, &wrong, &mut out, width, 16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not the pair registered"), "{e}");
    drop(registrations);
    let e = g.upload_step(&layout).unwrap_err().to_string();
    assert!(e.contains("LoRA adapter 10 is not loaded"), "{e}");
}

/// Launches so far, on the emulator (the fake driver does not count them).
fn launch_count<D: Device>(g: &CudaBackend<D>) -> Option<u64> {
    let dev: &dyn std::any::Any = g.device().as_ref();
    dev.downcast_ref::<EmuDevice>().map(EmuDevice::launch_count)
}

#[test]
fn embedding() {
    on_every_device!(check_embedding);
}

#[test]
fn rms_norms() {
    on_every_device!(check_rms_norms);
}

#[test]
fn span_rms_norm() {
    on_every_device!(check_span_rms_norm);
}

#[test]
fn head_norm_and_rope() {
    on_every_device!(check_head_norm_and_rope);
}

#[test]
fn kv_writes_and_block_copies() {
    on_every_device!(check_kv_writes_and_copies);
}

#[test]
fn silu_add_and_gather() {
    on_every_device!(check_silu_add_gather);
}

#[test]
fn silu_mul_down_projection() {
    on_every_device!(check_silu_mul_down);
}

#[test]
fn linear_and_lora() {
    on_every_device!(check_linear_and_lora);
}

#[test]
fn fused_qk_norm_rope_write_kv() {
    on_every_device!(check_fused_qk_norm_rope_write_kv);
}

#[test]
fn rope_is_accurate_to_128k_positions() {
    on_every_device!(check_rope_accuracy);
}
