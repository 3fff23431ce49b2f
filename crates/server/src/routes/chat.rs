//! `GET /chat`: a small chat page for people, built into the binary (one static HTML file with
//! its script; no CDN, no build step). It streams `/v1/chat/completions`, so it works with
//! whatever the OpenAI route supports, API keys included (the page asks for the key).

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::app::AppState;

const PAGE: &str = include_str!("../../assets/chat.html");

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/chat", get(page))
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
}
