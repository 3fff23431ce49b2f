//! Logit processors that run before temperature: bias, penalties and bans.
//!
//! All of them touch only the few tokens named by the request or seen in the sequence, so
//! their cost is O(len(prompt) + len(output) + len(controls)), never O(vocab).
//!
//! They are expressed as a list of per-token [`Edit`]s ([`for_each_edit`]) that the CPU
//! applies to its row ([`apply`]) and the CUDA sampler uploads and applies on the device, so
//! the two backends always edit the same tokens in the same order.

use super::{SamplingParams, SequenceContext};

/// One change to one logit. Edits of one token apply in the order [`for_each_edit`] gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Edit {
    /// `x += b` (`logit_bias`).
    Bias(f32),
    /// `x > 0 ? x / p : x * p` (HF/CTRL repetition penalty).
    Repetition(f32),
    /// `x -= v` (presence + frequency × count, computed here so both backends share it).
    Subtract(f32),
    /// `x = -inf` (bad words, stop ids before `min_new_tokens`, no-repeat n-grams).
    Ban,
}

impl Edit {
    /// The logit after a non-ban edit (a ban is applied by the caller, which saves the value).
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Edit::Bias(b) => x + b,
            Edit::Repetition(p) => {
                if x > 0.0 {
                    x / p
                } else {
                    x * p
                }
            }
            Edit::Subtract(v) => x - v,
            Edit::Ban => f32::NEG_INFINITY,
        }
    }
}

/// Calls `f(id, edit)` for every edit of a `vocab`-wide row, in the CPU pipeline's order:
/// every bias, then repetition (each distinct token of prompt or output once), then
/// presence/frequency (each distinct output token once), then the bans. Ids outside the
/// vocabulary are skipped.
pub fn for_each_edit(
    params: &SamplingParams,
    ctx: &SequenceContext,
    vocab: usize,
    mut f: impl FnMut(u32, Edit),
) {
    let mut emit = |id: u32, e: Edit| {
        if (id as usize) < vocab {
            f(id, e);
        }
    };
    for &(id, b) in &params.logit_bias {
        emit(id, Edit::Bias(b));
    }
    let rep = params.repetition_penalty;
    if rep != 1.0 {
        // sort + dedup of the seen tokens: each distinct token is penalized exactly once.
        let mut seen: Vec<u32> = ctx.prompt.iter().chain(ctx.output).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for id in seen {
            emit(id, Edit::Repetition(rep));
        }
    }
    let (presence, frequency) = (params.presence_penalty, params.frequency_penalty);
    if presence != 0.0 || frequency != 0.0 {
        let mut out = ctx.output.to_vec();
        out.sort_unstable();
        for run in out.chunk_by(|a, b| a == b) {
            emit(
                run[0],
                Edit::Subtract(presence + frequency * run.len() as f32),
            );
        }
    }
    for word in &params.bad_words {
        if let Some((&last, prefix)) = word.split_last()
            && ctx.output.ends_with(prefix)
        {
            emit(last, Edit::Ban);
        }
    }
    if (ctx.output.len() as u64) < u64::from(params.min_new_tokens) {
        ctx.stop_ids.iter().for_each(|&id| emit(id, Edit::Ban));
    }
    let n = params.no_repeat_ngram_size as usize;
    if n > 0 {
        banned_ngram_tokens(ctx.prompt, ctx.output, n, &mut |id| emit(id, Edit::Ban));
    }
}

/// Applies every edit to `logits`. Returns the `(id, value before masking)` pairs of the
/// bans, in masking order, so [`lift_bans`] can restore the row when the bans leave nothing
/// to sample.
pub(crate) fn apply(
    logits: &mut [f32],
    params: &SamplingParams,
    ctx: &SequenceContext,
) -> Vec<(u32, f32)> {
    let mut saved = Vec::new();
    let vocab = logits.len();
    for_each_edit(params, ctx, vocab, |id, edit| {
        let x = &mut logits[id as usize];
        if edit == Edit::Ban {
            saved.push((id, *x));
        }
        *x = edit.apply(*x);
    });
    saved
}

/// Undoes the bans of [`apply`] (reverse order, so a token banned twice gets its original
/// value).
pub(crate) fn lift_bans(logits: &mut [f32], saved: &[(u32, f32)]) {
    for &(id, x) in saved.iter().rev() {
        logits[id as usize] = x;
    }
}

/// HF `NoRepeatNGramLogitsProcessor` over `prompt ++ output`: for every earlier n-gram whose
/// first `n - 1` tokens equal the last `n - 1` tokens, its last token is banned. A direct
/// O(len * n) scan: no hash map, no concatenated copy.
fn banned_ngram_tokens(prompt: &[u32], output: &[u32], n: usize, ban: &mut impl FnMut(u32)) {
    let len = prompt.len() + output.len();
    // HF bans nothing while cur_len + 1 < n; with cur_len + 1 == n there is no earlier n-gram.
    if len < n {
        return;
    }
    let at = |i: usize| {
        if i < prompt.len() {
            prompt[i]
        } else {
            output[i - prompt.len()]
        }
    };
    let tail_start = len + 1 - n;
    for start in 0..=len - n {
        if (0..n - 1).all(|j| at(start + j) == at(tail_start + j)) {
            ban(at(start + n - 1));
        }
    }
}
