//! `surety.toml` as the router reads it: `[server]` and `[[api_keys]]`
//! here, `[providers.*]` and `[routes.*]` through the one loader of the file
//! (`surety_config::SuretyFile`); strict, validated with errors that
//! name the TOML path. API keys are stored as sha256 hashes, never in
//! clear. The listen address and the database URL may come from the
//! environment (`listen_env`, `database_env`), so a password need not be
//! written in the file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use surety_providers::config::ProviderConfig;

pub use surety_config::Route;

/// One API key's owner and scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub owner: String,
    /// What a budget calls this key (`[[budgets]] key`), where it has one.
    pub name: Option<String>,
    pub admin: bool,
    /// The operator's pages show (and act on) every owner's jobs, not only
    /// `owner`'s. Only an admin's key may say so.
    pub all_owners: bool,
}

/// Every default of `[server]`, in one place (docs/configuration.md says
/// each in words).
pub mod defaults {
    /// Enough for PostgreSQL to commit many jobs together, few enough for
    /// several replicas within its default 100 connections.
    pub const DATABASE_CONNECTIONS: u32 = 16;
    /// Connections open at once: well within a default file descriptor
    /// limit, far past what the clients of one router hold.
    pub const MAX_CONNECTIONS: usize = 4096;
    /// Failed authentications an address may make in 10 s.
    pub const MAX_FAILED_AUTH: u32 = 20;
    pub const CONTRACTS: &str = "contracts";
    pub const ATTEMPT_TIMEOUT_MS: u64 = 60_000;
    pub const DATABASE_TIMEOUT_MS: u64 = 3_000;
    /// A day: a key replays for a day after its job settled.
    pub const RETENTION_MS: u64 = 24 * 60 * 60 * 1000;
    /// A working day.
    pub const OPERATOR_SESSION_MS: u64 = 8 * 60 * 60 * 1000;
    pub const REQUEST_READ_TIMEOUT_MS: u64 = 10_000;
    pub const SHUTDOWN_GRACE_MS: u64 = 30_000;
    pub const LATE_RESULT_WINDOW_MS: u64 = 600_000;
    pub const LEASE_MS: u64 = 30_000;
    /// An unknown attempt is first asked about after this (a late answer
    /// usually comes sooner).
    pub const RECONCILE_AFTER_MS: u64 = 10_000;
    /// Then asked again at most this often.
    pub const RECONCILE_EVERY_MS: u64 = 60_000;
    /// OpenAI keeps stored completions 30 days: past it, asking proves
    /// nothing, and the attempt is left for an operator.
    pub const RECONCILE_HORIZON_MS: u64 = 30 * 24 * 60 * 60 * 1000;
    /// One question's time.
    pub const RECONCILE_TIMEOUT_MS: u64 = 10_000;
    pub const MAX_BODY_BYTES: usize = 1 << 20;
    /// The smallest SQLite file a limit may name.
    pub const MIN_SQLITE_BYTES: u64 = 1 << 20;
    /// An owner's requests in flight: a quarter of the connections (at
    /// least 1, at most 256), so one owner never holds them all.
    pub fn owner_in_flight(max_connections: usize) -> u32 {
        u32::try_from((max_connections / 4).clamp(1, 256)).unwrap_or(256)
    }
}

/// How the router takes connections.
#[derive(Debug, Clone, Copy)]
pub struct Listening {
    pub max_connections: usize,
    pub request_read_timeout: Duration,
}

/// The router's settings as the running router reads them: one value,
/// from the file to the state, copied nowhere else.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How long an attempt waits for its provider before it is `unknown`.
    pub attempt_timeout: Duration,
    /// How long a shutdown waits for in-flight attempts before it marks
    /// what remains `unknown`.
    pub shutdown_grace: Duration,
    /// `/v1/chat/completions` takes requests without an Idempotency-Key as
    /// one-off jobs (no deduplication), instead of refusing them.
    pub allow_keyless_chat: bool,
    /// How long an operation waits for the database (PostgreSQL: for a
    /// connection) before the request gets 503.
    pub database_timeout: Duration,
    /// How long a settled job is kept after it settled: its key replays
    /// until then, and is free (a new job) after.
    pub retention: Duration,
    /// Connections open at once, and how long a client may take to send a
    /// request's headers (or its body).
    pub listening: Listening,
    /// The operator's cookies are sent only over TLS.
    pub secure_cookies: bool,
    /// How long a timed-out attempt's late answer is still listened for.
    pub late_result_window: Duration,
    /// How long an attempt's lease lasts between heartbeats; past it, a
    /// router that died leaves the attempt for the reaper.
    pub lease: Duration,
    /// The most bytes a request's body may hold.
    pub max_body_bytes: usize,
    /// When unknown attempts are asked about, at providers that can tell.
    pub reconciling: Reconciling,
}

