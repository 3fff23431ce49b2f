//! Models from S3 (and S3-compatible stores): a prefix listed recursively and downloaded
//! concurrently into `SERVING_DOWNLOAD_DIR`, else a folder per URI under our cache, with
//! the standard credential chain, `AWS_REGION` and `AWS_ENDPOINT_URL_S3`.

mod client;
mod credentials;
mod sigv4;
mod xml;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::Method;

pub use credentials::CredentialEnv;

use crate::download::{self, Target};
use crate::error::{Result, StoreError};
use crate::progress::Progress;
use client::{Client, Object};

const CONCURRENT_OBJECTS: usize = 8;
/// Written into the download folder once complete: the objects (key → size, ETag) it holds.
const MANIFEST: &str = ".lmi-s3-manifest.json";

/// Where S3 is and where its files go.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// `AWS_REGION`, else `AWS_DEFAULT_REGION`, else us-east-1 (a bucket elsewhere is followed).
    pub region: String,
    /// `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`: an S3-compatible store, path-style.
    pub endpoint: Option<String>,
    /// `SERVING_DOWNLOAD_DIR`: where the files go (as LMI puts them); else our cache.
    pub download_dir: Option<PathBuf>,
    pub credentials: CredentialEnv,
}

impl S3Config {
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        S3Config {
            region: get("AWS_REGION")
                .or_else(|| get("AWS_DEFAULT_REGION"))
                .unwrap_or_else(|| "us-east-1".into()),
            endpoint: get("AWS_ENDPOINT_URL_S3").or_else(|| get("AWS_ENDPOINT_URL")),
            download_dir: get("SERVING_DOWNLOAD_DIR").map(PathBuf::from),
            credentials: CredentialEnv::from_vars(&var),
        }
    }
}

/// A prefix on disk.
#[derive(Debug, Clone)]
pub struct Downloaded {
    pub dir: PathBuf,
    /// Bytes of the objects it holds.
    pub bytes: u64,
    /// Bytes that crossed the network this time.
    pub fetched: u64,
}

/// `s3://bucket/prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Uri {
    pub bucket: String,
    /// The key prefix, as given (a trailing `/` kept).
    pub prefix: String,
}

impl std::fmt::Display for S3Uri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

