//! The OpenAI Responses API's and Anthropic Messages API's components: requests, response
//! objects, stream events and error bodies.

use serde_json::{Map, Value, json};

use super::reference as r;

fn object(required: &[&str], properties: Value) -> Value {
    json!({"type": "object", "required": required, "properties": properties})
}

pub fn schemas(s: &mut Map<String, Value>) {
    let mut add = |name: &str, v: Value| {
        s.insert(name.to_string(), v);
    };

    // ---- OpenAI Responses API ---------------------------------------------------------------
    add(
        "ResponsesInputItem",
        json!({"type": "object",
        "description": "A message (`role`, `content`: a string or `input_text` / `output_text` \
            parts), a `function_call` (`call_id`, `name`, `arguments`) or a \
            `function_call_output` (`call_id`, `output`). `input_image` parts (`image_url`: a \
            data: URL, or http(s) from option.allowed_media_domains) are read by a \
            vision-language model and refused (400) by a text model.",
        "properties": {
        "type": {"type": "string", "enum": ["message", "function_call", "function_call_output", "reasoning"]},
        "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "arguments": {"type": "string"},
        "output": {"type": "string"}}}),
    );
    add(
        "ResponsesRequest",
        json!({"type": "object", "required": ["input"],
        "description": "OpenAI Responses API, run as a chat completion. `store` (default true) \
            keeps the response in memory (option.responses_store, least recently used dropped) \
            for `previous_response_id` and `GET /v1/responses/{id}`. `reasoning` is accepted \
            and has no effect on models without reasoning.",
        "properties": {
        "model": {"type": "string"},
        "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": r("ResponsesInputItem")}]},
        "instructions": {"type": "string", "nullable": true},
        "max_output_tokens": {"type": "integer", "minimum": 1, "nullable": true},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": true},
        "top_p": {"type": "number", "nullable": true},
        "tools": {"type": "array", "nullable": true, "items": {"type": "object", "required": ["type", "name"],
            "properties": {"type": {"type": "string", "enum": ["function"]}, "name": {"type": "string"},
            "description": {"type": "string"}, "parameters": {"type": "object"}, "strict": {"type": "boolean"}}}},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}], "nullable": true},
        "parallel_tool_calls": {"type": "boolean", "nullable": true},
        "text": {"type": "object", "nullable": true, "properties": {"format": {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": "boolean"}}}}},
        "reasoning": {"type": "object", "nullable": true},
        "stream": {"type": "boolean", "nullable": true},
        "store": {"type": "boolean", "nullable": true},
        "previous_response_id": {"type": "string", "nullable": true},
        "metadata": {"type": "object", "nullable": true},
        "user": {"type": "string", "nullable": true}},
        "example": {"input": "Hi!", "max_output_tokens": 8}}),
    );
    add(
        "ResponsesOutputItem",
        json!({"type": "object", "required": ["type", "id", "status"], "properties": {
        "type": {"type": "string", "enum": ["message", "function_call", "reasoning"]},
        "id": {"type": "string"},
        "status": {"type": "string", "enum": ["in_progress", "completed", "incomplete"]},
        "role": {"type": "string", "enum": ["assistant"]},
        "content": {"type": "array", "items": {"anyOf": [r("ResponsesOutputText"), r("ResponsesReasoningText")]}},
        "summary": {"type": "array", "items": {}},
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "arguments": {"type": "string"}}}),
    );
    add(
        "ResponsesReasoningText",
        object(
            &["type", "text"],
            json!({
        "type": {"type": "string", "enum": ["reasoning_text"]},
        "text": {"type": "string"}}),
        ),
    );
    add(
        "ResponsesOutputText",
        object(
            &["type", "text", "annotations"],
            json!({
        "type": {"type": "string", "enum": ["output_text"]},
        "text": {"type": "string"},
        "annotations": {"type": "array", "items": {}},
        "logprobs": {"type": "array", "items": {}}}),
        ),
    );
    add(
        "Response",
        object(
            &[
                "id",
                "object",
                "created_at",
                "status",
                "model",
                "output",
                "usage",
            ],
            json!({
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response"]},
        "created_at": {"type": "integer", "minimum": 0},
        "status": {"type": "string", "enum": ["in_progress", "completed", "incomplete"]},
        "error": {"type": "object", "nullable": true},
        "incomplete_details": {"type": "object", "nullable": true, "properties": {
            "reason": {"type": "string", "enum": ["max_output_tokens"]}}},
        "instructions": {"type": "string", "nullable": true},
        "max_output_tokens": {"type": "integer", "nullable": true},
        "model": {"type": "string"},
        "output": {"type": "array", "items": r("ResponsesOutputItem")},
        "parallel_tool_calls": {"type": "boolean"},
        "previous_response_id": {"type": "string", "nullable": true},
        "store": {"type": "boolean"},
        "temperature": {"type": "number"},
        "top_p": {"type": "number"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": "object", "nullable": true,
            "required": ["input_tokens", "output_tokens", "total_tokens"], "properties": {
            "input_tokens": {"type": "integer", "minimum": 0},
            "output_tokens": {"type": "integer", "minimum": 0},
            "total_tokens": {"type": "integer", "minimum": 0}}}}),
        ),
    );
    add(
        "ResponseDeleted",
        object(
            &["id", "object", "deleted"],
            json!({
        "id": {"type": "string"},
        "object": {"type": "string", "enum": ["response.deleted"]},
        "deleted": {"type": "boolean"}}),
        ),
    );
    add(
        "ResponsesStreamEvent",
        json!({"type": "object", "required": ["type", "sequence_number"],
        "description": "`response.created`, `response.in_progress`, `response.output_item.added` / \
            `.done`, `response.content_part.added` / `.done`, `response.output_text.delta` / \
            `.done`, `response.reasoning_text.delta` / `.done` (a model with a reasoning \
            parser), `response.function_call_arguments.delta` / `.done`, then \
            `response.completed` (`response.incomplete` at max_output_tokens).",
        "properties": {
        "type": {"type": "string", "enum": ["response.created", "response.in_progress",
            "response.output_item.added", "response.output_item.done",
            "response.content_part.added", "response.content_part.done",
            "response.output_text.delta", "response.output_text.done",
            "response.reasoning_text.delta", "response.reasoning_text.done",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.completed", "response.incomplete"]},
        "sequence_number": {"type": "integer", "minimum": 0},
        "response": r("Response"),
        "output_index": {"type": "integer", "minimum": 0},
        "content_index": {"type": "integer", "minimum": 0},
        "item_id": {"type": "string"},
        "item": r("ResponsesOutputItem"),
        "part": r("ResponsesOutputText"),
        "delta": {"type": "string"},
        "text": {"type": "string"},
        "arguments": {"type": "string"}}}),
    );
    add(
        "ResponsesStreamError",
        object(
            &["type", "code", "message"],
            json!({
        "type": {"type": "string", "enum": ["error"]},
        "code": {"type": "string"},
        "message": {"type": "string"},
        "param": {"type": "string", "nullable": true},
        "sequence_number": {"type": "integer", "minimum": 0}}),
        ),
    );
    add(
        "ResponsesError",
        json!({"type": "object", "required": ["error"],
        "description": "OpenAI's error body.",
        "properties": {"error": object(&["message", "type"], json!({
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": "string", "nullable": true},
            "code": {"type": "string", "nullable": true}}))}}),
    );

    // ---- Anthropic Messages API -------------------------------------------------------------
    let message_fields = json!({
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": object(&["role", "content"], json!({
            "role": {"type": "string", "enum": ["user", "assistant"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object",
                "required": ["type"], "properties": {"type": {"type": "string",
                "enum": ["text", "tool_use", "tool_result", "thinking"]}}}}]}}))},
        "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "tools": {"type": "array", "items": object(&["name", "input_schema"], json!({
            "name": {"type": "string"}, "description": {"type": "string"},
            "input_schema": {"type": "object"}}))},
        "tool_choice": object(&["type"], json!({
            "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
            "name": {"type": "string"}, "disable_parallel_tool_use": {"type": "boolean"}})),
        "thinking": {"type": "object", "description": "`{\"type\": \"enabled\", \"budget_tokens\": N}`: a thinking budget for a model with a reasoning parser (its reasoning comes back as `thinking` blocks); `disabled`: budget 0; absent: the server's default."}
    });
    let mut messages_request = message_fields.clone();
    if let Some(m) = messages_request.as_object_mut() {
        m.insert(
            "max_tokens".into(),
            json!({"type": "integer", "minimum": 1}),
        );
        m.insert(
            "stop_sequences".into(),
            json!({"type": "array", "items": {"type": "string"}}),
        );
        m.insert(
            "temperature".into(),
            json!({"type": "number", "minimum": 0, "maximum": 1}),
        );
        m.insert("top_p".into(), json!({"type": "number"}));
        m.insert("top_k".into(), json!({"type": "integer", "minimum": 0}));
        m.insert("stream".into(), json!({"type": "boolean"}));
        m.insert("metadata".into(), json!({"type": "object"}));
    }
    add(
        "MessagesRequest",
        json!({"type": "object", "required": ["messages", "max_tokens"],
        "description": "Anthropic Messages API, run as a chat completion. A user's `image` \
            blocks (`source` of type `base64` or `url`) are read by a vision-language model and \
            refused (400) by a text model; `document` blocks are refused.",
        "properties": messages_request,
        "example": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi!"}]}}),
    );
    add(
        "CountTokensRequest",
        json!({"type": "object", "required": ["messages"], "properties": message_fields,
        "example": {"model": "m", "messages": [{"role": "user", "content": "Hi!"}]}}),
    );
    add(
        "TokenCount",
        object(
            &["input_tokens"],
            json!({"input_tokens": {"type": "integer", "minimum": 0}}),
        ),
    );
    let usage = object(
        &["input_tokens", "output_tokens"],
        json!({
        "input_tokens": {"type": "integer", "minimum": 0},
        "output_tokens": {"type": "integer", "minimum": 0},
        "cache_creation_input_tokens": {"type": "integer", "minimum": 0},
        "cache_read_input_tokens": {"type": "integer", "minimum": 0}}),
    );
    let block = object(
        &["type"],
        json!({
        "type": {"type": "string", "enum": ["text", "tool_use", "thinking"]},
        "text": {"type": "string"},
        "thinking": {"type": "string"},
        "signature": {"type": "string"},
        "id": {"type": "string"},
        "name": {"type": "string"},
        "input": {"type": "object"}}),
    );
    let stop_reason = json!({"type": "string", "nullable": true,
        "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]});
    add(
        "Message",
        object(
            &[
                "id",
                "type",
                "role",
                "model",
                "content",
                "stop_reason",
                "usage",
            ],
            json!({
        "id": {"type": "string"},
        "type": {"type": "string", "enum": ["message"]},
        "role": {"type": "string", "enum": ["assistant"]},
        "model": {"type": "string"},
        "content": {"type": "array", "items": block.clone()},
        "stop_reason": stop_reason.clone(),
        "stop_sequence": {"type": "string", "nullable": true},
        "usage": usage}),
        ),
    );
    add(
        "MessagesStreamEvent",
        json!({"type": "object", "required": ["type"],
        "description": "`message_start`, `content_block_start`, `content_block_delta` \
            (`text_delta` or `input_json_delta`), `content_block_stop`, `message_delta` \
            (`stop_reason`, output usage), `message_stop`; `error` ends a failed stream.",
        "properties": {
        "type": {"type": "string", "enum": ["message_start", "content_block_start",
            "content_block_delta", "content_block_stop", "message_delta", "message_stop", "error"]},
        "message": r("Message"),
        "index": {"type": "integer", "minimum": 0},
        "content_block": block,
        "delta": {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["text_delta", "input_json_delta", "thinking_delta"]},
            "text": {"type": "string"},
            "thinking": {"type": "string"},
            "partial_json": {"type": "string"},
            "stop_reason": stop_reason,
            "stop_sequence": {"type": "string", "nullable": true}}},
        "usage": {"type": "object", "properties": {"output_tokens": {"type": "integer", "minimum": 0}}},
        "error": object(&["type", "message"], json!({"type": {"type": "string"}, "message": {"type": "string"}}))}}),
    );
    add(
        "AnthropicError",
        json!({"type": "object", "required": ["type", "error"],
        "description": "Anthropic's error body (also the data of a failed stream's `error` event).",
        "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": object(&["type", "message"], json!({"type": {"type": "string"}, "message": {"type": "string"}}))}}),
    );
}
