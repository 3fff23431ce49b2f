//! Which model a request is for, and handing it to that model's routes.
//!
//! The name comes from the path (`/predictions/{model}`, `/models/{model}/adapters…`), from
//! SageMaker's `X-Amzn-SageMaker-Target-Model` header, or from the body's `model` (the
//! OpenAI, Anthropic and LMI bodies); TGI's routes and bodies without one go to the default
//! model. On OpenAI's chat and completions a body's `model` may also name a LoRA adapter of a
//! loaded model (as `/v1/models` lists them): the request goes to that model with the
//! adapter. A server of one model reads no body and routes everything to it, as before the
//! registry (its OpenAI routes take any `model`).

use std::sync::Arc;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use lmi_api::{ApiError, ErrorKind};
use tower::ServiceExt;

use super::{LoadError, Registry, Slot};

pub const TARGET_MODEL_HEADER: &str = "x-amzn-sagemaker-target-model";

/// How a request names its model.
enum Named {
    /// Not at all: the default model.
    None,
    /// In its path or header: it must be registered.
    Strict(String),
    /// In its body's `model`: a model, else an adapter of a loaded model.
    Body(String),
}

/// Serves one request on the model it names.
pub async fn handle(reg: Arc<Registry>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let (req, named) = if reg.is_multi() {
        match name_of(&reg, req).await {
            Ok(x) => x,
            Err(r) => return r,
        }
    } else {
        (req, Named::None)
    };
    let slot = match named {
        Named::None => match reg.default_slot() {
            Some(s) => s,
            None => return unknown(&reg, &path, None),
        },
        Named::Strict(n) => match reg.get(&n).or_else(|| reg.rescan(&n)) {
            Some(s) => s,
            None => return unknown(&reg, &path, Some(&n)),
        },
        Named::Body(n) => match reg.get(&n).or_else(|| reg.rescan(&n)) {
            Some(s) => s,
            None => match adapter_holder(&reg, &path, &n) {
                Some(s) => {
                    let req = with_adapter(req, &n).await;
                    return forward(&reg, &s, req).await;
                }
                None => return unknown(&reg, &path, Some(&n)),
            },
        },
    };
    forward(&reg, &slot, req).await
}

/// Routes whose bodies name a LoRA adapter in `adapter_id` (OpenAI's chat and completions,
/// also through /invocations): there `model` may name an adapter, as `/v1/models` lists them.
const ADAPTER_ROUTES: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/invocations"];

/// The loaded model holding an adapter named `name`, on routes that can apply it.
fn adapter_holder(reg: &Registry, path: &str, name: &str) -> Option<Arc<Slot>> {
    if !ADAPTER_ROUTES.contains(&path) {
        return None;
    }
    reg.slots().into_iter().find(|s| {
        s.phase()
            .live()
            .and_then(|l| l.state.model())
            .is_some_and(|m| m.adapters.names().iter().any(|a| a == name))
    })
}

/// The request with `adapter_id` set to `name` (unless it names one already).
async fn with_adapter(req: Request, name: &str) -> Request {
    let (parts, body) = req.into_parts();
    // The body was read into memory by `name_of`.
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut o)) => {
            o.entry("adapter_id")
                .or_insert_with(|| serde_json::Value::String(name.to_string()));
            Bytes::from(serde_json::Value::Object(o).to_string())
        }
        _ => bytes,
    };
    let mut parts = parts;
    parts.headers.remove(header::CONTENT_LENGTH);
    Request::from_parts(parts, Body::from(body))
}

