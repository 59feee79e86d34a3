//! Driving a job: an attempt at the first eligible provider of its route; a
//! definite failure moves to the next eligible one; a timeout makes the
//! attempt (and the job) `unknown` and stops there, while the router keeps
//! listening for the late result, which goes through compare-and-swap like
//! any other. Hedging starts one extra attempt after `hedge_after`, only for
//! contracts without side effects.

use std::sync::Arc;

use surety_providers::Message;
use surety_store::{AttemptHandle, JobId, OwnerId, Slot, StartAttempt};
use tracing::Instrument;

mod attempt;

use attempt::{Judge, attempt};

use crate::certification::{Eligible, ServedContract};
use crate::config::Route;
use crate::settled::Snapshot;
use crate::state::AppState;

/// How one attempt ended, for the dispatcher.
#[derive(Debug, Clone)]
pub enum End {
    /// The answer is the job's; with the job as that commit left it when
    /// the store read it there.
    Won(Option<Snapshot>),
    Lost,
    /// A definite failure, with the provider to fail over to: the next of
    /// the job's providers that is eligible as the attempt ended, and its
    /// place in the list (`None`: none is, and the job failed).
    Failed(Option<(usize, Eligible)>),
    Unknown,
}

/// What drives one job.
#[derive(Debug, Clone)]
pub struct Drive {
    pub owner: OwnerId,
    pub job_id: JobId,
    pub route: Route,
    pub served: Arc<ServedContract>,
    /// What every attempt sends: the contract's rendered prompt (or, on an
    /// output-only facade route, the client's messages). Each attempt's
    /// request is built from them by `surety_exchange::request`, the
    /// harness's own builder, for its provider.
    pub messages: Vec<Message>,
    /// The name of the API key that asked, whose budgets each attempt
    /// charges beside its owner's.
    pub key_name: Option<String>,
    /// The client's `anthropic-beta` (an output-only Messages job's), sent
    /// with every attempt to the kinds that take it.
    pub anthropic_beta: Option<String>,
    /// The job's input: what a rule of the contract may read (a refund
    /// within the order's total).
    pub input: Arc<serde_json::Value>,
    /// An attempt already started (with the job, or by a retry), at `providers[0]`.
    pub first: Option<AttemptHandle>,
    /// The route's providers eligible when the job was taken, in order.
    /// Each later attempt asks again, as the manifest and the configuration
    /// are when it starts: a certificate that lapsed or a provider
    /// reconfigured since is not tried.
    pub providers: Arc<[Eligible]>,
}

impl Drive {
    /// What an attempt at `at`, the job's `place`-th provider, is judged by.
    fn judge(&self, at: &Eligible, place: usize) -> Judge {
        Judge {
            served: self.served.clone(),
            models: at.models.clone(),
            providers: self.providers.clone(),
            input: self.input.clone(),
            place,
            shadow: self
                .route
                .shadow
                .as_ref()
                .map(|_| (self.route.clone(), self.messages.clone())),
        }
    }
}

/// Drives the job on a task of the router's own.
pub fn spawn(state: AppState, drive: Drive) {
    let tasks = state.inner.tasks.clone();
    // Boxed, as a new job's task is (`jobs::intake`): the dispatch's
    // future is large, and a task's inline future is copied as it runs.
    tasks.spawn(Box::pin(async move { self::drive(&state, drive).await }));
}

/// Drives the job to its end and wakes whoever waits on it.
pub async fn drive(state: &AppState, drive: Drive) {
    let span = tracing::info_span!("job", job_id = %drive.job_id);
    let job_id = drive.job_id.clone();
    let snapshot = run(state, drive).instrument(span).await;
    state.inner.settled.settle(&job_id, snapshot);
}

/// What an unknown attempt's provider said when the reconciler asked it,
/// recorded as the attempt's own answer would have been: judged by the
/// same check, made the job's by the same compare-and-swap (a late answer
/// racing it settles once), and a definite end fails over as the
/// attempt's own failure would have, to the next of `drive.providers` after
/// `place` (the attempt's) that is eligible as it ends.
pub async fn resolve(
    state: &AppState,
    drive: Drive,
    (handle, place): (AttemptHandle, usize),
    found: (
        Result<surety_providers::ChatResponse, surety_providers::ProviderError>,
        Option<String>,
    ),
) {
    let Some(at) = drive.providers.get(place) else {
        return;
    };
    let judge = drive.judge(at, place);
    let job_id = drive.job_id.clone();
    match attempt::record(state, &handle, found, &judge).await {
        End::Won(snapshot) => state.inner.settled.settle(&job_id, snapshot),
        End::Failed(Some((next, _))) => {
            // The job goes on from there, each attempt asking for
            // eligibility as it starts.
            let providers = drive.providers[next..].to_vec().into();
            self::drive(
                state,
                Drive {
                    first: None,
                    providers,
                    ..drive
                },
            )
            .await;
        }
        End::Failed(None) | End::Lost | End::Unknown => state.inner.settled.notify(&job_id),
    }
}

