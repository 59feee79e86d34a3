//! The operational endpoints: the providers with their certification,
//! liveness, readiness, metrics and the OpenAPI document.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use surety_config::Facade;

use super::error::ApiError;
use super::error::Problem;
use super::extract::{Caller, JsonObject, PathParams};
use super::responses::{HeadersTooLarge, Limited, NotJson, TooLarge, Unauthorized, Unavailable};
use super::views::{
    BudgetList, CertificationView, DriftView, PriceView, ProblemView, ProviderList, ProviderView,
    Readiness, ReconciliationView, Reinstate, RouteView,
};
use crate::state::AppState;

/// Providers with their certification per contract, and the routes.
#[utoipa::path(get, path = "/v1/providers", tag = "providers", responses((status = 200, description = "Providers and routes; a provider demoted for a contract by the router's own checks says `demoted`, with the reason", body = ProviderList), Unauthorized, Limited, Unavailable))]
pub(super) async fn providers(
    State(state): State<AppState>,
    _caller: Caller,
) -> Result<Json<ProviderList>, ApiError> {
    Ok(Json(provider_list(&state).await?))
}

/// The caller's budgets (its owner's, and its key's) as the database holds
/// them now: limit, spent, reserved, held by unknown attempts, what is
/// left and when each resets.
#[utoipa::path(get, path = "/v1/budget", tag = "budgets", responses((status = 200, description = "The caller's budgets; none when none is configured for it", body = BudgetList), Unauthorized, Limited, Unavailable))]
pub(super) async fn budget(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
) -> Result<Json<BudgetList>, ApiError> {
    Ok(Json(
        budget_list(&state.inner, &key.owner, key.name.as_deref()).await?,
    ))
}

/// The budgets of a job of `owner` asked for with the key named `key`, as
/// the database holds them now.
async fn budget_list(
    inner: &crate::state::Inner,
    owner: &str,
    key: Option<&str>,
) -> Result<BudgetList, surety_store::StoreError> {
    let now = crate::spend::now_ms();
    let mut budgets = Vec::new();
    for budget in inner.spending.of(owner, key) {
        let window = budget.window(now);
        let status = inner
            .store
            .budget(&budget.name, window.counts_from_ms)
            .await?;
        let amount = |n: i64| match budget.unit {
            crate::config::BudgetUnit::Money(_) => n as f64 / 1e6,
            crate::config::BudgetUnit::Tokens => n as f64,
        };
        budgets.push(super::views::BudgetView {
            name: budget.name.clone(),
            counts: match budget.payer {
                crate::config::Payer::Owner(_) => "owner",
                crate::config::Payer::Key(_) => "key",
                crate::config::Payer::Checks(_) => "route-checks",
            },
            unit: match &budget.unit {
                crate::config::BudgetUnit::Money(currency) => currency.clone(),
                crate::config::BudgetUnit::Tokens => "tokens".to_owned(),
            },
            period: match budget.period {
                crate::config::Period::Day => "day",
                crate::config::Period::Month => "month",
                crate::config::Period::Rolling(_) => "rolling",
                crate::config::Period::Total => "total",
            },
            window_ms: match budget.period {
                crate::config::Period::Rolling(w) => {
                    Some(u64::try_from(w.as_millis()).unwrap_or(u64::MAX))
                }
                _ => None,
            },
            at_limit: match budget.at_limit {
                crate::config::AtLimit::Refuse => "refuse",
                crate::config::AtLimit::Record => "record",
            },
            limit: amount(budget.limit),
            spent: amount(status.spent),
            reserved: amount(status.held),
            held_by_unknown: amount(status.held_by_unknown),
            left: amount((budget.limit - status.spent - status.held).max(0)),
            resets_at: crate::spend::resets(budget, window, status.oldest_bucket_ms)
                .map(crate::spend::rfc3339),
        });
    }
    Ok(BudgetList { budgets })
}

/// Lifts the router's demotion of a provider for a contract (admin keys
/// only), recorded with who and why; the provider is eligible again as far
/// as its certification goes, and the next live checks judge it afresh.
#[utoipa::path(post, path = "/v1/providers/{provider}/contracts/{contract}/reinstate", tag = "providers",
    params(("provider" = String, Path, description = "The provider's id"), ("contract" = String, Path, description = "The contract's id")),
    request_body(content = Reinstate, content_type = "application/json"),
    responses(
        (status = 200, description = "Reinstated: the providers as they are now", body = ProviderList),
        (status = 400, description = "A body that is not a reason", body = ProblemView, content_type = "application/problem+json"),
        (status = 403, description = "Not an admin key", body = ProblemView, content_type = "application/problem+json"),
        (status = 404, description = "The provider is not demoted for the contract", body = ProblemView, content_type = "application/problem+json"),
        Unauthorized, Limited, TooLarge, NotJson, HeadersTooLarge, Unavailable))]
