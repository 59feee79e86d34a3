//! `surety serve`: one job per intent behind idempotency keys, every try an
//! attempt under the job, failover only to providers the manifest certifies
//! for the job's contract at its current digest.
//!
//! Architecture invariant: only this crate knows the HTTP API and its error
//! shape (RFC 9457 problem details, `error.rs`).

pub mod api;
pub mod config;
pub mod dispatch;
pub mod document;
pub mod error;
pub mod extract;
pub mod facade;
pub mod listen;
pub mod manifest;
pub mod metrics;
pub mod service;
pub mod session;
pub mod settled;
mod ui;
pub mod views;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use surety_contracts::Contract;
use surety_exchange::pinning::UserTemplate;
use surety_providers::{Provider, ProviderConfig};
use surety_store::{Store, StoreOptions};

pub use api::app;
pub use config::RouterConfig;
pub use listen::Listening;

use crate::config::{ApiKey, Route};
use crate::manifest::ManifestHolder;
use crate::metrics::Metrics;
use crate::settled::Settled;

/// Settled jobs deleted per write when pruning past retention: a write of
/// a few ms, so the writes queued behind it barely wait.
const PRUNE_BATCH: u32 = 64;
/// Pruning runs every this many background ticks (of 500 ms): every 2 s,
/// so each pass is short.
const PRUNE_EVERY_TICKS: u64 = 4;

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
    pub manifest: ManifestHolder,
    pub metrics: Metrics,
    pub attempt_timeout: Duration,
    pub shutdown_grace: Duration,
    pub allow_keyless_chat: bool,
    /// Per-owner limits on rate and requests in flight.
    pub limits: Limits,
    /// The attempts this router is calling a provider for right now: what a
    /// shutdown marks `unknown` when its grace period runs out.
    pub in_flight: std::sync::Mutex<BTreeMap<(String, i64), surety_store::AttemptHandle>>,
    pub late_result_window: Duration,
    pub lease: Duration,
    pub max_body_bytes: usize,
    pub retention: Duration,
    pub database_timeout: Duration,
    pub listening: Listening,
    /// Wakes the requests waiting on a job when it settles here.
    pub settled: Arc<Settled>,
    /// The operator's signed-in sessions.
    pub sessions: session::Sessions,
    /// Failed authentications per client address.
    pub failures: session::Failures,
    pub secure_cookies: bool,
}

