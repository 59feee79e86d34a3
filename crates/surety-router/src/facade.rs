//! The OpenAI-compatible facade: `POST /v1/chat/completions` and
//! `GET /v1/models`, so clients built for OpenAI work by changing their base
//! URL. Every answer and every error here is in OpenAI's format, with the
//! statuses its SDKs map to typed exceptions and `x-should-retry` saying
//! whether a retry can help.
//!
//! `model` names a route. On a pinned route (the default) the messages must
//! be a rendering of the contract's templates: they are read back into the
//! contract's input, and the job is that input, sent as the harness
//! certified it. On an `output-only` route the messages pass through.
//! Either way the answer is checked against the contract before a byte of
//! it is sent, streamed or not. A parameter surety does not honour is
//! refused by name, never dropped.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use surety_core::{AttemptState, Fingerprint, IdempotencyKey, JobState};
use surety_providers::{Facade, Message, Role};
use surety_store::{Attempt, Job, JobKind, OwnerId};

use crate::error::{ApiError, Problem};
use crate::extract::{Caller, JsonObject, idempotency_key};
use crate::service::{Intake, create_or_replay, route_and_contract, wait_at_rest};
use crate::views::{
    ChatCompletionDoc, ChatRequestDoc, ChunkEventDoc, ModelList, ModelView, OpenAiErrorDetail,
    OpenAiErrorView,
};
use crate::views::{UsageView, finish_reason};
use crate::{AppState, ServedContract};

/// Says on every facade answer whether its prompt was certified
/// (`true` on a pinned route, `false` on an output-only one).
pub const PROMPT_CERTIFIED: &str = "surety-prompt-certified";

/// Says `off` on an answer to a request that came without an
/// Idempotency-Key (when the operator allows those): it was a one-off job,
/// and a repeat of it is a new job.
pub const DEDUPLICATION: &str = "surety-deduplication";

/// An error in OpenAI's format.
#[derive(Debug)]
pub struct OpenAiError {
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// A stable word for what went wrong.
    pub code: &'static str,
    /// The request parameter at fault, when one is.
    pub param: Option<String>,
    pub message: String,
    /// Whether the client may retry (`x-should-retry`); `None` leaves it to
    /// the client's own policy.
    pub should_retry: Option<bool>,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
}

