//! Operational routes: LMI `/ping`, TGI `/health` (and `GET /`), TGI `/info`, OpenAI
//! `/v1/models`, Prometheus `/metrics`, and the OpenAPI document.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::app::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/ping", get(ping))
        .route("/health", get(health))
        .route("/", get(health))
        .route("/info", get(info))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .route("/api-doc/openapi.json", get(openapi))
}

/// TGI's body for "not ready".
fn unhealthy() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": "unhealthy", "error_type": "healthcheck"})),
    )
        .into_response()
}

/// LMI: `{"<model>": {"status": "Healthy"}}` (200) once loaded; `"PENDING"` with 503 while
/// the model loads.
async fn ping(State(s): State<Arc<AppState>>) -> Response {
    if s.is_ready() {
        Json(json!({ s.model_name.clone(): {"status": "Healthy"} })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ s.model_name.clone(): {"status": "PENDING"} })),
        )
            .into_response()
    }
}

/// TGI: 200 with an empty body, 503 `{"error":"unhealthy","error_type":"healthcheck"}`.
async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.is_ready() {
        StatusCode::OK.into_response()
    } else {
        unhealthy()
    }
}

/// TGI's Info object (v2.1+ fields, plus the v2.0 dtype/device/batch fields), from the api
/// crate's typed `InfoIn` filled with this server's limits.
async fn info(State(s): State<Arc<AppState>>) -> Response {
    let Some(m) = s.model() else {
        return unhealthy();
    };
    let c = &s.config;
    let mut info = lmi_api::tgi::info::InfoIn::new(
        s.model_id.clone(),
        m.max_model_len.saturating_sub(1),
        m.max_model_len,
        env!("CARGO_PKG_VERSION"),
    );
    info.model_sha = m.origin.commit.clone();
    info.model_dtype = Some(m.dtype.clone());
    info.model_device_type = Some(m.backend.to_string());
    info.max_concurrent_requests = c.max_concurrent_requests;
    info.max_best_of = c.max_best_of;
    info.max_stop_sequences = c.max_stop_sequences;
    // Requests are validated on the HTTP threads, not in a worker pool.
    info.validation_workers = 1;
    info.max_client_batch_size = c.max_client_batch_size;
    info.max_batch_size = Some(c.max_rolling_batch_size);
    info.max_batch_prefill_tokens = Some(c.max_rolling_batch_prefill_tokens);
    info.max_top_n_tokens = Some(c.max_top_n_tokens);
    info.grammar_support = Some(m.grammars.available());
    info.max_grammar_bytes = Some(lmi_api::constraint::MAX_GRAMMAR_BYTES);
    if m.vision.is_some() {
        // The Hub's tag for models that read images (TGI reports the model card's).
        info.model_pipeline_tag = Some("image-text-to-text".into());
    }
    if let Ok(p) = crate::pooling::pooler(&s) {
        // The Hub's tags for embedding and scoring models, and their requests' input limit.
        let tag = match p.task {
            lmi_checkpoint::pooling::Task::Embed => "feature-extraction",
            _ => "text-classification",
        };
        info.model_pipeline_tag = Some(tag.into());
        info.max_client_batch_size = c.pooling.max_inputs;
    }
    respond_json(lmi_api::tgi::info::info(&info))
}

