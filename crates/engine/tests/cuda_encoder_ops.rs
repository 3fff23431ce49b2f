//! The encoder's ops on the CUDA backend (`layer_norm`, `gelu`, `gather_add`,
//! `encoder_attention`: kernels/norm.cu, activation.cu, encoder.cu) against plain f64
//! references written here from the formulas (BERT's LayerNorm, erf and tanh GELU, softmax
//! attention) and against the CPU backend's ops, through the `Backend` trait, on the CPU
//! emulator in both thread orders and on the driver's device (a GPU, or the fake driver). Attention runs ragged sequences (1, 7, 33
//! and 128 tokens, an empty one, one of 512) with heads of 8, 20, 32, 64 and 128, into f32 and
//! bf16 outputs; rows outside every sequence are left as they were.

mod cuda_common;

use cuda_common::{assert_close, bf16_round, cpu, random, to_host};
use lmi_checkpoint::weights::HostTensor;
use lmi_cuda::Device;
use lmi_engine::Backend;
use lmi_engine::cuda::{CudaBackend, CudaBuf};

fn vector(v: &[f32]) -> HostTensor {
    HostTensor::f32(vec![v.len()], v.to_vec())
}

/// LayerNorm of each row in f64: (x − mean) / sqrt(var + eps) · w + b, var the biased one.
fn layer_norm_ref(x: &[f32], width: usize, w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    x.chunks(width)
        .flat_map(|row| {
            let n = width as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (var + eps as f64).sqrt();
            row.iter()
                .zip(w.iter().zip(b))
                .map(move |(&v, (&w, &b))| ((v as f64 - mean) * inv * w as f64 + b as f64) as f32)
        })
        .collect()
}

/// erf from its series e^{−z²} · 2/√π · Σ 2ⁿ z^{2n+1} / (1·3···(2n+1)): every term positive,
/// so nothing cancels (exact to f64 rounding for the |z| < 6 used here).
fn erf(z: f64) -> f64 {
    if z < 0.0 {
        return -erf(-z);
    }
    let (mut term, mut sum) = (z, z);
    for n in 1..400 {
        term *= 2.0 * z * z / (2 * n + 1) as f64;
        sum += term;
        if term < sum * 1e-18 {
            break;
        }
    }
    (sum * (-z * z).exp() * 2.0 / std::f64::consts::PI.sqrt()).min(1.0)
}

fn gelu_ref(x: f32, tanh: bool) -> f32 {
    let x = x as f64;
    let y = if tanh {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh())
    } else {
        0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
    };
    y as f32
}

