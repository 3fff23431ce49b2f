//! Logit processors that run before temperature: bias, penalties and bans.
//!
//! All of them touch only the few tokens named by the request or seen in the sequence, so
//! their cost is O(len(prompt) + len(output) + len(controls)), never O(vocab).

use super::{SamplingParams, SequenceContext};

/// Adds `logit_bias`; ids outside the vocabulary are ignored.
pub(crate) fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(x) = logits.get_mut(id as usize) {
            *x += b;
        }
    }
}

/// Repetition (prompt or output), then presence and frequency (output only).
pub(crate) fn apply_penalties(logits: &mut [f32], params: &SamplingParams, ctx: &SequenceContext) {
    let rep = params.repetition_penalty;
    if rep != 1.0 {
        // sort + dedup of the seen tokens: each distinct token is penalized exactly once.
        let mut seen: Vec<u32> = ctx.prompt.iter().chain(ctx.output).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for id in seen {
            if let Some(x) = logits.get_mut(id as usize) {
                *x = if *x > 0.0 { *x / rep } else { *x * rep };
            }
        }
    }
    let (presence, frequency) = (params.presence_penalty, params.frequency_penalty);
    if presence != 0.0 || frequency != 0.0 {
        let mut out = ctx.output.to_vec();
        out.sort_unstable();
        for run in out.chunk_by(|a, b| a == b) {
            if let Some(x) = logits.get_mut(run[0] as usize) {
                *x -= presence + frequency * run.len() as f32;
            }
        }
    }
}

/// Masks banned tokens to `-inf`: bad words, stop ids before `min_new_tokens`, and
/// no-repeat n-grams. Returns the `(id, value before masking)` pairs, in masking order, so
/// [`lift_bans`] can restore the row when the bans leave nothing to sample.
pub(crate) fn apply_bans(
    logits: &mut [f32],
    params: &SamplingParams,
    ctx: &SequenceContext,
) -> Vec<(u32, f32)> {
    let mut saved = Vec::new();
    let mut ban = |id: u32| {
        if let Some(x) = logits.get_mut(id as usize) {
            saved.push((id, *x));
            *x = f32::NEG_INFINITY;
        }
    };
    for word in &params.bad_words {
        if let Some((&last, prefix)) = word.split_last()
            && ctx.output.ends_with(prefix)
        {
            ban(last);
        }
    }
    if (ctx.output.len() as u64) < u64::from(params.min_new_tokens) {
        ctx.stop_ids.iter().for_each(|&id| ban(id));
    }
    let n = params.no_repeat_ngram_size as usize;
    if n > 0 {
        banned_ngram_tokens(ctx.prompt, ctx.output, n, &mut ban);
    }
    saved
}

/// Undoes [`apply_bans`] (reverse order, so a token banned twice gets its original value).
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