impl OpenAiError {
    /// A 400 about `param`.
    pub fn bad_request(
        code: &'static str,
        param: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        OpenAiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code,
            param: param.map(str::to_owned),
            message: message.into(),
            should_retry: Some(false),
            retry_after: None,
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let body = OpenAiErrorView {
            error: OpenAiErrorDetail {
                message: self.message,
                kind: self.kind.to_owned(),
                param: self.param,
                code: self.code.to_owned(),
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(retry) = self.should_retry {
            headers.insert(
                "x-should-retry",
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        crate::error::close_if_limited(&mut response);
        response
    }
}

/// The native API's problems, in OpenAI's words and statuses.
impl From<ApiError> for OpenAiError {
    fn from(error: ApiError) -> OpenAiError {
        let status = error.problem.status();
        let (kind, code, param, should_retry) = match error.problem {
            Problem::Unauthorized => ("authentication_error", "invalid_api_key", None, Some(false)),
            Problem::Forbidden => ("permission_error", "forbidden", None, Some(false)),
            Problem::MissingIdempotencyKey => (
                "invalid_request_error",
                "missing_idempotency_key",
                None,
                Some(false),
            ),
            Problem::InvalidIdempotencyKey => (
                "invalid_request_error",
                "invalid_idempotency_key",
                None,
                Some(false),
            ),
            Problem::MalformedBody | Problem::UnsupportedMediaType => (
                "invalid_request_error",
                "invalid_request",
                None,
                Some(false),
            ),
            Problem::PayloadTooLarge | Problem::HeadersTooLarge => (
                "invalid_request_error",
                "request_too_large",
                None,
                Some(false),
            ),
            Problem::UnknownRoute => (
                "invalid_request_error",
                "model_not_found",
                Some("model"),
                Some(false),
            ),
            Problem::NotFound => ("invalid_request_error", "not_found", None, Some(false)),
            Problem::MethodNotAllowed => (
                "invalid_request_error",
                "method_not_allowed",
                None,
                Some(false),
            ),
            Problem::IdempotencyConflict => (
                "invalid_request_error",
                "idempotency_conflict",
                None,
                Some(false),
            ),
            Problem::AttemptOpen | Problem::JobSettled | Problem::AttemptNotOpen => {
                ("invalid_request_error", "conflict", None, Some(false))
            }
            // Nothing a client's retry changes: an operator must certify a provider.
            Problem::NoCertifiedProvider => {
                ("server_error", "no_certified_provider", None, Some(false))
            }
            Problem::RateLimited => ("rate_limit_error", "rate_limit_exceeded", None, Some(true)),
            // Nothing was recorded: the same request is safe to send again.
            Problem::DatabaseUnavailable => {
                ("server_error", "database_unavailable", None, Some(true))
            }
            Problem::StorageFull => ("server_error", "storage_full", None, Some(true)),
            Problem::Internal => ("server_error", "internal_error", None, None),
        };
        OpenAiError {
            status,
            kind,
            code,
            param: param.map(str::to_owned),
            message: error.detail,
            should_retry,
            retry_after: error.retry_after,
        }
    }
}

/// The routes, as OpenAI lists models.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    responses(
        (status = 200, description = "The routes", body = ModelList),
        (status = 401, description = "No or an unknown API key", body = OpenAiErrorView),
    )
)]
pub async fn models(State(state): State<AppState>, _caller: OpenAiCaller) -> Response {
    let data = state
        .inner
        .routes
        .values()
        .map(|r| ModelView {
            id: r.id.clone(),
            object: "model".to_owned(),
            created: 0,
            owned_by: "surety".to_owned(),
        })
        .collect();
    Json(ModelList {
        object: "list".to_owned(),
        data,
    })
    .into_response()
}

/// OpenAI's chat completions, on a route's certified prompt.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Names this intent: the same on every retry of it (required unless the operator allows one-off jobs)", min_length = 1, max_length = 255, pattern = r"^[!#-~]([ -~]*[!-~])?$"),
    ),
    request_body(content = ChatRequestDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "The completion, as JSON, or with `stream` as server-sent `chat.completion.chunk` events ending with `data: [DONE]`", content(
            (ChatCompletionDoc = "application/json"),
            (ChunkEventDoc = "text/event-stream"),
        )),
        (status = 400, description = "A bad request, a prompt the certificate does not cover, or a parameter surety does not honour (named in `param`)", body = OpenAiErrorView),
        (status = 401, description = "No or an unknown API key", body = OpenAiErrorView),
        (status = 409, description = "The key names a job with a different request", body = OpenAiErrorView),
        (status = 413, description = "The body is too large", body = OpenAiErrorView),
        (status = 415, description = "The body is not application/json", body = OpenAiErrorView),
        (status = 422, description = "No such route", body = OpenAiErrorView),
        (status = 431, description = "The headers are too large", body = OpenAiErrorView),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = OpenAiErrorView),
        (status = 502, description = "Every certified provider failed", body = OpenAiErrorView),
        (status = 503, description = "No provider of the route is certified now", body = OpenAiErrorView),
        (status = 504, description = "The job is still running, or unknown", body = OpenAiErrorView),
    )
)]
pub async fn chat_completions(
    State(state): State<AppState>,
    OpenAiCaller(caller): OpenAiCaller,
    headers: HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Response {
    match chat(&state, caller, &headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// What the request asks of the answer's delivery.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    stream: bool,
    include_usage: bool,
}

/// The caller, authenticated before the body is read (a request without a
/// good key is answered at once, in OpenAI's format, and its body never
/// read).
#[derive(Debug)]
pub struct OpenAiCaller(pub Caller);

impl axum::extract::FromRequestParts<AppState> for OpenAiCaller {
    type Rejection = OpenAiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<OpenAiCaller, OpenAiError> {
        Caller::from_request_parts(parts, state)
            .await
            .map(OpenAiCaller)
            .map_err(OpenAiError::from)
    }
}

async fn chat(
    state: &AppState,
    caller: Caller,
    headers: &HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Result<Response, OpenAiError> {
    let Caller(key, _admitted) = caller;
    let JsonObject(body) = body?;
    let Some(request) = body.as_object() else {
        return Err(OpenAiError::bad_request(
            "invalid_request",
            None,
            "the body must be a JSON object",
        ));
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            OpenAiError::bad_request(
                "invalid_request",
                Some("model"),
                "`model` must name a route",
            )
        })?;
    let (route, served) = route_and_contract(state, model)?;
    let delivery = parameters(request, served)?;
    let (idempotency, keyless) = match (idempotency_key(headers), state.inner.allow_keyless_chat) {
        (Ok(key), _) => (key, false),
        (Err(e), true) if e.problem == Problem::MissingIdempotencyKey => {
            let one_off = format!("one-off-{}", uuid::Uuid::now_v7());
            let key =
                IdempotencyKey::parse(&one_off).map_err(|e| ApiError::internal(e.to_string()))?;
            (key, true)
        }
        (Err(e), _) if e.problem == Problem::MissingIdempotencyKey => {
            return Err(OpenAiError::bad_request(
                "missing_idempotency_key",
                None,
                "this request has no Idempotency-Key header: send one naming this intent (e.g. `Idempotency-Key: order-1042-refund`), the same on every retry of it; docs/clients.md shows how each SDK sends it",
            ));
        }
        (Err(e), _) => return Err(e.into()),
    };
    let sent = chat_messages(&body)?;
    let (input, messages) = match route.facade {
        Facade::OutputOnly => (body.clone(), sent),
        Facade::Pinned => {
            let input = pin(served, &sent).map_err(|message| {
                OpenAiError::bad_request("prompt_not_certified", Some("messages"), message)
            })?;
            (input, sent)
        }
    };
    let owner = OwnerId(key.owner);
    let fingerprint = Fingerprint::of(&body)
        .map_err(|e| OpenAiError::bad_request("invalid_request", None, e.to_string()))?;
    let intake = Intake {
        owner: owner.clone(),
        key: idempotency,
        route: route.clone(),
        served: served.clone(),
        input,
        fingerprint: Some(fingerprint),
        kind: JobKind::Chat,
        // A pinned job's messages are its contract's rendering of its
        // input; an output-only job's are the client's, kept with it.
        keep_messages: route.facade == Facade::OutputOnly,
        messages,
    };
    let created = create_or_replay(state, intake, true).await?;
    let replayed = created.replayed;
    let limit = state.inner.attempt_timeout + Duration::from_secs(5);
    let (_, job, attempts) = wait_at_rest(state, &owner, created, limit).await?;
    let mut response = answer(&job, &attempts, delivery)?;
    let out = response.headers_mut();
    if replayed {
        out.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if keyless {
        out.insert(DEDUPLICATION, HeaderValue::from_static("off"));
    }
    if let Ok(value) = HeaderValue::from_str(&job.id.0) {
        out.insert("surety-job-id", value);
    }
    // Whether a certificate covers the prompt that was sent, not only the answer.
    out.insert(
        PROMPT_CERTIFIED,
        HeaderValue::from_static(match route.facade {
            Facade::Pinned => "true",
            Facade::OutputOnly => "false",
        }),
    );
    Ok(response)
}

/// The parameters surety honours, checked; any other is refused by name.
/// Sampling parameters are the contract's: a request may repeat them, not
/// change them.
fn parameters(
    request: &serde_json::Map<String, Value>,
    served: &ServedContract,
) -> Result<Delivery, OpenAiError> {
    let contract = &served.contract;
    let refuse = |param: &str, why: String| {
        Err(OpenAiError::bad_request(
            "unsupported_parameter",
            Some(param),
            why,
        ))
    };
    let mut delivery = Delivery {
        stream: false,
        include_usage: false,
    };
    for (name, value) in request {
        match name.as_str() {
            "model" | "messages" => {}
            // An end-user id for the caller's own records: it changes nothing sent.
            "user" if value.is_string() || value.is_null() => {}
            "stream" => match value {
                Value::Bool(on) => delivery.stream = *on,
                Value::Null => {}
                _ => return refuse(name, "`stream` must be true or false".to_owned()),
            },
            "stream_options" => match value {
                Value::Null => {}
                Value::Object(options) => {
                    for (option, v) in options {
                        match (option.as_str(), v) {
                            ("include_usage", Value::Bool(on)) => delivery.include_usage = *on,
                            _ => {
                                return refuse(
                                    &format!("stream_options.{option}"),
                                    format!(
                                        "`stream_options.{option}` is not supported; only `include_usage`"
                                    ),
                                );
                            }
                        }
                    }
                }
                _ => return refuse(name, "`stream_options` must be an object".to_owned()),
            },
            "n" if value.as_u64() == Some(1) || value.is_null() => {}
            "n" => {
                return refuse(
                    name,
                    "surety answers one choice per job: `n` must be 1".to_owned(),
                );
            }
            "temperature" => {
                let certified = f64::from(contract.sampling.temperature);
                if !(value.is_null()
                    || value.as_f64().is_some_and(|t| (t - certified).abs() < 1e-9))
                {
                    return refuse(
                        name,
                        format!(
                            "the route's contract `{}` is certified at temperature {certified}; send that or none",
                            contract.id
                        ),
                    );
                }
            }
            "max_tokens" | "max_completion_tokens" => {
                let certified = u64::from(contract.limits.max_output_tokens);
                if !(value.is_null() || value.as_u64() == Some(certified)) {
                    return refuse(
                        name,
                        format!(
                            "the route's contract `{}` is certified with {certified} output tokens; send that or none",
                            contract.id
                        ),
                    );
                }
            }
            "seed" => {
                let certified = contract.sampling.seed;
                if !(value.is_null() || (certified.is_some() && value.as_u64() == certified)) {
                    return refuse(
                        name,
                        format!(
                            "the route's contract `{}` decides the seed; send none",
                            contract.id
                        ),
                    );
                }
            }
            "response_format" => {
                return refuse(
                    name,
                    format!(
                        "the route's contract `{}` decides the answer's format (its JSON Schema); send no `response_format`",
                        contract.id
                    ),
                );
            }
            "tools" | "tool_choice" | "functions" | "function_call" | "parallel_tool_calls" => {
                return refuse(
                    name,
                    format!(
                        "`{name}` is not supported: a route answers in its contract's JSON, not with tool calls"
                    ),
                );
            }
            other => {
                return refuse(
                    other,
                    format!("`{other}` is not supported by surety's chat completions"),
                );
            }
        }
    }
    Ok(delivery)
}

/// The input of the route's contract that renders to exactly `messages`,
/// or what differs.
fn pin(served: &ServedContract, messages: &[Message]) -> Result<Value, String> {
    let contract = &served.contract;
    let template = served.user_template.as_ref().map_err(|why| {
        format!(
            "the user template of contract `{}` cannot be read back ({why}), so no request can be shown to be its certified prompt; the route can be served only with `facade = \"output-only\"`",
            contract.id
        )
    })?;
    surety_exchange::pinning::read_back(contract, template, messages).map_err(|e| {
        // A system message that differs names the digest it should have had already.
        let expected = surety_exchange::system_prompt_digest(contract)
            .filter(|_| e.part != "system")
            .map(|d| format!(" (the certified system prompt is {d})"))
            .unwrap_or_default();
        format!("{e}{expected}")
    })
}

/// The messages of an OpenAI chat request: roles system (or developer),
/// user and assistant, content as text or text parts. Anything else is
/// refused by name.
pub fn chat_messages(body: &Value) -> Result<Vec<Message>, OpenAiError> {
    let refuse = |param: String, message: String| {
        Err(OpenAiError::bad_request(
            "unsupported_parameter",
            Some(&param),
            message,
        ))
    };
    let Some(messages) = body["messages"].as_array() else {
        return refuse("messages".into(), "`messages` must be a list".into());
    };
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = match m["role"].as_str() {
            Some("system" | "developer") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(other) => {
                return refuse(
                    format!("messages[{i}].role"),
                    format!(
                        "the role `{other}` is not supported; surety takes system, developer, user and assistant messages"
                    ),
                );
            }
            None => {
                return refuse(
                    format!("messages[{i}].role"),
                    "a message needs a `role`".into(),
                );
            }
        };
        if let Some(extra) = m.as_object().and_then(|o| {
            o.keys()
                .find(|k| !matches!(k.as_str(), "role" | "content" | "name"))
        }) {
            return refuse(
                format!("messages[{i}].{extra}"),
                format!("`{extra}` in a message is not supported"),
            );
        }
        let content = match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (part["type"].as_str(), part["text"].as_str()) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return refuse(
                                format!("messages[{i}].content[{j}]"),
                                format!(
                                    "a content part of type `{}` is not supported; only text",
                                    kind.unwrap_or("(none)")
                                ),
                            );
                        }
                    }
                }
                text
            }
            _ => {
                return refuse(
                    format!("messages[{i}].content"),
                    "a message's content must be text".into(),
                );
            }
        };
        out.push(Message { role, content });
    }
    if out.is_empty() {
        return refuse("messages".into(), "`messages` is empty".into());
    }
    Ok(out)
}

