//! Anthropic's Messages API (`POST /v1/messages`), so Anthropic's SDKs and
//! the clients built on them put surety in front by changing a base URL:
//! the facade's owners, limits and Idempotency-Key rules, the key in
//! `x-api-key` (or `Authorization: Bearer`), `anthropic-version` required,
//! every answer and error in Anthropic's shape. A message is a job of kind
//! `messages`; its id (`msg_…`) is the job's, so a replay answers the same
//! message.
//!
//! On a pinned route `system` and the user turn must be the contract's
//! rendered prompt, read back into its input; on an output-only route the
//! turns pass through (an agent loop's `tool_use` and `tool_result` to
//! every provider kind in its own words). Either way the answer is checked
//! against the contract before a byte is sent.

mod error;
mod reply;
mod request;

use axum::extract::{FromRequestParts, State};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use surety_store::{Attempt, Job, JobKind, OwnerId};

pub use error::AnthropicError;

use super::{OpenAiError, intent_key, request_model, settled_job, stamp};
use crate::http::error::ApiError;
use crate::http::extract::{Caller, JsonObject, authenticate_anthropic};
use crate::http::views::{
    AnthropicErrorView, CountTokensRequestDoc, MessageEventDoc, MessageObject, MessageTokensCount,
    MessagesRequestDoc,
};
use crate::jobs::{Demotions, certified, route_and_contract};
use crate::state::AppState;

/// The header that names the API version a client speaks.
pub const ANTHROPIC_VERSION: &str = "anthropic-version";

/// The caller of a Messages request: its key (`x-api-key`, or a bearer
/// token) checked and its `anthropic-version` read before any body is,
/// each refusal in Anthropic's shape.
#[derive(Debug)]
pub struct AnthropicCaller(pub Caller);

impl FromRequestParts<AppState> for AnthropicCaller {
    type Rejection = AnthropicError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<AnthropicCaller, AnthropicError> {
        let caller = Caller::admitted(parts, state, authenticate_anthropic)?;
        version(&parts.headers)?;
        Ok(AnthropicCaller(caller))
    }
}

/// `anthropic-version`, required as Anthropic's API requires it: one
/// header, a date (`2023-06-01`, what the SDKs send).
fn version(headers: &HeaderMap) -> Result<(), AnthropicError> {
    let sent: Vec<_> = headers.get_all(ANTHROPIC_VERSION).iter().collect();
    let dated = |v: &str| {
        let b = v.as_bytes();
        b.len() == 10
            && b.iter().enumerate().all(|(i, c)| match i {
                4 | 7 => *c == b'-',
                _ => c.is_ascii_digit(),
            })
    };
    match sent.as_slice() {
        [one] if one.to_str().is_ok_and(dated) => Ok(()),
        [] => Err(AnthropicError::invalid(
            None,
            "anthropic-version: header is required",
        )),
        _ => Err(AnthropicError::invalid(
            None,
            "anthropic-version: one header, a date such as `2023-06-01`",
        )),
    }
}

