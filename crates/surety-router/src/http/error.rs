//! The router's errors as RFC 9457 problem details, one stable `type` each.
//! 5xx bodies stay generic; the details go to the log.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use surety_store::Outage;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    Unauthorized,
    Forbidden,
    MissingIdempotencyKey,
    InvalidIdempotencyKey,
    MalformedBody,
    UnsupportedMediaType,
    PayloadTooLarge,
    MethodNotAllowed,
    HeadersTooLarge,
    RateLimited,
    OverBudget,
    UnknownRoute,
    NotFound,
    IdempotencyConflict,
    AttemptOpen,
    JobSettled,
    AttemptNotOpen,
    NoCertifiedProvider,
    DatabaseUnavailable,
    StorageFull,
    Internal,
}

impl Problem {
    pub fn status(self) -> StatusCode {
        match self {
            Problem::Unauthorized => StatusCode::UNAUTHORIZED,
            Problem::Forbidden => StatusCode::FORBIDDEN,
            Problem::MissingIdempotencyKey
            | Problem::InvalidIdempotencyKey
            | Problem::MalformedBody => StatusCode::BAD_REQUEST,
            Problem::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Problem::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Problem::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Problem::RateLimited | Problem::OverBudget => StatusCode::TOO_MANY_REQUESTS,
            Problem::UnknownRoute => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::NotFound => StatusCode::NOT_FOUND,
            Problem::IdempotencyConflict
            | Problem::AttemptOpen
            | Problem::JobSettled
            | Problem::AttemptNotOpen => StatusCode::CONFLICT,
            Problem::NoCertifiedProvider | Problem::DatabaseUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Problem::StorageFull => StatusCode::INSUFFICIENT_STORAGE,
            Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Problem::Unauthorized => "unauthorized",
            Problem::Forbidden => "forbidden",
            Problem::MissingIdempotencyKey => "missing-idempotency-key",
            Problem::InvalidIdempotencyKey => "invalid-idempotency-key",
            Problem::MalformedBody => "malformed-body",
            Problem::PayloadTooLarge => "payload-too-large",
            Problem::UnsupportedMediaType => "unsupported-media-type",
            Problem::MethodNotAllowed => "method-not-allowed",
            Problem::HeadersTooLarge => "headers-too-large",
            Problem::RateLimited => "rate-limited",
            Problem::OverBudget => "over-budget",
            Problem::UnknownRoute => "unknown-route",
            Problem::NotFound => "not-found",
            Problem::IdempotencyConflict => "idempotency-conflict",
            Problem::AttemptOpen => "attempt-open",
            Problem::JobSettled => "job-settled",
            Problem::AttemptNotOpen => "attempt-not-open",
            Problem::NoCertifiedProvider => "no-certified-provider",
            Problem::DatabaseUnavailable => "database-unavailable",
            Problem::StorageFull => "storage-full",
            Problem::Internal => "internal",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::Unauthorized => "Missing or unknown API key",
            Problem::Forbidden => "This API key may not do that",
            Problem::MissingIdempotencyKey => "Idempotency-Key is required",
            Problem::InvalidIdempotencyKey => "Idempotency-Key is malformed",
            Problem::MalformedBody => "The request body is not valid",
            Problem::PayloadTooLarge => "The request body is too large",
            Problem::UnsupportedMediaType => "The request body must be application/json",
            Problem::MethodNotAllowed => "This endpoint does not take that method",
            Problem::HeadersTooLarge => "The request's headers are too large",
            Problem::RateLimited => "Too many requests from this owner",
            Problem::OverBudget => "The budget has no room for this job",
            Problem::UnknownRoute => "No such route",
            Problem::NotFound => "Not found",
            Problem::IdempotencyConflict => "This Idempotency-Key was used for a different request",
            Problem::AttemptOpen => "An attempt is still open",
            Problem::JobSettled => "The job is already settled",
            Problem::AttemptNotOpen => "The attempt is not open",
            Problem::NoCertifiedProvider => "No provider is certified for this contract",
            Problem::DatabaseUnavailable => "The database is unavailable",
            Problem::StorageFull => "The database is full",
            Problem::Internal => "Internal error",
        }
    }

    pub fn type_uri(self) -> String {
        format!("https://surety.dev/problems/{}", self.slug())
    }
}

