//! One object fetched to a file, whatever the source: under a lock (one download per file
//! across processes), into `<dest>.incomplete`, resumed with `Range` after a cut, retried
//! with backoff, checked (size, and sha256 where the source gives it), then renamed.

use std::fs::File;
use std::future::Future;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use hyper::body::Incoming;
use sha2::{Digest, Sha256};

use crate::cache::CacheLock;
use crate::http::{self, FetchError};
use crate::progress::Progress;

/// Consecutive failures (without a byte gained) before giving up.
const MAX_FAILURES: u32 = 6;
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Bytes gathered before each write (and hash update).
const WRITE_CHUNK: usize = 4 << 20;

/// Where one object goes and what it must be.
pub(crate) struct Target {
    /// The source's name for it, for messages.
    pub label: String,
    pub dest: PathBuf,
    pub lock: PathBuf,
    pub size: Option<u64>,
    /// Lowercase hex.
    pub sha256: Option<String>,
}

fn incomplete(dest: &Path) -> PathBuf {
    let mut s = dest.as_os_str().to_owned();
    s.push(".incomplete");
    PathBuf::from(s)
}

/// Fetches `t` with `get(offset)` (a GET from byte `offset`, with `Range` when it is not 0);
/// returns the bytes that crossed the network (0 when the file was there already).
pub(crate) async fn fetch<F, Fut>(
    t: &Target,
    progress: &Progress,
    get: F,
) -> Result<u64, FetchError>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<hyper::Response<Incoming>, FetchError>>,
{
    let lock_path = t.lock.clone();
    let _lock = tokio::task::spawn_blocking(move || CacheLock::at(&lock_path))
        .await
        .map_err(|e| FetchError::fatal(format!("waiting for a lock: {e}")))?
        .map_err(|e| FetchError::fatal(e.to_string()))?;
    if let Ok(meta) = std::fs::metadata(&t.dest)
        && t.size.is_none_or(|s| s == meta.len())
    {
        progress.add(meta.len());
        return Ok(0); // another process (or an earlier run) fetched it
    }
    if let Some(dir) = t.dest.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    let partial = incomplete(&t.dest);
    let started = Instant::now();
    let mut fetched = 0u64;
    let mut failures = 0u32;
    loop {
        let before = fetched;
        match attempt(t, &partial, progress, &get, &mut fetched).await {
            Ok(()) => break,
            Err(e) if e.transient && failures + 1 < MAX_FAILURES => {
                failures = if fetched > before { 1 } else { failures + 1 };
                let wait = FIRST_BACKOFF * 2u32.pow(failures - 1);
                tracing::warn!("{}: {e}; trying again in {wait:?}", t.label);
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
    std::fs::rename(&partial, &t.dest).map_err(|e| io(&t.dest, e))?;
    let size = std::fs::metadata(&t.dest).map(|m| m.len()).unwrap_or(0);
    progress.file_done(&t.label, size, started.elapsed());
    Ok(fetched)
}

fn io(path: &Path, e: std::io::Error) -> FetchError {
    FetchError::fatal(format!("{}: {e}", path.display()))
}

/// One request: resumes `partial` where it stops, streams the rest, checks the whole.
async fn attempt<F, Fut>(
    t: &Target,
    partial: &Path,
    progress: &Progress,
    get: &F,
    fetched: &mut u64,
) -> Result<(), FetchError>
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<hyper::Response<Incoming>, FetchError>>,
{
    let mut have = std::fs::metadata(partial).map(|m| m.len()).unwrap_or(0);
    if t.size.is_some_and(|s| have > s) {
        have = 0;
    }
    let resp = get(have).await?;
    let status = resp.status();
    let from = match status {
        StatusCode::PARTIAL_CONTENT if have > 0 => {
            let range = http::header_str(&resp, "content-range").unwrap_or("");
            if !range.starts_with(&format!("bytes {have}-")) {
                return Err(FetchError::transient(format!(
                    "asked for bytes from {have}, got {range:?}"
                )));
            }
            have
        }
        StatusCode::OK => 0,
        StatusCode::RANGE_NOT_SATISFIABLE if have > 0 => {
            // What we hold is all there is (or wrong): let the checks below decide.
            std::fs::remove_file(partial).map_err(|e| io(partial, e))?;
            return Err(FetchError::transient(
                "the partial file did not fit; starting over",
            ));
        }
        s => {
            return Err(FetchError {
                message: format!("{}: answered {s}", t.label),
                transient: s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS,
            });
        }
    };
    if from == 0 && have > 0 {
        progress.sub(have); // counted when first read below
    }
    let mut file = File::options()
        .create(true)
        .append(from > 0)
        .write(true)
        .truncate(from == 0)
        .open(partial)
        .map_err(|e| io(partial, e))?;
    let mut hasher = t.sha256.as_ref().map(|_| Sha256::new());
    if let Some(h) = hasher.as_mut()
        && from > 0
    {
        hash_file(partial, h).map_err(|e| io(partial, e))?;
    }
    if from > 0 && *fetched == 0 {
        progress.add(from); // resumed from an earlier process's bytes
    }
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_CHUNK);
    let mut flush = |buf: &mut Vec<u8>, file: &mut File| -> Result<(), FetchError> {
        file.write_all(buf).map_err(|e| io(partial, e))?;
        if let Some(h) = hasher.as_mut() {
            h.update(&buf[..]);
        }
        buf.clear();
        Ok(())
    };
    let mut written = from;
    let streamed = loop {
        match http::next_chunk(&mut body).await {
            Ok(Some(chunk)) => {
                *fetched += chunk.len() as u64;
                written += chunk.len() as u64;
                progress.add(chunk.len() as u64);
                buf.extend_from_slice(&chunk);
                if buf.len() >= WRITE_CHUNK {
                    flush(&mut buf, &mut file)?;
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    // Keep what arrived before a cut: the next attempt resumes after it.
    flush(&mut buf, &mut file)?;
    file.sync_data().map_err(|e| io(partial, e))?;
    streamed?;
    if let Some(size) = t.size
        && written != size
    {
        return Err(FetchError::transient(format!(
            "{}: {written} bytes arrived, {size} expected",
            t.label
        )));
    }
    if let (Some(h), Some(want)) = (hasher, &t.sha256) {
        let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if !got.eq_ignore_ascii_case(want) {
            std::fs::remove_file(partial).map_err(|e| io(partial, e))?;
            progress.sub(written);
            return Err(FetchError::transient(format!(
                "{}: the bytes are corrupt (sha256 {got}, the source says {want}); fetching again",
                t.label
            )));
        }
    }
    Ok(())
}

fn hash_file(path: &Path, h: &mut Sha256) -> std::io::Result<()> {
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

/// The runtime a fetch runs on: its callers are synchronous (`lmi serve` resolves in a
/// blocking task), and a runtime of its own keeps blocking file writes off anyone else's.
pub(crate) fn runtime() -> crate::error::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("lmi-fetch")
        .enable_all()
        .build()
        .map_err(|e| {
            crate::error::StoreError::Source(format!("starting the download runtime: {e}"))
        })
}

/// Waits for every file's task; the first failure aborts the rest and is the answer, else
/// the bytes fetched in all.
pub(crate) async fn join_all(
    mut tasks: tokio::task::JoinSet<Result<u64, FetchError>>,
) -> crate::error::Result<u64> {
    use crate::error::StoreError;
    let mut fetched = 0;
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        let failed = match done {
            Ok(Ok(n)) => {
                fetched += n;
                continue;
            }
            Ok(Err(e)) => StoreError::Source(e.message),
            Err(e) if e.is_cancelled() => continue,
            Err(e) => StoreError::Source(format!("a download task failed: {e}")),
        };
        if first_error.is_none() {
            first_error = Some(failed);
            tasks.abort_all();
        }
    }
    first_error.map_or(Ok(fetched), Err)
}

/// Free bytes on the file system holding `dir`.
pub(crate) fn free_space(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a zeroed statvfs the call fills.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// The error when `needed` more bytes do not fit in `free`.
pub(crate) fn check_space(dir: &Path, needed: u64, free: u64) -> Result<(), String> {
    // Leave a little room: a full disk breaks more than this download.
    let margin = 64 << 20;
    if needed + margin <= free {
        return Ok(());
    }
    Err(format!(
        "not enough disk space in {}: the download needs {:.2} GB more and {:.2} GB is free; free some space or point the cache elsewhere (HF_HUB_CACHE, SERVING_DOWNLOAD_DIR)",
        dir.display(),
        needed as f64 / 1e9,
        free as f64 / 1e9
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_check_names_both_sizes() {
        assert!(check_space(Path::new("/c"), 1 << 20, 1 << 30).is_ok());
        let e = check_space(Path::new("/c"), 3_000_000_000, 1_000_000_000).unwrap_err();
        assert!(
            e.contains("3.00 GB") && e.contains("1.00 GB") && e.contains("/c"),
            "{e}"
        );
        assert!(free_space(Path::new("/")).unwrap() > 0);
    }
}
