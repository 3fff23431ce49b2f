//! `lmi bench soak`: a fault-injecting load for a running server. `concurrency` clients send a
//! mix of routes (TGI, LMI, OpenAI; streaming and not) back to back for `duration`; a share of
//! them disconnect after the first streamed bytes and a share send malformed bodies. It reports
//! requests by outcome, the server's KV blocks in use once the load has stopped, and the
//! server's resident memory (`--pid`) at start, middle and end. A benchmark, not a test: it
//! prints figures and exits non-zero only when well-formed requests got a 5xx or blocks leak.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Request, Uri, header};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpStream;

#[derive(clap::Args)]
pub struct SoakArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Share of streaming requests whose client hangs up after the first bytes.
    #[arg(long, default_value_t = 0.1)]
    disconnect_share: f64,
    /// Share of requests with a malformed body (a 4xx is the expected answer).
    #[arg(long, default_value_t = 0.1)]
    malformed_share: f64,
    /// Tokens per request.
    #[arg(long, default_value_t = 16)]
    max_new_tokens: usize,
    /// The server's process id, to sample its resident memory (Linux /proc).
    #[arg(long)]
    pid: Option<u32>,
    /// API key, when the server requires one.
    #[arg(long)]
    api_key: Option<String>,
    /// The HTML report (the outcomes, latency of the answered requests, requests/s over time).
    #[arg(long, default_value = "lmi-bench-soak.html")]
    report: std::path::PathBuf,
}

/// A tiny deterministic generator (xorshift): the mix is reproducible run to run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Shot {
    path: &'static str,
    body: String,
    stream: bool,
    malformed: bool,
}

fn pick(rng: &mut Rng, a: &SoakArgs) -> Shot {
    let n = a.max_new_tokens;
    if rng.next() < a.malformed_share {
        let bodies = [
            ("/generate", "{\"inputs\": "),
            (
                "/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\"}]}",
            ),
            (
                "/invocations",
                "{\"inputs\": \"x\", \"parameters\": {\"temperature\": -1}}",
            ),
            ("/v1/completions", "[1, 2, 3]"),
            (
                "/generate_stream",
                "{\"inputs\": \"x\", \"parameters\": {\"max_new_tokens\": 0}}",
            ),
        ];
        let (path, body) = bodies[(rng.next() * bodies.len() as f64) as usize % bodies.len()];
        return Shot {
            path,
            body: body.to_string(),
            stream: false,
            malformed: true,
        };
    }
    let prompt = "Tell me about the sea and the lighthouse keeper";
    let msgs = json!([{"role": "user", "content": prompt}]);
    let (path, body, stream) = match (rng.next() * 6.0) as usize {
        0 => (
            "/generate",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": n}}),
            false,
        ),
        1 => (
            "/generate_stream",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": n}}),
            true,
        ),
        2 => (
            "/invocations",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": n}}),
            false,
        ),
        3 => (
            "/invocations",
            json!({"inputs": prompt, "parameters": {"max_new_tokens": n}, "stream": true}),
            true,
        ),
        4 => (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": n, "stream": true}),
            true,
        ),
        _ => (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": n}),
            false,
        ),
    };
    Shot {
        path,
        body: body.to_string(),
        stream,
        malformed: false,
    }
}

#[derive(Default)]
struct Tally(BTreeMap<String, u64>);
impl Tally {
    fn add(&mut self, k: &str) {
        *self.0.entry(k.to_string()).or_default() += 1;
    }
}

/// One request on a fresh connection; returns its outcome's name.
async fn shoot(a: &SoakArgs, addr: &str, shot: &Shot, hang_up: bool) -> String {
    let run = async {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (mut send, conn) = http1::handshake(TokioIo::new(tcp)).await?;
        let conn = tokio::spawn(conn);
        let mut req = Request::post(shot.path)
            .header(header::HOST, addr)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(k) = &a.api_key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let res = send
            .send_request(req.body(Full::new(Bytes::from(shot.body.clone())))?)
            .await?;
        let status = res.status().as_u16();
        let mut body = res.into_body();
        if hang_up && status == 200 {
            // Read the first bytes, then drop the connection mid-stream.
            let _ = body.frame().await;
            conn.abort();
            return Ok::<_, anyhow::Error>("disconnected mid-stream".to_string());
        }
        body.collect().await?;
        Ok(match (status, shot.malformed) {
            (200, false) => "200".to_string(),
            (s, true) if (400..500).contains(&s) => "4xx for a malformed body".to_string(),
            (s, _) if s >= 500 => format!(
                "{s} (5xx{})",
                if shot.malformed { ", malformed" } else { "" }
            ),
            (s, m) => format!("{s} ({})", if m { "malformed" } else { "well-formed" }),
        })
    };
    match tokio::time::timeout(Duration::from_secs(300), run).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => format!(
            "transport error: {}",
            e.to_string().chars().take(60).collect::<String>()
        ),
        Err(_) => "no answer within 300 s".to_string(),
    }
}

