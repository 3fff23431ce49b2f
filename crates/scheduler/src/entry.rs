//! A sequence and, beside it, the state each strategy of its request keeps for it: sampling
//! (seed, score, times), speculation (draft, draft model cache), the grammar matcher, the beam.
//! The step loop holds entries; the KV manager sees only `seq.kv`.

use std::sync::{Arc, Mutex};

use crate::constraint::SeqConstraint;
use crate::kv_manager::SeqBlocks;
use crate::sequence::Sequence;
use crate::strategy::beam::BeamState;
use crate::strategy::sampling::SamplingState;
use crate::strategy::speculation::SpecState;

pub(crate) struct SeqEntry {
    pub seq: Sequence,
    pub sampling: SamplingState,
    pub spec: SpecState,
    /// Constrained decoding: where the output stands in the request's grammar (shared with
    /// the worker computing its next mask).
    pub constraint: Option<Arc<Mutex<SeqConstraint>>>,
    pub beam: BeamState,
}

impl SeqEntry {
    /// A copy that continues independently on `kv` (shared by the KV manager): its own seed
    /// and grammar state, no draft.
    pub fn fork(&self, index: u32, seed: u64, kv: SeqBlocks) -> SeqEntry {
        let len = self.seq.tokens.len() - self.spec.draft_len;
        SeqEntry {
            seq: self.seq.fork(index, len, kv),
            sampling: self.sampling.fork(seed),
            spec: self.spec.fork(),
            constraint: self.constraint.as_ref().map(|c| {
                let c = c.lock().unwrap_or_else(|e| e.into_inner());
                Arc::new(Mutex::new(c.fork()))
            }),
            beam: self.beam.clone(),
        }
    }

    /// Takes back a draft that was not run (the sequence is preempted, or its blocks did not
    /// fit).
    pub fn strip_draft(&mut self) {
        let len = self.seq.tokens.len() - self.spec.draft_len;
        self.seq.tokens.truncate(len);
        self.spec.draft_len = 0;
    }
}
