//! Turns the sequences scheduled for a step into the engine's [`StepBatch`]: each chunk, the
//! draws (one per sequence that reaches its end, `n` of them when a request forks off its
//! first sequence), and the prompt tokens to score.

use std::collections::HashMap;

use lmi_engine::sampling::derive_seed;
use lmi_engine::{LogitsWanted, PromptLogprobRequest, SampleRequest, SeqChunk, TokenMask};

use crate::sequence::{RequestId, RequestState, Sequence};

/// How one scheduled sequence's results are found in the step's output.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    /// Index into the running sequences.
    pub running: usize,
    /// New tokens this step.
    pub tokens: usize,
    /// Tokens computed before this step.
    pub start: usize,
    /// Range of its draws in `StepOutput::samples`: one, or `n` on the fork step, or none.
    pub samples: std::ops::Range<usize>,
    /// Index of its request in `StepOutput::prompt_logprobs`.
    pub prompt_logprobs: Option<usize>,
}

/// Whether `s` still owes its request prompt logprobs (only the first sequence computes them).
pub(crate) fn wants_prompt_logprobs(s: &Sequence, r: &RequestState) -> bool {
    s.index == 0 && r.params.prompt_logprobs.is_some() && !r.prompt_logprobs_sent
}

/// The chunks of `scheduled` (running index, new tokens), in order.
pub(crate) fn chunks(
    running: &[Sequence],
    requests: &HashMap<RequestId, RequestState>,
    scheduled: &[(usize, usize)],
) -> Vec<SeqChunk> {
    scheduled
        .iter()
        .map(|&(i, n)| {
            let s = &running[i];
            let r = requests.get(&s.req);
            let end = s.num_computed + n;
            let logits = if s.draft_len > 0
                || (r.is_some_and(|r| wants_prompt_logprobs(s, r)) && s.num_computed < s.prompt_len)
            {
                // A draft is verified at every position; prompt logprobs score every one.
                LogitsWanted::All
            } else if end == s.tokens.len() {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            SeqChunk {
                tokens: s.tokens[s.num_computed..end].to_vec(),
                start_pos: s.num_computed,
                block_table: s.block_table.clone(),
                logits,
                adapter: r.and_then(|r| r.params.adapter_id()),
            }
        })
        .collect()
}

/// The draws and prompt scores of a step over `chunks` (from [`chunks`]), and where each
/// scheduled sequence's results land.
pub(crate) fn requests<'a>(
    running: &'a [Sequence],
    requests: &'a HashMap<RequestId, RequestState>,
    scheduled: &[(usize, usize)],
    chunks: &[SeqChunk],
    masks: &'a [Option<std::sync::Arc<TokenMask>>],
) -> (
    Vec<SampleRequest<'a>>,
    Vec<PromptLogprobRequest<'a>>,
    Vec<Planned>,
) {
    let mut samples = Vec::new();
    let mut scores = Vec::new();
    let mut planned = Vec::with_capacity(scheduled.len());
    for (k, (&(i, n), chunk)) in scheduled.iter().zip(chunks).enumerate() {
        let s = &running[i];
        let first = samples.len();
        let mut prompt_logprobs = None;
        if let Some(r) = requests.get(&s.req) {
            if chunk.logits == LogitsWanted::All && s.draft_len == 0 {
                let end = (s.num_computed + n + 1).min(s.prompt_len);
                let from = (s.num_computed + 1).min(end);
                prompt_logprobs = Some(scores.len());
                scores.push(PromptLogprobRequest {
                    chunk: k,
                    targets: &s.tokens[from..end],
                    top_n: r.params.prompt_logprobs.unwrap_or(0),
                });
            }
            if s.draft_len > 0 {
                // One draw after the last sampled token and after each draft token, each
                // with the context (and output position) it would have without the draft.
                let d = s.draft_len;
                let end = s.tokens.len() - d;
                for j in 0..=d {
                    samples.push(SampleRequest {
                        chunk: k,
                        position: n - 1 - d + j,
                        params: &r.params.sampling,
                        seed: s.seed,
                        ctx: lmi_engine::sampling::SequenceContext {
                            prompt: &s.tokens[..s.prompt_len],
                            output: &s.tokens[s.prompt_len..end + j],
                            stop_ids: &r.stop_ids,
                        },
                        allowed: None,
                    });
                }
            } else if s.num_computed + n == s.tokens.len() {
                // The first sequence of a request with n > 1 forks when its prompt is done:
                // every parallel sequence draws its first token from these logits.
                let draws = if s.index == 0 && !r.forked && r.params.beam.is_none() {
                    r.params.num_seqs()
                } else {
                    1
                };
                for d in 0..draws {
                    samples.push(SampleRequest {
                        chunk: k,
                        position: n - 1,
                        params: &r.params.sampling,
                        seed: if d == 0 {
                            s.seed
                        } else {
                            derive_seed(r.params.sampling.seed, d as u64)
                        },
                        ctx: lmi_engine::sampling::SequenceContext {
                            prompt: &s.tokens[..s.prompt_len],
                            output: s.output(),
                            stop_ids: &r.stop_ids,
                        },
                        // Forked sequences draw their first token under the same mask.
                        allowed: masks.get(k).and_then(|m| m.as_deref()),
                    });
                }
            }
        }
        planned.push(Planned {
            running: i,
            tokens: n,
            start: s.num_computed,
            samples: first..samples.len(),
            prompt_logprobs,
        });
    }
    (samples, scores, planned)
}