/// An error answer.
#[derive(Debug, thiserror::Error)]
#[error("{problem:?}: {detail}")]
pub struct ApiError {
    pub problem: Problem,
    pub detail: String,
    /// `Retry-After`, in seconds, where waiting helps.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(problem: Problem, detail: impl Into<String>) -> ApiError {
        ApiError {
            problem,
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub fn internal(error: impl std::fmt::Display) -> ApiError {
        tracing::error!(%error, "internal error");
        ApiError::new(
            Problem::Internal,
            "the server failed; the details are in its log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.problem.status();
        let body = crate::http::views::ProblemView {
            kind: self.problem.type_uri(),
            title: self.problem.title().to_owned(),
            status: status.as_u16(),
            detail: self.detail,
        };
        let mut response = (status, axum::Json(body)).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.problem == Problem::Unauthorized {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        close_if_limited(&mut response);
        response
    }
}

/// A request turned away by its owner's limits gives its connection back:
/// an owner past its limit holds no connection others could use.
pub(crate) fn close_if_limited(response: &mut Response) {
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// `Retry-After` when the database cannot be reached: a restart or a
/// failover of the database takes seconds.
const DATABASE_RETRY_AFTER_S: u64 = 2;
/// `Retry-After` when the database is full: room comes back when an
/// operator or the retention pruner makes it.
const STORAGE_RETRY_AFTER_S: u64 = 30;

impl From<surety_store::StoreError> for ApiError {
    fn from(error: surety_store::StoreError) -> ApiError {
        use surety_store::StoreError as E;
        // Nothing was recorded: the same request, with the same key, is
        // safe to send again once the database is back or has room.
        if let Some(outage) = error.outage() {
            let (problem, retry_after, detail) = match outage {
                Outage::Unavailable => (
                    Problem::DatabaseUnavailable,
                    DATABASE_RETRY_AFTER_S,
                    "the database cannot be reached; nothing was recorded. Send the same request with the same Idempotency-Key again",
                ),
                Outage::Full => (
                    Problem::StorageFull,
                    STORAGE_RETRY_AFTER_S,
                    "the database has no room for new jobs; nothing was recorded. Send the same request with the same Idempotency-Key again later",
                ),
            };
            tracing::warn!(%error, ?outage, "the database cannot take the request");
            return ApiError {
                retry_after: Some(retry_after),
                ..ApiError::new(problem, detail)
            };
        }
        match error {
            E::JobNotFound(_) | E::AttemptNotFound { .. } => {
                ApiError::new(Problem::NotFound, error.to_string())
            }
            E::AttemptOpen { .. } => ApiError::new(Problem::AttemptOpen, error.to_string()),
            E::OverBudget { .. } => ApiError::new(Problem::OverBudget, error.to_string()),
            // Demoted since eligibility was read: no provider is certified now.
            E::Demoted { .. } => ApiError::new(Problem::NoCertifiedProvider, error.to_string()),
            E::Transition(surety_core::TransitionError::Job { .. }) => {
                ApiError::new(Problem::JobSettled, error.to_string())
            }
            E::Transition(surety_core::TransitionError::Attempt { .. }) => {
                ApiError::new(Problem::AttemptNotOpen, error.to_string())
            }
            E::HedgeRefused { .. } | E::LeaseExpired { .. } | E::Invalid { .. } => {
                ApiError::new(Problem::MalformedBody, error.to_string())
            }
            E::UnsupportedUrl(_)
            | E::Database(_)
            | E::Sqlite(_)
            | E::NotCommitted { .. }
            | E::Away { .. }
            | E::Closed
            | E::Migrate(_)
            | E::Corrupt(_) => ApiError::internal(error),
        }
    }
}

impl From<crate::jobs::JobError> for ApiError {
    fn from(error: crate::jobs::JobError) -> ApiError {
        use crate::jobs::JobError as E;
        let detail = error.to_string();
        match error {
            E::UnknownRoute(_) => ApiError::new(Problem::UnknownRoute, detail),
            E::NoCertifiedProvider { .. } => ApiError::new(Problem::NoCertifiedProvider, detail),
            E::Conflict => ApiError::new(Problem::IdempotencyConflict, detail),
            E::NoLongerFits { .. } => ApiError::new(Problem::MalformedBody, detail),
            E::OverBudget(refusal) => ApiError {
                retry_after: refusal.retry_after,
                ..ApiError::new(Problem::OverBudget, detail)
            },
            E::Store(e) => ApiError::from(e),
            E::Internal(e) => ApiError::internal(e),
        }
    }
}

impl From<crate::live::ReinstateError> for ApiError {
    fn from(error: crate::live::ReinstateError) -> ApiError {
        use crate::live::ReinstateError as E;
        let detail = error.to_string();
        match error {
            E::Reason => ApiError::new(Problem::MalformedBody, detail),
            E::NotDemoted { .. } => ApiError::new(Problem::NotFound, detail),
            E::Store(e) => ApiError::from(e),
        }
    }
}
