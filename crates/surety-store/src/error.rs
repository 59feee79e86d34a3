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
    #[error(
        "provider `{provider}` has an open demotion on contract `{contract}` newer than its certification: no attempt starts there"
    )]
    Demoted { provider: String, contract: String },
    #[error(
        "budget `{budget}` cannot hold this attempt's worst case of {asked}: {spent} spent and {held} held of its {limit}"
    )]
    OverBudget {
        budget: String,
        limit: i64,
        spent: i64,
        held: i64,
        asked: i64,
        /// The oldest bucket that counts and holds spend (when a rolling
        /// window frees room).
        oldest_bucket_ms: Option<i64>,
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
    #[error("the write was not committed: {reason}")]
    NotCommitted {
        reason: String,
        /// Why, where the database is away or full.
        outage: Option<Outage>,
    },
    /// The database away or full, as the statement that carried several
    /// callers' writes together met it (the same for each of them): whether
    /// it committed is as unknown as for a statement of one's own.
    #[error("database error: {reason}")]
    Away { reason: String, outage: Outage },
    #[error("the store is closed")]
    Closed,
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("a stored row does not read back: {0}")]
    Corrupt(String),
}

/// Why the database cannot take a write now, where waiting may help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// It cannot be reached, refuses connections, or dropped them.
    Unavailable,
    /// It has no room: the disk, or the size the operator allows, is full.
    Full,
}

impl StoreError {
    /// A write not committed, with the reason the engine gave.
    pub(crate) fn not_committed(reason: impl Into<String>) -> StoreError {
        StoreError::NotCommitted {
            reason: reason.into(),
            outage: None,
        }
    }

    /// Whether this error is the database being away or full, rather than
    /// a refusal of the request: the same request may succeed later.
    pub fn outage(&self) -> Option<Outage> {
        match self {
            StoreError::Database(e) => sqlx_outage(e),
            StoreError::Sqlite(e) => sqlite_outage(e),
            StoreError::NotCommitted { outage, .. } => *outage,
            StoreError::Away { outage, .. } => Some(*outage),
            StoreError::Closed => Some(Outage::Unavailable),
            _ => None,
        }
    }
}

fn sqlx_outage(error: &sqlx::Error) -> Option<Outage> {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Some(Outage::Unavailable),
        sqlx::Error::Protocol(_) => Some(Outage::Unavailable),
        sqlx::Error::Database(e) => {
            let code = e.code()?;
            match &*code {
                // disk_full, out_of_memory, insufficient_resources
                "53100" | "53200" | "53000" => Some(Outage::Full),
                // admin_shutdown, crash_shutdown, cannot_connect_now,
                // too_many_connections, a database not accepting
                // connections (ALLOW_CONNECTIONS false), read-only replica.
                "57P01" | "57P02" | "57P03" | "53300" | "55000" | "25006" => {
                    Some(Outage::Unavailable)
                }
                // connection_exception and its subclasses.
                c if c.starts_with("08") => Some(Outage::Unavailable),
                _ => None,
            }
        }
        _ => None,
    }
}

pub(crate) fn sqlite_outage(error: &rusqlite::Error) -> Option<Outage> {
    match error.sqlite_error_code()? {
        rusqlite::ErrorCode::DiskFull => Some(Outage::Full),
        rusqlite::ErrorCode::DatabaseBusy
        | rusqlite::ErrorCode::DatabaseLocked
        | rusqlite::ErrorCode::CannotOpen
        | rusqlite::ErrorCode::SystemIoFailure
        | rusqlite::ErrorCode::ReadOnly => Some(Outage::Unavailable),
        _ => None,
    }
}
