//! Wakes the requests waiting on a job (`Prefer: wait`, chat completions)
//! when this router settles it, and only those: a job's waiters share one
//! [`Notify`], kept while someone waits on it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use surety_store::JobId;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, broadcast};

/// The jobs somebody waits on.
#[derive(Debug)]
pub struct Settled {
    /// Each job waited on, with its waiters' count.
    waiting: Mutex<HashMap<JobId, (Arc<Notify>, usize)>>,
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
    fn waiting(&self) -> MutexGuard<'_, HashMap<JobId, (Arc<Notify>, usize)>> {
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
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(job_id.clone());
        }
        let notify = self.waiting().get(job_id).map(|(notify, _)| notify.clone());
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    /// Starts waiting on `job_id`. Call it before reading the job's state:
    /// a notification between the two is kept for [`Waiter::changed`].
    pub fn watch(self: &Arc<Self>, job_id: &JobId) -> Waiter {
        let notify = {
            let mut waiting = self.waiting();
            let entry = waiting
                .entry(job_id.clone())
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        let mut waiter = Waiter {
            settled: self.clone(),
            job_id: job_id.clone(),
            notified: Box::pin(notify.clone().notified_owned()),
            notify,
        };
        waiter.notified.as_mut().enable();
        waiter
    }
}

/// A request waiting on one job.
pub struct Waiter {
    settled: Arc<Settled>,
    job_id: JobId,
    notify: Arc<Notify>,
    notified: Pin<Box<OwnedNotified>>,
}

impl Waiter {
    /// Resolves when the job was notified since the last call (or since
    /// [`Settled::watch`]).
    pub async fn changed(&mut self) {
        self.notified.as_mut().await;
        let mut next = Box::pin(self.notify.clone().notified_owned());
        next.as_mut().enable();
        self.notified = next;
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
}
