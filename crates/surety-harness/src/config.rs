//! The part of `surety.toml` certification reads: providers, and the routes
//! that say which contracts each provider serves.

use std::collections::BTreeMap;

use serde::Deserialize;
use surety_providers::config::{
    ConfigError, ProviderConfig, RawProviderConfig, RawRoute, Route, validate_providers,
    validate_routes,
};

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
    pub routes: BTreeMap<String, Route>,
}

impl CertifyConfig {
    pub fn from_toml(text: &str, contracts: &[String]) -> Result<CertifyConfig, ConfigError> {
        let raw: RawFile =
            toml::from_str(text).map_err(|e| ConfigError::at("", e.to_string().trim_end()))?;
        let providers = validate_providers(raw.providers)?;
        let routes = validate_routes(raw.routes, &providers)?;
        if let Some(route) = routes.values().find(|r| !contracts.contains(&r.contract)) {
            return Err(ConfigError::at(
                format!("routes.{}.contract", route.id),
                format!("no contract `{}` under contracts/", route.contract),
            ));
        }
        Ok(CertifyConfig { providers, routes })
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
