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

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::body::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1;
use hyper::{Request, StatusCode, Uri, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

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
    super::bench_report::write(&html, &a.report)?;
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

// ---------------------------------------------------------------------------------------------
// Incremental stream parsing

/// Splits a response body into events as bytes arrive, without buffering the whole body.
/// SSE (`text/event-stream`): `data:` lines (one optional space after the colon) are joined with
/// `\n` and dispatched at the blank line ending the event; comments and other fields are
/// skipped. Jsonlines: every non-empty line is an event. `\r\n` line ends are accepted.
#[derive(Default)]
pub struct EventParser {
    sse: bool,
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

impl EventParser {
    pub fn new(sse: bool) -> EventParser {
        EventParser {
            sse,
            ..Default::default()
        }
    }

    /// Feeds one chunk; calls `on_event` with the payload of every event it completes.
    pub fn feed(&mut self, mut chunk: &[u8], on_event: &mut impl FnMut(&[u8])) {
        while let Some(nl) = chunk.iter().position(|&b| b == b'\n') {
            let (head, rest) = chunk.split_at(nl);
            chunk = &rest[1..];
            if self.line.is_empty() {
                self.line_done(head, on_event);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(head);
                self.line_done(&line, on_event);
                line.clear();
                self.line = line;
            }
        }
        self.line.extend_from_slice(chunk);
    }

    /// End of body: dispatches what a last line without a newline completes.
    pub fn finish(&mut self, on_event: &mut impl FnMut(&[u8])) {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line, on_event);
        }
        if self.sse {
            self.line_done(b"", on_event);
        }
    }

    fn line_done(&mut self, line: &[u8], on_event: &mut impl FnMut(&[u8])) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !self.sse {
            if !line.is_empty() {
                on_event(line);
            }
            return;
        }
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
                self.data.clear();
                self.has_data = false;
            }
            return;
        }
        if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(v);
            self.has_data = true;
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// What one stream event is.
#[derive(Debug, PartialEq, Eq)]
enum EventKind {
    Token,
    Error,
    Other,
}

fn classify(route: Route, ev: &[u8]) -> EventKind {
    let ev = ev.trim_ascii();
    if ev.starts_with(b"{\"error\"")
        || contains(ev, b"\"error_msg\"")
        || contains(ev, b"\"finish_reason\":\"error\"")
    {
        return EventKind::Error;
    }
    if ev == b"[DONE]" {
        return EventKind::Other;
    }
    match route {
        // TGI and LMI send exactly one event per token (the last one carries the summary).
        Route::GenerateStream | Route::Generate | Route::Invocations => EventKind::Token,
        // Role chunk, finish-only chunk and usage chunk carry no token.
        Route::Chat if contains(ev, b"\"delta\":{\"content\":") => EventKind::Token,
        Route::Chat => EventKind::Other,
    }
}

/// Generated tokens in a non-streamed answer: TGI/LMI `details.generated_tokens`, OpenAI
/// `usage.completion_tokens`.
fn tokens_in_json(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let v = if let Value::Array(a) = &v {
        a.first()?
    } else {
        &v
    };
    v.pointer("/details/generated_tokens")
        .or_else(|| v.pointer("/usage/completion_tokens"))
        .and_then(Value::as_u64)
}

// ---------------------------------------------------------------------------------------------
// Statistics

/// Exact percentile (nearest rank) of ascending-sorted samples; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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

// ---------------------------------------------------------------------------------------------
// Client

type Sender = http1::SendRequest<Full<Bytes>>;

