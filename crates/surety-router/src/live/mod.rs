//! The router's own checks (SPEC "Live certification"): after a job of a
//! route with `[routes.<id>.shadow]` succeeds, a sampled job's certified
//! request (the very messages its attempts sent, built by
//! `surety_exchange::request` for each provider) goes to the route's other
//! eligible providers, off the request path, on the task tracker, within
//! the route's hourly budget and concurrency cap, each call with its own
//! idempotency key. Each answer is judged by the harness's own check and
//! compared with the job's answer on the contract's agreement pointers; the
//! result is recorded, and past the contract's thresholds the provider is
//! demoted for the contract. A shadow call is never an attempt: the job,
//! its answer, its replay and its books are untouched. These checks can
//! only take trust away.

pub(crate) mod budget;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use surety_config::{Route, Shadow};
use surety_contracts::{Judged, Seen};
use surety_providers::{CallContext, FailureClass, Message};
use surety_store::{JobId, LiveOutcome, LiveResult, LiveSource, Spend};
use tracing::Instrument;

use crate::certification::ServedContract;
use crate::state::AppState;

/// What a succeeded job offers its route's shadow checks.
#[derive(Debug, Clone)]
pub struct Succeeded {
    pub route: Route,
    pub served: Arc<ServedContract>,
    pub job_id: JobId,
    /// The provider whose answer won: it is not shadowed.
    pub winner: String,
    pub messages: Vec<Message>,
    /// The job's input (what `surety cases export` proposes as a case's).
    pub input: Value,
    pub answer: Value,
}

/// Shadows `job` if its route asks for it and the draw samples it; the
/// calls run on the task tracker, never on the request path.
pub fn after_success(state: &AppState, job: Succeeded) {
    let Some(shadow) = job.route.shadow.clone() else {
        return;
    };
    // Never for a contract whose calls may have side effects.
    if !job.served.contract.hedgeable() || !shadow.samples(rand::random_range(0..1_000_000)) {
        return;
    }
    let state_now = state.clone();
    let span = tracing::info_span!("shadow", job_id = %job.job_id, route = %job.route.id);
    state
        .inner
        .tasks
        .spawn(async move { shadow_job(&state_now, &shadow, job).await }.instrument(span));
}

async fn shadow_job(state: &AppState, shadow: &Shadow, job: Succeeded) {
    let certifier = match state.inner.certifier().await {
        Ok(certifier) => certifier,
        Err(e) => {
            tracing::warn!(error = %e, "shadow checks skipped: the demotions cannot be read");
            return;
        }
    };
    let others: Vec<String> = job
        .route
        .providers
        .iter()
        .filter(|p| **p != job.winner)
        .filter(|p| certifier.eligibility(p, &job.served).0.certified())
        .cloned()
        .collect();
    drop(certifier);
    for provider in others {
        let Some(in_flight) = take_budget(state, &job.route.id, &provider, shadow) else {
            return;
        };
        let Ok(_permit) = in_flight.acquire_owned().await else {
            return;
        };
        let key = format!("surety-shadow-{}-{provider}", job.job_id);
        let Some((outcome, detail, answer)) = ask(
            state,
            (&job.route.id, &job.served),
            (&job.input, &job.messages),
            Some(&job.answer),
            (&provider, &key),
            shadow.timeout,
        )
        .await
        else {
            return;
        };
        let result = LiveResult {
            provider: provider.clone(),
            contract: job.served.contract.id.clone(),
            route: job.route.id.clone(),
            source: LiveSource::Shadow,
            outcome,
            detail,
            job_id: Some(job.job_id.clone()),
            case_name: None,
            input: job.input.clone(),
            expected: Some(job.served.contract.live.agreed_fields(&job.answer)),
            answer,
            at_ms: 0,
        };
        record(state, &job.served, result).await;
    }
}

/// One call of `route`'s budget for `provider`, and the route's
/// concurrency cap to wait on; none left this hour is counted.
fn take_budget(
    state: &AppState,
    route: &str,
    provider: &str,
    shadow: &Shadow,
) -> Option<Arc<tokio::sync::Semaphore>> {
    let taken = state.inner.budgets.take(route, provider, shadow);
    if taken.is_none() {
        not_made(state, route);
    }
    taken
}

/// Counts a live check of `route` not made for want of budget.
fn not_made(state: &AppState, route: &str) {
    state
        .inner
        .metrics
        .live_budget_exhausted
        .with_label_values(&[route])
        .inc();
}

