//! The store's errors: every refusal is typed and says why.

use surety_core::{AttemptState, TransitionError};

use crate::JobId;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job {0} not found")]
    JobNotFound(JobId),
    #[error("attempt {ordinal} of job {job_id} not found")]
    AttemptNotFound { job_id: JobId, ordinal: i64 },
    #[error(
        "attempt {ordinal} of job {job_id} is still {state}; it must be resolved (a late result or an out-of-band cancel) before another attempt starts"
    )]
    AttemptOpen {
        job_id: JobId,
        ordinal: i64,
        state: AttemptState,
    },
    #[error("hedging refused for job {job_id}: {reason}")]
    HedgeRefused { job_id: JobId, reason: &'static str },
    #[error(
        "the lease of attempt {ordinal} of job {job_id} has expired; the reaper will mark it unknown"
    )]
    LeaseExpired { job_id: JobId, ordinal: i64 },
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("unsupported database URL scheme `{0}`: expected sqlite: or postgres:")]
    UnsupportedUrl(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the write was not committed: {0}")]
    NotCommitted(String),
    #[error("the store is closed")]
    Closed,
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("a stored row does not read back: {0}")]
    Corrupt(String),
}
