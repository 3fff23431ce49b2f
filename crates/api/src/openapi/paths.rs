//! `paths`: every route of `lmi serve` with its request body, success shapes and every status
//! code it can answer, each with its error body.

use serde_json::{Map, Value, json};

use super::reference as r;

const JSON: &str = "application/json";

fn content(media: &str, schema: Value) -> Value {
    json!({media: {"schema": schema}})
}

fn response(desc: &str, media: &str, schema: Value) -> Value {
    json!({"description": desc, "content": content(media, schema)})
}

/// A server-sent event stream: each event's `data` is `[DONE]` or JSON matching one of
/// `events` (schemathesis validates each event with `contentSchema`).
fn sse(events: &[&str]) -> Value {
    let payloads: Vec<Value> = events.iter().map(|e| r(e)).collect();
    json!({"schema": {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string"},
    "id": {"type": "string"},
    "data": {"anyOf": [
        {"type": "string", "enum": ["[DONE]"]},
        {"type": "string", "contentMediaType": JSON, "contentSchema": {"anyOf": payloads}}
    ]}}}})
}

/// A JSON-lines stream: each line is JSON matching `event`.
fn jsonlines(event: &str) -> Value {
    json!({"schema": {"type": "string", "description": format!("JSON lines, each a {event}")},
        "x-stream-event": r(event)})
}

/// Statuses every guarded route may answer, besides its own: a missing or wrong API key (401),
/// the time limit (408), a body over max_request_size (413, plain text from the body limit), a
/// request target or headers over their limits (414, 431).
fn guarded(error: &str, responses: &mut Map<String, Value>) {
    let e = || response("", JSON, r(error));
    let with = |desc: &str| {
        let mut v = e();
        v["description"] = json!(desc);
        v
    };
    responses.insert(
        "401".into(),
        with("API key missing or wrong (option.api_key)"),
    );
    responses.insert("408".into(), with("Over option.request_timeout"));
    responses.insert(
        "413".into(),
        response(
            "Body over max_request_size",
            "text/plain",
            json!({"type": "string"}),
        ),
    );
    responses.insert(
        "414".into(),
        with("Request target over option.max_uri_bytes"),
    );
    responses.insert("431".into(), with("Headers over option.max_header_bytes"));
}

fn body(schema: &str) -> Value {
    json!({"required": true, "content": content(JSON, r(schema))})
}

/// TGI's and the OpenAI routes' statuses (TGI's mapping): 400 JSON, 422 validation, 424
/// generation, 429 overloaded, 503 loading or queue full.
fn tgi_errors(responses: &mut Map<String, Value>) {
    for (code, desc) in [
        ("400", "The body is not JSON"),
        ("422", "Input validation error"),
        ("424", "Generation error"),
        ("429", "Model is overloaded (max_concurrent_requests)"),
        ("503", "Model not loaded yet, or the scheduler stopped"),
    ] {
        responses.insert(code.into(), response(desc, JSON, r("ErrorResponse")));
    }
    guarded("ErrorResponse", responses);
}

fn op(tag: &str, summary: &str, req: Option<&str>, responses: Map<String, Value>) -> Value {
    let mut o = json!({"tags": [tag], "summary": summary, "responses": responses,
        "security": [{}, {"bearer": []}, {"apiKey": []}]});
    if let Some(b) = req {
        o["requestBody"] = body(b);
    }
    o
}

fn ok(desc: &str, json_schema: Value, streams: &[(&str, Value)]) -> Map<String, Value> {
    let mut c = Map::new();
    c.insert(JSON.into(), json!({"schema": json_schema}));
    for (media, stream) in streams {
        c.insert((*media).into(), stream.clone());
    }
    let mut m = Map::new();
    m.insert("200".into(), json!({"description": desc, "content": c}));
    m
}

fn tgi_route(summary: &str, req: &str, ok_schema: Value, streams: &[(&str, Value)]) -> Value {
    let mut responses = ok("Generated output", ok_schema, streams);
    tgi_errors(&mut responses);
    json!({"post": op("TGI", summary, Some(req), responses)})
}

fn openai_route(summary: &str, req: &str, ok_schema: &str, event: &str) -> Value {
    let mut responses = ok(
        "The completion; with `stream: true` server-sent events (each a chunk, then `data: [DONE]`)",
        r(ok_schema),
        &[("text/event-stream", sse(&[event, "OpenAiStreamError"]))],
    );
    tgi_errors(&mut responses);
    json!({"post": op("OpenAI", summary, Some(req), responses)})
}