/// Sends `messages` as the contract's certified request to `provider` and
/// judges its answer by the harness's check and, given the job's answer
/// (`agree_with`), on the agreement pointers: what was seen, in words, and
/// the answer. Where the route's checks have a budget, the call's worst
/// case is reserved of it first and settled to what the call cost; with no
/// room left (or no reservation to be had) nothing is asked: `None`,
/// counted.
async fn ask(
    state: &AppState,
    (route, served): (&str, &ServedContract),
    (input, messages): (&Value, &[Message]),
    agree_with: Option<&Value>,
    (provider, key): (&str, &str),
    timeout: Duration,
) -> Option<(LiveOutcome, String, Option<Value>)> {
    let Some(adapter) = state.inner.providers.get(provider) else {
        return Some((
            LiveOutcome::Failed,
            format!("no provider `{provider}`"),
            None,
        ));
    };
    let hold = hold(state, route, adapter, served, messages, key).await?;
    let contract = &served.contract;
    let request =
        surety_exchange::request(contract, messages.to_vec(), adapter.adapter.capabilities());
    let call = CallContext {
        idempotency_key: key.to_owned(),
        ids: surety_providers::ResponseIds::default(),
    };
    let metrics = &state.inner.metrics;
    let called = tokio::time::timeout(timeout, adapter.adapter.chat(&request, &call)).await;
    if let Some(id) = &hold {
        // What the call cost: nothing where the provider said it did no
        // work, its usage where it answered, its worst case where no one
        // knows (it may have been billed).
        let spend = match &called {
            Ok(Ok(response)) => crate::spend::cost(&adapter.config, &response.usage)
                .map_or(Spend::WorstCase, Spend::Cost),
            Ok(Err(e)) if e.class() == FailureClass::Definite => Spend::Nothing,
            Ok(Err(_)) | Err(_) => Spend::WorstCase,
        };
        if let Err(e) = state.inner.store.settle_check(id, spend).await {
            tracing::warn!(check = %id, error = %e, "a live check's reservation is not settled: it is settled to its worst case once stale");
        }
    }
    let response = match called {
        Err(_) => {
            let words = format!("no answer within {} ms", timeout.as_millis());
            return Some((LiveOutcome::Failed, words, None));
        }
        Ok(Err(e)) => return Some((LiveOutcome::Failed, e.to_string(), None)),
        Ok(Ok(response)) => response,
    };
    let tokens = response.usage.prompt_tokens + response.usage.completion_tokens;
    metrics
        .live_tokens
        .with_label_values(&[provider, &contract.id])
        .inc_by(tokens);
    let checked = surety_exchange::check(contract, input, &response);
    let answer = checked.answer.clone();
    if !checked.passed() {
        return Some((LiveOutcome::Broke, checked.describe(), answer));
    }
    let disagreement = answer
        .as_ref()
        .zip(agree_with)
        .and_then(|(a, job)| contract.live.disagreement(job, a));
    Some(match disagreement {
        Some(words) => (LiveOutcome::Disagreed, words, answer),
        None => (LiveOutcome::Kept, "kept the contract".to_owned(), answer),
    })
}

/// Reserves a check's worst case at `provider` of `route`'s checks
/// budgets, by a hold of its own (`key` and a nonce: a re-check's key
/// repeats): `Some(None)` where the route's checks have no budget,
/// `Some(Some(id))` held, `None` when there is no room (or no
/// reservation to be had), counted.
async fn hold(
    state: &AppState,
    route: &str,
    provider: &crate::certification::ServedProvider,
    served: &ServedContract,
    messages: &[Message],
    key: &str,
) -> Option<Option<String>> {
    let spending = &state.inner.spending;
    if spending.of_checks(route).next().is_none() {
        return Some(None);
    }
    let worst = crate::spend::worst_case(provider, served, messages).await;
    let charges = spending.check_charges(route, worst, crate::spend::now_ms());
    let id = format!("{key}#{:016x}", rand::random::<u64>());
    match state.inner.store.hold_for_check(&id, &charges).await {
        Ok(()) => Some(Some(id)),
        Err(e) => {
            not_made(state, route);
            let refusal = state.inner.refused(&e, "", None);
            tracing::info!(%route, provider = %provider.config.id, detail = %refusal.detail, "live check not asked: no reservation of its budget");
            None
        }
    }
}

/// Settles, to their worst case, the holds of checks whose router is gone:
/// those unsettled for twice the longest check's timeout and a minute more.
pub async fn settle_stale_checks(state: &AppState) {
    if !state
        .inner
        .spending
        .budgets
        .iter()
        .any(|b| matches!(b.payer, crate::config::Payer::Checks(_)))
    {
        return;
    }
    let longest = state
        .inner
        .routes
        .values()
        .filter_map(|r| r.shadow.as_ref().map(|s| s.timeout))
        .max()
        .unwrap_or_default();
    let age = longest.saturating_mul(2) + Duration::from_secs(60);
    match state.inner.store.settle_stale_checks(age, 100).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            count = n,
            "live checks' holds left by a router that stopped settled to their worst case"
        ),
        Err(e) => tracing::warn!(error = %e, "stale live checks' holds cannot be settled"),
    }
}

