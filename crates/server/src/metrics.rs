//! Prometheus metrics of the server (`GET /metrics`). TGI's names where TGI has the metric
//! (tgi.md §3), `lmi_*` for the rest. Request handlers report through
//! [`ServerMetrics::on_request_start`] / [`ServerMetrics::on_request_done`] (or the
//! [`RequestTracker`] guard, which reports a dropped request as `err="dropped"`); scheduler
//! gauges are refreshed from a [`MetricsSnapshot`] on each scrape.
//!
//! The `vllm:*` gauges repeat queue, running and KV-cache values under vLLM's names, which the
//! Gateway API inference extension's endpoint picker reads by default (deploy/k8s, docs/deploy.md).

use std::sync::Arc;
use std::time::Duration;

use lmi_scheduler::MetricsSnapshot;
use prometheus::{
    Counter, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// What a finished request reports. `error: None` is a success.
#[derive(Debug, Clone, Default)]
pub struct RequestOutcome<'a> {
    /// TGI's `err` label: validation, overloaded, generation, incomplete, dropped, template...
    pub error: Option<&'a str>,
    /// End to end.
    pub duration: Duration,
    /// Submit → first scheduled (scheduler `Timings::queue`).
    pub queue: Option<Duration>,
    /// Submit → first token.
    pub time_to_first_token: Option<Duration>,
    /// Gaps between consecutive tokens.
    pub inter_token: &'a [Duration],
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// max_new_tokens asked (or defaulted), when known.
    pub max_new_tokens: Option<usize>,
}

pub struct ServerMetrics {
    registry: Registry,
    request_count: IntCounter,
    request_success: IntCounter,
    request_failure: IntCounterVec,
    route_requests: IntCounterVec,
    route_failures: IntCounterVec,
    in_flight: IntGauge,
    auth_refused: IntCounterVec,
    timed_out: IntCounter,
    request_duration: Histogram,
    queue_duration: Histogram,
    inference_duration: Histogram,
    mean_time_per_token: Histogram,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    input_length: Histogram,
    generated_tokens: Histogram,
    max_new_tokens: Histogram,
    queue_size: IntGauge,
    batch_current_size: IntGauge,
    batch_current_tokens: IntGauge,
    kv_blocks_used: IntGauge,
    kv_blocks_total: IntGauge,
    kv_window_blocks_used: IntGauge,
    kv_window_blocks_total: IntGauge,
    state_slots_used: IntGauge,
    state_snapshots: IntGauge,
    state_slots_total: IntGauge,
    prefix_hit_rate: prometheus::Gauge,
    model_ready: IntGauge,
    prompt_tokens_total: IntCounter,
    prefix_cached_tokens_total: IntCounter,
    generated_tokens_total: IntCounter,
    computed_tokens_total: IntCounter,
    preemptions_total: IntCounter,
    steps_total: IntCounter,
    step_seconds_total: Counter,
    forward_seconds_total: Counter,
    /// Vision-language models: media items in admitted prompts, items encoded, items served
    /// from the encoder cache, and the encoder's time.
    media_items_total: IntCounter,
    encoder_items_total: IntCounter,
    encoder_cache_hits_total: IntCounter,
    encoder_seconds_total: Counter,
    /// Embedding and scoring requests run, their input tokens (not in `lmi_prompt_tokens_total`)
    /// and those waiting now (also in `tgi_queue_size`).
    pooling_requests_total: IntCounter,
    pooling_prompt_tokens_total: IntCounter,
    pooling_waiting: IntGauge,
    /// Speculative decoding, by draft source: draft tokens proposed, kept, and the share kept.
    spec_draft_tokens: IntCounterVec,
    spec_accepted_tokens: IntCounterVec,
    spec_acceptance_rate: GaugeVec,
    cuda_graphs: IntGaugeVec,
    vllm: VllmGauges,
    /// The LoRA adapter cache (registry and engine tiers).
    pub adapters: lmi_scheduler::adapter_registry::AdapterMetrics,
}

