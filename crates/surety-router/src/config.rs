//! `surety.toml` as the router reads it: `[server]` and `[[api_keys]]`
//! here, `[providers.*]` and `[routes.*]` through the one loader of the file
//! (`surety_providers::SuretyFile`); strict, validated with errors that
//! name the TOML path. API keys are stored as sha256 hashes, never in
//! clear. The listen address and the database URL may come from the
//! environment (`listen_env`, `database_env`), so a password need not be
//! written in the file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use surety_providers::config::{ConfigError, ProviderConfig, SuretyFile};

pub use surety_providers::config::Route;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    /// The environment variable that holds the listen address.
    listen_env: Option<String>,
    database: Option<String>,
    /// The environment variable that holds the database URL.
    database_env: Option<String>,
    database_connections: Option<u32>,
    manifest: String,
    contracts: Option<String>,
    verifying_key: Option<String>,
    attempt_timeout_ms: Option<u64>,
    shutdown_grace_ms: Option<u64>,
    allow_keyless_chat: Option<bool>,
    owner_requests_per_second: Option<u32>,
    owner_burst: Option<u32>,
    owner_max_in_flight: Option<u32>,
    sqlite_synchronous: Option<String>,
    sqlite_max_bytes: Option<u64>,
    database_timeout_ms: Option<u64>,
    retention_ms: Option<u64>,
    max_connections: Option<usize>,
    request_read_timeout_ms: Option<u64>,
    late_result_window_ms: Option<u64>,
    lease_ms: Option<u64>,
    max_body_bytes: Option<usize>,
    /// How long an operator's session lasts after sign-in.
    operator_session_ms: Option<u64>,
    /// Mark the operator's cookies `Secure` (behind TLS).
    secure_cookies: Option<bool>,
    /// Failed authentications an address may make in 10 s (0: no limit).
    max_failed_auth: Option<u32>,
}

/// `[server]` and `[[api_keys]]` as written.
struct Raw {
    server: RawServer,
    api_keys: Vec<RawApiKey>,
}

