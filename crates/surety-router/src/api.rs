//! The HTTP API: `fn app(state) -> Router`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::Value;
use surety_store::{JobKind, OwnerId};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

use crate::AppState;
use crate::error::{ApiError, Problem};
use crate::extract::{Caller, JsonObject, PathParams, idempotency_key, job_id};
use crate::service::{Intake, create_or_replay, job_view, route_and_contract, wait_at_rest};
use crate::views::{
    AttemptList, CreateJob, JobView, OpenAiErrorView, ProblemView, ProviderList, Readiness,
};

/// The longest `Prefer: wait` honoured, in seconds.
const MAX_WAIT: u64 = 60;

/// The document `/openapi.json` serves: every path comes from a handler's
/// `#[utoipa::path]`, registered with the route itself (`routes!`), so no
/// route exists undocumented.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "surety", description = "One job per intent behind idempotency keys; failover only to certified providers."),
    modifiers(&BearerAuth),
    security(("api_key" = [])),
    components(schemas(ProblemView, OpenAiErrorView))
)]
struct ApiDoc;

/// The `api_key` bearer scheme every authenticated path names.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The router, and the OpenAPI document derived from its handlers.
pub fn routes() -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::router::OpenApiRouter;
    use utoipa_axum::routes;
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_job))
        .routes(routes!(get_job))
        .routes(routes!(get_attempts))
        .routes(routes!(retry))
        .routes(routes!(cancel))
        .routes(routes!(crate::facade::chat_completions))
        .routes(routes!(crate::facade::models))
        .routes(routes!(providers))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
        .split_for_parts()
}

pub fn app(state: AppState) -> Router {
    let limit = state.inner.max_body_bytes;
    let (router, doc) = routes();
    let router = router
        .merge(crate::ui::routes())
        .fallback(|| async { ApiError::new(Problem::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                Problem::MethodNotAllowed,
                "this endpoint does not take that method; /openapi.json lists what it takes",
            )
        })
        .layer(DefaultBodyLimit::max(limit))
        // A body must arrive whole within the read timeout, whatever the
        // pace of its bytes (`listen.rs` bounds the headers the same way).
        .layer(axum::middleware::from_fn_with_state(
            state.inner.listening.request_read_timeout,
            body_deadline,
        ))
        .layer(axum::Extension(Arc::new(crate::document::for_routes(
            doc, &state,
        ))))
        .with_state(state);
    // `x-request-id`: taken from the request or made (a UUID), recorded on
    // a span around everything the request does, so every log line of it
    // carries `request_id`, and returned on the response. (The last layer
    // added runs first.)
    let id = HeaderName::from_static(REQUEST_ID);
    router
        .layer(axum::middleware::from_fn(header_limit))
        .layer(PropagateRequestIdLayer::new(id.clone()))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::new(id, MakeRequestUuid))
        .layer(axum::middleware::from_fn(bounded_request_id))
}

/// The longest `x-request-id` taken from a client.
pub const MAX_REQUEST_ID: usize = 128;

