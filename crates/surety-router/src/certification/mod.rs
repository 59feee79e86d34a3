//! What the router may serve, decided from the signed manifest, the
//! configuration and the router's own demotions as they are at the moment
//! of asking: the providers and contracts as served (with what is computed
//! from them once), each provider's eligibility per contract, and the drift
//! seen in answers. Nothing here grants trust on its own: only a certified
//! manifest entry that matches the configuration now makes a provider
//! eligible, and a demotion newer than that certification takes it away.

mod manifest;

use std::collections::BTreeMap;
use std::sync::Arc;

use surety_contracts::Contract;
use surety_exchange::pinning::UserTemplate;
use surety_manifest::{Current, Eligibility};
use surety_providers::{Provider, ProviderConfig, Tokenizer};
use surety_store::Demotion;

use crate::config::Route;
pub use manifest::ManifestHolder;

/// A provider as the router serves it: the adapter, its configuration, and
/// the behaviour object a certificate of it must match.
#[derive(Debug)]
pub struct ServedProvider {
    pub adapter: Arc<dyn Provider>,
    pub config: ProviderConfig,
    pub behaviour: surety_manifest::Behaviour,
    /// The tokenizer its configuration names, loaded on first use.
    pub tokenizer: tokio::sync::OnceCell<Result<Tokenizer, String>>,
    /// Texts it counted, with their counts (see [`ServedProvider::count`]).
    pub counted: std::sync::Mutex<Counted>,
}

/// Texts a provider's tokenizer counted and their counts: a contract's
/// system prompt and schema come with each of its jobs. At most
/// [`Counted::MOST_BYTES`] of text is kept; past it, all is forgotten.
#[derive(Debug, Default)]
pub struct Counted {
    counts: std::collections::HashMap<String, u64>,
    bytes: usize,
}

impl Counted {
    pub const MOST_BYTES: usize = 1 << 20;

    fn get(&self, text: &str) -> Option<u64> {
        self.counts.get(text).copied()
    }

    fn keep(&mut self, text: &str, count: u64) {
        if self.bytes + text.len() > Self::MOST_BYTES {
            self.counts.clear();
            self.bytes = 0;
        }
        if text.len() <= Self::MOST_BYTES && self.counts.insert(text.to_owned(), count).is_none() {
            self.bytes += text.len();
        }
    }
}

impl ServedProvider {
    /// The tokenizer its certificates were judged by (see
    /// [`Tokenizer::for_provider`]), loaded once, off the async threads.
    pub async fn tokenizer(&self) -> Result<&Tokenizer, String> {
        self.tokenizer
            .get_or_init(|| async {
                let (config, adapter) = (self.config.clone(), Arc::clone(&self.adapter));
                tokio::task::spawn_blocking(move || Tokenizer::for_provider(&config, adapter))
                    .await
                    .unwrap_or_else(|e| Err(format!("loading the tokenizer: {e}")))
            })
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The tokens of a prompt of `parts` by its tokenizer, as
    /// [`Tokenizer::count`] counts them (a sum over the parts), each part's
    /// count kept for the next time it comes. `Ok(None)` with no tokenizer.
    pub async fn count(&self, parts: &[&str]) -> Result<Option<u64>, String> {
        let tokenizer = self.tokenizer().await?;
        let mut total = 0u64;
        for part in parts {
            let kept = self
                .counted
                .lock()
                .map_err(|_| "the counted texts' lock is poisoned".to_owned())?
                .get(part);
            let count = match kept {
                Some(count) => count,
                None => {
                    let Some(count) = tokenizer.count(&[part]).await? else {
                        return Ok(None);
                    };
                    if let Ok(mut counted) = self.counted.lock() {
                        counted.keep(part, count);
                    }
                    count
                }
            };
            total = total.saturating_add(count);
        }
        Ok(Some(total))
    }
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
    /// When that certificate was made (ms): a demotion at or after it stands.
    pub certified_at_ms: i64,
}

impl Eligible {
    /// What an attempt here rests on, for the database to check against
    /// the open demotions as the attempt starts.
    pub fn trust(&self, contract: &str) -> surety_store::Trust {
        surety_store::Trust {
            contract: contract.to_owned(),
            certified_at_ms: self.certified_at_ms,
        }
    }
}

/// Whether a provider may serve a contract, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// What the manifest says of the provider as it is configured now.
    Manifest(Eligibility),
    /// Certified, but demoted by the router's own checks since the
    /// certification.
    Demoted(Demotion),
}

impl Verdict {
    pub fn certified(&self) -> bool {
        *self == Verdict::Manifest(Eligibility::Certified)
    }

    /// A stable word for the verdict (`certified`, `stale`, `demoted`, …).
    pub fn code(&self) -> &'static str {
        match self {
            Verdict::Manifest(e) => e.code(),
            Verdict::Demoted(_) => "demoted",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Manifest(e) => e.fmt(f),
            Verdict::Demoted(d) => f.write_str(&d.reason),
        }
    }
}

/// What eligibility is decided from: the providers as configured, the
/// manifest as loaded, and the open demotions as the database had them,
/// all as they are when asked.
#[derive(Debug, Clone)]
pub struct Certifier<'a> {
    pub providers: &'a BTreeMap<String, ServedProvider>,
    pub manifest: &'a ManifestHolder,
    pub demotions: Arc<Vec<Demotion>>,
}

