//! What the handlers do, apart from HTTP: find a route and its contract,
//! decide the certified providers, create or replay a job and dispatch it on
//! the router's own tasks, wait for it to come to rest, and say what a
//! stored job sends. The handlers (`api.rs`, `facade.rs`) stay thin: they
//! extract, call these, and shape the answer.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use surety_core::{Fingerprint, IdempotencyKey};
use surety_providers::{Facade, Message};
use surety_store::{Attempt, Created, Job, JobId, JobKind, NewJob, OwnerId, Slot, StartAttempt};
use tracing::Instrument;

use crate::config::Route;
use crate::dispatch::{self, Drive, Eligible};
use crate::error::{ApiError, Problem};
use crate::settled::Waiter;
use crate::views::{CertificationView, DriftView, JobView, ProviderList, ProviderView, RouteView};
use crate::{AppState, ServedContract};

/// A route and its contract, by the route's id.
pub(crate) fn route_and_contract<'s>(
    state: &'s AppState,
    id: &str,
) -> Result<(Route, &'s Arc<ServedContract>), ApiError> {
    let route = state
        .inner
        .routes
        .get(id)
        .cloned()
        .ok_or_else(|| ApiError::new(Problem::UnknownRoute, format!("no route `{id}`")))?;
    let contract = state
        .inner
        .contracts
        .get(&route.contract)
        .ok_or_else(|| ApiError::internal("a route names a missing contract"))?;
    Ok((route, contract))
}

/// The route's providers the manifest certifies for its contract now, in
/// order; never empty: with none, a 503 saying why each is not.
pub(crate) fn certified(
    state: &AppState,
    route: &Route,
    served: &ServedContract,
) -> Result<Vec<Eligible>, ApiError> {
    let contract = &served.contract;
    let (eligible, why_not) = dispatch::eligible(state, route, served);
    if eligible.is_empty() {
        return Err(ApiError::new(
            Problem::NoCertifiedProvider,
            format!(
                "no provider of route `{}` is certified for `{}` at {}: {}",
                route.id,
                contract.id,
                contract.digest,
                why_not.join("; ")
            ),
        ));
    }
    Ok(eligible)
}

/// A job as a create request found or made it.
pub(crate) struct CreatedJob {
    pub(crate) job: Job,
    pub(crate) replayed: bool,
    /// Registered before the job was dispatched, when asked for.
    pub(crate) waiter: Option<Waiter>,
}

/// What a create request asks for, checked.
pub(crate) struct Intake {
    pub(crate) owner: OwnerId,
    pub(crate) key: IdempotencyKey,
    pub(crate) route: Route,
    pub(crate) served: Arc<ServedContract>,
    pub(crate) input: Value,
    /// Over the whole request (chat completions); by default over the
    /// route and the input.
    pub(crate) fingerprint: Option<Fingerprint>,
    /// How the job is asked for, recorded with it.
    pub(crate) kind: JobKind,
    /// The messages are not the contract's rendering of the input (an
    /// output-only chat route): they are kept with the job, for its retries.
    pub(crate) keep_messages: bool,
    /// What the job's attempts send (see [`Drive::messages`]).
    pub(crate) messages: Vec<Message>,
}

/// Finds the job this owner's key already names (a replay, or a conflict),
/// whatever the manifest says now; or creates the job with its first
/// attempt at the first certified provider, in one commit. A new job is
/// dispatched at once, after the waiter (`watch`) is registered.
pub(crate) async fn create_or_replay(
    state: &AppState,
    intake: Intake,
    watch: bool,
) -> Result<CreatedJob, ApiError> {
    // Once asked for, a job's creation and dispatch run on the router's own
    // task, whatever becomes of this request: a client that goes away
    // between the commit and the dispatch cannot strand a committed job.
    let detached = state.clone();
    state
        .inner
        .tasks
        .spawn(async move { create_and_dispatch(&detached, intake, watch).await }.in_current_span())
        .await
        .map_err(ApiError::internal)?
}

