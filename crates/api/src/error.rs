//! One error type for every schema. The same failure is rendered differently per wire format,
//! so an error carries a kind and a message and each schema picks its status code and body.

use serde::Serialize;

/// What went wrong, independent of the wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The body is not JSON at all.
    InvalidJson,
    /// A field has the wrong JSON type or the body has the wrong shape.
    InvalidBody,
    /// A value is out of range or inconsistent with another one.
    Validation,
    /// A feature the server does not implement (grammar, beam search, ...).
    NotSupported,
    /// OpenAI completions `suffix` (TGI has its own error_type for it).
    SuffixNotSupported,
    /// Too many prompts in one OpenAI completions request.
    BatchSizeExceeded,
    /// Chat template failed.
    Template,
    /// The engine failed while generating.
    Generation,
    /// No capacity (queue full / too many concurrent requests).
    Overloaded,
    /// The stream ended without a final event.
    IncompleteGeneration,
    /// Health check failed.
    Unhealthy,
    /// No API key, or a wrong one, on a server that requires one (401 in every schema).
    Unauthorized,
    /// The request ran past the server's time limit (option.request_timeout; 408).
    Timeout,
    /// Unknown model, adapter or route.
    NotFound,
    /// An empty input or list where the route needs text (TEI's `empty`, 400).
    EmptyInput,
    /// More inputs in one request than the server takes (413, naming the limit).
    TooManyInputs,
    /// A route this model does not serve: a generation route on an embedding or scoring
    /// model, or the reverse (400, naming the routes it serves).
    WrongTask,
    /// Anything else on the server side.
    Internal,
}

/// The wire schema an error is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// LMI rolling batch (`/invocations`, `/predictions/*`, LMI chat).
    Lmi,
    /// LMI dynamic batch (list `inputs`).
    LmiDynamicBatch,
    /// TGI routes (`/`, `/generate`, `/generate_stream`, `/tokenize`).
    Tgi,
    /// OpenAI routes (`/v1/chat/completions`, `/v1/completions`); TGI's body shape.
    OpenAi,
    /// OpenAI's own `{"error": {message, type, param, code}}`, 400 for a bad request, as the
    /// OpenAI SDK expects: the Responses API (`/v1/responses`), and the embedding and scoring
    /// routes in OpenAI's, vLLM's and Cohere's shapes (`/v1/embeddings`, `/v1/rerank`,
    /// `/v2/rerank`, `/score`).
    Responses,
    /// Anthropic's Messages API (`/v1/messages`): `{"type": "error", "error": {type, message}}`.
    Anthropic,
}

/// A request or generation error with a message that says what to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    /// Bare message, without any schema prefix ("Input validation error: " etc.).
    pub message: String,
    /// The offending field path, e.g. `parameters.temperature`, when one is known.
    pub param: Option<String>,
}

