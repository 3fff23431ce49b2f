//! Admission: which sequences run this step and with how many tokens (chunked prefill that
//! never cuts a media item, drafts), preemption by recompute, and prefix-cache reuse for new
//! sequences. Room in the KV pool is the KV manager's (`grow`, copy-on-write included).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::Scheduler;
use super::lora::AdapterWait;
use crate::entry::SeqEntry;
use crate::kv_manager::BlockCopies;
use crate::step_plan::wants_prompt_logprobs;

impl Scheduler {
    /// Picks this step's (running index, new tokens) pairs: running sequences first (oldest
    /// first), preempting the newest when blocks run out, then waiting ones while blocks, the
    /// token budget and the batch size allow. Records copy-on-write block copies in `copies`.
    /// Waiting pooling requests are admitted among the waiting ones in arrival order, into
    /// `pool_running` (they count against the budget and the batch size too).
    pub(super) fn schedule(&mut self, copies: &mut BlockCopies) -> Vec<(usize, usize)> {
        let mut budget = self.cfg.max_batch_tokens;
        let mut out = Vec::new();
        let mut preempted = false;
        // Rows speculation may add to this step, shared among the running sequences.
        let mut spare = self
            .cfg
            .speculative
            .step_rows
            .saturating_sub(self.running.len());
        let share = spare.div_ceil(self.running.len().max(1));
        if spare > 0 {
            self.run_draft_model(share);
        }
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if self.running[i].seq.remaining() == 0 {
                i += 1; // a beam waiting for its siblings' draws
                continue;
            }
            spare -= self.add_draft(i, spare.min(share).min(budget - 1));
            loop {
                let n = self.chunk_len(&self.running[i], budget);
                if n == 0 {
                    // A media item that does not fit what is left of the budget: next step.
                    i += 1;
                    break;
                }
                let e = &mut self.running[i];
                if self.kv.grow(&mut e.seq.kv, n, copies) {
                    out.push((i, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                if e.spec.draft_len > 0 {
                    // No room for the draft: decode without it before preempting anyone.
                    e.strip_draft();
                    continue;
                }
                let victim = self.running.len() - 1;
                if victim == 0 {
                    // Alone and still no room: only pinned blocks can hold the rest.
                    let id = self.running[0].seq.req;
                    self.fail_request(id, "the KV cache is exhausted by pinned prefixes; this request cannot continue".into());
                    return out;
                }
                self.preempt(victim);
                preempted = true;
                if victim == i {
                    break;
                }
            }
        }
        if preempted {
            return out;
        }
        // Requests whose adapter is loading or finds no engine slot wait; others go ahead.
        let mut held: Vec<SeqEntry> = Vec::new();
        while budget > 0 && self.running.len() + self.pool_running.len() < self.cfg.max_batch_size {
            if self.pooling_is_next() {
                match self.admit_pooling(budget) {
                    Some(n) => {
                        budget -= n;
                        continue;
                    }
                    None => break,
                }
            }
            let Some(mut e) = self.waiting.pop_front() else {
                break;
            };
            match self.adapter_ready(&e.seq) {
                AdapterWait::Ready => {}
                AdapterWait::Hold => {
                    held.push(e);
                    continue;
                }
                AdapterWait::Failed(msg) => {
                    let id = e.seq.req;
                    self.release(&mut e);
                    self.fail_request(id, msg);
                    continue;
                }
            }
            if e.seq.kv.num_computed == 0 && e.seq.kv.block_table.is_empty() {
                self.reuse_prefix(&mut e);
            }
            let n = self.chunk_len(&e, budget);
            // Not now (no blocks, or a media item wider than the budget left): give back the
            // cached prefix (it stays cached) and keep FCFS order.
            let mut no_copies = BlockCopies::default();
            if n == 0 || !self.kv.grow(&mut e.seq.kv, n, &mut no_copies) {
                self.release(&mut e);
                self.waiting.push_front(e);
                break;
            }
            let s = &e.seq;
            if let Some(r) = self.requests.get_mut(&s.req)
                && r.first_scheduled.is_none()
            {
                r.first_scheduled = Some(Instant::now());
                let cached = s.kv.num_computed.min(s.prompt_len);
                r.cached_prompt_tokens = cached;
                self.metrics
                    .prompt_tokens
                    .fetch_add(s.prompt_len as u64, Relaxed);
                self.metrics
                    .prefix_cached_tokens
                    .fetch_add(cached as u64, Relaxed);
                self.metrics
                    .media_items
                    .fetch_add(r.params.prompt.media().len() as u64, Relaxed);
            }
            self.running.push(e);
            out.push((self.running.len() - 1, n));
            budget -= n;
        }
        self.metrics
            .lora_waiting_requests
            .store(held.len() as u64, Relaxed);
        for s in held.into_iter().rev() {
            self.waiting.push_front(s);
        }
        out
    }

    /// Tokens `e` computes this step within `budget`: all it has left, or as many as fit
    /// without cutting a media item of its prompt (0 when the next item does not fit).
    fn chunk_len(&self, e: &SeqEntry, budget: usize) -> usize {
        let s = &e.seq;
        let (start, n) = (s.kv.num_computed, s.remaining().min(budget));
        match self.requests.get(&s.req) {
            Some(r) if start < s.prompt_len => r.params.prompt.chunk_end(start, start + n) - start,
            _ => n,
        }
    }

    /// Preemption by recompute: blocks freed (full ones stay in the prefix cache), output kept,
    /// back to the front of the queue.
    pub(super) fn preempt(&mut self, i: usize) {
        let mut e = self.running.remove(i);
        e.strip_draft();
        e.spec.mtp.clear();
        e.beam.pending = None;
        self.release(&mut e);
        self.metrics.preemptions.fetch_add(1, Relaxed);
        tracing::debug!(request = e.seq.req, index = e.seq.index, "preempted");
        self.waiting.push_front(e);
    }

    /// Gives back a sequence's blocks, in the KV pool and in the draft model's.
    pub(super) fn release(&mut self, e: &mut SeqEntry) {
        self.kv.release(&mut e.seq.kv);
        if let Some(dm) = self.draft_model.as_mut() {
            dm.release(&mut e.spec.draft_kv);
        }
    }

    /// Takes the longest cached prefix of full blocks, leaving at least one token to compute.
    pub(super) fn reuse_prefix(&mut self, e: &mut SeqEntry) {
        let Some(r) = self.requests.get(&e.seq.req) else {
            return;
        };
        if wants_prompt_logprobs(&e.seq, r) {
            return; // prompt logprobs need every prompt position's logits
        }
        let s = &mut e.seq;
        self.kv.reuse_prefix(&mut s.kv, &s.tokens, r.cache_key());
    }
}
