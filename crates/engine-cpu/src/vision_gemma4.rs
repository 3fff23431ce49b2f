//! Gemma 4's vision tower run on the host in f32 over its host weights
//! ([`Gemma4Tower`]), as transformers' `Gemma4VisionModel` and `Gemma4MultimodalEmbedder` run
//! it on one image: every patch attends to every other (the processor's padding rows are
//! never made, so nothing is masked).

use lmi_engine_core::vision::gemma4::{ClipLinear, Gemma4Tower, Layer};
use lmi_engine_core::vision::{VisionAct, VisionConfig, VisionInput};
use lmi_engine_core::{EngineError, Result};
use rayon::prelude::*;

use crate::linear;
use crate::vision::{gelu, gelu_tanh};

/// The image's embeddings in the language model's width, `[input.tokens(), out_hidden_size]`,
/// in the order of its soft tokens (the pooled grid row by row).
pub fn forward(cfg: &VisionConfig, t: &Gemma4Tower, input: &VisionInput) -> Result<Vec<f32>> {
    let [frames, rows, cols] = input.grid_thw;
    let k = cfg.spatial_merge_size;
    let h = cfg.hidden_size;
    let n = rows * cols;
    let patch_dim = cfg.in_chans * cfg.patch_size * cfg.patch_size;
    let side = t.g.position_embedding_size;
    if frames != 1
        || input.merge_size != k
        || !rows.is_multiple_of(k)
        || !cols.is_multiple_of(k)
        || input.pixels.len() != n * patch_dim
        || rows > side
        || cols > side
    {
        return Err(EngineError::Batch(format!(
            "an image's patches ({} values, grid {:?}, pooling {}) do not fit Gemma 4's vision \
             tower ({patch_dim} values a patch, pooling {k}, at most {side} patches a side)",
            input.pixels.len(),
            input.grid_thw,
            input.merge_size
        )));
    }
    let eps = t.g.rms_norm_eps as f32;
    // The model's own `2 · (x - 0.5)`, then the patch embedding and both axes' positions.
    let pixels: Vec<f32> = input.pixels.iter().map(|&v| 2.0 * (v - 0.5)).collect();
    let mut x = vec![0f32; n * h];
    linear(&pixels, n, patch_dim, &t.input_proj, h, None, &mut x);
    x.par_chunks_mut(h).enumerate().for_each(|(i, row)| {
        let (r, c) = (i / cols, i % cols);
        let px = &t.positions[c * h..(c + 1) * h];
        let py = &t.positions[(side + r) * h..(side + r + 1) * h];
        for ((v, a), b) in row.iter_mut().zip(px).zip(py) {
            *v += a + b;
        }
    });
    let (cos, sin) = rotary(rows, cols, t.g.head_dim, cfg.rope_theta);
    let mut normed = vec![0f32; n * h];
    let mut out = vec![0f32; n * h];
    for l in &t.layers {
        rms_norm(&x, h, Some(&l.input_norm), eps, &mut normed);
        attention(cfg, t, l, &normed, n, &cos, &sin, eps, &mut out);
        rms_norm_in_place(&mut out, h, &l.post_attention_norm, eps);
        x.par_iter_mut().zip(&out).for_each(|(x, d)| *x += d);
        rms_norm(&x, h, Some(&l.pre_feedforward_norm), eps, &mut normed);
        mlp(cfg, l, &normed, n, &mut out);
        rms_norm_in_place(&mut out, h, &l.post_feedforward_norm, eps);
        x.par_iter_mut().zip(&out).for_each(|(x, d)| *x += d);
    }
    // k x k average pooling over the patch grid, then √hidden and the standardization.
    let (pr, pc) = (rows / k, cols / k);
    let tokens = pr * pc;
    let mut pooled = vec![0f32; tokens * h];
    let root = (h as f64).sqrt() as f32;
    let inv = 1.0 / (k * k) as f32;
    pooled.par_chunks_mut(h).enumerate().for_each(|(j, o)| {
        let (r0, c0) = ((j / pc) * k, (j % pc) * k);
        for r in r0..r0 + k {
            for c in c0..c0 + k {
                let row = &x[(r * cols + c) * h..(r * cols + c + 1) * h];
                for (o, &v) in o.iter_mut().zip(row) {
                    *o += v * inv;
                }
            }
        }
        for (i, o) in o.iter_mut().enumerate() {
            *o *= root;
            if let Some((bias, scale)) = &t.std {
                *o = (*o - bias[i]) * scale[i];
            }
        }
    });
    // The multimodal embedder: a weightless RMSNorm, then the projection.
    let mut normed = vec![0f32; tokens * h];
    rms_norm(&pooled, h, None, eps, &mut normed);
    let lm = cfg.out_hidden_size;
    let mut emb = vec![0f32; tokens * lm];
    linear(&normed, tokens, h, &t.embed_proj, lm, None, &mut emb);
    Ok(emb)
}

