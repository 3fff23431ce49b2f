//! CORS for browser front ends (option.cors_allow_origin, as TGI's --cors-allow-origin): off
//! unless origins are configured; tower-http answers preflights.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method, header};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::config::AccessConfig;

pub fn layer(access: &AccessConfig) -> Option<CorsLayer> {
    let origins = &access.cors_allow_origin;
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list: Vec<HeaderValue> = origins
            .iter()
            .filter_map(|o| match HeaderValue::from_str(o) {
                Ok(v) => Some(v),
                Err(_) => {
                    tracing::warn!(
                        "option.cors_allow_origin: {o:?} is not a header value; skipped"
                    );
                    None
                }
            })
            .collect();
        AllowOrigin::list(list)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static("x-api-key"),
                HeaderName::from_static("x-request-id"),
                HeaderName::from_static("x-amzn-sagemaker-adapter-identifier"),
            ])
            .expose_headers([HeaderName::from_static("x-request-id")])
            .max_age(Duration::from_secs(3600)),
    )
}
