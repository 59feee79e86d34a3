//! Driving a job: an attempt at the first eligible provider of its route; a
//! definite failure moves to the next eligible one; a timeout makes the
//! attempt (and the job) `unknown` and stops there, while the router keeps
//! listening for the late result, which goes through compare-and-swap like
//! any other. Hedging starts one extra attempt after `hedge_after`, only for
//! contracts without side effects.

use std::sync::Arc;
use std::time::Duration;

use surety_manifest::{Current, Eligibility};
use surety_providers::{
    CallContext, ChatRequest, ChatResponse, FailureClass, Message, Provider, ProviderError,
};
use surety_store::{Answer, AttemptHandle, Finish, JobId, Outcome, OwnerId, Slot, StartAttempt};
use tracing::Instrument;

use crate::config::Route;
use crate::{AppState, Drift, ServedContract};

/// How one attempt ended, for the dispatcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Won,
    Lost,
    /// A definite failure, with the provider to fail over to: the next of
    /// the job's providers that is eligible as the attempt ended, and its
    /// place in the list (`None`: none is, and the job failed).
    Failed(Option<(usize, Eligible)>),
    Unknown,
}

/// A provider the manifest certifies for a job's contract, as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eligible {
    pub id: String,
    /// The model ids its certificate saw answer: an answer from any other is drift.
    pub models: Arc<[String]>,
}

/// Whether `provider` may serve `contract` now: its manifest entry must be
/// certified for the contract's digest and rendered prompts and for the
/// provider's configured behaviour, and not expired. With it, the model ids
/// the certificate saw answer.
pub fn eligibility(
    state: &AppState,
    provider: &str,
    contract: &ServedContract,
) -> (Eligibility, Vec<String>) {
    let (Some(served), Some(manifest)) = (
        state.inner.providers.get(provider),
        state.inner.manifest.current(),
    ) else {
        return (Eligibility::Missing, Vec::new());
    };
    let current = Current {
        contract_digest: &contract.contract.digest,
        prompt_digest: &contract.prompt_digest,
        provider: &served.behaviour,
    };
    let id = &contract.contract.id;
    let verdict = manifest.eligibility(provider, id, &current, time::OffsetDateTime::now_utc());
    let models = manifest
        .entry(provider, id)
        .map(|e| e.served_model.response_models.clone())
        .unwrap_or_default();
    (verdict, models)
}

/// `provider` with its certified models, if it is eligible for `served` now.
fn eligible_now(state: &AppState, provider: &str, served: &ServedContract) -> Option<Eligible> {
    match eligibility(state, provider, served) {
        (Eligibility::Certified, models) => Some(Eligible {
            id: provider.to_owned(),
            models: models.into(),
        }),
        (other, _) => {
            tracing::warn!(provider = %provider, contract = %served.contract.id, reason = %other, "no longer eligible: no attempt starts there");
            None
        }
    }
}

/// The route's providers that may serve its contract now, in the route's
/// order, with why each of the others may not.
pub fn eligible(
    state: &AppState,
    route: &Route,
    contract: &ServedContract,
) -> (Vec<Eligible>, Vec<String>) {
    let mut ok = Vec::new();
    let mut why_not = Vec::new();
    for provider in &route.providers {
        match eligibility(state, provider, contract) {
            (Eligibility::Certified, models) => ok.push(Eligible {
                id: provider.clone(),
                models: models.into(),
            }),
            (other, _) => why_not.push(format!("{provider}: {other}")),
        }
    }
    (ok, why_not)
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
    /// An attempt already started (with the job, or by a retry), at `providers[0]`.
    pub first: Option<AttemptHandle>,
    /// The route's providers eligible when the job was taken, in order.
    /// Each later attempt asks again, as the manifest and the configuration
    /// are when it starts: a certificate that lapsed or a provider
    /// reconfigured since is not tried.
    pub providers: Arc<[Eligible]>,
}

pub fn spawn(state: AppState, drive: Drive) {
    let tasks = state.inner.tasks.clone();
    let span = tracing::info_span!("job", job_id = %drive.job_id);
    tasks.spawn(
        async move {
            let job_id = drive.job_id.clone();
            run(&state, drive).await;
            state.inner.settled.notify(&job_id);
        }
        .instrument(span),
    );
}

