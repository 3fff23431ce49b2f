//! Models from the Hugging Face Hub, as huggingface_hub fetches them (same endpoint, token,
//! revision and offline rules, same cache), so that a cache filled by one serves the other.

mod api;
mod env;
mod layout;
pub mod select;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::Method;

pub use env::{DEFAULT_ENDPOINT, HubConfig, Token};
pub use layout::{RepoCache, is_commit};
use select::Sibling;

use crate::download::{self, Target};
use crate::error::{Result, StoreError};
use crate::http::FetchError;
use crate::progress::Progress;

/// How many files download at once (huggingface_hub's default).
const CONCURRENT_FILES: usize = 8;

/// A repository named on the Hub: `org/name`, a revision, and for a GGUF repository the
/// quantization (`org/name:Q4_K_M`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRef {
    pub repo: String,
    pub revision: Option<String>,
    pub quant: Option<String>,
}

/// What a repository is fetched for: a model (config, tokenizer, weights) or a LoRA adapter
/// (adapter_config.json and its safetensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Model,
    Adapter,
}

/// A revision's files on disk.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `snapshots/<commit>`: the model directory.
    pub dir: PathBuf,
    pub commit: String,
    /// The GGUF file(s) chosen, in shard order; empty for a safetensors model.
    pub gguf: Vec<PathBuf>,
    /// Bytes of the files the snapshot holds for the model.
    pub bytes: u64,
    /// Bytes that crossed the network this time.
    pub fetched: u64,
}

impl HubRef {
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("main")
    }
}

/// The files of `r` in the cache, fetching what is missing unless offline. With the Hub out
/// of reach, a complete cached snapshot of the revision is used, with a warning.
pub fn snapshot(cfg: &HubConfig, r: &HubRef, progress: bool) -> Result<Snapshot> {
    snapshot_for(cfg, r, Purpose::Model, progress)
}

/// [`snapshot`] for a model or an adapter.
pub fn snapshot_for(
    cfg: &HubConfig,
    r: &HubRef,
    purpose: Purpose,
    progress: bool,
) -> Result<Snapshot> {
    let cache = RepoCache::new(&cfg.cache, &r.repo);
    if cfg.offline {
        return cached(&cache, r, purpose).ok_or_else(|| {
            StoreError::Source(format!(
                "HF_HUB_OFFLINE is set and {} holds no complete snapshot of {}@{}: fetch it once with the network on, or unset HF_HUB_OFFLINE",
                cfg.cache.display(),
                r.repo,
                r.revision()
            ))
        });
    }
    let rt = download::runtime()?;
    let cfg = Arc::new(cfg.clone());
    let info = match rt.block_on(api::revision_info(&cfg, &r.repo, r.revision())) {
        Ok(info) => info,
        Err(e) if e.transient => {
            return match cached(&cache, r, purpose) {
                Some(s) => {
                    tracing::warn!(
                        "cannot reach {} ({e}); serving the cached snapshot {} of {}@{}",
                        cfg.endpoint,
                        s.commit,
                        r.repo,
                        r.revision()
                    );
                    Ok(s)
                }
                None => Err(StoreError::Source(format!(
                    "cannot reach {} for {}: {e} (and the cache {} holds no complete snapshot of it)",
                    cfg.endpoint,
                    r.repo,
                    cfg.cache.display()
                ))),
            };
        }
        Err(e) => return Err(StoreError::Source(e.message)),
    };
    rt.block_on(fetch_revision(
        cfg,
        cache,
        r.clone(),
        info,
        purpose,
        progress,
    ))
}

/// Fetches the files of `info` that `r` needs into the cache.
async fn fetch_revision(
    cfg: Arc<HubConfig>,
    cache: RepoCache,
    r: HubRef,
    info: api::RevisionInfo,
    purpose: Purpose,
    progress: bool,
) -> Result<Snapshot> {
    let commit = info.commit.clone();
    let fail = |m: String| StoreError::Source(m);
    let gguf_wanted =
        purpose == Purpose::Model && (r.quant.is_some() || select::is_gguf_repo(&info.siblings));
    let mut fetched = 0;
    let (first, weights): (Vec<&Sibling>, Vec<&Sibling>) = if purpose == Purpose::Adapter {
        (
            Vec::new(),
            select::adapter(&r.repo, &info.siblings).map_err(fail)?,
        )
    } else if gguf_wanted {
        let files = select::gguf(&r.repo, &info.siblings, r.quant.as_deref()).map_err(fail)?;
        (Vec::new(), files)
    } else {
        let meta = select::metadata(&info.siblings);
        if !meta.iter().any(|s| s.name == "config.json") {
            select::weights(&r.repo, &info.siblings, None).map_err(fail)?;
            return Err(fail(format!("{} has no config.json", r.repo)));
        }
        // The index first: it says which shards to fetch.
        fetched += fetch_all(&cfg, &cache, &r.repo, &commit, &meta, "metadata", false).await?;
        // A quantized checkpoint that will not load is refused before its weights come.
        let config = std::fs::read_to_string(cache.snapshot(&commit).join("config.json"))
            .map_err(|e| StoreError::io(cache.snapshot(&commit), e))?;
        lmi_checkpoint::config::quantization::check_json(&config)
            .map_err(|e| fail(format!("{}: {e}", r.repo)))?;
        let index = std::fs::read_to_string(cache.snapshot(&commit).join(select::INDEX)).ok();
        let w = select::weights(&r.repo, &info.siblings, index.as_deref()).map_err(fail)?;
        (meta, w)
    };
    let missing: u64 = weights
        .iter()
        .filter(|s| !blob_of(&cache, s).is_some_and(|b| b.is_file()))
        .map(|s| s.size.unwrap_or(0))
        .sum();
    std::fs::create_dir_all(cache.root()).map_err(|e| StoreError::io(cache.root(), e))?;
    let free = download::free_space(cache.root()).map_err(|e| StoreError::io(cache.root(), e))?;
    download::check_space(cache.root(), missing, free).map_err(fail)?;
    let what = format!("{}@{}", r.repo, &commit[..commit.len().min(12)]);
    fetched += fetch_all(&cfg, &cache, &r.repo, &commit, &weights, &what, progress).await?;
    cache
        .write_ref(r.revision(), &commit)
        .map_err(|e| StoreError::io(cache.root(), e))?;
    let dir = cache.snapshot(&commit);
    let bytes = first.iter().chain(&weights).filter_map(|s| s.size).sum();
    Ok(Snapshot {
        gguf: if gguf_wanted {
            weights.iter().map(|s| dir.join(&s.name)).collect()
        } else {
            Vec::new()
        },
        dir,
        commit,
        bytes,
        fetched,
    })
}

