//! The step loop's side of pooling requests (`crate::pooling`): queueing, admission beside
//! generation in arrival order, and their results after the step.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use tokio::sync::mpsc::Sender;

use super::Scheduler;
use crate::error::SubmitError;
use crate::event::{Event, Pooled, Timings};
use crate::kv_manager::{BlockCopies, SeqBlocks};
use crate::pooling::{PoolEntry, check_pooling};
use crate::request::PoolingRequest;
use crate::sequence::RequestId;

impl Scheduler {
    /// Queues an embedding or scoring request (prefill only) whose result goes to `tx`.
    pub fn add_pooling(
        &mut self,
        id: RequestId,
        req: PoolingRequest,
        tx: Sender<Event>,
    ) -> Result<(), SubmitError> {
        check_pooling(
            &req,
            &self.cfg,
            self.pooling_kv_blocks(),
            self.engine.model_config().vocab_size,
            self.engine.pooler().is_some(),
        )?;
        if self.num_waiting_requests() >= self.cfg.max_waiting {
            return Err(SubmitError::QueueFull(self.cfg.max_waiting));
        }
        self.pool_waiting.push_back(PoolEntry {
            id,
            arrival: self.next_arrival,
            req,
            tx,
            submitted: Instant::now(),
            scheduled: None,
            kv: SeqBlocks::default(),
        });
        self.next_arrival += 1;
        self.update_gauges();
        Ok(())
    }

    /// Blocks a pooling input may take now (pinned prefixes hold theirs for good); None when
    /// the engine keeps no KV cache (an encoder: its steps need no blocks).
    pub(super) fn pooling_kv_blocks(&self) -> Option<usize> {
        (self.kv.pool().num_blocks() > 0).then(|| self.kv.usable_blocks())
    }

    /// Whether the oldest waiting request is a pooling one (requests are admitted in the
    /// order they came, whichever kind).
    pub(super) fn pooling_is_next(&self) -> bool {
        self.pool_waiting.front().is_some_and(|p| {
            self.waiting
                .front()
                .is_none_or(|e| p.arrival < e.seq.arrival)
        })
    }

    /// Admits the oldest pooling request into this step when its whole input fits `budget`
    /// and its blocks are free; returns its tokens. None: it waits (and, to keep arrival
    /// order, so does everyone behind it).
    pub(super) fn admit_pooling(&mut self, budget: usize) -> Option<usize> {
        let n = self.pool_waiting.front()?.req.tokens.len();
        if n > budget {
            return None;
        }
        let mut kv = SeqBlocks::default();
        if self.kv.pool().num_blocks() > 0 && !self.kv.grow(&mut kv, n, &mut BlockCopies::default())
        {
            self.kv.release(&mut kv);
            return None;
        }
        let mut p = self.pool_waiting.pop_front()?;
        p.kv = kv;
        p.scheduled = Some(Instant::now());
        self.metrics.pooling_requests.fetch_add(1, Relaxed);
        self.metrics
            .pooling_prompt_tokens
            .fetch_add(n as u64, Relaxed);
        self.pool_running.push(p);
        Some(n)
    }

    /// Sends each pooling request of the step its output (`pooled`, one per request in
    /// order) and frees its blocks.
    pub(super) fn finish_pooling(&mut self, pooled: Vec<Vec<f32>>) {
        let done = std::mem::take(&mut self.pool_running);
        if pooled.len() != done.len() {
            let msg = format!(
                "the engine returned {} pooled outputs for {} inputs",
                pooled.len(),
                done.len()
            );
            tracing::error!("{msg}");
            self.pool_running = done;
            return self.fail_pooling(&msg);
        }
        let now = Instant::now();
        for (mut p, values) in done.into_iter().zip(pooled) {
            self.kv.release(&mut p.kv);
            let total = now - p.submitted;
            let timings = Timings {
                queue: p.scheduled.map(|t| t - p.submitted).unwrap_or_default(),
                time_to_first_token: total,
                total,
                inter_token: Vec::new(),
            };
            let _ = p.tx.try_send(Event::Pooled(Pooled {
                values,
                prompt_tokens: p.req.tokens.len(),
                timings,
            }));
        }
    }

    /// The step failed: each of its pooling requests gets the error, and its blocks back.
    pub(super) fn fail_pooling(&mut self, msg: &str) {
        for mut p in std::mem::take(&mut self.pool_running) {
            self.kv.release(&mut p.kv);
            tracing::debug!(request = p.id, "pooling request failed: {msg}");
            let _ = p.tx.try_send(Event::Error(msg.to_string()));
        }
    }

    /// Drops waiting pooling requests whose client went away.
    pub(super) fn reap_cancelled_pooling(&mut self) {
        self.pool_waiting.retain(|p| !p.tx.is_closed());
    }
}
