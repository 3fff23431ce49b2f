//! Download progress: a bar on a terminal; otherwise (containers, log collectors) a line per
//! file, and every ten seconds for a long one, with MB/s and the time left.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

const LINE_EVERY: Duration = Duration::from_secs(10);

pub(crate) struct Progress {
    what: String,
    total: u64,
    done: AtomicU64,
    start: Instant,
    bar: Option<ProgressBar>,
    lines: bool,
    last_line: Mutex<Instant>,
}

impl Progress {
    /// `shown`: false for tests and quiet callers (nothing printed).
    pub(crate) fn new(what: &str, total: u64, shown: bool) -> Self {
        let tty = shown && std::io::stderr().is_terminal();
        let bar = tty.then(|| {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(what.to_string());
            bar
        });
        Progress {
            what: what.to_string(),
            total,
            done: AtomicU64::new(0),
            start: Instant::now(),
            bar,
            lines: shown && !tty,
            last_line: Mutex::new(Instant::now()),
        }
    }

    pub(crate) fn add(&self, bytes: u64) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        } else if self.lines
            && let Ok(mut last) = self.last_line.try_lock()
            && last.elapsed() >= LINE_EVERY
        {
            *last = Instant::now();
            tracing::info!("{}: {}", self.what, self.status(done));
        }
    }

    /// Bytes counted again after a restart (a resume that the server would not honour).
    pub(crate) fn sub(&self, bytes: u64) {
        let done = self
            .done
            .fetch_sub(bytes, Ordering::Relaxed)
            .saturating_sub(bytes);
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }

    pub(crate) fn file_done(&self, file: &str, bytes: u64, took: Duration) {
        if self.lines {
            let done = self.done.load(Ordering::Relaxed);
            tracing::info!(
                "{}: {file} ({}) in {:.1} s; {}",
                self.what,
                mb(bytes),
                took.as_secs_f64(),
                self.status(done)
            );
        }
    }

    fn status(&self, done: u64) -> String {
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let rate = done as f64 / secs;
        let left = self.total.saturating_sub(done) as f64;
        let eta = if rate > 0.0 {
            left / rate
        } else {
            f64::INFINITY
        };
        format!(
            "{} of {} at {:.1} MB/s, ETA {}",
            mb(done),
            mb(self.total),
            rate / 1e6,
            if eta.is_finite() {
                format!("{eta:.0} s")
            } else {
                "?".into()
            }
        )
    }

    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}
