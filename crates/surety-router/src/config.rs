//! `surety.toml` as the router reads it: `[server]`, `[[api_keys]]`,
//! `[providers.*]` and `[routes.*]`, strict, validated with errors that name
//! the TOML path. API keys are stored as sha256 hashes, never in clear.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use surety_providers::config::{
    ConfigError, ProviderConfig, RawProviderConfig, RawRoute, validate_providers, validate_routes,
};

pub use surety_providers::config::Route;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    server: RawServer,
    #[serde(default)]
    api_keys: Vec<RawApiKey>,
    #[serde(default)]
    providers: BTreeMap<String, RawProviderConfig>,
    #[serde(default)]
    routes: BTreeMap<String, RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: String,
    database: String,
    manifest: String,
    contracts: Option<String>,
    verifying_key: Option<String>,
    attempt_timeout_ms: Option<u64>,
    late_result_window_ms: Option<u64>,
    lease_ms: Option<u64>,
    max_body_bytes: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApiKey {
    owner: String,
    /// sha256 of the key, hex.
    sha256: String,
    #[serde(default)]
    admin: bool,
}

/// One API key's owner and scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub owner: String,
    pub admin: bool,
}

#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub listen: SocketAddr,
    pub database: String,
    pub manifest: PathBuf,
    pub contracts: PathBuf,
    pub verifying_key: Option<PathBuf>,
    pub attempt_timeout: Duration,
    pub late_result_window: Duration,
    pub lease: Duration,
    pub max_body_bytes: usize,
    /// By sha256 of the key, hex.
    pub api_keys: BTreeMap<String, ApiKey>,
    pub providers: BTreeMap<String, ProviderConfig>,
    pub routes: BTreeMap<String, Route>,
}

impl RouterConfig {
    pub fn from_toml(text: &str) -> Result<RouterConfig, ConfigError> {
        let raw: RawFile =
            toml::from_str(text).map_err(|e| ConfigError::at("", e.to_string().trim_end()))?;
        let listen = raw
            .server
            .listen
            .parse()
            .map_err(|e| ConfigError::at("server.listen", format!("not an address: {e}")))?;
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
            if api_keys
                .insert(
                    hash,
                    ApiKey {
                        owner: key.owner,
                        admin: key.admin,
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
        let providers = validate_providers(raw.providers)?;
        let routes = validate_routes(raw.routes, &providers)?;
        Ok(RouterConfig {
            listen,
            database: raw.server.database,
            manifest: PathBuf::from(raw.server.manifest),
            contracts: PathBuf::from(
                raw.server
                    .contracts
                    .unwrap_or_else(|| "contracts".to_owned()),
            ),
            verifying_key: raw.server.verifying_key.map(PathBuf::from),
            attempt_timeout: ms(
                "server.attempt_timeout_ms",
                raw.server.attempt_timeout_ms,
                60_000,
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