fn seen(outcome: LiveOutcome) -> Seen {
    match outcome {
        LiveOutcome::Kept => Seen::Kept,
        LiveOutcome::Broke => Seen::Broke,
        LiveOutcome::Disagreed => Seen::Disagreed,
        LiveOutcome::Failed => Seen::Failed,
    }
}

/// The scheduled re-checks due now: for each route with `recheck_every`,
/// at most one (provider, certification case) pair per call, spread over
/// the interval, within the route's budget, on the task tracker. Called
/// from the background loop.
pub fn recheck_due(state: &AppState) {
    for route in state.inner.routes.values() {
        let (Some(every), Some(shadow)) = (route.recheck_every, route.shadow.as_ref()) else {
            continue;
        };
        let Some(served) = state.inner.contracts.get(&route.contract) else {
            continue;
        };
        let cases = served.contract.cases.len();
        let pairs = route.providers.len() * cases;
        let Some(slot) = state.inner.rechecks.due(&route.id, every, pairs) else {
            continue;
        };
        let (provider, case) = (route.providers[slot / cases].clone(), slot % cases);
        let Some(in_flight) = take_budget(state, &route.id, &provider, shadow) else {
            continue;
        };
        let (state_now, route, served) = (state.clone(), route.clone(), served.clone());
        let timeout = shadow.timeout;
        state.inner.tasks.spawn(async move {
            let Ok(_permit) = in_flight.acquire_owned().await else {
                return;
            };
            recheck(&state_now, &route, &served, &provider, case, timeout).await;
        });
    }
}

/// Runs certification case `case` of the route's contract through
/// `provider`, if it is eligible now, and records what it found.
async fn recheck(
    state: &AppState,
    route: &Route,
    served: &Arc<ServedContract>,
    provider: &str,
    case: usize,
    timeout: Duration,
) {
    let eligible = match state.inner.certifier().await {
        Ok(certifier) => certifier.eligibility(provider, served).0.certified(),
        Err(_) => false,
    };
    let contract = &served.contract;
    let (Some(case), true) = (contract.cases.get(case), eligible) else {
        return;
    };
    let Ok(rendered) = contract.render(&case.input) else {
        return;
    };
    let messages = surety_exchange::messages(&rendered);
    let key = format!("surety-recheck-{}-{provider}-{}", route.id, case.name);
    let Some((mut outcome, mut detail, answer)) = ask(
        state,
        (&route.id, served),
        (&case.input, &messages),
        None,
        (provider, &key),
        timeout,
    )
    .await
    else {
        return;
    };
    if outcome == LiveOutcome::Kept
        && let Some(answer) = &answer
    {
        let wrong = contract.check_facts(case, answer);
        if !wrong.is_empty() {
            outcome = LiveOutcome::Broke;
            detail = format!(
                "case `{}`: {}",
                case.name,
                surety_exchange::describe_all(&wrong)
            );
        }
    } else if outcome == LiveOutcome::Broke {
        detail = format!("case `{}`: {detail}", case.name);
    }
    let result = LiveResult {
        provider: provider.to_owned(),
        contract: contract.id.clone(),
        route: route.id.clone(),
        source: LiveSource::Recheck,
        outcome,
        detail,
        job_id: None,
        case_name: Some(case.name.clone()),
        input: case.input.clone(),
        expected: serde_json::to_value(&case.expect).ok(),
        answer,
        at_ms: 0,
    };
    record(state, served, result).await;
}

/// Records `result`, and demotes its provider for the contract when the
/// contract's thresholds say so.
pub async fn record(state: &AppState, served: &ServedContract, result: LiveResult) {
    let metrics = &state.inner.metrics;
    metrics
        .live_checks
        .with_label_values(&[
            &result.provider,
            &result.contract,
            result.source.as_str(),
            result.outcome.as_str(),
        ])
        .inc();
    let store = &state.inner.store;
    if let Err(e) = store.record_live(&result).await {
        tracing::warn!(error = %e, provider = %result.provider, "a live result could not be recorded");
        return;
    }
    let live = &served.contract.live;
    let window = match store
        .live_verdicts(&result.provider, &result.contract, live.window)
        .await
    {
        Ok(window) => window,
        Err(e) => {
            tracing::warn!(error = %e, "the live window cannot be read");
            return;
        }
    };
    let judged: Vec<Judged<'_>> = window
        .iter()
        .map(|r| Judged {
            seen: seen(r.outcome),
            recheck: r.source == LiveSource::Recheck,
            detail: &r.detail,
        })
        .collect();
    let Some(reason) = live.demotion(&judged) else {
        return;
    };
    match store
        .demote(&result.provider, &result.contract, &reason)
        .await
    {
        Ok(true) => {
            metrics
                .demotions
                .with_label_values(&[&result.provider, &result.contract])
                .inc();
            tracing::warn!(provider = %result.provider, contract = %result.contract, %reason, "provider demoted for the contract");
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "a demotion could not be recorded"),
    }
}

