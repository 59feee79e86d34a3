//! Reading `surety.toml` into a [`RouterConfig`]: `[server]` and
//! `[[api_keys]]` as written (strict), each value checked and defaulted
//! (`defaults`), and the relations between values checked, every error
//! naming its TOML path.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use surety_config::{ConfigError, SuretyFile};

use super::{ApiKey, Listening, Route, RouterConfig, Settings, defaults};

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
    reconcile_after_ms: Option<u64>,
    reconcile_every_ms: Option<u64>,
    reconcile_horizon_ms: Option<u64>,
    reconcile_timeout_ms: Option<u64>,
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
    /// What a budget calls the key.
    name: Option<String>,
    /// sha256 of the key, hex.
    sha256: String,
    #[serde(default)]
    admin: bool,
    /// An admin whose operator pages show every owner's jobs.
    #[serde(default)]
    all_owners: bool,
}

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

/// `value` as the file gives it (else `default`), if it is within
/// `low..=high`; else an error naming `path`.
fn within<T: PartialOrd + Copy + std::fmt::Display>(
    path: &str,
    value: Option<T>,
    default: T,
    (low, high): (T, T),
) -> Result<T, ConfigError> {
    match value.unwrap_or(default) {
        n if n < low || n > high => Err(ConfigError::at(
            path,
            format!("must be between {low} and {high}"),
        )),
        n => Ok(n),
    }
}

/// A route's hedge starts before its first attempt could time out: a
/// hedge due after the attempt's timeout would never start.
fn hedges_fit(
    routes: &BTreeMap<String, Route>,
    attempt_timeout: Duration,
) -> Result<(), ConfigError> {
    for route in routes.values() {
        if let Some(after) = route.hedge_after.filter(|after| *after >= attempt_timeout) {
            return Err(ConfigError::at(
                format!("routes.{}.hedge_after_ms", route.id),
                format!(
                    "{} ms is not shorter than server.attempt_timeout_ms ({} ms): the first attempt would end unknown before the hedge could start; make it shorter, or raise server.attempt_timeout_ms",
                    after.as_millis(),
                    attempt_timeout.as_millis()
                ),
            ));
        }
    }
    Ok(())
}

impl RouterConfig {
    /// Each section of `surety.toml`, as docs/configuration.md heads it,
    /// with every key it takes, read off the types that read it.
    pub fn sections() -> Vec<(&'static str, &'static [&'static str])> {
        use surety_config::keys::fields_of;
        let mut sections = surety_config::keys::sections();
        sections.push(("[server]", fields_of::<RawServer>()));
        sections.push(("[[api_keys]]", fields_of::<RawApiKey>()));
        sections.push(("[[budgets]]", super::budgets::raw_fields()));
        sections
    }

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
            if let Some(name) = &key.name
                && (name.is_empty()
                    || api_keys
                        .values()
                        .any(|k: &ApiKey| k.name.as_ref() == Some(name)))
            {
                return Err(ConfigError::at(
                    format!("api_keys[{i}].name"),
                    "must be a name no other key has",
                ));
            }
            if api_keys
                .insert(
                    hash,
                    ApiKey {
                        owner: key.owner,
                        name: key.name,
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
        let budgets = super::budgets::read(file.budgets, &api_keys, &file.routes, &file.providers)?;
        let (providers, routes) = (file.providers, file.routes);
        let attempt_timeout = ms(
            "server.attempt_timeout_ms",
            raw.server.attempt_timeout_ms,
            defaults::ATTEMPT_TIMEOUT_MS,
        )?;
        timeouts_fit(text, attempt_timeout)?;
        hedges_fit(&routes, attempt_timeout)?;
        let max_connections = within(
            "server.max_connections",
            raw.server.max_connections,
            defaults::MAX_CONNECTIONS,
            (1, 1_000_000),
        )?;
        let settings = Settings {
            attempt_timeout,
            allow_keyless_chat: raw.server.allow_keyless_chat.unwrap_or(false),
            database_timeout: ms(
                "server.database_timeout_ms",
                raw.server.database_timeout_ms,
                defaults::DATABASE_TIMEOUT_MS,
            )?,
            retention: ms(
                "server.retention_ms",
                raw.server.retention_ms,
                defaults::RETENTION_MS,
            )?,
            secure_cookies: raw.server.secure_cookies.unwrap_or(false),
            listening: Listening {
                max_connections,
                request_read_timeout: ms(
                    "server.request_read_timeout_ms",
                    raw.server.request_read_timeout_ms,
                    defaults::REQUEST_READ_TIMEOUT_MS,
                )?,
            },
            shutdown_grace: ms(
                "server.shutdown_grace_ms",
                raw.server.shutdown_grace_ms,
                defaults::SHUTDOWN_GRACE_MS,
            )?,
            late_result_window: ms(
                "server.late_result_window_ms",
                raw.server.late_result_window_ms,
                defaults::LATE_RESULT_WINDOW_MS,
            )?,
            lease: ms("server.lease_ms", raw.server.lease_ms, defaults::LEASE_MS)?,
            max_body_bytes: raw
                .server
                .max_body_bytes
                .unwrap_or(defaults::MAX_BODY_BYTES),
            reconciling: super::Reconciling {
                after: ms(
                    "server.reconcile_after_ms",
                    raw.server.reconcile_after_ms,
                    defaults::RECONCILE_AFTER_MS,
                )?,
                every: ms(
                    "server.reconcile_every_ms",
                    raw.server.reconcile_every_ms,
                    defaults::RECONCILE_EVERY_MS,
                )?,
                horizon: ms(
                    "server.reconcile_horizon_ms",
                    raw.server.reconcile_horizon_ms,
                    defaults::RECONCILE_HORIZON_MS,
                )?,
                timeout: ms(
                    "server.reconcile_timeout_ms",
                    raw.server.reconcile_timeout_ms,
                    defaults::RECONCILE_TIMEOUT_MS,
                )?,
            },
        };
        Ok(RouterConfig {
            listen,
            database,
            database_connections: within(
                "server.database_connections",
                raw.server.database_connections,
                defaults::DATABASE_CONNECTIONS,
                (1, 1000),
            )?,
            manifest: PathBuf::from(raw.server.manifest),
            contracts: PathBuf::from(
                raw.server
                    .contracts
                    .unwrap_or_else(|| defaults::CONTRACTS.to_owned()),
            ),
            verifying_key: raw.server.verifying_key.map(PathBuf::from),
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
                Some(n) if n < defaults::MIN_SQLITE_BYTES => {
                    return Err(ConfigError::at(
                        "server.sqlite_max_bytes",
                        format!("must be at least {} (1 MiB)", defaults::MIN_SQLITE_BYTES),
                    ));
                }
                other => other,
            },
            operator_session: ms(
                "server.operator_session_ms",
                raw.server.operator_session_ms,
                defaults::OPERATOR_SESSION_MS,
            )?,
            max_failed_auth: match raw.server.max_failed_auth {
                None => Some(defaults::MAX_FAILED_AUTH),
                Some(0) => None,
                Some(n) => Some(n),
            },
            // Every owner has a limit (waits count toward it): by default a
            // quarter of the connections, so one owner never holds them all.
            owner_max_in_flight: std::num::NonZeroU32::new(match raw.server.owner_max_in_flight {
                None => defaults::owner_in_flight(max_connections),
                Some(n) => n,
            })
            .ok_or_else(|| ConfigError::at("server.owner_max_in_flight", "must be at least 1"))?,
            api_keys,
            providers,
            routes,
            budgets,
            settings,
        })
    }
}
