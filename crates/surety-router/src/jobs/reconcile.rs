//! The reconciler: an unknown attempt at a provider that keeps what it did
//! (`Reconciliation` other than `none`) is resolved by asking the provider
//! whether it did the work — by the provider's id for the answer where the
//! attempt read one, else by the attempt's name in the stored answer's
//! metadata. Found and complete: the stored answer settles the job as a
//! late answer would (the same check, the same compare-and-swap). Ended at
//! the provider (failed, cancelled, expired, or an answer that is none):
//! a definite failure, and the job may fail over. Not found: the attempt
//! stays unknown, with the question recorded; a miss is never taken for
//! "not run". Each question is recorded on the attempt and counted.

use std::sync::Arc;

use surety_providers::kinds::Reconciliation;
use surety_providers::{
    CallContext, ChatRequest, FailureKind, Found, Lookup, Provider, ProviderError,
};
use surety_store::{AttemptHandle, Question, UnknownAttempt};

use super::intake::{Demotions, certified, route_and_contract};
use super::manage::{anthropic_beta, job_messages};
use crate::dispatch::{self, Drive};
use crate::state::AppState;

/// Unknown attempts asked about per provider and pass: a provider is never
/// asked more than this many questions each pass of the background loop.
const PER_PASS: u32 = 8;

/// One pass: every provider that can be asked, at once, each its due
/// unknowns one after another, least recently asked first.
pub async fn pass(state: &AppState) {
    let askable: Vec<(String, Arc<dyn Provider>)> = state
        .inner
        .providers
        .iter()
        .filter(|(_, p)| p.config.reconciliation() != Reconciliation::None)
        .map(|(id, p)| (id.clone(), p.adapter.clone()))
        .collect();
    let passes = askable
        .iter()
        .map(|(id, adapter)| provider_pass(state, id, adapter));
    futures_util::future::join_all(passes).await;
}

async fn provider_pass(state: &AppState, provider: &str, adapter: &Arc<dyn Provider>) {
    let when = state.inner.settings.reconciling;
    let due = match state
        .inner
        .store
        .due_unknowns(provider, (when.after, when.every, when.horizon), PER_PASS)
        .await
    {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(provider, error = %e, "the reconciler cannot read the unknown attempts; the next pass tries again");
            return;
        }
    };
    for unknown in due {
        ask(state, adapter, unknown).await;
    }
}

/// What a question found, for the record and for the attempt.
struct Answer {
    outcome: &'static str,
    detail: String,
    /// What the attempt's own call would have given, when the provider
    /// knows: its answer, or a definite failure.
    result: Option<Result<surety_providers::ChatResponse, ProviderError>>,
    /// The provider's id for the answer it found.
    id: Option<String>,
}

/// Records a question that could not be asked, so the attempt waits its
/// turn before it is tried again.
async fn unasked(state: &AppState, handle: &AttemptHandle, by: &str, why: String) {
    tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, why, "the reconciler could not ask about an unknown attempt");
    record(state, handle, by, ("error", format!("not asked: {why}"))).await;
}

/// Records a question and its outcome on the attempt, and counts it;
/// false when it could not be recorded (it is asked again next pass).
async fn record(
    state: &AppState,
    handle: &AttemptHandle,
    by: &str,
    (outcome, detail): (&'static str, String),
) -> bool {
    state
        .inner
        .metrics
        .reconciliations
        .with_label_values(&[&handle.provider, outcome])
        .inc();
    tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, provider = %handle.provider, by, outcome, detail, "asked the provider about an unknown attempt");
    let question = Question {
        ordinal: handle.ordinal,
        n: 0,
        provider: handle.provider.clone(),
        asked_at_ms: 0,
        asked_by: by.to_owned(),
        outcome: outcome.to_owned(),
        detail,
    };
    match state
        .inner
        .store
        .record_question(&handle.job_id, &question)
        .await
    {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "the reconciler's question could not be recorded");
            false
        }
    }
}