impl S3Uri {
    pub fn parse(spec: &str) -> Result<Self> {
        let rest = spec.strip_prefix("s3://").unwrap_or(spec);
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(StoreError::Source(format!(
                "{spec}: no bucket; expected s3://bucket/prefix/"
            )));
        }
        let lower = prefix.to_ascii_lowercase();
        if [".tar.gz", ".tgz", ".tar", ".zip"]
            .iter()
            .any(|x| lower.ends_with(x))
        {
            return Err(StoreError::Source(format!(
                "{spec} names an archive; lmi expects the S3 prefix (folder) that holds the model's files, s3://bucket/path/ — unpack the archive there"
            )));
        }
        Ok(S3Uri {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

impl S3Uri {
    /// The prefix as a folder: `models/qwen3` lists `models/qwen3/…`, not `models/qwen3-b/…`.
    fn folder(&self) -> String {
        if self.prefix.is_empty() || self.prefix.ends_with('/') {
            self.prefix.clone()
        } else {
            format!("{}/", self.prefix)
        }
    }
}

/// The folder `uri`'s files go to.
pub fn download_dir(cfg: &S3Config, uri: &S3Uri) -> Result<PathBuf> {
    if let Some(d) = &cfg.download_dir {
        return Ok(d.clone());
    }
    let mut dir = crate::cache_root()?.join("s3").join(&uri.bucket);
    for part in uri.folder().split('/').filter(|p| !p.is_empty()) {
        dir.push(safe_component(part)?);
    }
    Ok(dir)
}

fn safe_component(part: &str) -> Result<&str> {
    if part == "." || part == ".." || part.contains('\\') {
        return Err(StoreError::Source(format!(
            "an S3 key with a {part:?} component cannot be stored as a file"
        )));
    }
    Ok(part)
}

/// The prefix's objects in their folder, fetching what is missing or changed. With S3 out of
/// reach, a folder a complete earlier download left is used, with a warning.
pub fn download(cfg: &S3Config, uri: &S3Uri, progress: bool) -> Result<Downloaded> {
    let dir = download_dir(cfg, uri)?;
    let rt = download::runtime()?;
    rt.block_on(async {
        let creds = credentials::find(&cfg.credentials, &cfg.region)
            .await
            .map_err(|e| StoreError::Source(format!("{uri}: AWS credentials: {e}")))?;
        if let Some((c, from)) = &creds {
            tracing::info!(
                "{uri}: credentials from {from}{}",
                c.expires
                    .as_ref()
                    .map(|e| format!(", valid until {e}"))
                    .unwrap_or_default()
            );
        }
        let client = Arc::new(Client::new(cfg.endpoint.clone(), cfg.region.clone(), creds));
        let folder = uri.folder();
        let objects = match client.list(&uri.bucket, &folder).await {
            Ok(o) => o,
            Err(e) if e.transient => {
                return match complete(&dir) {
                    Some(bytes) => {
                        tracing::warn!(
                            "cannot list {uri} ({e}); using the earlier download in {}",
                            dir.display()
                        );
                        Ok(Downloaded {
                            dir,
                            bytes,
                            fetched: 0,
                        })
                    }
                    None => Err(StoreError::Source(format!("cannot list {uri}: {e}"))),
                };
            }
            Err(e) => return Err(StoreError::Source(e.message)),
        };
        let objects = select(uri, &folder, objects)?;
        fetch_objects(client, uri, &folder, &dir, objects, progress).await
    })
}

/// The prefix's `serving.properties`, fetched alone into the download folder (the server
/// reads its configuration before the model); None when the prefix has none.
pub fn properties(cfg: &S3Config, uri: &S3Uri) -> Result<Option<PathBuf>> {
    let dir = download_dir(cfg, uri)?;
    let rt = download::runtime()?;
    rt.block_on(async {
        let creds = credentials::find(&cfg.credentials, &cfg.region)
            .await
            .map_err(|e| StoreError::Source(format!("{uri}: AWS credentials: {e}")))?;
        let client = Client::new(cfg.endpoint.clone(), cfg.region.clone(), creds);
        let key = format!("{}serving.properties", uri.folder());
        let mut resp = client
            .send(Method::GET, &uri.bucket, &key, &[], &[])
            .await
            .map_err(|e| StoreError::Source(format!("{uri}: {e}")))?;
        let status = resp.status();
        let body = crate::http::read_body(resp.body_mut(), 1 << 20)
            .await
            .map_err(|e| StoreError::Source(format!("{uri}: {e}")))?;
        if status == hyper::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let e = client.error(&uri.bucket, &key, status, &String::from_utf8_lossy(&body));
            return Err(StoreError::Source(e.message));
        }
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let path = dir.join("serving.properties");
        std::fs::write(&path, &body).map_err(|e| StoreError::io(&path, e))?;
        Ok(Some(path))
    })
}

/// The objects to fetch: not folder markers, and no pickles beside safetensors.
fn select(uri: &S3Uri, folder: &str, objects: Vec<Object>) -> Result<Vec<Object>> {
    let files: Vec<Object> = objects
        .into_iter()
        .filter(|o| !o.key.ends_with('/') && o.key.len() > folder.len())
        .collect();
    if files.is_empty() {
        return Err(StoreError::Source(format!(
            "{uri} holds no objects (listed as the prefix {folder:?}): check the bucket and path"
        )));
    }
    let safetensors = files.iter().any(|o| o.key.ends_with(".safetensors"));
    let pickle = |k: &str| [".bin", ".pt", ".pth"].iter().any(|x| k.ends_with(x));
    let (skipped, kept): (Vec<Object>, Vec<Object>) = files
        .into_iter()
        .partition(|o| safetensors && pickle(&o.key));
    if !skipped.is_empty() {
        tracing::info!(
            "{uri}: skipping {} PyTorch pickle file(s) beside the safetensors",
            skipped.len()
        );
    }
    Ok(kept)
}

async fn fetch_objects(
    client: Arc<Client>,
    uri: &S3Uri,
    folder: &str,
    dir: &Path,
    objects: Vec<Object>,
    shown: bool,
) -> Result<Downloaded> {
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
    let manifest_path = dir.join(MANIFEST);
    let old = read_manifest(&manifest_path);
    let mut todo = Vec::new();
    for o in &objects {
        let rel = relative(folder, &o.key)?;
        let path = dir.join(&rel);
        let same = old
            .get(&rel)
            .is_some_and(|(size, etag)| *size == o.size && *etag == o.etag)
            && std::fs::metadata(&path).is_ok_and(|m| m.len() == o.size);
        if !same {
            // A changed object replaces the old file.
            let _ = std::fs::remove_file(&path);
            todo.push((o.clone(), rel));
        }
    }
    let needed: u64 = todo.iter().map(|(o, _)| o.size).sum();
    let free = download::free_space(dir).map_err(|e| StoreError::io(dir, e))?;
    download::check_space(dir, needed, free).map_err(StoreError::Source)?;
    let progress = Arc::new(Progress::new(&uri.to_string(), needed, shown));
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_OBJECTS));
    let mut tasks = tokio::task::JoinSet::new();
    for (o, rel) in todo {
        let (client, progress, permits) = (client.clone(), progress.clone(), permits.clone());
        let bucket = uri.bucket.clone();
        let target = Target {
            label: rel.clone(),
            dest: dir.join(&rel),
            lock: dir
                .join(".lmi-locks")
                .join(format!("{}.lock", rel.replace('/', "--"))),
            size: Some(o.size),
            sha256: None,
        };
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            download::fetch(&target, &progress, |from| {
                let (client, bucket, key) = (client.clone(), bucket.clone(), o.key.clone());
                async move {
                    let range: Vec<(&str, String)> = (from > 0)
                        .then(|| ("range", format!("bytes={from}-")))
                        .into_iter()
                        .collect();
                    let mut resp = client.send(Method::GET, &bucket, &key, &[], &range).await?;
                    let s = resp.status();
                    if s.is_success() || s == hyper::StatusCode::RANGE_NOT_SATISFIABLE {
                        return Ok(resp);
                    }
                    let body = crate::http::read_body(resp.body_mut(), 1 << 20)
                        .await
                        .unwrap_or_default();
                    Err(client.error(&bucket, &key, s, &String::from_utf8_lossy(&body)))
                }
            })
            .await
        });
    }
    let joined = download::join_all(tasks).await;
    progress.finish();
    let fetched = joined?;

    let manifest: BTreeMap<String, (u64, String)> = objects
        .iter()
        .filter_map(|o| Some((relative(folder, &o.key).ok()?, (o.size, o.etag.clone()))))
        .collect();
    write_manifest(&manifest_path, &manifest)?;
    Ok(Downloaded {
        dir: dir.to_path_buf(),
        bytes: objects.iter().map(|o| o.size).sum(),
        fetched,
    })
}

