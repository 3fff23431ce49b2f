//! The rolling-batch loop: it plans each step and owns the objects that carry it out (the
//! engine, the KV manager, the sequences with their strategies' state, the adapter slots).
//! Admission, chunked prefill, preemption, one engine step, sampling, detokenization, stop
//! rules and events; pooling requests (embeddings, scores) run whole in a step beside them. Owned by one thread (see `handle.rs`);
//! everything here is synchronous and deterministic for a given order of submissions.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use lmi_engine_core::StepBatch;
use lmi_engine_core::engine::StepEngine;
use lmi_text::{IncrementalDetokenizer, Tokenizer};
use tokio::sync::mpsc::Sender;

use crate::adapters::AdapterSlots;
use crate::block_pool::BlockPool;
use crate::entry::SeqEntry;
use crate::error::SubmitError;
use crate::event::Event;
use crate::kv_manager::{BlockCopies, KvManager, SeqBlocks, blocks_for};
use crate::metrics::SchedulerMetrics;
use crate::pooling::PoolEntry;
use crate::request::GenerateRequest;
use crate::request_state::RequestState;
use crate::sequence::{RequestId, Sequence};
use crate::step_plan;
use crate::stop::StopMatcher;
use crate::strategy::beam::{BeamSearch, BeamState};
use crate::strategy::draft_model::DraftModel;
use crate::strategy::sampling::SamplingState;
use crate::strategy::speculation::{SpecState, SpeculativeConfig};

mod admission;
mod beams;
mod draft_model;
mod forks;
mod lora;
mod masks;
mod output;
mod pooling;
mod speculation;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Sequences running at once (LMI's max_rolling_batch_size).
    pub max_batch_size: usize,
    /// Tokens per step, prefill chunks and decode tokens together
    /// (LMI's max_rolling_batch_prefill_tokens).
    pub max_batch_tokens: usize,
    /// Longest prompt + output (the model's length unless lowered).
    pub max_model_len: usize,
    /// Requests allowed to wait (LMI's job_queue_size); more are refused.
    pub max_waiting: usize,
    /// LoRA adapters resident in the engine at once (LMI's max_loras).
    pub max_loras: usize,
    /// Speculative decoding (drafts from clients and, when set, prompt lookup).
    pub speculative: SpeculativeConfig,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch_size: 64,
            max_batch_tokens: 4096,
            max_model_len: 4096,
            max_waiting: 1000,
            max_loras: 4,
            speculative: SpeculativeConfig::default(),
        }
    }
}

/// Locks a mutex, ignoring poisoning (a panic elsewhere must not wedge the scheduler).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Scheduler {
    engine: Box<dyn StepEngine>,
    tokenizer: Tokenizer,
    eos: Vec<u32>,
    cfg: SchedulerConfig,
    kv: KvManager,
    waiting: VecDeque<SeqEntry>,
    running: Vec<SeqEntry>,
    /// Pooling requests waiting, and those admitted into the step being planned (empty
    /// between steps: they finish in the step that runs them).
    pool_waiting: VecDeque<PoolEntry>,
    pool_running: Vec<PoolEntry>,
    requests: HashMap<RequestId, RequestState>,
    metrics: Arc<SchedulerMetrics>,
    next_arrival: u64,
    adapters: AdapterSlots,
    mask_pool: Option<rayon::ThreadPool>,
    /// Speculative decoding's draft model, when one is configured.
    draft_model: Option<DraftModel>,
}

