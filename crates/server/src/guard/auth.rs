//! Optional API keys. When keys are configured, every route but the open ones needs
//! `Authorization: Bearer <key>` or `x-api-key: <key>`. Keys are compared as SHA-256 digests
//! in constant time, against every configured key without stopping early, so neither the
//! timing nor the response tells how much of a key was right. A refusal is counted
//! (`lmi_auth_refused_total{reason}`) and logged without the key.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::Response;
use lmi_api::ApiError;
use sha2::{Digest, Sha256};

use crate::app::AppState;

/// Digests of the accepted keys.
pub struct Keys(Vec<[u8; 32]>);

impl Keys {
    pub fn new(keys: &[String]) -> Self {
        Keys(keys.iter().map(|k| digest(k)).collect())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `presented` is one of the keys; the time taken depends only on how many keys
    /// there are.
    pub fn accepts(&self, presented: &str) -> bool {
        let d = digest(presented);
        let mut any = 0u8;
        for k in &self.0 {
            let diff = k.iter().zip(&d).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            // 1 when equal, branch-free.
            any |= ((u16::from(diff).wrapping_sub(1)) >> 8) as u8 & 1;
        }
        std::hint::black_box(any) == 1
    }
}

fn digest(k: &str) -> [u8; 32] {
    Sha256::digest(k.as_bytes()).into()
}

/// Routes that answer without a key: health checks (orchestrators send none), the OpenAPI
/// document and the chat page (it asks the user for the key), and `/metrics` unless
/// option.protect_metrics.
fn is_open(method: &Method, path: &str, protect_metrics: bool) -> bool {
    match path {
        "/ping" | "/health" | "/api-doc/openapi.json" | "/chat" => true,
        "/" => method == Method::GET || method == Method::HEAD,
        "/metrics" => !protect_metrics,
        _ => false,
    }
}

/// The key a request carries: `Authorization: Bearer <key>`, else `x-api-key`.
fn presented(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        });
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
}

pub async fn layer(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let keys = s.api_keys();
    if keys.is_empty()
        || req.method() == Method::OPTIONS
        || is_open(
            req.method(),
            req.uri().path(),
            s.config.access.protect_metrics,
        )
    {
        return next.run(req).await;
    }
    let reason = match presented(req.headers()) {
        Some(k) if keys.accepts(k) => return next.run(req).await,
        Some(_) => "invalid",
        None => "missing",
    };
    s.metrics.auth_refused(reason);
    tracing::info!(reason, "API key refused");
    let mut res = super::wire::error_response(req.uri().path(), &ApiError::unauthorized());
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_configured_keys() {
        let k = Keys::new(&["alpha".into(), "beta-2".into()]);
        assert!(k.accepts("alpha") && k.accepts("beta-2"));
        assert!(!k.accepts("alph") && !k.accepts("alphaa") && !k.accepts(""));
        assert!(Keys::new(&[]).is_empty());
    }

    #[test]
    fn bearer_then_x_api_key() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), None);
        h.insert("x-api-key", HeaderValue::from_static("k2"));
        assert_eq!(presented(&h), Some("k2"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  k1 "),
        );
        assert_eq!(presented(&h), Some("k1"));
    }

    #[test]
    fn open_routes() {
        assert!(is_open(&Method::GET, "/ping", true));
        assert!(is_open(&Method::GET, "/", false));
        assert!(!is_open(&Method::POST, "/", false));
        assert!(is_open(&Method::GET, "/metrics", false));
        assert!(!is_open(&Method::GET, "/metrics", true));
        assert!(!is_open(&Method::GET, "/v1/models", false));
    }
}
