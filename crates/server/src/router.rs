//! The router: every route (ops + generation) with the layers every route gets: request id +
//! tracing span, request body limit (413), and the guard layers (CORS, shape limits, API keys,
//! time limit: `guard/`).

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::Response;
use tower_http::limit::RequestBodyLimitLayer;
use tracing::Instrument;

use crate::app::{AppState, REQUEST_ID_HEADER, RequestId, new_request_id};

/// An incoming id is echoed when it is short printable ASCII; otherwise a new one is made.
fn incoming_id(req: &Request) -> Option<String> {
    let v = req.headers().get(&REQUEST_ID_HEADER)?.to_str().ok()?;
    let ok = !v.is_empty() && v.len() <= 200 && v.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| v.to_string())
}

async fn request_id_layer(mut req: Request, next: Next) -> Response {
    let id = incoming_id(&req).unwrap_or_else(new_request_id);
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!(
        "request",
        id = %id,
        method = %req.method(),
        path = %req.uri().path()
    );
    let started = Instant::now();
    let mut res = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::debug!(
            status = res.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "response"
        )
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    res
}

/// Every route (ops + generation) of one model with the shared layers (the server runs
/// [`front`]; the unit tests drive one model's routes through this).
#[cfg(test)]
pub fn router(state: Arc<AppState>) -> Router {
    let routes = Router::new()
        .merge(crate::routes::ops::routes())
        .merge(crate::routes::generation_routes());
    layered(routes, state)
}

/// One model's routes bound to its state, without the layers: the registry's front router
/// (which has them) hands each request to the model it names.
pub fn model_routes(state: Arc<AppState>) -> Router {
    Router::new()
        .merge(crate::routes::ops::routes())
        .merge(crate::routes::generation_routes())
        .with_state(state)
}

/// The server's router: the registry's routes (management API, and `/ping`, `/v1/models`,
/// `/metrics` for every model) and every other path handed to the model it names, with the
/// shared layers.
pub fn front(registry: Arc<crate::models::Registry>) -> Router {
    let routes: Router<Arc<AppState>> = crate::models::manage::routes(registry.clone());
    layered(routes, registry.front.clone())
}

/// `routes` in the shared layers: guard, body limit, request id.
fn layered(routes: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    let limit = state.config.max_request_size;
    crate::guard::apply(routes, &state)
        .layer(DefaultBodyLimit::max(limit))
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(middleware::from_fn(request_id_layer))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::ServerMetrics;

    /// The generation routes add `POST /` next to the ops routes' `GET /` (TGI): the method
    /// routers of one path merge.
    #[tokio::test]
    async fn post_root_merges_with_get_root() {
        use axum::body::Body;
        use axum::http::{Request, StatusCode};
        use tower::ServiceExt;

        let config = crate::config::ServingConfig::load(
            &crate::config::ServeArgs::default(),
            &crate::config::EnvVars::new(),
            None,
        )
        .unwrap();
        let state = Arc::new(AppState::new(
            Arc::new(config),
            Arc::new(ServerMetrics::new()),
            "m".into(),
            "m".into(),
        ));
        assert_eq!(state.concurrency.available_permits(), 1032);
        let gen_routes: Router<Arc<AppState>> =
            Router::new().route("/", axum::routing::post(|| async { "generated" }));
        let app = Router::new()
            .merge(crate::routes::ops::routes())
            .merge(gen_routes)
            .with_state(state);
        let call = |method: &str| {
            Request::builder()
                .method(method)
                .uri("/")
                .body(Body::empty())
                .unwrap()
        };
        let res = app.clone().oneshot(call("POST")).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let res = app.oneshot(call("GET")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE); // not loaded
    }
}
