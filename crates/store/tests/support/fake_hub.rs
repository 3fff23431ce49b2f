//! A stand-in for the Hugging Face Hub on loopback, answering as the real one does:
//! `/api/models/{repo}/revision/{rev}` (sha, siblings with blob ids, sizes and LFS hashes),
//! `/api/models/{repo}/tree/{rev}` (the listing huggingface_hub 1.x reads),
//! `/{repo}/resolve/{rev}/{file}` with `ETag`, `X-Repo-Commit`, ranged answers, a 302 with an
//! absolute `Location` to a second host (127.0.0.2) for LFS files (as the Hub sends them to its CDN),
//! `X-Linked-Etag` / `X-Linked-Size`, and `X-Error-Code` errors (RepoNotFound,
//! RevisionNotFound, EntryNotFound, GatedRepo). Faults on demand: a transfer cut half way,
//! corrupted bytes, a server gone. It counts what it serves.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// Files larger than this are LFS files (served from the second port).
pub const LFS_THRESHOLD: usize = 1024;

/// A file as the Hub knows it: its bytes and the two names a client may see for them.
#[derive(Clone)]
pub struct File {
    pub bytes: Bytes,
    pub sha256: String,
    pub blob_id: String,
}

#[derive(Clone, Default)]
pub struct Repo {
    pub files: BTreeMap<String, File>,
    /// Branch or tag → commit.
    pub refs: BTreeMap<String, String>,
    /// Only with this token (the GatedRepo answer without it).
    pub gated_token: Option<String>,
    /// List files by name only (as an endpoint that ignores `?blobs=true`).
    pub names_only: bool,
}

impl Repo {
    pub fn new(files: &[(&str, &[u8])]) -> Self {
        Self::from_bytes(
            files
                .iter()
                .map(|(n, b)| (n.to_string(), Bytes::copy_from_slice(b)))
                .collect(),
        )
    }

    /// Without copying (large files for benchmarks).
    pub fn from_bytes(files: Vec<(String, Bytes)>) -> Self {
        let files: BTreeMap<String, File> = files
            .into_iter()
            .map(|(n, bytes)| {
                let f = File {
                    sha256: sha256_hex(&bytes),
                    blob_id: blob_id(&bytes),
                    bytes,
                };
                (n, f)
            })
            .collect();
        let mut h = Sha256::new();
        for (n, f) in &files {
            h.update(n.as_bytes());
            h.update(f.sha256.as_bytes());
        }
        let commit: String = h
            .finalize()
            .iter()
            .take(20)
            .map(|b| format!("{b:02x}"))
            .collect();
        Repo {
            files,
            refs: BTreeMap::from([("main".to_string(), commit)]),
            gated_token: None,
            names_only: false,
        }
    }

    pub fn commit(&self) -> &str {
        &self.refs["main"]
    }

    pub fn bytes(&self, name: &str) -> &[u8] {
        &self.files[name].bytes
    }
}

pub fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The git blob id of a (non-LFS) file: sha1 over "blob {len}\0" and the bytes. A stand-in
/// hash (sha256's first 40 hex digits) reads the same to a client, which only names files by it.
pub fn blob_id(b: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(format!("blob {}\0", b.len()).as_bytes());
    h.update(b);
    h.finalize()
        .iter()
        .take(20)
        .map(|x| format!("{x:02x}"))
        .collect()
}

#[derive(Default)]
pub struct Faults {
    /// Cut the next transfer of this file after this many bytes.
    pub cut: Option<(String, usize)>,
    /// Flip a byte in the next transfer of this file.
    pub corrupt: Option<String>,
}

#[derive(Default, Debug, Clone)]
pub struct Stats {
    /// File → GET requests for its bytes.
    pub gets: BTreeMap<String, usize>,
    /// File → body bytes sent.
    pub bytes: BTreeMap<String, usize>,
    pub api_calls: usize,
    pub requests: Vec<String>,
    /// LFS ("CDN") requests that carried an Authorization header.
    pub lfs_with_token: usize,
}

#[derive(Default)]
pub struct Shared {
    pub repos: Mutex<BTreeMap<String, Repo>>,
    pub faults: Mutex<Faults>,
    pub stats: Mutex<Stats>,
    lfs_base: Mutex<String>,
}

