//! Wakes the requests waiting on a job (`Prefer: wait`, chat completions)
//! when this router settles it, and only those: a job's waiters share one
//! [`Notify`], kept while someone waits on it. A job settled by a commit
//! that left none of its attempts open comes with that commit's view of it
//! (a [`Snapshot`]): nothing can change it any more, so its waiters answer
//! from it without reading the job again.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use surety_store::{Attempt, Job, JobId};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, broadcast};

/// A settled job and its attempts as the commit that settled it left
/// them, none open.
pub type Snapshot = Arc<(Job, Vec<Attempt>)>;

/// What a job's waiters share: the wake-up, and the job as it settled.
#[derive(Debug, Default)]
struct Watched {
    notify: Arc<Notify>,
    settled: std::sync::OnceLock<Snapshot>,
}

/// The jobs somebody waits on.
#[derive(Debug)]
pub struct Settled {
    /// Each job waited on, with its waiters' count.
    waiting: Mutex<HashMap<JobId, (Arc<Watched>, usize)>>,
    /// Every job settled here, for observers that do not know the id yet.
    events: broadcast::Sender<JobId>,
}

impl Default for Settled {
    fn default() -> Settled {
        Settled {
            waiting: Mutex::default(),
            events: broadcast::channel(1024).0,
        }
    }
}

impl Settled {
    fn waiting(&self) -> MutexGuard<'_, HashMap<JobId, (Arc<Watched>, usize)>> {
        // The map holds no invariant a panic could break.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every job settled here from now on (an observer's view; requests
    /// wait with [`Settled::watch`]).
    pub fn subscribe(&self) -> broadcast::Receiver<JobId> {
        self.events.subscribe()
    }

    /// Wakes whoever waits on `job_id` now.
    pub fn notify(&self, job_id: &JobId) {
        self.settle(job_id, None);
    }