/// LMI's prefix for request parsing failures (RB `input_parser`).
pub const LMI_PARSE_PREFIX: &str =
    "Input Parsing failed. Ensure that the request payload is valid. ";

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            param: None,
        }
    }
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }
    pub fn invalid_json(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidJson, msg)
    }
    pub fn invalid_body(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidBody, msg)
    }
    pub fn validation(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Validation, msg)
    }
    pub fn not_supported(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotSupported, msg)
    }
    pub fn generation(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Generation, msg)
    }
    /// TGI's message for a full semaphore.
    pub fn overloaded() -> Self {
        Self::new(ErrorKind::Overloaded, "Model is overloaded")
    }
    pub fn incomplete() -> Self {
        Self::new(ErrorKind::IncompleteGeneration, "Incomplete generation")
    }
    pub fn unhealthy() -> Self {
        Self::new(ErrorKind::Unhealthy, "unhealthy")
    }
    /// A missing or wrong API key; the message never contains the key that was sent.
    pub fn unauthorized() -> Self {
        Self::new(
            ErrorKind::Unauthorized,
            "a valid API key is required: send `Authorization: Bearer <key>` or `x-api-key: <key>`",
        )
    }
    pub fn timeout(limit: std::time::Duration) -> Self {
        Self::new(
            ErrorKind::Timeout,
            format!(
                "the request ran past the server's time limit of {} s (option.request_timeout): \
                 lower max_new_tokens or retry",
                limit.as_secs_f64()
            ),
        )
    }
    pub fn not_found(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, msg)
    }
    pub fn empty_input(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::EmptyInput, msg)
    }
    /// `n` inputs where the server takes at most `max` (`option`: the setting that raises it).
    pub fn too_many_inputs(n: usize, max: usize, option: &str) -> Self {
        Self::new(
            ErrorKind::TooManyInputs,
            format!(
                "{n} inputs in one request, over the limit of {max} ({option}): \
                 split them into several requests"
            ),
        )
    }
    pub fn wrong_task(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::WrongTask, msg)
    }

    fn is_request_error(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::InvalidJson
                | ErrorKind::InvalidBody
                | ErrorKind::Validation
                | ErrorKind::NotSupported
                | ErrorKind::SuffixNotSupported
                | ErrorKind::BatchSizeExceeded
                | ErrorKind::Template
                | ErrorKind::EmptyInput
                | ErrorKind::TooManyInputs
                | ErrorKind::WrongTask
        )
    }

    /// HTTP status for this error under `schema`.
    /// LMI answers every request/engine failure with 424 (its Python handler's code); TGI and the
    /// OpenAI routes use TGI's mapping (422 validation, 424 generation, 429 overloaded).
    pub fn status(&self, schema: Schema) -> u16 {
        match schema {
            _ if self.kind == ErrorKind::Unauthorized => 401,
            _ if self.kind == ErrorKind::Timeout => 408,
            // Only the embedding and scoring routes raise these, with the same codes in every
            // schema (TEI's 400 `empty` and 413 batch size).
            _ if self.kind == ErrorKind::TooManyInputs => 413,
            _ if matches!(self.kind, ErrorKind::WrongTask | ErrorKind::EmptyInput) => 400,
            Schema::Lmi | Schema::LmiDynamicBatch => match self.kind {
                ErrorKind::Overloaded | ErrorKind::Unhealthy => 503,
                ErrorKind::NotFound => 404,
                ErrorKind::IncompleteGeneration | ErrorKind::Internal => 500,
                _ => 424,
            },
            Schema::Tgi | Schema::OpenAi => match self.kind {
                ErrorKind::InvalidJson => 400,
                ErrorKind::Generation => 424,
                ErrorKind::Overloaded => 429,
                ErrorKind::Unhealthy => 503,
                ErrorKind::NotFound => 404,
                ErrorKind::IncompleteGeneration | ErrorKind::Internal => 500,
                _ => 422,
            },
            Schema::Responses | Schema::Anthropic => match self.kind {
                ErrorKind::Generation => 424,
                ErrorKind::Overloaded => 429,
                ErrorKind::Unhealthy => 503,
                ErrorKind::NotFound => 404,
                ErrorKind::IncompleteGeneration | ErrorKind::Internal => 500,
                _ => 400,
            },
        }
    }

    /// TGI's `error_type` string.
    pub fn error_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidJson
            | ErrorKind::InvalidBody
            | ErrorKind::Validation
            | ErrorKind::NotSupported
            | ErrorKind::TooManyInputs
            | ErrorKind::WrongTask => "validation",
            ErrorKind::EmptyInput => "empty",
            ErrorKind::SuffixNotSupported => "suffix not supported",
            ErrorKind::BatchSizeExceeded => "batch size exceeded",
            ErrorKind::Template => "template_error",
            ErrorKind::Generation => "generation",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::IncompleteGeneration => "incomplete_generation",
            ErrorKind::Unhealthy => "healthcheck",
            ErrorKind::Unauthorized => "authentication",
            ErrorKind::Timeout => "timeout",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Internal => "internal",
        }
    }

    /// The message as TGI words it (prefix per `InferError` variant).
    pub fn tgi_message(&self) -> String {
        match self.kind {
            ErrorKind::InvalidJson => {
                format!("Failed to parse the request body as JSON: {}", self.message)
            }
            ErrorKind::InvalidBody
            | ErrorKind::Validation
            | ErrorKind::NotSupported
            | ErrorKind::EmptyInput
            | ErrorKind::TooManyInputs
            | ErrorKind::WrongTask => format!("Input validation error: {}", self.message),
            ErrorKind::Generation => format!("Request failed during generation: {}", self.message),
            _ => self.message.clone(),
        }
    }

    /// The message as LMI words it.
    pub fn lmi_message(&self) -> String {
        if self.is_request_error() {
            format!("{LMI_PARSE_PREFIX}{}", self.message)
        } else {
            self.message.clone()
        }
    }

    /// LMI error body `{"error":"...","code":424}`: Gson order (error, code), compact, no newline.
    /// Also the last raw chunk of a failed LMI stream (no `data:` even in SSE mode).
    pub fn lmi_body(&self) -> String {
        #[derive(Serialize)]
        struct Body {
            error: String,
            code: u16,
        }
        compact(&Body {
            error: self.lmi_message(),
            code: self.status(Schema::Lmi),
        })
    }

    /// LMI dynamic batch body: Gson pretty print of `{"code","message":"invoke handler failure","error"}`.
    pub fn dynamic_batch_body(&self) -> String {
        #[derive(Serialize)]
        struct Body<'a> {
            code: u16,
            message: &'a str,
            error: &'a str,
        }
        serde_json::to_string_pretty(&Body {
            code: self.status(Schema::LmiDynamicBatch),
            message: "invoke handler failure",
            error: &self.message,
        })
        .unwrap_or_default()
    }

    /// TGI body `{"error":"...","error_type":"..."}` (also used by TGI's OpenAI routes).
    pub fn tgi_body(&self) -> String {
        #[derive(Serialize)]
        struct Body<'a> {
            error: String,
            error_type: &'a str,
        }
        compact(&Body {
            error: self.tgi_message(),
            error_type: self.error_type(),
        })
    }

    /// In-stream error on TGI routes: `data: {"error","error_type"}\n\n` (HTTP status stays 200).
    pub fn tgi_stream_event(&self) -> String {
        crate::sse::data(&self.tgi_body())
    }

    /// Non-streaming error body on the OpenAI routes: TGI uses the same `{"error","error_type"}`.
    pub fn openai_body(&self) -> String {
        self.tgi_body()
    }

    /// In-stream error on the OpenAI routes, as TGI sends it: an error event then `[DONE]`.
    pub fn openai_stream_events(&self) -> String {
        #[derive(Serialize)]
        struct Inner {
            message: String,
            http_status_code: u16,
        }
        #[derive(Serialize)]
        struct Body {
            error: Inner,
        }
        let body = compact(&Body {
            error: Inner {
                message: self.tgi_message(),
                http_status_code: self.status(Schema::OpenAi),
            },
        });
        format!("{}{}", crate::sse::data(&body), crate::sse::DONE)
    }

    /// Body for `schema` (non-streaming).
    pub fn body(&self, schema: Schema) -> String {
        match schema {
            Schema::Lmi => self.lmi_body(),
            Schema::LmiDynamicBatch => self.dynamic_batch_body(),
            Schema::Tgi => self.tgi_body(),
            Schema::OpenAi => self.openai_body(),
            Schema::Responses => self.responses_body(),
            Schema::Anthropic => self.anthropic_body(),
        }
    }

    /// OpenAI's error `type` (Responses API).
    fn openai_error_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::Overloaded => "rate_limit_error",
            ErrorKind::Timeout => "timeout_error",
            ErrorKind::Generation
            | ErrorKind::IncompleteGeneration
            | ErrorKind::Unhealthy
            | ErrorKind::Internal => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The Responses API's error body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn responses_body(&self) -> String {
        #[derive(Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            error: Inner<'a>,
        }
        compact(&Body {
            error: Inner {
                message: &self.message,
                kind: self.openai_error_type(),
                param: self.param.as_deref(),
                code: (self.kind == ErrorKind::Unauthorized).then_some("invalid_api_key"),
            },
        })
    }

    /// The `error` event that ends a failed Responses stream; `sequence_number` as numbered
    /// by the stream (absent when the stream is cut from outside, by the time limit).
    pub fn responses_stream_event(&self, sequence_number: Option<u64>) -> String {
        #[derive(Serialize)]
        struct Event<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            code: &'a str,
            message: &'a str,
            param: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            sequence_number: Option<u64>,
        }
        crate::sse::event(
            "error",
            &compact(&Event {
                kind: "error",
                code: self.openai_error_type(),
                message: &self.message,
                param: self.param.as_deref(),
                sequence_number,
            }),
        )
    }

    /// Anthropic's error `type`.
    fn anthropic_error_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::Overloaded => "rate_limit_error",
            ErrorKind::Timeout => "timeout_error",
            ErrorKind::Unhealthy => "overloaded_error",
            ErrorKind::Generation | ErrorKind::IncompleteGeneration | ErrorKind::Internal => {
                "api_error"
            }
            _ => "invalid_request_error",
        }
    }

    /// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
    pub fn anthropic_body(&self) -> String {
        #[derive(Serialize)]
        struct Inner<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            message: &'a str,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            error: Inner<'a>,
        }
        compact(&Body {
            kind: "error",
            error: Inner {
                kind: self.anthropic_error_type(),
                message: &self.message,
            },
        })
    }

    /// The `error` event that ends a failed Anthropic stream.
    pub fn anthropic_stream_event(&self) -> String {
        crate::sse::event("error", &self.anthropic_body())
    }
}

/// LMI/DJL server-level error (queue full etc.): pretty Gson `{"code","type","message"}`.
pub fn lmi_server_error_body(code: u16, exception_type: &str, message: &str) -> String {
    #[derive(Serialize)]
    struct Body<'a> {
        code: u16,
        #[serde(rename = "type")]
        kind: &'a str,
        message: &'a str,
    }
    serde_json::to_string_pretty(&Body {
        code,
        kind: exception_type,
        message,
    })
    .unwrap_or_default()
}

/// Compact serde_json; serializing our own plain structs cannot fail.
pub(crate) fn compact<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}
