//! Speculative decoding, the step loop's side (the strategy and its state:
//! `strategy/speculation.rs`): a draft is appended to a decoding sequence before the step,
//! and verified against the engine's draws after it.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use lmi_engine_core::sampling::Sampled;

use super::Scheduler;
use crate::strategy::speculation::{DraftSource, propose};

impl Scheduler {
    /// Appends a draft of at most `room` tokens to running sequence `i` when it is decoding
    /// one token unconstrained; returns the draft's length.
    pub(super) fn add_draft(&mut self, i: usize, room: usize) -> usize {
        let e = &self.running[i];
        let s = &e.seq;
        let Some(r) = self.requests.get(&s.req) else {
            return 0;
        };
        let p = &r.params;
        if room == 0
            || s.remaining() != 1
            || e.constraint.is_some()
            || p.beam.is_some()
            || !r.forked
            || (p.draft.is_empty()
                && e.spec.draft_kv.proposal.is_empty()
                && e.spec.mtp.is_empty()
                && self.cfg.speculative.ngram.is_none())
        {
            return 0;
        }
        // The draft and the token after it must fit the output and the context.
        let generated = s.tokens.len() - s.prompt_len;
        let k = room
            .min(
                e.spec
                    .spec_k
                    .clamp(1, self.cfg.speculative.max_draft.max(1)),
            )
            .min(p.stopping.max_new_tokens.saturating_sub(generated + 1))
            .min(self.cfg.max_model_len.saturating_sub(s.tokens.len() + 1));
        let model = match e.spec.mtp.is_empty() {
            false => (&e.spec.mtp[..], DraftSource::Mtp),
            true => (&e.spec.draft_kv.proposal[..], DraftSource::Model),
        };
        let Some((source, draft)) = propose(
            &s.tokens,
            s.prompt_len,
            &p.draft,
            model,
            self.cfg.speculative.ngram.as_ref(),
            k,
        ) else {
            return 0;
        };
        // A model with recurrent layers keeps the state before the draft to roll back to.
        if !self.kv.checkpoint_state(&mut self.running[i].seq.kv) {
            return 0;
        }
        self.metrics.spec_proposed[source as usize].fetch_add(draft.len() as u64, Relaxed);
        let e = &mut self.running[i];
        e.spec.draft_len = draft.len();
        e.spec.source = source;
        e.seq.tokens.extend_from_slice(&draft);
        draft.len()
    }

    /// Keeps the longest prefix of running sequence `i`'s draft that equals the engine's
    /// draws, then the draw after it, appending each as an ordinary token. Returns true when
    /// the sequence finished.
    pub(super) fn accept_draft(&mut self, i: usize, draws: Vec<Sampled>, now: Instant) -> bool {
        let e = &mut self.running[i];
        let k = e.spec.draft_len;
        let base = e.seq.tokens.len() - k;
        let accepted = (0..k)
            .take_while(|&j| {
                draws
                    .get(j)
                    .is_some_and(|d| d.token == e.seq.tokens[base + j])
            })
            .count();
        e.seq.tokens.truncate(base);
        e.seq.kv.num_computed = base;
        e.spec.settle(accepted, self.cfg.speculative.max_draft);
        self.metrics.spec_accepted[e.spec.source as usize].fetch_add(accepted as u64, Relaxed);
        let mut finished = false;
        for (j, d) in draws.into_iter().take(accepted + 1).enumerate() {
            if self.append_token(i, d.token, d.logprob, d.top, now) {
                finished = true;
                break;
            }
            if j < accepted {
                // This token was the draft's: its K/V were computed in this step.
                self.running[i].seq.kv.num_computed += 1;
            }
        }
        // Recurrent layers cannot take back rejected tokens: their state goes back to before
        // the draft, and the accepted tokens are computed again in the next step.
        let kv = &mut self.running[i].seq.kv;
        if let Some(start) = self.kv.settle_state(kv, accepted == k) {
            kv.num_computed = kv.num_computed.min(start);
        }
        self.register_full_blocks(i);
        // Blocks that only held rejected draft tokens go back to the pool.
        let s = &mut self.running[i].seq;
        self.kv.trim(&mut s.kv, s.tokens.len());
        finished
    }
}