pub(super) async fn reinstate(
    State(state): State<AppState>,
    Caller(key, _admitted): Caller,
    PathParams((provider, contract)): PathParams<(String, String)>,
    JsonObject(body): JsonObject<Reinstate>,
) -> Result<Json<ProviderList>, ApiError> {
    if !key.admin {
        return Err(ApiError::new(
            Problem::Forbidden,
            "reinstating a demoted provider needs an admin key",
        ));
    }
    crate::live::reinstate(
        &state,
        (&provider, &contract),
        &format!("an admin of {}", key.owner),
        &body.reason,
    )
    .await?;
    Ok(Json(provider_list(&state).await?))
}

/// Alive.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()), responses((status = 200, description = "Alive", body = String, content_type = "text/plain")))]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// Ready when a manifest is in force.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    security(()),
    responses(
        (status = 200, description = "A manifest is in force and the database answers", body = Readiness),
        (status = 503, description = "No valid manifest, or the database is down", body = Readiness),
    )
)]
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    let manifest = state.inner.manifest.current();
    let database = match tokio::time::timeout(
        state.inner.settings.database_timeout,
        state.inner.store.ping(),
    )
    .await
    {
        Ok(Ok(())) => None,
        // In words, without the driver's text (addresses, users): the
        // details are for the log, not for whoever asks /readyz.
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "/readyz: the database did not answer its ping");
            Some(
                match e.outage() {
                    Some(surety_store::Outage::Full) => "it is full",
                    Some(surety_store::Outage::Unavailable) => "it cannot be reached",
                    None => "it refused the round trip",
                }
                .to_owned(),
            )
        }
        Err(_) => Some(format!(
            "no answer within {} ms",
            state.inner.settings.database_timeout.as_millis()
        )),
    };
    let ready = manifest.is_some() && database.is_none();
    let body = Readiness {
        ready,
        database: if database.is_none() { "up" } else { "down" }.to_owned(),
        database_error: database,
        manifest_entries: manifest.as_ref().map(|m| m.entries.len()),
        manifest_generated_at: manifest.as_ref().map(|m| m.generated_at.clone()),
        last_reload_refused: state.inner.manifest.refused(),
    };
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "operations", security(()), responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let m = &state.inner.metrics;
    match state.inner.store.unknown_attempts().await {
        Ok(n) => m.unknown_attempts_open.set(n),
        Err(e) => tracing::warn!(error = %e, "cannot count unknown attempts"),
    }
    for (budget, status) in state.inner.spending.statuses(&state.inner.store).await {
        let labels = [
            budget.name.as_str(),
            budget.owner(&state.inner.spending),
            budget.store_unit().as_str(),
        ];
        m.budget_spent.with_label_values(&labels).set(status.spent);
        m.budget_reserved
            .with_label_values(&labels)
            .set(status.held);
        m.budget_held_by_unknown
            .with_label_values(&labels)
            .set(status.held_by_unknown);
    }
    m.live_budget_share.reset();
    for spent in state.inner.budgets.spent() {
        m.live_budget_share
            .with_label_values(&[&spent.route, &spent.provider])
            .set(spent.share());
    }
    if let Some(manifest) = state.inner.manifest.current() {
        m.manifest_entries.set(manifest.entries.len() as i64);
        if let Ok(at) = surety_manifest::parse_time(&manifest.generated_at) {
            m.manifest_age_seconds
                .set((time::OffsetDateTime::now_utc() - at).whole_seconds());
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.render(),
    )
        .into_response()
}

/// This document, derived from the handlers and the configured routes.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", security(()), responses((status = 200, description = "The OpenAPI document", content_type = "application/json")))]
pub(super) async fn openapi(axum::Extension(doc): axum::Extension<Arc<Value>>) -> Json<Arc<Value>> {
    Json(doc)
}

/// Every provider with its certification per contract (in words, from the
/// manifest against the configuration now), and the routes.
pub async fn provider_list(state: &AppState) -> Result<ProviderList, surety_store::StoreError> {
    let certifier = state.inner.certifier().await?;
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
                    let (verdict, models) = certifier.eligibility(id, c);
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
                reconciliation: ReconciliationView::of(served.config.reconciliation()),
                price: served.config.price.as_ref().map(PriceView::of),
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
    Ok(ProviderList {
        object: "list".to_owned(),
        data,
        routes,
    })
}
