//! The Hub's HTTP API as huggingface_hub uses it: a revision's commit and file list
//! (`/api/models/{repo}/revision/{rev}?blobs=true`), files under `/{repo}/resolve/{commit}/…`
//! (redirected elsewhere for LFS files), and its `X-Error-Code` errors told apart.

use hyper::body::{Bytes, Incoming};
use hyper::{Method, Response, StatusCode};
use url::Url;

use super::env::HubConfig;
use super::select::Sibling;
use crate::http::{self, FetchError};

const MAX_REDIRECTS: usize = 10;

/// A revision of a repository: the commit it is at and its files.
#[derive(Debug, Clone)]
pub struct RevisionInfo {
    pub commit: String,
    pub siblings: Vec<Sibling>,
}

/// Percent-encodes a revision as one path segment (`refs/pr/1` → `refs%2Fpr%2F1`).
fn segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// Percent-encodes a file path, keeping its slashes.
fn file_path(s: &str) -> String {
    s.split('/').map(segment).collect::<Vec<_>>().join("/")
}

pub(crate) fn revision_url(cfg: &HubConfig, repo: &str, revision: &str) -> Result<Url, FetchError> {
    parse(&format!(
        "{}/api/models/{repo}/revision/{}?blobs=true",
        cfg.endpoint,
        segment(revision)
    ))
}

pub(crate) fn file_url(
    cfg: &HubConfig,
    repo: &str,
    commit: &str,
    file: &str,
) -> Result<Url, FetchError> {
    parse(&format!(
        "{}/{repo}/resolve/{}/{}",
        cfg.endpoint,
        segment(commit),
        file_path(file)
    ))
}

fn parse(s: &str) -> Result<Url, FetchError> {
    Url::parse(s).map_err(|e| FetchError::fatal(format!("{s}: {e} (check HF_ENDPOINT)")))
}

/// What an error answer is about, for its message.
#[derive(Clone, Copy)]
pub(crate) enum Asked<'a> {
    Revision { revision: &'a str },
    File { file: &'a str },
}

/// Sends `method` to `url` with the token, following redirects: the token goes along only
/// while the host stays the endpoint's (the Hub sends LFS files to another host).
pub(crate) async fn request(
    cfg: &HubConfig,
    method: Method,
    url: Url,
    extra: &[(&str, String)],
) -> Result<Response<Incoming>, FetchError> {
    let origin = url.origin();
    let mut url = url;
    for _ in 0..=MAX_REDIRECTS {
        let mut headers: Vec<(&str, String)> = extra.to_vec();
        if let Some(t) = &cfg.token
            && url.origin() == origin
        {
            headers.push(("authorization", format!("Bearer {}", t.value)));
        }
        let resp = http::send(method.clone(), &url, &headers, Bytes::new()).await?;
        if !resp.status().is_redirection() {
            return Ok(resp);
        }
        let location = http::header_str(&resp, "location")
            .ok_or_else(|| FetchError::fatal(format!("{url}: a redirect without a Location")))?;
        url = url
            .join(location)
            .map_err(|e| FetchError::fatal(format!("{url}: bad redirect {location:?}: {e}")))?;
    }
    Err(FetchError::fatal(format!(
        "{url}: more than {MAX_REDIRECTS} redirects"
    )))
}

/// Turns an error answer into a message that says what to do.
pub(crate) async fn error_of(
    cfg: &HubConfig,
    repo: &str,
    asked: Asked<'_>,
    mut resp: Response<Incoming>,
) -> FetchError {
    let status = resp.status();
    let code = http::header_str(&resp, "x-error-code")
        .unwrap_or("")
        .to_string();
    let said = http::header_str(&resp, "x-error-message").map(str::to_string);
    // The real Hub also says it in a JSON body, {"error": "..."}.
    let body = http::read_body(resp.body_mut(), 64 * 1024)
        .await
        .unwrap_or_default();
    let said = said.or_else(|| {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_string))
    });
    let endpoint = &cfg.endpoint;
    let token_hint = match &cfg.token {
        Some(t) => format!("the token from {} was not accepted for it", t.from),
        None => "set HF_TOKEN to a token of an account that has access".to_string(),
    };
    let no_repo = || format!("no repository {repo} on {endpoint} (if it is private, {token_hint})");
    let denied = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
    let message = match (code.as_str(), asked) {
        ("GatedRepo", _) => format!(
            "{repo} is a gated repository: accept its licence at {endpoint}/{repo} while logged in, then {}",
            match &cfg.token {
                Some(t) => format!(
                    "make sure the token from {} belongs to that account",
                    t.from
                ),
                None => "set HF_TOKEN to a token of that account".to_string(),
            }
        ),
        ("RepoNotFound", _) => no_repo(),
        ("", Asked::Revision { .. }) if status == StatusCode::UNAUTHORIZED => no_repo(),
        ("RevisionNotFound", Asked::Revision { revision }) => format!(
            "{repo} has no revision {revision:?} (option.revision / HF_REVISION: a branch, tag, commit or refs/pr/N)"
        ),
        ("", Asked::Revision { revision }) if status == StatusCode::NOT_FOUND => {
            format!("no repository {repo} with a revision {revision:?} on {endpoint}")
        }
        ("EntryNotFound", Asked::File { file }) => format!("{repo} has no file {file}"),
        ("", Asked::File { file }) if status == StatusCode::NOT_FOUND => {
            format!("{repo} has no file {file}")
        }
        _ if denied => format!("{endpoint} refused access to {repo} ({status}): {token_hint}"),
        _ => format!("{endpoint} answered {status} for {repo}"),
    };
    let message = match said {
        Some(s) if !s.is_empty() => format!("{message} (the Hub says: {s})"),
        _ => message,
    };
    FetchError {
        message,
        transient: status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS,
    }
}

