//! The Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision transformer run on the host, in f32, over a
//! tower's host weights ([`VisionTower`]): patch embedding (the Conv3d as one matrix product),
//! Qwen3-VL's learned position embeddings, blocks of non-causal attention with a 2D rotary
//! embedding (per frame, or per window in Qwen2.5-VL's windowed layers), the 2x2 patch merger
//! into the language model's width, and Qwen3-VL's DeepStack mergers. Matrix products go
//! through this backend's kernels ([`linear`]).

use lmi_engine_core::Result;
use lmi_engine_core::vision::tower::{
    Linear, Merger, Mlp, NORM_EPS, Norm, VisionTower, permute_units, unwindow,
};
use lmi_engine_core::vision::window::{frame_segments, patch_rows_cols};
use lmi_engine_core::vision::{VisionAct, VisionInput, qwen3};
use rayon::prelude::*;

use crate::linear;

/// The item's embeddings in the order of its placeholder tokens: `[input.tokens(),
/// cfg.output_width()]`, each token's merger output followed by its DeepStack features
/// (Qwen3-VL; none for the others).
pub fn forward(tower: &VisionTower, input: &VisionInput) -> Result<Vec<f32>> {
    let cfg = tower.config();
    if let Some(g) = &tower.gemma4 {
        return crate::vision_gemma4::forward(cfg, g, input);
    }
    let (h, m) = (cfg.hidden_size, cfg.spatial_merge_size);
    let grid = input.grid_thw;
    let n: usize = grid.iter().product();
    tower.check_input(input)?;
    let unit = cfg.merge_unit();
    let mut x = vec![0f32; n * h];
    apply_linear(&tower.patch_embed, &input.pixels, n, &mut x);
    if let Some(table) = &tower.pos_embed {
        add_positions(&mut x, table, h, grid, m, cfg.position_grid_side());
    }
    let mut rows_cols = patch_rows_cols(grid, m);
    let full = frame_segments(grid);
    // Qwen2.5-VL groups each window's tokens (their merge units) together.
    let windows = tower.windows(grid);
    if let Some((order, _)) = &windows {
        x = permute_units(&x, order, unit * h);
        rows_cols = permute_units(&rows_cols, order, unit);
    }
    let (cos, sin) = rotary(&rows_cols, cfg.head_dim(), cfg.rope_theta as f32);

    let mut normed = vec![0f32; n * h];
    let mut qkv = vec![0f32; n * 3 * h];
    let mut attn = vec![0f32; n * h];
    let mut proj = vec![0f32; n * h];
    let mut deepstack = Vec::with_capacity(tower.deepstack.len());
    for (l, b) in tower.blocks.iter().enumerate() {
        let segments = match &windows {
            Some((_, bounds)) if !cfg.fullatt_block_indexes.contains(&l) => bounds,
            _ => &full,
        };
        apply_norm(&b.norm1, &x, h, &mut normed);
        apply_linear(&b.qkv, &normed, n, &mut qkv);
        rotate_qk(&mut qkv, h, cfg.head_dim(), &cos, &sin);
        attention(&qkv, h, cfg.num_heads, segments, &mut attn);
        apply_linear(&b.proj, &attn, n, &mut proj);
        add(&mut x, &proj);
        apply_norm(&b.norm2, &x, h, &mut normed);
        apply_mlp(&b.mlp, &normed, n, &mut proj);
        add(&mut x, &proj);
        if let Some(j) = cfg.deepstack_visual_indexes.iter().position(|&d| d == l) {
            deepstack.push(merge(&tower.deepstack[j], &x, h, unit, true));
        }
    }
    let out_h = cfg.out_hidden_size;
    let main = merge(&tower.merger, &x, h, unit, false);
    // Each token's row: the merger's output, then its DeepStack features in the order of the
    // blocks that made them (transformers' list, which the language model's layers take in turn).
    let width = cfg.output_width();
    let mut out = vec![0f32; (n / unit) * width];
    for (k, row) in out.chunks_mut(width).enumerate() {
        row[..out_h].copy_from_slice(&main[k * out_h..(k + 1) * out_h]);
        for (d, f) in deepstack.iter().enumerate() {
            row[(d + 1) * out_h..(d + 2) * out_h].copy_from_slice(&f[k * out_h..(k + 1) * out_h]);
        }
    }
    Ok(unwindow(
        out,
        windows.as_ref().map(|(o, _)| o.as_slice()),
        width,
    ))
}