fn check_layer_norm<D: Device>(g: &CudaBackend<D>) {
    for (rows, width, offset) in [(1, 8, 0.0), (5, 96, 0.0), (3, 384, 100.0), (2, 1030, -3.0)] {
        // A large mean (offset) checks the variance is taken about the mean, not E[x²] − m².
        let x: Vec<f32> = random(rows * width, 11, 2.0)
            .iter()
            .map(|v| v + offset)
            .collect();
        let w = random(width, 12, 1.5);
        let bias = random(width, 13, 0.5);
        let want = layer_norm_ref(&x, width, &w, &bias, 1e-12);
        // The CPU sums a row in sixteen lanes, the device in a tree: a mean of `offset`
        // rounds to ~|offset| · 2⁻²⁴ · √width in f32, which (x − mean) carries into every
        // output (seen on the CPU: 2.6e-5 at offset 100).
        let cpu_tol = 2e-5 + 1e-6 * offset.abs();
        let c = cpu();
        let mut on_cpu = c.alloc(rows * width).unwrap();
        let (cw, cb) = (
            c.upload_weight(vector(&w)).unwrap(),
            c.upload_weight(vector(&bias)).unwrap(),
        );
        c.layer_norm(&x, rows, &cw, &cb, 1e-12, &mut on_cpu)
            .unwrap();
        assert_close("layer_norm on the CPU", &on_cpu, &want, cpu_tol, 2e-5);
        let (gw, gb) = (
            g.upload_weight(vector(&w)).unwrap(),
            g.upload_weight(vector(&bias)).unwrap(),
        );
        let gx = g.upload_f32(&x).unwrap();
        let mut out = g.alloc(rows * width).unwrap();
        g.layer_norm(&gx, rows, &gw, &gb, 1e-12, &mut out).unwrap();
        assert_close("layer_norm", &to_host(g, &out), &want, 2e-5, 2e-5);
        assert_close(
            "layer_norm against the CPU",
            &to_host(g, &out),
            &on_cpu,
            cpu_tol,
            2e-5,
        );
        let mut out16 = g.alloc_matmul_input(rows * width).unwrap();
        g.layer_norm(&gx, rows, &gw, &gb, 1e-12, &mut out16)
            .unwrap();
        assert_close(
            "layer_norm to bf16",
            &to_host(g, &out16),
            &bf16_round(&on_cpu),
            cpu_tol,
            1.0 / 128.0,
        );
    }
    // The eps matters for a constant row: (x − mean) = 0, so out = b exactly.
    let w = random(64, 14, 1.0);
    let bias = random(64, 15, 1.0);
    let (gw, gb) = (
        g.upload_weight(vector(&w)).unwrap(),
        g.upload_weight(vector(&bias)).unwrap(),
    );
    let gx = g.upload_f32(&[3.25; 64]).unwrap();
    let mut out = g.alloc(64).unwrap();
    g.layer_norm(&gx, 1, &gw, &gb, 1e-5, &mut out).unwrap();
    assert_eq!(
        to_host(g, &out),
        bias,
        "a constant row normalizes to the bias"
    );
    // A bias of another width is refused.
    let short = g.upload_weight(vector(&bias[..63])).unwrap();
    assert!(g.layer_norm(&gx, 1, &gw, &short, 1e-5, &mut out).is_err());
}

#[test]
fn layer_norm_matches_the_formula() {
    on_every_device!(check_layer_norm);
}

fn check_gelu<D: Device>(g: &CudaBackend<D>) {
    let mut x = random(3000, 21, 6.0);
    x.extend([0.0, -0.0, 1e-20, -1e-20, 20.0, -20.0, 9.5, -9.5, 0.5, -0.5]);
    for tanh in [false, true] {
        let want: Vec<f32> = x.iter().map(|&v| gelu_ref(v, tanh)).collect();
        let mut buf = g.upload_f32(&x).unwrap();
        // Only the first `len` values change.
        let len = x.len() - 3;
        g.gelu(&mut buf, len, tanh).unwrap();
        let got = to_host(g, &buf);
        let what = if tanh { "gelu (tanh)" } else { "gelu (erf)" };
        assert_close(what, &got[..len], &want[..len], 1e-6, 2e-6);
        let mut on_cpu = x.clone();
        cpu().gelu(&mut on_cpu, len, tanh).unwrap();
        assert_close(
            &format!("{what} against the CPU"),
            &got,
            &on_cpu,
            2e-6,
            4e-6,
        );
        assert_eq!(got[len..], x[len..], "{what}: values past len");
    }
    // The two forms differ by far more than the tolerance (up to ~2e-4 near |x| = 2.4), so
    // each check above tells them apart.
    let apart = x
        .iter()
        .map(|&v| (gelu_ref(v, false) - gelu_ref(v, true)).abs())
        .fold(0.0, f32::max);
    assert!(apart > 1e-4, "the forms differ by {apart} at most");
}

#[test]
fn gelu_matches_the_erf_and_tanh_formulas() {
    on_every_device!(check_gelu);
}

