//! Multi-head latent attention on the CPU ([`Backend::mla_qkv`], [`Backend::mla_attention`]):
//! each token's latent queries and cache record, then its attention over the cached records
//! in the latent space, the value up-projection applied per head. One token per task, the
//! same reductions in the same order whatever the batch (batch invariant).
//!
//! [`Backend::mla_qkv`]: lmi_engine_core::backend::Backend::mla_qkv
//! [`Backend::mla_attention`]: lmi_engine_core::backend::Backend::mla_attention

use lmi_engine_core::backend::MlaDims;
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::kv::BLOCK_SIZE;
use rayon::prelude::*;

use crate::attention::softmax;
use crate::simd::{WElem, accumulate_rows_shared, dots};

/// Below this many tokens the work stays on the calling thread.
const PAR_TOKENS: usize = 2;

fn for_tokens(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() / width.max(1) < PAR_TOKENS {
        out.chunks_mut(width).enumerate().for_each(|(t, o)| f(t, o));
    } else {
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(t, o)| f(t, o));
    }
}

/// Rotate-half RoPE of `x` into `out` with the given cos and sin (each `x.len() / 2`).
fn turn(x: &[f32], cos: &[f32], sin: &[f32], out: &mut [f32]) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        out[i] = a * cos[i] - b * sin[i];
        out[i + half] = b * cos[i] + a * sin[i];
    }
}

/// See [`lmi_engine_core::backend::Backend::mla_qkv`]; `tokens` rows of `out`.
#[allow(clippy::too_many_arguments)]
pub fn qkv(
    q: &[f32],
    kva: &[f32],
    positions: &[u32],
    d: MlaDims,
    kv_norm: &[f32],
    w_uk: &[f32],
    eps: f32,
    inv_freq: &[f64],
    out: &mut [f32],
) {
    let (cw, lora, half) = (d.cache_width(), d.kv_lora, d.rope / 2);
    let qw = d.nope + d.rope;
    let tokens = positions.len();
    for_tokens(
        &mut out[..tokens * d.row_width()],
        d.row_width(),
        |t, row| {
            let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
            for i in 0..half {
                let (s, c) = (positions[t] as f64 * inv_freq[i]).sin_cos();
                cos[i] = c as f32 * d.rope_factor;
                sin[i] = s as f32 * d.rope_factor;
            }
            let qt = &q[t * d.heads * qw..(t + 1) * d.heads * qw];
            for h in 0..d.heads {
                let qh = &qt[h * qw..(h + 1) * qw];
                let o = &mut row[h * cw..(h + 1) * cw];
                let (lat, rot) = o.split_at_mut(lora);
                dots(
                    &qh[..d.nope],
                    &w_uk[h * lora * d.nope..][..lora * d.nope],
                    lat,
                );
                turn(&qh[d.nope..], &cos, &sin, rot);
            }
            let kv = &kva[t * cw..(t + 1) * cw];
            let rec = &mut row[d.heads * cw..];
            let latent = &kv[..lora];
            let ss: f64 = latent.iter().map(|&v| (v as f64) * (v as f64)).sum();
            let inv = (1.0 / (ss / lora as f64 + eps as f64).sqrt()) as f32;
            for ((o, &v), &g) in rec[..lora].iter_mut().zip(latent).zip(kv_norm) {
                *o = v * inv * g;
            }
            turn(&kv[lora..], &cos, &sin, &mut rec[lora..cw]);
        },
    );
}

/// See [`lmi_engine_core::backend::Backend::mla_attention`]: `k_cache` / `v_cache` hold each
/// record's halves, `[blocks, BLOCK_SIZE, cache_width / 2]`.
#[allow(clippy::too_many_arguments)]
pub fn attention<E: WElem>(
    qkv: &[f32],
    layout: &BatchLayout,
    d: MlaDims,
    k_cache: &[E],
    v_cache: &[E],
    w_uv: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let (cw, lora, heads) = (d.cache_width(), d.kv_lora, d.heads);
    let half = cw / 2;
    let n = layout.num_tokens();
    for_tokens(&mut out[..n * heads * d.v], heads * d.v, |t, o| {
        let seq = layout.token_seq[t] as usize;
        let ctx = layout.positions[t] as usize + 1;
        let table = layout.block_table(seq);
        let row = &qkv[t * d.row_width()..][..heads * cw];
        let mut scores = vec![0.0f32; heads * ctx];
        let mut second = [0.0f32; BLOCK_SIZE];
        let blocks = ctx.div_ceil(BLOCK_SIZE);
        // Where block `b`'s records start in either pool, and how many it holds.
        let rows = |b: usize| -> (usize, usize) {
            let len = (ctx - b * BLOCK_SIZE).min(BLOCK_SIZE);
            (table[b] as usize * BLOCK_SIZE * half, len)
        };
        for b in 0..blocks {
            let (start, len) = rows(b);
            let (keys, tails) = (
                &k_cache[start..][..len * half],
                &v_cache[start..][..len * half],
            );
            for h in 0..heads {
                let q = &row[h * cw..(h + 1) * cw];
                let s = &mut scores[h * ctx + b * BLOCK_SIZE..][..len];
                dots(&q[..half], keys, s);
                dots(&q[half..], tails, &mut second[..len]);
                for (v, &w) in s.iter_mut().zip(&second[..len]) {
                    *v = (*v + w) * scale;
                }
            }
        }
        for s in scores.chunks_mut(ctx) {
            softmax(s, None);
        }
        // The weighted sums of both halves of the records, per head.
        let (mut first, mut last) = (vec![0.0f32; heads * half], vec![0.0f32; heads * half]);
        for b in 0..blocks {
            let (start, len) = rows(b);
            let w = &scores[b * BLOCK_SIZE..];
            accumulate_rows_shared(
                &mut first,
                half,
                w,
                ctx,
                len,
                &k_cache[start..][..len * half],
            );
            accumulate_rows_shared(
                &mut last,
                half,
                w,
                ctx,
                len,
                &v_cache[start..][..len * half],
            );
        }
        let mut latent = vec![0.0f32; lora];
        for h in 0..heads {
            // The latent is the record's first `lora` values (the rest is the key's rotary
            // part, which has no value).
            let split = half.min(lora);
            latent[..split].copy_from_slice(&first[h * half..][..split]);
            latent[split..].copy_from_slice(&last[h * half..][..lora - split]);
            dots(
                &latent,
                &w_uv[h * d.v * lora..][..d.v * lora],
                &mut o[h * d.v..(h + 1) * d.v],
            );
        }
    });
}