/// Gemma 4's RMSNorm: `x · (mean(x²) + eps)^-0.5 · w` (no weight: `with_scale = False`).
fn rms_norm(x: &[f32], h: usize, w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    out.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .for_each(|(o, x)| norm_row(x, w, eps, o));
}

fn rms_norm_in_place(x: &mut [f32], h: usize, w: &[f32], eps: f32) {
    x.par_chunks_mut(h).for_each(|row| {
        let src = row.to_vec();
        norm_row(&src, Some(w), eps, row);
    });
}

fn norm_row(x: &[f32], w: Option<&[f32]>, eps: f32, o: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = (ss + eps).powf(-0.5);
    for (i, (o, &v)) in o.iter_mut().zip(x).enumerate() {
        *o = v * inv * w.map_or(1.0, |w| w[i]);
    }
}

fn clip_linear(l: &ClipLinear, x: &[f32], rows: usize, out: &mut [f32]) {
    match l.clip {
        None => linear(x, rows, l.k, &l.w, l.n, None, out),
        Some([lo, hi, out_lo, out_hi]) => {
            let x: Vec<f32> = x.iter().map(|&v| v.clamp(lo, hi)).collect();
            linear(&x, rows, l.k, &l.w, l.n, None, out);
            out.iter_mut().for_each(|v| *v = v.clamp(out_lo, out_hi));
        }
    }
}

fn mlp(cfg: &VisionConfig, l: &Layer, x: &[f32], n: usize, out: &mut [f32]) {
    let inter = l.gate.n;
    let mut g = vec![0f32; n * inter];
    let mut u = vec![0f32; n * inter];
    clip_linear(&l.gate, x, n, &mut g);
    clip_linear(&l.up, x, n, &mut u);
    let act = cfg.act;
    g.par_iter_mut().zip(&u).for_each(|(g, &u)| {
        *g = match act {
            VisionAct::GeluTanh => gelu_tanh(*g),
            VisionAct::Gelu => gelu(*g),
        } * u
    });
    clip_linear(&l.down, &g, n, out);
}