/// The job's answer as a chat completion (or its stream), or why there is none.
fn answer(job: &Job, attempts: &[Attempt], delivery: Delivery) -> Result<Response, OpenAiError> {
    let error = |status, kind, code, should_retry, retry_after, message: String| OpenAiError {
        status,
        kind,
        code,
        param: None,
        message,
        should_retry: Some(should_retry),
        retry_after,
    };
    match (job.state, &job.result) {
        (JobState::Succeeded, Some(result)) => {
            let completion = Completion::of(job, result);
            Ok(match delivery.stream {
                true => completion.stream(delivery.include_usage),
                false => Json(completion.whole()).into_response(),
            })
        }
        (JobState::Failed, _) => {
            let last = attempts
                .last()
                .and_then(|a| a.error.clone())
                .unwrap_or_default();
            Err(error(
                StatusCode::BAD_GATEWAY,
                "server_error",
                "provider_error",
                false,
                None,
                format!("every certified provider failed; the last said: {last}"),
            ))
        }
        (JobState::Unknown, _) => {
            let open = attempts
                .iter()
                .rev()
                .find(|a| a.state == AttemptState::Unknown);
            let (n, provider) = open.map_or((0, ""), |a| (a.ordinal, a.provider.as_str()));
            Err(error(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                "job_unknown",
                false,
                None,
                format!(
                    "job {id} is unknown: attempt {n} at provider `{provider}` got no answer in time, and the provider may have done the work, so nothing is retried on its own. A late answer still completes the job (ask again with the same Idempotency-Key to get it); otherwise an admin cancels the attempt (POST /v1/jobs/{id}/attempts/{n}/cancel) and retries the job (POST /v1/jobs/{id}/retry)",
                    id = job.id
                ),
            ))
        }
        (state_now, _) => Err(error(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            "job_not_settled",
            true,
            Some(2),
            format!(
                "job {} is {state_now}; ask again with the same Idempotency-Key and the same body to get its answer, or GET /v1/jobs/{}",
                job.id, job.id
            ),
        )),
    }
}