pub(crate) async fn create_and_dispatch(
    state: &AppState,
    intake: Intake,
    watch: bool,
) -> Result<CreatedJob, ApiError> {
    let contract = &intake.served.contract;
    let new = NewJob {
        owner: intake.owner.clone(),
        key: intake.key,
        route: intake.route.id.clone(),
        contract: contract.id.clone(),
        contract_digest: contract.digest.clone(),
        input: intake.input,
        kind: intake.kind,
        messages: match intake.keep_messages {
            true => Some(serde_json::to_value(&intake.messages).map_err(ApiError::internal)?),
            false => None,
        },
        hedgeable: contract.hedgeable(),
        fingerprint: intake.fingerprint,
    };
    let conflict = |state: &AppState| {
        state.inner.metrics.conflicts.inc();
        ApiError::new(
            Problem::IdempotencyConflict,
            "this Idempotency-Key already names a job with a different request; use a new key for a new intent",
        )
    };
    // A replay is answered from the store alone: only a new job needs a
    // certified provider. (The insert below still decides between two
    // requests racing for the same key.)
    let found = match state.inner.store.find(&new).await? {
        Some(Created::Replayed(job)) => Some(job),
        Some(Created::Conflict) => return Err(conflict(state)),
        Some(Created::New(_)) | None => None,
    };
    let (job, first, replayed, providers) = match found {
        Some(job) => (job, None, true, Vec::new()),
        None => {
            let providers = certified(state, &intake.route, &intake.served)?;
            let first = StartAttempt {
                provider: providers
                    .first()
                    .map(|p| p.id.clone())
                    .ok_or_else(|| ApiError::internal("no eligible provider"))?,
                slot: Slot::Primary,
                lease: state.inner.lease,
            };
            match state.inner.store.create_and_start(&new, &first).await? {
                (Created::New(job), first) => (job, first, false, providers),
                (Created::Replayed(job), _) => (job, None, true, providers),
                (Created::Conflict, _) => return Err(conflict(state)),
            }
        }
    };
    let waiter = watch.then(|| state.inner.settled.watch(&job.id));
    if replayed {
        state.inner.metrics.replays.inc();
    } else {
        state.inner.metrics.jobs_created.inc();
        tracing::info!(job_id = %job.id, owner = %new.owner, route = %new.route, "job created");
        let drive = Drive {
            owner: intake.owner,
            job_id: job.id.clone(),
            route: intake.route,
            served: intake.served.clone(),
            messages: intake.messages,
            first,
            providers: providers.into(),
        };
        dispatch::spawn(state.clone(), drive);
    }
    Ok(CreatedJob {
        job,
        replayed,
        waiter,
    })
}

/// Nothing more happens to the job on its own: settled, or unknown (which
/// waits for a late result or an admin).
pub(crate) fn at_rest(state: surety_core::JobState) -> bool {
    state.is_settled() || state == surety_core::JobState::Unknown
}

/// Waits until the job is at rest or `limit` passes, and returns whether it
/// is, with the job and its attempts as they are then. The waiter was
/// registered before the job was dispatched, so a job this request just
/// created is running and nothing is read until it settles; a replay's job
/// may have moved since it was read, so it is read again first. Without a
/// waiter (the client did not ask to wait), the job as it is now, with true.
pub(crate) async fn wait_at_rest(
    state: &AppState,
    owner: &OwnerId,
    seen: CreatedJob,
    limit: Duration,
) -> Result<(bool, Job, Vec<Attempt>), ApiError> {
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
        read_now = true;
    }
}

pub(crate) async fn job_view(
    state: &AppState,
    owner: &OwnerId,
    id: &JobId,
) -> Result<JobView, ApiError> {
    let (job, attempts) = state.inner.store.job_and_attempts(owner, id).await?;
    Ok(JobView::of(&job, &attempts))
}

/// What a stored job's attempts send: the messages kept with it (a chat
/// job on an output-only route), else its contract's rendering of its
/// input. Read from what the job recorded, never guessed from its input.
pub(crate) fn job_messages(job: &Job, served: &ServedContract) -> Result<Vec<Message>, String> {
    match &job.messages {
        Some(kept) => serde_json::from_value(kept.clone())
            .map_err(|e| format!("the job's kept messages do not read back: {e}")),
        None => served
            .contract
            .render(&job.input)
            .map(|r| surety_exchange::messages(&r))
            .map_err(|e| e.to_string()),
    }
}