/// Drives the job to its end; the job as its winning commit left it, when
/// the store read it there.
async fn run(state: &AppState, drive: Drive) -> Option<Snapshot> {
    let mut handle = drive.first.clone();
    // The first attempt was started at `providers[0]` as the job was taken;
    // without one, the first provider eligible now.
    let found = match &handle {
        Some(_) => drive.providers.first().cloned().map(|p| (0, p)),
        None => {
            let Ok(certifier) = state.inner.certifier().await else {
                tracing::warn!(job_id = %drive.job_id, "the demotions cannot be read: no attempt starts");
                return None;
            };
            drive.providers.iter().enumerate().find_map(|(i, p)| {
                certifier
                    .eligible_now(&p.id, &drive.served)
                    .map(|now| (i, now))
            })
        }
    };
    let (mut i, mut at) = found?;
    loop {
        let handle_now = match handle.take() {
            Some(handle) => handle,
            None => start(state, &drive, &at, Slot::Primary).await?,
        };
        let attempt_at = |handle: AttemptHandle, at: &Eligible, place: usize| {
            attempt(
                state.clone(),
                handle,
                (drive.messages.clone(), drive.anthropic_beta.clone()),
                drive.judge(at, place),
            )
        };
        let contract = &drive.served.contract;
        let hedge_at = drive.providers.get(i + 1).filter(|_| contract.hedgeable());
        let end = match (drive.route.hedge_after, hedge_at) {
            (Some(after), Some(hedge_provider)) => {
                let primary = attempt_at(handle_now, &at, i);
                tokio::pin!(primary);
                tokio::select! {
                    end = &mut primary => end,
                    () = tokio::time::sleep(after) => {
                        // The hedge asks for eligibility as it starts, too
                        // (a demotion it cannot read starts no hedge).
                        let now = match state.inner.certifier().await {
                            Ok(certifier) => certifier.eligible_now(&hedge_provider.id, &drive.served),
                            Err(_) => None,
                        };
                        match now {
                            None => primary.await,
                            // A hedge that does not start (the job won
                            // meanwhile, or the database refused it) leaves
                            // the primary to finish, never abandoned.
                            Some(hedge_provider) => match start(state, &drive, &hedge_provider, Slot::Hedge).await {
                                None => primary.await,
                                Some(hedge) => {
                                    let hedged = attempt_at(hedge, &hedge_provider, i + 1);
                                    let (a, b) = tokio::join!(primary, hedged);
                                    match (a, b) {
                                        (End::Failed(_), End::Failed(next)) => End::Failed(next),
                                        (End::Failed(_), other) | (other, _) => other,
                                    }
                                }
                            },
                        }
                    }
                }
            }
            _ => attempt_at(handle_now, &at, i).await,
        };
        match end {
            End::Won(snapshot) => return snapshot,
            End::Lost | End::Unknown | End::Failed(None) => return None,
            End::Failed(Some((next, now))) => (i, at) = (next, now),
        }
    }
}

async fn start(
    state: &AppState,
    drive: &Drive,
    at: &Eligible,
    slot: Slot,
) -> Option<AttemptHandle> {
    let charges = state
        .inner
        .charges(
            &at.id,
            &drive.served,
            &drive.messages,
            (&drive.owner.0, drive.key_name.as_deref()),
        )
        .await;
    let start = StartAttempt {
        provider: at.id.clone(),
        slot,
        lease: state.inner.settings.lease,
        trust: Some(at.trust(&drive.served.contract.id)),
        charges,
    };
    match state
        .inner
        .store
        .start_attempt(&drive.owner, &drive.job_id, &start)
        .await
    {
        Ok(handle) => Some(handle),
        // No call is made: the job waits, queued, for an operator's retry
        // once the budget has room (its failed attempts stand).
        Err(e @ surety_store::StoreError::OverBudget { .. }) => {
            let refusal = state
                .inner
                .refused(&e, &drive.owner.0, drive.key_name.as_deref());
            tracing::warn!(job_id = %drive.job_id, refusal = %refusal.detail, "no attempt started: over budget");
            None
        }
        Err(e) => {
            tracing::info!(job_id = %drive.job_id, error = %e, "no attempt started");
            None
        }
    }
}