/// `rfc3339` in milliseconds since the epoch, if it reads.
fn millis(rfc3339: &str) -> Option<i64> {
    let at = surety_manifest::parse_time(rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}

impl Certifier<'_> {
    /// Whether `provider` may serve `contract` now: its manifest entry must
    /// be certified for the contract's digest and rendered prompts and for
    /// the provider's configured behaviour, and not expired; and no
    /// demotion newer than that certification may stand. With it, the
    /// model ids the certificate saw answer.
    pub fn eligibility(&self, provider: &str, contract: &ServedContract) -> (Verdict, Vec<String>) {
        let (verdict, models, _) = self.judge(provider, contract);
        (verdict, models)
    }

    /// [`Certifier::eligibility`], with when the certification was made
    /// (ms; `i64::MAX` without one).
    fn judge(&self, provider: &str, contract: &ServedContract) -> (Verdict, Vec<String>, i64) {
        let (Some(served), Some(manifest)) =
            (self.providers.get(provider), self.manifest.current())
        else {
            return (
                Verdict::Manifest(Eligibility::Missing),
                Vec::new(),
                i64::MAX,
            );
        };
        let current = Current {
            contract_digest: &contract.contract.digest,
            prompt_digest: &contract.prompt_digest,
            provider: &served.behaviour,
        };
        let id = &contract.contract.id;
        let verdict = manifest.eligibility(provider, id, &current, time::OffsetDateTime::now_utc());
        let entry = manifest.entry(provider, id);
        let models = entry
            .map(|e| e.served_model.response_models.clone())
            .unwrap_or_default();
        let certified_at = entry
            .and_then(|e| millis(&e.generated_at))
            .unwrap_or(i64::MAX);
        if verdict != Eligibility::Certified {
            return (Verdict::Manifest(verdict), models, certified_at);
        }
        // A certification newer than the demotion lifts it (the background
        // loop records the lift; the verdict does not wait for it).
        match self.demotions.iter().find(|d| {
            d.provider == provider && d.contract == *id && d.demoted_at_ms >= certified_at
        }) {
            Some(demotion) => (Verdict::Demoted(demotion.clone()), models, certified_at),
            None => (Verdict::Manifest(verdict), models, certified_at),
        }
    }

    /// `provider` with its certified models, if it is eligible for `served`
    /// now; a provider that is not is logged, since an attempt was about
    /// to start there.
    pub fn eligible_now(&self, provider: &str, served: &ServedContract) -> Option<Eligible> {
        match self.judge(provider, served) {
            (verdict, models, certified_at_ms) if verdict.certified() => Some(Eligible {
                id: provider.to_owned(),
                models: models.into(),
                certified_at_ms,
            }),
            (other, _, _) => {
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
            match self.judge(provider, contract) {
                (verdict, models, certified_at_ms) if verdict.certified() => ok.push(Eligible {
                    id: provider.clone(),
                    models: models.into(),
                    certified_at_ms,
                }),
                (other, _, _) => why_not.push(format!("{provider}: {other}")),
            }
        }
        (ok, why_not)
    }

    /// Whether an open demotion of `contract` is listed (it may since have
    /// been lifted: ask the database again).
    pub fn lists_demotions_of(&self, contract: &str) -> bool {
        self.demotions.iter().any(|d| d.contract == contract)
    }

    /// The open demotions a certification newer than them has lifted, to
    /// be recorded as lifted.
    pub fn lifted_by_certification(&self) -> Vec<(Demotion, i64)> {
        let Some(manifest) = self.manifest.current() else {
            return Vec::new();
        };
        self.demotions
            .iter()
            .filter_map(|d| {
                let entry = manifest.entry(&d.provider, &d.contract)?;
                let at = millis(&entry.generated_at)?;
                (at > d.demoted_at_ms).then(|| (d.clone(), at))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(tokenizer: &str) -> ServedProvider {
        let config = surety_providers::ProvidersConfig::from_toml(&format!(
            "[providers.p]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\ncontext_window = 16000\ntokenizer = \"{tokenizer}\"\n"
        ))
        .unwrap()
        .providers
        .remove("p")
        .unwrap();
        ServedProvider {
            adapter: surety_providers::build_provider(&config).unwrap(),
            behaviour: surety_manifest::Behaviour::new(config.behaviour()),
            config,
            tokenizer: tokio::sync::OnceCell::new(),
            counted: std::sync::Mutex::default(),
        }
    }

    #[tokio::test]
    async fn a_kept_count_is_the_tokenizers_own() {
        let provider = served("tiktoken:o200k_base");
        let parts = ["Detect the language of the text.", "Bonjour à tous", ""];
        let tokenizer = provider.tokenizer().await.unwrap();
        let counted = tokenizer.count(&parts).await.unwrap();
        assert!(counted.is_some_and(|n| n > 12));
        // Counted, then read back from what was kept: the same.
        assert_eq!(provider.count(&parts).await.unwrap(), counted);
        assert_eq!(provider.count(&parts).await.unwrap(), counted);
        assert_eq!(provider.counted.lock().unwrap().counts.len(), 3);
        // No tokenizer: nothing counted, nothing kept.
        let none = served("none");
        assert_eq!(none.count(&parts).await.unwrap(), None);
        assert!(none.counted.lock().unwrap().counts.is_empty());
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let mut counted = Counted::default();
        let text = "x".repeat(Counted::MOST_BYTES / 4 + 1);
        for n in 0..4u8 {
            counted.keep(&format!("{n}{text}"), u64::from(n));
        }
        // The fourth would pass the bound: all before it was forgotten.
        assert_eq!(counted.counts.len(), 1);
        assert!(counted.bytes <= Counted::MOST_BYTES);
        assert_eq!(counted.get(&format!("3{text}")), Some(3));
        counted.keep(&"y".repeat(Counted::MOST_BYTES + 1), 9);
        assert!(counted.bytes <= Counted::MOST_BYTES);
    }
}
