//! Signed S3 requests: ListObjectsV2 pages and object GETs, path-style against a configured
//! endpoint (S3-compatible stores), virtual-hosted against AWS, following a bucket's region.

use std::sync::Mutex;

use hyper::body::{Bytes, Incoming};
use hyper::{Method, Response, StatusCode};
use url::Url;

use super::credentials::Credentials;
use super::sigv4;
use super::xml;
use crate::http::{self, FetchError};

pub(crate) struct Client {
    endpoint: Option<String>,
    region: Mutex<String>,
    creds: Option<Credentials>,
    /// Where the credentials came from, for errors.
    pub(crate) creds_from: &'static str,
}

/// One object under the prefix.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub key: String,
    pub size: u64,
    pub etag: String,
}

impl Client {
    pub(crate) fn new(
        endpoint: Option<String>,
        region: String,
        creds: Option<(Credentials, &'static str)>,
    ) -> Self {
        let (creds, creds_from) = match creds {
            Some((c, from)) => (Some(c), from),
            None => (None, "none found (requests unsigned)"),
        };
        Client {
            endpoint,
            region: Mutex::new(region),
            creds,
            creds_from,
        }
    }

    fn region(&self) -> String {
        self.region.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The URL of `key` in `bucket` (`key` empty: the bucket itself), and its Host.
    fn url(&self, bucket: &str, key: &str) -> Result<Url, FetchError> {
        let path = sigv4::uri_encode(key, true);
        let s = match &self.endpoint {
            // `/bucket` for the bucket itself, as the SDKs send it.
            Some(e) if key.is_empty() => format!("{}/{bucket}", e.trim_end_matches('/')),
            Some(e) => format!("{}/{bucket}/{path}", e.trim_end_matches('/')),
            None if bucket.contains('.') => {
                format!("https://s3.{}.amazonaws.com/{bucket}/{path}", self.region())
            }
            None => format!("https://{bucket}.s3.{}.amazonaws.com/{path}", self.region()),
        };
        Url::parse(&s)
            .map_err(|e| FetchError::fatal(format!("{s}: {e} (check AWS_ENDPOINT_URL_S3)")))
    }

    /// A signed request; follows the bucket to its region once when S3 says it is elsewhere.
    pub(crate) async fn send(
        &self,
        method: Method,
        bucket: &str,
        key: &str,
        query: &[(String, String)],
        extra: &[(&str, String)],
    ) -> Result<Response<Incoming>, FetchError> {
        for _ in 0..2 {
            let mut url = self.url(bucket, key)?;
            // url's encoding of the query (`+` for spaces) differs from SigV4's; send ours.
            let canonical_query: Vec<String> = query
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}={}",
                        sigv4::uri_encode(k, false),
                        sigv4::uri_encode(v, false)
                    )
                })
                .collect();
            url.set_query(
                (!query.is_empty())
                    .then(|| canonical_query.join("&"))
                    .as_deref(),
            );
            let mut headers: Vec<(&str, String)> = extra.to_vec();
            if let Some(c) = &self.creds {
                let host = match url.port() {
                    Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
                    None => url.host_str().unwrap_or_default().to_string(),
                };
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                headers.extend(sigv4::sign(
                    c,
                    &self.region(),
                    method.as_str(),
                    &host,
                    url.path(),
                    query,
                    &sigv4::amz_date(now),
                ));
            }
            let resp = http::send(method.clone(), &url, &headers, Bytes::new()).await?;
            let moved = matches!(
                resp.status(),
                StatusCode::MOVED_PERMANENTLY | StatusCode::BAD_REQUEST
            );
            if moved
                && self.endpoint.is_none()
                && let Some(region) = http::header_str(&resp, "x-amz-bucket-region")
                && region != self.region()
            {
                tracing::info!("s3://{bucket} is in {region}");
                if let Ok(mut r) = self.region.lock() {
                    *r = region.to_string();
                }
                continue;
            }
            return Ok(resp);
        }
        Err(FetchError::fatal(format!(
            "s3://{bucket}: S3 kept redirecting between regions"
        )))
    }

    /// Every object under `prefix`.
    pub(crate) async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<Object>, FetchError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![
                ("list-type".to_string(), "2".to_string()),
                ("prefix".to_string(), prefix.to_string()),
            ];
            if let Some(t) = &token {
                query.push(("continuation-token".to_string(), t.clone()));
            }
            let mut resp = self.send(Method::GET, bucket, "", &query, &[]).await?;
            let status = resp.status();
            let body = http::read_body(resp.body_mut(), 64 << 20).await?;
            let text = String::from_utf8_lossy(&body);
            if !status.is_success() {
                return Err(self.error(bucket, prefix, status, &text));
            }
            for c in xml::all(&text, "Contents") {
                let (Some(key), Some(size)) = (xml::first(c, "Key"), xml::first(c, "Size")) else {
                    continue;
                };
                out.push(Object {
                    key: xml::unescape(key),
                    size: size.trim().parse().unwrap_or(0),
                    etag: xml::first(c, "ETag")
                        .map(|e| xml::unescape(e).trim_matches('"').to_string())
                        .unwrap_or_default(),
                });
            }
            token = (xml::first(&text, "IsTruncated") == Some("true"))
                .then(|| xml::first(&text, "NextContinuationToken").map(xml::unescape))
                .flatten();
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// An S3 error answer in one line that says which.
    pub(crate) fn error(
        &self,
        bucket: &str,
        prefix: &str,
        status: StatusCode,
        body: &str,
    ) -> FetchError {
        let code = xml::first(body, "Code").unwrap_or("");
        let message = match code {
            "NoSuchBucket" => format!(
                "there is no bucket {bucket} (s3://{bucket}/{prefix}, region {})",
                self.region()
            ),
            "AccessDenied"
            | "AllAccessDisabled"
            | "InvalidAccessKeyId"
            | "SignatureDoesNotMatch"
            | "ExpiredToken" => format!(
                "access to s3://{bucket}/{prefix} was denied ({}; credentials: {}): the identity needs s3:ListBucket on the bucket and s3:GetObject on the prefix",
                xml::error_text(body),
                self.creds_from
            ),
            _ => format!(
                "s3://{bucket}/{prefix}: S3 answered {status}: {}",
                xml::error_text(body)
            ),
        };
        FetchError {
            message,
            transient: status.is_server_error()
                || status == StatusCode::TOO_MANY_REQUESTS
                || code == "SlowDown",
        }
    }
}
