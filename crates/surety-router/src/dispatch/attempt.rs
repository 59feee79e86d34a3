//! One attempt: the provider call under the attempt's lease and timeout,
//! its heartbeat, and what becomes of its result: judged by the harness's
//! own check against the contract and for drift from the certified
//! models, recorded by compare-and-swap, held for the window of a late
//! answer, or `unknown`; and where a failure fails over to.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use surety_providers::{
    CallContext, ChatRequest, ChatResponse, FailureClass, Message, Provider, ProviderError,
    ResponseIds,
};
use surety_store::{Answer, AttemptHandle, Finish, Outcome, Spend};

use super::End;
use crate::certification::{Drift, Eligible, ServedContract};
use crate::config::Route;
use crate::state::AppState;

/// Runs one attempt to its end: heartbeats its lease, calls the provider,
/// and records the outcome.
pub(super) async fn attempt(
    state: AppState,
    handle: AttemptHandle,
    (messages, anthropic_beta): (Vec<Message>, Option<String>),
    judge: Judge,
) -> End {
    let Some(provider) = state
        .inner
        .providers
        .get(&handle.provider)
        .map(|p| p.adapter.clone())
    else {
        let error = ProviderError::not_sent(&handle.provider, "not configured");
        return record(&state, &handle, (Err(error), None), &judge).await;
    };
    // The harness's own builder: what was certified is what is sent.
    let request = ChatRequest {
        anthropic_beta,
        ..surety_exchange::request(&judge.served.contract, messages, provider.capabilities())
    };
    let _in_flight = InFlight::enter(&state, &handle);
    // The provider's id for its answer, told by the adapter as soon as it
    // reads it: written on the attempt before the rest of the answer.
    let (ids, mut seen) = ResponseIds::channel();
    let call = CallContext::for_attempt(&handle.job_id.0, handle.ordinal).telling(ids);
    let started = std::time::Instant::now();
    // The call runs in this task (a panic in it is caught, as a task's
    // would be); past the timeout it is handed to a task of its own, which
    // keeps listening for the late answer.
    let mut task = Box::pin(
        std::panic::AssertUnwindSafe(call_provider(provider, request, call)).catch_unwind(),
    );
    // The lease is renewed beside the call, until the call ends (or the
    // lease is gone: then the call is only waited for).
    let mut noted = false;
    let outcome = {
        let waited = tokio::time::timeout(state.inner.settings.attempt_timeout, &mut task);
        let beating = heartbeat(&state, &handle);
        tokio::pin!(waited, beating);
        loop {
            tokio::select! {
                biased;
                outcome = &mut waited => break outcome,
                () = &mut beating => break (&mut waited).await,
                Ok(()) = seen.changed(), if !noted => {
                    noted = true;
                    let id = seen.borrow_and_update().clone();
                    if let Some(id) = id {
                        note_response_id(&state, &handle, &id).await;
                    }
                }
            }
        }
    };
    state
        .inner
        .metrics
        .provider_latency
        .with_label_values(&[&handle.provider])
        .observe(started.elapsed().as_secs_f64());
    let response_id = || seen.borrow().clone();
    match outcome {
        Ok(Ok(result)) => record(&state, &handle, (result, response_id()), &judge).await,
        Ok(Err(_panic)) => {
            mark_unknown(&state, &handle, "the call panicked").await;
            End::Unknown
        }
        Err(_) => {
            let waited = state.inner.settings.attempt_timeout;
            mark_unknown(
                &state,
                &handle,
                &format!("no answer within {} s", waited.as_secs_f64()),
            )
            .await;
            // Keep listening: a late answer goes through compare-and-swap like any other.
            let late = state.clone();
            state.inner.tasks.spawn(async move {
                if let Ok(Ok(result)) =
                    tokio::time::timeout(late.inner.settings.late_result_window, task).await
                {
                    tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, "late result arrived");
                    let id = seen.borrow().clone();
                    record(&late, &handle, (result, id), &judge).await;
                    late.inner.settled.notify(&handle.job_id);
                }
            });
            End::Unknown
        }
    }
}

