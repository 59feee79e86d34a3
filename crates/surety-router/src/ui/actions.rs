//! The pages that change something: a confirmation page for each act
//! (cancel an open attempt, retry a job), whose form carries the session's
//! CSRF token and whose action is built from the parsed job id; and the
//! POST that does the act, through the same `jobs` operations as the API.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use surety_store::JobId;

use super::page;
use super::session::{Operator, Token, acting, operator, to_sign_in};
use super::views::ConfirmPage;
use crate::http::error::ApiError;
use crate::http::extract::job_id;
use crate::state::AppState;

/// An act on a job.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// Cancel attempt `n`.
    Cancel(i64),
    Retry,
}

impl Act {
    /// The page's title, for job `id`.
    fn title(self, id: &JobId) -> String {
        match self {
            Act::Cancel(n) => format!("Cancel attempt {n} of job {id}?"),
            Act::Retry => format!("Retry job {id}?"),
        }
    }

    fn explain(self) -> &'static str {
        match self {
            Act::Cancel(_) => {
                "The provider may have done the work: cancel only once you know it did not (or that it does not matter). The attempt becomes cancelled, a late answer from it loses, and the job may be retried."
            }
            Act::Retry => {
                "A new attempt starts at the route's first certified provider, under the same job."
            }
        }
    }

    fn confirm(self) -> &'static str {
        match self {
            Act::Cancel(_) => "Yes, cancel the attempt",
            Act::Retry => "Yes, retry the job",
        }
    }

    /// Where the form posts: built from the parsed id, never the raw path.
    fn action(self, id: &JobId) -> String {
        match self {
            Act::Cancel(n) => format!("/ui/jobs/{id}/attempts/{n}/cancel"),
            Act::Retry => format!("/ui/jobs/{id}/retry"),
        }
    }

    /// Where the operator goes once it is done: the job's page (after a
    /// retry, waiting for the new attempt's outcome).
    fn after(self, id: &JobId) -> String {
        match self {
            Act::Cancel(_) => format!("/ui/jobs/{id}"),
            Act::Retry => format!("/ui/jobs/{id}?wait=10"),
        }
    }

    /// Does it, as the operator `op` may.
    async fn run(self, state: &AppState, op: &Operator, id: &JobId) -> Result<(), ApiError> {
        let owner = op.owner_of(state, id).await?;
        match self {
            Act::Cancel(n) => crate::jobs::cancel(state, &owner, id, n).await?,
            Act::Retry => crate::jobs::retry(state, &owner, id).await?,
        }
        Ok(())
    }
}

/// The question before `act` on job `id`, with `error` when a try failed.
fn confirmation(op: &Operator, id: &JobId, act: Act, error: Option<String>) -> Response {
    let status = match error {
        Some(_) => StatusCode::CONFLICT,
        None => StatusCode::OK,
    };
    page(
        status,
        "confirm.html",
        ConfirmPage {
            operator: op.view(),
            job_id: &id.0,
            title: &act.title(id),
            explain: act.explain(),
            confirm: act.confirm(),
            action: &act.action(id),
            error,
        },
    )
}

/// The confirmation page of `act` on job `raw` (a 404 for an id that
/// cannot be one).
async fn ask(state: &AppState, headers: &HeaderMap, raw: &str, act: Act) -> Response {
    let id = match job_id(raw) {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    match operator(state, headers) {
        Some(op) => confirmation(&op, &id, act, None),
        None => to_sign_in(),
    }
}

/// `act` on job `raw`, for the operator whose session token the form
/// carries; then to the job's page, or back to the question saying why not.
async fn act(state: &AppState, headers: &HeaderMap, form: &Token, raw: &str, act: Act) -> Response {
    let op = match acting(state, headers, form) {
        Ok(op) => op,
        Err(refused) => return refused.into_response(),
    };
    let id = match job_id(raw) {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    match act.run(state, &op, &id).await {
        Ok(()) => Redirect::to(&act.after(&id)).into_response(),
        Err(e) => confirmation(&op, &id, act, Some(e.detail)),
    }
}

pub(super) async fn confirm_cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
) -> Response {
    ask(&state, &headers, &id, Act::Cancel(n)).await
}

pub(super) async fn confirm_retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    ask(&state, &headers, &id, Act::Retry).await
}

pub(super) async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
    Form(form): Form<Token>,
) -> Response {
    act(&state, &headers, &form, &id, Act::Cancel(n)).await
}

pub(super) async fn retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Token>,
) -> Response {
    act(&state, &headers, &form, &id, Act::Retry).await
}
