//! LMI's adapter management API (DJL Serving's `AdapterManagementRequestHandler`):
//! `POST /models/{model}/adapters?name=&src=[&preload=][&pin=]`, `GET /models/{model}/adapters`,
//! `GET /models/{model}/adapters/{name}`, `POST /models/{model}/adapters/{name}/update?pin=|preload=`,
//! `DELETE /models/{model}/adapters/{name}`, and the same without `/models/{model}` (one model
//! is served). Errors use DJL's generic body `{"code", "type", "message"}`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::app::{AppState, LoadedModel};
use lmi_scheduler::adapter_registry::{AdapterRegistry, Registration, RegistryError};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/models/{model}/adapters", post(register).get(list))
        .route(
            "/models/{model}/adapters/{name}",
            get(describe).delete(unregister),
        )
        .route("/models/{model}/adapters/{name}/update", post(update))
        .route("/adapters", post(register_default).get(list_default))
        .route(
            "/adapters/{name}",
            get(describe_default).delete(unregister_default),
        )
        .route("/adapters/{name}/update", post(update_default))
}

type Params = Query<HashMap<String, String>>;

/// An error answer, rendered as DJL's body `{"code", "type", "message"}`.
struct Failure {
    code: u16,
    kind: &'static str,
    message: String,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({"code": self.code, "type": self.kind, "message": self.message});
        (status, axum::Json(body)).into_response()
    }
}

fn error(code: u16, kind: &'static str, message: impl std::fmt::Display) -> Failure {
    Failure {
        code,
        kind,
        message: message.to_string(),
    }
}

fn registry_error(e: &RegistryError) -> Failure {
    let kind = match e {
        RegistryError::Disabled | RegistryError::Invalid(_) => "BadRequestException",
        RegistryError::NotFound(_) => "AdapterNotFoundException",
        RegistryError::Duplicate(_) => "ConflictException",
        RegistryError::NoFreeSlots => "OutOfMemoryException",
        RegistryError::Load(_) => "ModelException",
    };
    error(e.status(), kind, e)
}

fn ok(message: String) -> Response {
    (StatusCode::OK, axum::Json(json!({"status": message}))).into_response()
}

/// The loaded model if `model` names it (None: the single model).
fn model<'a>(s: &'a AppState, model: Option<&str>) -> Result<&'a LoadedModel, Failure> {
    if let Some(m) = model
        && m != s.model_name
    {
        return Err(error(
            404,
            "ModelNotFoundException",
            format!("Model {m} not found"),
        ));
    }
    s.model().ok_or_else(|| {
        error(
            503,
            "ServiceUnavailableException",
            "The model is still loading",
        )
    })
}

fn flag(q: &HashMap<String, String>, key: &str, default: bool) -> Result<bool, Failure> {
    match q.get(key).map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(default),
        Some(v) if v == "true" => Ok(true),
        Some(v) if v == "false" => Ok(false),
        Some(v) => Err(error(
            400,
            "BadRequestException",
            format!("{key} must be true or false, got {v:?}"),
        )),
    }
}

fn required<'a>(q: &'a HashMap<String, String>, key: &str) -> Result<&'a str, Failure> {
    q.get(key)
        .map(String::as_str)
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| {
            error(
                400,
                "BadRequestException",
                format!("Parameter {key} is required."),
            )
        })
}

/// Runs blocking registry work off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RegistryError> + Send + 'static,
) -> Result<T, Failure> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| registry_error(&e)),
        Err(e) => Err(error(500, "InternalServerException", e)),
    }
}

/// Pins `name` in the engine; on refusal the error to answer with.
async fn pin(m: &LoadedModel, registry: &Arc<AdapterRegistry>, name: &str) -> Result<(), Failure> {
    let (reg, n) = (registry.clone(), name.to_string());
    let adapter = blocking(move || reg.preload(&n)).await?;
    match m.handle.pin_adapter(adapter).await {
        Ok(()) => {
            registry.set_pinned(name);
            Ok(())
        }
        Err(msg) if msg.contains("No free lora slots") => {
            Err(registry_error(&RegistryError::NoFreeSlots))
        }
        Err(msg) => Err(registry_error(&RegistryError::Load(msg))),
    }
}

/// `src` named on the Hub (`org/name[@revision]`) or in S3 (`s3://bucket/prefix/`), fetched
/// into the cache (with the server's HF_TOKEN / AWS credentials); None for a path.
async fn fetched(s: &AppState, spec: &str) -> Result<Option<PathBuf>, Failure> {
    match lmi_store::ModelSource::parse(Some(spec), None) {
        Ok(lmi_store::ModelSource::Hub(_) | lmi_store::ModelSource::S3(_)) => {}
        _ => return Ok(None),
    }
    let fetch = s.config.fetch.without_revision();
    let spec = spec.to_string();
    match tokio::task::spawn_blocking(move || lmi_store::resolve_adapter(&spec, &fetch)).await {
        Ok(Ok(dir)) => Ok(Some(dir)),
        Ok(Err(e)) => Err(error(400, "BadRequestException", e)),
        Err(e) => Err(error(500, "InternalServerException", e)),
    }
}

