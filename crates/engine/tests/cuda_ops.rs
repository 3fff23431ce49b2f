//! Every CUDA backend op (kernels/*.cu and their launches) against the CPU backend's, through
//! the `Backend` trait: on the CPU emulator in both thread orders, and on a GPU when present.
//! Inputs are rounded to bf16 where the GPU keeps bf16, so the two sides see the same values
//! and differ only by summation order.

mod cuda_common;

use cuda_common::{assert_close, bf16_round, cpu, random, to_host};
use lmi_cuda::{Device, DeviceExt};
use lmi_engine::backend::{LoraGroup, QkvLayout};
use lmi_engine::cpu::CpuKv;
use lmi_engine::cuda::CudaBackend;
use lmi_engine::weights::HostTensor;
use lmi_engine::{Backend, BatchLayout, DType, KvCacheConfig, LogitsWanted, SeqChunk};

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
            logits: LogitsWanted::Last,
            adapter,
        },
        SeqChunk {
            tokens: vec![11, 12, 13],
            start_pos: 30,
            block_table: vec![0, 7, 3],
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

fn check_linear_and_lora<D: Device>(g: &CudaBackend<D>) {
    let c = cpu();
    let (k, n) = (192, 80);
    let l = layout(Some(3));
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
    let step = g.upload_step(&l).unwrap();
    let gx = g.upload_f32(&x).unwrap();
    let mut out = g.alloc(rows * n).unwrap();
    g.linear(&gx, rows, &gw, Some(&gb), &mut out).unwrap();
    assert_close("linear", &to_host(g, &out), &want, 1e-4, 1e-4);

    // LoRA on the adapter's rows into a column slice of a wider output, each backend's pair
    // in its own layout: f32 on the CPU (an f32 model's), bf16 on the GPU, from bf16-exact
    // values so both see the same numbers.
    let rank = 8;
    let (av, _) = bf16_matrix(rank, k, 17, 0.5);
    let (bv, _) = bf16_matrix(n, rank, 18, 0.5);
    let host = |v: &Vec<f32>, rows, cols| HostTensor::f32(vec![rows, cols], v.clone());
    let (ca, cb) = c
        .upload_lora_pair(host(&av, rank, k), host(&bv, n, rank), DType::F32)
        .unwrap();
    let (ga, gb) = g
        .upload_lora_pair(host(&av, rank, k), host(&bv, n, rank), DType::BF16)
        .unwrap();
    let width = n + 16;
    let base = random(rows * width, 19, 1.0);
    let mut want = base.clone();
    let group = |a, b| LoraGroup { group: 0, a, b };
    c.lora(
        &x,
        k,
        &c.upload_step(&l).unwrap(),
        &[group(&ca, &cb)],
        &mut want,
        width,
        16,
    )
    .unwrap();
    let mut out = g.upload_f32(&base).unwrap();
    let ggroup = LoraGroup {
        group: 0,
        a: &ga,
        b: &gb,
    };
    g.lora(&gx, k, &step, &[ggroup], &mut out, width, 16)
        .unwrap();
    assert_close("lora", &to_host(g, &out), &want, 1e-4, 1e-4);
    let untouched: Vec<f32> = to_host(g, &out)[rows * width - width..][..16].to_vec();
    assert_eq!(
        untouched,
        base[rows * width - width..][..16],
        "columns outside the slice"
    );
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
fn linear_and_lora() {
    on_every_device!(check_linear_and_lora);
}
