//! The pages that change something: a confirmation page for each act
//! (cancel an open attempt, retry a job), whose form carries the session's
//! CSRF token and whose action is built from the parsed job id.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use surety_store::{JobId, OwnerId};

use super::page;
use super::session::{Operator, Token, acting, operator, to_sign_in};
use super::views::ConfirmPage;
use crate::http::error::ApiError;
use crate::http::extract::job_id;
use crate::state::AppState;

/// What a confirmation page asks, and where its form goes.
pub(super) struct Confirm<'a> {
    title: String,
    explain: &'a str,
    confirm: &'a str,
    action: String,
}

pub(super) fn confirmation(
    op: &Operator,
    job_id: &str,
    ask: &Confirm<'_>,
    error: Option<String>,
) -> Response {
    let status = match error {
        Some(_) => StatusCode::CONFLICT,
        None => StatusCode::OK,
    };
    page(
        status,
        "confirm.html",
        ConfirmPage {
            operator: op.view(),
            job_id,
            title: &ask.title,
            explain: ask.explain,
            confirm: ask.confirm,
            action: &ask.action,
            error,
        },
    )
}

pub(super) fn cancel_question(id: &str, n: i64) -> Confirm<'static> {
    Confirm {
        title: format!("Cancel attempt {n} of job {id}?"),
        explain: "The provider may have done the work: cancel only once you know it did not (or that it does not matter). The attempt becomes cancelled, a late answer from it loses, and the job may be retried.",
        confirm: "Yes, cancel the attempt",
        action: format!("/ui/jobs/{id}/attempts/{n}/cancel"),
    }
}

pub(super) fn retry_question(id: &str) -> Confirm<'static> {
    Confirm {
        title: format!("Retry job {id}?"),
        explain: "A new attempt starts at the route's first certified provider, under the same job.",
        confirm: "Yes, retry the job",
        action: format!("/ui/jobs/{id}/retry"),
    }
}

pub(super) async fn confirm_cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
) -> Response {
    // The form's action is built from the parsed id, never the raw path.
    if let Err(e) = job_id(&id) {
        return e.into_response();
    }
    match operator(&state, &headers) {
        Some(op) => confirmation(&op, &id, &cancel_question(&id, n), None),
        None => to_sign_in(),
    }
}

pub(super) async fn confirm_retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = job_id(&id) {
        return e.into_response();
    }
    match operator(&state, &headers) {
        Some(op) => confirmation(&op, &id, &retry_question(&id), None),
        None => to_sign_in(),
    }
}

/// After an action: to `after`, or back to its question, saying why not.
pub(super) fn answered(
    op: &Operator,
    job_id: &str,
    question: &Confirm<'_>,
    done: Result<(), ApiError>,
    after: &str,
) -> Response {
    match done {
        Ok(()) => Redirect::to(after).into_response(),
        Err(e) => confirmation(op, job_id, question, Some(e.detail)),
    }
}

/// A form that acts on job `id`: the operator whose token it carries, and
/// the parsed job id with the owner this operator may act for; else the
/// answer that refuses it.
pub(super) async fn acting_on(
    state: &AppState,
    headers: &HeaderMap,
    form: &Token,
    id: &str,
) -> Result<(Operator, Result<(OwnerId, JobId), ApiError>), Response> {
    let op = acting(state, headers, form).map_err(IntoResponse::into_response)?;
    let job_id = job_id(id).map_err(IntoResponse::into_response)?;
    let owner = op
        .owner_of(state, &job_id)
        .await
        .map(|owner| (owner, job_id));
    Ok((op, owner))
}

pub(super) async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
    Form(form): Form<Token>,
) -> Response {
    let (op, found) = match acting_on(&state, &headers, &form, &id).await {
        Ok(acting) => acting,
        Err(refused) => return refused,
    };
    let done = match found {
        Ok((owner, job_id)) => crate::jobs::cancel(&state, &owner, &job_id, n)
            .await
            .map_err(ApiError::from),
        Err(e) => Err(e),
    };
    let after = format!("/ui/jobs/{id}");
    answered(&op, &id, &cancel_question(&id, n), done, &after)
}

pub(super) async fn retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Token>,
) -> Response {
    let (op, found) = match acting_on(&state, &headers, &form, &id).await {
        Ok(acting) => acting,
        Err(refused) => return refused,
    };
    let done = match found {
        Ok((owner, job_id)) => crate::jobs::retry(&state, &owner, &job_id)
            .await
            .map_err(ApiError::from),
        Err(e) => Err(e),
    };
    // The job's page shows the outcome once the new attempt has one.
    let after = format!("/ui/jobs/{id}?wait=10");
    answered(&op, &id, &retry_question(&id), done, &after)
}