/// The statuses of the Responses and Messages routes, each with that API's error body: 400 for
/// any bad request, 424 generation, 429 overloaded, 503 loading or queue full.
fn agent_errors(error: &str, responses: &mut Map<String, Value>) {
    for (code, desc) in [
        (
            "400",
            "Bad request: the body is not JSON, or a field is wrong",
        ),
        ("424", "Generation error"),
        ("429", "Model is overloaded (max_concurrent_requests)"),
        ("503", "Model not loaded yet, or the scheduler stopped"),
    ] {
        responses.insert(code.into(), response(desc, JSON, r(error)));
    }
    guarded(error, responses);
}

/// `/v1/responses`, `/v1/responses/{id}`, `/v1/messages`, `/v1/messages/count_tokens`.
fn agent_routes(p: &mut Map<String, Value>) {
    let mut create = ok(
        "The response; with `stream: true` server-sent events named after their `type`",
        r("Response"),
        &[(
            "text/event-stream",
            sse(&["ResponsesStreamEvent", "ResponsesStreamError"]),
        )],
    );
    agent_errors("ResponsesError", &mut create);
    create.insert(
        "404".into(),
        response(
            "`previous_response_id` is not in the store",
            JSON,
            r("ResponsesError"),
        ),
    );
    p.insert(
        "/v1/responses".into(),
        json!({"post": op("OpenAI Responses", "Create a response", Some("ResponsesRequest"), create)}),
    );
    let by_id = |ok_schema: &str, summary: &str| {
        let mut responses = Map::new();
        responses.insert("200".into(), response("OK", JSON, r(ok_schema)));
        responses.insert(
            "404".into(),
            response("No stored response of that id", JSON, r("ResponsesError")),
        );
        guarded("ResponsesError", &mut responses);
        let mut o = op("OpenAI Responses", summary, None, responses);
        o["parameters"] =
            json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
        o
    };
    p.insert(
        "/v1/responses/{id}".into(),
        json!({"get": by_id("Response", "A stored response"),
               "delete": by_id("ResponseDeleted", "Delete a stored response")}),
    );
    let mut messages = ok(
        "The message; with `stream: true` Anthropic's server-sent events",
        r("Message"),
        &[(
            "text/event-stream",
            sse(&["MessagesStreamEvent", "AnthropicError"]),
        )],
    );
    agent_errors("AnthropicError", &mut messages);
    p.insert(
        "/v1/messages".into(),
        json!({"post": op("Anthropic", "Anthropic Messages API", Some("MessagesRequest"), messages)}),
    );
    let mut count = ok(
        "The prompt's tokens (chat template and tools included)",
        r("TokenCount"),
        &[],
    );
    agent_errors("AnthropicError", &mut count);
    p.insert(
        "/v1/messages/count_tokens".into(),
        json!({"post": op("Anthropic", "Count a Messages request's input tokens", Some("CountTokensRequest"), count)}),
    );
}

fn lmi_route(summary: &str, path_param: bool) -> Value {
    let mut responses = ok(
        "`json` formatter (or a dynamic batch list, or an OpenAI body for `messages` / `prompt`); \
         streams are `jsonlines` or `sse` lines of LmiStreamLine (TGI's StreamResponse under \
         tgi_compat, ChatCompletionChunk for `messages`)",
        json!({"anyOf": [r("LmiResponse"), r("DynamicBatchResponse"), r("LmiCompatResponses"),
                         r("ChatCompletion"), r("TextCompletion"), r("EmbedResponse"),
                         r("LmiScores")]}),
        &[
            ("application/jsonlines", jsonlines("LmiStreamLine")),
            (
                "text/event-stream",
                sse(&[
                    "LmiStreamLine",
                    "StreamResponse",
                    "ChatCompletionChunk",
                    "TextCompletion",
                    "OpenAiStreamError",
                ]),
            ),
        ],
    );
    for (code, desc) in [
        (
            "424",
            "LMI's answer to a request or generation failure (invalid JSON, validation, generation)",
        ),
        (
            "503",
            "Model not loaded yet, queue full, or the scheduler stopped",
        ),
    ] {
        responses.insert(code.into(), response(desc, JSON, r("LmiError")));
    }
    if path_param {
        responses.insert(
            "404".into(),
            response("No model of that name", JSON, r("LmiError")),
        );
    }
    guarded("LmiError", &mut responses);
    // On an embedding model `{"inputs"}` answers vectors; on a reranker the pair forms answer
    // scores; a body for another task is a 400 naming the routes; too many inputs a 413.
    responses.insert(
        "400".into(),
        response(
            "A body for a task this model does not serve, or an empty input",
            JSON,
            r("LmiError"),
        ),
    );
    let mut o = op("LMI", summary, Some("LmiRequest"), responses);
    o["requestBody"]["content"][JSON]["schema"] =
        json!({"anyOf": [r("LmiRequest"), r("LmiScoreRequest")]});
    o["responses"]["413"]["content"][JSON] = json!({"schema": r("LmiError")});
    let mut params = vec![json!({"name": "adapter", "in": "query", "required": false,
        "schema": {"type": "string"}, "description": "LoRA adapter (overrides the body)"})];
    if path_param {
        params.insert(
            0,
            json!({"name": "model_name", "in": "path", "required": true, "schema": {"type": "string"}}),
        );
    }
    o["parameters"] = json!(params);
    json!({"post": o})
}