impl Scheduler {
    pub fn new(
        engine: Box<dyn StepEngine>,
        tokenizer: Tokenizer,
        mut cfg: SchedulerConfig,
    ) -> Self {
        let mut eos = engine.model_config().eos_token_ids.clone();
        for id in tokenizer.eos_token_ids() {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        cfg.max_model_len = cfg
            .max_model_len
            .min(engine.model_config().max_position_embeddings);
        cfg.max_batch_size = cfg.max_batch_size.max(1);
        cfg.max_batch_tokens = cfg.max_batch_tokens.max(1);
        let mut kv = KvManager::with_window(engine.num_blocks(), engine.kv_window());
        if let Some(states) = engine.state_config() {
            // A running sequence holds a state slot; a quarter of them (at least one) stay for
            // prefix snapshots and drafts' backups.
            let most = states.slots - (states.slots / 4).max(1);
            if cfg.max_batch_size > most {
                tracing::warn!(
                    "max batch size lowered from {} to {most}: the model's recurrent-state \
                     slots ({}) hold one per running sequence and the prefix snapshots",
                    cfg.max_batch_size,
                    states.slots
                );
                cfg.max_batch_size = most;
            }
            kv = kv.with_states(states.slots);
        }
        let metrics = Arc::new(SchedulerMetrics::default());
        metrics
            .kv_blocks_total
            .store(kv.pool().num_blocks() as u64, Relaxed);
        metrics.kv_window_blocks_total.store(
            kv.window_pool().map_or(0, |p| p.num_blocks()) as u64,
            Relaxed,
        );
        metrics
            .state_slots_total
            .store(kv.state_pool().map_or(0, |p| p.num_slots()) as u64, Relaxed);
        if let Some(g) = engine.graph_stats() {
            metrics
                .cuda_graphs_captured
                .store(g.captured as u64, Relaxed);
            metrics.cuda_graphs_failed.store(g.failed as u64, Relaxed);
        }
        Scheduler {
            mask_pool: None,
            draft_model: None,
            adapters: AdapterSlots::new(cfg.max_loras),
            engine,
            tokenizer,
            eos,
            cfg,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool_waiting: VecDeque::new(),
            pool_running: Vec::new(),
            requests: HashMap::new(),
            metrics,
            next_arrival: 0,
        }
    }

    /// Adds a draft model for speculative decoding (option.speculative_draft_model); it must
    /// share the target's vocabulary (and tokenizer).
    pub fn with_draft_model(mut self, engine: Box<dyn StepEngine>) -> Result<Self, String> {
        if engine.kv_window().is_some() {
            return Err("the draft model's engine keeps window pools; load it with \
                        EngineOptions::window_pools false"
                .into());
        }
        if engine.state_config().is_some() {
            return Err(
                "a model with linear-attention layers (Qwen3.5, Qwen3-Next) cannot \
                        be a draft model yet: choose an attention-only one"
                    .into(),
            );
        }
        let dm = DraftModel::new(engine);
        let (d, t) = (dm.vocab_size(), self.engine.model_config().vocab_size);
        if d != t {
            return Err(format!(
                "the draft model's vocabulary ({d} tokens) differs from the model's ({t}): a draft \
                 model must share the tokenizer"
            ));
        }
        self.draft_model = Some(dm);
        Ok(self)
    }

    pub fn metrics(&self) -> Arc<SchedulerMetrics> {
        self.metrics.clone()
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }

    pub fn engine(&self) -> &dyn StepEngine {
        self.engine.as_ref()
    }

    pub fn pool(&self) -> &BlockPool {
        self.kv.pool()
    }

    /// The sliding-window layers' pool, when the engine keeps one.
    pub fn window_pool(&self) -> Option<&BlockPool> {
        self.kv.window_pool()
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.pool_waiting.is_empty()
    }

    pub fn num_waiting_requests(&self) -> usize {
        self.waiting
            .iter()
            .filter(|e| e.seq.kv.num_computed == 0)
            .count()
            + self.pool_waiting.len()
    }

    /// Checks that a request fits the pool as it is now (pinned prefixes take blocks for
    /// good). Everything else was checked once by `Handle::submit` ([`check_request`]).
    fn check_fits_now(&self, req: &GenerateRequest) -> Result<(), SubmitError> {
        check_fits(req, self.kv.usable_blocks())
    }

    /// Queues a request whose events go to `tx`.
    pub fn add(
        &mut self,
        id: RequestId,
        req: GenerateRequest,
        tx: Sender<Event>,
    ) -> Result<(), SubmitError> {
        self.check_fits_now(&req)?;
        if self.num_waiting_requests() >= self.cfg.max_waiting {
            return Err(SubmitError::QueueFull(self.cfg.max_waiting));
        }
        let mut req = req;
        // Beams draw greedily with 2 * width alternatives: their candidates.
        let beam = req.beam.clone().map(|b| {
            let user_top_n = req.sampling.top_logprobs as usize;
            req.sampling.top_logprobs = req.sampling.top_logprobs.max(2 * b.width as u32);
            BeamSearch::new(b, user_top_n)
        });
        let mut stop_ids = req.stopping.stop_token_ids.clone();
        if !req.stopping.ignore_eos {
            stop_ids.extend(self.eos.iter().copied());
        }
        let seq = Sequence {
            req: id,
            index: 0,
            arrival: self.next_arrival,
            tokens: req.prompt.to_vec(),
            prompt_len: req.prompt.len(),
            kv: SeqBlocks::for_prompt(req.prompt.len()),
            detok: IncrementalDetokenizer::with_prompt_tail(
                &req.prompt,
                &self.tokenizer,
                req.skip_special_tokens,
            ),
            stop: StopMatcher::new(
                &req.stopping.stop_strings,
                req.stopping.include_stop_str_in_output,
            ),
        };
        let entry = SeqEntry {
            seq,
            sampling: SamplingState::new(req.sampling.seed),
            spec: SpecState::default(),
            constraint: req
                .constraint
                .as_ref()
                .map(|g| Arc::new(Mutex::new(g.start()))),
            beam: BeamState::default(),
        };
        self.next_arrival += 1;
        self.requests.insert(
            id,
            RequestState {
                params: Arc::new(req),
                tx,
                submitted: Instant::now(),
                first_scheduled: None,
                prompt_logprobs: Vec::new(),
                prompt_logprobs_sent: false,
                alive: 1,
                forked: false,
                cached_prompt_tokens: 0,
                stop_ids,
                beam,
            },
        );
        self.waiting.push_back(entry);
        self.update_gauges();
        Ok(())
    }

    /// Drops every request whose client went away, freeing its blocks.
    pub fn reap_cancelled(&mut self) {
        let gone: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, r)| r.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.drop_request(id);
        }
        self.reap_cancelled_pooling();
    }

    fn drop_request(&mut self, id: RequestId) {
        let mut gone: Vec<SeqEntry> = Vec::new();
        let (running, waiting): (Vec<SeqEntry>, Vec<SeqEntry>) = (
            std::mem::take(&mut self.running),
            std::mem::take(&mut self.waiting).into(),
        );
        for s in running {
            if s.seq.req == id {
                gone.push(s)
            } else {
                self.running.push(s)
            }
        }
        for s in waiting {
            if s.seq.req == id {
                gone.push(s)
            } else {
                self.waiting.push_back(s)
            }
        }
        for mut s in gone {
            self.release(&mut s);
        }
        self.requests.remove(&id);
        self.update_gauges();
    }

    fn fail_request(&mut self, id: RequestId, msg: String) {
        if let Some(r) = self.requests.get(&id) {
            r.send(Event::Error(msg));
        }
        self.drop_request(id);
    }

    /// One scheduling round and engine step. Returns false when no step ran (nothing to
    /// run, or every waiting request waits for its adapter).
    pub fn step(&mut self) -> bool {
        let t0 = Instant::now();
        self.reap_cancelled();
        let busy = self.busy_adapters();
        self.adapters.unload_retired(self.engine.as_mut(), &busy);
        self.adapters.load_pinned(self.engine.as_mut(), &busy);
        let mut copies = BlockCopies::default();
        let scheduled = self.schedule(&mut copies);
        if scheduled.is_empty() && self.pool_running.is_empty() {
            self.update_gauges();
            return false;
        }
        let (mut chunks, media, mut rope_deltas) =
            step_plan::chunks(&self.running, &self.requests, &scheduled);
        let mut states = step_plan::states(&self.kv, &self.running, &scheduled);
        // Pooling inputs follow the generation chunks, whole.
        let pools = step_plan::pools(
            &self.kv,
            &self.pool_running,
            &mut chunks,
            &mut rope_deltas,
            &mut states,
        );
        let state_copies = self.kv.take_state_copies();
        // Constrained draws: their masks are computed on the mask workers while the forward
        // pass runs; the engine waits for each right before its draw.
        let masks = self.start_masks(&scheduled);
        let batch_tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let (samples, prompt_logprobs, planned) =
            step_plan::requests(&self.running, &self.requests, &scheduled, &chunks, &masks);
        let mtp = match self.engine.mtp() {
            true => step_plan::mtp(&self.running, &self.requests, &scheduled, &self.cfg),
            false => Vec::new(),
        };
        let batch = StepBatch {
            chunks: &chunks,
            samples: &samples,
            prompt_logprobs: &prompt_logprobs,
            media: &media,
            rope_deltas: &rope_deltas,
            states: &states,
            pools: &pools,
            mtp: &mtp,
        };
        let tf = Instant::now();
        let result = self
            .engine
            .copy_blocks(&copies.full)
            .and_then(|_| self.engine.copy_window_blocks(&copies.window))
            .and_then(|_| self.engine.copy_states(&state_copies))
            .and_then(|_| self.engine.step(&batch));
        let forward = tf.elapsed();
        drop((samples, prompt_logprobs));
        // Counters first: a client that reads /metrics right after its last event must see
        // the step that produced it.
        let m = &self.metrics;
        m.steps.fetch_add(1, Relaxed);
        m.last_batch_tokens.store(batch_tokens as u64, Relaxed);
        m.computed_tokens.fetch_add(batch_tokens as u64, Relaxed);
        m.last_batch_seqs.store(chunks.len() as u64, Relaxed);
        m.forward_nanos
            .fetch_add(forward.as_nanos() as u64, Relaxed);
        if let Some(g) = self.engine.graph_stats() {
            m.cuda_graphs_captured.store(g.captured as u64, Relaxed);
            m.cuda_graphs_failed.store(g.failed as u64, Relaxed);
        }
        if !media.is_empty() {
            let e = self.engine.encoder_stats();
            m.encoder_items.store(e.items_encoded, Relaxed);
            m.encoder_cache_hits.store(e.cache_hits, Relaxed);
            m.encoder_nanos.store(e.time.as_nanos() as u64, Relaxed);
        }
        match result {
            Ok(mut out) => {
                // The engine's step includes sampling; the metric keeps it apart.
                let sample_ns = out.sample_time.as_nanos() as u64;
                m.sample_nanos.fetch_add(sample_ns, Relaxed);
                m.forward_nanos
                    .fetch_sub(sample_ns.min(forward.as_nanos() as u64), Relaxed);
                let pooled = std::mem::take(&mut out.pooled);
                // The head's drafts continue each sequence as this step's draws leave it;
                // a sequence it skipped has none.
                let head = self.engine.mtp();
                for &(i, _) in scheduled.iter().filter(|_| head) {
                    self.running[i].spec.mtp.clear();
                }
                for (m, d) in mtp.iter().zip(std::mem::take(&mut out.drafts)) {
                    self.running[scheduled[m.chunk].0].spec.mtp = d;
                }
                self.process(&planned, out);
                self.finish_pooling(pooled);
            }
            Err(e) => {
                tracing::error!("engine step failed: {e}");
                let ids: Vec<RequestId> = scheduled
                    .iter()
                    .map(|&(i, _)| self.running[i].seq.req)
                    .collect();
                for id in ids {
                    self.fail_request(id, format!("generation failed: {e}"));
                }
                self.fail_pooling(&format!("the model failed: {e}"));
            }
        }
        self.metrics
            .step_nanos
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        self.update_gauges();
        true
    }

    fn update_gauges(&self) {
        let m = &self.metrics;
        m.running.store(self.running.len() as u64, Relaxed);
        m.waiting.store(
            (self.waiting.len() + self.pool_waiting.len()) as u64,
            Relaxed,
        );
        m.pooling_waiting
            .store(self.pool_waiting.len() as u64, Relaxed);
        m.kv_blocks_used
            .store(self.kv.pool().num_used() as u64, Relaxed);
        if let Some(p) = self.kv.window_pool() {
            m.kv_window_blocks_used.store(p.num_used() as u64, Relaxed);
        }
        if let Some(p) = self.kv.state_pool() {
            m.state_slots_used.store(p.num_used() as u64, Relaxed);
            m.state_snapshots.store(p.num_cached() as u64, Relaxed);
        }
    }
}