/// The commit and files of `revision`.
pub(crate) async fn revision_info(
    cfg: &HubConfig,
    repo: &str,
    revision: &str,
) -> Result<RevisionInfo, FetchError> {
    let url = revision_url(cfg, repo, revision)?;
    let mut resp = request(cfg, Method::GET, url, &[]).await?;
    if !resp.status().is_success() {
        return Err(error_of(cfg, repo, Asked::Revision { revision }, resp).await);
    }
    let body = http::read_body(resp.body_mut(), 64 << 20).await?;
    parse_revision(repo, &body)
}

pub(crate) fn parse_revision(repo: &str, body: &[u8]) -> Result<RevisionInfo, FetchError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| FetchError::fatal(format!("{repo}: the Hub's answer is not JSON: {e}")))?;
    let commit = v
        .get("sha")
        .and_then(|s| s.as_str())
        .ok_or_else(|| FetchError::fatal(format!("{repo}: the Hub's answer has no sha")))?
        .to_string();
    let siblings = v
        .get("siblings")
        .and_then(|s| s.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|s| {
                    let lfs = s.get("lfs");
                    Some(Sibling {
                        name: s.get("rfilename")?.as_str()?.to_string(),
                        size: s
                            .get("size")
                            .and_then(|v| v.as_u64())
                            .or_else(|| lfs?.get("size")?.as_u64()),
                        blob_id: s.get("blobId").and_then(|v| v.as_str()).map(str::to_string),
                        sha256: lfs
                            .and_then(|l| l.get("sha256")?.as_str())
                            .map(str::to_string),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(RevisionInfo { commit, siblings })
}

/// A file as a HEAD request names it, for a listing without blob ids: its ETag (the blob's
/// name), its size, and for an LFS file (`X-Linked-Etag`) the sha256 its bytes must have.
pub(crate) struct Head {
    pub etag: String,
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

pub(crate) async fn head(
    cfg: &HubConfig,
    repo: &str,
    commit: &str,
    file: &str,
) -> Result<Head, FetchError> {
    // huggingface_hub reads the first answer that is not a redirect within the Hub (the LFS
    // redirect elsewhere carries X-Linked-Etag / X-Linked-Size), so it is read the same way.
    let mut u = file_url(cfg, repo, commit, file)?;
    for _ in 0..=MAX_REDIRECTS {
        let mut h = vec![("accept-encoding", "identity".to_string())];
        if let Some(t) = &cfg.token {
            h.push(("authorization", format!("Bearer {}", t.value)));
        }
        let resp = http::send(Method::HEAD, &u, &h, Bytes::new()).await?;
        let status = resp.status();
        if !status.is_success() && !status.is_redirection() {
            return Err(error_of(cfg, repo, Asked::File { file }, resp).await);
        }
        let linked = http::header_str(&resp, "x-linked-etag").map(clean_etag);
        let etag = linked
            .clone()
            .or_else(|| http::header_str(&resp, "etag").map(clean_etag))
            .filter(|e| !e.is_empty());
        let size = http::header_str(&resp, "x-linked-size")
            .or_else(|| http::header_str(&resp, "content-length"))
            .and_then(|s| s.parse().ok());
        let next = http::header_str(&resp, "location").and_then(|loc| u.join(loc).ok());
        match (etag, next) {
            (_, Some(next))
                if status.is_redirection() && linked.is_none() && next.origin() == u.origin() =>
            {
                u = next;
            }
            (Some(etag), _) => {
                return Ok(Head {
                    etag,
                    size,
                    sha256: linked,
                });
            }
            _ => break,
        }
    }
    Err(FetchError::fatal(format!(
        "{repo}: the Hub gave no ETag for {file}"
    )))
}

/// `W/"abc"` → `abc`.
pub(crate) fn clean_etag(e: &str) -> String {
    e.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_revisions_and_paths() {
        let cfg = HubConfig::from_vars(|k| (k == "HF_ENDPOINT").then(|| "http://h:1/".into()));
        assert_eq!(
            revision_url(&cfg, "o/r", "refs/pr/1").unwrap().as_str(),
            "http://h:1/api/models/o/r/revision/refs%2Fpr%2F1?blobs=true"
        );
        assert_eq!(
            file_url(&cfg, "o/r", "abc", "sub dir/a+b.json")
                .unwrap()
                .as_str(),
            "http://h:1/o/r/resolve/abc/sub%20dir/a%2Bb.json"
        );
        assert_eq!(clean_etag("W/\"x1\""), "x1");
    }

    #[test]
    fn listing_reads_sizes_blob_ids_and_lfs_hashes() {
        let body = br#"{"sha": "c0ffee", "siblings": [
            {"rfilename": "config.json", "blobId": "b1", "size": 10},
            {"rfilename": "model.safetensors", "blobId": "b2", "size": 99,
             "lfs": {"sha256": "s2", "size": 99, "pointerSize": 130}},
            {"rfilename": "plain.txt"}]}"#;
        let info = parse_revision("o/r", body).unwrap();
        assert_eq!(info.commit, "c0ffee");
        assert_eq!(info.siblings[1].sha256.as_deref(), Some("s2"));
        assert_eq!(info.siblings[1].size, Some(99));
        assert_eq!(info.siblings[2].blob_id, None);
    }
}
