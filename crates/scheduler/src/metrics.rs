//! Gauges and counters the scheduler thread updates and the server's /metrics reads.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug, Default)]
pub struct SchedulerMetrics {
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    /// The sliding-window layers' own pool (0 of 0 without one).
    pub kv_window_blocks_used: AtomicU64,
    pub kv_window_blocks_total: AtomicU64,
    /// Recurrent-state slots (models with linear-attention layers; 0 of 0 without): held by
    /// sequences, holding prefix snapshots, in all.
    pub state_slots_used: AtomicU64,
    pub state_snapshots: AtomicU64,
    pub state_slots_total: AtomicU64,
    /// Prompt tokens admitted, and how many of them came from the prefix cache.
    pub prompt_tokens: AtomicU64,
    pub prefix_cached_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub steps: AtomicU64,
    /// Tokens in the last step's batch, and its number of sequences.
    pub last_batch_tokens: AtomicU64,
    pub last_batch_seqs: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens run through the model (prefix-cache hits are not).
    pub computed_tokens: AtomicU64,
    /// Wall time of steps, and of the engine's forward pass inside them (the difference is the
    /// scheduler's own overhead: batching, sampling, detokenizing, stop rules, events).
    pub step_nanos: AtomicU64,
    pub forward_nanos: AtomicU64,
    /// Of the scheduler's own time, the part spent sampling (vocabulary-sized passes per row;
    /// on a GPU backend this moves into the device step).
    pub sample_nanos: AtomicU64,
    /// LoRA adapters uploaded into the engine's slots, pinned among them, and the uploads
    /// and evictions so far (the engine tier of the adapter cache).
    pub lora_engine_resident: AtomicU64,
    pub lora_pinned: AtomicU64,
    pub lora_engine_loads: AtomicU64,
    pub lora_engine_evictions: AtomicU64,
    /// Requests waiting for their adapter (its weights loading, or no engine slot free).
    pub lora_waiting_requests: AtomicU64,
    /// Constraint masks computed, their total time, and the most recent durations (µs) for
    /// percentiles.
    /// Speculative decoding, per [`crate::DraftSource`]: draft tokens proposed and kept.
    pub spec_proposed: [AtomicU64; 4],
    pub spec_accepted: [AtomicU64; 4],
    pub masks: AtomicU64,
    pub mask_nanos: AtomicU64,
    /// The engine's CUDA graphs: captured, and keys whose capture failed (all 0 without).
    pub cuda_graphs_captured: AtomicU64,
    pub cuda_graphs_failed: AtomicU64,
    /// Media items in admitted prompts; items the vision encoder ran on, items served from
    /// its cache, and its time.
    pub media_items: AtomicU64,
    pub encoder_items: AtomicU64,
    pub encoder_cache_hits: AtomicU64,
    pub encoder_nanos: AtomicU64,
    /// Embedding and scoring requests admitted into a step, and their input tokens (apart
    /// from `prompt_tokens`, which counts generation prompts); those waiting now (also in
    /// `waiting`).
    pub pooling_requests: AtomicU64,
    pub pooling_prompt_tokens: AtomicU64,
    pub pooling_waiting: AtomicU64,
    recent_masks: std::sync::Mutex<std::collections::VecDeque<u32>>,
}

/// Mask durations kept for percentiles.
const RECENT_MASKS: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MetricsSnapshot {
    pub running: u64,
    pub waiting: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_total: u64,
    pub kv_window_blocks_used: u64,
    pub kv_window_blocks_total: u64,
    pub state_slots_used: u64,
    pub state_snapshots: u64,
    pub state_slots_total: u64,
    pub prompt_tokens: u64,
    pub prefix_cached_tokens: u64,
    pub preemptions: u64,
    pub steps: u64,
    pub last_batch_tokens: u64,
    pub last_batch_seqs: u64,
    pub generated_tokens: u64,
    pub computed_tokens: u64,
    pub step_nanos: u64,
    pub forward_nanos: u64,
    pub sample_nanos: u64,
    pub lora_engine_resident: u64,
    pub lora_pinned: u64,
    pub lora_engine_loads: u64,
    pub lora_engine_evictions: u64,
    pub lora_waiting_requests: u64,
    pub spec_proposed: [u64; 4],
    pub spec_accepted: [u64; 4],
    pub masks: u64,
    pub mask_nanos: u64,
    pub cuda_graphs_captured: u64,
    pub cuda_graphs_failed: u64,
    pub media_items: u64,
    pub encoder_items: u64,
    pub encoder_cache_hits: u64,
    pub encoder_nanos: u64,
    pub pooling_requests: u64,
    pub pooling_prompt_tokens: u64,
    pub pooling_waiting: u64,
}