/// The submit-time checks (`Handle::submit`): the one place a request's parameters are
/// validated; the front end turns the error into its schema's message.
pub(crate) fn check_request(
    req: &GenerateRequest,
    cfg: &SchedulerConfig,
    usable_blocks: usize,
    vocab_size: usize,
) -> Result<(), SubmitError> {
    if req.prompt.is_empty() {
        return Err(SubmitError::EmptyPrompt);
    }
    if let Some(b) = &req.beam {
        if b.width == 0 || b.num_return == 0 || b.num_return > b.width {
            return Err(SubmitError::InvalidParams(format!(
                "beam search needs 1 <= num_return_sequences ({}) <= num_beams ({})",
                b.num_return, b.width
            )));
        }
        if !req.sampling.is_greedy() || req.n > 1 || req.best_of > 1 || req.constraint.is_some() {
            return Err(SubmitError::InvalidParams(
                "beam search is deterministic: it cannot be combined with sampling, n, best_of \
                 or a grammar"
                    .into(),
            ));
        }
    }
    check_media(req, cfg, vocab_size)?;
    if let Some(t) = req.draft.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(SubmitError::InvalidParams(format!(
            "draft token id {t} is not in the vocabulary (size {vocab_size})"
        )));
    }
    req.sampling
        .validate()
        .map_err(SubmitError::InvalidParams)?;
    if req.n == 0 {
        return Err(SubmitError::InvalidParams("n must be at least 1".into()));
    }
    if req.best_of > 1 && req.best_of < req.n {
        return Err(SubmitError::InvalidParams(format!(
            "best_of ({}) must be greater than or equal to n ({})",
            req.best_of, req.n
        )));
    }
    let total = req.prompt.len() + req.stopping.max_new_tokens;
    if total > cfg.max_model_len {
        return Err(SubmitError::TooLong {
            prompt: req.prompt.len(),
            max_new: req.stopping.max_new_tokens,
            total,
            max_len: cfg.max_model_len,
        });
    }
    check_fits(req, usable_blocks)
}