/// A merger over the patches `x` (`[n, h]`): each token's `unit` patches side by side, through
/// `norm` (per patch, or over the merged row when `merged_norm`: DeepStack's), `fc1`, GELU
/// (erf) and `fc2`. Returns `[n / unit, out_hidden_size]`.
fn merge(mg: &Merger, x: &[f32], h: usize, unit: usize, merged_norm: bool) -> Vec<f32> {
    let tokens = x.len() / h / unit;
    let wide = h * unit;
    let mut normed = vec![0f32; x.len()];
    apply_norm(&mg.norm, x, if merged_norm { wide } else { h }, &mut normed);
    let mut mid = vec![0f32; tokens * wide];
    apply_linear(&mg.fc1, &normed, tokens, &mut mid);
    mid.par_iter_mut().for_each(|v| *v = gelu(*v));
    let mut out = vec![0f32; tokens * mg.fc2.n];
    apply_linear(&mg.fc2, &mid, tokens, &mut out);
    out
}

/// Adds each patch's learned position embedding: the table resampled bilinearly to the grid
/// (Qwen3-VL), its four taps summed in f32 in transformers' order.
fn add_positions(x: &mut [f32], table: &[f32], h: usize, grid: [usize; 3], m: usize, side: usize) {
    let taps = qwen3::position_taps(grid, m, side);
    x.par_chunks_mut(h).zip(&taps).for_each(|(row, taps)| {
        for (j, v) in row.iter_mut().enumerate() {
            let mut s = 0f32;
            for &(i, w) in taps {
                s += table[i as usize * h + j] * w;
            }
            *v += s;
        }
    });
}

fn apply_linear(l: &Linear, x: &[f32], rows: usize, out: &mut [f32]) {
    linear(x, rows, l.k, &l.w, l.n, l.b.as_deref(), out);
}

fn apply_norm(norm: &Norm, x: &[f32], h: usize, out: &mut [f32]) {
    out.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .for_each(|(o, x)| {
            let len = h as f64;
            match &norm.bias {
                None => {
                    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
                    let inv = (1.0 / (ss / len + NORM_EPS as f64).sqrt()) as f32;
                    for ((o, &v), &g) in o.iter_mut().zip(x).zip(&norm.weight) {
                        *o = v * inv * g;
                    }
                }
                Some(bias) => {
                    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / len;
                    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / len;
                    let inv = 1.0 / (var + NORM_EPS as f64).sqrt();
                    for (((o, &v), &g), &b) in o.iter_mut().zip(x).zip(&norm.weight).zip(bias) {
                        *o = ((v as f64 - mean) * inv) as f32 * g + b;
                    }
                }
            }
        });
}

