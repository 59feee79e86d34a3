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

pub mod keys;
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
    #[serde(default)]
    budgets: Vec<toml::Table>,
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
    /// `[[budgets]]`, for the router.
    pub budgets: Vec<toml::Table>,
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
            budgets: raw.budgets,
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
    /// Shadow checks of the route's other providers on its succeeded jobs.
    pub shadow: Option<RawShadow>,
    /// How often the contract's certification cases are run through each
    /// eligible provider (within the shadow budget).
    pub recheck_every_ms: Option<u64>,
}

/// `[routes.<id>.shadow]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShadow {
    /// The share of succeeded jobs sampled, from 0 to 1.
    pub sampling: f64,
    /// Shadow and re-check calls per hour, at most.
    pub hourly_budget: u32,
    /// Shadow and re-check calls in flight, at most.
    pub max_concurrent: Option<u32>,
    /// How long one such call may take.
    pub timeout_ms: Option<u64>,
}

/// The router's own checks on a route: how many succeeded jobs are
/// shadowed, within what budget, and how often the certification cases
/// are re-checked. They can only take trust away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadow {
    /// Sampled jobs per million.
    pub per_million: u32,
    pub hourly_budget: u32,
    pub max_concurrent: u32,
    pub timeout: Duration,
}

impl Shadow {
    /// Whether a job whose uniform draw in `0..1_000_000` is `draw` is sampled.
    pub fn samples(&self, draw: u32) -> bool {
        draw < self.per_million
    }
}

/// Calls in flight at once for a route's live checks, by default.
pub const DEFAULT_SHADOW_CONCURRENCY: u32 = 2;
/// How long a live check's call may take, by default.
pub const DEFAULT_SHADOW_TIMEOUT_MS: u64 = 30_000;

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
    pub shadow: Option<Shadow>,
    pub recheck_every: Option<Duration>,
}

/// Validates `[routes.<id>.shadow]` (at `path`).
fn shadow(path: &str, raw: RawShadow) -> Result<Shadow, ConfigError> {
    if !(0.0..=1.0).contains(&raw.sampling) {
        return Err(ConfigError::at(
            format!("{path}.sampling"),
            "is a share of succeeded jobs, from 0 to 1",
        ));
    }
    let positive = |field: &str, n: u64| match n {
        0 => Err(ConfigError::at(
            format!("{path}.{field}"),
            "must be at least 1",
        )),
        n => Ok(n),
    };
    positive("hourly_budget", u64::from(raw.hourly_budget))?;
    let max_concurrent = raw.max_concurrent.unwrap_or(DEFAULT_SHADOW_CONCURRENCY);
    positive("max_concurrent", u64::from(max_concurrent))?;
    let timeout_ms = positive(
        "timeout_ms",
        raw.timeout_ms.unwrap_or(DEFAULT_SHADOW_TIMEOUT_MS),
    )?;
    Ok(Shadow {
        // Exact for the shares people write (0.05 is 50,000 per million).
        per_million: (raw.sampling * 1_000_000.0).round() as u32,
        hourly_budget: raw.hourly_budget,
        max_concurrent,
        timeout: Duration::from_millis(timeout_ms),
    })
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
        let shadow = route
            .shadow
            .map(|raw| shadow(&format!("routes.{id}.shadow"), raw))
            .transpose()?;
        let recheck_every = match (route.recheck_every_ms, &shadow) {
            (None, _) => None,
            (Some(0), _) => {
                return Err(ConfigError::at(
                    format!("routes.{id}.recheck_every_ms"),
                    "must be at least 1 ms",
                ));
            }
            (Some(_), None) => {
                return Err(ConfigError::at(
                    format!("routes.{id}.recheck_every_ms"),
                    format!(
                        "re-checks are paid from the route's budget: add `[routes.{id}.shadow]` with its `hourly_budget` (`sampling = 0` re-checks without shadowing)"
                    ),
                ));
            }
            (Some(ms), Some(_)) => Some(Duration::from_millis(ms)),
        };
        routes.insert(
            id.clone(),
            Route {
                id,
                contract: route.contract,
                providers: route.providers,
                hedge_after,
                facade: route.facade.unwrap_or_default(),
                shadow,
                recheck_every,
            },
        );
    }
    Ok(routes)
}