/// Media items: placeholders in the vocabulary, and each item small enough for one step's
/// token budget. An item is never split between steps (its positions are computed together),
/// so one longer than the budget could never run; it is refused rather than given a step of
/// its own because the budget is what bounds the engine's step buffers and how long one step
/// holds every other stream.
fn check_media(
    req: &GenerateRequest,
    cfg: &SchedulerConfig,
    vocab_size: usize,
) -> Result<(), SubmitError> {
    for m in req.prompt.media() {
        let (len, id) = (m.item.len, m.item.placeholder);
        if len == 0 {
            return Err(SubmitError::InvalidParams(format!(
                "the media item at prompt position {} has no placeholder tokens",
                m.start
            )));
        }
        if id as usize >= vocab_size {
            return Err(SubmitError::InvalidParams(format!(
                "media placeholder token id {id} is not in the vocabulary (size {vocab_size})"
            )));
        }
        if len > cfg.max_batch_tokens {
            return Err(SubmitError::InvalidParams(format!(
                "a media item of {len} tokens exceeds the step's token budget of {} \
                 (option.max_rolling_batch_prefill_tokens): an item is never split between \
                 steps; raise the budget or send a smaller item",
                cfg.max_batch_tokens
            )));
        }
    }
    Ok(())
}

/// Whether the request's longest output fits `usable_blocks` (beams may each hold their own).
fn check_fits(req: &GenerateRequest, usable_blocks: usize) -> Result<(), SubmitError> {
    let total = req.prompt.len() + req.stopping.max_new_tokens;
    let needed = blocks_for(total) * req.beam.as_ref().map_or(1, |b| b.width);
    if needed > usable_blocks {
        return Err(SubmitError::NeverFits {
            needed,
            tokens: total,
            available: usable_blocks,
        });
    }
    Ok(())
}
