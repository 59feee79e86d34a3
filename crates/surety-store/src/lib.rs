//! surety's durable store: jobs and attempts on SQLite or PostgreSQL.
//!
//! One interface, two engines. The guarantees live in the schema and in
//! single guarded statements (see `migrations/` and `sql.rs`):
//! - one job per `(owner_id, idempotency_key)`, by a unique constraint;
//! - at most one open attempt per job and slot (slot 1 being the hedge), by a
//!   partial unique index, and the hedge slot only on jobs that allow it, by a
//!   composite foreign key and a check;
//! - completion by compare-and-swap on the job's version, fenced by the
//!   finishing attempt still being open, with `rows_affected` checked;
//! - leases on the database's clock.
//!
//! Architecture invariant: this crate owns SQL. Nothing else writes a query.

mod batch;
#[cfg(test)]
mod batch_pg;
mod conn;
mod error;
mod model;
mod ops;
mod sql;
mod sqlite;
mod store;
mod trust;

pub use error::{Outage, StoreError};
pub use model::{
    Answer, Attempt, AttemptHandle, AttemptRef, BudgetStatus, Charge, Cost, Created, Demotion,
    Finish, Job, JobId, JobKind, Lift, LiveOutcome, LiveResult, LiveSource, LiveVerdict, NewJob,
    Outcome, OwnerId, Question, Race, Reservation, Slot, Spend, StartAttempt, Trust, Unit,
    UnknownAttempt,
};
pub use store::{Backend, SqliteSync, Store, StoreOptions};

/// The statements, for the benchmark's raw-driver baseline only.
#[doc(hidden)]
pub use sql::{Returning, Sql};