/// cos and sin per patch, `[patches, head_dim / 2]`: the first `head_dim / 4` angles turn
/// with the patch's column (x), the next with its row (y), at `theta^(-4i / head_dim)`.
fn rotary(rows: usize, cols: usize, head_dim: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let quarter = head_dim / 4;
    let spatial = (head_dim / 2) as f32;
    let inv: Vec<f32> = (0..quarter)
        .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / spatial))
        .collect();
    let mut cos = Vec::with_capacity(rows * cols * 2 * quarter);
    let mut sin = Vec::with_capacity(rows * cols * 2 * quarter);
    for r in 0..rows {
        for c in 0..cols {
            for pos in [c as f32, r as f32] {
                for f in &inv {
                    let a = pos * f;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
    }
    (cos, sin)
}

/// Query rows per block of attention scores.
const BLOCK: usize = 128;

/// RoPE over one head: each half (x, then y) rotated as `rotate_half` within it.
fn rope_head(v: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = v.len() / 2;
    let quarter = half / 2;
    for part in 0..2 {
        let seg = &mut v[part * half..(part + 1) * half];
        let (cs, sn) = (
            &cos[part * quarter..(part + 1) * quarter],
            &sin[part * quarter..(part + 1) * quarter],
        );
        for i in 0..quarter {
            let (a, b) = (seg[i], seg[i + quarter]);
            seg[i] = a * cs[i] - b * sn[i];
            seg[i + quarter] = b * cs[i] + a * sn[i];
        }
    }
}

/// Self-attention over all `n` patches: q/k normed per head and rotated, v normed without a
/// weight, scores unscaled, grouped K/V heads.
#[allow(clippy::too_many_arguments)]
fn attention(
    cfg: &VisionConfig,
    t: &Gemma4Tower,
    l: &Layer,
    x: &[f32],
    n: usize,
    cos: &[f32],
    sin: &[f32],
    eps: f32,
    out: &mut [f32],
) {
    let d = t.g.head_dim;
    let (heads, kv_heads) = (cfg.num_heads, t.g.num_kv_heads);
    let (qw, kw) = (heads * d, kv_heads * d);
    let mut q = vec![0f32; n * qw];
    let mut k = vec![0f32; n * kw];
    let mut v = vec![0f32; n * kw];
    clip_linear(&l.q, x, n, &mut q);
    clip_linear(&l.k, x, n, &mut k);
    clip_linear(&l.v, x, n, &mut v);
    let half = d / 2;
    // Norms and RoPE per (patch, head).
    let norm_rope = |buf: &mut [f32], width: usize, w: Option<&[f32]>, rotate: bool| {
        buf.par_chunks_mut(width).enumerate().for_each(|(i, row)| {
            for head in row.chunks_mut(d) {
                let src = head.to_vec();
                norm_row(&src, w, eps, head);
                if rotate {
                    rope_head(
                        head,
                        &cos[i * half..(i + 1) * half],
                        &sin[i * half..(i + 1) * half],
                    );
                }
            }
        });
    };
    norm_rope(&mut q, qw, Some(&l.q_norm), true);
    norm_rope(&mut k, kw, Some(&l.k_norm), true);
    norm_rope(&mut v, kw, None, false);
    let group = heads / kv_heads.max(1);
    let results: Vec<Vec<f32>> = (0..heads)
        .into_par_iter()
        .map(|hd| {
            let kh = hd / group;
            let gather = |buf: &[f32], width: usize, h: usize| -> Vec<f32> {
                (0..n)
                    .flat_map(|i| buf[i * width + h * d..i * width + (h + 1) * d].to_vec())
                    .collect()
            };
            let qh = gather(&q, qw, hd);
            let kh_ = gather(&k, kw, kh);
            let vh = gather(&v, kw, kh);
            let mut vt = vec![0f32; d * n];
            for i in 0..n {
                for j in 0..d {
                    vt[j * n + i] = vh[i * d + j];
                }
            }
            // Rows in blocks, so that the scores stay `BLOCK x n`.
            let mut res = vec![0f32; n * d];
            let mut scores = vec![0f32; BLOCK.min(n) * n];
            for first in (0..n).step_by(BLOCK) {
                let rows = BLOCK.min(n - first);
                let sc = &mut scores[..rows * n];
                linear(&qh[first * d..], rows, d, &kh_, n, None, sc);
                for r in sc.chunks_mut(n) {
                    let max = r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    let mut sum = 0f32;
                    for x in r.iter_mut() {
                        *x = (*x - max).exp();
                        sum += *x;
                    }
                    let inv = 1.0 / sum;
                    r.iter_mut().for_each(|x| *x *= inv);
                }
                linear(
                    sc,
                    rows,
                    n,
                    &vt,
                    d,
                    None,
                    &mut res[first * d..(first + rows) * d],
                );
            }
            res
        })
        .collect();
    let mut attn = vec![0f32; n * qw];
    for (hd, res) in results.iter().enumerate() {
        for (i, r) in res.chunks(d).enumerate() {
            attn[i * qw + hd * d..i * qw + (hd + 1) * d].copy_from_slice(r);
        }
    }
    clip_linear(&l.o, &attn, n, out);
}