/// A succeeded job as a chat completion.
struct Completion {
    id: String,
    created: i64,
    model: String,
    content: String,
    finish_reason: Value,
    usage: Value,
}

impl Completion {
    fn of(job: &Job, result: &Value) -> Completion {
        let usage = UsageView::of(job).unwrap_or_default();
        let (prompt, completion) = (usage.prompt_tokens, usage.completion_tokens);
        Completion {
            id: format!("chatcmpl-{}", job.id),
            created: job.created_at_ms / 1000,
            model: job.route.clone(),
            content: result.to_string(),
            finish_reason: json!(finish_reason(job).unwrap_or_else(|| "stop".to_owned())),
            usage: json!({
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }),
        }
    }

    fn whole(&self) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": self.content, "refusal": null},
                "logprobs": null,
                "finish_reason": self.finish_reason,
            }],
            "usage": self.usage,
        })
    }

    fn chunk(&self, choices: Value, usage: Value) -> Event {
        Event::default().data(
            json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": choices,
                "usage": usage,
            })
            .to_string(),
        )
    }

    /// Server-sent events in OpenAI's chunk format: the role, the content in
    /// pieces, the finish reason, the usage when asked for, then `[DONE]`.
    /// The answer was checked before the first byte.
    fn stream(&self, include_usage: bool) -> Response {
        let delta = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
        let mut events = vec![self.chunk(
            delta(json!({"role": "assistant", "content": ""}), Value::Null),
            Value::Null,
        )];
        let chars: Vec<char> = self.content.chars().collect();
        for piece in chars.chunks(24) {
            let text: String = piece.iter().collect();
            events.push(self.chunk(delta(json!({"content": text}), Value::Null), Value::Null));
        }
        events.push(self.chunk(delta(json!({}), self.finish_reason.clone()), Value::Null));
        if include_usage {
            events.push(self.chunk(json!([]), self.usage.clone()));
        }
        events.push(Event::default().data("[DONE]"));
        let stream = futures_util::stream::iter(events.into_iter().map(Ok::<Event, Infallible>));
        Sse::new(stream).into_response()
    }
}