/// Hands `req` to `slot`'s routes (loading it first when it is not loaded); the model counts
/// the request in flight until its response body ends.
pub async fn forward(reg: &Arc<Registry>, slot: &Arc<Slot>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let (live, token) = match reg.ready(slot).await {
        Ok(x) => x,
        Err(e) => return load_failure(&path, &e),
    };
    let res = match live.app.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, body) = res.into_parts();
    if let Some(len) = body.size_hint().exact() {
        // A whole body (not a stream): the request is done once it is read, and it keeps its
        // Content-Length.
        return match axum::body::to_bytes(body, len as usize).await {
            Ok(bytes) => {
                drop(token);
                Response::from_parts(parts, Body::from(bytes))
            }
            Err(e) => load_failure(&path, &LoadError::Busy(format!("reading the reply: {e}"))),
        };
    }
    // A stream: the token lives in its closure, dropped when the body ends or is dropped.
    let stream = body.into_data_stream().map(move |chunk| {
        let _held = &token;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Reads the name a request gives; the body is read (and put back) only for routes whose
/// bodies carry `model`.
async fn name_of(reg: &Registry, req: Request) -> Result<(Request, Named), Response> {
    let limit = reg.base.max_request_size;
    let path = req.uri().path();
    if let Some(rest) = path
        .strip_prefix("/predictions/")
        .or_else(|| path.strip_prefix("/models/"))
    {
        let name = percent_decode(rest.split('/').next().unwrap_or_default());
        return Ok((req, Named::Strict(name)));
    }
    if let Some(v) = req
        .headers()
        .get(TARGET_MODEL_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        let name = target_model_name(v);
        return Ok((req, Named::Strict(name)));
    }
    // A stored response (GET / DELETE /v1/responses/{id}) is in the store of the model that
    // made it.
    if req.method() != Method::POST
        && let Some(id) = path.strip_prefix("/v1/responses/")
    {
        let id = id.split('/').next().unwrap_or_default();
        let holder = reg.slots().into_iter().find(|s| {
            s.phase()
                .live()
                .is_some_and(|l| l.state.responses.contains(id))
        });
        let named = holder.map_or(Named::None, |s| Named::Strict(s.name.clone()));
        return Ok((req, named));
    }
    let reads_body = req.method() == Method::POST
        && (path == "/invocations"
            || path.starts_with("/v1/")
            || path.starts_with("/v2/")
            || path == "/score");
    if !reads_body {
        return Ok((req, Named::None));
    }
    let (parts, body) = req.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over max_request_size ({limit} bytes)"),
            )
                .into_response());
        }
    };
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(default)]
        model: Option<serde_json::Value>,
    }
    let named = match serde_json::from_slice::<Peek>(&bytes) {
        Ok(Peek {
            model: Some(serde_json::Value::String(m)),
        }) if !m.is_empty() => Named::Body(m),
        _ => Named::None,
    };
    Ok((Request::from_parts(parts, Body::from(bytes)), named))
}

/// SageMaker names the model by its artifact's path (`model-a.tar.gz`); the server's name
/// for it is the file name without the archive suffix.
pub fn target_model_name(v: &str) -> String {
    let base = v.rsplit('/').next().unwrap_or(v);
    base.strip_suffix(".tar.gz")
        .or_else(|| base.strip_suffix(".tgz"))
        .unwrap_or(base)
        .to_string()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or(""), 16)
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `path` answers in DJL's `{"code", "type", "message"}` (LMI's routes and the
/// management API).
fn djl_shaped(path: &str) -> bool {
    path == "/invocations" || path.starts_with("/predictions/") || path.starts_with("/models")
}

/// 404 for a name no model has, naming the models there are, in the route's error shape.
pub fn unknown(reg: &Registry, path: &str, name: Option<&str>) -> Response {
    let names = reg.names();
    let there = if names.is_empty() {
        "no model is registered: add one with POST /models".to_string()
    } else {
        format!("this server serves {}", names.join(", "))
    };
    let msg = match name {
        Some(n) => format!("Model not found: {n} ({there})"),
        None => format!("No default model ({there}): name a model"),
    };
    error(
        path,
        404,
        ErrorKind::NotFound,
        "ModelNotFoundException",
        &msg,
    )
}

/// A model that could not be made ready for a request.
pub fn load_failure(path: &str, e: &LoadError) -> Response {
    let kind = match e {
        LoadError::NotFound(_) => ErrorKind::NotFound,
        LoadError::NoRoom(_) => ErrorKind::Overloaded,
        LoadError::Busy(_) => ErrorKind::Unhealthy,
        LoadError::Conflict(_) | LoadError::BadModel(_) | LoadError::Broken(_) => {
            ErrorKind::Internal
        }
    };
    error(path, e.code(), kind, e.kind(), e.message())
}

/// An error in the shape of the route at `path`, with `code` as its status.
fn error(path: &str, code: u16, kind: ErrorKind, djl_type: &str, msg: &str) -> Response {
    let body = if djl_shaped(path) {
        lmi_api::lmi_server_error_body(code, djl_type, msg)
    } else {
        let e = ApiError::new(kind, msg);
        let shape = crate::guard::wire::shape_of(path);
        match shape {
            crate::guard::wire::Shape::Api(schema) => e.body(schema),
            crate::guard::wire::Shape::Management => {
                lmi_api::lmi_server_error_body(code, djl_type, msg)
            }
        }
    };
    crate::guard::wire::json_response(code, body, StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sagemaker_target_names_and_escapes() {
        assert_eq!(target_model_name("model-a.tar.gz"), "model-a");
        assert_eq!(target_model_name("dir/b.tgz"), "b");
        assert_eq!(target_model_name("c"), "c");
        assert_eq!(percent_decode("a%2Fb"), "a/b");
        assert_eq!(percent_decode("x%zz"), "x%zz");
    }
}