pub struct FakeHub {
    pub url: String,
    pub shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHub {
    pub fn start() -> Self {
        let shared = Arc::new(Shared::default());
        let (url_tx, url_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let main = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                // Another host name for the "CDN" (Linux routes all of 127/8 to loopback), as
                // clients tell the Hub from where it redirects by host name.
                let lfs = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
                let lfs_base = format!("http://{}", lfs.local_addr().unwrap());
                *s.lfs_base.lock().unwrap() = lfs_base;
                url_tx
                    .send(format!("http://{}", main.local_addr().unwrap()))
                    .unwrap();
                let app = axum::Router::new().fallback(handle).with_state(s.clone());
                let cdn = axum::Router::new().fallback(handle_lfs).with_state(s);
                tokio::select! {
                    _ = axum::serve(main, app) => {}
                    _ = axum::serve(lfs, cdn) => {}
                    _ = stop_rx => {}
                }
            });
        });
        FakeHub {
            url: url_rx.recv().unwrap(),
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn add(&self, name: &str, repo: Repo) {
        self.shared
            .repos
            .lock()
            .unwrap()
            .insert(name.to_string(), repo);
    }

    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().unwrap().clone()
    }

    pub fn reset_stats(&self) {
        *self.shared.stats.lock().unwrap() = Stats::default();
    }

    /// Stops serving (the port refuses connections afterwards).
    pub fn stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop();
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut r = (status, axum::Json(serde_json::json!({"error": message}))).into_response();
    r.headers_mut()
        .insert("x-error-code", HeaderValue::from_str(code).unwrap());
    r.headers_mut()
        .insert("x-error-message", HeaderValue::from_str(message).unwrap());
    r
}

fn token_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::to_string)
}

fn decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Finds the repository a path starts with (`org/name/...`).
fn split_repo(path: &str) -> Option<(String, String)> {
    let mut parts = path.splitn(3, '/');
    let (org, name) = (parts.next()?, parts.next()?);
    Some((
        format!("{org}/{name}"),
        parts.next().unwrap_or("").to_string(),
    ))
}

/// Checks access; the repository when it may be read, else the answer to send.
#[allow(clippy::result_large_err)] // the error is the HTTP answer itself
fn open_repo(s: &Shared, repo: &str, headers: &HeaderMap) -> Result<Repo, Response> {
    let repos = s.repos.lock().unwrap();
    let Some(r) = repos.get(repo) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
            "Repository Not Found",
        ));
    };
    if let Some(t) = &r.gated_token
        && token_of(headers).as_ref() != Some(t)
    {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "GatedRepo",
            "Access to this model is restricted. You must have access to it and be authenticated to access it.",
        ));
    }
    Ok(r.clone())
}

fn commit_of(r: &Repo, rev: &str) -> Option<String> {
    if let Some(c) = r.refs.get(rev) {
        return Some(c.clone());
    }
    r.refs.values().find(|c| c.as_str() == rev).cloned()
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().trim_start_matches('/').to_string();
    s.stats
        .lock()
        .unwrap()
        .requests
        .push(format!("{} {}", req.method(), req.uri()));
    if let Some(rest) = path.strip_prefix("api/models/") {
        s.stats.lock().unwrap().api_calls += 1;
        let Some((repo, rest)) = split_repo(rest) else {
            return error(
                StatusCode::NOT_FOUND,
                "RepoNotFound",
                "Repository Not Found",
            );
        };
        let r = match open_repo(&s, &repo, req.headers()) {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        let tree = rest.starts_with("tree/");
        let rev = rest
            .strip_prefix("revision/")
            .or_else(|| rest.strip_prefix("tree/"))
            .map(decode)
            .unwrap_or_else(|| "main".into());
        let Some(commit) = commit_of(&r, &rev) else {
            return error(
                StatusCode::NOT_FOUND,
                "RevisionNotFound",
                &format!("Invalid rev id: {rev}"),
            );
        };
        if tree {
            // huggingface_hub 1.x lists files here (recursive, one page).
            let entries: Vec<serde_json::Value> = r
                .files
                .iter()
                .map(|(n, f)| {
                    let len = f.bytes.len();
                    let mut v = serde_json::json!({"type": "file", "path": n, "oid": f.blob_id, "size": len});
                    if len > LFS_THRESHOLD {
                        v["lfs"] = serde_json::json!({"oid": f.sha256, "size": len, "pointerSize": 134});
                    }
                    v
                })
                .collect();
            return axum::Json(entries).into_response();
        }
        let siblings: Vec<serde_json::Value> = r
            .files
            .iter()
            .map(|(n, f)| {
                if r.names_only {
                    return serde_json::json!({"rfilename": n});
                }
                let len = f.bytes.len();
                let mut v = serde_json::json!({"rfilename": n, "blobId": f.blob_id, "size": len});
                if len > LFS_THRESHOLD {
                    v["lfs"] =
                        serde_json::json!({"sha256": f.sha256, "size": len, "pointerSize": 134});
                }
                v
            })
            .collect();
        return axum::Json(serde_json::json!({
            "id": repo, "modelId": repo, "sha": commit, "private": false,
            "gated": if r.gated_token.is_some() { serde_json::json!("manual") } else { serde_json::json!(false) },
            "siblings": siblings,
        }))
        .into_response();
    }
    let Some((repo, rest)) = split_repo(&path) else {
        return error(
            StatusCode::NOT_FOUND,
            "RepoNotFound",
            "Repository Not Found",
        );
    };
    let Some(rest) = rest.strip_prefix("resolve/") else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let r = match open_repo(&s, &repo, req.headers()) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let (rev, file) = rest.split_once('/').unwrap_or((rest, ""));
    let (rev, file) = (
        decode(rev),
        file.split('/').map(decode).collect::<Vec<_>>().join("/"),
    );
    let Some(commit) = commit_of(&r, &rev) else {
        return error(
            StatusCode::NOT_FOUND,
            "RevisionNotFound",
            &format!("Invalid rev id: {rev}"),
        );
    };
    let Some(f) = r.files.get(&file) else {
        return error(
            StatusCode::NOT_FOUND,
            "EntryNotFound",
            &format!("{file} does not exist"),
        );
    };
    let mut headers = HeaderMap::new();
    headers.insert("x-repo-commit", HeaderValue::from_str(&commit).unwrap());
    headers.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{}\"", f.blob_id)).unwrap(),
    );
    if f.bytes.len() > LFS_THRESHOLD {
        let sha = &f.sha256;
        let lfs_base = s.lfs_base.lock().unwrap().clone();
        headers.insert(
            "x-linked-etag",
            HeaderValue::from_str(&format!("\"{sha}\"")).unwrap(),
        );
        headers.insert("x-linked-size", HeaderValue::from(f.bytes.len()));
        let location = format!(
            "{lfs_base}/lfs/{repo}/{sha}?file={}",
            url::form_urlencoded::byte_serialize(file.as_bytes()).collect::<String>()
        );
        headers.insert(header::LOCATION, HeaderValue::from_str(&location).unwrap());
        return (StatusCode::FOUND, headers).into_response();
    }
    serve_bytes(
        &s,
        &file,
        f.bytes.clone(),
        req.method(),
        req.headers(),
        headers,
    )
}

