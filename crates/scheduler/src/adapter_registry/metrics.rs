//! The adapter cache's metrics: host tier (the registry's) and engine tier (the scheduler's,
//! copied in on each scrape). Names follow the server's `lmi_*` convention; the server
//! registers them in its /metrics registry.

use std::time::Duration;

use crate::MetricsSnapshot;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// Cheap to clone: every metric is a shared handle.
#[derive(Clone)]
pub struct AdapterMetrics {
    pub registered: IntGauge,
    pub host_resident: IntGauge,
    pub host_loads: IntCounter,
    pub host_evictions: IntCounter,
    load_seconds: Histogram,
    requests: IntCounterVec,
    engine_resident: IntGauge,
    pinned: IntGauge,
    engine_loads: IntCounter,
    engine_evictions: IntCounter,
    waiting_requests: IntGauge,
}

impl AdapterMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m;
                registry.register(Box::new(m.clone()))?;
                m
            }};
        }
        let buckets: Vec<f64> = (0..20).map(|k| 1e-3 * 2f64.powi(k)).collect();
        Ok(AdapterMetrics {
            registered: reg!(IntGauge::new(
                "lmi_lora_adapters_registered",
                "LoRA adapters registered"
            )?),
            host_resident: reg!(IntGauge::new(
                "lmi_lora_adapters_host_resident",
                "LoRA adapters whose weights are in host memory (at most option.max_cpu_loras)"
            )?),
            host_loads: reg!(IntCounter::new(
                "lmi_lora_host_loads_total",
                "LoRA adapter weights read from disk"
            )?),
            host_evictions: reg!(IntCounter::new(
                "lmi_lora_host_evictions_total",
                "LoRA adapters whose weights were dropped from host memory"
            )?),
            load_seconds: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "lmi_lora_load_seconds",
                    "Time to read an adapter's weights (s)"
                )
                .buckets(buckets)
            )?),
            requests: reg!(IntCounterVec::new(
                Opts::new("lmi_lora_requests_total", "Requests by LoRA adapter"),
                &["adapter"]
            )?),
            engine_resident: reg!(IntGauge::new(
                "lmi_lora_adapters_engine_resident",
                "LoRA adapters loaded into the engine (at most option.max_loras)"
            )?),
            pinned: reg!(IntGauge::new(
                "lmi_lora_adapters_pinned",
                "LoRA adapters pinned in the engine"
            )?),
            engine_loads: reg!(IntCounter::new(
                "lmi_lora_engine_loads_total",
                "LoRA adapters uploaded into the engine"
            )?),
            engine_evictions: reg!(IntCounter::new(
                "lmi_lora_engine_evictions_total",
                "LoRA adapters evicted from the engine"
            )?),
            waiting_requests: reg!(IntGauge::new(
                "lmi_lora_waiting_requests",
                "Requests waiting for their adapter (weights loading or no engine slot)"
            )?),
        })
    }

    pub fn observe_load(&self, d: Duration) {
        self.host_loads.inc();
        self.load_seconds.observe(d.as_secs_f64());
    }

    pub fn count_request(&self, adapter: &str) {
        self.requests.with_label_values(&[adapter]).inc();
    }

    /// Copies the scheduler's engine-tier values.
    pub fn update_from_scheduler(&self, s: &MetricsSnapshot) {
        let g = |gauge: &IntGauge, v: u64| gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
        g(&self.engine_resident, s.lora_engine_resident);
        g(&self.pinned, s.lora_pinned);
        g(&self.waiting_requests, s.lora_waiting_requests);
        advance(&self.engine_loads, s.lora_engine_loads);
        advance(&self.engine_evictions, s.lora_engine_evictions);
    }
}

/// Advances a counter that mirrors a monotonic total kept elsewhere to that total (as the
/// server's `metrics::advance` does for the scheduler's other totals).
fn advance(counter: &IntCounter, total: u64) {
    let cur = counter.get();
    if total > cur {
        counter.inc_by(total - cur);
    }
}
