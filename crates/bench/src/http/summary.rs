//! What a run measured: the tables printed to stdout and the plots of the HTML report.

use super::{HttpArgs, Level, Stats, Workload};

/// Exact percentile (nearest rank) of ascending-sorted samples; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The plots of the run for the HTML report: latency distributions and tokens/s over time of
/// the last (highest) level, and throughput against concurrency when there are several.
pub fn html_report(a: &HttpArgs, w: &Workload, levels: &[Level]) -> crate::report::Report {
    use crate::report::Chart;
    let to_ms = |v: &[u64]| v.iter().map(|&ns| ms(ns)).collect::<Vec<f64>>();
    let mut charts = Vec::new();
    let mut text = format!(
        "lmi bench http: {}, prompt {} words, max_new_tokens {}, stream {}\n",
        w.path, a.prompt_len, a.max_new_tokens, w.stream,
    );
    for l in levels {
        let s = &l.stats;
        text.push_str(&format!(
            "{} connections: {} requests ok, {} errors in {:.2} s: {:.1} requests/s, {:.0} output \
             tokens/s\n",
            l.concurrency,
            s.ok,
            s.errors,
            l.secs,
            s.ok as f64 / l.secs,
            s.tokens as f64 / l.secs,
        ));
    }
    if levels.len() > 1 {
        charts.push(Chart::Line {
            title: "Output tokens/s against concurrency".into(),
            x_label: "client connections".into(),
            y_label: "output tokens/s".into(),
            points: levels
                .iter()
                .map(|l| (l.concurrency as f64, l.stats.tokens as f64 / l.secs))
                .collect(),
        });
    }
    let Some(last) = levels.last() else {
        return crate::report::Report {
            title: "lmi bench http".into(),
            text,
            charts,
        };
    };
    let (s, c) = (&last.stats, last.concurrency);
    if w.stream {
        charts.push(Chart::Histogram {
            title: format!(
                "Time to first token ({} requests, {c} connections)",
                s.ttft.len()
            ),
            samples_ms: to_ms(&s.ttft),
        });
        charts.push(Chart::Histogram {
            title: format!(
                "Inter-token latency ({} gaps, {c} connections)",
                s.itl.len()
            ),
            samples_ms: to_ms(&s.itl),
        });
    }
    charts.push(Chart::Histogram {
        title: format!(
            "End-to-end latency ({} requests, {c} connections)",
            s.e2e.len()
        ),
        samples_ms: to_ms(&s.e2e),
    });
    charts.push(Chart::Line {
        title: format!("Output tokens/s over time ({c} connections)"),
        x_label: "seconds since the start".into(),
        y_label: "tokens/s".into(),
        points: tokens_per_second(&s.token_at, last.secs),
    });
    let list: Vec<String> = levels.iter().map(|l| l.concurrency.to_string()).collect();
    crate::report::Report {
        title: format!(
            "lmi bench http: {} at concurrency {}",
            w.path,
            list.join(", ")
        ),
        text,
        charts,
    }
}

/// Output tokens/s in about 20 equal windows over the run (at least 100 ms each), each
/// point at its window's middle.
pub fn tokens_per_second(token_at_ns: &[u64], secs: f64) -> Vec<(f64, f64)> {
    let end = token_at_ns
        .iter()
        .map(|&t| t as f64 / 1e9)
        .fold(secs, f64::max);
    let width = (end / 20.0).max(0.1);
    let n = ((end / width).ceil() as usize).max(1);
    let mut counts = vec![0u64; n];
    for &t in token_at_ns {
        let i = ((t as f64 / 1e9 / width) as usize).min(n - 1);
        counts[i] += 1;
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, &c)| ((i as f64 + 0.5) * width, c as f64 / width))
        .collect()
}

pub fn report(a: &HttpArgs, w: &Workload, s: &Stats, secs: f64, backend: Option<&str>) {
    let mut ttft = s.ttft.clone();
    let mut itl = s.itl.clone();
    let mut e2e = s.e2e.clone();
    ttft.sort_unstable();
    itl.sort_unstable();
    e2e.sort_unstable();
    let rps = s.ok as f64 / secs;
    let tps = s.tokens as f64 / secs;
    let p = |v: &[u64], q: f64| ms(percentile(v, q));
    println!(
        "\nrequests {} ok, {} errors in {secs:.2} s: {rps:.1} requests/s, {tps:.0} output tokens/s \
         ({:.1} tokens/request)",
        s.ok,
        s.errors,
        if s.ok > 0 {
            s.tokens as f64 / s.ok as f64
        } else {
            0.0
        },
    );
    if let Some(e) = &s.first_error {
        let e: String = e.chars().take(300).collect();
        println!("first error: {e}");
    }
    if w.stream {
        println!(
            "TTFT ms: p50 {:.3}  p90 {:.3}  p99 {:.3}",
            p(&ttft, 50.0),
            p(&ttft, 90.0),
            p(&ttft, 99.0)
        );
        println!(
            "ITL  ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  (mean {:.3}, {} gaps)",
            p(&itl, 50.0),
            p(&itl, 90.0),
            p(&itl, 99.0),
            if itl.is_empty() {
                0.0
            } else {
                itl.iter().sum::<u64>() as f64 / itl.len() as f64 / 1e6
            },
            itl.len()
        );
    }
    println!(
        "E2E  ms: p50 {:.3}  p90 {:.3}  p99 {:.3}",
        p(&e2e, 50.0),
        p(&e2e, 90.0),
        p(&e2e, 99.0)
    );
    // Only the null engine computes nothing; with a real model TTFT/ITL include the model.
    if w.stream && matches!(backend, Some("null") | None) {
        println!(
            "front-end added latency (with --engine null, where the engine computes nothing, all of \
             TTFT and ITL is server + client overhead): TTFT p50 {:.3} ms, ITL p50 {:.3} ms",
            p(&ttft, 50.0),
            p(&itl, 50.0)
        );
    }
    let route = &w.path;
    println!(
        "\n| route | conc | prompt | max new | stream | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms \
         | ITL p50 ms | ITL p99 ms | E2E p50 ms | E2E p99 ms | errors |"
    );
    println!("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let or_dash = |v: &[u64], q: f64| {
        if w.stream {
            format!("{:.3}", p(v, q))
        } else {
            "-".to_string()
        }
    };
    println!(
        "| {route} | {} | {} | {} | {} | {rps:.0} | {tps:.0} | {} | {} | {} | {} | {:.3} | {:.3} | {} |",
        a.concurrency,
        a.prompt_len,
        a.max_new_tokens,
        w.stream,
        or_dash(&ttft, 50.0),
        or_dash(&ttft, 99.0),
        or_dash(&itl, 50.0),
        or_dash(&itl, 99.0),
        p(&e2e, 50.0),
        p(&e2e, 99.0),
        s.errors
    );
}