fn respond_json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// OpenAI model list: the model, then each LoRA adapter (with `parent`).
async fn models(State(s): State<Arc<AppState>>) -> Response {
    let modalities: &[&str] = match s.model() {
        Some(m) if m.vision.is_some() => &["text", "image"],
        _ => &["text"],
    };
    let mut data = vec![json!({
        "id": s.model_name,
        "object": "model",
        "created": 0,
        "owned_by": s.model_id,
        "input_modalities": modalities,
    })];
    if let Some(m) = s.model() {
        for name in m.adapters.names() {
            data.push(json!({
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": s.model_id,
                "parent": s.model_name,
            }));
        }
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    prometheus_text(render_metrics(&s))
}

/// The Prometheus exposition of one model's series, brought up to date with its scheduler.
pub fn render_metrics(s: &AppState) -> String {
    if let Some(h) = s.handle() {
        s.metrics.update_from_scheduler(&h.metrics().snapshot());
    }
    // The LoRA info series is there from the start: the endpoint picker expects it.
    let (running, waiting) = s.model().map(|m| m.adapters.in_use()).unwrap_or_default();
    s.metrics
        .update_lora_info(&running, &waiting, s.config.max_loras);
    s.metrics.render()
}

pub fn prometheus_text(body: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn openapi(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(lmi_api::openapi::openapi_for_model(
        env!("CARGO_PKG_VERSION"),
        &s.model_name,
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::{Body, to_bytes};
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use crate::app::AppState;
    use crate::config::{EnvVars, ServeArgs, ServingConfig};
    use crate::metrics::ServerMetrics;
    use crate::router::router;

    fn state(limit: usize) -> Arc<AppState> {
        let cli = ServeArgs {
            payload_limit: Some(limit),
            ..Default::default()
        };
        let config = ServingConfig::load(&cli, &EnvVars::new(), None).unwrap();
        Arc::new(AppState::new(
            Arc::new(config),
            Arc::new(ServerMetrics::new()),
            "tiny".into(),
            "/models/tiny".into(),
        ))
    }

    async fn call(
        s: &Arc<AppState>,
        method: &str,
        path: &str,
        body: Vec<u8>,
        id: Option<&str>,
    ) -> (StatusCode, String, Option<String>) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        let req = req
            .header("content-length", body.len())
            .body(Body::from(body))
            .unwrap();
        let res = router(s.clone()).oneshot(req).await.unwrap();
        let status = res.status();
        let rid = res
            .headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_string());
        let body = to_bytes(res.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap(), rid)
    }

    #[tokio::test]
    async fn not_ready_answers_503_on_health_routes() {
        let s = state(2_000_000);
        let (st, body, _) = call(&s, "GET", "/ping", vec![], None).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, r#"{"tiny":{"status":"PENDING"}}"#);
        let (st, body, _) = call(&s, "GET", "/health", vec![], None).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, r#"{"error":"unhealthy","error_type":"healthcheck"}"#);
        let (st, _, _) = call(&s, "GET", "/", vec![], None).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        let (st, _, _) = call(&s, "GET", "/info", vec![], None).await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        // Metrics and the model list answer while loading.
        let (st, body, _) = call(&s, "GET", "/metrics", vec![], None).await;
        assert_eq!(st, StatusCode::OK);
        assert!(body.contains("lmi_model_ready 0"), "{body}");
        assert!(body.contains("vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}"), "{body}");
        let (st, body, _) = call(&s, "GET", "/v1/models", vec![], None).await;
        assert_eq!(st, StatusCode::OK);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["data"][0]["id"], "tiny");
    }

    #[tokio::test]
    async fn request_ids_body_limit_and_unknown_paths() {
        let s = state(1000);
        let (_, _, rid) = call(&s, "GET", "/ping", vec![], Some("abc-123")).await;
        assert_eq!(rid.as_deref(), Some("abc-123"));
        let (_, _, rid) = call(&s, "GET", "/ping", vec![], None).await;
        assert_eq!(rid.map(|r| r.len()), Some(36));
        let (st, _, rid) = call(&s, "POST", "/ping", vec![b'x'; 1001], None).await;
        assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(rid.is_some());
        let (st, body, _) = call(&s, "GET", "/nope", vec![], None).await;
        assert_eq!((st, body.as_str()), (StatusCode::NOT_FOUND, ""));
        let (st, _, _) = call(&s, "DELETE", "/ping", vec![], None).await;
        assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[test]
    fn openapi_lists_every_route() {
        let doc = lmi_api::openapi::openapi_for_model("0", "tiny");
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/ping",
            "/invocations",
            "/predictions/{model_name}",
            "/",
            "/generate",
            "/generate_stream",
            "/tokenize",
            "/health",
            "/info",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
            "/metrics",
            "/api-doc/openapi.json",
        ] {
            assert!(paths.contains_key(p), "{p}");
        }
        assert!(doc["paths"]["/"]["get"].is_object() && doc["paths"]["/"]["post"].is_object());
        assert!(doc["components"]["schemas"].is_object(), "{doc}");
    }

    /// Every (path, method) the document lists is routed.
    #[tokio::test]
    async fn every_documented_operation_is_routed() {
        let s = state(2_000_000);
        let doc = lmi_api::openapi::openapi_for_model("0", "tiny");
        for (path, item) in doc["paths"].as_object().unwrap() {
            let concrete = path.replace("{model_name}", "tiny").replace("{name}", "a1");
            for method in item.as_object().unwrap().keys() {
                let (st, body, _) =
                    call(&s, &method.to_uppercase(), &concrete, b"{}".to_vec(), None).await;
                // An unrouted path is axum's bare 404; a route's own 404 has a body.
                let unrouted = st == StatusCode::NOT_FOUND && body.is_empty();
                assert!(
                    !unrouted && st != StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path}: {st}"
                );
            }
        }
    }
}
