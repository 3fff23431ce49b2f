//! The layers between the network and the routes, outermost first: CORS (preflight answered
//! here), request shape limits (URI and header bytes: 414 / 431), API keys (401), and the
//! per-request time limit (408, or the schema's in-stream error once a stream has started).
//! Each refusal is rendered in the schema of the route it was meant for ([`wire`]).

pub mod auth;
pub mod cors;
pub mod limits;
pub mod timeout;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use axum::middleware;

use crate::app::AppState;

/// Wraps `router` in the guard layers (the last `.layer` is the outermost).
pub fn apply(router: Router<Arc<AppState>>, state: &Arc<AppState>) -> Router<Arc<AppState>> {
    let mut r = router
        .layer(middleware::from_fn_with_state(
            state.clone(),
            timeout::layer,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), auth::layer))
        .layer(middleware::from_fn_with_state(state.clone(), limits::layer));
    if let Some(cors) = cors::layer(&state.config.access) {
        r = r.layer(cors);
    }
    r
}

#[cfg(test)]
mod tests;
