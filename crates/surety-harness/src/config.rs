//! The part of `surety.toml` certification reads: providers, and the routes
//! that say which contracts each provider serves.

use std::collections::BTreeMap;

use serde::Deserialize;
use surety_providers::config::{ConfigError, ProviderConfig, RawProviderConfig};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub contract: String,
    pub providers: Vec<String>,
    pub hedge_after_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    providers: BTreeMap<String, RawProviderConfig>,
    #[serde(default)]
    routes: BTreeMap<String, RawRoute>,
    /// The router's own sections: not certification's business.
    #[serde(default, rename = "server")]
    _server: Option<toml::Table>,
    #[serde(default, rename = "api_keys")]
    _api_keys: Option<Vec<toml::Table>>,
}

/// Providers and routes, validated against each other.
#[derive(Debug, Clone)]
pub struct CertifyConfig {
    pub providers: BTreeMap<String, ProviderConfig>,
    pub routes: BTreeMap<String, RawRoute>,
}

impl CertifyConfig {
    pub fn from_toml(text: &str, contracts: &[String]) -> Result<CertifyConfig, ConfigError> {
        let raw: RawFile =
            toml::from_str(text).map_err(|e| ConfigError::at("", e.to_string().trim_end()))?;
        let providers = raw
            .providers
            .into_iter()
            .map(|(id, p)| Ok((id.clone(), ProviderConfig::validate(&id, p)?)))
            .collect::<Result<BTreeMap<_, _>, ConfigError>>()?;
        for (id, route) in &raw.routes {
            if !contracts.contains(&route.contract) {
                return Err(ConfigError::at(
                    format!("routes.{id}.contract"),
                    format!("no contract `{}` under contracts/", route.contract),
                ));
            }
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
        }
        Ok(CertifyConfig {
            providers,
            routes: raw.routes,
        })
    }

    /// The contracts routed to `provider`, sorted.
    pub fn contracts_of(&self, provider: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .routes
            .values()
            .filter(|r| r.providers.iter().any(|p| p == provider))
            .map(|r| r.contract.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}
