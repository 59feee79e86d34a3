//! Acting on a job after it was taken: a retry (a new attempt under the
//! same job, at a provider certified now) and an admin's cancel of an open
//! attempt.

use surety_providers::Message;
use surety_store::{Job, JobId, OwnerId, Slot, StartAttempt};

use super::JobError;
use super::intake::{Demotions, certified, route_and_contract};
use crate::certification::ServedContract;
use crate::dispatch::{self, Drive};
use crate::state::AppState;

/// What a stored job's attempts send: the messages kept with it (a chat
/// job on an output-only route), else its contract's rendering of its
/// input. Read from what the job recorded, never guessed from its input.
pub fn job_messages(job: &Job, served: &ServedContract) -> Result<Vec<Message>, String> {
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

/// Where a Messages job keeps its client's `anthropic-beta`: a key of the
/// job's kept request.
pub const BETA_KEPT: &str = "anthropic_beta";

/// The client's `anthropic-beta` a Messages job keeps for its attempts
/// (an output-only route's), as it sent it.
pub fn anthropic_beta(
    kind: surety_store::JobKind,
    request: Option<&serde_json::Value>,
) -> Option<String> {
    match kind {
        surety_store::JobKind::Messages => request?[BETA_KEPT].as_str().map(str::to_owned),
        _ => None,
    }
}

/// A new attempt at the owner's job, at its first certified provider, if no
/// attempt is open and it has not succeeded (the store's guard decides).
pub async fn retry(state: &AppState, owner: &OwnerId, job_id: &JobId) -> Result<(), JobError> {
    let job = state.inner.store.job(owner, job_id).await?;
    let (route, served) = route_and_contract(state, &job.route)?;
    let eligible = certified(state, &route, served, Demotions::Read).await?;
    let contract = &served.contract;
    // Built before the attempt starts: an input that no longer fits its
    // contract starts nothing.
    let messages = job_messages(&job, served).map_err(|e| JobError::NoLongerFits {
        contract: contract.id.clone(),
        why: e,
    })?;
    let first = &eligible[0];
    // The job's budgets (its key's, as its reservations name it) are
    // charged as for any attempt.
    let key_name = state.inner.key_of_job(owner, &job.id).await;
    let charges = state
        .inner
        .charges(
            &first.id,
            served,
            &messages,
            (&owner.0, key_name.as_deref()),
        )
        .await;
    // The store's guard decides: an open attempt or a settled job is a 409 saying which.
    let start = StartAttempt {
        provider: first.id.clone(),
        slot: Slot::Primary,
        lease: state.inner.settings.lease,
        trust: Some(first.trust(&contract.id)),
        charges,
    };
    let handle = match state
        .inner
        .store
        .start_attempt(owner, &job.id, &start)
        .await
    {
        Ok(handle) => handle,
        Err(e @ surety_store::StoreError::OverBudget { .. }) => {
            return Err(JobError::OverBudget(state.inner.refused(
                &e,
                &owner.0,
                key_name.as_deref(),
            )));
        }
        Err(e) => return Err(e.into()),
    };
    dispatch::spawn(
        state.clone(),
        Drive {
            owner: owner.clone(),
            job_id: job.id.clone(),
            route,
            served: served.clone(),
            messages,
            key_name,
            anthropic_beta: anthropic_beta(job.kind, job.request.as_ref()),
            input: std::sync::Arc::new(job.input),
            first: Some(handle),
            providers: eligible.into(),
        },
    );
    Ok(())
}

/// Resolves an open attempt of the owner's job out of band (an admin's
/// act): it is `cancelled`, and a late answer from it loses.
pub async fn cancel(
    state: &AppState,
    owner: &OwnerId,
    job_id: &JobId,
    n: i64,
) -> Result<(), JobError> {
    let reason = format!("cancelled out of band by an admin of {}", owner.0);
    state
        .inner
        .store
        .cancel_attempt(owner, job_id, n, &reason)
        .await?;
    let attempts = state.inner.store.attempts(owner, job_id).await?;
    let cancelled = attempts.iter().find(|a| a.ordinal == n);
    let provider = cancelled.map_or("", |a| a.provider.as_str());
    // Where the provider can stop the work (a background response), it is
    // asked to, by the id the attempt recorded: the attempt's own poll then
    // sees it end there, and the job goes on.
    if let Some((served, id)) = cancelled.and_then(|a| {
        let served = state.inner.providers.get(&a.provider)?;
        let id = a.provider_response_id.as_deref()?;
        served
            .config
            .capabilities
            .background
            .then_some((served, id))
    }) {
        let timeout = state.inner.settings.reconciling.timeout;
        match tokio::time::timeout(timeout, served.adapter.cancel(id)).await {
            Ok(Ok(())) => {
                tracing::info!(job_id = %job_id, attempt = n, response = id, "cancelled at the provider")
            }
            Ok(Err(e)) => {
                tracing::warn!(job_id = %job_id, attempt = n, response = id, error = %e, "the provider did not cancel the response")
            }
            Err(_) => {
                tracing::warn!(job_id = %job_id, attempt = n, response = id, "the provider did not answer the cancel in time")
            }
        }
    }
    state
        .inner
        .metrics
        .attempts
        .with_label_values(&[provider, "cancelled"])
        .inc();
    state.inner.settled.notify(job_id);
    Ok(())
}
