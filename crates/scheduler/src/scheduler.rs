//! The rolling-batch loop body: admission, chunked prefill, preemption, one engine step,
//! sampling, detokenization, stop rules and events. Owned by one thread (see `handle.rs`);
//! everything here is synchronous and deterministic for a given order of submissions.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use lmi_engine::engine::StepEngine;
use lmi_engine::sampling::{Sampled, derive_seed};
use lmi_engine::{BLOCK_SIZE, StepBatch, StepOutput, TokenMask};
use lmi_text::{IncrementalDetokenizer, Tokenizer};
use tokio::sync::mpsc::Sender;

use crate::adapters::{AdapterSlots, Residency};
use crate::block_pool::BlockPool;
use crate::error::SubmitError;
use crate::event::{Event, FinishReason, Finished, PromptToken, Timings, TokenEvent};
use crate::metrics::SchedulerMetrics;
use crate::prefix_hash::block_hash;
use crate::request::{AdapterId, AdapterRef, GenerateRequest};
use crate::sequence::{RequestId, RequestState, Sequence};
use crate::step_plan::{self, Planned, wants_prompt_logprobs};
use crate::stop::StopMatcher;

mod beams;
mod speculation;
pub(crate) use beams::BeamSearch;
pub use speculation::{DraftSource, NgramLookup, SpeculativeConfig};

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

/// Whether a waiting request's adapter lets it run now.
enum AdapterWait {
    Ready,
    /// Its weights are loading, or every engine slot is pinned or in use.
    Hold,
    Failed(String),
}

pub struct Scheduler {
    engine: Box<dyn StepEngine>,
    tokenizer: Tokenizer,
    eos: Vec<u32>,
    cfg: SchedulerConfig,
    pool: BlockPool,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    requests: HashMap<RequestId, RequestState>,
    metrics: Arc<SchedulerMetrics>,
    next_arrival: u64,
    adapters: AdapterSlots,
    mask_pool: Option<rayon::ThreadPool>,
}

fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_SIZE)
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
        let pool = BlockPool::new(engine.num_blocks());
        let metrics = Arc::new(SchedulerMetrics::default());
        metrics
            .kv_blocks_total
            .store(pool.num_blocks() as u64, Relaxed);
        Scheduler {
            mask_pool: None,
            adapters: AdapterSlots::new(cfg.max_loras),
            engine,
            tokenizer,
            eos,
            cfg,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            requests: HashMap::new(),
            metrics,
            next_arrival: 0,
        }
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
        &self.pool
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    pub fn num_waiting_requests(&self) -> usize {
        self.waiting.iter().filter(|s| s.num_computed == 0).count()
    }

    /// Checks that a request can ever run; the error says what to change.
    pub fn check(&self, req: &GenerateRequest) -> Result<(), SubmitError> {
        check_request(
            req,
            &self.cfg,
            self.pool.num_blocks() - self.pool.num_pinned(),
            self.engine.model_config().vocab_size,
        )
    }

    /// Queues a request whose events go to `tx`.
    pub fn add(
        &mut self,
        id: RequestId,
        req: GenerateRequest,
        tx: Sender<Event>,
    ) -> Result<(), SubmitError> {
        self.check(&req)?;
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
            seed: req.sampling.seed,
            arrival: self.next_arrival,
            tokens: req.prompt.clone(),
            prompt_len: req.prompt.len(),
            num_computed: 0,
            block_table: Vec::new(),
            hashes: Vec::new(),
            detok: IncrementalDetokenizer::with_prompt_tail(
                &req.prompt,
                &self.tokenizer,
                req.skip_special_tokens,
            ),
            stop: StopMatcher::new(
                &req.stopping.stop_strings,
                req.stopping.include_stop_str_in_output,
            ),
            cum_logprob: 0.0,
            first_token_at: None,
            last_token_at: None,
            inter_token: Vec::new(),
            constraint: req
                .constraint
                .as_ref()
                .map(|g| Arc::new(Mutex::new(g.start()))),
            draft_len: 0,
            draft_source: DraftSource::Client,
            spec_k: 4,
            draft_accepted: 0,
            draft_rejected: 0,
            beam_pending: None,
            beam_scores: Vec::new(),
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
        self.waiting.push_back(seq);
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
    }

    fn drop_request(&mut self, id: RequestId) {
        let pool = &mut self.pool;
        let mut release = |s: &Sequence| {
            for &b in s.block_table.iter().rev() {
                pool.free(b);
            }
        };
        self.running.retain(|s| {
            let keep = s.req != id;
            if !keep {
                release(s);
            }
            keep
        });
        self.waiting.retain(|s| {
            let keep = s.req != id;
            if !keep {
                release(s);
            }
            keep
        });
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
        let mut copies: Vec<(u32, u32)> = Vec::new();
        let scheduled = self.schedule(&mut copies);
        if scheduled.is_empty() {
            self.update_gauges();
            return false;
        }
        let chunks = step_plan::chunks(&self.running, &self.requests, &scheduled);
        // Constrained draws: their masks are computed on the mask workers while the forward
        // pass runs; the engine waits for each right before its draw.
        let masks = self.start_masks(&scheduled);
        let batch_tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let (samples, prompt_logprobs, planned) =
            step_plan::requests(&self.running, &self.requests, &scheduled, &chunks, &masks);
        let batch = StepBatch {
            chunks: &chunks,
            samples: &samples,
            prompt_logprobs: &prompt_logprobs,
        };
        let tf = Instant::now();
        let result = self
            .engine
            .copy_blocks(&copies)
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
        match result {
            Ok(out) => {
                // The engine's step includes sampling; the metric keeps it apart.
                let sample_ns = out.sample_time.as_nanos() as u64;
                m.sample_nanos.fetch_add(sample_ns, Relaxed);
                m.forward_nanos
                    .fetch_sub(sample_ns.min(forward.as_nanos() as u64), Relaxed);
                self.process(&planned, out)
            }
            Err(e) => {
                tracing::error!("engine step failed: {e}");
                let ids: Vec<RequestId> = scheduled
                    .iter()
                    .map(|&(i, _)| self.running[i].req)
                    .collect();
                for id in ids {
                    self.fail_request(id, format!("generation failed: {e}"));
                }
            }
        }
        self.metrics
            .step_nanos
            .fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        self.update_gauges();
        true
    }

    /// Picks this step's (running index, new tokens) pairs: running sequences first (oldest
    /// first), preempting the newest when blocks run out, then waiting ones while blocks, the
    /// token budget and the batch size allow. Records copy-on-write block copies in `copies`.
    fn schedule(&mut self, copies: &mut Vec<(u32, u32)>) -> Vec<(usize, usize)> {
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

    /// Starts the mask of every constrained sequence that draws this step (one per scheduled
    /// sequence, None for the others).
    fn start_masks(&mut self, scheduled: &[(usize, usize)]) -> Vec<Option<Arc<TokenMask>>> {
        scheduled
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                let c = s.constraint.as_ref()?;
                if s.num_computed + n != s.tokens.len() {
                    return None; // a prefill chunk that draws nothing
                }
                let mask = Arc::new(TokenMask::pending());
                let (m, c, metrics) = (mask.clone(), c.clone(), self.metrics.clone());
                self.mask_pool().spawn(move || {
                    let t = Instant::now();
                    let bits = lock(&c).mask();
                    metrics.record_mask(t.elapsed());
                    if let Err(e) = &bits {
                        tracing::warn!("computing a constraint mask: {e}");
                    }
                    m.set(bits.ok());
                });
                Some(mask)
            })
            .collect()
    }

    /// The workers computing constraint masks (started on first use).
    fn mask_pool(&mut self) -> &rayon::ThreadPool {
        self.mask_pool.get_or_insert_with(|| {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("lmi-mask-{i}"))
                .build()
                .unwrap_or_else(|e| {
                    tracing::warn!("mask worker pool: {e}; using one thread");
                    rayon::ThreadPoolBuilder::new()
                        .num_threads(1)
                        .build()
                        .expect("a one-thread pool")
                })
        })
    }

    /// Adapters of running sequences (never evicted).
    fn busy_adapters(&self) -> HashSet<AdapterId> {
        self.running
            .iter()
            .filter_map(|s| self.requests.get(&s.req)?.params.adapter_id())
            .collect()
    }

    /// Whether `seq`'s adapter is loaded into the engine (loading it if a slot can be had).
    fn adapter_ready(&mut self, seq: &Sequence) -> AdapterWait {
        let Some(a) = self
            .requests
            .get(&seq.req)
            .and_then(|r| r.params.adapter.clone())
        else {
            return AdapterWait::Ready;
        };
        let weights = match a.weights.get() {
            None => return AdapterWait::Hold,
            Some(Err(e)) => {
                return AdapterWait::Failed(format!("LoRA adapter {}: {e}", a.name));
            }
            Some(Ok(w)) => w.clone(),
        };
        let busy = self.busy_adapters();
        let r = self
            .adapters
            .ensure(self.engine.as_mut(), a.id, &weights, &busy);
        self.update_adapter_metrics();
        match r {
            Residency::Ready => AdapterWait::Ready,
            Residency::NoSlot => AdapterWait::Hold,
            Residency::Failed(e) => AdapterWait::Failed(format!("LoRA adapter {}: {e}", a.name)),
        }
    }

    /// Pins an adapter in the engine (LMI's `pin=true`): loaded as soon as a slot can be
    /// had, never evicted. Refused ("No free lora slots") when pins would take the last slot.
    pub fn pin_adapter(&mut self, a: &AdapterRef) -> Result<(), String> {
        let weights = match a.weights.get() {
            Some(Ok(w)) => w.clone(),
            Some(Err(e)) => return Err(e.clone()),
            None => return Err("its weights are not loaded".into()),
        };
        self.adapters.pin(a.id, weights)?;
        let busy = self.busy_adapters();
        self.adapters.load_pinned(self.engine.as_mut(), &busy);
        self.update_adapter_metrics();
        Ok(())
    }

    /// Forgets an unregistered adapter: unpinned, unloaded once no running sequence uses it.
    pub fn retire_adapter(&mut self, id: AdapterId) {
        let busy = self.busy_adapters();
        self.adapters.retire(self.engine.as_mut(), id, &busy);
        self.update_adapter_metrics();
    }

    fn update_adapter_metrics(&self) {
        let m = &self.metrics;
        m.lora_engine_resident
            .store(self.adapters.resident() as u64, Relaxed);
        m.lora_pinned.store(self.adapters.pinned() as u64, Relaxed);
        m.lora_engine_loads.store(self.adapters.loads, Relaxed);
        m.lora_engine_evictions
            .store(self.adapters.evictions, Relaxed);
    }

    /// Makes room for `n` more tokens of running sequence `i`: copy-on-write of a shared
    /// partial block, then new blocks. False when the pool is out of blocks.
    fn grow(&mut self, i: usize, n: usize, copies: &mut Vec<(u32, u32)>) -> bool {
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
    fn preempt(&mut self, i: usize) {
        let mut s = self.running.remove(i);
        speculation::strip_draft(&mut s);
        s.beam_pending = None;
        self.release(&mut s);
        self.metrics.preemptions.fetch_add(1, Relaxed);
        tracing::debug!(request = s.req, index = s.index, "preempted");
        self.waiting.push_front(s);
    }

    fn release(&mut self, s: &mut Sequence) {
        for &b in s.block_table.iter().rev() {
            self.pool.free(b);
        }
        s.block_table.clear();
        s.hashes.clear();
        s.num_computed = 0;
    }

    /// Takes the longest cached prefix of full blocks, leaving at least one token to compute.
    fn reuse_prefix(&mut self, s: &mut Sequence) {
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

    fn process(&mut self, planned: &[Planned], out: StepOutput) {
        let mut prompt_logprobs: Vec<Option<Vec<lmi_engine::TokenLogprob>>> =
            out.prompt_logprobs.into_iter().map(Some).collect();
        let mut samples: Vec<Option<Sampled>> = out.samples.into_iter().map(Some).collect();
        // (running index, sample) of every sequence that got a token this step, parallel
        // sequences forked now last.
        let mut appends: Vec<(usize, Sampled)> = Vec::new();
        let mut forked: Vec<(usize, Sampled)> = Vec::new();
        let mut drafted: Vec<(usize, Vec<Sampled>)> = Vec::new();
        for p in planned {
            let i = p.running;
            if self.running[i].draft_len > 0 {
                // Verified after the others (it may append several tokens).
                let draws = p
                    .samples
                    .clone()
                    .filter_map(|k| samples[k].take())
                    .collect();
                drafted.push((i, draws));
                continue;
            }
            self.running[i].num_computed += p.tokens;
            self.register_full_blocks(i);
            if let Some(lp) = p.prompt_logprobs.and_then(|k| prompt_logprobs[k].take()) {
                self.collect_prompt_logprobs(i, p.start, p.tokens, lp);
            }
            let mut draws = p.samples.clone().filter_map(|k| samples[k].take());
            let Some(first) = draws.next() else { continue };
            let id = self.running[i].req;
            if let Some(req) = self.requests.get_mut(&id)
                && req.beam.is_some()
            {
                // Beams advance together once all have drawn (beams.rs).
                req.forked = true;
                self.running[i].beam_pending = Some(first);
                continue;
            }
            if self.running[i].index == 0
                && let Some(req) = self.requests.get_mut(&id)
                && !req.forked
            {
                // Fork parallel sequences (n > 1 / best_of) off the first one's prefill;
                // each drew its first token from these logits with its own seed.
                req.forked = true;
                req.alive = req.params.num_seqs();
                let seed = req.params.sampling.seed;
                for (idx, smp) in (1..).zip(draws) {
                    let base = &self.running[i];
                    for &b in &base.block_table {
                        self.pool.share(b);
                    }
                    let sib = Sequence {
                        req: id,
                        index: idx,
                        seed: derive_seed(seed, idx as u64),
                        arrival: base.arrival,
                        tokens: base.tokens.clone(),
                        prompt_len: base.prompt_len,
                        num_computed: base.num_computed,
                        block_table: base.block_table.clone(),
                        hashes: base.hashes.clone(),
                        detok: base.detok.clone(),
                        stop: base.stop.clone(),
                        cum_logprob: 0.0,
                        first_token_at: None,
                        last_token_at: None,
                        inter_token: Vec::new(),
                        constraint: base
                            .constraint
                            .as_ref()
                            .map(|c| Arc::new(Mutex::new(lock(c).fork()))),
                        draft_len: 0,
                        draft_source: DraftSource::Client,
                        spec_k: base.spec_k,
                        draft_accepted: 0,
                        draft_rejected: 0,
                        beam_pending: None,
                        beam_scores: Vec::new(),
                    };
                    self.running.push(sib);
                    forked.push((self.running.len() - 1, smp));
                }
            }
            appends.push((i, first));
        }
        appends.extend(forked);
        let now = Instant::now();
        let mut finished: Vec<usize> = Vec::new();
        for (i, smp) in appends {
            if self.append_token(i, smp.token, smp.logprob, smp.top, now) {
                finished.push(i);
            }
        }
        for (i, draws) in drafted {
            if self.accept_draft(i, draws, now) {
                finished.push(i);
            }
        }
        finished.sort_unstable();
        for &i in finished.iter().rev() {
            let mut s = self.running.remove(i);
            self.release(&mut s);
            if let Some(r) = self.requests.get_mut(&s.req) {
                r.alive = r.alive.saturating_sub(1);
                if r.alive == 0 {
                    self.requests.remove(&s.req);
                }
            }
        }
        self.advance_beams();
    }

    /// Registers newly full blocks of running sequence `i` in the prefix cache, pinning those
    /// inside the request's pinned prefix.
    fn register_full_blocks(&mut self, i: usize) {
        let s = &mut self.running[i];
        let Some(r) = self.requests.get(&s.req) else {
            return;
        };
        let adapter = r.params.adapter_id();
        let pin_upto = r.params.pin_prefix_tokens;
        while (s.hashes.len() + 1) * BLOCK_SIZE <= s.num_computed {
            let b = s.hashes.len();
            let h = block_hash(
                s.hashes.last().copied(),
                &s.tokens[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE],
                adapter,
            );
            self.pool.register(s.block_table[b], h);
            if (b + 1) * BLOCK_SIZE <= pin_upto {
                self.pool.pin(h);
            }
            s.hashes.push(h);
        }
    }

    /// Adds the scores of prompt tokens `start + 1 ..= start + n` (those inside the prompt)
    /// and sends them all once the prompt is done.
    fn collect_prompt_logprobs(
        &mut self,
        i: usize,
        start: usize,
        n: usize,
        scores: Vec<lmi_engine::TokenLogprob>,
    ) {
        let s = &self.running[i];
        let Some(r) = self.requests.get_mut(&s.req) else {
            return;
        };
        if start == 0 {
            r.prompt_logprobs.push(PromptToken {
                id: s.tokens[0],
                logprob: None,
                top: vec![],
            });
        }
        for (j, sc) in scores.into_iter().enumerate() {
            r.prompt_logprobs.push(PromptToken {
                id: s.tokens[start + j + 1],
                logprob: Some(sc.logprob),
                top: sc.top,
            });
        }
        if start + n >= s.prompt_len {
            r.prompt_logprobs_sent = true;
            let lp = std::mem::take(&mut r.prompt_logprobs);
            r.send(Event::Prefill(lp));
        }
    }

    /// Appends a sampled token to running sequence `i`, sends its event, applies the stop
    /// rules. Returns true when the sequence is finished.
    fn append_token(
        &mut self,
        i: usize,
        token: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
        now: Instant,
    ) -> bool {
        let s = &mut self.running[i];
        let Some(r) = self.requests.get(&s.req) else {
            return true;
        };
        let p = &r.params;
        s.tokens.push(token);
        s.cum_logprob += logprob as f64;
        // Constrained output moves on in its grammar; a complete grammar ends the sequence.
        let mut grammar_done = false;
        if let Some(c) = &s.constraint {
            let mut c = lock(c);
            if let Err(e) = c.commit(token) {
                r.send(Event::Error(format!("the output left its grammar: {e}")));
                return true;
            }
            grammar_done = c.is_finished();
        }
        match s.last_token_at {
            Some(t) => s.inter_token.push(now - t),
            None => s.first_token_at = Some(now),
        }
        s.last_token_at = Some(now);
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        let generated = s.tokens.len() - s.prompt_len;

        let delta = match s.detok.push(&self.tokenizer, token) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("detokenizing token {token}: {e}");
                String::new()
            }
        };
        let is_stop_id = p.stopping.stop_token_ids.contains(&token)
            || (!p.stopping.ignore_eos && self.eos.contains(&token));
        let mut reason = None;
        let mut text = String::new();
        if is_stop_id {
            reason = Some(FinishReason::EosToken);
        } else {
            let (emit, hit) = s.stop.push(&delta);
            text = emit;
            if hit {
                reason = Some(FinishReason::StopSequence);
            } else if grammar_done {
                // The grammar's last token is output; it ends the sequence like an EOS would.
                reason = Some(FinishReason::EosToken);
            }
        }
        if reason.is_none()
            && (generated >= p.stopping.max_new_tokens || s.tokens.len() >= self.cfg.max_model_len)
        {
            reason = Some(FinishReason::Length);
        }
        if matches!(reason, Some(FinishReason::Length | FinishReason::EosToken)) {
            // Release held-back text and any incomplete character at the end.
            if let Ok(rest) = s.detok.flush(&self.tokenizer) {
                let (emit, _) = s.stop.push(&rest);
                text.push_str(&emit);
            }
            text.push_str(&s.stop.finish());
        }
        let alive = r.send(Event::Token(TokenEvent {
            index: s.index,
            id: token,
            text,
            logprob,
            top,
            special: self.tokenizer.is_special(token),
            finish: reason,
        }));
        let Some(reason) = reason else { return !alive };
        let submitted = r.submitted;
        let timings = Timings {
            queue: r.first_scheduled.map(|t| t - submitted).unwrap_or_default(),
            time_to_first_token: s.first_token_at.map(|t| t - submitted).unwrap_or_default(),
            total: now - submitted,
            inter_token: std::mem::take(&mut s.inter_token),
        };
        r.send(Event::Finished(Finished {
            index: s.index,
            reason,
            text: s.stop.text().to_string(),
            generated_tokens: generated,
            prompt_tokens: s.prompt_len,
            cached_prompt_tokens: r.cached_prompt_tokens,
            cumulative_logprob: s.cum_logprob,
            timings,
            accepted_draft_tokens: s.draft_accepted,
            rejected_draft_tokens: s.draft_rejected,
        }));
        true
    }

    fn update_gauges(&self) {
        let m = &self.metrics;
        m.running.store(self.running.len() as u64, Relaxed);
        m.waiting.store(self.waiting.len() as u64, Relaxed);
        m.kv_blocks_used.store(self.pool.num_used() as u64, Relaxed);
    }
}

/// The submit-time checks, shared by the scheduler and its handle.
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
    // Beams may each hold their own blocks.
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
