//! `components.schemas`: request bodies, every formatter's output and every error body.

use serde_json::{Map, Value, json};

use super::reference as r;

fn strings_or_string() -> Value {
    json!({"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})
}

fn finish_reason(values: &[&str]) -> Value {
    json!({"type": "string", "enum": values})
}

pub fn schemas() -> Map<String, Value> {
    let mut s = Map::new();
    let mut add = |name: &str, v: Value| {
        s.insert(name.to_string(), v);
    };

    // ---- requests -------------------------------------------------------------------------
    add(
        "GenerateParameters",
        json!({"type": "object",
        "description": "Generation controls (TGI's names, LMI's common, vLLM and TensorRT-LLM \
            names). Unknown parameters are ignored. `max_new_tokens` defaults to 100 on the TGI \
            routes and 30 on LMI's, clamped to what `max_model_len` leaves.",
        "properties": {
        "do_sample": {"type": "boolean", "default": false},
        "seed": {"type": "integer", "format": "int64", "minimum": 0, "nullable": true},
        "temperature": {"type": "number", "minimum": 0, "nullable": true},
        "repetition_penalty": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "nullable": true},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": true},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": true},
        "top_k": {"type": "integer", "nullable": true},
        "top_p": {"type": "number", "nullable": true},
        "typical_p": {"type": "number", "nullable": true},
        "min_p": {"type": "number", "nullable": true},
        "max_new_tokens": {"type": "integer", "minimum": 1, "nullable": true, "example": 8},
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
        "output_formatter": {"type": "string", "enum": ["json", "jsonlines", "sse", "tgi_compat"]},
        "grammar": {"type": "object", "nullable": true, "required": ["type", "value"], "properties": {
            "type": {"type": "string", "enum": ["json", "json_schema", "regex"]}, "value": {}}},
        "watermark": {"type": "boolean", "default": false}}}),
    );
    add(
        "GenerateRequest",
        json!({"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"type": "string", "example": "What is Deep Learning?"},
        "parameters": r("GenerateParameters"),
        "stream": {"type": "boolean", "default": false}}}),
    );
    add(
        "TokenizeRequest",
        json!({"type": "object", "required": ["inputs"], "properties": {
        "inputs": {"type": "string", "example": "Hello world"},
        "parameters": r("GenerateParameters")}}),
    );
    add(
        "LmiRequest",
        json!({"type": "object",
        "description": "LMI: `inputs` (text: rolling batch; a list: dynamic batch, one \
            `{generated_text}` per input), or `messages` (an OpenAI chat body, answered as \
            chat.completion), or `prompt` (an OpenAI completions body).",
        "properties": {
        "inputs": strings_or_string(),
        "parameters": r("GenerateParameters"),
        "stream": {"type": "boolean", "default": false},
        "adapters": strings_or_string(),
        "messages": {"type": "array", "items": r("ChatMessage")},
        "prompt": strings_or_string()},
        "example": {"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 8}}}),
    );
    add(
        "ToolCall",
        json!({"type": "object", "required": ["function"], "properties": {
        "index": {"type": "integer"},
        "id": {"type": "string"},
        "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "arguments": {"type": "string"}}}}}),
    );
    add(
        "ContentPart",
        json!({"type": "object", "required": ["type"],
        "description": "Images and videos are read by a vision-language model (data: URLs; \
            others answer 422), and refused by a text-only model.",
        "properties": {
        "type": {"type": "string", "enum": ["text", "image_url", "video_url"]},
        "text": {"type": "string"},
        "image_url": {"type": "object", "required": ["url"], "properties": {
            "url": {"type": "string"}, "detail": {"type": "string"}}},
        "video_url": {"type": "object", "required": ["url"], "properties": {
            "url": {"type": "string"}}}}}),
    );
    add(
        "ChatMessage",
        json!({"type": "object", "required": ["role"],
        "description": "`content` is required except on an assistant message with `tool_calls`.",
        "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": r("ContentPart")}], "nullable": true},
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": r("ToolCall")},
        "tool_call_id": {"type": "string"}}}),
    );
    add(
        "ChatRequest",
        json!({"type": "object", "required": ["messages"],
        "description": "OpenAI chat completions. Without `max_tokens` the answer may run to \
            `max_model_len` (prompt included).",
        "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1, "items": r("ChatMessage")},
        "max_tokens": {"type": "integer", "minimum": 1, "nullable": true},
        "max_completion_tokens": {"type": "integer", "minimum": 1, "nullable": true},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": true},
        "top_p": {"type": "number", "nullable": true},
        "n": {"type": "integer", "minimum": 1, "maximum": 128, "nullable": true},
        "stream": {"type": "boolean", "nullable": true},
        "stream_options": {"type": "object", "nullable": true, "properties": {"include_usage": {"type": "boolean"}}},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}], "nullable": true},
        "seed": {"type": "integer", "nullable": true},
        "logprobs": {"type": "boolean", "nullable": true},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20, "nullable": true},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": true},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": true},
        "logit_bias": {"type": "object", "nullable": true, "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
        "response_format": {"type": "object", "nullable": true, "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]}}},
        "tools": {"type": "array", "nullable": true, "items": {"type": "object"}},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}], "nullable": true},
        "parallel_tool_calls": {"type": "boolean", "nullable": true},
        "chat_template_kwargs": {"type": "object", "nullable": true,
            "description": "Variables for the chat template (e.g. `enable_thinking`).",
            "properties": {"enable_thinking": {"type": "boolean"}}},
        "thinking_token_budget": {"type": "integer", "minimum": -1, "nullable": true,
            "description": "Tokens the reasoning may take (-1: no limit; 0: none)."},
        "thinking_budget_tokens": {"type": "integer", "minimum": -1, "nullable": true,
            "description": "llama.cpp's spelling of `thinking_token_budget`."},
        "reasoning_effort": {"type": "string", "enum": ["none", "minimal", "low", "medium", "high"],
            "nullable": true,
            "description": "The chat template's `reasoning_effort` variable (gpt-oss's effort)."},
        "ignore_eos": {"type": "boolean"}},
        "example": {"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 8}}),
    );
    add(
        "CompletionRequest",
        json!({"type": "object", "required": ["prompt"],
        "description": "OpenAI completions; `max_tokens` defaults to 16. `prompt` is text, texts, \
            token ids or lists of token ids. `echo` with `logprobs` lists the prompt's tokens and \
            logprobs (the first null) before the completion's; `max_tokens: 0` (only with `echo`) \
            scores the prompt without generating.",
        "properties": {
        "model": {"type": "string"},
        "prompt": {"oneOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}},
            {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1,
                "items": {"type": "integer", "minimum": 0, "maximum": 4294967295u64}}}]},
        "max_tokens": {"type": "integer", "minimum": 0, "default": 16, "nullable": true},
        "echo": {"type": "boolean", "nullable": true},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 5, "nullable": true},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": true},
        "top_p": {"type": "number", "nullable": true},
        "n": {"type": "integer", "minimum": 1, "maximum": 128, "nullable": true},
        "best_of": {"type": "integer", "minimum": 1, "maximum": 128, "nullable": true},
        "stream": {"type": "boolean", "nullable": true},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}], "nullable": true},
        "seed": {"type": "integer", "nullable": true}},
        "example": {"prompt": "The capital of France is", "max_tokens": 8}}),
    );

    // ---- TGI responses --------------------------------------------------------------------
    add(
        "Token",
        json!({"type": "object", "required": ["id", "text", "logprob", "special"], "properties": {
        "id": {"type": "integer", "minimum": 0},
        "text": {"type": "string"},
        "logprob": {"type": "number", "nullable": true},
        "special": {"type": "boolean"}}}),
    );
    add(
        "PrefillToken",
        json!({"type": "object", "required": ["id", "text", "logprob"], "properties": {
        "id": {"type": "integer", "minimum": 0},
        "text": {"type": "string"},
        "logprob": {"type": "number", "nullable": true}}}),
    );
    let tgi_finish = finish_reason(&["length", "eos_token", "stop_sequence"]);
    add(
        "BestOfSequence",
        json!({"type": "object",
        "required": ["generated_text", "finish_reason", "generated_tokens", "seed", "prefill", "tokens"],
        "properties": {
        "generated_text": {"type": "string"},
        "finish_reason": tgi_finish.clone(),
        "generated_tokens": {"type": "integer", "minimum": 0},
        "seed": {"type": "integer", "minimum": 0, "nullable": true},
        "prefill": {"type": "array", "items": r("PrefillToken")},
        "tokens": {"type": "array", "items": r("Token")},
        "top_tokens": {"type": "array", "items": {"type": "array", "items": r("Token")}}}}),
    );
    add(
        "Details",
        json!({"type": "object",
        "required": ["finish_reason", "generated_tokens", "seed", "prefill", "tokens"],
        "properties": {
        "finish_reason": tgi_finish.clone(),
        "generated_tokens": {"type": "integer", "minimum": 0},
        "seed": {"type": "integer", "minimum": 0, "nullable": true},
        "prefill": {"type": "array", "items": r("PrefillToken")},
        "tokens": {"type": "array", "items": r("Token")},
        "best_of_sequences": {"type": "array", "items": r("BestOfSequence")},
        "top_tokens": {"type": "array", "items": {"type": "array", "items": r("Token")}}}}),
    );
    add(
        "GenerateResponse",
        json!({"type": "object", "required": ["generated_text"], "properties": {
        "generated_text": {"type": "string"}, "details": r("Details")}}),
    );
    add(
        "GenerateResponses",
        json!({"type": "array", "items": r("GenerateResponse"),
        "description": "TGI's `POST /` answer: one element."}),
    );
    add(
        "StreamDetails",
        json!({"type": "object", "nullable": true,
        "required": ["finish_reason", "generated_tokens", "seed", "input_length"], "properties": {
        "finish_reason": tgi_finish,
        "generated_tokens": {"type": "integer", "minimum": 0},
        "seed": {"type": "integer", "minimum": 0, "nullable": true},
        "input_length": {"type": "integer", "minimum": 0}}}),
    );
    add(
        "StreamResponse",
        json!({"type": "object",
        "description": "One `data:` event of a TGI stream; the last carries `generated_text` and `details`.",
        "required": ["index", "token", "generated_text", "details"], "properties": {
        "index": {"type": "integer", "minimum": 1},
        "token": r("Token"),
        "top_tokens": {"type": "array", "items": r("Token")},
        "generated_text": {"type": "string", "nullable": true},
        "details": r("StreamDetails")}}),
    );
    add(
        "TokenizeResponse",
        json!({"type": "array", "items": {"type": "object",
        "required": ["id", "text", "start", "stop"], "properties": {
        "id": {"type": "integer", "minimum": 0}, "text": {"type": "string"},
        "start": {"type": "integer", "minimum": 0}, "stop": {"type": "integer", "minimum": 0}}}}),
    );
    add(
        "Info",
        json!({"type": "object",
        "required": ["model_id", "max_concurrent_requests", "max_best_of", "max_stop_sequences",
                     "max_input_tokens", "max_total_tokens", "validation_workers",
                     "max_client_batch_size", "router", "version"],
        "properties": {
        "model_id": {"type": "string"},
        "model_sha": {"type": "string", "nullable": true},
        "model_pipeline_tag": {"type": "string", "nullable": true},
        "model_dtype": {"type": "string"},
        "model_device_type": {"type": "string"},
        "max_concurrent_requests": {"type": "integer", "minimum": 0},
        "max_best_of": {"type": "integer", "minimum": 0},
        "max_stop_sequences": {"type": "integer", "minimum": 0},
        "max_input_tokens": {"type": "integer", "minimum": 0},
        "max_total_tokens": {"type": "integer", "minimum": 0},
        "max_batch_size": {"type": "integer", "minimum": 0, "nullable": true},
        "max_batch_prefill_tokens": {"type": "integer", "minimum": 0},
        "validation_workers": {"type": "integer", "minimum": 0},
        "max_client_batch_size": {"type": "integer", "minimum": 0},
        "max_top_n_tokens": {"type": "integer", "minimum": 0},
        "grammar_support": {"type": "boolean"},
        "max_grammar_bytes": {"type": "integer", "minimum": 0},
        "router": {"type": "string"},
        "version": {"type": "string"},
        "sha": {"type": "string", "nullable": true},
        "docker_label": {"type": "string", "nullable": true}}}),
    );

    // ---- LMI responses --------------------------------------------------------------------
    add(
        "LmiToken",
        json!({"type": "object", "required": ["id", "text", "log_prob"], "properties": {
        "id": {"type": "integer"},
        "text": {"type": "string"},
        "log_prob": {"type": "number", "nullable": true},
        "special_token": {"type": "boolean"},
        "error_msg": {"type": "string"}}}),
    );
    let lmi_finish = finish_reason(&["length", "eos_token", "stop_sequence", "error"]);
    add(
        "LmiBestOf",
        json!({"type": "object",
        "required": ["finish_reason", "generated_tokens", "tokens", "generated_text"], "properties": {
        "finish_reason": lmi_finish.clone(),
        "generated_tokens": {"type": "integer", "minimum": 0},
        "tokens": {"type": "array", "items": {"oneOf": [r("LmiToken"), r("Token")]}},
        "generated_text": {"type": "string"},
        "prefill": {"type": "array", "items": {}},
        "top_tokens": {"type": "array", "items": {"type": "array", "items": {}}}}}),
    );
    add(
        "LmiDetails",
        json!({"type": "object", "required": ["finish_reason", "generated_tokens", "inputs"],
        "properties": {
        "finish_reason": lmi_finish,
        "generated_tokens": {"type": "integer", "minimum": 0, "nullable": true},
        "inputs": {"type": "string", "nullable": true},
        "tokens": {"type": "array", "nullable": true, "items": {}},
        "prefill": {"type": "array", "items": {}},
        "top_tokens": {"type": "array", "items": {"type": "array", "items": {}}},
        "best_of_sequences": {"type": "array", "items": r("LmiBestOf")}}}),
    );
    add(
        "LmiResponse",
        json!({"type": "object", "required": ["generated_text"],
        "description": "LMI `json` formatter (and `tgi_compat`, which is a one-element array of it).",
        "properties": {
        "generated_text": {"type": "string"}, "details": r("LmiDetails")}}),
    );
    add(
        "LmiCompatResponses",
        json!({"type": "array", "items": r("LmiResponse"),
        "description": "LMI's `json` output under option.tgi_compat: a one-element array."}),
    );
    add(
        "LmiStreamLine",
        json!({"type": "object",
        "description": "One `jsonlines` line (or `sse` event): `{token}` per token; the last \
            also carries `generated_text` (and `details` when asked); a failure ends the \
            stream with a token whose `error_msg` says why.",
        "properties": {
        "token": r("LmiToken"),
        "generated_text": {"type": "string"},
        "details": r("LmiDetails")}}),
    );
    add(
        "DynamicBatchResponse",
        json!({"type": "array",
        "description": "LMI dynamic batch: one object per input, in order.",
        "items": {"type": "object", "required": ["generated_text"], "properties": {
            "generated_text": {"type": "string"}}}}),
    );

    // ---- OpenAI responses -----------------------------------------------------------------
    let openai_finish = json!({"type": "string", "enum": ["stop", "length", "tool_calls"]});
    add(
        "Usage",
        json!({"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens_details": {"type": "object", "properties": {
            "accepted_prediction_tokens": {"type": "integer", "minimum": 0},
            "rejected_prediction_tokens": {"type": "integer", "minimum": 0},
            "reasoning_tokens": {"type": "integer", "minimum": 0}}}}}),
    );
    add(
        "TopLogprob",
        json!({"type": "object", "required": ["token", "logprob", "bytes"], "properties": {
        "token": {"type": "string"}, "logprob": {"type": "number"},
        "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}}}),
    );
    add(
        "ChatLogprobs",
        json!({"type": "object", "nullable": true, "required": ["content"], "properties": {
        "content": {"type": "array", "items": {"type": "object",
            "required": ["token", "logprob", "bytes", "top_logprobs"], "properties": {
            "token": {"type": "string"}, "logprob": {"type": "number"},
            "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}},
            "top_logprobs": {"type": "array", "items": r("TopLogprob")}}}}}}),
    );
    let envelope = |object: &str, choice: Value, usage_nullable: bool| {
        let usage = if usage_nullable {
            json!({"allOf": [r("Usage")], "nullable": true})
        } else {
            r("Usage")
        };
        json!({"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
            "id": {"type": "string"},
            "object": {"type": "string", "enum": [object]},
            "created": {"type": "integer", "minimum": 0},
            "model": {"type": "string"},
            "system_fingerprint": {"type": "string", "nullable": true},
            "choices": {"type": "array", "items": choice},
            "usage": usage}})
    };
    add(
        "ChatCompletion",
        envelope(
            "chat.completion",
            json!({"type": "object",
        "required": ["index", "message", "logprobs", "finish_reason"], "properties": {
        "index": {"type": "integer", "minimum": 0},
        "message": {"type": "object", "required": ["role"], "properties": {
            "role": {"type": "string", "enum": ["assistant"]},
            "content": {"type": "string", "nullable": true},
            "reasoning_content": {"type": "string"},
            "tool_calls": {"type": "array", "items": r("ToolCall")}}},
        "logprobs": r("ChatLogprobs"),
        "finish_reason": openai_finish.clone()}}),
            false,
        ),
    );
    add(
        "ChatCompletionChunk",
        envelope(
            "chat.completion.chunk",
            json!({"type": "object",
        "required": ["index", "delta", "finish_reason"], "properties": {
        "index": {"type": "integer", "minimum": 0},
        "delta": {"type": "object", "properties": {
            "role": {"type": "string", "enum": ["assistant"]},
            "content": {"type": "string", "nullable": true},
            "reasoning_content": {"type": "string"},
            "tool_calls": {"type": "array", "items": r("ToolCall")}}},
        "logprobs": r("ChatLogprobs"),
        "finish_reason": {"type": "string", "enum": ["stop", "length", "tool_calls"], "nullable": true}}}),
            true,
        ),
    );
    let completion_choice = json!({"type": "object", "required": ["index", "text", "logprobs", "finish_reason"],
        "properties": {
        "index": {"type": "integer", "minimum": 0},
        "text": {"type": "string"},
        "logprobs": {"type": "object", "nullable": true, "properties": {
            "tokens": {"type": "array", "items": {"type": "string"}},
            "token_logprobs": {"type": "array", "items": {"type": "number", "nullable": true}},
            "top_logprobs": {"type": "array", "items": {"type": "object", "nullable": true,
                "additionalProperties": {"type": "number"}}},
            "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}}}},
        "finish_reason": {"type": "string", "enum": ["stop", "length"], "nullable": true}}});
    add(
        "TextCompletion",
        envelope("text_completion", completion_choice, true),
    );
    add(
        "ModelList",
        json!({"type": "object", "required": ["object", "data"], "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": {"type": "object", "required": ["id", "object", "created", "owned_by"],
            "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["model"]},
            "created": {"type": "integer", "minimum": 0}, "owned_by": {"type": "string"},
            "parent": {"type": "string"},
            "input_modalities": {"type": "array", "items": {"type": "string", "enum": ["text", "image"]},
                "description": "What the model reads: text, and image for a vision-language model."}}}}}}),
    );
    add(
        "OpenAiStreamError",
        json!({"type": "object", "required": ["error"],
        "description": "The event that ends a failed OpenAI stream (then `data: [DONE]`).",
        "properties": {"error": {"type": "object", "required": ["message", "http_status_code"], "properties": {
            "message": {"type": "string"}, "http_status_code": {"type": "integer"}}}}}),
    );

    // ---- errors and operations ------------------------------------------------------------
    add(
        "ErrorResponse",
        json!({"type": "object", "required": ["error", "error_type"],
        "description": "TGI's error body, also used by the OpenAI routes (as TGI does).",
        "properties": {"error": {"type": "string"}, "error_type": {"type": "string"}}}),
    );
    add(
        "LmiError",
        json!({"type": "object", "required": ["code"],
        "description": "LMI rolling batch `{error, code}`, dynamic batch `{code, message, error}`, \
            or DJL's server error `{code, type, message}`.",
        "properties": {
        "error": {"type": "string"}, "code": {"type": "integer"},
        "message": {"type": "string"}, "type": {"type": "string"}}}),
    );
    add(
        "ManagementError",
        json!({"type": "object", "required": ["code", "type", "message"],
        "properties": {"code": {"type": "integer"}, "type": {"type": "string"}, "message": {"type": "string"}}}),
    );
    add(
        "Ping",
        json!({"type": "object", "description": "`{\"<model>\": {\"status\": \"Healthy\" | \"PENDING\"}}`",
        "additionalProperties": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "string", "enum": ["Healthy", "PENDING"]}}}}),
    );
    add(
        "AdapterStatus",
        json!({"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}),
    );
    add(
        "Adapter",
        json!({"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "src": {"type": "string"}, "pin": {"type": "boolean"},
        "preload": {"type": "boolean"}}}),
    );
    add(
        "AdapterList",
        json!({"type": "object", "required": ["adapters"], "properties": {
        "adapters": {"type": "array", "items": r("Adapter")}}}),
    );
    super::agents::schemas(&mut s);
    super::pooling::schemas(&mut s);
    s
}