impl MetricsSnapshot {
    /// The fuller of the KV pools (and the state slots), as a share: where the window pool
    /// fills first, admission stops there (what a load balancer reading `vllm:kv_cache_usage_perc` must see).
    pub fn kv_usage(&self) -> f64 {
        let share = |used: u64, total: u64| {
            if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            }
        };
        share(self.kv_blocks_used, self.kv_blocks_total)
            .max(share(
                self.kv_window_blocks_used,
                self.kv_window_blocks_total,
            ))
            .max(share(self.state_slots_used, self.state_slots_total))
    }

    /// Share of admitted prompt tokens served from the prefix cache.
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.prefix_cached_tokens as f64 / self.prompt_tokens as f64
        }
    }
}

impl SchedulerMetrics {
    /// Records one constraint mask's computation time.
    pub fn record_mask(&self, d: std::time::Duration) {
        self.masks.fetch_add(1, Relaxed);
        self.mask_nanos.fetch_add(d.as_nanos() as u64, Relaxed);
        if let Ok(mut r) = self.recent_masks.lock() {
            if r.len() == RECENT_MASKS {
                r.pop_front();
            }
            r.push_back(d.as_micros().min(u128::from(u32::MAX)) as u32);
        }
    }

    /// The `q`-quantile (0..=1) of the recent mask times, in µs.
    pub fn mask_quantile_micros(&self, q: f64) -> Option<u32> {
        let r = self.recent_masks.lock().ok()?;
        if r.is_empty() {
            return None;
        }
        let mut v: Vec<u32> = r.iter().copied().collect();
        v.sort_unstable();
        let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        v.get(i).copied()
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            kv_blocks_used: self.kv_blocks_used.load(Relaxed),
            kv_blocks_total: self.kv_blocks_total.load(Relaxed),
            kv_window_blocks_used: self.kv_window_blocks_used.load(Relaxed),
            kv_window_blocks_total: self.kv_window_blocks_total.load(Relaxed),
            state_slots_used: self.state_slots_used.load(Relaxed),
            state_snapshots: self.state_snapshots.load(Relaxed),
            state_slots_total: self.state_slots_total.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            prefix_cached_tokens: self.prefix_cached_tokens.load(Relaxed),
            preemptions: self.preemptions.load(Relaxed),
            steps: self.steps.load(Relaxed),
            last_batch_tokens: self.last_batch_tokens.load(Relaxed),
            last_batch_seqs: self.last_batch_seqs.load(Relaxed),
            generated_tokens: self.generated_tokens.load(Relaxed),
            computed_tokens: self.computed_tokens.load(Relaxed),
            step_nanos: self.step_nanos.load(Relaxed),
            forward_nanos: self.forward_nanos.load(Relaxed),
            sample_nanos: self.sample_nanos.load(Relaxed),
            lora_engine_resident: self.lora_engine_resident.load(Relaxed),
            lora_pinned: self.lora_pinned.load(Relaxed),
            lora_engine_loads: self.lora_engine_loads.load(Relaxed),
            lora_engine_evictions: self.lora_engine_evictions.load(Relaxed),
            lora_waiting_requests: self.lora_waiting_requests.load(Relaxed),
            spec_proposed: self.spec_proposed.each_ref().map(|a| a.load(Relaxed)),
            spec_accepted: self.spec_accepted.each_ref().map(|a| a.load(Relaxed)),
            masks: self.masks.load(Relaxed),
            mask_nanos: self.mask_nanos.load(Relaxed),
            cuda_graphs_captured: self.cuda_graphs_captured.load(Relaxed),
            cuda_graphs_failed: self.cuda_graphs_failed.load(Relaxed),
            media_items: self.media_items.load(Relaxed),
            encoder_items: self.encoder_items.load(Relaxed),
            encoder_cache_hits: self.encoder_cache_hits.load(Relaxed),
            encoder_nanos: self.encoder_nanos.load(Relaxed),
            pooling_requests: self.pooling_requests.load(Relaxed),
            pooling_prompt_tokens: self.pooling_prompt_tokens.load(Relaxed),
            pooling_waiting: self.pooling_waiting.load(Relaxed),
        }
    }
}
