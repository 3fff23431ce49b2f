//! Token sampling shared by every backend. The CPU path here is the reference semantics;
//! the CUDA backend mirrors it.
//!
//! # Pipeline (per sequence, on one f32 logits row of length `vocab`)
//!
//! 1. **Bias**: `logit_bias` is added (TRT-LLM `embedding_bias`, OpenAI `logit_bias`).
//! 2. **Bans** (set to `-inf`):
//!    * `bad_words`: a one-token word is always banned; a longer word bans its last token
//!      when the *output* ends with the word's other tokens.
//!    * `min_new_tokens`: while `output.len() < min_new_tokens`, every id in
//!      `ctx.stop_ids` (EOS + stop token ids) is banned.
//!    * `no_repeat_ngram_size = n`: HF semantics over `prompt ++ output`; every earlier
//!      n-gram whose first `n - 1` tokens equal the last `n - 1` tokens bans its last token.
//! 3. **Penalties**, in this order: repetition (HF/CTRL, on tokens in prompt *or* output:
//!    `x > 0 ? x / p : x * p`), presence (`x -= p` once per token in the output), frequency
//!    (`x -= f * count_in_output`). Penalties map `-inf` to `-inf`, so they commute with the
//!    bans; the implementation applies them before the bans.
//! 4. **Logprobs** are taken here: `log_softmax` of this processed row, before temperature
//!    and truncation (vLLM's "processed logits"), so greedy and sampled requests report
//!    comparable numbers. Top-n is sorted by logprob descending, ties by id ascending, and
//!    lists only tokens of nonzero probability.
//! 5. **Greedy** (`temperature <= 1e-5`): the argmax, ties to the lowest id. Truncation
//!    filters do not apply.
//! 6. Otherwise **temperature**: `p ∝ w = 2^((x - max) · log2(e) / T)`, each weight in f32
//!    arithmetic that the CUDA sampler repeats bit for bit (`weight`: within 1.1e-7 of `2^t`
//!    for its f32 argument `t`, monotone in `x`, 0 below `2^-126`), sums of weights in f64;
//!    then the filters, each on the renormalized survivors of the previous one, candidates
//!    ordered by (logit descending, id ascending), which is also p descending:
//!    * `min_p`: drop `p < min_p * p_max` (vLLM order: before top-k/top-p; it commutes
//!      with top-k);
//!    * `top_k`: keep the first `k`;
//!    * `top_p`: keep the shortest prefix whose cumulative mass is `>= top_p`;
//!    * `typical_p`: HF `TypicalLogitsWarper` (sort by `|-ln p - H|` ascending, ties id
//!      ascending; keep up to and including the first index where the cumulative
//!      probability reaches `typical_p`, plus ties of its score).
//! 7. **Draw**: `u = uniform(seed, output.len())` (a SplitMix64 hash, no RNG state); the
//!    token is the first candidate, in (logit descending, id ascending) order, whose inclusive
//!    cumulative probability (f64, renormalized over the survivors) exceeds `u`. A seeded
//!    sequence therefore depends only on (seed, position, logits): same tokens alone or in
//!    any batch.
//!
//! # Degenerate rows
//! NaN logits count as `-inf` and `+inf` as `f32::MAX`; nothing panics. When the bans leave
//! no finite logit, the bans are lifted and the argmax of the unbanned row (bias and
//! penalties applied) is returned, with logprobs of that row. A row with no finite logit at
//! all yields token 0 with logprob `-ln(vocab)` (the limit of equal logits).
//!
//! # Cost
//! Greedy with everything off is one fused pass (clean + argmax + online log-sum-exp) and no
//! vocab-sized allocation; without a logprob wanted (`SamplingParams::logprob` false, no
//! alternatives) the log-sum-exp is skipped and the logprob is NaN. Processors cost O(len(prompt) + len(output)). Sampling uses a
//! per-thread candidate buffer, selection for top-k and mass-guided selection for top-p and
//! the draw; only `typical_p` sorts all survivors.

/// Also the CPU attention's softmax.
pub mod fast_exp;
mod filters;
pub(crate) mod logprobs;
mod params;
pub mod processors;
mod rng;
pub mod weight;

#[cfg(test)]
mod tests;

use rayon::prelude::*;