impl Inner {
    /// The attempts waiting on a provider now, by job and ordinal.
    pub fn in_flight(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<(String, i64), surety_store::AttemptHandle>> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A provider as the router serves it: the adapter, its configuration, and
/// the behaviour object a certificate of it must match.
#[derive(Debug)]
pub struct ServedProvider {
    pub adapter: Arc<dyn Provider>,
    pub config: ProviderConfig,
    pub behaviour: serde_json::Value,
}

/// A contract as the router serves it, with what is computed from it once:
/// the digest of its prompts as rendered now (a certificate must match it),
/// and its user template read as plain substitutions for prompt pinning, or
/// why it cannot be.
#[derive(Debug)]
pub struct ServedContract {
    pub contract: Arc<Contract>,
    pub prompt_digest: String,
    pub user_template: Result<UserTemplate, String>,
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

/// An answer from a model id the provider's certificate did not see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub contract: String,
    pub model: String,
    /// The ids the certificate saw answer.
    pub certified: Vec<String>,
    pub at: String,
}

/// Serves the API on `listener` until `shutdown` completes, then shuts
/// down gracefully: no new connections; in-flight attempts get
/// `shutdown_grace` to finish; those still waiting on a provider then become
/// `unknown` (the provider may have done the work), so nothing is left
/// `started` for a reaper to find later. Each step is logged.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listening = state.inner.listening;
    let connections = listen::accept_until(listener, app(state.clone()), listening, shutdown).await;
    // No new connections; open ones finish their request and close.
    let closed = connections.shutdown();
    let grace = state.inner.shutdown_grace;
    let open = state.in_flight().len();
    tracing::info!(
        in_flight = open,
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections; waiting for in-flight attempts"
    );
    let work = &state.inner.tasks;
    work.close();
    if tokio::time::timeout(grace, work.wait()).await.is_err() {
        let left = state.in_flight();
        tracing::warn!(
            attempts = left.len(),
            "shutdown grace period over: the attempts still waiting on a provider become unknown"
        );
        for handle in left {
            let reason = "the router shut down before the provider answered; the provider may have done the work";
            if let Err(e) = state.inner.store.mark_unknown(&handle, reason).await {
                tracing::error!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "could not mark the attempt unknown");
            }
        }
    }
    // Answers already on their way get a moment to leave.
    let _ = tokio::time::timeout(Duration::from_millis(500), closed).await;
    tracing::info!("shut down");
    Ok(())
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
        let mut options = StoreOptions::new(&config.database);
        options.max_connections = config.database_connections;
        options.sqlite_synchronous = config.sqlite_synchronous;
        options.sqlite_max_bytes = config.sqlite_max_bytes;
        options.acquire_timeout = config.database_timeout;
        let store = Store::open_with(&options)
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
            let unpinnable = contracts
                .get(&route.contract)
                .and_then(|c| c.user_template.as_ref().err());
            if let (Some(why), surety_providers::Facade::Pinned) = (unpinnable, route.facade) {
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
                    behaviour: p.behaviour(),
                    config: p.clone(),
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
                manifest,
                metrics: Metrics::new()?,
                attempt_timeout: config.attempt_timeout,
                shutdown_grace: config.shutdown_grace,
                allow_keyless_chat: config.allow_keyless_chat,
                limits: Limits::from_config(config),
                in_flight: std::sync::Mutex::default(),
                late_result_window: config.late_result_window,
                lease: config.lease,
                max_body_bytes: config.max_body_bytes,
                retention: config.retention,
                database_timeout: config.database_timeout,
                listening: config.listening,
                settled: Arc::default(),
                sessions: session::Sessions::new(config.operator_session),
                failures: session::Failures::new(config.max_failed_auth),
                secure_cookies: config.secure_cookies,
            }),
        })
    }

    /// The background work of a running router: reload the manifest when it
    /// changes, reap the leases of routers that died, and prune settled
    /// jobs past retention.
    pub fn spawn_background(&self) -> tokio::task::JoinHandle<()> {
        let state = self.clone();
        // Its handle is the caller's, who stops it at shutdown.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n: u64 = 0;
            loop {
                tick.tick().await;
                state.inner.manifest.reload_if_changed();
                n += 1;
                if n.is_multiple_of(4) {
                    match state.inner.store.reap_expired().await {
                        Ok(reaped) if !reaped.is_empty() => {
                            tracing::warn!(count = reaped.len(), "reaped expired leases")
                        }
                        Ok(_) => {}
                        Err(e) => tracing::error!(error = %e, "reaper failed"),
                    }
                }
                if n.is_multiple_of(PRUNE_EVERY_TICKS) {
                    state.prune().await;
                }
            }
        })
    }

    /// Deletes the settled jobs past retention, a small batch per write so
    /// the writers' queue never waits long behind it; returns how many went.
    pub async fn prune(&self) -> u64 {
        let mut pruned = 0;
        loop {
            match self
                .inner
                .store
                .prune_settled(self.inner.retention, PRUNE_BATCH)
                .await
            {
                Ok(n) => {
                    pruned += n;
                    self.inner.metrics.pruned_jobs.inc_by(n);
                    if n < u64::from(PRUNE_BATCH) {
                        break;
                    }
                    // Between batches, the jobs being made go first.
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pruning settled jobs failed; the next pass tries again");
                    break;
                }
            }
        }
        if pruned > 0 {
            tracing::info!(
                jobs = pruned,
                retention_s = self.inner.retention.as_secs(),
                "pruned settled jobs past retention"
            );
        }
        pruned
    }
}

#[cfg(test)]
mod layers {
    //! The layer rule: a module imports only modules of a lower layer, so
    //! there is no import cycle and a change's place can be read off the
    //! layout. Read from the sources.

    /// Each module's layer, lowest first: what every part stands on (views,
    /// configuration, sessions, the manifest, metrics, the accept loop,
    /// the OpenAPI document's edits), errors, the request edge's parts and
    /// the dispatcher, the jobs service, the HTTP surfaces (the facade, the
    /// operator's pages), and the router that puts them together.
    const LAYERS: [(&str, u8); 15] = [
        ("views", 0),
        ("config", 0),
        ("session", 0),
        ("settled", 0),
        ("metrics", 0),
        ("manifest", 0),
        ("listen", 0),
        ("document", 0),
        ("error", 1),
        ("extract", 2),
        ("dispatch", 2),
        ("service", 3),
        ("facade", 4),
        ("ui", 4),
        ("api", 5),
    ];

    fn layer(module: &str) -> Option<u8> {
        LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
    }

    #[test]
    fn every_module_imports_only_lower_layers() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut offences = Vec::new();
        let mut seen = 0;
        for entry in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{e}")) {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let Some(module) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .filter(|_| path.extension().is_some_and(|e| e == "rs"))
            else {
                continue;
            };
            if module == "lib" {
                continue;
            }
            seen += 1;
            let Some(own) = layer(module) else {
                offences.push(format!("{module}.rs has no layer in LAYERS"));
                continue;
            };
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
            for (at, _) in text.match_indices("crate::") {
                let name: String = text[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                match layer(&name) {
                    Some(theirs) if theirs >= own && name != module => offences.push(format!(
                        "{module} (layer {own}) imports {name} (layer {theirs})"
                    )),
                    _ => {}
                }
            }
        }
        assert_eq!(
            seen,
            LAYERS.len(),
            "every module is in LAYERS, and only those"
        );
        assert!(offences.is_empty(), "{offences:#?}");
    }
}
