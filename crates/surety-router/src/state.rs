//! The router's shared state, built once from a validated configuration:
//! the store, the providers and contracts as served, the manifest, the
//! limits, the sessions, and the work in flight. Every handler and every
//! dispatcher takes it; it is cheap to clone. (The background work that
//! runs on it is `app.rs`'s.)

use std::collections::BTreeMap;
use std::sync::Arc;

use surety_exchange::pinning::UserTemplate;
use surety_store::Store;

use crate::auth::{Failures, Sessions};
use crate::certification::{Certifier, Drift, ManifestHolder, ServedContract, ServedProvider};
use crate::config::{ApiKey, Route, RouterConfig, Settings};
use crate::live::budget::{Budgets, Rechecks};
use crate::metrics::Metrics;
use crate::settled::Settled;

/// Everything a request handler or a dispatcher needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub inner: Arc<Inner>,
}

#[derive(Debug)]
pub struct Inner {
    pub store: Store,
    pub providers: BTreeMap<String, ServedProvider>,
    pub routes: BTreeMap<String, Route>,
    /// Shared with every job driven against them.
    pub contracts: BTreeMap<String, Arc<ServedContract>>,
    /// The work of every job (its creation once a request has asked for
    /// it, its dispatch, heartbeats, provider calls, late results), so
    /// shutdown (and a test) can wait for it and none of it runs untracked.
    pub tasks: tokio_util::task::TaskTracker,
    /// The last answer per provider from a model its certificate did not see.
    pub drift: std::sync::Mutex<BTreeMap<String, Drift>>,
    pub api_keys: BTreeMap<String, ApiKey>,
    /// The settings, as the file gave them.
    pub settings: Settings,
    pub manifest: ManifestHolder,
    pub metrics: Metrics,
    /// Per-owner limits on rate and requests in flight.
    pub limits: Limits,
    /// The attempts this router is calling a provider for right now: what a
    /// shutdown marks `unknown` when its grace period runs out.
    pub in_flight: std::sync::Mutex<BTreeMap<(String, i64), surety_store::AttemptHandle>>,
    /// A reconciler's pass is running: the next waits for it to end.
    pub reconciling: std::sync::atomic::AtomicBool,
    /// Wakes the requests waiting on a job when it settles here.
    pub settled: Arc<Settled>,
    /// The operator's signed-in sessions.
    pub sessions: Sessions,
    /// Failed authentications per client address.
    pub failures: Failures,
    /// Each route's budget for its shadow checks and re-checks.
    pub budgets: Budgets,
    /// The owners' and keys' budgets, charged per attempt.
    pub spending: crate::spend::Spending,
    /// When each route's next scheduled re-check is due.
    pub rechecks: Rechecks,
    /// The open demotions as this router last read them (every eligibility
    /// read from the database refreshes it; the background loop reads
    /// every 2 s).
    pub demotions_seen: std::sync::RwLock<Arc<Vec<surety_store::Demotion>>>,
}

