//! The registry's own routes: DJL Serving's management API and SageMaker's multi-model
//! contract on `/models`, and `/ping`, `/v1/models`, `/metrics` speaking for every model;
//! every other path is handed to the model it names (`dispatch.rs`).
//!
//! DJL: `POST /models?url=&model_name=[&synchronous=false]` (200 `{"status": "Model \"m\"
//! registered."}`, 202 when asynchronous), `GET /models?limit=&next_page_token=`,
//! `GET /models/{name}` (the workflow list DJL describes), `DELETE /models/{name}`.
//! SageMaker (`SAGEMAKER_MULTI_MODEL=true`): `POST /models` with `{"model_name", "url"}`,
//! `GET /models/{name}` as `{"modelName", "modelUrl"}`, `POST /models/{name}/invoke`.
//! Errors are DJL's `{"code", "type", "message"}`: 404 unknown, 409 already registered, 507
//! no room, 400 a model that cannot be loaded.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::dispatch;
use super::{LoadError, Phase, Registry, Slot};
use crate::app::AppState;

type Reg = State<Arc<Registry>>;
type Params = Query<HashMap<String, String>>;

pub fn routes(reg: Arc<Registry>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/ping", get(ping))
        .route("/v1/models", get(openai_models))
        .route("/info", get(info))
        .route("/metrics", get(metrics))
        .route("/models", get(list).post(register))
        .route("/models/{name}", get(describe).delete(unregister))
        .route("/models/{name}/invoke", post(invoke))
        .fallback(fallback)
        .with_state(reg)
}

async fn fallback(State(reg): Reg, req: Request) -> Response {
    dispatch::handle(reg, req).await
}

fn djl_error(e: &LoadError) -> Response {
    let status = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = lmi_api::lmi_server_error_body(e.code(), e.kind(), e.message());
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn not_found(name: &str) -> Response {
    djl_error(&LoadError::NotFound(format!("Model not found: {name}")))
}

fn bad_request(msg: impl Into<String>) -> Response {
    djl_error(&LoadError::BadModel(msg.into()))
}

/// One model and nothing more: the model's own `/ping`, `/v1/models` and `/metrics`, as a
/// server of one model always answered.
fn single(reg: &Registry) -> bool {
    !reg.is_multi() && reg.default_slot().is_some()
}

/// LMI's `/ping`: every model's status; 200 once the models loaded at start are (a model
/// registered or loaded on demand later must not make the endpoint look unhealthy).
async fn ping(State(reg): Reg, req: Request) -> Response {
    if single(&reg) {
        return dispatch::handle(reg, req).await;
    }
    let mut body = serde_json::Map::new();
    for s in reg.slots() {
        let status = match s.phase() {
            Phase::Ready(_) => "Healthy",
            Phase::Loading { .. } => "PENDING",
            Phase::Unloaded => "Unloaded",
            Phase::Failed(_) => "Failed",
            Phase::NoRoom(_) => "NoRoom",
            Phase::Draining(_) => "Unregistering",
        };
        body.insert(s.name.clone(), json!({ "status": status }));
    }
    let starting = reg.slots().iter().any(|s| {
        matches!(
            s.phase(),
            Phase::Loading {
                on_demand: false,
                ..
            }
        )
    });
    let code = if starting {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, Json(Value::Object(body))).into_response()
}

/// TGI's `/info` is the default model's; with several models it adds `models`: each
/// model's status (DJL's words: READY, PENDING, UNLOADED, FAILED, UNREGISTERING; and NO_ROOM).
async fn info(State(reg): Reg, req: Request) -> Response {
    let multi = reg.is_multi();
    let res = dispatch::handle(reg.clone(), req).await;
    if !multi || res.status() != StatusCode::OK {
        return res;
    }
    let (parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut v: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(_) => return Response::from_parts(parts, axum::body::Body::from(bytes)),
    };
    let models: serde_json::Map<String, Value> = reg
        .slots()
        .iter()
        .map(|s| (s.name.clone(), json!(s.phase().status())))
        .collect();
    v["models"] = Value::Object(models);
    let mut r = Json(v).into_response();
    *r.headers_mut() = parts.headers;
    r.headers_mut().remove(axum::http::header::CONTENT_LENGTH);
    r
}

/// OpenAI's model list: every model, loaded or loadable (`status`), then the LoRA adapters
/// of the loaded ones.
async fn openai_models(State(reg): Reg, req: Request) -> Response {
    if single(&reg) {
        return dispatch::handle(reg, req).await;
    }
    let mut data = Vec::new();
    let mut adapters = Vec::new();
    for s in reg.slots() {
        let phase = s.phase();
        let model = phase.live().and_then(|l| l.state.model());
        let modalities: &[&str] = match model {
            Some(m) if m.vision.is_some() => &["text", "image"],
            _ => &["text"],
        };
        data.push(json!({
            "id": s.name,
            "object": "model",
            "created": phase.live().map(|l| unix(l.since)).unwrap_or(0),
            "owned_by": s.url,
            "status": phase.status(),
            "input_modalities": modalities,
        }));
        if let Some(m) = model {
            for a in m.adapters.names() {
                adapters.push(json!({
                    "id": a, "object": "model", "created": 0, "owned_by": s.url, "parent": s.name,
                }));
            }
        }
    }
    data.extend(adapters);
    Json(json!({"object": "list", "data": data})).into_response()
}

fn unix(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Every loaded model's series, each with a `model` label.
async fn metrics(State(reg): Reg, req: Request) -> Response {
    if single(&reg) {
        return dispatch::handle(reg, req).await;
    }
    let parts: Vec<(String, String)> = reg
        .slots()
        .iter()
        .filter_map(|s| {
            let phase = s.phase();
            let live = phase.live()?;
            Some((
                s.name.clone(),
                crate::routes::ops::render_metrics(&live.state),
            ))
        })
        .collect();
    crate::routes::ops::prometheus_text(super::metrics_text::merge(&parts))
}

/// `GET /models?limit=&next_page_token=`: DJL's (and SageMaker's ListModels) page.
async fn list(State(reg): Reg, Query(q): Params) -> Response {
    let limit = match q.get("limit").map(|v| v.parse::<usize>()) {
        None => 100,
        Some(Ok(n)) if n > 0 => n,
        _ => return bad_request("limit must be a positive integer"),
    };
    let start = match q.get("next_page_token").map(|v| v.parse::<usize>()) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return bad_request("next_page_token must be a value a previous GET /models gave");
        }
    };
    let slots = reg.slots();
    let page: Vec<Value> = slots
        .iter()
        .skip(start)
        .take(limit)
        .map(|s| json!({"modelName": s.name, "modelUrl": s.url, "status": s.phase().status()}))
        .collect();
    let mut body = json!({ "models": page });
    if start + limit < slots.len() {
        body["nextPageToken"] = json!((start + limit).to_string());
    }
    Json(body).into_response()
}

