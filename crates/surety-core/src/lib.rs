//! surety's domain: jobs, attempts, their state machines, the Idempotency-Key
//! syntax and the intent fingerprint.
//!
//! Architecture invariant: this crate does no IO. It knows nothing of SQL,
//! HTTP or providers; the crates at the edges translate to and from it.

mod fingerprint;
mod key;
mod state;

pub use fingerprint::{Fingerprint, FingerprintError, Intent};
pub use key::{IdempotencyKey, KeyError};
pub use state::{
    AttemptEvent, AttemptState, JobEvent, JobState, ParseStateError, TransitionError,
    attempt_after, job_after,
};