fn check_gather_add<D: Device>(g: &CudaBackend<D>) {
    let (rows, width) = (40, 72);
    let table = bf16_round(&random(rows * width, 31, 1.0));
    let ids: Vec<u32> = [0, 39, 5, 5, 17, 0, 1, 38, 2]
        .into_iter()
        .chain(0..40)
        .collect();
    let base = random(ids.len() * width, 32, 3.0);
    let want: Vec<f32> = base
        .chunks(width)
        .zip(&ids)
        .flat_map(|(row, &id)| {
            let t = &table[id as usize * width..][..width];
            row.iter().zip(t).map(|(a, b)| a + b).collect::<Vec<_>>()
        })
        .collect();
    // A matrix uploads as bf16 (the values are bf16 already, so exactly); the router's upload
    // keeps f32: both table types.
    let tensor = || HostTensor::f32(vec![rows, width], table.clone());
    let c = cpu();
    for (on_cpu, w) in [
        (
            c.upload_weight(tensor()).unwrap(),
            g.upload_weight(tensor()).unwrap(),
        ),
        (
            c.upload_router(tensor()).unwrap(),
            g.upload_router(tensor()).unwrap(),
        ),
    ] {
        let mut cpu_out = base.clone();
        c.gather_add(&on_cpu, &ids, &mut cpu_out).unwrap();
        assert_eq!(cpu_out, want, "the CPU, {:?} table", w.dtype);
        let mut out = g.upload_f32(&base).unwrap();
        g.gather_add(&w, &ids, &mut out).unwrap();
        assert_eq!(to_host(g, &out), want, "{:?} table", w.dtype);
        let mut out = g.upload_f32(&base).unwrap();
        let err = g.gather_add(&w, &[3, 40], &mut out).unwrap_err();
        assert!(
            err.to_string().contains("outside a table of 40 rows"),
            "{err}"
        );
    }
}

#[test]
fn gather_add_adds_the_rows_of_the_ids() {
    on_every_device!(check_gather_add);
}