async fn connect(t: &Target) -> anyhow::Result<Sender> {
    let tcp = TcpStream::connect(&t.addr)
        .await
        .with_context(|| format!("connecting to {}", t.addr))?;
    tcp.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One request; `None` records nothing (warm-up), `Some` adds its samples.
async fn one_request(
    sender: &mut Sender,
    t: &Target,
    w: &Workload,
    stats: Option<&mut Stats>,
) -> anyhow::Result<()> {
    let mut scratch = Stats::default();
    let stats = stats.unwrap_or(&mut scratch);
    sender.ready().await?;
    let req = Request::post(&w.path)
        .header(header::HOST, &t.host)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(w.body.clone()))?;
    let sent = Instant::now();
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut body = resp.into_body();
    if status != StatusCode::OK || !w.stream {
        let bytes = body.collect().await?.to_bytes();
        let e2e = sent.elapsed().as_nanos() as u64;
        if status != StatusCode::OK {
            stats.error(|| format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)));
            return Ok(());
        }
        let tokens = tokens_in_json(&bytes).unwrap_or(0);
        stats.ok += 1;
        stats.tokens += tokens;
        stats.e2e.push(e2e);
        if let Some(o) = stats.origin {
            // Without a stream the tokens all arrive with the body.
            let at = (Instant::now() - o).as_nanos() as u64;
            stats
                .token_at
                .extend(std::iter::repeat_n(at, tokens as usize));
        }
        return Ok(());
    }
    let mut parser = EventParser::new(sse);
    let mut tokens = 0u64;
    let mut last: Option<Instant> = None;
    let mut error: Option<String> = None;
    let route = w.route;
    let mut on_event = |ev: &[u8], now: Instant, st: &mut Stats| match classify(route, ev) {
        EventKind::Token => {
            tokens += 1;
            match last {
                None => st.ttft.push((now - sent).as_nanos() as u64),
                Some(prev) => st.itl.push((now - prev).as_nanos() as u64),
            }
            if let Some(o) = st.origin {
                st.token_at
                    .push((now.saturating_duration_since(o)).as_nanos() as u64);
            }
            last = Some(now);
        }
        EventKind::Error => {
            if error.is_none() {
                error = Some(String::from_utf8_lossy(ev).into_owned());
            }
        }
        EventKind::Other => {}
    };
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let now = Instant::now();
        if let Some(data) = frame.data_ref() {
            parser.feed(data, &mut |ev| on_event(ev, now, stats));
        }
    }
    let now = Instant::now();
    parser.finish(&mut |ev| on_event(ev, now, stats));
    match error {
        Some(e) => stats.error(|| format!("error event: {e}")),
        None => {
            stats.ok += 1;
            stats.tokens += tokens;
            stats.e2e.push((now - sent).as_nanos() as u64);
        }
    }
    Ok(())
}

/// Shared state of the client tasks.
struct Load {
    target: Target,
    work: Workload,
    warmup_left: AtomicI64,
    /// Measured requests left to start (requests mode).
    left: Option<AtomicI64>,
    duration: Option<Duration>,
    barrier: tokio::sync::Barrier,
}

fn take(counter: &AtomicI64) -> bool {
    counter.fetch_sub(1, Ordering::Relaxed) > 0
}