/// A client's `x-request-id` is kept only when it is short and plain
/// (letters, digits, `-`, `_`, `.`, `:`); else it is dropped and the router
/// makes one, so no client writes what it likes into every log line and
/// echo.
async fn bounded_request_id(
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
async fn body_deadline(
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
    let body = axum::body::Body::new(crate::listen::DeadlineBody::new(body, deadline, limit));
    next.run(axum::extract::Request::from_parts(parts, body))
        .await
}

/// The most header bytes (names and values) a request may carry.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Refuses, as problem details, a request whose headers exceed
/// [`MAX_HEADER_BYTES`]. (Bytes no HTTP header may hold, such as control
/// characters, are refused by the HTTP parser itself, before any of this
/// runs: its 400 carries no body.)
async fn header_limit(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
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

fn request_span(request: &axum::http::Request<axum::body::Body>) -> tracing::Span {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    tracing::info_span!("request", request_id = %id, method = %request.method(), path = %request.uri().path())
}

/// The header that carries a request's id.
pub const REQUEST_ID: &str = "x-request-id";

/// `Prefer: wait=N` (RFC 7240), capped.
fn prefer_wait(headers: &HeaderMap) -> Option<Duration> {
    let prefer = headers.get("prefer")?.to_str().ok()?;
    let seconds = prefer
        .split([',', ';'])
        .find_map(|p| p.trim().strip_prefix("wait=")?.trim().parse::<u64>().ok())?;
    Some(Duration::from_secs(seconds.min(MAX_WAIT)))
}

/// Creates a job, or answers the one this owner's Idempotency-Key already names.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    tag = "jobs",
    params(
        ("Idempotency-Key" = String, Header, description = "Names this intent: the same on every retry of it (1 to 255 printable ASCII characters; bare, or quoted as in the IETF draft)", min_length = 1, max_length = 255, pattern = r"^[!#-~]([ -~]*[!-~])?$"),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 preferences; `wait=N` holds the answer up to N seconds (at most 60) for the job to come to rest. Others are ignored"),
    ),
    request_body(content = CreateJob, content_type = "application/json"),
    responses(
        (status = 201, description = "A new job", body = JobView),
        (status = 200, description = "The job this key already names (`Idempotent-Replayed: true`)", body = JobView),
        (status = 202, description = "A new job, still running after `Prefer: wait`", body = JobView),
        (status = 400, description = "A missing or malformed key, or a body that is not the contract's input", body = ProblemView, content_type = "application/problem+json"),
        (status = 401, description = "No or an unknown API key", body = ProblemView, content_type = "application/problem+json"),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = ProblemView, content_type = "application/problem+json"),
        (status = 409, description = "The key names a job with a different request", body = ProblemView, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemView, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json", body = ProblemView, content_type = "application/problem+json"),
        (status = 422, description = "No such route", body = ProblemView, content_type = "application/problem+json"),
        (status = 431, description = "The headers are too large", body = ProblemView, content_type = "application/problem+json"),
        (status = 503, description = "No provider of the route is certified for its contract now", body = ProblemView, content_type = "application/problem+json"),
    )
)]
async fn create_job(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    headers: HeaderMap,
    JsonObject(request): JsonObject<CreateJob>,
) -> Result<Response, ApiError> {
    let idempotency = idempotency_key(&headers)?;
    if !request.input.is_object() {
        return Err(ApiError::new(
            Problem::MalformedBody,
            "`input` must be an object of the contract's template variables",
        ));
    }
    let (route, served) = route_and_contract(&state, &request.route)?;
    let contract = &served.contract;
    // The input is checked here, before any job is made of it.
    let rendered = contract.render(&request.input).map_err(|e| {
        ApiError::new(
            Problem::MalformedBody,
            format!("`input` does not fit contract `{}`: {e}", contract.id),
        )
    })?;
    let owner = OwnerId(key.owner.clone());
    let wait = prefer_wait(&headers);
    let intake = Intake {
        owner: owner.clone(),
        key: idempotency,
        route,
        served: served.clone(),
        input: request.input,
        fingerprint: None,
        kind: JobKind::Native,
        keep_messages: false,
        messages: surety_exchange::messages(&rendered),
    };
    let created = create_or_replay(&state, intake, wait.is_some()).await?;
    let replayed = created.replayed;
    let limit = wait.unwrap_or_default();
    let (at_rest, job, attempts) = wait_at_rest(&state, &owner, created, limit).await?;
    let status = match (at_rest, replayed) {
        (false, _) => StatusCode::ACCEPTED,
        (_, true) => StatusCode::OK,
        (_, false) => StatusCode::CREATED,
    };
    let mut response = (status, Json(JobView::of(&job, &attempts))).into_response();
    let headers = response.headers_mut();
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
        headers.insert(header::LOCATION, location);
    }
    Ok(response)
}

/// The owner's job; another owner's job is not found.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The job", body = JobView),
        (status = 401, description = "No or an unknown API key", body = ProblemView, content_type = "application/problem+json"),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = ProblemView, content_type = "application/problem+json"),
        (status = 404, description = "No such job of this owner", body = ProblemView, content_type = "application/problem+json"),
    )
)]
async fn get_job(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<JobView>, ApiError> {
    Ok(Json(
        job_view(&state, &OwnerId(key.owner), &job_id(&id)?).await?,
    ))
}

/// The owner's job's attempts, in order.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}/attempts",
    tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The job's attempts", body = AttemptList),
        (status = 401, description = "No or an unknown API key", body = ProblemView, content_type = "application/problem+json"),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = ProblemView, content_type = "application/problem+json"),
        (status = 404, description = "No such job of this owner", body = ProblemView, content_type = "application/problem+json"),
    )
)]
async fn get_attempts(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<AttemptList>, ApiError> {
    let attempts = state
        .inner
        .store
        .attempts(&OwnerId(key.owner), &job_id(&id)?)
        .await?;
    Ok(Json(AttemptList::of(&attempts)))
}

/// A new attempt at the job, if no attempt is open and it has not succeeded.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/retry",
    tag = "jobs",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 202, description = "A new attempt started", body = JobView),
        (status = 400, description = "The job's input no longer fits its contract", body = ProblemView, content_type = "application/problem+json"),
        (status = 401, description = "No or an unknown API key", body = ProblemView, content_type = "application/problem+json"),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = ProblemView, content_type = "application/problem+json"),
        (status = 404, description = "No such job of this owner", body = ProblemView, content_type = "application/problem+json"),
        (status = 409, description = "An attempt is still open, or the job is settled", body = ProblemView, content_type = "application/problem+json"),
        (status = 503, description = "No provider of the route is certified for its contract now", body = ProblemView, content_type = "application/problem+json"),
    )
)]
async fn retry(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let owner = OwnerId(key.owner);
    let job_id = job_id(&id)?;
    crate::service::retry(&state, &owner, &job_id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(job_view(&state, &owner, &job_id).await?),
    )
        .into_response())
}