/// Records as lifted the demotions a certification newer than them lifts
/// (the verdicts already do not count them).
pub async fn lift_certified(state: &AppState) {
    let Ok(certifier) = state.inner.certifier().await else {
        return;
    };
    for (demotion, certified_at_ms) in certifier.lifted_by_certification() {
        let lift = surety_store::Lift::Certification { certified_at_ms };
        if let Err(e) = state
            .inner
            .store
            .lift(&demotion.provider, &demotion.contract, &lift)
            .await
        {
            tracing::warn!(error = %e, "a lifted demotion could not be recorded");
        }
    }
}

/// The longest reason an admin may record for a reinstate.
pub const MAX_REINSTATE_REASON: usize = 500;

/// Why a reinstate did not happen; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ReinstateError {
    #[error("`reason` says why, in 1 to {MAX_REINSTATE_REASON} characters")]
    Reason,
    #[error("`{provider}` is not demoted for `{contract}`")]
    NotDemoted { provider: String, contract: String },
    #[error(transparent)]
    Store(#[from] surety_store::StoreError),
}

/// An admin's reinstate (the API's and the operator page's alike): lifts
/// the demotion of `provider` for `contract`, recorded with who (`by`) and
/// why; the provider is eligible again as far as its certification goes,
/// and the next live checks judge it afresh.
pub async fn reinstate(
    state: &AppState,
    (provider, contract): (&str, &str),
    by: &str,
    reason: &str,
) -> Result<(), ReinstateError> {
    let reason = reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REINSTATE_REASON {
        return Err(ReinstateError::Reason);
    }
    let lift = surety_store::Lift::Admin {
        by: by.to_owned(),
        why: reason.to_owned(),
    };
    if !state.inner.store.lift(provider, contract, &lift).await? {
        return Err(ReinstateError::NotDemoted {
            provider: provider.to_owned(),
            contract: contract.to_owned(),
        });
    }
    tracing::warn!(%provider, %contract, %by, %reason, "reinstated by an admin");
    Ok(())
}

/// `surety cases export`: the inputs of route `route` on which a fallback
/// broke the contract or disagreed (or only `outcome`), since `since_ms`,
/// as proposed cases of its contract in `cases.toml`'s format, each saying
/// where and when it came from; the job's answer on the agreement pointers
/// is the proposed `expect`. For a person to review and merge into the
/// contract: the router never writes into `contracts/`.
pub async fn export_cases(
    config: &crate::config::RouterConfig,
    route: &str,
    since_ms: i64,
    outcome: Option<LiveOutcome>,
) -> anyhow::Result<String> {
    use anyhow::Context;
    let found = config
        .routes
        .get(route)
        .with_context(|| format!("no route `{route}` in the configuration"))?;
    let contract = surety_contracts::Contract::load(&config.contracts.join(&found.contract))
        .with_context(|| format!("loading contract `{}`", found.contract))?;
    let store = surety_store::Store::open_with(&config.store_options())
        .await
        .context("opening the database")?;
    let results = store.live_results(route, since_ms, outcome).await?;
    let mut cases = Vec::new();
    for r in results.iter().filter(|r| r.source == LiveSource::Shadow) {
        // Only an input the contract renders is a case (an output-only
        // chat job's input is a whole request).
        if contract.render(&r.input).is_err() {
            continue;
        }
        let expect = r
            .expected
            .as_ref()
            .and_then(Value::as_object)
            .map(|fields| {
                fields
                    .iter()
                    .map(|(pointer, value)| surety_contracts::Expectation {
                        pointer: pointer.clone(),
                        equals: Some(value.clone()),
                        one_of: None,
                        contains: None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let job = r.job_id.as_ref().map_or("?", |j| j.0.as_str());
        let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(r.at_ms) * 1_000_000)
            .map(surety_manifest::now_rfc3339)
            .unwrap_or_default();
        let comment = format!(
            "From a shadow call of job {job} at provider `{}`, {at}: {} — {}\nThe expected facts are the job's answer on the agreement pointers: check them before merging.",
            r.provider,
            r.outcome.as_str(),
            r.detail
        );
        let name = format!("live-{}-{}", r.provider, cases.len() + 1);
        cases.push((
            comment,
            surety_contracts::Case {
                name,
                input: r.input.clone(),
                expect,
            },
        ));
    }
    let head = format!(
        "# Proposed cases for contract `{}` from route `{route}`'s live checks ({} of them), by `surety cases export`.\n# Review each, then merge into {}/cases.toml; certification covers them from then on.\n\n",
        contract.id,
        cases.len(),
        contract.dir.display()
    );
    Ok(head + &surety_contracts::cases_toml(&cases)?)
}
