//! What the router may serve, decided from the signed manifest and the
//! configuration as they are at the moment of asking: the providers and
//! contracts as served (with what is computed from them once), each
//! provider's eligibility per contract, and the drift seen in answers.
//! Nothing here grants trust on its own: only a certified manifest entry
//! that matches the configuration now makes a provider eligible.

mod manifest;

use std::collections::BTreeMap;
use std::sync::Arc;

use surety_contracts::Contract;
use surety_exchange::pinning::UserTemplate;
use surety_manifest::{Current, Eligibility};
use surety_providers::{Provider, ProviderConfig};

use crate::config::Route;
pub use manifest::ManifestHolder;

/// A provider as the router serves it: the adapter, its configuration, and
/// the behaviour object a certificate of it must match.
#[derive(Debug)]
pub struct ServedProvider {
    pub adapter: Arc<dyn Provider>,
    pub config: ProviderConfig,
    pub behaviour: serde_json::Value,
}

/// A contract as the router serves it, with what is computed from it once:
/// the digest of its prompts as rendered now (a certificate must match it),
/// and its user template read as plain substitutions for prompt pinning, or
/// why it cannot be.
#[derive(Debug)]
pub struct ServedContract {
    pub contract: Arc<Contract>,
    pub prompt_digest: String,
    pub user_template: Result<UserTemplate, String>,
}

/// An answer from a model id the provider's certificate did not see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub contract: String,
    pub model: String,
    /// The ids the certificate saw answer.
    pub certified: Vec<String>,
    pub at: String,
}

/// A provider the manifest certifies for a job's contract, as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eligible {
    pub id: String,
    /// The model ids its certificate saw answer: an answer from any other is drift.
    pub models: Arc<[String]>,
}

/// What eligibility is decided from: the providers as configured and the
/// manifest as loaded, both as they are when asked.
#[derive(Debug, Clone, Copy)]
pub struct Certifier<'a> {
    pub providers: &'a BTreeMap<String, ServedProvider>,
    pub manifest: &'a ManifestHolder,
}

impl Certifier<'_> {
    /// Whether `provider` may serve `contract` now: its manifest entry must
    /// be certified for the contract's digest and rendered prompts and for
    /// the provider's configured behaviour, and not expired. With it, the
    /// model ids the certificate saw answer.
    pub fn eligibility(
        &self,
        provider: &str,
        contract: &ServedContract,
    ) -> (Eligibility, Vec<String>) {
        let (Some(served), Some(manifest)) =
            (self.providers.get(provider), self.manifest.current())
        else {
            return (Eligibility::Missing, Vec::new());
        };
        let current = Current {
            contract_digest: &contract.contract.digest,
            prompt_digest: &contract.prompt_digest,
            provider: &served.behaviour,
        };
        let id = &contract.contract.id;
        let verdict = manifest.eligibility(provider, id, &current, time::OffsetDateTime::now_utc());
        let models = manifest
            .entry(provider, id)
            .map(|e| e.served_model.response_models.clone())
            .unwrap_or_default();
        (verdict, models)
    }

    /// `provider` with its certified models, if it is eligible for `served`
    /// now; a provider that is not is logged, since an attempt was about
    /// to start there.
    pub fn eligible_now(&self, provider: &str, served: &ServedContract) -> Option<Eligible> {
        match self.eligibility(provider, served) {
            (Eligibility::Certified, models) => Some(Eligible {
                id: provider.to_owned(),
                models: models.into(),
            }),
            (other, _) => {
                tracing::warn!(provider = %provider, contract = %served.contract.id, reason = %other, "no longer eligible: no attempt starts there");
                None
            }
        }
    }

    /// The route's providers that may serve its contract now, in the
    /// route's order, with why each of the others may not.
    pub fn eligible(
        &self,
        route: &Route,
        contract: &ServedContract,
    ) -> (Vec<Eligible>, Vec<String>) {
        let mut ok = Vec::new();
        let mut why_not = Vec::new();
        for provider in &route.providers {
            match self.eligibility(provider, contract) {
                (Eligibility::Certified, models) => ok.push(Eligible {
                    id: provider.clone(),
                    models: models.into(),
                }),
                (other, _) => why_not.push(format!("{provider}: {other}")),
            }
        }
        (ok, why_not)
    }
}
