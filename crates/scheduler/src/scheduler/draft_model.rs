//! The draft model, the step loop's side (the model and its cache: `strategy/draft_model.rs`):
//! which running sequences draft this step and how far.

use super::Scheduler;
use crate::strategy::draft_model::DraftRow;

impl Scheduler {
    /// Runs the draft model for the running sequences that may speculate this step, leaving
    /// each one's proposal in `spec.draft_kv.proposal` (see `speculation::propose`). `room`
    /// is the most tokens a sequence may draft.
    pub(super) fn run_draft_model(&mut self, room: usize) {
        let Some(dm) = self.draft_model.as_mut() else {
            return;
        };
        let max_draft = self.cfg.speculative.max_draft.max(1);
        let mut rows: Vec<DraftRow<'_>> = Vec::new();
        for e in self.running.iter_mut() {
            e.spec.draft_kv.proposal.clear();
            let s = &e.seq;
            let Some(r) = self.requests.get(&s.req) else {
                continue;
            };
            let p = &r.params;
            // The draft model has no vision encoder: a prompt with media does not draft.
            if s.remaining() != 1
                || e.constraint.is_some()
                || p.beam.is_some()
                || !r.forked
                || !p.draft.is_empty()
                || !p.prompt.media().is_empty()
            {
                continue;
            }
            let generated = s.tokens.len() - s.prompt_len;
            let k = room
                .min(e.spec.spec_k.clamp(1, max_draft))
                .min(p.stopping.max_new_tokens.saturating_sub(generated + 1))
                .min(self.cfg.max_model_len.saturating_sub(s.tokens.len() + 1));
            if k == 0 || !dm.reserve(&s.tokens, &mut e.spec.draft_kv, k) {
                continue;
            }
            rows.push(DraftRow {
                tokens: &s.tokens,
                kv: &mut e.spec.draft_kv,
                k,
            });
        }
        dm.propose(&mut rows);
    }
}
