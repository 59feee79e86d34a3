//! The pages that change something: a confirmation page for each act
//! (cancel an open attempt, retry a job, reinstate a demoted provider),
//! whose form carries the session's CSRF token and whose action is built
//! from the parsed job id or the configured provider and contract, never
//! the raw path; and the POST that does the act, through the same
//! operations as the API.

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use surety_store::JobId;

use super::page;
use super::session::{Operator, Token, acting, operator, to_sign_in};
use super::views::ConfirmPage;
use crate::http::error::{ApiError, Problem};
use crate::http::extract::job_id;
use crate::state::AppState;

/// An act an operator confirms.
#[derive(Debug, Clone)]
enum Act {
    /// Cancel attempt `n` of a job.
    Cancel(JobId, i64),
    Retry(JobId),
    /// Lift the router's demotion of a provider for a contract.
    Reinstate {
        provider: String,
        contract: String,
    },
}

impl Act {
    /// The page's title.
    fn title(&self) -> String {
        match self {
            Act::Cancel(id, n) => format!("Cancel attempt {n} of job {id}?"),
            Act::Retry(id) => format!("Retry job {id}?"),
            Act::Reinstate { provider, contract } => {
                format!("Reinstate {provider} for {contract}?")
            }
        }
    }

    fn explain(&self) -> &'static str {
        match self {
            Act::Cancel(..) => {
                "The provider may have done the work: cancel only once you know it did not (or that it does not matter). The attempt becomes cancelled, a late answer from it loses, and the job may be retried."
            }
            Act::Retry(_) => {
                "A new attempt starts at the route's first certified provider, under the same job."
            }
            Act::Reinstate { .. } => {
                "The router's own checks found this provider breaking the contract (the reason is on the previous page). Reinstated, it is eligible again as far as its certification goes, for new jobs and failover, on every replica; the next live checks judge it afresh. Your reason is recorded with the reinstate."
            }
        }
    }

    fn confirm(&self) -> &'static str {
        match self {
            Act::Cancel(..) => "Yes, cancel the attempt",
            Act::Retry(_) => "Yes, retry the job",
            Act::Reinstate { .. } => "Yes, reinstate the provider",
        }
    }

    /// Whether the form asks for a reason, recorded with the act.
    fn asks_reason(&self) -> bool {
        matches!(self, Act::Reinstate { .. })
    }

    /// Where the form posts.
    fn action(&self) -> String {
        match self {
            Act::Cancel(id, n) => format!("/ui/jobs/{id}/attempts/{n}/cancel"),
            Act::Retry(id) => format!("/ui/jobs/{id}/retry"),
            Act::Reinstate { provider, contract } => {
                format!("/ui/certification/{provider}/{contract}/reinstate")
            }
        }
    }

    /// Where "go back" goes: the page the act was asked from.
    fn back(&self) -> String {
        match self {
            Act::Cancel(id, _) | Act::Retry(id) => format!("/ui/jobs/{id}"),
            Act::Reinstate { provider, contract } => {
                format!("/ui/certification/{provider}/{contract}")
            }
        }
    }

    /// Where the operator goes once it is done (after a retry, the job's
    /// page waiting for the new attempt's outcome).
    fn after(&self) -> String {
        match self {
            Act::Retry(id) => format!("/ui/jobs/{id}?wait=10"),
            Act::Cancel(..) | Act::Reinstate { .. } => self.back(),
        }
    }

    /// Does it, as the operator `op` may, with the form's `reason`.
    async fn run(&self, state: &AppState, op: &Operator, reason: &str) -> Result<(), ApiError> {
        match self {
            Act::Cancel(id, n) => {
                let owner = op.owner_of(state, id).await?;
                crate::jobs::cancel(state, &owner, id, *n).await?;
            }
            Act::Retry(id) => {
                let owner = op.owner_of(state, id).await?;
                crate::jobs::retry(state, &owner, id).await?;
            }
            Act::Reinstate { provider, contract } => {
                let by = format!("an admin of {}, on the operator pages", op.owner);
                crate::live::reinstate(state, (provider, contract), &by, reason).await?;
            }
        }
        Ok(())
    }
}

