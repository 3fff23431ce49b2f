//! Request shape limits hyper leaves wide: the request target (414) and the headers' total
//! size (431), in the route's error shape. hyper itself refuses more than 100 headers and
//! heads over its buffer size.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use lmi_api::ApiError;

use crate::app::AppState;

pub async fn layer(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let a = &s.config.access;
    let uri_len = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().len())
        .unwrap_or(0);
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    let refusal = if uri_len > a.max_uri_bytes {
        Some((
            414,
            format!(
                "the request target is {uri_len} bytes, over the limit of {} (option.max_uri_bytes): \
                 send parameters in the body",
                a.max_uri_bytes
            ),
        ))
    } else if header_bytes > a.max_header_bytes {
        Some((
            431,
            format!(
                "the headers are {header_bytes} bytes, over the limit of {} (option.max_header_bytes)",
                a.max_header_bytes
            ),
        ))
    } else {
        None
    };
    let Some((status, message)) = refusal else {
        return next.run(req).await;
    };
    let mut res = super::wire::error_response(req.uri().path(), &ApiError::invalid_body(message));
    *res.status_mut() =
        axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::BAD_REQUEST);
    res
}

/// Most prompts in one LMI list request: option.max_client_batch_size, or the dynamic batch
/// size when that is larger (a list is how a client fills one batch).
pub fn check_prompts(s: &AppState, prompts: usize) -> Result<(), ApiError> {
    let max = s.config.max_client_batch_size.max(s.config.batch_size);
    if prompts > max {
        return Err(ApiError::new(
            lmi_api::ErrorKind::BatchSizeExceeded,
            format!(
                "{prompts} inputs in one request, over the limit of {max} \
                 (option.max_client_batch_size): split them into several requests"
            ),
        )
        .with_param("inputs"));
    }
    Ok(())
}