async fn client(load: Arc<Load>) -> (Stats, Instant) {
    let mut stats = Stats::default();
    let mut sender: Option<Sender> = None;
    // Warm-up: also opens the connection before the clock starts.
    if let Ok(s) = connect(&load.target).await {
        sender = Some(s);
    }
    while take(&load.warmup_left) {
        if let Some(s) = sender.as_mut()
            && one_request(s, &load.target, &load.work, None).await.is_ok()
        {
            continue;
        }
        sender = connect(&load.target).await.ok();
    }
    load.barrier.wait().await;
    let start = Instant::now();
    stats.origin = Some(start);
    let deadline = load.duration.map(|d| start + d);
    loop {
        if let Some(d) = deadline
            && Instant::now() >= d
        {
            break;
        }
        if let Some(left) = &load.left
            && !take(left)
        {
            break;
        }
        if sender.is_none() {
            match connect(&load.target).await {
                Ok(s) => sender = Some(s),
                Err(e) => {
                    stats.error(|| format!("{e:#}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let s = sender.as_mut().expect("connected above");
        if let Err(e) = one_request(s, &load.target, &load.work, Some(&mut stats)).await {
            stats.error(|| format!("{e:#}"));
            sender = None;
        }
    }
    (stats, Instant::now())
}

/// A GET on a fresh connection: (status, body).
async fn get(t: &Target, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
    let tcp = TcpStream::connect(&t.addr)
        .await
        .with_context(|| format!("connecting to {}", t.addr))?;
    tcp.set_nodelay(true)?;
    let (mut sender, conn) = http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::get(t.path(path))
        .header(header::HOST, &t.host)
        .body(Empty::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// Sum of a Prometheus counter's samples (all label sets) in a text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

const STEP_METRIC: &str = "lmi_scheduler_step_seconds_total";
const FORWARD_METRIC: &str = "lmi_engine_forward_seconds_total";

async fn scrape(t: &Target) -> Option<(f64, f64)> {
    let (status, body) = get(t, "/metrics").await.ok()?;
    if status != StatusCode::OK {
        return None;
    }
    let text = String::from_utf8_lossy(&body);
    Some((metric(&text, STEP_METRIC)?, metric(&text, FORWARD_METRIC)?))
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat (Linux).
fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command name: state is field 3, utime 14 and stime 15 (1-based).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0) // USER_HZ is 100 on Linux
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
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

/// The plots of the run for the HTML report: latency distributions and tokens/s over time of
/// the last (highest) level, and throughput against concurrency when there are several.
fn html_report(a: &HttpArgs, w: &Workload, levels: &[Level]) -> super::bench_report::Report {
    use super::bench_report::Chart;
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
        return super::bench_report::Report {
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
    super::bench_report::Report {
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

fn report(a: &HttpArgs, w: &Workload, s: &Stats, secs: f64, backend: Option<&str>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_per_second_counts_each_token_in_its_window() {
        // 2 s run, 100 ms windows: 3 tokens in the first, 1 in the last.
        let at = [0, 50_000_000, 99_000_000, 1_950_000_000];
        let pts = tokens_per_second(&at, 2.0);
        assert_eq!(pts.len(), 20);
        assert!((pts[0].0 - 0.05).abs() < 1e-9 && (pts[0].1 - 30.0).abs() < 1e-9);
        assert!((pts[19].1 - 10.0).abs() < 1e-9);
        let total: f64 = pts.iter().map(|p| p.1 * 0.1).sum();
        assert!((total - 4.0).abs() < 1e-9);
    }

    fn events(sse: bool, chunks: &[&[u8]]) -> Vec<String> {
        let mut p = EventParser::new(sse);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut |e| out.push(String::from_utf8(e.to_vec()).unwrap()));
        }
        p.finish(&mut |e| out.push(String::from_utf8(e.to_vec()).unwrap()));
        out
    }

    #[test]
    fn sse_events_split_anywhere() {
        let body = b"data: {\"a\":1}\n\n: comment\n\ndata:{\"b\":2}\r\n\r\nevent: x\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
        let want = ["{\"a\":1}", "{\"b\":2}", "l1\nl2", "[DONE]"];
        assert_eq!(events(true, &[body]), want);
        // Every split point, and byte by byte.
        for i in 0..body.len() {
            assert_eq!(
                events(true, &[&body[..i], &body[i..]]),
                want,
                "split at {i}"
            );
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(events(true, &bytes), want);
    }

    #[test]
    fn sse_event_complete_only_at_blank_line() {
        let mut p = EventParser::new(true);
        let mut n = 0;
        p.feed(b"data: {\"token\":1}\n", &mut |_| n += 1);
        assert_eq!(n, 0);
        p.feed(b"\n", &mut |_| n += 1);
        assert_eq!(n, 1);
        // A last event without the blank line is dispatched at the end of the body.
        p.feed(b"data: x", &mut |_| n += 1);
        p.finish(&mut |_| n += 1);
        assert_eq!(n, 2);
    }

    #[test]
    fn jsonlines_events() {
        let body = b"{\"token\":1}\n{\"token\":2}\n\n{\"generated_text\":\"x\"}";
        assert_eq!(
            events(false, &[&body[..5], &body[5..17], &body[17..]]),
            [
                "{\"token\":1}",
                "{\"token\":2}",
                "{\"generated_text\":\"x\"}"
            ]
        );
    }

    #[test]
    fn classify_events() {
        use EventKind::*;
        let tgi = br#"{"index":1,"token":{"id":3,"text":"error","logprob":-1.0,"special":false},"generated_text":null,"details":null}"#;
        assert_eq!(classify(Route::GenerateStream, tgi), Token);
        assert_eq!(
            classify(Route::GenerateStream, br#"{"error":"x","error_type":"y"}"#),
            Error
        );
        assert_eq!(
            classify(
                Route::Invocations,
                br#"{"token":{"id":-1,"error_msg":"x"}}"#
            ),
            Error
        );
        assert_eq!(
            classify(
                Route::Chat,
                br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#
            ),
            Other
        );
        assert_eq!(
            classify(
                Route::Chat,
                br#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#
            ),
            Token
        );
        assert_eq!(classify(Route::Chat, b"[DONE]"), Other);
        assert_eq!(
            classify(Route::Chat, br#"{"choices":[],"usage":{}}"#),
            Other
        );
    }

    #[test]
    fn percentiles_are_exact_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 90.0), 90);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
        let v = [10, 20, 30, 40];
        assert_eq!(percentile(&v, 50.0), 20);
        assert_eq!(percentile(&v, 51.0), 30);
        assert_eq!(percentile(&v, 99.0), 40);
    }

    #[test]
    fn counts_tokens_and_metrics() {
        assert_eq!(
            tokens_in_json(br#"{"generated_text":"x","details":{"generated_tokens":16}}"#),
            Some(16)
        );
        assert_eq!(
            tokens_in_json(br#"[{"generated_text":"x","details":{"generated_tokens":5}}]"#),
            Some(5)
        );
        assert_eq!(
            tokens_in_json(br#"{"usage":{"completion_tokens":9}}"#),
            Some(9)
        );
        let text = "# HELP x\nlmi_engine_forward_seconds_total 1.5\nlmi_engine_forward_seconds_total_x 9\nfoo{a=\"1\"} 2\nfoo{a=\"2\"} 3\n";
        assert_eq!(metric(text, "lmi_engine_forward_seconds_total"), Some(1.5));
        assert_eq!(metric(text, "foo"), Some(5.0));
        assert_eq!(metric(text, "bar"), None);
        let t = Target::parse("http://127.0.0.1:18181/").unwrap();
        assert_eq!(t.addr, "127.0.0.1:18181");
        assert_eq!(t.path("/generate_stream"), "/generate_stream");
    }
}
