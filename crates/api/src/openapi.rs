//! The OpenAPI 3 document served at `/api-doc/openapi.json`, written by hand (no utoipa: the
//! request shapes are validated by hand too, so derived schemas would describe nothing more).

use serde_json::{Value, json};

fn body(schema: &str) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

fn resp(desc: &str, content_type: &str, schema: Value) -> Value {
    json!({"description": desc, "content": {content_type: {"schema": schema}}})
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn errors(schema: &str) -> Value {
    json!({
        "422": resp("Input validation error", "application/json", reference(schema)),
        "424": resp("Generation error", "application/json", reference(schema)),
        "429": resp("Model is overloaded", "application/json", reference(schema)),
    })
}

fn post(summary: &str, req: &str, ok: Value, err_schema: &str) -> Value {
    let mut responses = errors(err_schema);
    responses["200"] = ok;
    json!({"post": {"summary": summary, "requestBody": body(req), "responses": responses}})
}

/// The document; `version` is the server's version.
pub fn openapi(version: &str) -> Value {
    let token = json!({"type": "object", "required": ["id", "text", "logprob", "special"], "properties": {
        "id": {"type": "integer", "format": "int32", "minimum": 0},
        "text": {"type": "string"},
        "logprob": {"type": "number", "format": "float", "nullable": true},
        "special": {"type": "boolean"}}});
    let params = json!({"type": "object", "properties": {
        "do_sample": {"type": "boolean", "default": false},
        "seed": {"type": "integer", "format": "int64", "minimum": 0, "nullable": true},
        "temperature": {"type": "number", "nullable": true},
        "repetition_penalty": {"type": "number", "nullable": true},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": true},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": true},
        "top_k": {"type": "integer", "nullable": true},
        "top_p": {"type": "number", "nullable": true},
        "typical_p": {"type": "number", "nullable": true},
        "min_p": {"type": "number", "nullable": true},
        "max_new_tokens": {"type": "integer", "minimum": 1, "nullable": true},
        "min_length": {"type": "integer", "minimum": 0, "nullable": true},
        "details": {"type": "boolean", "default": false},
        "decoder_input_details": {"type": "boolean", "default": false},
        "return_full_text": {"type": "boolean", "nullable": true},
        "stop_sequences": {"type": "array", "items": {"type": "string"}, "nullable": true},
        "stop": {"type": "array", "items": {"type": "string"}, "nullable": true},
        "stop_token_ids": {"type": "array", "items": {"type": "integer"}, "nullable": true},
        "include_stop_str_in_output": {"type": "boolean", "default": false},
        "ignore_eos_token": {"type": "boolean", "default": false},
        "n": {"type": "integer", "minimum": 1, "nullable": true},
        "best_of": {"type": "integer", "minimum": 1, "nullable": true},
        "top_n_tokens": {"type": "integer", "minimum": 0, "nullable": true},
        "logprobs": {"type": "integer", "minimum": 0, "nullable": true},
        "prompt_logprobs": {"type": "integer", "minimum": 0, "nullable": true},
        "truncate": {"type": "integer", "minimum": 1, "nullable": true},
        "no_repeat_ngram_size": {"type": "integer", "minimum": 0, "nullable": true},
        "bad_words_list": {"type": "array", "items": {"type": "string"}, "nullable": true},
        "logit_bias": {"type": "object", "additionalProperties": {"type": "number"}, "nullable": true},
        "skip_special_tokens": {"type": "boolean", "default": true},
        "spaces_between_special_tokens": {"type": "boolean", "default": true},
        "adapter_id": {"type": "string", "nullable": true},
        "watermark": {"type": "boolean", "default": false}}});
    let generate_request = json!({"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"type": "string", "example": "What is Deep Learning?"},
        "parameters": reference("GenerateParameters"),
        "stream": {"type": "boolean", "default": false}}});
    let lmi_request = json!({"type": "object", "properties": {
        "inputs": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "parameters": reference("GenerateParameters"),
        "stream": {"type": "boolean", "default": false},
        "adapters": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "messages": {"type": "array", "items": reference("ChatMessage")},
        "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}}});
    let details = json!({"type": "object", "properties": {
        "finish_reason": {"type": "string", "enum": ["length", "eos_token", "stop_sequence"]},
        "generated_tokens": {"type": "integer"},
        "seed": {"type": "integer", "nullable": true},
        "prefill": {"type": "array", "items": reference("Token")},
        "tokens": {"type": "array", "items": reference("Token")},
        "top_tokens": {"type": "array", "items": {"type": "array", "items": reference("Token")}},
        "best_of_sequences": {"type": "array", "items": {"type": "object"}}}});
    let generate_response = json!({"type": "object", "required": ["generated_text"], "properties": {
        "generated_text": {"type": "string"}, "details": reference("Details")}});
    let stream_response = json!({"type": "object", "required": ["index", "token"], "properties": {
        "index": {"type": "integer"}, "token": reference("Token"),
        "top_tokens": {"type": "array", "items": reference("Token")},
        "generated_text": {"type": "string", "nullable": true},
        "details": {"type": "object", "nullable": true, "properties": {
            "finish_reason": {"type": "string"}, "generated_tokens": {"type": "integer"},
            "seed": {"type": "integer", "nullable": true}, "input_length": {"type": "integer"}}}}});
    let chat_message = json!({"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}], "nullable": true},
        "name": {"type": "string"}, "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"}}});
    let chat_request = json!({"type": "object", "required": ["messages"], "properties": {
        "model": {"type": "string"}, "messages": {"type": "array", "items": reference("ChatMessage")},
        "max_tokens": {"type": "integer", "minimum": 1}, "max_completion_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2}, "top_p": {"type": "number"},
        "n": {"type": "integer", "minimum": 1}, "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "seed": {"type": "integer"}, "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "logit_bias": {"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
        "ignore_eos": {"type": "boolean"}, "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {}}});
    let completion_request = json!({"type": "object", "required": ["prompt"], "properties": {
        "model": {"type": "string"},
        "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "max_tokens": {"type": "integer", "minimum": 1, "default": 16}, "echo": {"type": "boolean"},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 5}, "temperature": {"type": "number"},
        "top_p": {"type": "number"}, "n": {"type": "integer"}, "best_of": {"type": "integer"},
        "stream": {"type": "boolean"}, "stop": {}, "seed": {"type": "integer"}}});
    let tgi_error = json!({"type": "object", "required": ["error", "error_type"], "properties": {
        "error": {"type": "string"}, "error_type": {"type": "string"}}});
    let lmi_error = json!({"type": "object", "required": ["error", "code"], "properties": {
        "error": {"type": "string"}, "code": {"type": "integer", "example": 424}}});
    let sse = |schema: &str| {
        resp(
            "Server-sent events, one `data: {json}` per token",
            "text/event-stream",
            reference(schema),
        )
    };
    let json_ok = |schema: Value| resp("OK", "application/json", schema);

    let mut paths = serde_json::Map::new();
    paths.insert(
        "/invocations".into(),
        post(
            "LMI generate / chat / completion (dispatch on inputs, messages, prompt)",
            "LmiRequest",
            json_ok(json!({"type": "object"})),
            "LmiError",
        ),
    );
    paths.insert(
        "/".into(),
        post(
            "TGI compat generate (array answer, or SSE with stream)",
            "GenerateRequest",
            json_ok(json!({"type": "array", "items": reference("GenerateResponse")})),
            "ErrorResponse",
        ),
    );
    paths.insert(
        "/generate".into(),
        post(
            "TGI generate",
            "GenerateRequest",
            json_ok(reference("GenerateResponse")),
            "ErrorResponse",
        ),
    );
    paths.insert(
        "/generate_stream".into(),
        post(
            "TGI generate, streamed",
            "GenerateRequest",
            sse("StreamResponse"),
            "ErrorResponse",
        ),
    );
    paths.insert("/tokenize".into(), post("TGI tokenize", "GenerateRequest", json_ok(json!({"type": "array", "items": {"type": "object",
        "properties": {"id": {"type": "integer"}, "text": {"type": "string"}, "start": {"type": "integer"}, "stop": {"type": "integer"}}}})), "ErrorResponse"));
    paths.insert(
        "/v1/chat/completions".into(),
        post(
            "OpenAI chat completions",
            "ChatRequest",
            json_ok(json!({"type": "object"})),
            "ErrorResponse",
        ),
    );
    paths.insert(
        "/v1/completions".into(),
        post(
            "OpenAI completions",
            "CompletionRequest",
            json_ok(json!({"type": "object"})),
            "ErrorResponse",
        ),
    );
    paths.insert("/v1/models".into(), json!({"get": {"summary": "List models", "responses": {"200": json_ok(json!({"type": "object"}))}}}));
    paths.insert("/info".into(), json!({"get": {"summary": "Model and router info", "responses": {"200": json_ok(json!({"type": "object"}))}}}));
    for health in ["/ping", "/health"] {
        paths.insert(health.into(), json!({"get": {"summary": "Health check", "responses": {"200": {"description": "healthy"}, "503": {"description": "unhealthy"}}}}));
    }
    json!({
        "openapi": "3.0.3",
        "info": {"title": "lmi", "description": "LLM inference server speaking the AWS LMI, HuggingFace TGI and OpenAI schemas",
                 "license": {"name": "Apache-2.0"}, "version": version},
        "paths": paths,
        "components": {"schemas": {
            "Token": token, "GenerateParameters": params, "GenerateRequest": generate_request,
            "LmiRequest": lmi_request, "Details": details, "GenerateResponse": generate_response,
            "StreamResponse": stream_response, "ChatMessage": chat_message, "ChatRequest": chat_request,
            "CompletionRequest": completion_request, "ErrorResponse": tgi_error, "LmiError": lmi_error}}
    })
}