    /// Wakes whoever waits on `job_id` now, giving them the job as it
    /// settled when `snapshot` holds it (none of its attempts open).
    pub fn settle(&self, job_id: &JobId, snapshot: Option<Snapshot>) {
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(job_id.clone());
        }
        let watched = self
            .waiting()
            .get(job_id)
            .map(|(watched, _)| watched.clone());
        if let Some(watched) = watched {
            if let Some(snapshot) = snapshot.filter(|s| s.1.iter().all(|a| !a.state.is_open())) {
                let _ = watched.settled.set(snapshot);
            }
            watched.notify.notify_waiters();
        }
    }

    /// Starts waiting on `job_id`. Call it before reading the job's state:
    /// a notification between the two is kept for [`Waiter::changed`].
    pub fn watch(self: &Arc<Self>, job_id: &JobId) -> Waiter {
        let watched = {
            let mut waiting = self.waiting();
            let entry = waiting
                .entry(job_id.clone())
                .or_insert_with(|| (Arc::default(), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        Waiter {
            settled: self.clone(),
            job_id: job_id.clone(),
            notified: notified(&watched),
            watched,
        }
    }
}

/// A wake-up of `watched`'s waiters, registered at once: a notification
/// from now on is kept for it.
fn notified(watched: &Watched) -> Pin<Box<OwnedNotified>> {
    let mut notified = Box::pin(watched.notify.clone().notified_owned());
    notified.as_mut().enable();
    notified
}

/// A request waiting on one job.
pub struct Waiter {
    settled: Arc<Settled>,
    job_id: JobId,
    watched: Arc<Watched>,
    notified: Pin<Box<OwnedNotified>>,
}

impl Waiter {
    /// Resolves when the job was notified since the last call (or since
    /// [`Settled::watch`]).
    pub async fn changed(&mut self) {
        self.notified.as_mut().await;
        self.notified = notified(&self.watched);
    }

    /// The job as it settled, when it settled here with none of its
    /// attempts open.
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.watched.settled.get().cloned()
    }
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("job_id", &self.job_id)
            .finish_non_exhaustive()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut waiting = self.settled.waiting();
        let last = match waiting.get_mut(&self.job_id) {
            Some((_, count)) => {
                *count -= 1;
                *count == 0
            }
            None => false,
        };
        if last {
            waiting.remove(&self.job_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_notification_before_the_wait_is_kept_and_others_are_not_woken() {
        let settled = Arc::new(Settled::default());
        let (a, b) = (JobId("a".to_owned()), JobId("b".to_owned()));
        let mut on_a = settled.watch(&a);
        let mut on_b = settled.watch(&b);
        settled.notify(&a);
        on_a.changed().await;
        // b was not notified: its wait is still pending.
        let pending = tokio::time::timeout(std::time::Duration::ZERO, on_b.changed()).await;
        assert!(pending.is_err(), "b woke without a notification");
        drop((on_a, on_b));
        assert!(settled.waiting().is_empty(), "waiters left entries behind");
    }

    #[tokio::test]
    async fn every_waiter_of_a_job_wakes_and_the_entry_outlives_the_first() {
        let settled = Arc::new(Settled::default());
        let job = JobId("j".to_owned());
        let mut first = settled.watch(&job);
        let mut second = settled.watch(&job);
        settled.notify(&job);
        first.changed().await;
        second.changed().await;
        drop(first);
        assert_eq!(settled.waiting().len(), 1, "the second still waits");
        drop(second);
        assert!(settled.waiting().is_empty());
    }

    fn settled_job(id: &JobId, open: bool) -> Snapshot {
        use surety_core::{AttemptState, Fingerprint, JobState};
        let job = Job {
            id: id.clone(),
            owner: surety_store::OwnerId("acme".to_owned()),
            key: "k".to_owned(),
            route: "r".to_owned(),
            contract: "c".to_owned(),
            contract_digest: "sha256:0".to_owned(),
            input: serde_json::json!({}),
            fingerprint: Fingerprint::from_stored("00".to_owned()),
            hedgeable: true,
            state: JobState::Succeeded,
            version: 1,
            result: Some(serde_json::json!({"ok": true})),
            completed_by: Some(1),
            created_at_ms: 0,
            updated_at_ms: 0,
            completion: None,
            kind: surety_store::JobKind::Native,
            messages: None,
            request: None,
            deleted_at_ms: None,
        };
        let attempt = |ordinal, state| Attempt {
            job_id: id.clone(),
            ordinal,
            slot: surety_store::Slot::Primary,
            provider: "p".to_owned(),
            state,
            base_version: 0,
            started_at_ms: 0,
            lease_expires_at_ms: 0,
            unknown_since_ms: None,
            finished_at_ms: None,
            error: None,
            provider_response_id: None,
            asked_at_ms: None,
        };
        let second = match open {
            true => AttemptState::Started,
            false => AttemptState::Lost,
        };
        Arc::new((
            job,
            vec![attempt(1, AttemptState::Succeeded), attempt(2, second)],
        ))
    }

    #[tokio::test]
    async fn a_job_settled_with_no_attempt_open_comes_with_its_view_and_only_then() {
        let settled = Arc::new(Settled::default());
        let (done, hedged) = (JobId("done".to_owned()), JobId("hedged".to_owned()));
        let mut on_done = settled.watch(&done);
        let mut on_hedged = settled.watch(&hedged);
        settled.settle(&done, Some(settled_job(&done, false)));
        // An attempt still open may yet change: its waiters read the job.
        settled.settle(&hedged, Some(settled_job(&hedged, true)));
        on_done.changed().await;
        on_hedged.changed().await;
        let view = on_done.snapshot().expect("the settled view");
        assert_eq!(view.0.id, done);
        assert!(
            on_hedged.snapshot().is_none(),
            "a view with an open attempt was given"
        );
        // A later waiter on a job nobody watched is given nothing stale.
        drop((on_done, on_hedged));
        assert!(settled.watch(&done).snapshot().is_none());
    }
}
