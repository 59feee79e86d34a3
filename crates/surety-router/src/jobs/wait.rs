//! Waiting for a job to come to rest, woken by this router's settle
//! notifications and re-reading for jobs another replica drives.

use std::sync::Arc;
use std::time::Duration;

use surety_store::{Attempt, Job, OwnerId};

use super::JobError;
use super::intake::CreatedJob;
use crate::state::AppState;

/// Nothing more happens to the job on its own: settled, or unknown (which
/// waits for a late result or an admin).
pub fn at_rest(state: surety_core::JobState) -> bool {
    state.is_settled() || state == surety_core::JobState::Unknown
}

/// Waits until the job is at rest or `limit` passes, and returns whether it
/// is, with the job and its attempts as they are then. The waiter was
/// registered before the job was dispatched, so a job this request just
/// created is running and nothing is read until it settles (and not then,
/// when it settled here with none of its attempts open); a replay's job
/// may have moved since it was read, so it is read again first. Without a
/// waiter (the client did not ask to wait), the job as it is now, with true.
pub async fn wait_at_rest(
    state: &AppState,
    owner: &OwnerId,
    seen: CreatedJob,
    limit: Duration,
) -> Result<(bool, Job, Vec<Attempt>), JobError> {
    let id = seen.job.id;
    let read = async || state.inner.store.job_and_attempts(owner, &id).await;
    let Some(mut waiter) = seen.waiter else {
        let (job, attempts) = read().await?;
        return Ok((true, job, attempts));
    };
    let deadline = tokio::time::Instant::now() + limit;
    let mut read_now = seen.replayed;
    loop {
        if read_now {
            let (job, attempts) = read().await?;
            if at_rest(job.state) {
                return Ok((true, job, attempts));
            }
        }
        // Woken when this router settles the job; re-read now and then for
        // jobs another replica drives.
        let wake = tokio::time::timeout(Duration::from_millis(250), waiter.changed());
        if tokio::time::timeout_at(deadline, wake).await.is_err() {
            let (job, attempts) = read().await?;
            return Ok((at_rest(job.state), job, attempts));
        }
        // A job this router settled with none of its attempts open comes
        // as that commit left it: nothing can change it any more.
        if let Some(snapshot) = waiter.snapshot() {
            let (job, attempts) = Arc::unwrap_or_clone(snapshot);
            return Ok((true, job, attempts));
        }
        read_now = true;
    }
}
