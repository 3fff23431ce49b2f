//! The OpenAPI 3.0 document served at `/api-doc/openapi.json`: every route, its body, each
//! success shape (every output formatter, and the payload of each streamed event), and every
//! status code with its error shape.
//!
//! Written by hand: the request bodies are read field by field (`fields.rs`, for exact error
//! messages), so derived schemas would describe structs that do not exist. What keeps it honest:
//! `tests/api/openapi.rs` renders every formatter and error body and validates it against the
//! schema named here with [`check::validate`], and CI fuzzes a running server over the whole
//! document with schemathesis (tests/clients/test_schemathesis.py), checking every response's
//! status, content type and body.

mod agents;
pub mod check;
mod paths;
mod pooling;
mod schemas;

use serde_json::{Value, json};

/// `#/components/schemas/<name>`.
pub(crate) fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// The document; `version` is the server's version.
pub fn openapi(version: &str) -> Value {
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "lmi",
            "description": "LLM inference server speaking the AWS LMI, HuggingFace TGI and OpenAI \
                schemas. Streams (`stream: true`, or LMI's `jsonlines` / `sse` formatters) are \
                `text/event-stream` (each event's `data` is JSON described by `contentSchema`, or \
                `[DONE]`) or `application/jsonlines` (each line's schema in `x-stream-event`). With API keys set \
                (`option.api_key`), every route but the health checks, `/metrics` and this \
                document needs `Authorization: Bearer <key>` or `x-api-key`.",
            "license": {"name": "Apache-2.0"},
            "version": version
        },
        "paths": paths::paths(),
        "components": {
            "schemas": schemas::schemas(),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}
            }
        }
    })
}

/// The document for a server serving `model_name`: path parameters naming the model get it
/// as their example (so clients and fuzzers can reach the route).
pub fn openapi_for_model(version: &str, model_name: &str) -> Value {
    let mut doc = openapi(version);
    if let Some(paths) = doc["paths"].as_object_mut() {
        for op in paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|m| m.values_mut())
        {
            if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
                for p in params.iter_mut().filter(|p| p["name"] == "model_name") {
                    p["schema"]["example"] = json!(model_name);
                }
            }
        }
    }
    doc
}

/// The schema `name` in `doc`'s components.
pub fn component<'a>(doc: &'a Value, name: &str) -> Option<&'a Value> {
    doc.get("components")?.get("schemas")?.get(name)
}