async fn do_register(
    s: Arc<AppState>,
    model_name: Option<String>,
    q: HashMap<String, String>,
) -> Response {
    let m = match model(&s, model_name.as_deref()) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let run = async {
        let name = required(&q, "name")?.trim().to_string();
        let spec = required(&q, "src")?.trim().to_string();
        let mut how = Registration {
            preload: flag(&q, "preload", true)?,
            pin: flag(&q, "pin", false)?,
            trusted: false,
        };
        let src = match fetched(&s, &spec).await? {
            // Fetched by the server into its own cache: read as the operator's adapters are.
            Some(dir) => {
                how.trusted = true;
                dir
            }
            None => PathBuf::from(&spec),
        };
        let (reg, n) = (m.adapters.clone(), name.clone());
        let id = blocking(move || reg.register(&n, &src, how)).await?;
        if how.pin
            && let Err(r) = pin(m, &m.adapters, &name).await
        {
            // Not registered after all: leave nothing behind.
            if m.adapters.remove(&name).is_ok() {
                m.handle.retire_adapter(id);
            }
            return Err(r);
        }
        Ok(ok(format!("Adapter {name} registered")))
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

async fn do_list(s: Arc<AppState>, model_name: Option<String>) -> Response {
    match model(&s, model_name.as_deref()) {
        Ok(m) if !m.adapters.enabled() => registry_error(&RegistryError::Disabled).into_response(),
        Ok(m) => axum::Json(json!({"adapters": m.adapters.list()})).into_response(),
        Err(r) => r.into_response(),
    }
}

async fn do_describe(s: Arc<AppState>, model_name: Option<String>, name: String) -> Response {
    match model(&s, model_name.as_deref()) {
        Ok(m) => match m.adapters.get(&name) {
            Ok(item) => axum::Json(item).into_response(),
            Err(e) => registry_error(&e).into_response(),
        },
        Err(r) => r.into_response(),
    }
}

async fn do_update(
    s: Arc<AppState>,
    model_name: Option<String>,
    name: String,
    q: HashMap<String, String>,
) -> Response {
    let m = match model(&s, model_name.as_deref()) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let run = async {
        let item = m.adapters.get(&name).map_err(|e| registry_error(&e))?;
        if q.contains_key("src") {
            return Err(error(
                400,
                "BadRequestException",
                "changing src is not supported: delete the adapter and register it again",
            ));
        }
        match flag(&q, "pin", item.pin)? {
            false if item.pin => {
                return Err(error(
                    400,
                    "BadRequestException",
                    "unpinning is not supported: delete the adapter and register it again",
                ));
            }
            true if !item.pin => pin(m, &m.adapters, &name).await?,
            _ => {}
        }
        match q
            .get("preload")
            .map(|_| flag(&q, "preload", item.preload))
            .transpose()?
        {
            Some(true) => {
                let (reg, n) = (m.adapters.clone(), name.clone());
                blocking(move || reg.preload(&n).map(|_| ())).await?;
            }
            Some(false) => m
                .adapters
                .set_preload_off(&name)
                .map_err(|e| registry_error(&e))?,
            None => {}
        }
        Ok(ok(format!("Adapter {name} updated")))
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

async fn do_unregister(s: Arc<AppState>, model_name: Option<String>, name: String) -> Response {
    let m = match model(&s, model_name.as_deref()) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    match m.adapters.remove(&name) {
        Ok(id) => {
            m.handle.retire_adapter(id);
            ok(format!("Adapter {name} unregistered"))
        }
        Err(e) => registry_error(&e).into_response(),
    }
}

async fn register(
    State(s): State<Arc<AppState>>,
    Path(model): Path<String>,
    Query(q): Params,
) -> Response {
    do_register(s, Some(model), q).await
}
async fn register_default(State(s): State<Arc<AppState>>, Query(q): Params) -> Response {
    do_register(s, None, q).await
}
async fn list(State(s): State<Arc<AppState>>, Path(model): Path<String>) -> Response {
    do_list(s, Some(model)).await
}
async fn list_default(State(s): State<Arc<AppState>>) -> Response {
    do_list(s, None).await
}
async fn describe(
    State(s): State<Arc<AppState>>,
    Path((model, name)): Path<(String, String)>,
) -> Response {
    do_describe(s, Some(model), name).await
}
async fn describe_default(State(s): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    do_describe(s, None, name).await
}
async fn update(
    State(s): State<Arc<AppState>>,
    Path((model, name)): Path<(String, String)>,
    Query(q): Params,
) -> Response {
    do_update(s, Some(model), name, q).await
}
async fn update_default(
    State(s): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(q): Params,
) -> Response {
    do_update(s, None, name, q).await
}
async fn unregister(
    State(s): State<Arc<AppState>>,
    Path((model, name)): Path<(String, String)>,
) -> Response {
    do_unregister(s, Some(model), name).await
}
async fn unregister_default(State(s): State<Arc<AppState>>, Path(name): Path<String>) -> Response {
    do_unregister(s, None, name).await
}