/// The reinstate of `provider` for `contract`: both as the configuration
/// names them (anything else is not found), so the form's action is built
/// from configured ids, never from the raw path.
fn reinstating(state: &AppState, provider: &str, contract: &str) -> Result<Act, ApiError> {
    match state.inner.configured(provider, contract) {
        Some((provider, served)) => Ok(Act::Reinstate {
            provider: provider.to_owned(),
            contract: served.contract.id.clone(),
        }),
        None => Err(not_configured(provider, contract)),
    }
}

/// The 404 of a provider and contract the configuration does not name.
pub(super) fn not_configured(provider: &str, contract: &str) -> ApiError {
    ApiError::new(
        Problem::NotFound,
        format!("no provider `{provider}` with a contract `{contract}` here"),
    )
}

/// The question before `act`, with `error` when a try failed.
fn confirmation(op: &Operator, act: &Act, error: Option<String>) -> Response {
    let status = match error {
        Some(_) => StatusCode::CONFLICT,
        None => StatusCode::OK,
    };
    page(
        status,
        "confirm.html",
        ConfirmPage {
            operator: op.view(),
            title: &act.title(),
            explain: act.explain(),
            confirm: act.confirm(),
            action: &act.action(),
            back: &act.back(),
            asks_reason: act.asks_reason(),
            error,
        },
    )
}

/// The confirmation page of `act` (a 404 for a target that cannot be one).
fn ask(state: &AppState, headers: &HeaderMap, act: Result<Act, ApiError>) -> Response {
    let act = match act {
        Ok(act) => act,
        Err(e) => return e.into_response(),
    };
    match operator(state, headers) {
        Some(op) => confirmation(&op, &act, None),
        None => to_sign_in(),
    }
}

/// What a confirmation's form sends: the session's CSRF token and, where
/// the act asks for one, a reason.
#[derive(Deserialize)]
pub(super) struct Confirmed {
    /// Missing is refused as any other token that does not match.
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

/// `act`, for the operator whose session token the form carries; then to
/// where the act leads, or back to the question saying why not.
async fn act(
    state: &AppState,
    headers: &HeaderMap,
    form: Confirmed,
    act: Result<Act, ApiError>,
) -> Response {
    let token = Token { csrf: form.csrf };
    let op = match acting(state, headers, &token) {
        Ok(op) => op,
        Err(refused) => return refused.into_response(),
    };
    let act = match act {
        Ok(act) => act,
        Err(e) => return e.into_response(),
    };
    match act.run(state, &op, &form.reason).await {
        Ok(()) => Redirect::to(&act.after()).into_response(),
        Err(e) => confirmation(&op, &act, Some(e.detail)),
    }
}

pub(super) async fn confirm_cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
) -> Response {
    ask(&state, &headers, job_id(&id).map(|id| Act::Cancel(id, n)))
}

pub(super) async fn confirm_retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    ask(&state, &headers, job_id(&id).map(Act::Retry))
}

pub(super) async fn confirm_reinstate(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((provider, contract)): Path<(String, String)>,
) -> Response {
    let act = reinstating(&state, &provider, &contract);
    ask(&state, &headers, act)
}

pub(super) async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
    Form(form): Form<Confirmed>,
) -> Response {
    let target = job_id(&id).map(|id| Act::Cancel(id, n));
    act(&state, &headers, form, target).await
}

pub(super) async fn retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Confirmed>,
) -> Response {
    act(&state, &headers, form, job_id(&id).map(Act::Retry)).await
}

pub(super) async fn reinstate(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((provider, contract)): Path<(String, String)>,
    Form(form): Form<Confirmed>,
) -> Response {
    let target = reinstating(&state, &provider, &contract);
    act(&state, &headers, form, target).await
}