fn get(tag: &str, summary: &str, ok_resp: Value, extra: &[(&str, Value)], guard: bool) -> Value {
    let mut responses = Map::new();
    responses.insert("200".into(), ok_resp);
    for (code, v) in extra {
        responses.insert((*code).into(), v.clone());
    }
    if guard {
        guarded("ErrorResponse", &mut responses);
    }
    json!({"get": op(tag, summary, None, responses)})
}

fn adapter_ops(with_model: bool) -> Vec<(String, Value)> {
    let prefix = if with_model {
        "/models/{model_name}"
    } else {
        ""
    };
    let mut path_params = Vec::new();
    if with_model {
        path_params.push(json!({"name": "model_name", "in": "path", "required": true, "schema": {"type": "string"}}));
    }
    let name =
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
    let q = |n: &str, required: bool, schema: Value| json!({"name": n, "in": "query", "required": required, "schema": schema});
    let flag = json!({"type": "string", "enum": ["true", "false"]});
    let errors = |responses: &mut Map<String, Value>| {
        for (code, desc) in [
            ("400", "Bad parameters, or adapters not enabled"),
            ("404", "No such model or adapter"),
            ("409", "An adapter of that name exists"),
            ("424", "The adapter failed to load"),
            ("503", "Model not loaded yet"),
            ("507", "No free LoRA slot to pin into"),
        ] {
            responses.insert(code.into(), response(desc, JSON, r("ManagementError")));
        }
        guarded("ManagementError", responses);
    };
    let with = |ok_schema: &str, extra_params: Vec<Value>, summary: &str| {
        let mut responses = Map::new();
        responses.insert("200".into(), response("OK", JSON, r(ok_schema)));
        errors(&mut responses);
        let mut o = op("LMI adapters", summary, None, responses);
        let mut params = path_params.clone();
        params.extend(extra_params);
        o["parameters"] = json!(params);
        o
    };
    vec![
        (
            format!("{prefix}/adapters"),
            json!({
                "post": with("AdapterStatus", vec![
                    q("name", true, json!({"type": "string"})),
                    q("src", true, json!({"type": "string"})),
                    q("preload", false, flag.clone()),
                    q("pin", false, flag.clone()),
                ], "Register a LoRA adapter (a PEFT directory inside the model directory or option.adapter_dirs)"),
                "get": with("AdapterList", vec![], "List adapters"),
            }),
        ),
        (
            format!("{prefix}/adapters/{{name}}"),
            json!({
                "get": with("Adapter", vec![name.clone()], "Describe an adapter"),
                "delete": with("AdapterStatus", vec![name.clone()], "Unregister an adapter"),
            }),
        ),
        (
            format!("{prefix}/adapters/{{name}}/update"),
            json!({"post": with("AdapterStatus", vec![name, q("pin", false, flag.clone()), q("preload", false, flag)],
                "Pin or preload an adapter")}),
        ),
    ]
}

