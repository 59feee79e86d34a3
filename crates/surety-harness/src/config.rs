//! The part of `surety.toml` certification reads: providers, and the routes
//! that say which contracts each provider serves.

use std::collections::BTreeMap;

use surety_config::{ConfigError, Route, SuretyFile};
use surety_providers::config::ProviderConfig;

/// Providers and routes, validated against each other.
#[derive(Debug, Clone)]
pub struct CertifyConfig {
    pub providers: BTreeMap<String, ProviderConfig>,
    pub routes: BTreeMap<String, Route>,
}

impl CertifyConfig {
    /// The providers and routes of `surety.toml` (its router sections are
    /// the router's business), every route naming one of `contracts`.
    pub fn from_toml(text: &str, contracts: &[String]) -> Result<CertifyConfig, ConfigError> {
        let file = SuretyFile::from_toml(text)?;
        if let Some(route) = file
            .routes
            .values()
            .find(|r| !contracts.contains(&r.contract))
        {
            return Err(ConfigError::at(
                format!("routes.{}.contract", route.id),
                format!("no contract `{}` under contracts/", route.contract),
            ));
        }
        Ok(CertifyConfig {
            providers: file.providers,
            routes: file.routes,
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