/// `key` below `folder`, checked to stay inside the download folder.
fn relative(folder: &str, key: &str) -> Result<String> {
    let rel = key.strip_prefix(folder).unwrap_or(key);
    for part in rel.split('/') {
        if part.is_empty() {
            return Err(StoreError::Source(format!(
                "the S3 key {key:?} has an empty path component"
            )));
        }
        safe_component(part)?;
    }
    Ok(rel.to_string())
}

fn read_manifest(path: &Path) -> BTreeMap<String, (u64, String)> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write_manifest(path: &Path, m: &BTreeMap<String, (u64, String)>) -> Result<()> {
    let tmp = path.with_extension(crate::cache::unique_suffix());
    let text = serde_json::to_vec_pretty(m).map_err(|e| StoreError::Source(e.to_string()))?;
    std::fs::write(&tmp, text).map_err(|e| StoreError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| StoreError::io(path, e))
}

/// The bytes of a complete earlier download in `dir` (its manifest's files all there).
fn complete(dir: &Path) -> Option<u64> {
    let m = read_manifest(&dir.join(MANIFEST));
    if m.is_empty() {
        return None;
    }
    m.iter()
        .all(|(rel, (size, _))| std::fs::metadata(dir.join(rel)).is_ok_and(|f| f.len() == *size))
        .then(|| m.values().map(|(s, _)| s).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stay_inside_the_folder() {
        assert_eq!(relative("m/", "m/a/b.json").unwrap(), "a/b.json");
        assert!(relative("m/", "m/../etc/passwd").is_err());
        assert!(relative("m/", "m/a//b").is_err());
        let u = S3Uri::parse("s3://b/models/qwen3").unwrap();
        assert_eq!(u.folder(), "models/qwen3/");
        let cfg = S3Config::from_vars(|k| (k == "SERVING_DOWNLOAD_DIR").then(|| "/tmp/dl".into()));
        assert_eq!(download_dir(&cfg, &u).unwrap(), PathBuf::from("/tmp/dl"));
        assert_eq!(cfg.region, "us-east-1");
    }

    #[test]
    fn a_prefix_not_an_archive() {
        let u = S3Uri::parse("s3://b/models/qwen3/").unwrap();
        assert_eq!(
            (u.bucket.as_str(), u.prefix.as_str()),
            ("b", "models/qwen3/")
        );
        assert_eq!(u.to_string(), "s3://b/models/qwen3/");
        assert_eq!(S3Uri::parse("s3://b").unwrap().prefix, "");
        let e = S3Uri::parse("s3://b/x/model.tar.gz")
            .unwrap_err()
            .to_string();
        assert!(e.contains("prefix") && e.contains("archive"), "{e}");
        assert!(S3Uri::parse("s3:///x").is_err());
    }
}