/// Anthropic's messages, on a route's contract.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "anthropic",
    params(
        ("anthropic-version" = String, Header, nullable = false, description = "The API version the client speaks, a date (`2023-06-01`)", pattern = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"),
        ("Idempotency-Key" = Option<String>, Header, description = "Names this intent: the same on every retry of it (required unless the operator allows one-off jobs)", min_length = 1, max_length = 255, pattern = r"^[!#-~]([ -~]*[!-~])?$"),
    ),
    request_body(content = MessagesRequestDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "The message, as JSON, or with `stream` as server-sent events (`message_start` … `message_stop`); `surety-not-sent` names the client's `cache_control` and `anthropic-beta` where the provider that answered was not sent them", content(
            (MessageObject = "application/json"),
            (MessageEventDoc = "text/event-stream"),
        )),
        (status = 400, description = "A bad request, a prompt the certificate does not cover, or a parameter surety does not honour (named first in the message)", body = AnthropicErrorView),
        (status = 401, description = "No or an unknown API key", body = AnthropicErrorView),
        (status = 404, description = "No such route (`model`)", body = AnthropicErrorView),
        (status = 409, description = "The key names a job with a different request", body = AnthropicErrorView),
        (status = 413, description = "The body or the headers are too large", body = AnthropicErrorView),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = AnthropicErrorView),
        (status = 500, description = "Every certified provider failed", body = AnthropicErrorView),
        (status = 504, description = "The job is still running, or unknown", body = AnthropicErrorView),
        (status = 529, description = "No provider is certified now, or the database is away or full: nothing was recorded (`overloaded_error`)", body = AnthropicErrorView),
    )
)]
pub async fn create_message(
    State(state): State<AppState>,
    AnthropicCaller(caller): AnthropicCaller,
    headers: HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Response {
    match message(&state, caller, &headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn message(
    state: &AppState,
    caller: Caller,
    headers: &HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Result<Response, AnthropicError> {
    let Caller(key, _admitted) = caller;
    let JsonObject(body) = body?;
    let (request, model) = request_model(&body)?;
    let (route, served) = route_and_contract(state, model)?;
    let asked = request::parameters(request, served)?;
    let (idempotency, keyless) = intent_key(state, headers)?;
    let messages = request::turns(&body)?;
    let beta = request::caching(&messages, headers, served, route.facade)?;
    let owner = OwnerId(key.owner);
    let (replayed, job, attempts) = settled_job(
        state,
        (owner, key.name, idempotency),
        (route.clone(), served.clone()),
        (
            &body,
            beta.map(|b| serde_json::json!({ crate::jobs::BETA_KEPT: b })),
        ),
        (JobKind::Messages, messages),
    )
    .await?;
    let mut response = reply::answer(&job, &attempts, asked)?;
    stamp(&mut response, replayed, keyless, &job, route.facade);
    not_sent(state, &mut response, &job, &attempts);
    Ok(response)
}

/// The header naming what of the client's request the provider that
/// answered was not sent: its `cache_control` and `anthropic-beta`, for a
/// kind that takes neither.
pub const NOT_SENT: &str = "surety-not-sent";

fn not_sent(state: &AppState, response: &mut Response, job: &Job, attempts: &[Attempt]) {
    let answered = attempts
        .iter()
        .find(|a| Some(a.ordinal) == job.completed_by)
        .and_then(|a| state.inner.providers.get(&a.provider));
    let (Some(provider), Some(messages)) = (answered, &job.messages) else {
        return;
    };
    let messages: Vec<surety_providers::Message> =
        serde_json::from_value(messages.clone()).unwrap_or_default();
    let beta = crate::jobs::anthropic_beta(job.kind, job.request.as_ref()).is_some();
    let left_out = surety_providers::not_sent(&messages, beta, provider.config.kind);
    if let Ok(value) = axum::http::HeaderValue::from_str(&left_out.join(", "))
        && !left_out.is_empty()
    {
        response.headers_mut().insert(NOT_SENT, value);
    }
}

/// The header naming the tokenizer a count was made with.
pub const SURETY_TOKENIZER: &str = "surety-tokenizer";

/// The tokens of a prompt, counted by the tokenizer of the provider the
/// route would send it to now (the one its certificate was judged by).
#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    tag = "anthropic",
    params(
        ("anthropic-version" = String, Header, nullable = false, description = "The API version the client speaks, a date (`2023-06-01`)", pattern = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"),
    ),
    request_body(content = CountTokensRequestDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "The count; `surety-tokenizer` names the tokenizer and `surety-provider` the provider it is that of", body = MessageTokensCount),
        (status = 400, description = "A bad request, a parameter surety does not count, or a provider with no tokenizer known (named in the message)", body = AnthropicErrorView),
        (status = 401, description = "No or an unknown API key", body = AnthropicErrorView),
        (status = 404, description = "No such route (`model`)", body = AnthropicErrorView),
        (status = 413, description = "The body or the headers are too large", body = AnthropicErrorView),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = AnthropicErrorView),
        (status = 500, description = "The tokenizer failed", body = AnthropicErrorView),
        (status = 529, description = "No provider is certified now (`overloaded_error`)", body = AnthropicErrorView),
    )
)]
pub async fn count_tokens(
    State(state): State<AppState>,
    AnthropicCaller(_caller): AnthropicCaller,
    body: Result<JsonObject<Value>, ApiError>,
) -> Response {
    match count(&state, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn count(
    state: &AppState,
    body: Result<JsonObject<Value>, ApiError>,
) -> Result<Response, AnthropicError> {
    let JsonObject(body) = body?;
    let (_request, model) = request_model(&body)?;
    let (route, served) = route_and_contract(state, model)?;
    let texts = request::counted(&body)?;
    let eligible = certified(state, &route, served, Demotions::Seen).await?;
    let first = &eligible[0].id;
    let provider = state
        .inner
        .providers
        .get(first)
        .ok_or_else(|| ApiError::internal("a route names a missing provider"))?;
    let failed =
        |e: String| ApiError::internal(format!("the tokenizer of provider `{first}` failed: {e}"));
    let tokenizer = provider.tokenizer().await.map_err(failed)?;
    let parts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let Some(input_tokens) = tokenizer.count(&parts).await.map_err(failed)? else {
        return Err(OpenAiError::bad_request(
            "invalid_request",
            Some("model"),
            format!(
                "provider `{first}`, which route `{}` sends to now, names no tokenizer (`tokenizer` in its configuration): surety does not guess a count",
                route.id
            ),
        )
        .into());
    };
    let mut response = axum::Json(MessageTokensCount { input_tokens }).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (SURETY_TOKENIZER, tokenizer.describe()),
        ("surety-provider", first.clone()),
    ] {
        if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    Ok(response)
}