pub fn paths() -> Map<String, Value> {
    let mut p = Map::new();
    let unhealthy = response("Model not loaded yet", JSON, r("ErrorResponse"));
    p.insert(
        "/invocations".into(),
        lmi_route("LMI / SageMaker inference", false),
    );
    p.insert(
        "/predictions/{model_name}".into(),
        lmi_route("LMI inference on the named model", true),
    );
    let mut root = tgi_route(
        "TGI compat generate: a one-element array, or events with `stream: true`",
        "GenerateRequest",
        r("GenerateResponses"),
        &[(
            "text/event-stream",
            sse(&["StreamResponse", "ErrorResponse"]),
        )],
    );
    // On an embedding or scoring model TEI's POST / is the model's own route (/embed, /rerank
    // or /predict, whose bodies are documented there).
    root["post"]["description"] = json!(
        "On an embedding model the body and answer are /embed's; on a reranker /rerank's (a \
         `query`) or /predict's"
    );
    root["post"]["responses"]["200"]["content"][JSON]["schema"] = json!({"anyOf": [
        r("GenerateResponses"), r("EmbedResponse"), r("TeiRerankResponse"), r("PredictResponse")]});
    root["post"]["responses"]["413"]["content"][JSON] = json!({"schema": r("ErrorResponse")});
    root["get"] = get(
        "TGI",
        "Health check (TGI)",
        json!({"description": "Healthy (empty body)"}),
        &[("503", unhealthy.clone())],
        false,
    )["get"]
        .clone();
    p.insert("/".into(), root);
    p.insert(
        "/generate".into(),
        tgi_route(
            "TGI generate",
            "GenerateRequest",
            r("GenerateResponse"),
            &[],
        ),
    );
    let mut gs = tgi_route("TGI generate, streamed", "GenerateRequest", json!({}), &[]);
    gs["post"]["responses"]["200"] = json!({"description": "Server-sent events",
        "content": {"text/event-stream": sse(&["StreamResponse", "ErrorResponse"])}});
    p.insert("/generate_stream".into(), gs);
    p.insert(
        "/tokenize".into(),
        tgi_route(
            "TGI tokenize",
            "TokenizeRequest",
            r("TokenizeResponse"),
            &[],
        ),
    );
    p.insert(
        "/v1/chat/completions".into(),
        openai_route(
            "OpenAI chat completions",
            "ChatRequest",
            "ChatCompletion",
            "ChatCompletionChunk",
        ),
    );
    p.insert(
        "/v1/completions".into(),
        openai_route(
            "OpenAI completions",
            "CompletionRequest",
            "TextCompletion",
            "TextCompletion",
        ),
    );
    p.insert(
        "/v1/models".into(),
        get(
            "OpenAI",
            "The model and its LoRA adapters",
            response("Model list", JSON, r("ModelList")),
            &[],
            true,
        ),
    );
    p.insert(
        "/info".into(),
        get(
            "TGI",
            "Model and router limits (TGI Info)",
            response("Info", JSON, r("Info")),
            &[("503", unhealthy.clone())],
            true,
        ),
    );
    p.insert(
        "/ping".into(),
        get(
            "LMI",
            "Health check (LMI / SageMaker)",
            response("Healthy", JSON, r("Ping")),
            &[("503", response("Loading", JSON, r("Ping")))],
            false,
        ),
    );
    p.insert(
        "/health".into(),
        get(
            "TGI",
            "Health check (TGI)",
            json!({"description": "Healthy (empty body)"}),
            &[("503", unhealthy)],
            false,
        ),
    );
    p.insert(
        "/metrics".into(),
        get(
            "Operations",
            "Prometheus metrics (text exposition format); needs a key with option.protect_metrics",
            response("Metrics", "text/plain", json!({"type": "string"})),
            &[(
                "401",
                response("API key missing or wrong", JSON, r("ErrorResponse")),
            )],
            false,
        ),
    );
    p.insert(
        "/api-doc/openapi.json".into(),
        get(
            "Operations",
            "This document",
            response("OpenAPI 3.0 document", JSON, json!({"type": "object"})),
            &[],
            false,
        ),
    );
    p.insert(
        "/chat".into(),
        get(
            "Operations",
            "A chat page for people (streams /v1/chat/completions)",
            response("The page", "text/html", json!({"type": "string"})),
            &[],
            false,
        ),
    );
    agent_routes(&mut p);
    super::pooling::paths(&mut p);
    for with_model in [true, false] {
        for (path, item) in adapter_ops(with_model) {
            p.insert(path, item);
        }
    }
    p
}