/// `POST /models`: DJL's query (`url`, `model_name`, `synchronous`) or SageMaker's JSON body
/// (`model_name`, `url`).
async fn register(State(reg): Reg, Query(q): Params, body: Bytes) -> Response {
    let (url, name, synchronous) = if let Some(url) = q.get("url") {
        let sync = match q.get("synchronous").map(|v| v.to_ascii_lowercase()) {
            None => true,
            Some(v) if v == "true" => true,
            Some(v) if v == "false" => false,
            Some(v) => return bad_request(format!("synchronous must be true or false, got {v:?}")),
        };
        (url.clone(), q.get("model_name").cloned(), sync)
    } else {
        #[derive(serde::Deserialize)]
        struct Load {
            model_name: Option<String>,
            url: String,
        }
        match serde_json::from_slice::<Load>(&body) {
            Ok(l) => (l.url, l.model_name, true),
            Err(e) => {
                return bad_request(format!(
                    "register a model with POST /models?url=…&model_name=… or the JSON body \
                     {{\"model_name\": …, \"url\": …}}: {e}"
                ));
            }
        }
    };
    let url = url.trim().to_string();
    if url.is_empty() {
        return bad_request("url is empty: give the model's directory, Hub id or s3:// prefix");
    }
    let name = match name.filter(|n| !n.trim().is_empty()) {
        Some(n) => n.trim().to_string(),
        None => inferred_name(&reg, &url),
    };
    if name.contains('/') {
        // Names are path segments of /predictions/{name} and /models/{name}.
        return bad_request(format!(
            "model_name {name:?} has a '/': give model_name explicitly (it names /predictions/{{name}})"
        ));
    }
    match reg.register(&name, &url, synchronous).await {
        Ok(()) if synchronous => (
            StatusCode::OK,
            Json(json!({"status": format!("Model \"{name}\" registered.")})),
        )
            .into_response(),
        Ok(()) => (
            StatusCode::ACCEPTED,
            Json(json!({"status": format!("Model \"{name}\" registration scheduled.")})),
        )
            .into_response(),
        Err(e) => djl_error(&e),
    }
}

