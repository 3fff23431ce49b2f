//! Multi-head latent attention on the CPU ([`Backend::mla_qkv`], [`Backend::mla_attention`]):
//! each token's latent queries and cache record, then its attention over the cached records
//! in the latent space, the value up-projection applied per head. The absorbed projections
//! (`W_UK`, `W_UV`) are one matrix per head in the model's form (a GGUF's `attn_k_b` and
//! `attn_v_b` blocks as stored: at f32 they were a third of a GLM-4.7-Flash decode step's
//! reads) and run one task per head over every token of the step, so each head's matrix is
//! read once a step, not once a token; attention runs one task per token and head. Every
//! element keeps one reduction order whatever the batch (batch invariant: the products are
//! the backend's, [`head_products`]; attention's dots are `dots`' canonical order).
//!
//! [`Backend::mla_qkv`]: lmi_engine_core::backend::Backend::mla_qkv
//! [`Backend::mla_attention`]: lmi_engine_core::backend::Backend::mla_attention

use lmi_engine_core::backend::MlaDims;
use lmi_engine_core::batch::BatchLayout;
use lmi_engine_core::kv::BLOCK_SIZE;

use crate::attention::softmax;
use crate::qlinear::SendPtr;
use crate::simd::{WElem, accumulate_rows_shared, dots};
use crate::{CpuBackend, CpuWeight};

/// Runs `f` on each `width`-wide piece of `out` (a token's head), in parallel when there
/// are several: each piece is computed alone, the same way whatever the batch.
fn for_pieces(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if out.len() <= width {
        out.chunks_mut(width).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        crate::pool::chunks_mut(out, width, f);
    }
}

/// `out[t·ldo ..][..n] = x[t·ldx ..][..k] · wᵀ` for `rows` rows, `w` one head's `[n, k]`
/// matrix in any of the backend's forms (quantized blocks as stored included): the rows are
/// gathered, run through the backend's product (batch invariant) and scattered.
///
/// # Safety
/// `x` holds `rows` rows of `k` at stride `ldx`; `out` has room for `rows` rows of `n` at
/// stride `ldo`, which no other thread writes meanwhile.
unsafe fn head_products(
    backend: &CpuBackend,
    x: *const f32,
    ldx: usize,
    rows: usize,
    w: &CpuWeight,
    out: *mut f32,
    ldo: usize,
) {
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let mut xs = vec![0.0f32; rows * k];
    for (t, dst) in xs.chunks_exact_mut(k).enumerate() {
        // SAFETY: row t of x exists (the caller's extents).
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(x.add(t * ldx), k) });
    }
    let mut ys = vec![0.0f32; rows * n];
    backend.linear_into(&xs, rows, w, None, &mut ys);
    for (t, src) in ys.chunks_exact(n).enumerate() {
        // SAFETY: row t's n outputs are this caller's (see above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.add(t * ldo), n) };
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
    backend: &CpuBackend,
    q: &[f32],
    kva: &[f32],
    positions: &[u32],
    d: MlaDims,
    kv_norm: &[f32],
    w_uk: &[CpuWeight],
    eps: f32,
    inv_freq: &[f64],
    out: &mut [f32],
) {
    let (cw, lora, half) = (d.cache_width(), d.kv_lora, d.rope / 2);
    let qw = d.nope + d.rope;
    let tokens = positions.len();
    let rw = d.row_width();
    let out = &mut out[..tokens * rw];
    let cos_sin = |t: usize| {
        let (mut cos, mut sin) = (vec![0.0f32; half], vec![0.0f32; half]);
        for f in 0..half {
            let (s, c) = (positions[t] as f64 * inv_freq[f]).sin_cos();
            cos[f] = c as f32 * d.rope_factor;
            sin[f] = s as f32 * d.rope_factor;
        }
        (cos, sin)
    };
    let base = SendPtr(out.as_mut_ptr());
    // Tasks 0..heads: a head's latent queries (W_UK over every token) and rotary parts;
    // then one task per token for its record.
    crate::pool::run(d.heads + tokens, |i| {
        if i < d.heads {
            let h = i;
            // SAFETY: head h's pieces (row t, columns h·cw ..) are this task's alone; q
            // holds `tokens` rows of `heads · qw`.
            unsafe {
                head_products(
                    backend,
                    q.as_ptr().add(h * qw),
                    d.heads * qw,
                    tokens,
                    &w_uk[h],
                    base.at(h * cw),
                    rw,
                );
            }
            for t in 0..tokens {
                let (cos, sin) = cos_sin(t);
                let qh = &q[(t * d.heads + h) * qw..][..qw];
                // SAFETY: as above.
                let rot = unsafe {
                    std::slice::from_raw_parts_mut(base.at(t * rw + h * cw + lora), cw - lora)
                };
                turn(&qh[d.nope..], &cos, &sin, rot);
            }
            return;
        }
        let t = i - d.heads;
        // SAFETY: token t's record piece is this task's alone.
        let o = unsafe { std::slice::from_raw_parts_mut(base.at(t * rw + d.heads * cw), cw) };
        let (cos, sin) = cos_sin(t);
        let (lat, rot) = o.split_at_mut(lora);
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
    backend: &CpuBackend,
    qkv: &[f32],
    layout: &BatchLayout,
    d: MlaDims,
    k_cache: &[E],
    v_cache: &[E],
    w_uv: &[CpuWeight],
    scale: f32,
    out: &mut [f32],
) {
    let (cw, lora, heads) = (d.cache_width(), d.kv_lora, d.heads);
    let half = cw / 2;
    let n = layout.num_tokens();
    // Each token and head's attended latent, then W_UV one head at a time over every token.
    let mut latents = vec![0.0f32; n * heads * lora];
    for_pieces(&mut latents, lora, |i, latent| {
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
        latent[..split].copy_from_slice(&first[..split]);
        latent[split..].copy_from_slice(&last[..lora - split]);
    });
    let out = &mut out[..n * heads * d.v];
    let base = SendPtr(out.as_mut_ptr());
    crate::pool::run(heads, |h| {
        // SAFETY: head h's pieces (row t, columns h·v ..) are this task's alone; `latents`
        // holds n rows of heads · lora.
        unsafe {
            head_products(
                backend,
                latents.as_ptr().add(h * lora),
                heads * lora,
                n,
                &w_uv[h],
                base.at(h * d.v),
                heads * d.v,
            );
        }
    });
}