/// TGI's buckets for every `*duration`: 1e-4 · 1.5^k, k = 1..=35 (0.00015 s … ≈146 s).
fn duration_buckets() -> Vec<f64> {
    (1..=35).map(|k| 1e-4 * 1.5f64.powi(k)).collect()
}

/// Token-count buckets: 1, 2, 4 … 32768 plus a linear run for short outputs.
fn token_buckets() -> Vec<f64> {
    let mut b: Vec<f64> = (0..=15).map(|k| f64::from(1u32 << k)).collect();
    b.extend([
        3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
    ]);
    b.sort_by(f64::total_cmp);
    b.dedup();
    b
}

impl ServerMetrics {
    pub fn new() -> Self {
        Self::try_new().expect("metric definitions are valid and registered once")
    }

    fn try_new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m;
                registry.register(Box::new(m.clone()))?;
                m
            }};
        }
        let hist = |name: &str, help: &str, buckets: Vec<f64>| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        };
        let d = duration_buckets;
        let t = token_buckets;
        Ok(ServerMetrics {
            request_count: reg!(IntCounter::new("tgi_request_count", "Requests received")?),
            request_success: reg!(IntCounter::new(
                "tgi_request_success",
                "Requests that succeeded"
            )?),
            request_failure: reg!(IntCounterVec::new(
                Opts::new("tgi_request_failure", "Requests that failed, by error kind"),
                &["err"]
            )?),
            route_requests: reg!(IntCounterVec::new(
                Opts::new("lmi_requests_total", "Requests received, by route"),
                &["route"]
            )?),
            route_failures: reg!(IntCounterVec::new(
                Opts::new(
                    "lmi_request_failures_total",
                    "Requests that failed, by route and error kind"
                ),
                &["route", "err"]
            )?),
            auth_refused: reg!(IntCounterVec::new(
                Opts::new(
                    "lmi_auth_refused_total",
                    "Requests refused for a missing or invalid API key"
                ),
                &["reason"]
            )?),
            timed_out: reg!(IntCounter::new(
                "lmi_request_timeouts_total",
                "Requests ended by option.request_timeout"
            )?),
            in_flight: reg!(IntGauge::new(
                "lmi_requests_in_flight",
                "Requests being served now"
            )?),
            request_duration: reg!(hist(
                "tgi_request_duration",
                "End-to-end request duration (s)",
                d()
            )?),
            queue_duration: reg!(hist(
                "tgi_request_queue_duration",
                "Time waiting before the first step (s)",
                d()
            )?),
            inference_duration: reg!(hist(
                "tgi_request_inference_duration",
                "Time from first step to the end (s)",
                d()
            )?),
            mean_time_per_token: reg!(hist(
                "tgi_request_mean_time_per_token_duration",
                "Mean inter-token latency of a request (s)",
                d()
            )?),
            time_to_first_token: reg!(hist(
                "lmi_time_to_first_token_seconds",
                "Time to first token (s)",
                d()
            )?),
            inter_token_latency: reg!(hist(
                "lmi_inter_token_latency_seconds",
                "Time between consecutive tokens (s)",
                d()
            )?),
            input_length: reg!(hist(
                "tgi_request_input_length",
                "Prompt tokens per request",
                t()
            )?),
            generated_tokens: reg!(hist(
                "tgi_request_generated_tokens",
                "Generated tokens per request",
                t()
            )?),
            max_new_tokens: reg!(hist(
                "tgi_request_max_new_tokens",
                "max_new_tokens per request",
                t()
            )?),
            queue_size: reg!(IntGauge::new("tgi_queue_size", "Sequences waiting")?),
            batch_current_size: reg!(IntGauge::new(
                "tgi_batch_current_size",
                "Sequences running"
            )?),
            batch_current_tokens: reg!(IntGauge::new(
                "lmi_batch_last_tokens",
                "Tokens in the last engine step"
            )?),
            kv_blocks_used: reg!(IntGauge::new(
                "lmi_kv_cache_blocks_used",
                "KV cache blocks in use"
            )?),
            kv_blocks_total: reg!(IntGauge::new(
                "lmi_kv_cache_blocks_total",
                "KV cache blocks in the pool"
            )?),
            kv_window_blocks_used: reg!(IntGauge::new(
                "lmi_kv_cache_window_blocks_used",
                "Blocks in use in the sliding-window layers' own pool"
            )?),
            kv_window_blocks_total: reg!(IntGauge::new(
                "lmi_kv_cache_window_blocks_total",
                "Blocks in the sliding-window layers' own pool (0 without one)"
            )?),
            state_slots_used: reg!(IntGauge::new(
                "lmi_state_slots_used",
                "Recurrent-state slots held by sequences (linear-attention models)"
            )?),
            state_snapshots: reg!(IntGauge::new(
                "lmi_state_prefix_snapshots",
                "Recurrent-state slots holding prefix-cache snapshots"
            )?),
            state_slots_total: reg!(IntGauge::new(
                "lmi_state_slots_total",
                "Recurrent-state slots in all (0 for models without linear-attention layers)"
            )?),
            prefix_hit_rate: reg!(prometheus::Gauge::new(
                "lmi_prefix_cache_hit_rate",
                "Share of admitted prompt tokens served from the prefix cache"
            )?),
            model_ready: reg!(IntGauge::new(
                "lmi_model_ready",
                "1 once the model is loaded"
            )?),
            prompt_tokens_total: reg!(IntCounter::new(
                "lmi_prompt_tokens_total",
                "Prompt tokens admitted"
            )?),
            prefix_cached_tokens_total: reg!(IntCounter::new(
                "lmi_prefix_cache_hit_tokens_total",
                "Prompt tokens served from the prefix cache"
            )?),
            generated_tokens_total: reg!(IntCounter::new(
                "lmi_generated_tokens_total",
                "Tokens generated"
            )?),
            computed_tokens_total: reg!(IntCounter::new(
                "lmi_computed_tokens_total",
                "Tokens run through the model"
            )?),
            preemptions_total: reg!(IntCounter::new(
                "lmi_preemptions_total",
                "Sequences preempted"
            )?),
            steps_total: reg!(IntCounter::new(
                "lmi_scheduler_steps_total",
                "Engine steps"
            )?),
            step_seconds_total: reg!(Counter::new(
                "lmi_scheduler_step_seconds_total",
                "Wall time of steps (s)"
            )?),
            forward_seconds_total: reg!(Counter::new(
                "lmi_engine_forward_seconds_total",
                "Wall time of the engine's forward passes (s)"
            )?),
            media_items_total: reg!(IntCounter::new(
                "lmi_media_items_total",
                "Images and videos in admitted prompts"
            )?),
            encoder_items_total: reg!(IntCounter::new(
                "lmi_encoder_items_total",
                "Media items the vision encoder ran on"
            )?),
            encoder_cache_hits_total: reg!(IntCounter::new(
                "lmi_encoder_cache_hits_total",
                "Media items whose embeddings came from the encoder cache"
            )?),
            encoder_seconds_total: reg!(Counter::new(
                "lmi_encoder_seconds_total",
                "Wall time of the vision encoder (s)"
            )?),
            pooling_requests_total: reg!(IntCounter::new(
                "lmi_pooling_requests_total",
                "Embedding and scoring inputs run (each input of a request counts)"
            )?),
            pooling_prompt_tokens_total: reg!(IntCounter::new(
                "lmi_pooling_prompt_tokens_total",
                "Tokens of the embedding and scoring inputs run"
            )?),
            pooling_waiting: reg!(IntGauge::new(
                "lmi_pooling_queue_size",
                "Embedding and scoring inputs waiting for a step"
            )?),
            spec_draft_tokens: reg!(IntCounterVec::new(
                Opts::new(
                    "lmi_spec_draft_tokens_total",
                    "Speculative decoding: draft tokens proposed, by source"
                ),
                &["source"]
            )?),
            spec_accepted_tokens: reg!(IntCounterVec::new(
                Opts::new(
                    "lmi_spec_accepted_tokens_total",
                    "Speculative decoding: draft tokens kept in the output, by source"
                ),
                &["source"]
            )?),
            spec_acceptance_rate: reg!(GaugeVec::new(
                Opts::new(
                    "lmi_spec_acceptance_rate",
                    "Speculative decoding: share of draft tokens kept so far, by source"
                ),
                &["source"]
            )?),
            cuda_graphs: reg!(IntGaugeVec::new(
                Opts::new(
                    "lmi_cuda_graphs",
                    "CUDA graphs of decode steps: captured, and failed (those steps run directly)"
                ),
                &["state"]
            )?),
            adapters: lmi_scheduler::adapter_registry::AdapterMetrics::register(&registry)?,
            vllm: VllmGauges::register(&registry)?,
            registry,
        })
    }

    /// A request arrived on `route` (e.g. "/generate").
    pub fn on_request_start(&self, route: &str) {
        self.request_count.inc();
        self.route_requests.with_label_values(&[route]).inc();
        self.in_flight.inc();
    }

    /// The request started with [`Self::on_request_start`] has finished.
    pub fn on_request_done(&self, route: &str, o: &RequestOutcome<'_>) {
        self.in_flight.dec();
        match o.error {
            None => self.request_success.inc(),
            Some(err) => {
                self.request_failure.with_label_values(&[err]).inc();
                self.route_failures.with_label_values(&[route, err]).inc();
            }
        }
        self.request_duration.observe(o.duration.as_secs_f64());
        if let Some(q) = o.queue {
            self.queue_duration.observe(q.as_secs_f64());
            self.inference_duration
                .observe(o.duration.saturating_sub(q).as_secs_f64());
        }
        if let Some(t) = o.time_to_first_token {
            self.time_to_first_token.observe(t.as_secs_f64());
        }
        if !o.inter_token.is_empty() {
            let mut sum = 0.0;
            for gap in o.inter_token {
                let s = gap.as_secs_f64();
                sum += s;
                self.inter_token_latency.observe(s);
            }
            self.mean_time_per_token
                .observe(sum / o.inter_token.len() as f64);
        }
        if o.prompt_tokens > 0 {
            self.input_length.observe(o.prompt_tokens as f64);
        }
        if o.error.is_none() || o.generated_tokens > 0 {
            self.generated_tokens.observe(o.generated_tokens as f64);
        }
        if let Some(m) = o.max_new_tokens {
            self.max_new_tokens.observe(m as f64);
        }
    }

    /// Starts a request and returns a guard that reports it: call
    /// [`RequestTracker::finish`]; dropped unfinished (client went away), it counts as
    /// `err="dropped"`.
    pub fn track(self: &Arc<Self>, route: &'static str) -> RequestTracker {
        self.on_request_start(route);
        RequestTracker {
            metrics: Arc::clone(self),
            route,
            started: std::time::Instant::now(),
            done: false,
        }
    }

    /// A request refused by the API-key check (`reason`: missing or invalid).
    pub fn auth_refused(&self, reason: &str) {
        self.auth_refused.with_label_values(&[reason]).inc();
    }

    pub fn request_timed_out(&self) {
        self.timed_out.inc();
    }

    pub fn set_model_ready(&self, ready: bool) {
        self.model_ready.set(i64::from(ready));
    }

    /// Copies the scheduler's live values into the gauges and counters.
    pub fn update_from_scheduler(&self, s: &MetricsSnapshot) {
        let g = |gauge: &IntGauge, v: u64| gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
        g(&self.queue_size, s.waiting);
        g(&self.batch_current_size, s.running);
        g(&self.batch_current_tokens, s.last_batch_tokens);
        g(&self.kv_blocks_used, s.kv_blocks_used);
        g(&self.kv_blocks_total, s.kv_blocks_total);
        g(&self.kv_window_blocks_used, s.kv_window_blocks_used);
        g(&self.kv_window_blocks_total, s.kv_window_blocks_total);
        g(&self.state_slots_used, s.state_slots_used);
        g(&self.state_snapshots, s.state_snapshots);
        g(&self.state_slots_total, s.state_slots_total);
        g(&self.pooling_waiting, s.pooling_waiting);
        self.prefix_hit_rate.set(s.prefix_hit_rate());
        // Monotonic totals: advance the counters to the scheduler's values.
        let c = advance;
        c(&self.prompt_tokens_total, s.prompt_tokens);
        c(&self.prefix_cached_tokens_total, s.prefix_cached_tokens);
        c(&self.generated_tokens_total, s.generated_tokens);
        c(&self.computed_tokens_total, s.computed_tokens);
        c(&self.preemptions_total, s.preemptions);
        c(&self.steps_total, s.steps);
        c(&self.pooling_requests_total, s.pooling_requests);
        c(&self.pooling_prompt_tokens_total, s.pooling_prompt_tokens);
        for src in lmi_scheduler::DraftSource::ALL {
            let (k, name) = (src as usize, [src.name()]);
            c(
                &self.spec_draft_tokens.with_label_values(&name),
                s.spec_proposed[k],
            );
            c(
                &self.spec_accepted_tokens.with_label_values(&name),
                s.spec_accepted[k],
            );
            if s.spec_proposed[k] > 0 {
                self.spec_acceptance_rate
                    .with_label_values(&name)
                    .set(s.spec_accepted[k] as f64 / s.spec_proposed[k] as f64);
            }
        }
        let f = |counter: &Counter, nanos: u64| {
            let v = nanos as f64 * 1e-9;
            let cur = counter.get();
            if v > cur {
                counter.inc_by(v - cur);
            }
        };
        f(&self.step_seconds_total, s.step_nanos);
        f(&self.forward_seconds_total, s.forward_nanos);
        f(&self.encoder_seconds_total, s.encoder_nanos);
        c(&self.media_items_total, s.media_items);
        c(&self.encoder_items_total, s.encoder_items);
        c(&self.encoder_cache_hits_total, s.encoder_cache_hits);
        for (state, n) in [
            ("captured", s.cuda_graphs_captured),
            ("failed", s.cuda_graphs_failed),
        ] {
            g(&self.cuda_graphs.with_label_values(&[state]), n);
        }
        self.adapters.update_from_scheduler(s);
        self.vllm.update_from_scheduler(s);
    }

    /// Sets vLLM's LoRA info gauge: adapters with requests being served (`running`), those
    /// whose requests wait for the weights (`waiting`), and the engine's slot count.
    pub fn update_lora_info(&self, running: &[String], waiting: &[String], max_lora: usize) {
        self.vllm.set_lora_info(running, waiting, max_lora);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encoding metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// vLLM's gauge names for the values the inference extension's endpoint picker scores.
struct VllmGauges {
    waiting: IntGauge,
    running: IntGauge,
    /// vLLM ≤ 0.9's name; newer vLLM (and newer pickers) use `kv_cache_usage_perc`.
    gpu_cache_usage: Gauge,
    kv_cache_usage: Gauge,
    lora_info: GaugeVec,
}

impl VllmGauges {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let int = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let frac = |name: &str| -> prometheus::Result<Gauge> {
            let g = Gauge::new(
                name,
                "KV cache usage as a fraction of the block pool (0 to 1), vLLM's name",
            )?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let lora_info = GaugeVec::new(
            Opts::new(
                "vllm:lora_requests_info",
                "Running and waiting LoRA adapters (comma-separated) and the engine's slots; the value is the Unix time of the scrape, as vLLM reports it",
            ),
            &["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
        )?;
        registry.register(Box::new(lora_info.clone()))?;
        Ok(VllmGauges {
            waiting: int(
                "vllm:num_requests_waiting",
                "Sequences waiting (tgi_queue_size), vLLM's name",
            )?,
            running: int(
                "vllm:num_requests_running",
                "Sequences running (tgi_batch_current_size), vLLM's name",
            )?,
            gpu_cache_usage: frac("vllm:gpu_cache_usage_perc")?,
            kv_cache_usage: frac("vllm:kv_cache_usage_perc")?,
            lora_info,
        })
    }

    fn update_from_scheduler(&self, s: &MetricsSnapshot) {
        let g = |gauge: &IntGauge, v: u64| gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
        g(&self.waiting, s.waiting);
        g(&self.running, s.running);
        let usage = s.kv_usage();
        self.gpu_cache_usage.set(usage);
        self.kv_cache_usage.set(usage);
    }

    /// One series only: the picker reads the newest (largest value) series, and stale label
    /// sets would otherwise stay in the exposition.
    fn set_lora_info(&self, running: &[String], waiting: &[String], max_lora: usize) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.lora_info.reset();
        self.lora_info
            .with_label_values(&[
                running.join(",").as_str(),
                waiting.join(",").as_str(),
                max_lora.to_string().as_str(),
            ])
            .set(now);
    }
}

/// Advances a counter that mirrors a monotonic total kept elsewhere to that total.
pub fn advance(counter: &IntCounter, total: u64) {
    let cur = counter.get();
    if total > cur {
        counter.inc_by(total - cur);
    }
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Reports one request to [`ServerMetrics`] exactly once.
pub struct RequestTracker {
    metrics: Arc<ServerMetrics>,
    route: &'static str,
    started: std::time::Instant,
    done: bool,
}

impl RequestTracker {
    /// Reports the outcome; `outcome.duration` zero means "measure it here".
    pub fn finish(mut self, mut outcome: RequestOutcome<'_>) {
        if outcome.duration.is_zero() {
            outcome.duration = self.started.elapsed();
        }
        self.metrics.on_request_done(self.route, &outcome);
        self.done = true;
    }
}

impl Drop for RequestTracker {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.on_request_done(
                self.route,
                &RequestOutcome {
                    error: Some("dropped"),
                    duration: self.started.elapsed(),
                    ..Default::default()
                },
            );
        }
    }
}