/// Writes the provider's id for the attempt's answer on the attempt.
async fn note_response_id(state: &AppState, handle: &AttemptHandle, id: &str) {
    if let Err(e) = state.inner.store.note_response_id(handle, id).await {
        tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "could not note the provider's response id");
    }
}

/// Renews the attempt's lease every third of it, for as long as it is
/// polled; returns once the lease is gone or the attempt closed.
async fn heartbeat(state: &AppState, handle: &AttemptHandle) {
    let mut tick = tokio::time::interval(state.inner.settings.lease / 3);
    tick.tick().await;
    loop {
        tick.tick().await;
        match state
            .inner
            .store
            .heartbeat(handle, state.inner.settings.lease)
            .await
        {
            Ok(_) => {}
            // The database is away: the next beat tries again.
            Err(e) if e.outage().is_some() => {}
            // The lease is gone or the attempt closed: nothing to keep.
            Err(_) => return,
        }
    }
}

/// Records an attempt's outcome. While the database is away, the outcome
/// is held here and offered again (backing off to every 2 s) for as long as
/// the late-result window: a provider's answer is never thrown away for an
/// outage, and the provider is never asked again for it.
async fn finish_held(
    state: &AppState,
    handle: &AttemptHandle,
    outcome: Outcome,
) -> Result<(Finish, Option<Vec<surety_store::Attempt>>), surety_store::StoreError> {
    let deadline = tokio::time::Instant::now() + state.inner.settings.late_result_window;
    let mut backoff = Duration::from_millis(50);
    let mut held: Option<Held> = None;
    loop {
        let error = match state
            .inner
            .store
            .finish_attempt_settled(handle, outcome.clone())
            .await
        {
            Err(e) if e.outage().is_some() => e,
            done => {
                if held.is_some() {
                    tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, "a held result is recorded: the database is back");
                }
                return done;
            }
        };
        if tokio::time::Instant::now() + backoff > deadline {
            tracing::error!(job_id = %handle.job_id, attempt = handle.ordinal, error = %error, "a held result is dropped: the database stayed away past the late-result window; the attempt stays open (unknown) for an operator");
            return Err(error);
        }
        if held.is_none() {
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, error = %error, "the database cannot take a result now; holding it and trying again");
            held = Some(Held::new(state));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One result held in memory, counted by `surety_results_held` until dropped.
struct Held(prometheus::IntGauge);

impl Held {
    fn new(state: &AppState) -> Held {
        let gauge = state.inner.metrics.results_held.clone();
        gauge.inc();
        Held(gauge)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

async fn call_provider(
    provider: Arc<dyn Provider>,
    request: ChatRequest,
    call: CallContext,
) -> Result<ChatResponse, ProviderError> {
    provider.chat(&request, &call).await
}

async fn mark_unknown(state: &AppState, handle: &AttemptHandle, reason: &str) {
    state
        .inner
        .metrics
        .attempts
        .with_label_values(&[&handle.provider, "unknown"])
        .inc();
    match state.inner.store.mark_unknown(handle, reason).await {
        Ok(()) => {}
        Err(e) => {
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "could not mark the attempt unknown")
        }
    }
}

/// An attempt waiting on its provider, listed in `Inner::in_flight` until dropped.
struct InFlight {
    state: AppState,
    key: (String, i64),
}

impl InFlight {
    fn enter(state: &AppState, handle: &AttemptHandle) -> InFlight {
        let key = (handle.job_id.0.clone(), handle.ordinal);
        state.inner.in_flight().insert(key.clone(), handle.clone());
        InFlight {
            state: state.clone(),
            key,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.inner.in_flight().remove(&self.key);
    }
}

/// What an attempt's answer is judged by, and where a failure goes next.
pub(super) struct Judge {
    pub(super) served: Arc<ServedContract>,
    /// The model ids the provider's certificate saw answer.
    pub(super) models: Arc<[String]>,
    /// The job's providers, and this attempt's place among them.
    pub(super) providers: Arc<[Eligible]>,
    /// The job's input, for the contract's rules.
    pub(super) input: Arc<serde_json::Value>,
    pub(super) place: usize,
    /// The route and the messages its shadow checks send, when the route
    /// has them.
    pub(super) shadow: Option<(Route, Vec<Message>)>,
}

impl Judge {
    /// The next provider after this attempt's that is eligible now: where
    /// a definite failure fails over to. With none, the failure fails the job.
    /// Demotions that cannot be read fail over nowhere: trust is never
    /// assumed.
    pub(super) async fn next(&self, state: &AppState) -> Option<(usize, Eligible)> {
        let certifier = match state.inner.certifier().await {
            Ok(certifier) => certifier,
            Err(e) => {
                tracing::warn!(error = %e, "the demotions cannot be read: no failover");
                return None;
            }
        };
        self.providers
            .iter()
            .enumerate()
            .skip(self.place + 1)
            .find_map(|(i, p)| {
                certifier
                    .eligible_now(&p.id, &self.served)
                    .map(|now| (i, now))
            })
    }
}

/// Records what the provider said. An answer from a model the certificate
/// did not see (drift) or that breaks the contract (the harness's own
/// check) is a definite failure.
pub(super) async fn record(
    state: &AppState,
    handle: &AttemptHandle,
    (result, response_id): (Result<ChatResponse, ProviderError>, Option<String>),
    judge: &Judge,
) -> End {
    let metrics = &state.inner.metrics;
    let contract = &judge.served.contract;
    // `give_up` is settled below, once the outcome is known to be a failure.
    let failed = |error: String, spend: Spend| Outcome::Failed {
        error,
        give_up: false,
        spend,
    };
    // What an answer cost, which its reservations become whatever becomes
    // of it (the provider billed it).
    let cost = |response: &ChatResponse| {
        state
            .inner
            .providers
            .get(&handle.provider)
            .and_then(|p| crate::spend::cost(&p.config, &response.usage))
    };
    if let Ok(response) = &result {
        // Every answered call's tokens, whatever becomes of the answer.
        for (kind, n) in [
            ("prompt", response.usage.prompt_tokens),
            ("completion", response.usage.completion_tokens),
        ] {
            metrics
                .tokens
                .with_label_values(&[&handle.provider, kind])
                .inc_by(n);
        }
        for (counter, n) in [
            (&metrics.cache_read_tokens, response.usage.cache_read_tokens),
            (
                &metrics.cache_write_tokens,
                response.usage.cache_write_tokens,
            ),
        ] {
            counter.with_label_values(&[&handle.provider]).inc_by(n);
        }
    }
    let mut outcome = match result {
        Ok(response) if !judge.models.contains(&response.model) => {
            metrics
                .model_drift
                .with_label_values(&[&handle.provider, &response.model])
                .inc();
            let drift = Drift {
                contract: contract.id.clone(),
                model: response.model.clone(),
                certified: judge.models.to_vec(),
                at: surety_manifest::now_rfc3339(time::OffsetDateTime::now_utc()),
            };
            tracing::warn!(job_id = %handle.job_id, provider = %handle.provider, model = %response.model, "model drift: an answer from a model the certificate did not see");
            state
                .inner
                .drift
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(handle.provider.clone(), drift);
            let spend = cost(&response).map_or(Spend::WorstCase, Spend::Cost);
            failed(
                format!(
                    "model drift: the answer came from model `{}`, but the certificate of `{}` for `{}` saw only {}",
                    response.model,
                    handle.provider,
                    contract.id,
                    judge
                        .models
                        .iter()
                        .map(|m| format!("`{m}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                spend,
            )
        }
        Ok(response) => {
            let checked = surety_exchange::check(contract, &judge.input, &response);
            match (checked.passed(), checked.answer.clone()) {
                (true, Some(answer)) => Outcome::Succeeded(Answer {
                    result: answer,
                    completion: Some(completion(&response)),
                    response_id: response_id.clone(),
                    // What the job's budgets are settled to.
                    cost: cost(&response),
                }),
                (_, answer) => {
                    let what = match answer {
                        None => "gave no JSON answer",
                        Some(_) => "breaks the contract",
                    };
                    let spend = cost(&response).map_or(Spend::WorstCase, Spend::Cost);
                    failed(
                        format!(
                            "the answer {what} `{}`: {}",
                            contract.id,
                            checked.describe()
                        ),
                        spend,
                    )
                }
            }
        }
        Err(e) if e.class() == FailureClass::Definite => failed(e.to_string(), Spend::Nothing),
        Err(e) => {
            mark_unknown(state, handle, &e.to_string()).await;
            return End::Unknown;
        }
    };
    // Where a failure goes is asked as this attempt ends, just before the
    // next would start; a success asks nothing.
    let next = match &mut outcome {
        Outcome::Failed { give_up, .. } => {
            // An answer that failed its checks still had the provider's id.
            if let Some(id) = &response_id {
                note_response_id(state, handle, id).await;
            }
            let next = judge.next(state).await;
            *give_up = next.is_none();
            next
        }
        _ => None,
    };
    // What became of the attempt, counted in one place: by provider and
    // outcome, and an answer that did not become the job's is a late
    // result discarded.
    let failure = matches!(outcome, Outcome::Failed { .. });
    let (counted, end) = match finish_held(state, handle, outcome).await {
        Ok((Finish::Won(job), attempts)) => {
            let job = *job;
            if let Some((route, messages)) = &judge.shadow
                && let Some(answer) = job.result.clone()
            {
                crate::live::after_success(
                    state,
                    crate::live::Succeeded {
                        route: route.clone(),
                        served: judge.served.clone(),
                        job_id: handle.job_id.clone(),
                        winner: handle.provider.clone(),
                        messages: messages.clone(),
                        input: job.input.clone(),
                        answer,
                    },
                );
            }
            let snapshot = attempts.map(|attempts| Arc::new((job, attempts)));
            (Some("succeeded"), End::Won(snapshot))
        }
        Ok((Finish::Lost { winner }, _)) => {
            metrics.lost_races.inc();
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, winner = ?winner, "late result discarded: the attempt lost the race");
            (Some("lost"), End::Lost)
        }
        Ok((Finish::Failed, _)) => (Some("failed"), End::Failed(next)),
        // Cancelled out of band, and the provider says it ended without an
        // answer (a background response cancelled there): no work is left
        // running, and the job goes on as after the attempt's own failure.
        Err(surety_store::StoreError::Transition(surety_core::TransitionError::Attempt {
            from: surety_core::AttemptState::Cancelled,
            ..
        })) if failure => {
            tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, "the cancelled attempt ended at its provider; the job goes on");
            (None, End::Failed(next))
        }
        Err(e) => {
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "late result discarded: the attempt's outcome was refused");
            (None, End::Lost)
        }
    };
    if matches!(end, End::Lost) {
        metrics.late_results_discarded.inc();
    }
    if let Some(outcome) = counted {
        metrics
            .attempts
            .with_label_values(&[&handle.provider, outcome])
            .inc();
    }
    end
}

/// How the provider answered, kept with the job: its usage, its finish
/// reason (in OpenAI's words, and as the provider said it) and the model.
fn completion(response: &ChatResponse) -> serde_json::Value {
    serde_json::json!({
        "usage": {
            "prompt_tokens": response.usage.prompt_tokens,
            "completion_tokens": response.usage.completion_tokens,
            "cache_read_tokens": response.usage.cache_read_tokens,
            "cache_write_tokens": response.usage.cache_write_tokens,
        },
        "finish_reason": response.finish_reason_word(),
        "provider_finish_reason": response.finish_reason,
        "model": response.model,
    })
}
