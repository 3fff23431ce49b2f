//! The guard layers through the real router (and, for the time limit, slow stand-in routes).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use tower::ServiceExt;

use crate::app::AppState;
use crate::config::{EnvVars, ServeArgs, ServingConfig};
use crate::metrics::ServerMetrics;

fn state(options: &[&str]) -> Arc<AppState> {
    let cli = ServeArgs {
        options: options.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    };
    let config = ServingConfig::load(&cli, &EnvVars::new(), None).unwrap();
    Arc::new(AppState::new(
        Arc::new(config),
        Arc::new(ServerMetrics::new()),
        "tiny".into(),
        "tiny".into(),
    ))
}

async fn send(app: Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let res = app.oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

fn req(method: &str, path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut r = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.body(Body::from("{}")).unwrap()
}

#[tokio::test]
async fn api_keys_guard_every_generation_route_in_its_schema() {
    let s = state(&["option.api_key=sekret-1,sekret-2"]);
    let app = || crate::router::router(s.clone());
    // No key: 401 in each route's shape.
    let (st, h, body) = send(app(), req("POST", "/v1/chat/completions", &[])).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert_eq!(h["www-authenticate"], "Bearer");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error_type"], "authentication", "{body}");
    let (st, _, body) = send(app(), req("POST", "/invocations", &[])).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], 401, "{body}");
    let (st, _, body) = send(app(), req("GET", "/models/tiny/adapters", &[])).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert!(body.contains("UnauthorizedException"), "{body}");
    for path in ["/v1/models", "/info"] {
        let (st, _, _) = send(app(), req("GET", path, &[])).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{path}");
    }
    // A wrong key, bearer or x-api-key; the key is not echoed.
    let (st, _, body) = send(
        app(),
        req("POST", "/generate", &[("authorization", "Bearer sekret-3")]),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert!(!body.contains("sekret"), "{body}");
    let (st, _, _) = send(app(), req("POST", "/generate", &[("x-api-key", "nope")])).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    // A right key passes the guard (then 503: no model loaded here).
    for h in [
        ("authorization", "Bearer sekret-2"),
        ("x-api-key", "sekret-1"),
    ] {
        let (st, _, _) = send(app(), req("POST", "/generate", &[h])).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{h:?}");
    }
    // Health, metrics and the document stay open.
    for path in ["/ping", "/health", "/", "/metrics", "/api-doc/openapi.json"] {
        let (st, _, _) = send(app(), req("GET", path, &[])).await;
        assert_ne!(st, StatusCode::UNAUTHORIZED, "{path}");
    }
    let (_, _, metrics) = send(app(), req("GET", "/metrics", &[])).await;
    assert!(
        metrics.contains(r#"lmi_auth_refused_total{reason="missing"} 5"#)
            && metrics.contains(r#"lmi_auth_refused_total{reason="invalid"} 2"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn protect_metrics_closes_metrics_only() {
    let s = state(&["option.api_key=k", "option.protect_metrics=true"]);
    let (st, _, _) = send(
        crate::router::router(s.clone()),
        req("GET", "/metrics", &[]),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _, _) = send(
        crate::router::router(s.clone()),
        req("GET", "/metrics", &[("x-api-key", "k")]),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _, _) = send(crate::router::router(s), req("GET", "/ping", &[])).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn cors_is_off_by_default_and_answers_preflight_when_set() {
    let preflight = || {
        req(
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("origin", "http://ui.example"),
                ("access-control-request-method", "POST"),
                (
                    "access-control-request-headers",
                    "authorization,content-type",
                ),
            ],
        )
    };
    let (_, h, _) = send(crate::router::router(state(&[])), preflight()).await;
    assert!(h.get("access-control-allow-origin").is_none());
    // With a key set too: the preflight carries no key and must still pass.
    let s = state(&[
        "option.cors_allow_origin=http://ui.example",
        "option.api_key=k",
    ]);
    let (st, h, _) = send(crate::router::router(s.clone()), preflight()).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(h["access-control-allow-origin"], "http://ui.example");
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    assert!(allowed.contains("authorization"), "{allowed}");
    let (_, h, _) = send(
        crate::router::router(s),
        req("GET", "/ping", &[("origin", "http://other.example")]),
    )
    .await;
    assert!(h.get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn uri_and_header_limits_are_clean_4xx() {
    let s = state(&["option.max_uri_bytes=64", "option.max_header_bytes=200"]);
    let long = format!("/generate?x={}", "a".repeat(100));
    let (st, _, body) = send(crate::router::router(s.clone()), req("POST", &long, &[])).await;
    assert_eq!(st, StatusCode::URI_TOO_LONG);
    assert!(body.contains("option.max_uri_bytes"), "{body}");
    let big = "b".repeat(300);
    let (st, _, _) = send(
        crate::router::router(s),
        req("POST", "/generate", &[("x-big", &big)]),
    )
    .await;
    assert_eq!(st, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
}

/// A handler that outlives the limit is dropped and answered with the schema's 408; a stream
/// that outlives it ends with the schema's in-stream error, and its producer is dropped (what
/// cancels a scheduler request).
#[tokio::test]
async fn request_timeout_ends_requests_and_streams() {
    let s = state(&["option.request_timeout=0.2"]);
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    struct Flag(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let d = dropped.clone();
    let routes: Router<Arc<AppState>> = Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .route(
            "/generate_stream",
            post(move || {
                let flag = Flag(d.clone());
                async move {
                    let s = futures_util::stream::unfold(flag, |f| async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Some((Ok::<_, std::convert::Infallible>("data: {}\n\n"), f))
                    });
                    axum::response::Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(Body::from_stream(s))
                        .unwrap()
                }
            }),
        );
    let app = super::apply(routes, &s).with_state(s.clone());
    let t = std::time::Instant::now();
    let (st, _, body) = send(app.clone(), req("POST", "/v1/chat/completions", &[])).await;
    assert_eq!(st, StatusCode::REQUEST_TIMEOUT, "{body}");
    assert!(body.contains("\"error_type\":\"timeout\""), "{body}");
    assert!(t.elapsed() < Duration::from_secs(5));
    let (st, _, body) = send(app, req("POST", "/generate_stream", &[])).await;
    assert_eq!(st, StatusCode::OK);
    assert!(body.starts_with("data: {}\n\n"), "{body}");
    assert!(body.ends_with("\"error_type\":\"timeout\"}\n\n"), "{body}");
    assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
}
