//! Paged causal attention for a ragged batch: each token attends to its sequence's keys
//! `0 ..= position`, read through the block table. One pass per token (prefill chunk or
//! decode alike), all q heads of a GQA group sharing each K/V row load.

use rayon::prelude::*;

use super::simd::{axpy, dot};
use crate::backend::QkvLayout;
use crate::batch::BatchLayout;
use crate::kv::BLOCK_SIZE;

pub fn paged_attention(
    qkv: &[f32],
    layout: &BatchLayout,
    l: QkvLayout,
    k_cache: &[f32],
    v_cache: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let d = l.head_dim;
    let group = l.q_heads / l.kv_heads;
    let width = l.q_heads * d;
    let body = |t: usize, o: &mut [f32]| {
        let seq = layout.token_seq[t] as usize;
        let ctx = layout.positions[t] as usize + 1;
        let table = layout.block_table(seq);
        let row = &qkv[t * l.row_width()..(t + 1) * l.row_width()];
        let mut scores = vec![0.0f32; group * ctx];
        for g in 0..l.kv_heads {
            let slot = |j: usize| {
                let block = table[j / BLOCK_SIZE] as usize;
                ((block * l.kv_heads + g) * BLOCK_SIZE + j % BLOCK_SIZE) * d
            };
            for j in 0..ctx {
                let key = &k_cache[slot(j)..slot(j) + d];
                for h in 0..group {
                    let q = &row[(g * group + h) * d..(g * group + h + 1) * d];
                    scores[h * ctx + j] = dot(q, key) * scale;
                }
            }
            for h in 0..group {
                let s = &mut scores[h * ctx..(h + 1) * ctx];
                let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for v in s.iter_mut() {
                    *v = (*v - max).exp();
                    sum += *v;
                }
                let inv = 1.0 / sum;
                for v in s.iter_mut() {
                    *v *= inv;
                }
            }
            let og = &mut o[g * group * d..(g + 1) * group * d];
            og.fill(0.0);
            for j in 0..ctx {
                let val = &v_cache[slot(j)..slot(j) + d];
                for h in 0..group {
                    axpy(&mut og[h * d..(h + 1) * d], scores[h * ctx + j], val);
                }
            }
        }
    };
    let n = layout.num_tokens();
    if n == 1 {
        body(0, &mut out[..width]);
    } else {
        out[..n * width]
            .par_chunks_mut(width)
            .enumerate()
            .for_each(|(t, o)| body(t, o));
    }
}

/// Stores each token's k and v heads at its slot of the `[blocks, kv_heads, BLOCK_SIZE, d]` pools.
pub fn write_kv(
    qkv: &[f32],
    slots: &[u32],
    l: QkvLayout,
    k_cache: &mut [f32],
    v_cache: &mut [f32],
) {
    let d = l.head_dim;
    for (t, &slot) in slots.iter().enumerate() {
        let row = &qkv[t * l.row_width()..(t + 1) * l.row_width()];
        let (block, off) = (slot as usize / BLOCK_SIZE, slot as usize % BLOCK_SIZE);
        for g in 0..l.kv_heads {
            let dst = ((block * l.kv_heads + g) * BLOCK_SIZE + off) * d;
            let k = l.k_offset() + g * d;
            let v = l.v_offset() + g * d;
            k_cache[dst..dst + d].copy_from_slice(&row[k..k + d]);
            v_cache[dst..dst + d].copy_from_slice(&row[v..v + d]);
        }
    }
}
