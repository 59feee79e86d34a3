//! The native job API: create or replay (`POST /v1/jobs`), read a job and
//! its attempts, retry, and an admin's cancel of an attempt.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use surety_store::{JobId, JobKind, OwnerId};

use super::error::{ApiError, Problem};
use super::extract::{Caller, JsonObject, PathParams, idempotency_key, job_id};
use super::responses::{Full, Limited, NoSuchJob, Unauthorized, Unavailable, Uncertified};
use super::views::{AttemptList, CreateJob, JobView, ProblemView};
use crate::jobs::{Intake, create_or_replay, route_and_contract, wait_at_rest};
use crate::state::AppState;

/// The longest `Prefer: wait` honoured, in seconds.
const MAX_WAIT: u64 = 60;

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
        (status = 409, description = "The key names a job with a different request", body = ProblemView, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemView, content_type = "application/problem+json"),
        (status = 415, description = "The body is not application/json", body = ProblemView, content_type = "application/problem+json"),
        (status = 422, description = "No such route", body = ProblemView, content_type = "application/problem+json"),
        (status = 431, description = "The headers are too large", body = ProblemView, content_type = "application/problem+json"),
        Unauthorized, Limited, Uncertified, Full
    )
)]
pub(super) async fn create_job(
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
    let intake = Intake::new(
        (owner.clone(), key.name.clone(), idempotency),
        (route, served.clone()),
        request.input,
        JobKind::Native,
        surety_exchange::messages(&rendered),
    );
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
#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = String, Path, description = "The job's id")), responses((status = 200, description = "The job", body = JobView), Unauthorized, Limited, NoSuchJob, Unavailable))]
pub(super) async fn get_job(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<JobView>, ApiError> {
    Ok(Json(
        job_view(&state, &OwnerId(key.owner), &job_id(&id)?).await?,
    ))
}

/// The owner's job's attempts, in order.
#[utoipa::path(get, path = "/v1/jobs/{id}/attempts", tag = "jobs", params(("id" = String, Path, description = "The job's id")), responses((status = 200, description = "The job's attempts", body = AttemptList), Unauthorized, Limited, NoSuchJob, Unavailable))]
pub(super) async fn get_attempts(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams(id): PathParams<String>,
) -> Result<Json<AttemptList>, ApiError> {
    let (owner, id) = (OwnerId(key.owner), job_id(&id)?);
    let attempts = state.inner.store.attempts(&owner, &id).await?;
    let questions = state.inner.store.questions(&owner, &id).await?;
    let reservations = state.inner.store.reservations(&owner, &id).await?;
    Ok(Json(AttemptList::of(&attempts, &questions, &reservations)))
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
        (status = 409, description = "An attempt is still open, or the job is settled", body = ProblemView, content_type = "application/problem+json"),
        Unauthorized, Limited, NoSuchJob, Uncertified, Full
    )
)]
pub(super) async fn retry(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let owner = OwnerId(key.owner);
    let job_id = job_id(&id)?;
    crate::jobs::retry(&state, &owner, &job_id).await?;
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
        (status = 403, description = "Not an admin key", body = ProblemView, content_type = "application/problem+json"),
        (status = 404, description = "No such job or attempt of this owner", body = ProblemView, content_type = "application/problem+json"),
        (status = 409, description = "The attempt is not open", body = ProblemView, content_type = "application/problem+json"),
        Unauthorized, Limited, Unavailable, Full
    )
)]
pub(super) async fn cancel(
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
    crate::jobs::cancel(&state, &owner, &job_id, n).await?;
    Ok(Json(job_view(&state, &owner, &job_id).await?))
}

/// The owner's job with its attempts, as the API shows it.
async fn job_view(state: &AppState, owner: &OwnerId, id: &JobId) -> Result<JobView, ApiError> {
    let (job, attempts) = state.inner.store.job_and_attempts(owner, id).await?;
    Ok(JobView::of(&job, &attempts))
}