pub use logprobs::token_logprob;
pub use params::{GREEDY_EPS, SamplingParams};
pub use rng::{derive_seed, splitmix64, uniform};

use logprobs::RowStats;

/// The sequence state the processors need.
#[derive(Debug, Clone, Copy, Default)]
pub struct SequenceContext<'a> {
    pub prompt: &'a [u32],
    /// Tokens generated so far; its length is the output position of the token being sampled.
    pub output: &'a [u32],
    /// EOS + stop token ids, banned while `output.len() < min_new_tokens`.
    pub stop_ids: &'a [u32],
}

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// `log_softmax` of the processed logits (see the module docs), at `token`.
    pub logprob: f32,
    /// Top `params.top_logprobs` alternatives `(id, logprob)`, logprob desc, id asc.
    pub top: Vec<(u32, f32)>,
}

/// Samples one token from `logits` (modified in place: it ends up holding the processed,
/// cleaned row). An empty row yields token 0 with logprob 0.
pub fn sample(logits: &mut [f32], params: &SamplingParams, ctx: &SequenceContext) -> Sampled {
    sample_seeded(logits, params, params.seed, ctx)
}

/// [`sample`] with the draw keyed by `seed` instead of `params.seed` (each parallel sequence
/// of a request draws with its own seed).
pub fn sample_seeded(
    logits: &mut [f32],
    params: &SamplingParams,
    seed: u64,
    ctx: &SequenceContext,
) -> Sampled {
    sample_masked(logits, params, seed, ctx, None)
}

/// [`sample_seeded`] restricted to the tokens whose bit is set in `allowed` (bit `i % 32` of
/// word `i / 32`; tokens past its end are not allowed): constrained decoding's mask. Masked
/// tokens are `-inf` before every processor, so bans lifted because they left nothing never
/// bring them back; logprobs are those of the masked row.
pub fn sample_masked(
    logits: &mut [f32],
    params: &SamplingParams,
    seed: u64,
    ctx: &SequenceContext,
    allowed: Option<&[u32]>,
) -> Sampled {
    if let Some(bits) = allowed {
        apply_mask(logits, bits);
    }
    if logits.is_empty() {
        return Sampled {
            token: 0,
            logprob: 0.0,
            top: Vec::new(),
        };
    }
    let bans = processors::apply(logits, params, ctx);
    let scan = if params.needs_logprobs() {
        RowStats::scan_in_place
    } else {
        RowStats::scan_in_place_argmax
    };
    let mut stats = scan(logits);
    let banned_everything = stats.max == f32::NEG_INFINITY && !bans.is_empty();
    if banned_everything {
        processors::lift_bans(logits, &bans);
        stats = scan(logits);
    }
    let token = if params.is_greedy() || banned_everything || stats.max == f32::NEG_INFINITY {
        stats.argmax
    } else {
        let u = uniform(seed, ctx.output.len() as u64);
        filters::draw(logits, stats.max, params, u).unwrap_or(stats.argmax)
    };
    Sampled {
        token,
        logprob: stats.logprob(logits[token as usize]),
        top: logprobs::top_n(logits, params.top_logprobs, &stats),
    }
}

/// Sets every token not allowed by the bitset to `-inf`.
pub fn apply_mask(logits: &mut [f32], allowed: &[u32]) {
    for (i, x) in logits.iter_mut().enumerate() {
        let ok = allowed
            .get(i / 32)
            .is_some_and(|w| w & (1 << (i % 32)) != 0);
        if !ok {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// Samples every row of a `rows.len() x vocab` logits matrix in parallel; row `i` gives
/// exactly what [`sample`] gives for it alone.
///
/// # Panics
/// If `logits.len() != rows.len() * vocab` (a caller bug, not request input).
pub fn sample_batch(
    logits: &mut [f32],
    vocab: usize,
    rows: &[(&SamplingParams, SequenceContext)],
) -> Vec<Sampled> {
    assert_eq!(
        logits.len(),
        rows.len() * vocab,
        "sample_batch: logits must hold rows * vocab values"
    );
    if vocab == 0 {
        return rows
            .iter()
            .map(|(p, ctx)| sample(&mut [], p, ctx))
            .collect();
    }
    logits
        .par_chunks_mut(vocab)
        .zip(rows.par_iter())
        .map(|(row, (params, ctx))| sample(row, params, ctx))
        .collect()
}
