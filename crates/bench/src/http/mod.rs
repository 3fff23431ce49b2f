//! `lmi bench http`: a closed-loop HTTP load generator for a running server.
//!
//! `concurrency` client tasks, each on its own keep-alive HTTP/1.1 connection (hyper's client
//! connection, `TCP_NODELAY` set), send requests back to back. Streams (TGI SSE, LMI jsonlines
//! or SSE, OpenAI chat chunks) are parsed incrementally as bytes arrive and every token event is
//! timestamped: TTFT = first token event - send, ITL = gaps between token events, E2E = last
//! byte - send. Percentiles are exact (nearest rank over the sorted samples).
//!
//! The client runs on a small tokio runtime (1 worker thread by default) because on a small
//! machine it shares the cores with the server. Against `lmi serve --engine null` (tokens
//! emitted without computing) the whole TTFT and ITL is front-end overhead (HTTP, scheduler,
//! detokenizer, SSE framing and this client), so the report prints them as "added latency".

mod client;
mod events;
mod summary;

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hyper::body::Bytes;
use hyper::{StatusCode, Uri};
use serde_json::{Value, json};

use client::{FORWARD_METRIC, Load, STEP_METRIC, client, get, own_cpu_seconds, scrape};
pub use summary::tokens_per_second;
use summary::{html_report, report};

/// Which server route the load goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Route {
    /// TGI `POST /generate_stream` (SSE); with `--stream false`, TGI `POST /generate`.
    #[value(name = "generate_stream")]
    GenerateStream,
    /// TGI `POST /generate` (JSON); with `--stream true`, TGI `POST /generate_stream`.
    #[value(name = "generate")]
    Generate,
    /// LMI `POST /invocations` (jsonlines or SSE when streaming).
    #[value(name = "invocations")]
    Invocations,
    /// OpenAI `POST /v1/chat/completions`.
    #[value(name = "chat")]
    Chat,
}

#[derive(clap::Args, Clone)]
pub struct HttpArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Client connections, each sending requests back to back (closed loop); several
    /// (comma-separated, e.g. 1,4,16) run one after the other, and the report plots
    /// throughput against them.
    #[arg(long = "concurrency", value_delimiter = ',', default_value = "64")]
    levels: Vec<usize>,
    /// The level being run.
    #[arg(skip)]
    concurrency: usize,
    /// Measured requests in all (after the warm-up); conflicts with --duration.
    #[arg(long, conflicts_with = "duration")]
    requests: Option<u64>,
    /// Seconds of measured load (in-flight requests finish after it); 10 when neither this nor
    /// --requests is given.
    #[arg(long)]
    duration: Option<f64>,
    /// Prompt length in words ("hello hello ..."), about one token per word.
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    /// Tokens to generate per request (EOS is ignored where the route allows it; the actual
    /// token count is what is reported).
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Stream tokens (SSE / jsonlines) and measure TTFT and inter-token latency.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    stream: bool,
    /// Route to drive.
    #[arg(long, value_enum, default_value = "generate_stream")]
    route: Route,
    /// Warm-up requests before measuring (spread over the connections); default: one per
    /// connection.
    #[arg(long)]
    warmup: Option<u64>,
    /// Worker threads of the client's tokio runtime (1: a current-thread runtime).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// The HTML report (plots of TTFT, inter-token and E2E latency, tokens/s over time) is
    /// written here.
    #[arg(long, default_value = "lmi-bench-http.html")]
    report: std::path::PathBuf,
}

pub fn run(a: HttpArgs) -> anyhow::Result<()> {
    if a.levels.is_empty() || a.levels.contains(&0) {
        bail!(
            "--concurrency takes one or more connection counts (comma-separated), each at least 1"
        );
    }
    let rt = if a.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.client_threads)
            .enable_all()
            .build()?
    };
    let mut levels = Vec::new();
    for &c in &a.levels {
        let one = HttpArgs {
            concurrency: c,
            ..a.clone()
        };
        levels.push(rt.block_on(main(&one))?);
    }
    let target = Target::parse(&a.url)?;
    let html = html_report(&a, &workload(&a, &target), &levels);
    crate::report::write(&html, &a.report)?;
    println!("\nreport: {}", a.report.display());
    Ok(())
}

/// What one concurrency level measured.
struct Level {
    concurrency: usize,
    stats: Stats,
    secs: f64,
}

/// Where requests go: socket address, Host header and the request path.
#[derive(Clone)]
struct Target {
    addr: String,
    host: String,
    prefix: String,
}

impl Target {
    fn parse(url: &str) -> anyhow::Result<Target> {
        let uri: Uri = url.parse().with_context(|| format!("bad --url {url}"))?;
        if uri.scheme_str().is_some_and(|s| s != "http") {
            bail!("only http:// URLs are supported, got {url}");
        }
        let host = uri.host().context("--url has no host")?.to_string();
        let port = uri.port_u16().unwrap_or(80);
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(Target {
            addr: format!("{host}:{port}"),
            host: format!("{host}:{port}"),
            prefix,
        })
    }

    fn path(&self, p: &str) -> String {
        format!("{}{p}", self.prefix)
    }
}

/// The request every client sends: path, JSON body and how to read the answer.
struct Workload {
    path: String,
    body: Bytes,
    stream: bool,
    route: Route,
}