async fn run(state: &AppState, drive: Drive) {
    let mut handle = drive.first.clone();
    // The first attempt was started at `providers[0]` as the job was taken;
    // without one, the first provider eligible now.
    let found = match &handle {
        Some(_) => drive.providers.first().cloned().map(|p| (0, p)),
        None => drive
            .providers
            .iter()
            .enumerate()
            .find_map(|(i, p)| eligible_now(state, &p.id, &drive.served).map(|now| (i, now))),
    };
    let Some((mut i, mut at)) = found else {
        return;
    };
    loop {
        let handle_now = match handle.take() {
            Some(handle) => handle,
            None => match start(state, &drive, &at.id, Slot::Primary).await {
                Some(handle) => handle,
                None => return,
            },
        };
        let attempt_at = |handle: AttemptHandle, at: &Eligible, place: usize| {
            attempt(
                state.clone(),
                handle,
                drive.messages.clone(),
                Judge {
                    served: drive.served.clone(),
                    models: at.models.clone(),
                    providers: drive.providers.clone(),
                    place,
                },
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
                        // The hedge asks for eligibility as it starts, too.
                        match eligible_now(state, &hedge_provider.id, &drive.served) {
                            None => primary.await,
                            Some(hedge_provider) => {
                                let Some(hedge) = start(state, &drive, &hedge_provider.id, Slot::Hedge).await else {
                                    return;
                                };
                                let hedged = attempt_at(hedge, &hedge_provider, i + 1);
                                let (a, b) = tokio::join!(primary, hedged);
                                match (a, b) {
                                    (End::Failed(_), End::Failed(next)) => End::Failed(next),
                                    (End::Failed(_), other) | (other, _) => other,
                                }
                            }
                        }
                    }
                }
            }
            _ => attempt_at(handle_now, &at, i).await,
        };
        match end {
            End::Won | End::Lost | End::Unknown | End::Failed(None) => return,
            End::Failed(Some((next, now))) => (i, at) = (next, now),
        }
    }
}

async fn start(
    state: &AppState,
    drive: &Drive,
    provider: &str,
    slot: Slot,
) -> Option<AttemptHandle> {
    let start = StartAttempt {
        provider: provider.to_owned(),
        slot,
        lease: state.inner.lease,
    };
    match state
        .inner
        .store
        .start_attempt(&drive.owner, &drive.job_id, &start)
        .await
    {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::info!(job_id = %drive.job_id, error = %e, "no attempt started");
            None
        }
    }
}