/// Resolves an open attempt out of band (admin keys only).
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/attempts/{n}/cancel",
    tag = "jobs",
    params(
        ("id" = String, Path, description = "The job's id"),
        ("n" = i64, Path, description = "The attempt's ordinal"),
    ),
    responses(
        (status = 200, description = "The attempt is cancelled", body = JobView),
        (status = 400, description = "A path that does not fit", body = ProblemView, content_type = "application/problem+json"),
        (status = 401, description = "No or an unknown API key", body = ProblemView, content_type = "application/problem+json"),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = ProblemView, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key", body = ProblemView, content_type = "application/problem+json"),
        (status = 404, description = "No such job or attempt of this owner", body = ProblemView, content_type = "application/problem+json"),
        (status = 409, description = "The attempt is not open", body = ProblemView, content_type = "application/problem+json"),
    )
)]
async fn cancel(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams((id, n)): PathParams<(String, i64)>,
) -> Result<Json<JobView>, ApiError> {
    if !key.admin {
        return Err(ApiError::new(
            Problem::Forbidden,
            "cancelling an attempt out of band needs an admin key",
        ));
    }
    let owner = OwnerId(key.owner.clone());
    let job_id = job_id(&id)?;
    crate::service::cancel(&state, &owner, &job_id, n).await?;
    Ok(Json(job_view(&state, &owner, &job_id).await?))
}

/// Providers with their certification per contract, and the routes.
#[utoipa::path(
    get,
    path = "/v1/providers",
    tag = "providers",
    responses(
        (status = 200, description = "Providers and routes", body = ProviderList),
        (status = 401, description = "No or an unknown API key", body = ProblemView, content_type = "application/problem+json"),
        (status = 429, description = "This owner's rate or concurrency limit (Retry-After says when)", body = ProblemView, content_type = "application/problem+json"),
    )
)]
async fn providers(State(state): State<AppState>, _caller: Caller) -> Json<ProviderList> {
    Json(crate::service::provider_list(&state))
}

/// Alive.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()), responses((status = 200, description = "Alive", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Ready when a manifest is in force.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "A manifest is in force and the database answers", body = Readiness),
        (status = 503, description = "No valid manifest, or the database is down", body = Readiness),
    )
)]
async fn readyz(State(state): State<AppState>) -> Response {
    let manifest = state.inner.manifest.current();
    let database =
        match tokio::time::timeout(state.inner.database_timeout, state.inner.store.ping()).await {
            Ok(Ok(())) => None,
            // In words, without the driver's text (addresses, users): the
            // details are for the log, not for whoever asks /readyz.
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "/readyz: the database did not answer its ping");
                Some(
                    match e.outage() {
                        Some(surety_store::Outage::Full) => "it is full",
                        Some(surety_store::Outage::Unavailable) => "it cannot be reached",
                        None => "it refused the round trip",
                    }
                    .to_owned(),
                )
            }
            Err(_) => Some(format!(
                "no answer within {} ms",
                state.inner.database_timeout.as_millis()
            )),
        };
    let ready = manifest.is_some() && database.is_none();
    let body = Readiness {
        ready,
        database: if database.is_none() { "up" } else { "down" }.to_owned(),
        database_error: database,
        manifest_entries: manifest.as_ref().map(|m| m.entries.len()),
        manifest_generated_at: manifest.as_ref().map(|m| m.generated_at.clone()),
        last_reload_refused: state.inner.manifest.refused(),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "operations", security(()), responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
async fn metrics(State(state): State<AppState>) -> Response {
    let m = &state.inner.metrics;
    match state.inner.store.unknown_attempts().await {
        Ok(n) => m.unknown_attempts_open.set(n),
        Err(e) => tracing::warn!(error = %e, "cannot count unknown attempts"),
    }
    if let Some(manifest) = state.inner.manifest.current() {
        m.manifest_entries.set(manifest.entries.len() as i64);
        if let Ok(at) = surety_manifest::parse_time(&manifest.generated_at) {
            m.manifest_age_seconds
                .set((time::OffsetDateTime::now_utc() - at).whole_seconds());
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
        .into_response()
}

/// This document, derived from the handlers and the configured routes.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()), responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
async fn openapi(axum::Extension(doc): axum::Extension<Arc<Value>>) -> Json<Arc<Value>> {
    Json(doc)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    /// Tidy: every API route is registered through `routes!` with its
    /// `#[utoipa::path]`, so none can be served undocumented. The operator's
    /// HTML pages (`ui.rs`, under `/ui`) are not API, and only they may.
    #[test]
    fn no_route_is_registered_outside_the_openapi_router() {
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                match path.is_dir() {
                    true => dirs.push(path),
                    false if path.ends_with("ui.rs") => {}
                    false => files.push(path),
                }
            }
        }
        assert!(files.len() > 5, "{files:?}");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            // Spelled in pieces, so this test does not find itself.
            let found = [
                concat!(".rou", "te(\""),
                concat!(".ne", "st(\""),
                concat!(".rou", "te_service("),
            ]
            .iter()
            .find(|pattern| text.contains(*pattern));
            assert!(
                found.is_none(),
                "{} registers a route with `{}`; use `.routes(routes!(handler))`",
                path.display(),
                found.unwrap_or(&"")
            );
        }
    }
}