fn workload(a: &HttpArgs, t: &Target) -> Workload {
    let prompt = vec!["hello"; a.prompt_len].join(" ");
    let n = a.max_new_tokens;
    let (path, body) = match (a.route, a.stream) {
        (Route::GenerateStream | Route::Generate, stream) => (
            if stream {
                "/generate_stream"
            } else {
                "/generate"
            },
            // TGI takes no ignore_eos; the null engine never emits EOS, a real model may stop.
            json!({"inputs": prompt, "parameters": {"max_new_tokens": n, "details": !stream}}),
        ),
        (Route::Invocations, stream) => (
            "/invocations",
            json!({"inputs": prompt, "stream": stream, "parameters": {
                "max_new_tokens": n, "ignore_eos_token": true, "details": !stream}}),
        ),
        (Route::Chat, stream) => {
            let mut b = json!({"messages": [{"role": "user", "content": prompt}],
                "max_tokens": n, "ignore_eos": true, "stream": stream});
            if stream {
                b["stream_options"] = json!({"include_usage": true});
            }
            ("/v1/chat/completions", b)
        }
    };
    Workload {
        path: t.path(path),
        body: Bytes::from(body.to_string()),
        stream: a.stream,
        route: a.route,
    }
}

#[derive(Default)]
struct Stats {
    ok: u64,
    errors: u64,
    tokens: u64,
    /// Nanoseconds.
    ttft: Vec<u64>,
    itl: Vec<u64>,
    e2e: Vec<u64>,
    /// When each output token arrived, ns after `origin` (the measured run's start).
    token_at: Vec<u64>,
    origin: Option<Instant>,
    first_error: Option<String>,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.ok += o.ok;
        self.errors += o.errors;
        self.tokens += o.tokens;
        self.ttft.extend(o.ttft);
        self.itl.extend(o.itl);
        self.e2e.extend(o.e2e);
        self.token_at.extend(o.token_at);
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn error(&mut self, msg: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(msg());
        }
    }
}

async fn main(a: &HttpArgs) -> anyhow::Result<Level> {
    let target = Target::parse(&a.url)?;
    let (status, _) = get(&target, "/health")
        .await
        .with_context(|| format!("is a server running at {}?", a.url))?;
    if status != StatusCode::OK {
        bail!("{}/health answered {status}; is the model loaded?", a.url);
    }
    let info = match get(&target, "/info").await {
        Ok((StatusCode::OK, b)) => serde_json::from_slice::<Value>(&b).ok(),
        _ => None,
    };
    let work = workload(a, &target);
    let duration = match (a.requests, a.duration) {
        (Some(_), _) => None,
        (None, d) => Some(Duration::from_secs_f64(d.unwrap_or(10.0))),
    };
    let warmup = a.warmup.unwrap_or(a.concurrency as u64);
    let runtime = if a.client_threads <= 1 {
        "a current-thread tokio runtime (1 thread)".to_string()
    } else {
        format!("a tokio runtime with {} worker threads", a.client_threads)
    };
    if let Some(info) = &info {
        println!(
            "server: {} model {}, backend {}",
            a.url,
            info["model_id"].as_str().unwrap_or("?"),
            info["model_device_type"].as_str().unwrap_or("?"),
        );
    }
    println!(
        "client: {} keep-alive HTTP/1.1 connections on {runtime} (the server shares this machine's \
         {} cores); POST {} prompt {} words, max_new_tokens {}, stream {}; {} warm-up requests; {}",
        a.concurrency,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        work.path,
        a.prompt_len,
        a.max_new_tokens,
        work.stream,
        warmup,
        match (a.requests, duration) {
            (Some(n), _) => format!("{n} measured requests"),
            (None, Some(d)) => format!("{:.0} s measured", d.as_secs_f64()),
            (None, None) => unreachable!(),
        }
    );

    let load = Arc::new(Load {
        target: target.clone(),
        work,
        warmup_left: AtomicI64::new(warmup as i64),
        left: a.requests.map(|n| AtomicI64::new(n as i64)),
        duration,
        barrier: tokio::sync::Barrier::new(a.concurrency + 1),
    });
    let tasks: Vec<_> = (0..a.concurrency)
        .map(|_| tokio::spawn(client(load.clone())))
        .collect();
    load.barrier.wait().await;
    let start = Instant::now();
    let cpu0 = own_cpu_seconds();
    let m0 = scrape(&target).await;
    let mut stats = Stats::default();
    let mut end = start;
    for t in tasks {
        let (s, e) = t.await?;
        stats.merge(s);
        end = end.max(e);
    }
    let m1 = scrape(&target).await;
    let cpu1 = own_cpu_seconds();
    let secs = (end - start).as_secs_f64();
    let backend = info
        .as_ref()
        .and_then(|i| i["model_device_type"].as_str().map(str::to_string));
    report(a, &load.work, &stats, secs, backend.as_deref());
    if let (Some(c0), Some(c1)) = (cpu0, cpu1) {
        println!(
            "client CPU: {:.2} s over {secs:.2} s ({:.0}% of one core)",
            c1 - c0,
            100.0 * (c1 - c0) / secs
        );
    }
    if let (Some((s0, f0)), Some((s1, f1))) = (m0, m1) {
        let (step, fwd) = (s1 - s0, f1 - f0);
        println!(
            "server /metrics during the run: {STEP_METRIC} +{step:.2} s ({:.0}% of wall time), \
             {FORWARD_METRIC} +{fwd:.2} s; step/forward ratio {:.2}",
            100.0 * step / secs,
            if fwd > 0.0 { step / fwd } else { f64::NAN },
        );
    }
    Ok(Level {
        concurrency: a.concurrency,
        stats,
        secs,
    })
}

#[cfg(test)]
mod tests;
