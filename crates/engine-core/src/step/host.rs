//! A step's logits work on the host: prompt-token scores and draws over a `rows × vocab`
//! matrix, rows in parallel. The CPU backend's `process_logits`, and the reference the CUDA
//! sampler is tested against.

use rayon::prelude::*;

use super::{LogitsOutput, LogitsWork, TokenLogprob};
use crate::sampling::{logprobs, sample_masked};

/// Runs `work` over `logits` (row-major, `vocab` wide). Rows are modified in place by the
/// draws (processors write into them); scores read them before that.
///
/// # Panics
/// If a request names a row outside the matrix (a caller bug: `LogitsWork::new` maps rows
/// from the step's own layout).
pub fn process_logits_host(logits: &mut [f32], vocab: usize, work: &LogitsWork) -> LogitsOutput {
    let row = |r: usize| -> &[f32] { &logits[r * vocab..(r + 1) * vocab] };
    let scores: Vec<TokenLogprob> = work
        .scores
        .par_iter()
        .map(|s| {
            let (logprob, top) = logprobs::token_logprob(row(s.row), s.token, s.top_n);
            TokenLogprob { logprob, top }
        })
        .collect();

    // A row drawn from several times (the parallel sequences of a fork) is copied for every
    // draw but its last, which works in place.
    let rows = logits.len().checked_div(vocab).unwrap_or(0);
    let mut last_use = vec![usize::MAX; rows];
    for (i, s) in work.samples.iter().enumerate() {
        last_use[s.row] = i;
    }
    let copies: Vec<Option<Vec<f32>>> = work
        .samples
        .iter()
        .enumerate()
        .map(|(i, s)| (last_use.get(s.row) != Some(&i)).then(|| row(s.row).to_vec()))
        .collect();
    let mut in_place: Vec<Option<&mut [f32]>> = if vocab == 0 {
        Vec::new()
    } else {
        logits.chunks_mut(vocab).map(Some).collect()
    };
    let jobs: Vec<RowBuf> = work
        .samples
        .iter()
        .zip(copies)
        .map(|(s, copy)| match copy {
            Some(v) => RowBuf::Owned(v),
            None => RowBuf::Borrowed(
                in_place
                    .get_mut(s.row)
                    .and_then(Option::take)
                    .unwrap_or_default(),
            ),
        })
        .collect();
    let samples = jobs
        .into_par_iter()
        .zip(work.samples.par_iter())
        .map(|(mut buf, s)| {
            let mask = s.allowed.and_then(|m| m.wait());
            sample_masked(buf.as_mut(), s.params, s.seed, &s.ctx, mask.as_deref())
        })
        .collect();
    LogitsOutput { samples, scores }
}

enum RowBuf<'a> {
    Borrowed(&'a mut [f32]),
    Owned(Vec<f32>),
}

impl RowBuf<'_> {
    fn as_mut(&mut self) -> &mut [f32] {
        match self {
            RowBuf::Borrowed(r) => r,
            RowBuf::Owned(v) => v,
        }
    }
}
