//! The pages that read: the attention queue (unknown and failed jobs), a
//! job with its attempts, the certification matrix with what the live
//! checks found and cost, and one provider × contract's live results.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use surety_core::{AttemptState, JobState};
use surety_store::LiveOutcome;

use super::session::{operator, to_sign_in};
use super::views::{
    AttemptCount, AttemptRow, BudgetRow, CertificationPage, CertificationRow, Figure, JobPage,
    JobSummary, LivePage, LiveRow, QueuePage, QueueRow, RaceRow, StateCount, ToolCallRow,
};
use super::{MAX_WAIT_S, QUEUE_LENGTH, page};
use crate::http::error::ApiError;
use crate::http::extract::job_id;
use crate::metrics::Metrics;
use crate::state::AppState;

pub(super) use crate::spend::now_ms;

/// `ms` as `2 h 5 m`, `3 m 12 s` or `41 s`.
pub(super) fn age(ms: i64) -> String {
    let s = Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0)).as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} m {} s", s / 60, s % 60),
        _ => format!("{} h {} m", s / 3600, s % 3600 / 60),
    }
}

pub(super) fn when(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map(surety_manifest::now_rfc3339)
        .unwrap_or_default()
}

pub(super) async fn queue(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(op) = operator(&state, &headers) else {
        return to_sign_in();
    };
    let (unknown, failed) = match state
        .inner
        .store
        .attention(op.scope.as_ref(), QUEUE_LENGTH)
        .await
    {
        Ok(lists) => lists,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let now = now_ms();
    let rows = |jobs: &[surety_store::Job]| -> Vec<QueueRow> {
        jobs.iter()
            .map(|j| QueueRow {
                id: j.id.0.clone(),
                age: age(now - j.updated_at_ms),
                route: j.route.clone(),
                provider: String::new(),
                known: String::new(),
            })
            .collect()
    };
    let (mut unknown_rows, mut failed_rows) = (rows(&unknown), rows(&failed));
    // What is known: the last attempt's provider and error.
    for (rows, jobs) in [(&mut unknown_rows, &unknown), (&mut failed_rows, &failed)] {
        for (row, job) in rows.iter_mut().zip(jobs.iter()) {
            if let Ok(attempts) = state.inner.store.attempts(&job.owner, &job.id).await
                && let Some(last) = attempts.last()
            {
                row.provider.clone_from(&last.provider);
                row.known = last.error.clone().unwrap_or_default();
            }
        }
    }
    let m = &state.inner.metrics;
    let figure = |name, value| Figure { name, value };
    let figures = vec![
        figure(
            "jobs created (this router)",
            crate::metrics::series(&m.jobs_created)
                .iter()
                .map(|(_, n)| n)
                .sum(),
        ),
        figure("replays answered", m.replays.get()),
        figure("late results discarded", m.late_results_discarded.get()),
        figure(
            "answers held while the database was away",
            u64::try_from(m.results_held.get()).unwrap_or(0),
        ),
        figure("jobs pruned past retention", m.pruned_jobs.get()),
    ];
    let by_state = state
        .inner
        .store
        .jobs_by_state(op.scope.as_ref())
        .await
        .unwrap_or_default();
    let by_state: Vec<StateCount> = by_state
        .iter()
        .map(|(state, n)| StateCount {
            state: state.to_string(),
            count: u64::try_from(*n).unwrap_or(0),
        })
        .collect();
    // Attempts by provider and outcome, as this router counted them.
    let attempts = crate::metrics::series(&m.attempts)
        .into_iter()
        .map(|(labels, count)| {
            let label = |name: &str| {
                labels
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(String::new(), |(_, v)| v.clone())
            };
            AttemptCount {
                provider: label("provider"),
                outcome: label("outcome"),
                count,
            }
        })
        .collect();
    let budgets = state
        .inner
        .spending
        .rows(&state.inner.store, op.scope.as_ref().map(|o| o.0.as_str()))
        .await
        .into_iter()
        .map(|(budget, status, resets)| BudgetRow {
            name: budget.name.clone(),
            whom: budget.for_whom(),
            limit: budget.say(budget.limit),
            spent: budget.say(status.spent),
            reserved: budget.say(status.held),
            held_by_unknown: budget.say(status.held_by_unknown),
            resets: resets_at(resets),
        })
        .collect();
    page(
        StatusCode::OK,
        "queue.html",
        QueuePage {
            operator: op.view(),
            unknown: unknown_rows,
            failed: failed_rows,
            figures,
            by_state,
            attempts,
            budgets,
        },
    )
}

#[derive(Deserialize)]
pub(super) struct JobQuery {
    /// Seconds to wait for the job to come to rest first (after a retry).
    wait: Option<u64>,
}

pub(super) async fn job_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<JobQuery>,
) -> Response {
    let id = match job_id(&id) {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    let Some(op) = operator(&state, &headers) else {
        return to_sign_in();
    };
    let owner = match op.owner_of(&state, &id).await {
        Ok(owner) => owner,
        Err(e) => return e.into_response(),
    };
    let found = match query.wait {
        Some(seconds) => match state.inner.store.job(&owner, &id).await {
            Ok(job) => {
                let seen = crate::jobs::CreatedJob::watched(&state, job);
                let limit = Duration::from_secs(seconds.min(MAX_WAIT_S));
                crate::jobs::wait_at_rest(&state, &owner, seen, limit)
                    .await
                    .map(|(_, job, attempts)| (job, attempts))
            }
            Err(e) => Err(e.into()),
        },
        None => state
            .inner
            .store
            .job_and_attempts(&owner, &id)
            .await
            .map_err(Into::into),
    };
    let (job, attempts) = match found {
        Ok(found) => found,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let races = state
        .inner
        .store
        .races(&owner, &id)
        .await
        .unwrap_or_default();
    let questions = state
        .inner
        .store
        .questions(&owner, &id)
        .await
        .unwrap_or_default();
    let reservations = state
        .inner
        .store
        .reservations(&owner, &id)
        .await
        .unwrap_or_default();
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let attempts = attempts
        .iter()
        .map(|a| {
            let ended = a.finished_at_ms.or(a.unknown_since_ms);
            let way = state
                .inner
                .providers
                .get(&a.provider)
                .map(|p| p.config.reconciliation());
            let asking = match (a.state, way) {
                (AttemptState::Unknown, Some(way)) => {
                    crate::http::views::ReconciliationView::of(way).how
                }
                (AttemptState::Unknown, None) => {
                    "cannot be asked: the provider is no longer configured".to_owned()
                }
                _ => String::new(),
            };
            AttemptRow {
                ordinal: a.ordinal,
                hedge: a.slot == surety_store::Slot::Hedge,
                provider: a.provider.clone(),
                state: a.state.as_str(),
                started: when(a.started_at_ms),
                ended: ended.map(when).unwrap_or_default(),
                took: ended.map(|e| age(e - a.started_at_ms)).unwrap_or_default(),
                error: a.error.clone().unwrap_or_default(),
                open: matches!(a.state, AttemptState::Started | AttemptState::Unknown),
                response_id: a.provider_response_id.clone().unwrap_or_default(),
                asking,
                budget: reservations
                    .iter()
                    .filter(|r| r.ordinal == a.ordinal)
                    .map(|r| state.inner.spending.say(r))
                    .collect(),
                questions: questions
                    .iter()
                    .filter(|q| q.ordinal == a.ordinal)
                    .map(|q| {
                        format!(
                            "asked {} at {} by {}: {} — {}",
                            q.provider,
                            when(q.asked_at_ms),
                            q.asked_by,
                            q.outcome.replace('_', " "),
                            q.detail
                        )
                    })
                    .collect(),
            }
        })
        .collect();
    let races = races
        .iter()
        .map(|r| RaceRow {
            loser: r.loser_ordinal,
            winner: r
                .winner_ordinal
                .map_or("nobody".to_owned(), |w| format!("attempt {w}")),
            reason: r.reason.clone(),
            at: when(r.at_ms),
        })
        .collect();
    let summary = JobSummary {
        id: job.id.0.clone(),
        state: job.state.as_str(),
        retryable: matches!(job.state, JobState::Queued | JobState::Failed),
        route: job.route.clone(),
        contract: job.contract.clone(),
        key: job.key.clone(),
        created: when(job.created_at_ms),
        kind: job.kind.as_str(),
        response_id: (job.kind == surety_store::JobKind::Responses)
            .then(|| crate::http::views::response_id(&job)),
        continues: crate::http::views::continues(&job).map(|id| id.0),
        input: pretty(&job.input),
        result: job.result.as_ref().map(pretty),
        tool_calls: tool_calls(&state, &job, pretty),
    };
    page(
        StatusCode::OK,
        "job.html",
        JobPage {
            operator: op.view(),
            job: summary,
            attempts,
            races,
        },
    )
}

/// A tool-call contract's answer, a row per call: the tool and its arguments.
fn tool_calls(
    state: &AppState,
    job: &surety_store::Job,
    pretty: impl Fn(&Value) -> String,
) -> Vec<ToolCallRow> {
    let tool_contract = state
        .inner
        .contracts
        .get(&job.contract)
        .is_some_and(|served| served.contract.tool_calls.is_some());
    let (true, Some(answer)) = (tool_contract, &job.result) else {
        return Vec::new();
    };
    surety_contracts::calls(answer)
        .into_iter()
        .map(|(_, call)| ToolCallRow {
            tool: call["tool"].as_str().unwrap_or_default().to_owned(),
            arguments: pretty(&call["arguments"]),
        })
        .collect()
}

pub(super) async fn certification(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(op) = operator(&state, &headers) else {
        return to_sign_in();
    };
    let list = match crate::http::provider_list(&state).await {
        Ok(list) => list,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut rows = Vec::new();
    for route in &list.routes {
        let shadowed = state
            .inner
            .routes
            .get(&route.id)
            .is_some_and(|r| r.shadow.is_some());
        for provider in &route.providers {
            let Some(p) = list.data.iter().find(|p| &p.id == provider) else {
                continue;
            };
            let Some(c) = p.certification.get(&route.contract) else {
                continue;
            };
            let Some((provider, served)) = state.inner.configured(provider, &route.contract) else {
                continue;
            };
            // The window's outcomes are enough here: its verdicts, no JSON.
            let contract = &served.contract;
            let verdicts = state
                .inner
                .store
                .live_verdicts(provider, &contract.id, contract.live.window)
                .await;
            let live = match verdicts {
                Ok(window) => summary(&window.iter().map(|v| v.outcome).collect::<Vec<_>>()),
                Err(e) => return ApiError::from(e).into_response(),
            };
            rows.push(CertificationRow {
                route: route.id.clone(),
                contract: route.contract.clone(),
                provider: provider.to_owned(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                expires: c.expires_at.clone().unwrap_or_default(),
                drift: p
                    .drift
                    .as_ref()
                    .map(|d| format!("model {} answered at {}", d.model, d.at)),
                live,
                cost: shadowed.then(|| cost(&state, &route.id, provider, &route.contract)),
                page: format!("/ui/certification/{provider}/{}", served.contract.id),
                demoted: c.status == "demoted",
                cache: cache_tokens(&state, provider),
            });
        }
    }
    let manifest = match state.inner.manifest.current() {
        Some(m) => format!(
            "Manifest generated at {} with {} entries{}.",
            m.generated_at,
            m.entries.len(),
            if state.inner.manifest.refused().is_some() {
                "; the last reload was refused, so this is the last good one"
            } else {
                ""
            }
        ),
        None => "No valid manifest is in force: nothing is routed.".to_owned(),
    };
    page(
        StatusCode::OK,
        "certification.html",
        CertificationPage {
            operator: op.view(),
            rows,
            manifest,
        },
    )
}

/// A provider's prompt-cache tokens, as `/metrics` counts them on this
/// replica: `1200 read, 300 written`.
fn cache_tokens(state: &AppState, provider: &str) -> String {
    let metrics = &state.inner.metrics;
    let [read, written] = [&metrics.cache_read_tokens, &metrics.cache_write_tokens]
        .map(|counter| counter.with_label_values(&[provider]).get());
    format!("{read} read, {written} written")
}

/// A window of live results' outcomes in a sentence: `3 kept, 1 broke of
/// the last 4 live checks`.
fn summary(window: &[LiveOutcome]) -> String {
    if window.is_empty() {
        return "no live checks yet".to_owned();
    }
    let counts: Vec<String> = [
        LiveOutcome::Kept,
        LiveOutcome::Broke,
        LiveOutcome::Disagreed,
        LiveOutcome::Failed,
    ]
    .iter()
    .filter_map(|outcome| {
        let n = window.iter().filter(|seen| *seen == outcome).count();
        (n > 0).then(|| format!("{n} {}", outcome.as_str()))
    })
    .collect();
    format!(
        "{} of the last {} live checks",
        counts.join(", "),
        window.len()
    )
}

/// What the live checks of `provider` for `contract` cost on this router:
/// calls, tokens and its share of `route`'s hourly budget.
fn cost(state: &AppState, route: &str, provider: &str, contract: &str) -> String {
    let m = &state.inner.metrics;
    let labels = [("provider", provider), ("contract", contract)];
    let calls = Metrics::sum_where(&m.live_checks, &labels);
    let tokens = Metrics::sum_where(&m.live_tokens, &labels);
    let hourly = state
        .inner
        .routes
        .get(route)
        .and_then(|r| r.shadow.as_ref())
        .map_or(0, |s| s.hourly_budget);
    let (spent, share) = state
        .inner
        .budgets
        .spent()
        .into_iter()
        .find(|s| s.route == route && s.provider == provider)
        .map_or((0, 0.0), |s| (s.calls, s.share() * 100.0));
    format!(
        "calls: {calls}, tokens: {tokens} (since this router started); budget: {spent} of the route's {hourly} calls this hour ({share:.0} %)"
    )
}

/// `/ui/certification/{provider}/{contract}`: one provider × contract, its
/// certification, its demotion and its window of live results, and a way
/// When a budget resets, in words: never for a total.
fn resets_at(resets: Option<i64>) -> String {
    resets
        .map(when)
        .unwrap_or_else(|| "never (a total)".to_owned())
}

/// to reinstate it when demoted.
pub(super) async fn live_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((provider, contract)): Path<(String, String)>,
) -> Response {
    let Some(op) = operator(&state, &headers) else {
        return to_sign_in();
    };
    let Some((provider, served)) = state.inner.configured(&provider, &contract) else {
        return super::actions::not_configured(&provider, &contract).into_response();
    };
    let contract = &served.contract.id;
    let list = match crate::http::provider_list(&state).await {
        Ok(list) => list,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let certification = list
        .data
        .iter()
        .find(|p| p.id == provider)
        .and_then(|p| p.certification.get(contract));
    let (status, reason) = certification.map_or(("missing".to_owned(), String::new()), |c| {
        (c.status.clone(), c.reason.clone())
    });
    let window = state
        .inner
        .store
        .live_window(provider, contract, served.contract.live.window)
        .await;
    let window = match window {
        Ok(window) => window,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // Each route of this contract through this provider that runs live
    // checks, and what they spent of its checks budget, beside it.
    let live: Vec<&str> = state
        .inner
        .routes
        .values()
        .filter(|r| r.contract == *contract && r.shadow.is_some())
        .filter(|r| r.providers.iter().any(|p| p == provider))
        .map(|r| r.id.as_str())
        .collect();
    let mut costs: Vec<String> = live
        .iter()
        .map(|route| format!("route {route}: {}", cost(&state, route, provider, contract)))
        .collect();
    for (budget, status, resets) in state.inner.spending.rows(&state.inner.store, None).await {
        if let crate::config::Payer::Checks(route) = &budget.payer
            && live.contains(&route.as_str())
        {
            costs.push(format!(
                "route {route}'s checks budget `{}`: {} spent and {} held of {}; it resets {}",
                budget.name,
                budget.say(status.spent),
                budget.say(status.held),
                budget.say(budget.limit),
                resets_at(resets),
            ));
        }
    }
    let results = window
        .iter()
        .map(|r| LiveRow {
            at: when(r.at_ms),
            source: r.source.as_str(),
            outcome: r.outcome.as_str(),
            detail: r.detail.clone(),
            job: r.job_id.as_ref().map(|j| j.0.clone()),
            case: r.case_name.clone().unwrap_or_default(),
        })
        .collect();
    page(
        StatusCode::OK,
        "live.html",
        LivePage {
            operator: op.view(),
            provider: provider.to_owned(),
            contract: contract.clone(),
            demoted: status == "demoted",
            status,
            reason,
            summary: summary(&window.iter().map(|r| r.outcome).collect::<Vec<_>>()),
            costs,
            results,
        },
    )
}
