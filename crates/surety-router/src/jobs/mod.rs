//! Jobs, apart from HTTP: find a route and its contract, decide the
//! certified providers, create or replay a job and dispatch it on the
//! router's own tasks, wait for it to come to rest, retry it, cancel an
//! attempt. The handlers (`http`, `ui`) stay thin: they extract, call
//! these, and shape the answer; this layer's errors are its own
//! ([`JobError`]), which each surface renders in its own format.

mod intake;
mod manage;
pub mod reconcile;
mod wait;

pub use intake::{CreatedJob, Demotions, Intake, certified, create_or_replay, route_and_contract};
pub use manage::{BETA_KEPT, anthropic_beta, cancel, job_messages, retry};
pub use wait::wait_at_rest;

/// Why a job operation did not happen; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("no route `{0}`")]
    UnknownRoute(String),
    #[error("no provider of route `{route}` is certified for `{contract}` at {digest}: {why}")]
    NoCertifiedProvider {
        route: String,
        contract: String,
        digest: String,
        /// Why each of the route's providers is not, joined.
        why: String,
    },
    #[error(
        "this Idempotency-Key already names a job with a different request; use a new key for a new intent"
    )]
    Conflict,
    #[error("the job's input does not fit contract `{contract}` now: {why}")]
    NoLongerFits { contract: String, why: String },
    /// A budget of the job's has no room for its attempt's worst case.
    #[error("{}", .0.detail)]
    OverBudget(crate::spend::Refusal),
    #[error(transparent)]
    Store(#[from] surety_store::StoreError),
    /// A bug or a broken invariant, in words for the log.
    #[error("{0}")]
    Internal(String),
}

impl JobError {
    pub(crate) fn internal(e: impl std::fmt::Display) -> JobError {
        JobError::Internal(e.to_string())
    }
}