async fn metrics(addr: &str, key: Option<&str>) -> anyhow::Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let (mut send, conn) = http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let mut req = Request::get("/metrics").header(header::HOST, addr);
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let res = send
        .send_request(req.body(Full::new(Bytes::new()))?)
        .await?;
    let body = res.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn rss_mib(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

pub fn run(a: SoakArgs) -> anyhow::Result<()> {
    if a.concurrency == 0 || a.duration <= 0.0 {
        bail!("--concurrency and --duration must be positive");
    }
    let uri: Uri = a
        .url
        .parse()
        .with_context(|| format!("bad --url {}", a.url))?;
    let addr = format!(
        "{}:{}",
        uri.host().context("--url has no host")?,
        uri.port_u16().unwrap_or(80)
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(soak(Arc::new(a), addr))
}

async fn soak(a: Arc<SoakArgs>, addr: String) -> anyhow::Result<()> {
    let rss_start = rss_mib(a.pid);
    let tally = Arc::new(Mutex::new(Tally::default()));
    // Per request: when it ended (ns since the start), its latency (ms), answered 200.
    let timings = Arc::new(Mutex::new(Vec::<(u64, f64, bool)>::new()));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(a.duration);
    let mut clients = Vec::new();
    for c in 0..a.concurrency {
        let (a, addr, tally, timings) = (a.clone(), addr.clone(), tally.clone(), timings.clone());
        clients.push(tokio::spawn(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((c as u64 + 1) * 0x1000_0001));
            while Instant::now() < end {
                let shot = pick(&mut rng, &a);
                let hang_up = shot.stream && rng.next() < a.disconnect_share;
                let sent = Instant::now();
                let outcome = shoot(&a, &addr, &shot, hang_up).await;
                if let Ok(mut t) = tally.lock() {
                    t.add(&outcome);
                }
                if let Ok(mut t) = timings.lock() {
                    let ended = start.elapsed().as_nanos() as u64;
                    t.push((ended, sent.elapsed().as_secs_f64() * 1e3, outcome == "200"));
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(a.duration / 2.0)).await;
    let rss_mid = rss_mib(a.pid);
    for c in clients {
        let _ = c.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Let cancelled requests be reaped (the scheduler drops them on its next step).
    let mut blocks = None;
    for _ in 0..50 {
        let text = metrics(&addr, a.api_key.as_deref())
            .await
            .unwrap_or_default();
        blocks = sample(&text, "lmi_kv_cache_blocks_used");
        if blocks == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rss_end = rss_mib(a.pid);
    let tally = tally.lock().map(|t| t.0.clone()).unwrap_or_default();
    let total: u64 = tally.values().sum();
    let mut text = format!(
        "soak: {} clients, {elapsed:.0} s, {total} requests ({:.1}/s)\n",
        a.concurrency,
        total as f64 / elapsed
    );
    for (k, v) in &tally {
        text.push_str(&format!("  {k:<40} {v}\n"));
    }
    let show = |v: Option<f64>| v.map_or("n/a".into(), |m| format!("{m:.0} MiB"));
    text.push_str(&format!(
        "  KV blocks in use at the end: {}\n",
        blocks.map_or("n/a".into(), |b| b.to_string())
    ));
    text.push_str(&format!(
        "  server RSS: start {}, middle {}, end {}{}\n",
        show(rss_start),
        show(rss_mid),
        show(rss_end),
        match (rss_mid, rss_end) {
            (Some(m), Some(e)) => format!(" (end vs middle {:+.1}%)", (e / m - 1.0) * 100.0),
            _ => String::new(),
        }
    ));
    print!("{text}");
    let timings = timings.lock().map(|t| t.clone()).unwrap_or_default();
    crate::report::write(&soak_report(&a, text, &timings, elapsed), &a.report)?;
    println!("\nreport: {}", a.report.display());
    let bad_5xx: u64 = tally
        .iter()
        .filter(|(k, _)| k.contains("5xx") && !k.contains("malformed"))
        .map(|(_, v)| v)
        .sum();
    if bad_5xx > 0 || blocks.is_some_and(|b| b > 0.0) {
        bail!("{bad_5xx} well-formed requests got a 5xx; KV blocks in use at the end: {blocks:?}");
    }
    Ok(())
}

/// The soak's report: its summary, the latency of the requests answered 200, and requests
/// (of every outcome) finished per second over the run.
fn soak_report(
    a: &SoakArgs,
    text: String,
    timings: &[(u64, f64, bool)],
    secs: f64,
) -> crate::report::Report {
    use crate::report::Chart;
    let ok: Vec<f64> = timings.iter().filter(|t| t.2).map(|t| t.1).collect();
    let ended: Vec<u64> = timings.iter().map(|t| t.0).collect();
    crate::report::Report {
        title: format!("lmi bench soak: {} clients, {:.0} s", a.concurrency, secs),
        text,
        charts: vec![
            Chart::Histogram {
                title: format!("Latency of the requests answered 200 ({})", ok.len()),
                samples_ms: ok,
            },
            Chart::Line {
                title: "Requests finished per second (every outcome)".into(),
                x_label: "seconds since the start".into(),
                y_label: "requests/s".into(),
                points: crate::http::tokens_per_second(&ended, secs),
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_samples_and_mix() {
        let text = "# HELP x\nlmi_kv_cache_blocks_used 3\nlmi_kv_cache_blocks_total 64\n";
        assert_eq!(sample(text, "lmi_kv_cache_blocks_used"), Some(3.0));
        let a = SoakArgs {
            url: String::new(),
            concurrency: 1,
            duration: 1.0,
            disconnect_share: 0.0,
            malformed_share: 0.5,
            max_new_tokens: 4,
            pid: None,
            api_key: None,
            report: "r.html".into(),
        };
        let timings = [(100_000_000, 12.0, true), (900_000_000, 30.0, false)];
        let html =
            crate::report::html(&soak_report(&a, "x".into(), &timings, 1.0)).expect("report");
        assert_eq!(html.matches("<svg").count(), 2);
        assert!(html.contains("answered 200 (1)"));
        let mut rng = Rng(7);
        let shots: Vec<Shot> = (0..400).map(|_| pick(&mut rng, &a)).collect();
        let malformed = shots.iter().filter(|s| s.malformed).count();
        assert!((150..250).contains(&malformed), "{malformed}");
        assert!(shots.iter().any(|s| s.stream) && shots.iter().any(|s| !s.stream && !s.malformed));
    }
}