impl Inner {
    /// Eligibility against the providers, the manifest and the open
    /// demotions as they are now (the demotions read from the database,
    /// so a demotion any replica decided counts at once). What was read
    /// is kept as this router's copy, for [`Inner::certifier_seen`].
    pub async fn certifier(&self) -> Result<Certifier<'_>, surety_store::StoreError> {
        let demotions = Arc::new(self.store.demotions().await?);
        *self
            .demotions_seen
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = demotions.clone();
        Ok(Certifier {
            providers: &self.providers,
            manifest: &self.manifest,
            demotions,
        })
    }

    /// Eligibility with the open demotions as this router last read them
    /// (no IO): what a new job's first provider is chosen by. It may lag
    /// a demotion another replica just made; the attempt's own insert
    /// refuses a demoted provider in the database
    /// ([`surety_store::StoreError::Demoted`]), and the caller then asks
    /// [`Inner::certifier`].
    pub fn certifier_seen(&self) -> Certifier<'_> {
        let demotions = self
            .demotions_seen
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Certifier {
            providers: &self.providers,
            manifest: &self.manifest,
            demotions,
        }
    }

    /// `provider` and `contract` as the configuration names them, if it
    /// names both (what a page builds its links and forms from).
    pub fn configured(
        &self,
        provider: &str,
        contract: &str,
    ) -> Option<(&str, &Arc<ServedContract>)> {
        let (provider, _) = self.providers.get_key_value(provider)?;
        Some((provider.as_str(), self.contracts.get(contract)?))
    }

    /// The attempts waiting on a provider now, by job and ordinal.
    pub fn in_flight(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<(String, i64), surety_store::AttemptHandle>> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Budgets: what an attempt reserves, whose key a job was asked with,
/// and a refusal counted.
impl Inner {
    /// What an attempt at `provider` of a job of `owner`, asked for with
    /// the key named `key`, reserves of each of its budgets: nothing (and
    /// no counting) where no budget is the job's.
    pub async fn charges(
        &self,
        provider: &str,
        served: &ServedContract,
        messages: &[surety_providers::Message],
        (owner, key): (&str, Option<&str>),
    ) -> Vec<surety_store::Charge> {
        if self.spending.of(owner, key).next().is_none() {
            return Vec::new();
        }
        let Some(at) = self.providers.get(provider) else {
            return Vec::new();
        };
        let worst = crate::spend::worst_case(at, served, messages).await;
        self.spending
            .charges(owner, key, worst, crate::spend::now_ms())
    }

    /// The name of the key a job was asked for with, as its reservations
    /// say (a later attempt started away from the request that asked: an
    /// operator's retry, a failover after a reconciliation).
    pub async fn key_of_job(
        &self,
        owner: &surety_store::OwnerId,
        job_id: &surety_store::JobId,
    ) -> Option<String> {
        if !self
            .spending
            .budgets
            .iter()
            .any(|b| matches!(b.payer, crate::config::Payer::Key(_)))
        {
            return None;
        }
        match self.store.reservations(owner, job_id).await {
            Ok(reserved) => self
                .spending
                .key_of(reserved.iter().map(|r| r.budget.as_str())),
            Err(e) => {
                tracing::warn!(%job_id, error = %e, "the job's reservations cannot be read: its key's budgets are not charged");
                None
            }
        }
    }
}

impl Inner {
    /// A refusal for `error` (a budget with no room), counted, in words.
    pub fn refused(
        &self,
        error: &surety_store::StoreError,
        owner: &str,
        key: Option<&str>,
    ) -> crate::spend::Refusal {
        if let surety_store::StoreError::OverBudget { budget, .. } = error {
            self.metrics
                .budget_refusals
                .with_label_values(&[budget.as_str(), owner])
                .inc();
            tracing::info!(%budget, %owner, key = key.unwrap_or(""), "refused: over budget");
        }
        self.spending.refusal(error, crate::spend::now_ms())
    }
}

/// Per-owner limits: a keyed rate limiter (GCRA), and a semaphore per
/// owner counting its requests in flight (every owner has one).
#[derive(Debug)]
pub struct Limits {
    pub rate: Option<governor::DefaultKeyedRateLimiter<String>>,
    /// The most requests in flight per owner.
    pub most_in_flight: usize,
    /// Each owner's gate, made on its first request; read-locked on every
    /// request, write-locked only to make a new owner's.
    pub gates: Gates,
}

/// A semaphore per owner, made on its first request.
pub type Gates = std::sync::RwLock<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>;

impl Limits {
    fn from_config(config: &RouterConfig) -> Limits {
        let rate = config.owner_rate.map(|(per_second, burst)| {
            governor::RateLimiter::keyed(governor::Quota::per_second(per_second).allow_burst(burst))
        });
        Limits {
            rate,
            most_in_flight: config.owner_max_in_flight.get() as usize,
            gates: Gates::default(),
        }
    }
}

impl AppState {
    /// The attempts this router is calling a provider for now.
    pub fn in_flight(&self) -> Vec<surety_store::AttemptHandle> {
        self.inner.in_flight().values().cloned().collect()
    }

    /// Builds the state from a validated configuration: opens the store,
    /// loads the contracts, builds the providers (keys from the
    /// environment) and loads the manifest.
    pub async fn from_config(config: &RouterConfig) -> anyhow::Result<AppState> {
        use anyhow::Context;
        let store = Store::open_with(&config.store_options())
            .await
            .context("opening the database")?;
        // Attempts a dead router left behind become unknown before anything is served.
        let reaped = store
            .reap_expired()
            .await
            .context("reaping expired leases")?;
        if !reaped.is_empty() {
            tracing::warn!(
                count = reaped.len(),
                "attempts of a router that died are now unknown"
            );
        }
        let contracts = surety_contracts::load_all(&config.contracts)
            .with_context(|| format!("loading contracts from {}", config.contracts.display()))?
            .into_iter()
            .map(|c| {
                let prompt_digest = surety_exchange::prompt_digest(&c)
                    .with_context(|| format!("contract `{}` does not render", c.id))?;
                let served = ServedContract {
                    user_template: UserTemplate::parse(&c.user_template),
                    prompt_digest,
                    contract: Arc::new(c),
                };
                Ok((served.contract.id.clone(), Arc::new(served)))
            })
            .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
        for route in config.routes.values() {
            if !contracts.contains_key(&route.contract) {
                anyhow::bail!(
                    "`routes.{}.contract`: no contract `{}` in {}",
                    route.id,
                    route.contract,
                    config.contracts.display()
                );
            }
        }
        for route in config.routes.values() {
            let side_effects = contracts
                .get(&route.contract)
                .is_some_and(|c| !c.contract.hedgeable());
            let samples = route.shadow.as_ref().is_some_and(|s| s.per_million > 0);
            if samples && side_effects {
                anyhow::bail!(
                    "`routes.{}.shadow.sampling`: contract `{}` may have side effects, so its jobs are never shadowed (a shadow call would do the work again); set `sampling = 0`",
                    route.id,
                    route.contract
                );
            }
        }
        for route in config.routes.values() {
            let on_input = contracts
                .get(&route.contract)
                .and_then(|c| c.contract.rules.iter().find(|r| r.reads_input()));
            if let (Some(rule), surety_config::Facade::OutputOnly) = (on_input, route.facade) {
                anyhow::bail!(
                    "`routes.{}.facade`: contract `{}` has a rule on the job's input (`{}`), and an output-only route's jobs have no contract input (theirs is the whole chat request), so every answer would fail it; serve the route pinned",
                    route.id,
                    route.contract,
                    rule.name()
                );
            }
        }
        for route in config.routes.values() {
            let unpinnable = contracts
                .get(&route.contract)
                .and_then(|c| c.user_template.as_ref().err());
            if let (Some(why), surety_config::Facade::Pinned) = (unpinnable, route.facade) {
                tracing::warn!(
                    route = %route.id,
                    "the user template of contract `{}` cannot be read back ({why}): /v1/chat/completions refuses this route unless it is `facade = \"output-only\"`",
                    route.contract
                );
            }
        }
        let providers = config
            .providers
            .iter()
            .map(|(id, p)| {
                let served = ServedProvider {
                    adapter: surety_providers::build_provider(p)?,
                    behaviour: surety_manifest::Behaviour::new(p.behaviour()),
                    config: p.clone(),
                    tokenizer: tokio::sync::OnceCell::new(),
                    counted: std::sync::Mutex::default(),
                };
                Ok((id.clone(), served))
            })
            .collect::<Result<BTreeMap<_, _>, surety_providers::ConfigError>>()?;
        let key = match &config.verifying_key {
            Some(path) => Some(
                surety_manifest::read_verifying_key(path)
                    .context("reading the manifest's verifying key")?,
            ),
            None => None,
        };
        let manifest = ManifestHolder::new(&config.manifest, key);
        manifest.reload_if_changed();
        Ok(AppState {
            inner: Arc::new(Inner {
                store,
                providers,
                routes: config.routes.clone(),
                contracts,
                drift: std::sync::Mutex::default(),
                tasks: tokio_util::task::TaskTracker::new(),
                api_keys: config.api_keys.clone(),
                settings: config.settings,
                manifest,
                metrics: Metrics::new()?,
                limits: Limits::from_config(config),
                in_flight: std::sync::Mutex::default(),
                reconciling: std::sync::atomic::AtomicBool::new(false),
                settled: Arc::default(),
                sessions: Sessions::new(config.operator_session),
                failures: Failures::new(config.max_failed_auth),
                budgets: Budgets::default(),
                spending: crate::spend::Spending::new(config),
                rechecks: Rechecks::default(),
                demotions_seen: std::sync::RwLock::default(),
            }),
        })
    }
}