/// Every provider with its certification per contract (in words, from the
/// manifest against the configuration now), and the routes.
pub(crate) fn provider_list(state: &AppState) -> ProviderList {
    let drift = state
        .inner
        .drift
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let manifest = state.inner.manifest.current();
    let data = state
        .inner
        .providers
        .iter()
        .map(|(id, served)| {
            let certification = state
                .inner
                .contracts
                .values()
                .map(|c| {
                    let (verdict, models) = dispatch::eligibility(state, id, c);
                    let expires_at = manifest
                        .as_ref()
                        .and_then(|m| m.entry(id, &c.contract.id))
                        .map(|e| e.expires_at.clone());
                    let view = CertificationView {
                        status: verdict.code().to_owned(),
                        reason: verdict.to_string(),
                        expires_at,
                        certified_models: models,
                    };
                    (c.contract.id.clone(), view)
                })
                .collect();
            ProviderView {
                id: id.clone(),
                kind: served.config.kind.to_string(),
                model: served.config.model.clone(),
                base_url: served.config.base_url.clone(),
                certification,
                drift: drift.get(id).map(|d| DriftView {
                    contract: d.contract.clone(),
                    model: d.model.clone(),
                    certified_models: d.certified.clone(),
                    at: d.at.clone(),
                }),
            }
        })
        .collect();
    let routes = state
        .inner
        .routes
        .values()
        .map(|r| {
            // A pinned route whose user template cannot be read back takes
            // no chat completion at all, and says why.
            let unpinnable = state
                .inner
                .contracts
                .get(&r.contract)
                .and_then(|c| c.user_template.as_ref().err());
            RouteView {
                id: r.id.clone(),
                contract: r.contract.clone(),
                providers: r.providers.clone(),
                facade: r.facade.as_str().to_owned(),
                prompt_certified: r.facade == Facade::Pinned,
                pinning_unavailable: unpinnable.filter(|_| r.facade == Facade::Pinned).cloned(),
            }
        })
        .collect();
    ProviderList {
        object: "list".to_owned(),
        data,
        routes,
    }
}

/// A new attempt at the owner's job, at its first certified provider, if no
/// attempt is open and it has not succeeded (the store's guard decides).
pub(crate) async fn retry(
    state: &AppState,
    owner: &OwnerId,
    job_id: &JobId,
) -> Result<(), ApiError> {
    let job = state.inner.store.job(owner, job_id).await?;
    let (route, served) = route_and_contract(state, &job.route)?;
    let eligible = certified(state, &route, served)?;
    let contract = &served.contract;
    // Built before the attempt starts: an input that no longer fits its
    // contract starts nothing.
    let messages = job_messages(&job, served).map_err(|e| {
        ApiError::new(
            Problem::MalformedBody,
            format!(
                "the job's input does not fit contract `{}` now: {e}",
                contract.id
            ),
        )
    })?;
    let first = &eligible[0];
    // The store's guard decides: an open attempt or a settled job is a 409 saying which.
    let start = StartAttempt {
        provider: first.id.clone(),
        slot: Slot::Primary,
        lease: state.inner.lease,
    };
    let handle = state
        .inner
        .store
        .start_attempt(owner, &job.id, &start)
        .await?;
    dispatch::spawn(
        state.clone(),
        Drive {
            owner: owner.clone(),
            job_id: job.id.clone(),
            route,
            served: served.clone(),
            messages,
            first: Some(handle),
            providers: eligible.into(),
        },
    );
    Ok(())
}

/// Resolves an open attempt of the owner's job out of band (an admin's
/// act): it is `cancelled`, and a late answer from it loses.
pub(crate) async fn cancel(
    state: &AppState,
    owner: &OwnerId,
    job_id: &JobId,
    n: i64,
) -> Result<(), ApiError> {
    let reason = format!("cancelled out of band by an admin of {}", owner.0);
    state
        .inner
        .store
        .cancel_attempt(owner, job_id, n, &reason)
        .await?;
    let attempts = state.inner.store.attempts(owner, job_id).await?;
    let provider = attempts
        .iter()
        .find(|a| a.ordinal == n)
        .map_or("", |a| a.provider.as_str());
    state
        .inner
        .metrics
        .attempts
        .with_label_values(&[provider, "cancelled"])
        .inc();
    state.inner.settled.notify(job_id);
    Ok(())
}