/// Runs one attempt to its end: heartbeats its lease, calls the provider,
/// and records the outcome.
async fn attempt(
    state: AppState,
    handle: AttemptHandle,
    messages: Vec<Message>,
    judge: Judge,
) -> End {
    let Some(provider) = state
        .inner
        .providers
        .get(&handle.provider)
        .map(|p| p.adapter.clone())
    else {
        let error = ProviderError::not_sent(&handle.provider, "not configured");
        return record(&state, &handle, Err(error), &judge).await;
    };
    // The harness's own builder: what was certified is what is sent.
    let request =
        surety_exchange::request(&judge.served.contract, messages, provider.capabilities());
    let _in_flight = InFlight::enter(&state, &handle);
    let heartbeat = {
        let (state, handle) = (state.clone(), handle.clone());
        let tasks = state.inner.tasks.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(state.inner.lease / 3);
            tick.tick().await;
            loop {
                tick.tick().await;
                match state
                    .inner
                    .store
                    .heartbeat(&handle, state.inner.lease)
                    .await
                {
                    Ok(_) => {}
                    // The database is away: the next beat tries again.
                    Err(e) if e.outage().is_some() => {}
                    // The lease is gone or the attempt closed: nothing to keep.
                    Err(_) => return,
                }
            }
        })
    };
    let call = CallContext::for_attempt(&handle.job_id.0, handle.ordinal);
    let started = std::time::Instant::now();
    let mut task = state
        .inner
        .tasks
        .spawn(call_provider(provider, request, call));
    let outcome = tokio::time::timeout(state.inner.attempt_timeout, &mut task).await;
    heartbeat.abort();
    state
        .inner
        .metrics
        .provider_latency
        .with_label_values(&[&handle.provider])
        .observe(started.elapsed().as_secs_f64());
    match outcome {
        Ok(Ok(result)) => record(&state, &handle, result, &judge).await,
        Ok(Err(join)) => {
            mark_unknown(&state, &handle, &format!("the call task failed: {join}")).await;
            End::Unknown
        }
        Err(_) => {
            let waited = state.inner.attempt_timeout;
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
                    tokio::time::timeout(late.inner.late_result_window, task).await
                {
                    tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, "late result arrived");
                    record(&late, &handle, result, &judge).await;
                    late.inner.settled.notify(&handle.job_id);
                }
            });
            End::Unknown
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
) -> Result<Finish, surety_store::StoreError> {
    let deadline = tokio::time::Instant::now() + state.inner.late_result_window;
    let mut backoff = Duration::from_millis(50);
    let mut held: Option<Held> = None;
    loop {
        let error = match state
            .inner
            .store
            .finish_attempt(handle, outcome.clone())
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

/// How the provider answered, kept with the job: its usage, its finish
/// reason (in OpenAI's words, and as the provider said it) and the model.
fn completion(response: &ChatResponse) -> serde_json::Value {
    serde_json::json!({
        "usage": {
            "prompt_tokens": response.usage.prompt_tokens,
            "completion_tokens": response.usage.completion_tokens,
        },
        "finish_reason": response.finish_reason_word(),
        "provider_finish_reason": response.finish_reason,
        "model": response.model,
    })
}

/// What an attempt's answer is judged by, and where a failure goes next.
struct Judge {
    served: Arc<ServedContract>,
    /// The model ids the provider's certificate saw answer.
    models: Arc<[String]>,
    /// The job's providers, and this attempt's place among them.
    providers: Arc<[Eligible]>,
    place: usize,
}

impl Judge {
    /// The next provider after this attempt's that is eligible now: where
    /// a definite failure fails over to. With none, the failure fails the job.
    fn next(&self, state: &AppState) -> Option<(usize, Eligible)> {
        self.providers
            .iter()
            .enumerate()
            .skip(self.place + 1)
            .find_map(|(i, p)| eligible_now(state, &p.id, &self.served).map(|now| (i, now)))
    }
}

/// Records what the provider said. An answer from a model the certificate
/// did not see (drift) or that breaks the contract (the harness's own
/// check) is a definite failure.
async fn record(
    state: &AppState,
    handle: &AttemptHandle,
    result: Result<ChatResponse, ProviderError>,
    judge: &Judge,
) -> End {
    let metrics = &state.inner.metrics;
    let contract = &judge.served.contract;
    // `give_up` is settled below, once the outcome is known to be a failure.
    let failed = |error: String| Outcome::Failed {
        error,
        give_up: false,
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
            failed(format!(
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
            ))
        }
        Ok(response) => {
            let checked = surety_exchange::check(contract, &response);
            match (checked.passed(), checked.answer.clone()) {
                (true, Some(answer)) => Outcome::Succeeded(Answer {
                    result: answer,
                    completion: Some(completion(&response)),
                }),
                (_, answer) => {
                    let what = match answer {
                        None => "gave no JSON answer",
                        Some(_) => "breaks the contract",
                    };
                    failed(format!(
                        "the answer {what} `{}`: {}",
                        contract.id,
                        checked.describe()
                    ))
                }
            }
        }
        Err(e) if e.class() == FailureClass::Definite => failed(e.to_string()),
        Err(e) => {
            mark_unknown(state, handle, &e.to_string()).await;
            return End::Unknown;
        }
    };
    // Where a failure goes is asked as this attempt ends, just before the
    // next would start; a success asks nothing.
    let next = match &mut outcome {
        Outcome::Failed { give_up, .. } => {
            let next = judge.next(state);
            *give_up = next.is_none();
            next
        }
        _ => None,
    };
    match finish_held(state, handle, outcome).await {
        Ok(Finish::Won(_)) => {
            metrics
                .attempts
                .with_label_values(&[&handle.provider, "succeeded"])
                .inc();
            End::Won
        }
        Ok(Finish::Lost { winner }) => {
            metrics
                .attempts
                .with_label_values(&[&handle.provider, "lost"])
                .inc();
            metrics.lost_races.inc();
            metrics.late_results_discarded.inc();
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, winner = ?winner, "late result discarded: the attempt lost the race");
            End::Lost
        }
        Ok(Finish::Failed) => {
            metrics
                .attempts
                .with_label_values(&[&handle.provider, "failed"])
                .inc();
            End::Failed(next)
        }
        Err(e) => {
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "the attempt's outcome was refused");
            metrics.late_results_discarded.inc();
            End::Lost
        }
    }
}