fn apply_mlp(mlp: &Mlp, x: &[f32], rows: usize, out: &mut [f32]) {
    match mlp {
        Mlp::SwiGlu { gate, up, down } => {
            let mut g = vec![0f32; rows * gate.n];
            let mut u = vec![0f32; rows * up.n];
            apply_linear(gate, x, rows, &mut g);
            apply_linear(up, x, rows, &mut u);
            g.par_iter_mut()
                .zip(&u)
                .for_each(|(g, &u)| *g = *g / (1.0 + (-*g).exp()) * u);
            apply_linear(down, &g, rows, out);
        }
        Mlp::QuickGelu { fc1, fc2 } => {
            let mut a = vec![0f32; rows * fc1.n];
            apply_linear(fc1, x, rows, &mut a);
            a.par_iter_mut()
                .for_each(|v| *v = *v / (1.0 + (-1.702 * *v).exp()));
            apply_linear(fc2, &a, rows, out);
        }
        Mlp::Gelu { fc1, fc2, act } => {
            let mut a = vec![0f32; rows * fc1.n];
            apply_linear(fc1, x, rows, &mut a);
            match act {
                VisionAct::GeluTanh => a.par_iter_mut().for_each(|v| *v = gelu_tanh(*v)),
                VisionAct::Gelu => a.par_iter_mut().for_each(|v| *v = gelu(*v)),
            }
            apply_linear(fc2, &a, rows, out);
        }
    }
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`), in f64 and rounded.
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    let x = f64::from(x);
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    (0.5 * x * (1.0 + inner.tanh())) as f32
}

fn add(x: &mut [f32], d: &[f32]) {
    x.par_iter_mut().zip(d).for_each(|(x, d)| *x += d);
}

/// cos and sin of each patch's rotary angles, `[patches, head_dim / 2]`: the first quarter of
/// the head's frequencies turn with the patch's row, the second with its column.
fn rotary(rows_cols: &[(u32, u32)], head_dim: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let dim = head_dim / 2;
    let inv: Vec<f32> = (0..dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(rows_cols.len() * dim);
    let mut sin = Vec::with_capacity(rows_cols.len() * dim);
    for &(r, c) in rows_cols {
        for pos in [r, c] {
            for &f in &inv {
                // As the reference: the angle in f32, its cos and sin in f32.
                let a = pos as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
    }
    (cos, sin)
}

/// Rotate-half on every q and k head of `qkv` (`[patches, 3 · width]`).
fn rotate_qk(qkv: &mut [f32], width: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    qkv.par_chunks_mut(3 * width)
        .enumerate()
        .for_each(|(p, row)| {
            let (c, s) = (
                &cos[p * half..(p + 1) * half],
                &sin[p * half..(p + 1) * half],
            );
            for head in row[..2 * width].chunks_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * c[i] - b * s[i];
                    head[i + half] = b * c[i] + a * s[i];
                }
            }
        });
}

/// Query rows of one attention matrix product: scores for this many rows at a time.
const ATTN_BLOCK: usize = 128;

/// Non-causal attention inside each segment `[bounds[i], bounds[i+1])` of patches, per head.
/// Both products (`q·kᵀ` and `p·v`) go through the CPU's matrix kernels, so the tower's full
/// attention layers (thousands of patches at 1024²) run at their rate.
fn attention(qkv: &[f32], width: usize, heads: usize, bounds: &[usize], out: &mut [f32]) {
    let d = width / heads;
    let scale = 1.0 / (d as f32).sqrt();
    let jobs: Vec<(usize, usize, usize)> = bounds
        .windows(2)
        .flat_map(|s| (0..heads).map(move |hd| (s[0], s[1], hd)))
        .collect();
    let results: Vec<(usize, usize, usize, Vec<f32>)> = jobs
        .par_iter()
        .map(|&(from, to, hd)| {
            let len = to - from;
            // This head's q (scaled), k, and v transposed (`[d, len]`, the weight layout of
            // the second product).
            let (mut q, mut k, mut vt) = (
                vec![0f32; len * d],
                vec![0f32; len * d],
                vec![0f32; d * len],
            );
            for i in 0..len {
                let row = &qkv[(from + i) * 3 * width..][..3 * width];
                for j in 0..d {
                    q[i * d + j] = row[hd * d + j] * scale;
                    k[i * d + j] = row[width + hd * d + j];
                    vt[j * len + i] = row[2 * width + hd * d + j];
                }
            }
            let mut res = vec![0f32; len * d];
            let mut scores = vec![0f32; ATTN_BLOCK.min(len) * len];
            for first in (0..len).step_by(ATTN_BLOCK) {
                let rows = ATTN_BLOCK.min(len - first);
                let sc = &mut scores[..rows * len];
                linear(&q[first * d..], rows, d, &k, len, None, sc);
                for r in sc.chunks_mut(len) {
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
                    len,
                    &vt,
                    d,
                    None,
                    &mut res[first * d..(first + rows) * d],
                );
            }
            (from, to, hd, res)
        })
        .collect();
    for (from, to, hd, res) in results {
        for (i, r) in (from..to).zip(res.chunks(d)) {
            out[i * width + hd * d..i * width + (hd + 1) * d].copy_from_slice(r);
        }
    }
}

/// GELU with the exact erf (`nn.GELU()`), erf to ~1e-7 (Numerical Recipes' erfc).
pub(crate) fn gelu(x: f32) -> f32 {
    let z = (x as f64) / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z.abs());
    let poly = -z * z - 1.26551223
        + t * (1.00002368
            + t * (0.37409196
                + t * (0.09678418
                    + t * (-0.18628806
                        + t * (0.27886807
                            + t * (-1.13520398
                                + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * poly.exp();
    let erf = if z >= 0.0 { 1.0 - erfc } else { erfc - 1.0 };
    (0.5 * x as f64 * (1.0 + erf)) as f32
}

#[cfg(test)]
mod tests {
    use super::gelu;

    #[test]
    fn gelu_matches_erf_values() {
        // 0.5·x·(1 + erf(x/√2)) from a reference table.
        for (x, want) in [
            (1.0f32, 0.841_344_7f32),
            (-1.0, -0.158_655_26),
            (2.5, 2.484_47),
        ] {
            assert!((gelu(x) - want).abs() < 1e-5, "{x}: {}", gelu(x));
        }
    }
}