/// A `[server]` value written in the file (`field`) or named by the
/// environment variable that holds it (`field_env`): one of the two.
fn from_file_or_env(
    field: &str,
    written: Option<String>,
    var: Option<String>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    match (written, var) {
        (Some(value), None) => Ok(value),
        (None, Some(var)) => lookup(&var).filter(|v| !v.is_empty()).ok_or_else(|| {
            ConfigError::at(
                format!("server.{field}_env"),
                format!("the environment variable {var} is not set"),
            )
        }),
        (Some(_), Some(_)) => Err(ConfigError::at(
            format!("server.{field}"),
            format!("give `{field}` or `{field}_env`, not both"),
        )),
        (None, None) => Err(ConfigError::at(
            format!("server.{field}"),
            format!(
                "missing: give `{field}`, or `{field}_env` naming the environment variable that holds it"
            ),
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApiKey {
    owner: String,
    /// sha256 of the key, hex.
    sha256: String,
    #[serde(default)]
    admin: bool,
    /// An admin whose operator pages show every owner's jobs.
    #[serde(default)]
    all_owners: bool,
}

/// One API key's owner and scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub owner: String,
    pub admin: bool,
    /// The operator's pages show (and act on) every owner's jobs, not only
    /// `owner`'s. Only an admin's key may say so.
    pub all_owners: bool,
}

/// Enough for PostgreSQL to commit many jobs together, few enough for
/// several replicas within its default 100 connections.
const DEFAULT_DATABASE_CONNECTIONS: u32 = 16;

/// Connections open at once by default: well within a default file
/// descriptor limit, far past what the clients of one router hold.
const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Failed authentications an address may make in 10 s, by default.
const DEFAULT_MAX_FAILED_AUTH: u32 = 20;

/// A provider's own request timeout, where the file sets one, is at most
/// the attempt's: past it the attempt ends `unknown` first, and the
/// provider's timeout would never decide anything.
fn timeouts_fit(text: &str, attempt_timeout: Duration) -> Result<(), ConfigError> {
    let file: toml::Table =
        toml::from_str(text).map_err(|e| ConfigError::at("", e.to_string().trim_end()))?;
    let providers = file.get("providers").and_then(toml::Value::as_table);
    for (id, provider) in providers.into_iter().flatten() {
        let request_ms = provider
            .get("timeouts")
            .and_then(|t| t.get("request_ms"))
            .and_then(toml::Value::as_integer);
        if let Some(request_ms) = request_ms
            && u128::try_from(request_ms).unwrap_or(0) > attempt_timeout.as_millis()
        {
            return Err(ConfigError::at(
                format!("providers.{id}.timeouts.request_ms"),
                format!(
                    "{request_ms} ms is longer than server.attempt_timeout_ms ({} ms): the attempt would end unknown before this timeout could decide; make it at most server.attempt_timeout_ms, or raise that",
                    attempt_timeout.as_millis()
                ),
            ));
        }
    }
    Ok(())
}

/// An owner's requests in flight when the file says nothing: a quarter of
/// the connections (at least 1, at most 256).
fn default_owner_in_flight(max_connections: usize) -> u32 {
    u32::try_from((max_connections / 4).clamp(1, 256)).unwrap_or(256)
}

/// The smallest SQLite file a limit may name.
const MIN_SQLITE_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub listen: SocketAddr,
    pub database: String,
    /// PostgreSQL: the pool's connections; SQLite: pooled readers.
    pub database_connections: u32,
    pub manifest: PathBuf,
    pub contracts: PathBuf,
    pub verifying_key: Option<PathBuf>,
    pub attempt_timeout: Duration,
    /// How long a shutdown waits for in-flight attempts before it marks
    /// what remains `unknown`.
    pub shutdown_grace: Duration,
    /// `/v1/chat/completions` takes requests without an Idempotency-Key as
    /// one-off jobs (no deduplication), instead of refusing them.
    pub allow_keyless_chat: bool,
    /// Each owner's sustained requests per second and burst.
    pub owner_rate: Option<(std::num::NonZeroU32, std::num::NonZeroU32)>,
    /// Each owner's requests in flight at most.
    pub owner_max_in_flight: std::num::NonZeroU32,
    /// SQLite: `normal` (the default) or `full` (an fsync per commit).
    pub sqlite_synchronous: surety_store::SqliteSync,
    /// SQLite: the most bytes the database file may hold.
    pub sqlite_max_bytes: Option<u64>,
    /// How long an operation waits for the database (PostgreSQL: for a
    /// connection) before the request gets 503.
    pub database_timeout: Duration,
    /// How long a settled job is kept after it settled: its key replays
    /// until then, and is free (a new job) after.
    pub retention: Duration,
    /// Connections open at once, and how long a client may take to send a
    /// request's headers (or its body).
    pub listening: crate::Listening,
    /// How long an operator's session lasts after sign-in (default 8 h).
    pub operator_session: Duration,
    /// The operator's cookies are sent only over TLS.
    pub secure_cookies: bool,
    /// Failed authentications an address may make in 10 s; `None`: no limit.
    pub max_failed_auth: Option<u32>,
    pub late_result_window: Duration,
    pub lease: Duration,
    pub max_body_bytes: usize,
    /// By sha256 of the key, hex.
    pub api_keys: BTreeMap<String, ApiKey>,
    pub providers: BTreeMap<String, ProviderConfig>,
    pub routes: BTreeMap<String, Route>,
}

impl RouterConfig {
    /// Reads `surety.toml`, with `listen_env` and `database_env` read from
    /// the process's environment.
    pub fn from_toml(text: &str) -> Result<RouterConfig, ConfigError> {
        RouterConfig::from_toml_with(text, &|var| std::env::var(var).ok())
    }

    /// As [`RouterConfig::from_toml`], reading environment variables through `lookup`.
    pub fn from_toml_with(
        text: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<RouterConfig, ConfigError> {
        let file = SuretyFile::from_toml(text)?;
        let table = |value: toml::Table| toml::Value::Table(value);
        let server = file
            .server
            .ok_or_else(|| ConfigError::at("server", "the router needs a `[server]` table"))?;
        let server = RawServer::deserialize(table(server))
            .map_err(|e| ConfigError::at("server", e.to_string().trim_end()))?;
        let raw_keys = file
            .api_keys
            .into_iter()
            .enumerate()
            .map(|(i, key)| {
                RawApiKey::deserialize(table(key)).map_err(|e| {
                    ConfigError::at(format!("api_keys[{i}]"), e.to_string().trim_end())
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let listen = from_file_or_env(
            "listen",
            server.listen.clone(),
            server.listen_env.clone(),
            lookup,
        )?
        .parse()
        .map_err(|e| ConfigError::at("server.listen", format!("not an address: {e}")))?;
        let database = from_file_or_env(
            "database",
            server.database.clone(),
            server.database_env.clone(),
            lookup,
        )?;
        let raw = Raw {
            server,
            api_keys: raw_keys,
        };
        let ms = |path: &str, value: Option<u64>, default: u64| match value.unwrap_or(default) {
            0 => Err(ConfigError::at(path, "must be at least 1 ms")),
            n => Ok(Duration::from_millis(n)),
        };
        let mut api_keys = BTreeMap::new();
        for (i, key) in raw.api_keys.into_iter().enumerate() {
            let hash = key.sha256.to_ascii_lowercase();
            if hash.len() != 64 || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(ConfigError::at(
                    format!("api_keys[{i}].sha256"),
                    "must be the key's sha256, 64 hex digits",
                ));
            }
            if key.owner.is_empty() {
                return Err(ConfigError::at(
                    format!("api_keys[{i}].owner"),
                    "must not be empty",
                ));
            }
            if key.all_owners && !key.admin {
                return Err(ConfigError::at(
                    format!("api_keys[{i}].all_owners"),
                    "only an admin key may operate for every owner (set `admin = true`)",
                ));
            }
            if api_keys
                .insert(
                    hash,
                    ApiKey {
                        owner: key.owner,
                        admin: key.admin,
                        all_owners: key.all_owners,
                    },
                )
                .is_some()
            {
                return Err(ConfigError::at(
                    format!("api_keys[{i}].sha256"),
                    "the same key is listed twice",
                ));
            }
        }
        let (providers, routes) = (file.providers, file.routes);
        let attempt_timeout = ms(
            "server.attempt_timeout_ms",
            raw.server.attempt_timeout_ms,
            60_000,
        )?;
        timeouts_fit(text, attempt_timeout)?;
        let max_connections = match raw.server.max_connections {
            None => DEFAULT_MAX_CONNECTIONS,
            Some(n @ 1..=1_000_000) => n,
            Some(_) => {
                return Err(ConfigError::at(
                    "server.max_connections",
                    "must be between 1 and 1000000",
                ));
            }
        };
        Ok(RouterConfig {
            listen,
            database,
            database_connections: match raw.server.database_connections {
                None => DEFAULT_DATABASE_CONNECTIONS,
                Some(n @ 1..=1000) => n,
                Some(_) => {
                    return Err(ConfigError::at(
                        "server.database_connections",
                        "must be between 1 and 1000",
                    ));
                }
            },
            manifest: PathBuf::from(raw.server.manifest),
            contracts: PathBuf::from(
                raw.server
                    .contracts
                    .unwrap_or_else(|| "contracts".to_owned()),
            ),
            verifying_key: raw.server.verifying_key.map(PathBuf::from),
            attempt_timeout,
            allow_keyless_chat: raw.server.allow_keyless_chat.unwrap_or(false),
            owner_rate: match (raw.server.owner_requests_per_second, raw.server.owner_burst) {
                (None, None) => None,
                (Some(rate), burst) => {
                    let positive = |path: &str, n: u32| {
                        std::num::NonZeroU32::new(n)
                            .ok_or_else(|| ConfigError::at(path, "must be at least 1"))
                    };
                    Some((
                        positive("server.owner_requests_per_second", rate)?,
                        positive("server.owner_burst", burst.unwrap_or(rate))?,
                    ))
                }
                (None, Some(_)) => {
                    return Err(ConfigError::at(
                        "server.owner_burst",
                        "needs `owner_requests_per_second`",
                    ));
                }
            },
            sqlite_synchronous: match raw.server.sqlite_synchronous.as_deref() {
                None | Some("normal") => surety_store::SqliteSync::Normal,
                Some("full") => surety_store::SqliteSync::Full,
                Some(other) => {
                    return Err(ConfigError::at(
                        "server.sqlite_synchronous",
                        format!("`{other}` is not `normal` or `full`"),
                    ));
                }
            },
            sqlite_max_bytes: match raw.server.sqlite_max_bytes {
                Some(n) if n < MIN_SQLITE_BYTES => {
                    return Err(ConfigError::at(
                        "server.sqlite_max_bytes",
                        format!("must be at least {MIN_SQLITE_BYTES} (1 MiB)"),
                    ));
                }
                other => other,
            },
            database_timeout: ms(
                "server.database_timeout_ms",
                raw.server.database_timeout_ms,
                3_000,
            )?,
            retention: ms(
                "server.retention_ms",
                raw.server.retention_ms,
                24 * 60 * 60 * 1000,
            )?,
            operator_session: ms(
                "server.operator_session_ms",
                raw.server.operator_session_ms,
                8 * 60 * 60 * 1000,
            )?,
            secure_cookies: raw.server.secure_cookies.unwrap_or(false),
            max_failed_auth: match raw.server.max_failed_auth {
                None => Some(DEFAULT_MAX_FAILED_AUTH),
                Some(0) => None,
                Some(n) => Some(n),
            },
            listening: crate::Listening {
                max_connections,
                request_read_timeout: ms(
                    "server.request_read_timeout_ms",
                    raw.server.request_read_timeout_ms,
                    10_000,
                )?,
            },
            // Every owner has a limit (waits count toward it): by default a
            // quarter of the connections, so one owner never holds them all.
            owner_max_in_flight: std::num::NonZeroU32::new(match raw.server.owner_max_in_flight {
                None => default_owner_in_flight(max_connections),
                Some(n) => n,
            })
            .ok_or_else(|| ConfigError::at("server.owner_max_in_flight", "must be at least 1"))?,
            shutdown_grace: ms(
                "server.shutdown_grace_ms",
                raw.server.shutdown_grace_ms,
                30_000,
            )?,
            late_result_window: ms(
                "server.late_result_window_ms",
                raw.server.late_result_window_ms,
                600_000,
            )?,
            lease: ms("server.lease_ms", raw.server.lease_ms, 30_000)?,
            max_body_bytes: raw.server.max_body_bytes.unwrap_or(1 << 20),
            api_keys,
            providers,
            routes,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const GOOD: &str = r#"
[server]
listen = "127.0.0.1:0"
database = "sqlite:surety.db"
manifest = "certification/manifest.json"

[[api_keys]]
owner = "acme"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

[providers.fake]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
model = "fake"
context_window = 16000

[routes.language]
contract = "language-detect"
providers = ["fake"]
"#;

    fn error_with(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "{from}");
        RouterConfig::from_toml(&GOOD.replace(from, to))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_provider_timeout_longer_than_the_attempts_is_refused_naming_both() {
        let with = |request_ms: u64, attempt: &str| {
            let text = GOOD
                .replace("[server]", &format!("[server]\n{attempt}"))
                .replace(
                    "[providers.fake]",
                    &format!("[providers.fake]\ntimeouts = {{ request_ms = {request_ms} }}"),
                );
            RouterConfig::from_toml(&text)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let refused = with(120_000, "").unwrap_err();
        assert!(
            refused.contains("providers.fake.timeouts.request_ms")
                && refused.contains("server.attempt_timeout_ms (60000 ms)"),
            "{refused}"
        );
        assert_eq!(with(120_000, "attempt_timeout_ms = 120000"), Ok(()));
        assert_eq!(with(30_000, ""), Ok(()));
    }

    #[test]
    fn a_good_file_parses_with_its_defaults() {
        let config = RouterConfig::from_toml(GOOD).unwrap();
        assert_eq!(config.database_connections, DEFAULT_DATABASE_CONNECTIONS);
        assert_eq!(config.contracts, PathBuf::from("contracts"));
        assert_eq!(config.api_keys.len(), 1);
        assert_eq!(config.routes["language"].providers, ["fake"]);
        assert_eq!(config.retention, Duration::from_secs(24 * 60 * 60));
        assert_eq!(config.listening.max_connections, DEFAULT_MAX_CONNECTIONS);
        // Every owner has an in-flight limit: a quarter of the connections, at most 256.
        assert_eq!(config.owner_max_in_flight.get(), 256);
        let small = GOOD.replace("[server]", "[server]\nmax_connections = 16");
        let small = RouterConfig::from_toml(&small).unwrap();
        assert_eq!(small.owner_max_in_flight.get(), 4);
        assert_eq!(config.operator_session, Duration::from_secs(8 * 3600));
        assert!(!config.secure_cookies);
        assert_eq!(
            config.listening.request_read_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(config.database_timeout, Duration::from_secs(3));
        assert_eq!(config.sqlite_max_bytes, None);
    }

    #[test]
    fn errors_name_the_toml_path() {
        let cases = [
            (
                "listen = \"127.0.0.1:0\"",
                "listen = \"here\"",
                "`server.listen`",
            ),
            (
                "manifest = ",
                "database_connections = 0\nmanifest = ",
                "`server.database_connections`",
            ),
            (
                "manifest = ",
                "lease_ms = 0\nmanifest = ",
                "`server.lease_ms`",
            ),
            ("sha256 = \"9f86", "sha256 = \"zz86", "`api_keys[0].sha256`"),
            (
                "manifest = ",
                "sqlite_synchronous = \"sometimes\"\nmanifest = ",
                "`server.sqlite_synchronous`",
            ),
            (
                "manifest = ",
                "sqlite_max_bytes = 4096\nmanifest = ",
                "`server.sqlite_max_bytes`",
            ),
            (
                "manifest = ",
                "max_connections = 0\nmanifest = ",
                "`server.max_connections`",
            ),
            (
                "manifest = ",
                "retention_ms = 0\nmanifest = ",
                "`server.retention_ms`",
            ),
            (
                "manifest = ",
                "request_read_timeout_ms = 0\nmanifest = ",
                "`server.request_read_timeout_ms`",
            ),
            ("owner = \"acme\"", "owner = \"\"", "`api_keys[0].owner`"),
            (
                "owner = \"acme\"",
                "owner = \"acme\"\nall_owners = true",
                "`api_keys[0].all_owners`",
            ),
            (
                "providers = [\"fake\"]",
                "providers = [\"nobody\"]",
                "routes.language",
            ),
        ];
        for (from, to, path) in cases {
            let error = error_with(from, to);
            assert!(error.contains(path), "{to}: {error}");
        }
        let unknown = error_with("manifest = ", "databse = \"x\"\nmanifest = ");
        assert!(unknown.contains("databse"), "{unknown}");
    }

    #[test]
    fn the_listen_address_and_the_database_url_may_come_from_the_environment() {
        let from_env = GOOD
            .replace(
                "database = \"sqlite:surety.db\"",
                "database_env = \"SURETY_DB\"",
            )
            .replace("listen = \"127.0.0.1:0\"", "listen_env = \"SURETY_LISTEN\"");
        let env = |var: &str| match var {
            "SURETY_DB" => Some("postgres://app:s3cret@db:5432/surety".to_owned()),
            "SURETY_LISTEN" => Some("0.0.0.0:9000".to_owned()),
            _ => None,
        };
        let config = RouterConfig::from_toml_with(&from_env, &env).unwrap();
        assert_eq!(config.database, "postgres://app:s3cret@db:5432/surety");
        assert_eq!(config.listen.to_string(), "0.0.0.0:9000");
        let unset = RouterConfig::from_toml_with(&from_env, &|_| None)
            .unwrap_err()
            .to_string();
        assert!(
            unset
                .contains("`server.listen_env`: the environment variable SURETY_LISTEN is not set"),
            "{unset}"
        );
        let both = error_with(
            "database = \"sqlite:surety.db\"",
            "database = \"sqlite:surety.db\"\ndatabase_env = \"SURETY_DB\"",
        );
        assert!(
            both.contains("`server.database`: give `database` or `database_env`, not both"),
            "{both}"
        );
        let neither = error_with("database = \"sqlite:surety.db\"", "");
        assert!(neither.contains("`server.database`: missing"), "{neither}");
    }
}
