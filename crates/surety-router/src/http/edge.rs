//! The edge's limits on every request, before any handler: a bounded,
//! plain `x-request-id`, a deadline over the whole body, a cap on header
//! bytes, and the request's span.

use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, Problem};

/// The longest `x-request-id` taken from a client.
pub const MAX_REQUEST_ID: usize = 128;

/// A client's `x-request-id` is kept only when it is short and plain
/// (letters, digits, `-`, `_`, `.`, `:`); else it is dropped and the router
/// makes one, so no client writes what it likes into every log line and
/// echo.
pub(super) async fn bounded_request_id(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let plain = |v: &axum::http::HeaderValue| {
        v.len() <= MAX_REQUEST_ID
            && !v.is_empty()
            && v.as_bytes()
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b))
    };
    let ids = request.headers().get_all(REQUEST_ID);
    if ids.iter().count() > 1 || ids.iter().any(|v| !plain(v)) {
        request.headers_mut().remove(REQUEST_ID);
    }
    next.run(request).await
}

/// The request's body, cut when it has not arrived whole by `limit` after
/// the handler began to read the request (the timer is never reset by a
/// byte arriving).
pub(super) async fn body_deadline(
    State(limit): State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use http_body::Body as _;
    // A request with no body (most reads) has nothing to wait for.
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let deadline = tokio::time::Instant::now() + limit;
    let (parts, body) = request.into_parts();
    let body = axum::body::Body::new(super::listen::DeadlineBody::new(body, deadline, limit));
    next.run(axum::extract::Request::from_parts(parts, body))
        .await
}

/// The most header bytes (names and values) a request may carry.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Refuses, as problem details, a request whose headers exceed
/// [`MAX_HEADER_BYTES`]. (Bytes no HTTP header may hold, such as control
/// characters, are refused by the HTTP parser itself, before any of this
/// runs: its 400 carries no body.)
pub(super) async fn header_limit(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if size > MAX_HEADER_BYTES {
        return ApiError::new(
            Problem::HeadersTooLarge,
            format!("the headers hold {size} bytes; at most {MAX_HEADER_BYTES} are taken"),
        )
        .into_response();
    }
    next.run(request).await
}

pub(super) fn request_span(request: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    tracing::info_span!("request", request_id = %id, method = %request.method(), path = %request.uri().path())
}

/// The header that carries a request's id.
pub const REQUEST_ID: &str = "x-request-id";

/// The same id under the name Anthropic's SDKs read (`request-id`, their
/// `_request_id`), on every answer.
pub const ANTHROPIC_REQUEST_ID: &str = "request-id";

/// Copies the answer's `x-request-id` to `request-id`.
pub(super) async fn anthropic_request_id(mut response: Response) -> Response {
    if let Some(id) = response.headers().get(REQUEST_ID).cloned() {
        response.headers_mut().insert(ANTHROPIC_REQUEST_ID, id);
    }
    response
}
