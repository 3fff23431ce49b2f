//! Admission and room in the KV pool: which sequences run this step and with how many
//! tokens (chunked prefill, drafts), copy-on-write of shared blocks, preemption by recompute,
//! and prefix-cache reuse for new sequences.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use lmi_engine::BLOCK_SIZE;

use super::lora::AdapterWait;
use super::{Scheduler, blocks_for, speculation};
use crate::prefix_hash::block_hash;
use crate::sequence::Sequence;
use crate::step_plan::wants_prompt_logprobs;

impl Scheduler {
    /// Picks this step's (running index, new tokens) pairs: running sequences first (oldest
    /// first), preempting the newest when blocks run out, then waiting ones while blocks, the
    /// token budget and the batch size allow. Records copy-on-write block copies in `copies`.
    pub(super) fn schedule(&mut self, copies: &mut Vec<(u32, u32)>) -> Vec<(usize, usize)> {
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
            if self.running[i].remaining() == 0 {
                i += 1; // a beam waiting for its siblings' draws
                continue;
            }
            spare -= self.add_draft(i, spare.min(share).min(budget - 1));
            loop {
                let n = self.running[i].remaining().min(budget);
                if self.grow(i, n, copies) {
                    out.push((i, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                if self.running[i].draft_len > 0 {
                    // No room for the draft: decode without it before preempting anyone.
                    speculation::strip_draft(&mut self.running[i]);
                    continue;
                }
                let victim = self.running.len() - 1;
                if victim == 0 {
                    // Alone and still no room: only pinned blocks can hold the rest.
                    let id = self.running[0].req;
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
        let mut held: Vec<Sequence> = Vec::new();
        while budget > 0 && self.running.len() < self.cfg.max_batch_size {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            match self.adapter_ready(&seq) {
                AdapterWait::Ready => {}
                AdapterWait::Hold => {
                    held.push(seq);
                    continue;
                }
                AdapterWait::Failed(msg) => {
                    let id = seq.req;
                    self.release(&mut seq);
                    self.fail_request(id, msg);
                    continue;
                }
            }
            if seq.num_computed == 0 && seq.block_table.is_empty() {
                self.reuse_prefix(&mut seq);
            }
            let n = seq.remaining().min(budget);
            let need = blocks_for(seq.num_computed + n).saturating_sub(seq.block_table.len());
            if need > self.pool.num_free() {
                // Not now: give back the cached prefix (it stays cached) and keep FCFS order.
                self.release(&mut seq);
                self.waiting.push_front(seq);
                break;
            }
            for _ in 0..need {
                if let Some(b) = self.pool.allocate() {
                    seq.block_table.push(b);
                }
            }
            if let Some(r) = self.requests.get_mut(&seq.req)
                && r.first_scheduled.is_none()
            {
                r.first_scheduled = Some(Instant::now());
                let cached = seq.num_computed.min(seq.prompt_len);
                r.cached_prompt_tokens = cached;
                self.metrics
                    .prompt_tokens
                    .fetch_add(seq.prompt_len as u64, Relaxed);
                self.metrics
                    .prefix_cached_tokens
                    .fetch_add(cached as u64, Relaxed);
            }
            self.running.push(seq);
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

    /// Makes room for `n` more tokens of running sequence `i`: copy-on-write of a shared
    /// partial block, then new blocks. False when the pool is out of blocks.
    pub(super) fn grow(&mut self, i: usize, n: usize, copies: &mut Vec<(u32, u32)>) -> bool {
        let s = &mut self.running[i];
        let first = s.num_computed / BLOCK_SIZE;
        if let Some(&b) = s.block_table.get(first)
            && self.pool.ref_count(b) > 1
        {
            let Some(nb) = self.pool.allocate() else {
                return false;
            };
            copies.push((b, nb));
            self.pool.free(b);
            s.block_table[first] = nb;
        }
        let need = blocks_for(s.num_computed + n).saturating_sub(s.block_table.len());
        if need > self.pool.num_free() {
            return false;
        }
        for _ in 0..need {
            if let Some(b) = self.pool.allocate() {
                s.block_table.push(b);
            }
        }
        true
    }

    /// Preemption by recompute: blocks freed (full ones stay in the prefix cache), output kept,
    /// back to the front of the queue.
    pub(super) fn preempt(&mut self, i: usize) {
        let mut s = self.running.remove(i);
        speculation::strip_draft(&mut s);
        s.beam_pending = None;
        self.release(&mut s);
        self.metrics.preemptions.fetch_add(1, Relaxed);
        tracing::debug!(request = s.req, index = s.index, "preempted");
        self.waiting.push_front(s);
    }

    pub(super) fn release(&mut self, s: &mut Sequence) {
        for &b in s.block_table.iter().rev() {
            self.pool.free(b);
        }
        self.release_draft(s);
        s.block_table.clear();
        s.hashes.clear();
        s.num_computed = 0;
    }

    /// Takes the longest cached prefix of full blocks, leaving at least one token to compute.
    pub(super) fn reuse_prefix(&mut self, s: &mut Sequence) {
        let Some(r) = self.requests.get(&s.req) else {
            return;
        };
        if wants_prompt_logprobs(s, r) {
            return; // prompt logprobs need every prompt position's logits
        }
        let adapter = r.params.adapter_id();
        let max_blocks = (s.tokens.len() - 1) / BLOCK_SIZE;
        let mut parent = None;
        for b in 0..max_blocks {
            let h = block_hash(
                parent,
                &s.tokens[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE],
                adapter,
            );
            match self.pool.lookup(h) {
                Some(block) => {
                    s.block_table.push(block);
                    s.hashes.push(h);
                    parent = Some(h);
                }
                None => break,
            }
        }
        s.num_computed = s.block_table.len() * BLOCK_SIZE;
    }
}