/// When the reconciler asks a provider about an unknown attempt.
#[derive(Debug, Clone, Copy)]
pub struct Reconciling {
    /// How long an attempt is unknown before it is first asked about.
    pub after: Duration,
    /// How long after a question the next may be asked.
    pub every: Duration,
    /// How long an attempt is asked about at all: past it, the provider
    /// keeps nothing to find, and the attempt is left for an operator.
    pub horizon: Duration,
    /// One question's time.
    pub timeout: Duration,
}

/// `surety.toml` as the router takes it: where it listens and keeps its
/// jobs, what it serves, who may ask, and its [`Settings`].
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub listen: SocketAddr,
    pub database: String,
    /// PostgreSQL: the pool's connections; SQLite: pooled readers.
    pub database_connections: u32,
    pub manifest: PathBuf,
    pub contracts: PathBuf,
    pub verifying_key: Option<PathBuf>,
    /// Each owner's sustained requests per second and burst.
    pub owner_rate: Option<(std::num::NonZeroU32, std::num::NonZeroU32)>,
    /// Each owner's requests in flight at most.
    pub owner_max_in_flight: std::num::NonZeroU32,
    /// SQLite: `normal` (the default) or `full` (an fsync per commit).
    pub sqlite_synchronous: surety_store::SqliteSync,
    /// SQLite: the most bytes the database file may hold.
    pub sqlite_max_bytes: Option<u64>,
    /// How long an operator's session lasts after sign-in (default 8 h).
    pub operator_session: Duration,
    /// Failed authentications an address may make in 10 s; `None`: no limit.
    pub max_failed_auth: Option<u32>,
    /// By sha256 of the key, hex.
    pub api_keys: BTreeMap<String, ApiKey>,
    pub providers: BTreeMap<String, ProviderConfig>,
    pub routes: BTreeMap<String, Route>,
    /// `[[budgets]]`, in the file's order.
    pub budgets: Vec<Budget>,
    pub settings: Settings,
}

mod budgets;
mod read;
pub use budgets::{AtLimit, Budget, BudgetUnit, Payer, Period};
impl RouterConfig {
    /// How the store is opened: the database, its pool, SQLite's sync
    /// and size limit, and how long an operation waits for it.
    pub fn store_options(&self) -> surety_store::StoreOptions {
        let mut options = surety_store::StoreOptions::new(&self.database);
        options.max_connections = self.database_connections;
        options.sqlite_synchronous = self.sqlite_synchronous;
        options.sqlite_max_bytes = self.sqlite_max_bytes;
        options.acquire_timeout = self.settings.database_timeout;
        options
    }

    /// How many threads the router's runtime runs its tasks on, on a
    /// machine of `cores`: one per core, but on SQLite one fewer (at least
    /// one), since the SQLite store commits on a writer thread of its own
    /// that is busy whenever the runtime is. Measured (`bench router` on
    /// two cores, one run, ABAB): one runtime thread instead of two gave
    /// ×1.09–1.12 jobs/s at 16 and 64 clients and ×0.82–0.87 of the
    /// router's CPU per job on SQLite, but ×0.93–0.98 jobs/s on
    /// PostgreSQL, whose commits run in its own server.
    /// `TOKIO_WORKER_THREADS`, when set, overrides this
    /// ([`RouterConfig::runtime`] leaves it to the runtime).
    pub fn runtime_workers(&self, cores: usize) -> usize {
        match surety_store::Backend::of_url(&self.database) {
            Some(surety_store::Backend::Sqlite) => cores.saturating_sub(1).max(1),
            Some(surety_store::Backend::Postgres) | None => cores.max(1),
        }
    }

    /// The runtime `surety serve` runs on: [`RouterConfig::runtime_workers`]
    /// threads for this machine's cores, unless `TOKIO_WORKER_THREADS` is
    /// set (the runtime reads it then).
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all();
        if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
            builder.worker_threads(self.runtime_workers(cores));
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests;
