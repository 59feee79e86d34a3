//! Errors in Anthropic's shape (`{"type": "error", "error": {"type",
//! "message"}}`), with the statuses and error types Anthropic's SDKs map
//! to their exception classes. Every refusal the facade shares with the
//! OpenAI dialect is made once, as an [`OpenAiError`], and said here in
//! Anthropic's words: its `param` leads the message, as Anthropic's own
//! errors name the field at fault.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::super::OpenAiError;
use super::super::error::retry_headers;
use crate::http::error::ApiError;
use crate::http::views::{AnthropicErrorDetail, AnthropicErrorView};

/// Anthropic's "overloaded" status: the SDK's `OverloadedError`.
pub const OVERLOADED: u16 = 529;

/// An error in Anthropic's shape.
#[derive(Debug)]
pub struct AnthropicError {
    pub status: StatusCode,
    /// Anthropic's error `type`.
    pub kind: &'static str,
    pub message: String,
    pub should_retry: Option<bool>,
    pub retry_after: Option<u64>,
}

impl AnthropicError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> AnthropicError {
        OpenAiError::bad_request("invalid_request", param, message).into()
    }
}

impl From<OpenAiError> for AnthropicError {
    fn from(error: OpenAiError) -> AnthropicError {
        let overloaded =
            StatusCode::from_u16(OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let (status, kind) = match error.status.as_u16() {
            401 => (error.status, "authentication_error"),
            403 => (error.status, "permission_error"),
            404 => (error.status, "not_found_error"),
            // An unknown route is an unknown model: Anthropic's 404.
            422 if error.code == "model_not_found" => (StatusCode::NOT_FOUND, "not_found_error"),
            413 | 431 => (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            429 => (error.status, "rate_limit_error"),
            // Every certified provider failed.
            502 => (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
            // No certified provider now, or the database away or full:
            // nothing was recorded.
            503 | 507 => (overloaded, "overloaded_error"),
            504 => (error.status, "timeout_error"),
            500 => (error.status, "api_error"),
            _ if error.status.is_server_error() => (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
            // 400, 409, 415, 422: the request is refused as it is.
            _ => (error.status, "invalid_request_error"),
        };
        let message = match &error.param {
            Some(param) => format!("{param}: {}", error.message),
            None => error.message,
        };
        AnthropicError {
            status,
            kind,
            message,
            should_retry: error.should_retry,
            retry_after: error.retry_after,
        }
    }
}

impl From<ApiError> for AnthropicError {
    fn from(error: ApiError) -> AnthropicError {
        OpenAiError::from(error).into()
    }
}

impl From<crate::jobs::JobError> for AnthropicError {
    fn from(error: crate::jobs::JobError) -> AnthropicError {
        OpenAiError::from(error).into()
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let body = AnthropicErrorView {
            kind: "error".to_owned(),
            error: AnthropicErrorDetail {
                kind: self.kind.to_owned(),
                message: self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        retry_headers(response.headers_mut(), self.should_retry, self.retry_after);
        crate::http::error::close_if_limited(&mut response);
        response
    }
}
