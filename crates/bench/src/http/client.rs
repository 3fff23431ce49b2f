//! The client side: keep-alive connections sending the workload back to back, timing every
//! token event, and the server's /metrics scraped around the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::events::{EventKind, EventParser, classify, tokens_in_json};
use super::{Stats, Target, Workload};

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
pub struct Load {
    pub target: Target,
    pub work: Workload,
    pub warmup_left: AtomicI64,
    /// Measured requests left to start (requests mode).
    pub left: Option<AtomicI64>,
    pub duration: Option<Duration>,
    pub barrier: tokio::sync::Barrier,
}

fn take(counter: &AtomicI64) -> bool {
    counter.fetch_sub(1, Ordering::Relaxed) > 0
}

pub async fn client(load: Arc<Load>) -> (Stats, Instant) {
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
pub async fn get(t: &Target, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
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
pub fn metric(text: &str, name: &str) -> Option<f64> {
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

pub const STEP_METRIC: &str = "lmi_scheduler_step_seconds_total";
pub const FORWARD_METRIC: &str = "lmi_engine_forward_seconds_total";

pub async fn scrape(t: &Target) -> Option<(f64, f64)> {
    let (status, body) = get(t, "/metrics").await.ok()?;
    if status != StatusCode::OK {
        return None;
    }
    let text = String::from_utf8_lossy(&body);
    Some((metric(&text, STEP_METRIC)?, metric(&text, FORWARD_METRIC)?))
}

/// CPU seconds (user + system) this process has used, from /proc/self/stat (Linux).
pub fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command name: state is field 3, utime 14 and stime 15 (1-based).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0) // USER_HZ is 100 on Linux
}