/// The name DJL infers from a url: its directory or file name.
fn inferred_name(reg: &Registry, url: &str) -> String {
    let mut c = (*reg.base).clone();
    c.model_id = Some(url.to_string());
    c.served_model_name = None;
    let name = crate::commands::serve::model_names(&c).0;
    name.rsplit('/').next().unwrap_or(&name).to_string()
}

/// `GET /models/{name}`: DJL's workflow description (SageMaker's `{"modelName",
/// "modelUrl"}` under SAGEMAKER_MULTI_MODEL).
async fn describe(State(reg): Reg, Path(name): Path<String>) -> Response {
    let Some(s) = reg.get(&name) else {
        return not_found(&name);
    };
    if reg.base.models.sagemaker_multi_model {
        return Json(json!({"modelName": s.name, "modelUrl": s.url})).into_response();
    }
    Json(json!([{ "workflowName": s.name, "models": [describe_model(&reg, &s)] }])).into_response()
}

fn describe_model(reg: &Registry, s: &Slot) -> Value {
    let phase = s.phase();
    let c = &reg.base;
    let (status, worker) = match &phase {
        Phase::Ready(_) => ("Healthy", "READY"),
        Phase::Loading { .. } => ("Unhealthy", "PENDING"),
        Phase::Draining(_) => ("Unhealthy", "UNREGISTERING"),
        Phase::Unloaded => ("Unloaded", "UNLOADED"),
        Phase::Failed(_) => ("Unhealthy", "FAILED"),
        Phase::NoRoom(_) => ("Unloaded", "NO_ROOM"),
    };
    let live = phase.live();
    let model = live.and_then(|l| l.state.model());
    let device = match c.device {
        lmi_engine::Device::Cpu => json!({"deviceType": "cpu", "deviceId": -1}),
        lmi_engine::Device::Cuda(i) => json!({"deviceType": "gpu", "deviceId": i}),
    };
    let workers: Vec<Value> = live
        .map(|l| {
            vec![json!({
                "id": 1,
                "startTime": rfc3339(l.since),
                "status": worker,
            })]
        })
        .unwrap_or_default();
    let mut m = json!({
        "modelName": s.name,
        "modelUrl": s.url,
        "batchSize": c.max_rolling_batch_size,
        "maxBatchDelayMillis": c.max_batch_delay_ms,
        "maxIdleSeconds": 60,
        "queueSize": c.job_queue_size,
        "requestInQueue": model.map(|m| m.handle.metrics().snapshot().waiting).unwrap_or(0),
        "requestInProcess": s.in_flight(),
        "status": status,
        "loadedAtStartup": s.loaded_at_startup,
        "memoryBytes": live.map(|l| l.bytes).unwrap_or(0),
        "workerGroups": [{
            "device": device,
            "minWorkers": 1,
            "maxWorkers": 1,
            "workers": workers,
        }],
    });
    if let Some(e) = phase.error() {
        m["error"] = json!(e.message());
    }
    if let Some(model) = model {
        m["kvBlocksTotal"] = json!(model.handle.limits().num_blocks);
        m["adapters"] = json!(model.adapters.names());
    }
    m
}

/// `DELETE /models/{name}`: finishes its requests, then unloads it.
async fn unregister(State(reg): Reg, Path(name): Path<String>) -> Response {
    match reg.unregister(&name).await {
        Ok(()) => Json(json!({"status": format!("Model \"{name}\" unregistered")})).into_response(),
        Err(e) => djl_error(&e),
    }
}

/// SageMaker's `POST /models/{name}/invoke`: `/invocations` on that model.
async fn invoke(State(reg): Reg, Path(name): Path<String>, mut req: Request) -> Response {
    let Some(slot) = reg.get(&name) else {
        return not_found(&name);
    };
    let uri = match req.uri().query() {
        Some(q) => format!("/invocations?{q}"),
        None => "/invocations".to_string(),
    };
    if let Ok(u) = uri.parse::<Uri>() {
        *req.uri_mut() = u;
    }
    dispatch::forward(&reg, &slot, req).await
}

/// `2023-06-08T08:14:16.999Z` (UTC), as DJL writes a worker's start time.
fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let date = lmi_text::chat::strftime(secs, "%Y-%m-%dT%H:%M:%S");
    format!("{date}.{:03}Z", d.subsec_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_are_rfc3339() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_686_212_056_999);
        assert_eq!(rfc3339(t), "2023-06-08T08:14:16.999Z");
        assert_eq!(rfc3339(std::time::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }
}