/// The "CDN": LFS objects by sha256, no token needed (the redirect is the permission).
async fn handle_lfs(State(s): State<Arc<Shared>>, req: Request) -> Response {
    {
        let mut st = s.stats.lock().unwrap();
        st.requests
            .push(format!("LFS {} {}", req.method(), req.uri()));
        st.lfs_with_token += usize::from(req.headers().contains_key(header::AUTHORIZATION));
    }
    let path = req.uri().path().trim_start_matches('/').to_string();
    let Some(rest) = path.strip_prefix("lfs/") else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (repo, sha) = match rest.rsplit_once('/') {
        Some((r, s)) => (r.to_string(), s.to_string()),
        None => return StatusCode::NOT_FOUND.into_response(),
    };
    let found = s.repos.lock().unwrap().get(&repo).and_then(|r| {
        r.files
            .iter()
            .find(|(_, f)| f.sha256 == sha)
            .map(|(n, f)| (n.clone(), f.bytes.clone()))
    });
    let Some((name, bytes)) = found else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"{sha}\"")).unwrap(),
    );
    serve_bytes(&s, &name, bytes, req.method(), req.headers(), headers)
}

/// The bytes (or the range asked for), with the faults set for this file.
fn serve_bytes(
    s: &Shared,
    file: &str,
    bytes: Bytes,
    method: &Method,
    req: &HeaderMap,
    mut headers: HeaderMap,
) -> Response {
    let len = bytes.len();
    let from = req
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse::<usize>().ok());
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let status = match from {
        Some(f) if f >= len => {
            headers.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{len}")).unwrap(),
            );
            return (StatusCode::RANGE_NOT_SATISFIABLE, headers).into_response();
        }
        Some(f) => {
            headers.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {f}-{}/{len}", len - 1)).unwrap(),
            );
            StatusCode::PARTIAL_CONTENT
        }
        None => StatusCode::OK,
    };
    let body = bytes.slice(from.unwrap_or(0)..);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    if method == Method::HEAD {
        return (status, headers).into_response();
    }
    let mut body = body;
    let mut cut = None;
    {
        let mut f = s.faults.lock().unwrap();
        if f.corrupt.as_deref() == Some(file) {
            f.corrupt = None;
            let mut v = body.to_vec();
            if let Some(b) = v.last_mut() {
                *b ^= 0xff;
            }
            body = Bytes::from(v);
        }
        if let Some((name, at)) = &f.cut
            && name == file
        {
            cut = Some((*at).min(body.len()));
            f.cut = None;
        }
    }
    {
        let mut st = s.stats.lock().unwrap();
        *st.gets.entry(file.to_string()).or_default() += 1;
        *st.bytes.entry(file.to_string()).or_default() += cut.unwrap_or(body.len());
    }
    match cut {
        None => (status, headers, body).into_response(),
        Some(at) => {
            // Headers promise the whole; the connection ends after `at` bytes.
            // The first part, a pause for it to reach the client, then the error that ends
            // the connection.
            let stream = futures_util::stream::unfold(0, move |step| {
                let first = body.slice(..at);
                async move {
                    match step {
                        0 => Some((Ok::<_, std::io::Error>(first), 1)),
                        1 => {
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                            Some((Err(std::io::Error::other("cut")), 2))
                        }
                        _ => None,
                    }
                }
            });
            (status, headers, Body::from_stream(stream)).into_response()
        }
    }
}
