//! Several callers' writes in one statement (PostgreSQL).
//!
//! PostgreSQL's cost per job is the work of each statement (planning,
//! executor start, commit), not its durable flush: `cargo xtask profile
//! router` on PostgreSQL and pgbench both measure it (ARCHITECTURE.md, the
//! store). So the two statements every job makes — its insert with its
//! first attempt, and the compare-and-swap of its result — take every
//! caller waiting for the same statement at once, as SQLite's writer thread
//! takes every caller waiting for a commit.
//!
//! No caller waits for company: a batch leaves as soon as one of its
//! statements' slots is free, with whatever queued meanwhile, so one caller
//! alone pays no delay, and many share each statement. Each batch runs on a
//! task of its own, so a caller that goes away cannot stop the others' write.
//! Each caller is answered only after the statement that holds its write
//! has committed (or failed), and gets its own answer.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

#[cfg(test)]
use crate::Outage;
use crate::StoreError;

/// An item's answer, sent back to the caller waiting for it.
type Reply<O> = oneshot::Sender<Result<O, StoreError>>;

/// Takes items from many callers and runs them in batches.
#[derive(Debug)]
pub(crate) struct Batcher<I, O> {
    queue: mpsc::UnboundedSender<(I, Reply<O>)>,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the batcher on the current runtime: at most `most` items per
    /// batch, at most `in_flight` batches running at once. `run` answers a
    /// batch, an answer per item in its order.
    pub(crate) fn start<F, Fut>(most: usize, in_flight: usize, run: F) -> Batcher<I, O>
    where
        F: Fn(Vec<I>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<Result<O, StoreError>>> + Send + 'static,
    {
        let (queue, mut waiting) = mpsc::unbounded_channel::<(I, Reply<O>)>();
        let slots = Arc::new(Semaphore::new(in_flight.max(1)));
        tokio::spawn(async move {
            loop {
                // A free slot first: items queue while every slot is busy,
                // and the next batch takes all of them.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    break;
                };
                let Some(first) = waiting.recv().await else {
                    break;
                };
                let mut batch = vec![first];
                while batch.len() < most {
                    match waiting.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let (items, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
                let answers = run(items);
                tokio::spawn(async move {
                    let mut answers = answers.await.into_iter();
                    for reply in replies {
                        let answer = answers.next().unwrap_or_else(|| {
                            Err(StoreError::Corrupt(
                                "a batch answered fewer items than it took".to_owned(),
                            ))
                        });
                        // A caller that went away needs no answer.
                        let _ = reply.send(answer);
                    }
                    drop(slot);
                });
            }
        });
        Batcher { queue }
    }

    /// Queues `item`; its answer comes on the receiver. The item comes back
    /// when the batcher is gone (the runtime that started it has stopped),
    /// for the caller to run it alone.
    pub(crate) fn submit(&self, item: I) -> Result<oneshot::Receiver<Result<O, StoreError>>, I> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((item, reply))
            .map_err(|refused| refused.0.0)?;
        Ok(answer)
    }
}

/// The answer a caller waits for; a batch task that ended without one (its
/// runtime stopping) is the store being closed.
pub(crate) async fn answer<O>(
    answer: oneshot::Receiver<Result<O, StoreError>>,
) -> Result<O, StoreError> {
    answer.await.unwrap_or(Err(StoreError::Closed))
}

/// What each item of a batch gets when its statement failed for every item
/// alike: the database away or full. `None` when the failure may be one
/// item's (a row a rule refused), for the caller to run each alone.
pub(crate) fn shared_failure<T>(
    error: &StoreError,
    items: usize,
) -> Option<Vec<Result<T, StoreError>>> {
    let outage = error.outage()?;
    Some(
        (0..items)
            .map(|_| {
                Err(StoreError::Away {
                    reason: error.to_string(),
                    outage,
                })
            })
            .collect(),
    )
}

/// What each item of a batch gets when its statement never ran (no
/// connection): nothing was written.
pub(crate) fn none_ran<T>(error: &StoreError, items: usize) -> Vec<Result<T, StoreError>> {
    (0..items)
        .map(|_| {
            Err(StoreError::NotCommitted {
                reason: error.to_string(),
                outage: error.outage(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Every batch a batcher was given, in order.
    type Seen = Arc<Mutex<Vec<Vec<u32>>>>;

    /// A batcher whose batches are held until the test lets each go (`go`),
    /// and which records every batch it was given and says when each began.
    fn held(
        in_flight: usize,
    ) -> (
        Batcher<u32, u32>,
        Seen,
        mpsc::UnboundedSender<()>,
        mpsc::UnboundedReceiver<()>,
    ) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (go, gate) = mpsc::unbounded_channel::<()>();
        let gate = Arc::new(tokio::sync::Mutex::new(gate));
        let (started, started_rx) = mpsc::unbounded_channel::<()>();
        let record = seen.clone();
        let batcher = Batcher::start(3, in_flight, move |items: Vec<u32>| {
            record.lock().unwrap().push(items.clone());
            let (gate, started) = (gate.clone(), started.clone());
            async move {
                started.send(()).unwrap();
                gate.lock().await.recv().await;
                items.into_iter().map(|i| Ok(i * 10)).collect()
            }
        });
        (batcher, seen, go, started_rx)
    }

    #[tokio::test]
    async fn what_queues_while_every_slot_is_busy_leaves_together_and_each_gets_its_own_answer() {
        let (batcher, seen, go, mut started) = held(1);
        let first = batcher.submit(1).unwrap();
        started.recv().await.unwrap();
        // The one slot is busy: these wait, and leave as one batch of at
        // most three, then the rest.
        let waiting: Vec<_> = (2..=5).map(|i| batcher.submit(i).unwrap()).collect();
        go.send(()).unwrap();
        assert_eq!(answer(first).await.unwrap(), 10);
        started.recv().await.unwrap();
        go.send(()).unwrap();
        started.recv().await.unwrap();
        go.send(()).unwrap();
        let mut answers = Vec::new();
        for w in waiting {
            answers.push(answer(w).await.unwrap());
        }
        assert_eq!(answers, [20, 30, 40, 50]);
        assert_eq!(*seen.lock().unwrap(), [vec![1], vec![2, 3, 4], vec![5]]);
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_costs_the_others_nothing() {
        let (batcher, seen, go, mut started) = held(2);
        let gone = batcher.submit(1).unwrap();
        started.recv().await.unwrap();
        drop(gone);
        let kept = batcher.submit(2).unwrap();
        started.recv().await.unwrap();
        go.send(()).unwrap();
        go.send(()).unwrap();
        assert_eq!(answer(kept).await.unwrap(), 20);
        // Both ran, each on a slot of its own: nobody waited for company.
        assert_eq!(*seen.lock().unwrap(), [vec![1], vec![2]]);
    }

    #[test]
    fn a_batcher_whose_runtime_stopped_gives_the_item_back() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let batcher: Batcher<u32, u32> = runtime.block_on(async {
            Batcher::start(4, 1, |items: Vec<u32>| async move {
                items.into_iter().map(Ok).collect()
            })
        });
        drop(runtime);
        assert_eq!(batcher.submit(7).unwrap_err(), 7);
    }

    #[test]
    fn a_shared_failure_is_each_items_own_and_only_for_an_outage() {
        let away = StoreError::Database(sqlx::Error::PoolTimedOut);
        let each = shared_failure::<()>(&away, 3).unwrap();
        assert_eq!(each.len(), 3);
        assert!(each.iter().all(|e| matches!(
            e,
            Err(StoreError::Away {
                outage: Outage::Unavailable,
                ..
            })
        )));
        let refused = StoreError::Corrupt("one row".to_owned());
        assert!(shared_failure::<()>(&refused, 3).is_none());
        let none = none_ran::<()>(&refused, 2);
        assert!(
            none.iter()
                .all(|e| matches!(e, Err(StoreError::NotCommitted { outage: None, .. })))
        );
    }
}
