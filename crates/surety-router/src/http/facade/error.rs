//! Errors in OpenAI's format, with the statuses its SDKs map to typed
//! exceptions and `x-should-retry` saying whether a retry can help; the
//! native API's problems and the jobs layer's errors in its words.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::http::error::{ApiError, Problem};
use crate::http::views::{OpenAiErrorDetail, OpenAiErrorView};

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
        OpenAiError::invalid(StatusCode::BAD_REQUEST, code, param, message)
    }

    /// A refusal of the request (`invalid_request_error`) with `status`,
    /// about `param` when one is at fault; a retry of it cannot help.
    pub fn invalid(
        status: StatusCode,
        code: &'static str,
        param: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        OpenAiError {
            status,
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
        retry_headers(headers, self.should_retry, self.retry_after);
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        crate::http::error::close_if_limited(&mut response);
        response
    }
}

/// Whether a retry can help (`x-should-retry`, which OpenAI's and
/// Anthropic's SDKs both read) and when (`Retry-After`, in seconds).
pub(super) fn retry_headers(
    headers: &mut axum::http::HeaderMap,
    should_retry: Option<bool>,
    retry_after: Option<u64>,
) {
    if let Some(retry) = should_retry {
        headers.insert(
            "x-should-retry",
            HeaderValue::from_static(if retry { "true" } else { "false" }),
        );
    }
    if let Some(seconds) = retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
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
            // OpenAI's own word for a spent quota; a retry before the
            // budget resets is refused again (`Retry-After` says when).
            Problem::OverBudget => (
                "insufficient_quota",
                "insufficient_quota",
                None,
                Some(false),
            ),
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

/// The jobs layer's errors, through the native API's problem for each.
impl From<crate::jobs::JobError> for OpenAiError {
    fn from(error: crate::jobs::JobError) -> OpenAiError {
        ApiError::from(error).into()
    }
}
