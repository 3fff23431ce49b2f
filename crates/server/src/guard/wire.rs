//! Which wire schema a path answers in, for errors raised before (or around) its handler.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use lmi_api::{ApiError, Schema};

/// The error shape of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A generation schema: the error is that schema's body.
    Api(Schema),
    /// LMI's management API (adapters): DJL's `{"code", "type", "message"}`.
    Management,
}

pub fn shape_of(path: &str) -> Shape {
    if path == "/invocations" || path.starts_with("/predictions/") {
        Shape::Api(Schema::Lmi)
    } else if path == "/v1/responses" || path.starts_with("/v1/responses/") {
        Shape::Api(Schema::Responses)
    } else if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Shape::Api(Schema::Anthropic)
    } else if matches!(
        path,
        "/v1/embeddings" | "/v1/rerank" | "/v2/rerank" | "/score" | "/v1/score"
    ) {
        // The embedding and scoring routes in OpenAI's, vLLM's and Cohere's shape.
        Shape::Api(Schema::Responses)
    } else if path.starts_with("/v1/") {
        Shape::Api(Schema::OpenAi)
    } else if path.starts_with("/models/") || path == "/adapters" || path.starts_with("/adapters/")
    {
        Shape::Management
    } else {
        // TGI routes, /info, /metrics and anything unknown.
        Shape::Api(Schema::Tgi)
    }
}

/// `e` rendered for the route at `path`.
pub fn error_response(path: &str, e: &ApiError) -> Response {
    let (status, body) = match shape_of(path) {
        Shape::Api(schema) => (e.status(schema), e.body(schema)),
        Shape::Management => {
            let status = e.status(Schema::Tgi);
            let kind = match status {
                401 => "UnauthorizedException",
                408 => "TimeoutException",
                _ => "BadRequestException",
            };
            (
                status,
                lmi_api::lmi_server_error_body(status, kind, &e.message),
            )
        }
    };
    json_response(status, body, StatusCode::BAD_REQUEST)
}

/// A JSON `body` with status `code` (`fallback` if `code` is not a status).
pub fn json_response(code: u16, body: String, fallback: StatusCode) -> Response {
    let mut r = Response::new(axum::body::Body::from(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(fallback);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_their_schema() {
        assert_eq!(shape_of("/invocations"), Shape::Api(Schema::Lmi));
        assert_eq!(shape_of("/predictions/m"), Shape::Api(Schema::Lmi));
        assert_eq!(shape_of("/v1/chat/completions"), Shape::Api(Schema::OpenAi));
        assert_eq!(
            shape_of("/v1/responses/resp_1"),
            Shape::Api(Schema::Responses)
        );
        assert_eq!(shape_of("/v1/messages"), Shape::Api(Schema::Anthropic));
        assert_eq!(
            shape_of("/v1/messages/count_tokens"),
            Shape::Api(Schema::Anthropic)
        );
        assert_eq!(shape_of("/v1/embeddings"), Shape::Api(Schema::Responses));
        assert_eq!(shape_of("/v2/rerank"), Shape::Api(Schema::Responses));
        assert_eq!(shape_of("/score"), Shape::Api(Schema::Responses));
        assert_eq!(shape_of("/embed"), Shape::Api(Schema::Tgi));
        assert_eq!(shape_of("/generate_stream"), Shape::Api(Schema::Tgi));
        assert_eq!(shape_of("/"), Shape::Api(Schema::Tgi));
        assert_eq!(shape_of("/models/m/adapters"), Shape::Management);
        assert_eq!(shape_of("/adapters/a1"), Shape::Management);
    }
}