/// Attention of each sequence `cu[s] .. cu[s + 1]` in f64 (rows outside them are zeros).
fn attention_ref(qkv: &[f32], cu: &[u32], heads: usize, hd: usize, scale: f32) -> Vec<f32> {
    let width = heads * hd;
    let rows = *cu.last().unwrap() as usize;
    let at = |t: usize, part: usize, h: usize, i: usize| {
        qkv[t * 3 * width + part * width + h * hd + i] as f64
    };
    let mut out = vec![0f32; rows * width];
    for s in cu.windows(2) {
        let (first, end) = (s[0] as usize, s[1] as usize);
        for h in 0..heads {
            for t in first..end {
                let scores: Vec<f64> = (first..end)
                    .map(|j| {
                        scale as f64
                            * (0..hd)
                                .map(|i| at(t, 0, h, i) * at(j, 1, h, i))
                                .sum::<f64>()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = p.iter().sum();
                for i in 0..hd {
                    let o: f64 = (first..end).zip(&p).map(|(j, p)| p * at(j, 2, h, i)).sum();
                    out[t * width + h * hd + i] = (o / sum) as f32;
                }
            }
        }
    }
    out
}

/// One attention case into an f32 and a bf16 output, both prefilled with a sentinel so rows
/// outside the sequences can be seen untouched.
fn attention_case<D: Device>(
    g: &CudaBackend<D>,
    lens: &[u32],
    first: u32,
    heads: usize,
    hd: usize,
    scale: f32,
    seed: u64,
) {
    let mut cu = vec![first];
    for &l in lens {
        cu.push(cu.last().unwrap() + l);
    }
    let rows = *cu.last().unwrap() as usize;
    let width = heads * hd;
    let qkv = random(rows * 3 * width, seed, 1.5);
    let want = attention_ref(&qkv, &cu, heads, hd, scale);
    let gqkv = g.upload_f32(&qkv).unwrap();
    let sentinel = 7.5f32;
    let what =
        format!("encoder attention, lengths {lens:?} from row {first}, {heads} heads of {hd}");
    let outside = |t: usize| cu[0] as usize > t;

    let mut out = g.upload_f32(&vec![sentinel; rows * width]).unwrap();
    g.encoder_attention(&gqkv, &cu, heads, hd, scale, &mut out)
        .unwrap();
    let got = to_host(g, &out);
    let mut expect = want.clone();
    for (t, row) in expect.chunks_mut(width).enumerate() {
        if outside(t) {
            row.fill(sentinel);
        }
    }
    assert_close(&what, &got, &expect, 2e-5, 1e-4);
    let mut on_cpu = vec![sentinel; rows * width];
    cpu()
        .encoder_attention(&qkv, &cu, heads, hd, scale, &mut on_cpu)
        .unwrap();
    assert_close(&format!("{what}, the CPU"), &on_cpu, &expect, 2e-5, 1e-4);
    assert_close(
        &format!("{what}, against the CPU"),
        &got,
        &on_cpu,
        2e-5,
        1e-4,
    );

    let mut out16 = g.alloc_matmul_input(rows * width).unwrap();
    bf16_fill(g, &out16, sentinel);
    g.encoder_attention(&gqkv, &cu, heads, hd, scale, &mut out16)
        .unwrap();
    assert_close(
        &format!("{what}, bf16"),
        &to_host(g, &out16),
        &bf16_round(&on_cpu),
        1e-5,
        1.0 / 128.0,
    );
}

/// Fills a bf16 buffer with `v` (exact in bf16) through the layer norm of a constant row:
/// its output is the bias.
fn bf16_fill<D: Device>(g: &CudaBackend<D>, buf: &CudaBuf, v: f32) {
    let width = buf.len;
    let w = g.upload_weight(vector(&vec![1.0; width])).unwrap();
    let b = g.upload_weight(vector(&vec![v; width])).unwrap();
    let x = g.upload_f32(&vec![0.0; width]).unwrap();
    let mut out = *buf;
    g.layer_norm(&x, 1, &w, &b, 1e-5, &mut out).unwrap();
}

fn check_attention<D: Device>(g: &CudaBackend<D>) {
    let ragged = [1, 7, 33, 128];
    for (heads, hd, seed) in [
        (3, 8, 41),
        (2, 20, 42),
        (4, 32, 43),
        (2, 64, 44),
        (2, 128, 45),
    ] {
        let scale = 1.0 / (hd as f32).sqrt();
        attention_case(g, &ragged, 0, heads, hd, scale, seed);
    }
    // An empty sequence among others, rows before the first sequence, another scale.
    attention_case(g, &[33, 0, 7, 1], 5, 3, 64, 0.3, 46);
    // BERT's longest sequence: sixteen chunks of keys.
    attention_case(g, &[512], 0, 1, 64, 0.125, 47);
}

#[test]
fn encoder_attention_matches_softmax_attention_per_sequence() {
    on_every_device!(check_attention);
}

fn check_attention_refusals<D: Device>(g: &CudaBackend<D>) {
    let qkv = g.upload_f32(&random(4 * 3 * 2 * 136, 51, 1.0)).unwrap();
    let mut out = g.alloc(4 * 2 * 136).unwrap();
    let e = g
        .encoder_attention(&qkv, &[0, 4], 2, 136, 0.1, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("use --device cpu"), "{e}");
    let e = g
        .encoder_attention(&qkv, &[0, 4], 2, 6, 0.1, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("a multiple of 4"), "{e}");
    let e = g
        .encoder_attention(&qkv, &[0, 3, 2], 2, 64, 0.1, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("decrease"), "{e}");
    let e = g
        .encoder_attention(&qkv, &[0, 40], 2, 64, 0.1, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("needs"), "{e}");
}

#[test]
fn encoder_attention_refuses_what_it_cannot_run() {
    on_every_device!(check_attention_refusals);
}

#[test]
fn the_cuda_backend_runs_encoders() {
    let b = CudaBackend::with_graphs(
        cuda_common::emulator(lmi_cuda_emu::ThreadOrder::Forward),
        false,
    )
    .unwrap();
    assert!(b.supports(lmi_engine::backend::Feature::Encoder));
}

#[test]
fn the_reference_erf_is_right() {
    // erf(0.5), erf(1), erf(2), erf(3.5) to 16 digits (Abramowitz & Stegun, Table 7.1).
    for (z, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.5, 0.999_999_256_901_627_7),
    ] {
        assert!((erf(z) - want).abs() < 1e-15, "erf({z}) = {}", erf(z));
    }
}
