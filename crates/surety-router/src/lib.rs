//! `surety serve`: one job per intent behind idempotency keys, every try an
//! attempt under the job, failover only to providers the manifest certifies
//! for the job's contract at its current digest.
//!
//! Architecture invariant: only this crate knows the HTTP API and its error
//! shape (RFC 9457 problem details, `error.rs`).

pub mod api;
pub mod config;
pub mod dispatch;
pub mod error;
pub mod manifest;
pub mod metrics;
pub mod settled;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use surety_contracts::Contract;
use surety_providers::Provider;
use surety_store::{Store, StoreOptions};

pub use api::app;
pub use config::RouterConfig;

use crate::config::{ApiKey, Route};
use crate::manifest::ManifestHolder;
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
    pub providers: BTreeMap<String, Arc<dyn Provider>>,
    pub routes: BTreeMap<String, Route>,
    /// Shared with every job driven against them.
    pub contracts: BTreeMap<String, Arc<Contract>>,
    pub api_keys: BTreeMap<String, ApiKey>,
    pub manifest: ManifestHolder,
    pub metrics: Metrics,
    pub attempt_timeout: Duration,
    pub late_result_window: Duration,
    pub lease: Duration,
    pub max_body_bytes: usize,
    /// Wakes the requests waiting on a job when it settles here.
    pub settled: Arc<Settled>,
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

impl AppState {
    /// Builds the state from a validated configuration: opens the store,
    /// loads the contracts, builds the providers (keys from the
    /// environment) and loads the manifest.
    pub async fn from_config(config: &RouterConfig) -> anyhow::Result<AppState> {
        use anyhow::Context;
        let mut options = StoreOptions::new(&config.database);
        options.max_connections = config.database_connections;
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
        let contracts: BTreeMap<String, Arc<Contract>> =
            surety_contracts::load_all(&config.contracts)
                .with_context(|| format!("loading contracts from {}", config.contracts.display()))?
                .into_iter()
                .map(|c| (c.id.clone(), Arc::new(c)))
                .collect();
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
        let providers = config
            .providers
            .iter()
            .map(|(id, p)| Ok((id.clone(), surety_providers::build_provider(p)?)))
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
                api_keys: config.api_keys.clone(),
                manifest,
                metrics: Metrics::new()?,
                attempt_timeout: config.attempt_timeout,
                late_result_window: config.late_result_window,
                lease: config.lease,
                max_body_bytes: config.max_body_bytes,
                settled: Arc::default(),
            }),
        })
    }

    /// The background work of a running router: reload the manifest when it
    /// changes, and reap the leases of routers that died.
    pub fn spawn_background(&self) -> tokio::task::JoinHandle<()> {
        let state = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
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
            }
        })
    }
}