#[cfg(test)]
#[path = "deploy_assets_tests.rs"]
mod deploy_assets_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, line_start: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn request_outcomes_and_scheduler_gauges_render() {
        let m = Arc::new(ServerMetrics::new());
        m.on_request_start("/generate");
        let gaps = [Duration::from_millis(10), Duration::from_millis(30)];
        m.on_request_done(
            "/generate",
            &RequestOutcome {
                duration: Duration::from_millis(100),
                queue: Some(Duration::from_millis(5)),
                time_to_first_token: Some(Duration::from_millis(40)),
                inter_token: &gaps,
                prompt_tokens: 7,
                generated_tokens: 3,
                ..Default::default()
            },
        );
        let t = m.track("/v1/completions");
        drop(t);
        let t = m.track("/invocations");
        t.finish(RequestOutcome {
            error: Some("validation"),
            ..Default::default()
        });
        m.update_from_scheduler(&MetricsSnapshot {
            running: 2,
            waiting: 5,
            kv_blocks_used: 10,
            kv_blocks_total: 64,
            prompt_tokens: 100,
            prefix_cached_tokens: 25,
            generated_tokens: 9,
            step_nanos: 2_000_000_000,
            pooling_requests: 12,
            pooling_prompt_tokens: 340,
            pooling_waiting: 2,
            ..Default::default()
        });
        let text = m.render();
        assert_eq!(sample(&text, "tgi_request_count "), Some(3.0));
        assert_eq!(sample(&text, "tgi_request_success "), Some(1.0));
        assert_eq!(
            sample(&text, "tgi_request_failure{err=\"dropped\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "tgi_request_failure{err=\"validation\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, "lmi_requests_total{route=\"/generate\"}"),
            Some(1.0)
        );
        assert_eq!(sample(&text, "lmi_requests_in_flight "), Some(0.0));
        assert_eq!(sample(&text, "tgi_request_duration_count "), Some(3.0));
        assert_eq!(sample(&text, "tgi_request_input_length_sum "), Some(7.0));
        assert_eq!(
            sample(&text, "tgi_request_generated_tokens_sum "),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "lmi_inter_token_latency_seconds_count "),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "tgi_request_mean_time_per_token_duration_sum "),
            Some(0.02)
        );
        assert_eq!(
            sample(&text, "lmi_time_to_first_token_seconds_count "),
            Some(1.0)
        );
        assert_eq!(sample(&text, "tgi_queue_size "), Some(5.0));
        assert_eq!(sample(&text, "tgi_batch_current_size "), Some(2.0));
        assert_eq!(sample(&text, "lmi_kv_cache_blocks_used "), Some(10.0));
        assert_eq!(sample(&text, "lmi_kv_cache_blocks_total "), Some(64.0));
        assert_eq!(sample(&text, "lmi_prefix_cache_hit_rate "), Some(0.25));
        assert_eq!(sample(&text, "lmi_pooling_requests_total "), Some(12.0));
        assert_eq!(
            sample(&text, "lmi_pooling_prompt_tokens_total "),
            Some(340.0)
        );
        assert_eq!(sample(&text, "lmi_pooling_queue_size "), Some(2.0));
        assert_eq!(
            sample(&text, "lmi_scheduler_step_seconds_total "),
            Some(2.0)
        );
        assert!(text.contains("# TYPE tgi_request_duration histogram"));
        // Counters only move forward, to the scheduler's totals.
        m.update_from_scheduler(&MetricsSnapshot {
            prompt_tokens: 150,
            ..Default::default()
        });
        assert_eq!(sample(&m.render(), "lmi_prompt_tokens_total "), Some(150.0));
    }

    #[test]
    fn vllm_gauges_for_the_endpoint_picker() {
        let m = ServerMetrics::new();
        m.update_from_scheduler(&MetricsSnapshot {
            running: 3,
            waiting: 7,
            kv_blocks_used: 16,
            kv_blocks_total: 64,
            ..Default::default()
        });
        m.update_lora_info(&["a".into(), "b".into()], &[], 4);
        m.update_lora_info(&["b".into()], &["c".into()], 4);
        let text = m.render();
        assert_eq!(sample(&text, "vllm:num_requests_waiting "), Some(7.0));
        assert_eq!(sample(&text, "vllm:num_requests_running "), Some(3.0));
        assert_eq!(sample(&text, "vllm:gpu_cache_usage_perc "), Some(0.25));
        assert_eq!(sample(&text, "vllm:kv_cache_usage_perc "), Some(0.25));
        // A window pool fuller than the global one is the usage the picker sees.
        m.update_from_scheduler(&MetricsSnapshot {
            kv_blocks_used: 16,
            kv_blocks_total: 64,
            kv_window_blocks_used: 30,
            kv_window_blocks_total: 40,
            ..Default::default()
        });
        let text = m.render();
        assert_eq!(sample(&text, "vllm:kv_cache_usage_perc "), Some(0.75));
        // Only the latest label set (labels sorted by name); the value is a timestamp.
        let info: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("vllm:lora_requests_info{"))
            .collect();
        assert_eq!(info.len(), 1, "{text}");
        assert!(
            info[0].starts_with(
                "vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"b\",waiting_lora_adapters=\"c\"}"
            ),
            "{}",
            info[0]
        );
        let ts = sample(&text, "vllm:lora_requests_info{").unwrap_or(0.0);
        assert!(ts > 1.6e9, "{ts}");
        // An empty pool reports zero usage rather than NaN.
        m.update_from_scheduler(&MetricsSnapshot::default());
        assert_eq!(sample(&m.render(), "vllm:kv_cache_usage_perc "), Some(0.0));
    }

    #[test]
    fn tgi_duration_buckets() {
        let b = duration_buckets();
        assert_eq!(b.len(), 35);
        assert!((b[0] - 0.00015).abs() < 1e-12);
        assert!((b[34] - 145.6).abs() < 0.1, "{}", b[34]);
    }
}
