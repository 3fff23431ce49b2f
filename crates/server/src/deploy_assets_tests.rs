//! deploy/grafana (dashboard, alert rules) and deploy/k8s (autoscaler rules, endpoint picker
//! flags) query the server's metrics by name: each name they use must be one `/metrics` serves.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use lmi_scheduler::MetricsSnapshot;

use crate::metrics::{RequestOutcome, ServerMetrics};

/// Every sample name the server exposes, with each labelled family given a series.
fn exposed() -> BTreeSet<String> {
    let m = Arc::new(ServerMetrics::new());
    m.on_request_start("/generate");
    m.on_request_done(
        "/generate",
        &RequestOutcome {
            error: Some("generation"),
            ..Default::default()
        },
    );
    m.adapters.count_request("a");
    m.update_from_scheduler(&MetricsSnapshot::default());
    m.update_lora_info(&[], &[], 4);
    let text = m.render();
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        names.insert(line[..end].to_string());
    }
    // A family with no sample yet still shows its TYPE line.
    for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        if let Some(name) = line.split(' ').next() {
            names.insert(name.to_string());
        }
    }
    names
}

/// Identifiers in `text` that name the server's metrics (its prefixes).
fn referenced(text: &str) -> BTreeSet<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| is_name(c)) {
        let tail = &rest[start..];
        let len = tail.find(|c: char| !is_name(c)).unwrap_or(tail.len());
        let word = &tail[..len];
        let preceded_by_name = start > 0 && rest[..start].ends_with(|c: char| is_name(c));
        if !preceded_by_name
            && ["tgi_", "lmi_", "vllm:"]
                .iter()
                .any(|p| word.starts_with(p))
        {
            out.insert(word.to_string());
        }
        rest = &tail[len..];
    }
    out
}

fn repo_file(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn dashboards_rules_and_picker_flags_query_exposed_metrics() {
    let exposed = exposed();
    // The Prometheus adapter's name for vllm:kv_cache_usage_perc, not a server metric.
    let not_metrics = ["lmi_kv_cache_usage"];
    for (file, at_least) in [
        ("deploy/grafana/dashboard.json", 20),
        ("deploy/grafana/alerts.yaml", 5),
        ("deploy/k8s/base/prometheus-adapter-rules.yaml", 2),
        ("deploy/k8s/base/hpa.yaml", 1),
        ("deploy/k8s/gateway/epp.yaml", 4),
    ] {
        let used = referenced(&repo_file(file));
        let used: BTreeSet<&String> = used
            .iter()
            .filter(|n| !not_metrics.contains(&n.as_str()))
            .collect();
        assert!(
            used.len() >= at_least,
            "{file}: only {} metric names found: {used:?}",
            used.len()
        );
        let missing: Vec<&&String> = used.iter().filter(|n| !exposed.contains(**n)).collect();
        assert!(
            missing.is_empty(),
            "{file} queries metrics the server does not expose: {missing:?}"
        );
    }
}

#[test]
fn the_name_scan_finds_names_and_the_check_can_fail() {
    let used =
        referenced(r#"rate(lmi_requests_total{x="y"}[5m]) / vllm:kv_cache_usage_perc + xtgi_no"#);
    let want: BTreeSet<String> = ["lmi_requests_total", "vllm:kv_cache_usage_perc"]
        .map(String::from)
        .into();
    assert_eq!(used, want);
    let exposed = exposed();
    assert!(exposed.contains("lmi_time_to_first_token_seconds_bucket"));
    assert!(exposed.contains("vllm:lora_requests_info"));
    assert!(!exposed.contains("lmi_no_such_metric_total"));
}
