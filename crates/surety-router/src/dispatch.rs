//! Driving a job: an attempt at the first eligible provider of its route; a
//! definite failure moves to the next eligible one; a timeout makes the
//! attempt (and the job) `unknown` and stops there, while the router keeps
//! listening for the late result, which goes through compare-and-swap like
//! any other. Hedging starts one extra attempt after `hedge_after`, only for
//! contracts without side effects.

use std::sync::Arc;

use serde_json::Value;
use surety_contracts::Contract;
use surety_manifest::Eligibility;
use surety_providers::{
    CallContext, ChatRequest, ChatResponse, FailureClass, Message, OutputFormat, Provider,
    ProviderError,
};
use surety_store::{AttemptHandle, Finish, JobId, Outcome, OwnerId, Slot, StartAttempt};

use crate::AppState;
use crate::config::Route;

/// How one attempt ended, for the dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Won,
    Lost,
    Failed,
    Unknown,
}

/// The route's providers that the manifest certifies for the contract at
/// its current digest, in the route's order, with why the others are not.
pub fn eligible(
    state: &AppState,
    route: &Route,
    contract: &Contract,
) -> (Vec<String>, Vec<String>) {
    let mut ok = Vec::new();
    let mut why_not = Vec::new();
    for provider in &route.providers {
        match state
            .inner
            .manifest
            .eligibility(provider, &contract.id, &contract.digest)
        {
            Eligibility::Certified => ok.push(provider.clone()),
            other => why_not.push(format!("{provider}: {other:?}")),
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
    /// What every attempt sends (see [`request_for`]).
    pub request: ChatRequest,
    /// An attempt already started (with the job, or by a retry), at `providers[0]`.
    pub first: Option<AttemptHandle>,
    pub providers: Vec<String>,
}

pub fn spawn(state: AppState, drive: Drive) {
    tokio::spawn(async move {
        let job_id = drive.job_id.clone();
        run(&state, drive).await;
        state.inner.settled.notify(&job_id);
    });
}

async fn run(state: &AppState, drive: Drive) {
    let Some(contract) = state.inner.contracts.get(&drive.route.contract).cloned() else {
        return;
    };
    let request = &drive.request;
    let mut first = drive.first.clone();
    let mut i = 0;
    while i < drive.providers.len() {
        let last = i + 1 == drive.providers.len();
        let handle = match first.take() {
            Some(handle) => handle,
            None => match start(state, &drive, &drive.providers[i], Slot::Primary).await {
                Some(handle) => handle,
                None => return,
            },
        };
        let hedge_at = drive.providers.get(i + 1).filter(|_| contract.hedgeable());
        let end = match (drive.route.hedge_after, hedge_at) {
            (Some(after), Some(hedge_provider)) => {
                let primary = attempt(
                    state.clone(),
                    handle,
                    request.clone(),
                    contract.clone(),
                    last,
                );
                tokio::pin!(primary);
                tokio::select! {
                    end = &mut primary => end,
                    () = tokio::time::sleep(after) => {
                        let Some(hedge) = start(state, &drive, hedge_provider, Slot::Hedge).await else {
                            return;
                        };
                        let give_up = i + 2 >= drive.providers.len();
                        let hedged = attempt(state.clone(), hedge, request.clone(), contract.clone(), give_up);
                        let (a, b) = tokio::join!(primary, hedged);
                        i += 1;
                        [a, b].into_iter().find(|e| *e != End::Failed).unwrap_or(End::Failed)
                    }
                }
            }
            _ => {
                attempt(
                    state.clone(),
                    handle,
                    request.clone(),
                    contract.clone(),
                    last,
                )
                .await
            }
        };
        match end {
            End::Won | End::Lost | End::Unknown => return,
            End::Failed => i += 1,
        }
    }
}

/// The messages and token budget of an OpenAI chat request, as sent.
fn as_sent(body: &Value, contract: &Contract) -> Result<(Vec<Message>, u32), String> {
    let messages = body["messages"]
        .as_array()
        .ok_or("`messages` must be a list")?;
    let mut out = Vec::new();
    for m in messages {
        let role = match m["role"].as_str() {
            Some("system" | "developer") => surety_providers::Role::System,
            Some("user") => surety_providers::Role::User,
            Some("assistant") => surety_providers::Role::Assistant,
            other => return Err(format!("unsupported message role {other:?}")),
        };
        let content = match &m["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            _ => return Err("a message without text content".to_owned()),
        };
        out.push(Message { role, content });
    }
    if out.is_empty() {
        return Err("`messages` is empty".to_owned());
    }
    let asked = body["max_completion_tokens"]
        .as_u64()
        .or_else(|| body["max_tokens"].as_u64());
    let max_tokens = asked.map_or(contract.limits.max_output_tokens, |n| {
        u32::try_from(n).unwrap_or(u32::MAX)
    });
    Ok((out, max_tokens))
}

/// What a job's attempts send: the contract's rendered prompt for `input`,
/// or, with `as_sent`, the messages of the OpenAI chat request `input`;
/// always the contract's sampling and output schema. An input that does
/// not fit is refused here, before a job is made of it.
pub fn request_for(
    contract: &Contract,
    input: &Value,
    as_sent: bool,
) -> Result<ChatRequest, String> {
    let (messages, max_tokens) = match as_sent {
        true => self::as_sent(input, contract)?,
        false => {
            let rendered = contract.render(input).map_err(|e| e.to_string())?;
            (
                vec![
                    Message::system(rendered.system),
                    Message::user(rendered.user),
                ],
                contract.limits.max_output_tokens,
            )
        }
    };
    Ok(ChatRequest {
        messages,
        temperature: contract.sampling.temperature,
        max_tokens,
        seed: None,
        output: OutputFormat::Json {
            name: contract.output_name.clone(),
            schema: contract.schema.clone(),
        },
    })
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
    request: ChatRequest,
    contract: Arc<Contract>,
    give_up: bool,
) -> End {
    let Some(provider) = state.inner.providers.get(&handle.provider).cloned() else {
        return record(
            &state,
            &handle,
            Err(ProviderError::not_sent(&handle.provider, "not configured")),
            &contract,
            give_up,
        )
        .await;
    };
    let heartbeat = {
        let (state, handle) = (state.clone(), handle.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(state.inner.lease / 3);
            tick.tick().await;
            loop {
                tick.tick().await;
                if state
                    .inner
                    .store
                    .heartbeat(&handle, state.inner.lease)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
    };
    let call = CallContext::for_attempt(&handle.job_id.0, handle.ordinal);
    let started = std::time::Instant::now();
    let mut task = tokio::spawn(call_provider(provider, request, call));
    let outcome = tokio::time::timeout(state.inner.attempt_timeout, &mut task).await;
    heartbeat.abort();
    state
        .inner
        .metrics
        .provider_latency
        .with_label_values(&[&handle.provider])
        .observe(started.elapsed().as_secs_f64());
    match outcome {
        Ok(Ok(result)) => record(&state, &handle, result, &contract, give_up).await,
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
            tokio::spawn(async move {
                if let Ok(Ok(result)) =
                    tokio::time::timeout(late.inner.late_result_window, task).await
                {
                    tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, "late result arrived");
                    record(&late, &handle, result, &contract, give_up).await;
                    late.inner.settled.notify(&handle.job_id);
                }
            });
            End::Unknown
        }
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

/// Records what the provider said. Every answer is checked against the
/// contract; a violation is a definite failure.
async fn record(
    state: &AppState,
    handle: &AttemptHandle,
    result: Result<ChatResponse, ProviderError>,
    contract: &Contract,
    give_up: bool,
) -> End {
    let metrics = &state.inner.metrics;
    let failed = |error: String| Outcome::Failed { error, give_up };
    let outcome = match result {
        Ok(response) => match response.json {
            Some(answer) => {
                let violations = contract.check_answer(&answer);
                match violations.is_empty() {
                    true => Outcome::Succeeded(answer),
                    false => failed(format!(
                        "the answer breaks contract `{}`: {}",
                        contract.id,
                        violations
                            .iter()
                            .map(|v| format!("{} at `{}`: {}", v.check, v.pointer, v.message))
                            .collect::<Vec<_>>()
                            .join("; ")
                    )),
                }
            }
            None => failed("the provider gave no JSON answer".to_owned()),
        },
        Err(e) if e.class() == FailureClass::Definite => failed(e.to_string()),
        Err(e) => {
            mark_unknown(state, handle, &e.to_string()).await;
            return End::Unknown;
        }
    };
    match state.inner.store.finish_attempt(handle, outcome).await {
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
            End::Failed
        }
        Err(e) => {
            tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "the attempt's outcome was refused");
            metrics.late_results_discarded.inc();
            End::Lost
        }
    }
}