/// The blob a listed file is stored as, when the listing names it.
fn blob_of(cache: &RepoCache, s: &Sibling) -> Option<PathBuf> {
    s.sha256
        .as_ref()
        .or(s.blob_id.as_ref())
        .map(|e| cache.blob(e))
}

/// Fetches `files` concurrently and links each into the snapshot; returns the bytes fetched.
async fn fetch_all(
    cfg: &Arc<HubConfig>,
    cache: &RepoCache,
    repo: &str,
    commit: &str,
    files: &[&Sibling],
    what: &str,
    shown: bool,
) -> Result<u64> {
    let total = files.iter().filter_map(|s| s.size).sum();
    let progress = Arc::new(Progress::new(what, total, shown));
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_FILES));
    let mut tasks = tokio::task::JoinSet::new();
    for s in files {
        let (cfg, cache, progress, permits) = (
            cfg.clone(),
            cache.clone(),
            progress.clone(),
            permits.clone(),
        );
        let (repo, commit, s) = (repo.to_string(), commit.to_string(), (*s).clone());
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            fetch_file(&cfg, &cache, &repo, &commit, &s, &progress).await
        });
    }
    let joined = download::join_all(tasks).await;
    progress.finish();
    joined
}

async fn fetch_file(
    cfg: &HubConfig,
    cache: &RepoCache,
    repo: &str,
    commit: &str,
    s: &Sibling,
    progress: &Progress,
) -> Result<u64, FetchError> {
    let (etag, size, sha256) = match s.sha256.as_ref().or(s.blob_id.as_ref()) {
        Some(e) => (e.clone(), s.size, s.sha256.clone()),
        None => {
            let h = api::head(cfg, repo, commit, &s.name).await?;
            (h.etag, h.size, h.sha256)
        }
    };
    let url = api::file_url(cfg, repo, commit, &s.name)?;
    let target = Target {
        label: s.name.clone(),
        dest: cache.blob(&etag),
        lock: cache.lock_path(&etag),
        size,
        sha256,
    };
    let fetched = download::fetch(&target, progress, |from| {
        let url = url.clone();
        let file = s.name.clone();
        async move {
            let range = (from > 0).then(|| ("range", format!("bytes={from}-")));
            let resp = api::request(
                cfg,
                Method::GET,
                url,
                &range.into_iter().collect::<Vec<_>>(),
            )
            .await?;
            if resp.status().is_success()
                || resp.status() == hyper::StatusCode::RANGE_NOT_SATISFIABLE
            {
                Ok(resp)
            } else {
                Err(api::error_of(cfg, repo, api::Asked::File { file: &file }, resp).await)
            }
        }
    })
    .await?;
    cache
        .link(commit, &s.name, &etag)
        .map_err(|e| FetchError::fatal(format!("{}: {e}", cache.snapshot(commit).display())))?;
    Ok(fetched)
}

/// A complete snapshot of `r` in the cache, read without the network: the commit its
/// revision was last seen at, and every file the model needs present.
pub fn cached(cache: &RepoCache, r: &HubRef, purpose: Purpose) -> Option<Snapshot> {
    let commit = cache.commit_of(r.revision())?;
    let dir = cache.snapshot(&commit);
    let files = list_files(&dir);
    let siblings: Vec<Sibling> = files
        .iter()
        .map(|name| Sibling {
            name: name.clone(),
            size: std::fs::metadata(dir.join(name)).ok().map(|m| m.len()),
            blob_id: None,
            sha256: None,
        })
        .collect();
    let (chosen, gguf) = if purpose == Purpose::Adapter {
        (select::adapter(&r.repo, &siblings).ok()?, Vec::new())
    } else if r.quant.is_some() || select::is_gguf_repo(&siblings) {
        let g = select::gguf(&r.repo, &siblings, r.quant.as_deref()).ok()?;
        (g.clone(), g)
    } else {
        if !dir.join("config.json").is_file() {
            return None;
        }
        let index = std::fs::read_to_string(dir.join(select::INDEX)).ok();
        let w = select::weights(&r.repo, &siblings, index.as_deref()).ok()?;
        let mut all = select::metadata(&siblings);
        all.extend(w);
        (all, Vec::new())
    };
    // A file whose blob is gone (a half-cleaned cache) is not there.
    if chosen.iter().any(|s| s.size.is_none()) {
        return None;
    }
    Some(Snapshot {
        gguf: gguf.iter().map(|s| dir.join(&s.name)).collect(),
        bytes: chosen.iter().filter_map(|s| s.size).sum(),
        dir,
        commit,
        fetched: 0,
    })
}

/// Files under `dir`, as paths relative to it with `/`.
fn list_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    out
}