/// Asks about one unknown attempt, records the question, and resolves the
/// attempt where the provider knows.
async fn ask(state: &AppState, adapter: &Arc<dyn Provider>, unknown: UnknownAttempt) {
    let UnknownAttempt { owner, attempt } = unknown;
    let handle = AttemptHandle {
        job_id: attempt.job_id.clone(),
        ordinal: attempt.ordinal,
        slot: attempt.slot,
        provider: attempt.provider.clone(),
        base_version: attempt.base_version,
        charged: true,
    };
    let by = match attempt.provider_response_id {
        Some(_) => "id",
        None => "metadata",
    };
    // What the question needs of the job; without it the question is
    // recorded as not asked, so the attempt waits its turn again.
    let job = match state.inner.store.job(&owner, &handle.job_id).await {
        Ok(job) => job,
        Err(e) => return unasked(state, &handle, by, format!("the job cannot be read: {e}")).await,
    };
    let Ok((route, served)) = route_and_contract(state, &job.route) else {
        let why = format!("its route `{}` is no longer served here", job.route);
        return unasked(state, &handle, by, why).await;
    };
    let messages = match job_messages(&job, served) {
        Ok(messages) => messages,
        Err(why) => {
            let why = format!("the attempt's request cannot be rebuilt: {why}");
            return unasked(state, &handle, by, why).await;
        }
    };
    let beta = anthropic_beta(job.kind, job.request.as_ref());
    // The request the attempt sent, built as it was: its answer is read as
    // that request's.
    let request = ChatRequest {
        anthropic_beta: beta.clone(),
        ..surety_exchange::request(&served.contract, messages.clone(), adapter.capabilities())
    };
    let call = CallContext::for_attempt(&handle.job_id.0, handle.ordinal);
    let lookup = Lookup {
        request: &request,
        response_id: attempt.provider_response_id.as_deref(),
        attempt: &call.idempotency_key,
    };
    let timeout = state.inner.settings.reconciling.timeout;
    let answer = match tokio::time::timeout(timeout, adapter.look_up(lookup)).await {
        Err(_) => Answer {
            outcome: "error",
            detail: format!("no answer within {} s", timeout.as_secs_f64()),
            result: None,
            id: None,
        },
        Ok(Err(e)) => Answer {
            outcome: "error",
            detail: e.to_string(),
            result: None,
            id: None,
        },
        Ok(Ok(Found::NotFound)) => Answer {
            outcome: "not_found",
            detail: "not found: no proof either way; the attempt stays unknown".to_owned(),
            result: None,
            id: None,
        },
        Ok(Ok(Found::Running(words))) => Answer {
            outcome: "running",
            detail: format!("still running there: {words}"),
            result: None,
            id: None,
        },
        Ok(Ok(Found::Ended(words))) => Answer {
            outcome: "ended",
            detail: format!("ended there without an answer: {words}"),
            result: Some(Err(ProviderError::new(
                &handle.provider,
                FailureKind::ServerError,
                format!(
                    "the provider, asked afterwards, says the call ended without an answer: {words}"
                ),
            ))),
            id: None,
        },
        Ok(Ok(Found::Answered { response, id })) => Answer {
            outcome: "answered",
            detail: match &id {
                Some(id) => format!("it did the work: its stored answer {id} is the attempt's"),
                None => "it did the work: its stored answer is the attempt's".to_owned(),
            },
            result: Some(Ok(response)),
            id,
        },
    };
    if !record(state, &handle, by, (answer.outcome, answer.detail)).await {
        return;
    }
    let Some(result) = answer.result else {
        return;
    };
    // The answer is judged against the certificate the provider holds for
    // the contract now: a provider no longer certified has its answer left
    // for an operator (trust is never assumed).
    let eligible = certified(state, &route, served, Demotions::Read)
        .await
        .unwrap_or_default();
    let Some(place) = eligible.iter().position(|p| p.id == handle.provider) else {
        tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, provider = %handle.provider, "the provider did the work, but is no longer certified for the contract: the attempt is left for an operator");
        return;
    };
    let key_name = state.inner.key_of_job(&owner, &handle.job_id).await;
    let drive = Drive {
        owner,
        key_name,
        job_id: handle.job_id.clone(),
        route,
        served: served.clone(),
        messages,
        anthropic_beta: beta,
        input: Arc::new(job.input),
        first: None,
        providers: eligible.into(),
    };
    let response_id = answer.id.or(attempt.provider_response_id);
    // A failover may take an attempt's time: on a task of its own.
    let state = state.clone();
    let tasks = state.inner.tasks.clone();
    tasks.spawn(async move {
        dispatch::resolve(&state, drive, (handle, place), (result, response_id)).await;
    });
}
