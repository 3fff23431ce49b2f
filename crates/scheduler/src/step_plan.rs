//! Turns the sequences scheduled for a step into the engine's [`StepBatch`]: each chunk and
//! the media items among its positions, the draws (one per sequence that reaches its end, `n`
//! of them when a request forks off its first sequence), and the prompt tokens to score.

use std::collections::HashMap;

use lmi_engine_core::sampling::derive_seed;
use lmi_engine_core::step::PoolRequest;
use lmi_engine_core::{
    ChunkMedia, ChunkState, LogitsWanted, MtpChunk, PromptLogprobRequest, SampleRequest, SeqChunk,
    TokenMask,
};

use crate::entry::SeqEntry;
use crate::kv_manager::KvManager;
use crate::pooling::PoolEntry;
use crate::request_state::RequestState;
use crate::sequence::{RequestId, Sequence};

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

/// The chunks of `scheduled` (running index, new tokens), in order, the media items among
/// their positions, and (when any sequence has media) each chunk's M-RoPE delta.
pub(crate) fn chunks(
    running: &[SeqEntry],
    requests: &HashMap<RequestId, RequestState>,
    scheduled: &[(usize, usize)],
) -> (Vec<SeqChunk>, Vec<ChunkMedia>, Vec<i64>) {
    let mut media = Vec::new();
    let mut deltas = Vec::new();
    let chunks = scheduled
        .iter()
        .enumerate()
        .map(|(k, &(i, n))| {
            let (s, draft_len) = (&running[i].seq, running[i].spec.draft_len);
            let r = requests.get(&s.req);
            let start = s.kv.num_computed;
            let end = start + n;
            // The rotary shift of the items that end before this chunk.
            let delta: i64 = r.map_or(0, |r| {
                let items = r.params.prompt.media();
                items[..items.partition_point(|m| m.end() <= start)]
                    .iter()
                    .map(|m| m.item.rope_delta())
                    .sum()
            });
            deltas.push(delta);
            if let Some(r) = r {
                for m in r.params.prompt.media_in(start..end) {
                    let from = m.start.max(start);
                    media.push(ChunkMedia {
                        chunk: k,
                        offset: from - start,
                        len: m.end().min(end) - from,
                        item_offset: from - m.start,
                        hash: m.item.hash,
                        input: m.item.input.clone(),
                    });
                }
            }
            let logits = if draft_len > 0
                || (r.is_some_and(|r| wants_prompt_logprobs(s, r)) && start < s.prompt_len)
            {
                // A draft is verified at every position; prompt logprobs score every one.
                LogitsWanted::All
            } else if end == s.tokens.len() {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            SeqChunk {
                tokens: s.tokens[start..end].to_vec(),
                start_pos: start,
                block_table: s.kv.block_table.clone(),
                window_table: s.kv.window_table.clone(),
                logits,
                adapter: r.and_then(|r| r.params.adapter_id()),
            }
        })
        .collect();
    // Text-only steps pass none.
    if deltas.iter().all(|&d| d == 0) {
        deltas.clear();
    }
    (chunks, media, deltas)
}

/// Each scheduled chunk's entry for the engine's multi-token-prediction head, for the
/// sequences that may draft: the prompt token after a chunk that does not end its prompt, the
/// draft it carries, and the draft tokens wanted back where the sequence may draft next step
/// (as `add_draft` allows, less the step's room, which is only known then). The head skips
/// the others (its K/V there are never read by their own drafts; another sequence's prefix hit
/// on their blocks drafts from what the head holds, which only its drafts' quality feels).
pub(crate) fn mtp(
    running: &[SeqEntry],
    requests: &HashMap<RequestId, RequestState>,
    scheduled: &[(usize, usize)],
    cfg: &crate::SchedulerConfig,
) -> Vec<MtpChunk> {
    scheduled
        .iter()
        .enumerate()
        .filter_map(|(k, &(i, n))| {
            let e = &running[i];
            let s = &e.seq;
            let end = s.kv.num_computed + n;
            let drafts = requests.get(&s.req).is_some_and(|r| {
                let p = &r.params;
                e.constraint.is_none()
                    && p.beam.is_none()
                    && p.draft.is_empty()
                    && p.prompt.media().is_empty()
            });
            // A head that keeps missing stops drafting for the sequence: its drafts' rows
            // cost more than they bring (a fine-tune may carry a stale MTP layer). After 16
            // draft tokens, fewer than one in four kept.
            let missing = e.spec.rejected >= 16 && e.spec.accepted * 3 < e.spec.rejected;
            if !drafts || missing || cfg.speculative.step_rows <= 1 {
                return None;
            }
            let propose = match end == s.tokens.len() {
                true => e.spec.spec_k.clamp(1, cfg.speculative.max_draft.max(1)),
                false => 0,
            };
            Some(MtpChunk {
                chunk: k,
                next: s.tokens.get(end).copied(),
                draft: e.spec.draft_len,
                propose,
            })
        })
        .collect()
}

/// Each scheduled sequence's recurrent state in the step (empty for a model without
/// recurrent layers): its slot and the prefix snapshots planned inside its chunk.
pub(crate) fn states(
    kv: &KvManager,
    running: &[SeqEntry],
    scheduled: &[(usize, usize)],
) -> Vec<ChunkState> {
    if kv.state_pool().is_none() {
        return Vec::new();
    }
    scheduled
        .iter()
        .map(|&(i, n)| {
            let s = &running[i].seq.kv;
            let start = s.num_computed;
            kv.chunk_state(s, start, start + n).unwrap_or_default()
        })
        .collect()
}

/// Appends the step's pooling inputs to `chunks`, each whole from position 0 on the blocks
/// taken for it, wanting no logits (with a zero M-RoPE delta and its state slot where the
/// other chunks have them), and returns the engine's [`PoolRequest`]s, in order.
pub(crate) fn pools(
    kv: &KvManager,
    entries: &[PoolEntry],
    chunks: &mut Vec<SeqChunk>,
    rope_deltas: &mut Vec<i64>,
    states: &mut Vec<ChunkState>,
) -> Vec<PoolRequest> {
    entries
        .iter()
        .map(|p| {
            let n = p.req.tokens.len();
            if !rope_deltas.is_empty() {
                rope_deltas.push(0);
            }
            if kv.state_pool().is_some() {
                states.push(kv.chunk_state(&p.kv, 0, n).unwrap_or_default());
            }
            chunks.push(SeqChunk {
                tokens: p.req.tokens.clone(),
                start_pos: 0,
                block_table: p.kv.block_table.clone(),
                window_table: p.kv.window_table.clone(),
                logits: LogitsWanted::None,
                adapter: None,
            });
            PoolRequest {
                chunk: chunks.len() - 1,
                segment_b: p.req.segment_b,
            }
        })
        .collect()
}

/// The draws and prompt scores of a step over `chunks` (from [`chunks`]), and where each
/// scheduled sequence's results land.
pub(crate) fn requests<'a>(
    running: &'a [SeqEntry],
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
        let (s, seed, draft_len) = (
            &running[i].seq,
            running[i].sampling.seed,
            running[i].spec.draft_len,
        );
        let first = samples.len();
        let mut prompt_logprobs = None;
        if let Some(r) = requests.get(&s.req) {
            if chunk.logits == LogitsWanted::All && draft_len == 0 {
                let end = (s.kv.num_computed + n + 1).min(s.prompt_len);
                let from = (s.kv.num_computed + 1).min(end);
                prompt_logprobs = Some(scores.len());
                scores.push(PromptLogprobRequest {
                    chunk: k,
                    targets: &s.tokens[from..end],
                    top_n: r.params.prompt_logprobs.unwrap_or(0),
                });
            }
            if draft_len > 0 {
                // One draw after the last sampled token and after each draft token, each
                // with the context (and output position) it would have without the draft.
                let d = draft_len;
                let end = s.tokens.len() - d;
                for j in 0..=d {
                    samples.push(SampleRequest {
                        chunk: k,
                        position: n - 1 - d + j,
                        params: &r.params.sampling,
                        seed,
                        ctx: lmi_engine_core::sampling::SequenceContext {
                            prompt: &s.tokens[..s.prompt_len],
                            output: &s.tokens[s.prompt_len..end + j],
                            stop_ids: &r.stop_ids,
                        },
                        allowed: None,
                    });
                }
            } else if s.kv.num_computed + n == s.tokens.len() {
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
                            seed
                        } else {
                            derive_seed(r.params.sampling.seed, d as u64)
                        },
                        ctx: lmi_engine_core::sampling::SequenceContext {
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
            start: s.kv.num_computed,
            samples: first..samples.len(),
            prompt_logprobs,
        });
    }
    (samples, scores, planned)
}
