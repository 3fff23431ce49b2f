//! Multi-head latent attention on the CPU ([`Backend::mla_qkv`], [`Backend::mla_attention`]):
//! each token's latent queries and cache record, then its attention over the cached records
//! in the latent space, the value up-projection applied per head. One token and head per
//! task, the same reductions in the same order whatever the batch (batch invariant).
//!
//! [`Backend::mla_qkv`]: lmi_engine_core::backend::Backend::mla_qkv
//! [`Backend::mla_attention`]: lmi_engine_core::backend::Backend::mla_attention

use lmi_engine_core::backend::MlaDims;
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::kv::BLOCK_SIZE;

use crate::attention::softmax;
use crate::simd::{WElem, accumulate_rows_shared, dots};

/// Runs `f` on each `width`-wide piece of `out` (a token's head), in parallel when there
/// are several: each piece is computed alone, the same way whatever the batch.
fn for_pieces(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() <= width {
        out.chunks_mut(width).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        crate::pool::chunks_mut(out, width, f);
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

/// See [`lmi_engine_core::backend::Backend::mla_qkv`]; `tokens` rows of `out`, each
/// `heads + 1` pieces of `cache_width` (a head's query, then the token's record), one task
/// each.
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
    for_pieces(&mut out[..tokens * d.row_width()], cw, |i, o| {
        let (t, h) = (i / (d.heads + 1), i % (d.heads + 1));
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        for f in 0..half {
            let (s, c) = (positions[t] as f64 * inv_freq[f]).sin_cos();
            cos[f] = c as f32 * d.rope_factor;
            sin[f] = s as f32 * d.rope_factor;
        }
        let (lat, rot) = o.split_at_mut(lora);
        if h < d.heads {
            let qh = &q[(t * d.heads + h) * qw..][..qw];
            dots(
                &qh[..d.nope],
                &w_uk[h * lora * d.nope..][..lora * d.nope],
                lat,
            );
            turn(&qh[d.nope..], &cos, &sin, rot);
            return;
        }
        let kv = &kva[t * cw..(t + 1) * cw];
        let latent = &kv[..lora];
        let ss: f64 = latent.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let inv = (1.0 / (ss / lora as f64 + eps as f64).sqrt()) as f32;
        for ((o, &v), &g) in lat.iter_mut().zip(latent).zip(kv_norm) {
            *o = v * inv * g;
        }
        turn(&kv[lora..], &cos, &sin, rot);
    });
}

/// See [`lmi_engine_core::backend::Backend::mla_attention`]: `k_cache` / `v_cache` hold each
/// record's halves, `[blocks, BLOCK_SIZE, cache_width / 2]`. One task per token and head.
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
    for_pieces(&mut out[..n * heads * d.v], d.v, |i, o| {
        let (t, h) = (i / heads, i % heads);
        let seq = layout.token_seq[t] as usize;
        let ctx = layout.positions[t] as usize + 1;
        let table = layout.block_table(seq);
        let q = &qkv[t * d.row_width() + h * cw..][..cw];
        let mut scores = vec![0.0f32; ctx];
        let mut second = [0.0f32; BLOCK_SIZE];
        let blocks = ctx.div_ceil(BLOCK_SIZE);
        // Where block `b`'s records start in either pool, and how many it holds.
        let rows = |b: usize| -> (usize, usize) {
            let len = (ctx - b * BLOCK_SIZE).min(BLOCK_SIZE);
            (table[b] as usize * BLOCK_SIZE * half, len)
        };
        for b in 0..blocks {
            let (start, len) = rows(b);
            let s = &mut scores[b * BLOCK_SIZE..][..len];
            dots(&q[..half], &k_cache[start..][..len * half], s);
            dots(
                &q[half..],
                &v_cache[start..][..len * half],
                &mut second[..len],
            );
            for (v, &w) in s.iter_mut().zip(&second[..len]) {
                *v = (*v + w) * scale;
            }
        }
        softmax(&mut scores, None);
        // The weighted sums of both halves of the records.
        let (mut first, mut last) = (vec![0.0f32; half], vec![0.0f32; half]);
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
        // The latent is the record's first `lora` values (the rest is the key's rotary part,
        // which has no value).
        let split = half.min(lora);
        let mut latent = vec![0.0f32; lora];
        latent[..split].copy_from_slice(&first[..split]);
        latent[split..].copy_from_slice(&last[..lora - split]);
        dots(&latent, &w_uv[h * d.v * lora..][..d.v * lora], o);
    });
}
