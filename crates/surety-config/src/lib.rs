//! `surety.toml`, read once for everyone: its providers (validated by
//! `surety-providers`, which owns their wire formats) and its routes,
//! validated against each other here; `[server]` and `[[api_keys]]` kept as
//! tables for the router, which validates them (the harness has no use for
//! them). The one loader of the file: the router, the harness and the tests
//! all read it through this. Strict (`deny_unknown_fields`); every error
//! names its TOML path.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
pub use surety_providers::ConfigError;
use surety_providers::config::{ProviderConfig, RawProviderConfig, validate_providers};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    providers: BTreeMap<String, RawProviderConfig>,
    #[serde(default)]
    routes: BTreeMap<String, RawRoute>,
    server: Option<toml::Table>,
    #[serde(default)]
    api_keys: Vec<toml::Table>,
}

/// `surety.toml`, read once for everyone: its providers and routes
/// validated here; `[server]` and `[[api_keys]]` kept as tables for the
/// router, which validates them (the harness has no use for them). The one
/// loader of the file: the router, the harness and the tests all read it
/// through this.
#[derive(Debug, Clone)]
pub struct SuretyFile {
    pub providers: BTreeMap<String, ProviderConfig>,
    pub routes: BTreeMap<String, Route>,
    pub server: Option<toml::Table>,
    pub api_keys: Vec<toml::Table>,
}

impl SuretyFile {
    pub fn from_toml(text: &str) -> Result<SuretyFile, ConfigError> {
        let raw: RawFile =
            toml::from_str(text).map_err(|e| ConfigError::at("", e.to_string().trim_end()))?;
        let providers = validate_providers(raw.providers)?;
        let routes = validate_routes(raw.routes, &providers)?;
        Ok(SuretyFile {
            providers,
            routes,
            server: raw.server,
            api_keys: raw.api_keys,
        })
    }
}

/// `[routes.<id>]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub contract: String,
    pub providers: Vec<String>,
    pub hedge_after_ms: Option<u64>,
    /// How `/v1/chat/completions` serves the route (default `pinned`).
    pub facade: Option<Facade>,
}

/// How the OpenAI-compatible facade treats a client's messages on a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Facade {
    /// Only a rendering of the contract's templates is sent: the certified
    /// system prompt, and a user message read back into the input.
    #[default]
    Pinned,
    /// The client's messages pass through; every answer is still checked
    /// against the contract, and says that its prompt was not certified.
    OutputOnly,
}

impl Facade {
    pub fn as_str(self) -> &'static str {
        match self {
            Facade::Pinned => "pinned",
            Facade::OutputOnly => "output-only",
        }
    }
}

/// A route: a contract, and the providers that may serve it, in order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub id: String,
    pub contract: String,
    pub providers: Vec<String>,
    /// When a hedging attempt may start (for contracts without side effects).
    pub hedge_after: Option<Duration>,
    pub facade: Facade,
}

/// Validates every `[routes.<id>]` against the configured providers.
fn validate_routes(
    raw: BTreeMap<String, RawRoute>,
    providers: &BTreeMap<String, ProviderConfig>,
) -> Result<BTreeMap<String, Route>, ConfigError> {
    let mut routes = BTreeMap::new();
    for (id, route) in raw {
        if route.providers.is_empty() {
            return Err(ConfigError::at(
                format!("routes.{id}.providers"),
                "must list at least one provider",
            ));
        }
        for (i, p) in route.providers.iter().enumerate() {
            if !providers.contains_key(p) {
                return Err(ConfigError::at(
                    format!("routes.{id}.providers[{i}]"),
                    format!("no provider `{p}` is configured"),
                ));
            }
        }
        let hedge_after = match route.hedge_after_ms {
            Some(0) => {
                return Err(ConfigError::at(
                    format!("routes.{id}.hedge_after_ms"),
                    "must be at least 1 ms",
                ));
            }
            ms => ms.map(Duration::from_millis),
        };
        routes.insert(
            id.clone(),
            Route {
                id,
                contract: route.contract,
                providers: route.providers,
                hedge_after,
                facade: route.facade.unwrap_or_default(),
            },
        );
    }
    Ok(routes)
}
