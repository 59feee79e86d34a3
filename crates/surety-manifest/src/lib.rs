//! The certification manifest: per provider and contract, whether the
//! provider kept the contract, bound to the contract's digest, and when that
//! lapses. The harness writes it; the router routes only along what it
//! certifies.
//!
//! The whole manifest may be signed with ed25519: the signature covers the
//! RFC 8785 canonical form of the manifest without its `signature` field.
//!
//! Architecture invariant: this crate owns the manifest format. It reads no
//! clock: callers pass the time.

use std::path::Path;

use ed25519_dalek::{Signer, Verifier};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The format this crate reads and writes.
/// Version 2 binds each entry to the provider's behaviour and the rendered
/// prompts; a version 1 entry said too little to be trusted, and is refused.
pub const FORMAT: &str = "surety-manifest/2";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub generated_at: String,
    pub entries: Vec<Entry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Certified,
    Failed,
}

/// One provider x contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub provider: String,
    pub contract: String,
    pub status: Status,
    pub contract_digest: String,
    /// sha256 over every rendered prompt of the contract's cases, as sent.
    pub prompt_digest: String,
    /// sha256 of the rendered system prompt, when every case has the same
    /// one: the certified system prompt the facade pins.
    pub system_prompt_digest: Option<String>,
    /// sha256 of the canonical form of `provider_config`.
    pub provider_fingerprint: String,
    /// What in the provider's configuration changes its answers (kind, base
    /// URL, model, structured-output mode, tokenizer, context window, seed);
    /// never a secret.
    pub provider_config: Value,
    /// The base URL in the configuration when the run was pointed elsewhere
    /// (`--override-base-url`): the entry is bound to the URL it ran
    /// against, so a router serves it only if its configuration names that URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url_override: Option<String>,
    /// The provider's prices as the run had them (`[providers.x.price]`),
    /// where it has them: what its tokens were reckoned at. Not part of
    /// the binding (a price changes no answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Value>,
    pub served_model: ServedModel,
    pub tokenizer: String,
    pub structured_mode: String,
    /// Where the provider's structured-output mode drops a keyword the schema uses.
    pub lint: Vec<String>,
    pub counts: Counts,
    pub failures: Vec<Failure>,
    pub tokens: Tokens,
    pub latency_ms: Latency,
    pub generated_at: String,
    pub expires_at: String,
    pub harness_version: String,
}

/// What the server reported of the model it serves.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServedModel {
    /// The `model` field of the responses, as seen.
    pub response_models: Vec<String>,
    /// The `/v1/models` listing, where the server has one.
    pub models_endpoint: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counts {
    pub cases: u32,
    pub stable_pass: u32,
    pub flaky: u32,
    pub stable_fail: u32,
    pub samples: u32,
    pub samples_passed: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    pub case: String,
    /// The sample (1-based), or none for a per-case check (golden, determinism).
    pub sample: Option<u32>,
    pub check: String,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tokens {
    pub prompt_max: u64,
    pub completion_max: u64,
    pub prompt_total: u64,
    pub completion_total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    pub p50: u64,
    pub p95: u64,
    pub max: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub algorithm: String,
    /// The verifying key, hex: which key signed, not a reason to trust it.
    pub public_key: String,
    pub value: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the manifest does not parse: {0}")]
    Parse(String),
    #[error("the manifest's format is `{0}`; this build reads `{FORMAT}`")]
    Format(String),
    #[error("the manifest is not signed")]
    Unsigned,
    #[error("the manifest's signature does not verify: {0}")]
    BadSignature(String),
    #[error("the manifest was signed by key {found}, not by the configured key {expected}")]
    WrongKey { expected: String, found: String },
    #[error("bad key: {0}")]
    BadKey(String),
    #[error("bad time `{0}`")]
    BadTime(String),
}

/// Whether a provider may serve a contract, and if not, why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eligibility {
    Certified,
    /// The manifest has no entry for the pair.
    Missing,
    /// Certification ran and failed.
    Failed,
    /// Certified against another digest: the contract changed since.
    Stale {
        certified_digest: String,
    },
    /// The prompts rendered now are not the ones certified.
    PromptChanged {
        certified_digest: String,
    },
    /// The provider's configuration changed since certification.
    ProviderChanged {
        changes: Vec<Change>,
    },
    /// Certified, but past its expiry.
    Expired {
        expired_at: String,
    },
}

/// One field of a provider's behaviour that changed since certification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub field: String,
    /// As certified (`(none)` when absent).
    pub certified: String,
    /// As configured now.
    pub current: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} → {}", self.field, self.certified, self.current)
    }
}

impl Eligibility {
    /// A stable word for the state: `certified`, `missing`, `failed`,
    /// `stale`, `prompt_changed`, `provider_changed` or `expired`.
    pub fn code(&self) -> &'static str {
        match self {
            Eligibility::Certified => "certified",
            Eligibility::Missing => "missing",
            Eligibility::Failed => "failed",
            Eligibility::Stale { .. } => "stale",
            Eligibility::PromptChanged { .. } => "prompt_changed",
            Eligibility::ProviderChanged { .. } => "provider_changed",
            Eligibility::Expired { .. } => "expired",
        }
    }
}

/// Why, in words: `provider config changed: model a → b`.
impl std::fmt::Display for Eligibility {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Eligibility::Certified => f.write_str("certified"),
            Eligibility::Missing => f.write_str("not certified: the manifest has no entry"),
            Eligibility::Failed => f.write_str("certification failed"),
            Eligibility::Stale { certified_digest } => write!(
                f,
                "stale: certified for contract digest {certified_digest}, the contract changed since"
            ),
            Eligibility::PromptChanged { certified_digest } => write!(
                f,
                "prompt changed: certified prompts {certified_digest}, the rendered prompts differ now"
            ),
            Eligibility::ProviderChanged { changes } => {
                let changes: Vec<String> = changes.iter().map(Change::to_string).collect();
                write!(f, "provider config changed: {}", changes.join(", "))
            }
            Eligibility::Expired { expired_at } => write!(f, "expired at {expired_at}"),
        }
    }
}

/// What an entry must match now: the contract as it is, the prompts it
/// renders, and the provider's behaviour as configured.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    pub contract_digest: &'a str,
    pub prompt_digest: &'a str,
    /// The provider's behaviour object (see `Entry::provider_config`).
    pub provider: &'a Behaviour,
}

/// A provider's behaviour object with its fingerprint, hashed once (the
/// router asks for eligibility at every attempt; the behaviour is fixed
/// for as long as the configuration is).
#[derive(Debug, Clone, PartialEq)]
pub struct Behaviour {
    value: Value,
    fingerprint: String,
}

impl Behaviour {
    pub fn new(value: Value) -> Behaviour {
        let fingerprint = fingerprint(&value);
        Behaviour { value, fingerprint }
    }

    pub fn value(&self) -> &Value {
        &self.value
    }

    /// `sha256:` and the hex of the JCS form's hash.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

/// The fields of two behaviour objects that differ, in key order.
pub fn changes(certified: &Value, current: &Value) -> Vec<Change> {
    let empty = serde_json::Map::new();
    let a = certified.as_object().unwrap_or(&empty);
    let b = current.as_object().unwrap_or(&empty);
    let show = |v: Option<&Value>| match v {
        None => "(none)".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| Change {
            field: k.clone(),
            certified: show(a.get(k)),
            current: show(b.get(k)),
        })
        .collect()
}

pub fn now_rfc3339(now: OffsetDateTime) -> String {
    now.format(&Rfc3339)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}

pub fn parse_time(text: &str) -> Result<OffsetDateTime, ManifestError> {
    OffsetDateTime::parse(text, &Rfc3339).map_err(|_| ManifestError::BadTime(text.to_owned()))
}

/// `sha256:<hex>` of the canonical JSON of `value`.
pub fn fingerprint(value: &Value) -> String {
    let canonical = serde_jcs::to_vec(value).unwrap_or_default();
    format!("sha256:{}", hex::encode(Sha256::digest(&canonical)))
}

impl Manifest {
    pub fn new(now: OffsetDateTime) -> Manifest {
        Manifest {
            format: FORMAT.to_owned(),
            generated_at: now_rfc3339(now),
            entries: Vec::new(),
            signature: None,
        }
    }

    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let manifest: Manifest =
            serde_json::from_str(text).map_err(|e| ManifestError::Parse(e.to_string()))?;
        if manifest.format != FORMAT {
            return Err(ManifestError::Format(manifest.format));
        }
        Ok(manifest)
    }

    /// Reads a manifest; a missing file is an empty manifest.
    pub fn load_or_new(path: &Path, now: OffsetDateTime) -> Result<Manifest, ManifestError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Manifest::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Manifest::new(now)),
            Err(source) => Err(ManifestError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Writes the manifest atomically (a temporary file, then a rename), so a
    /// router reloading it never reads half of it.
    pub fn write(&self, path: &Path) -> Result<(), ManifestError> {
        let io = |source| ManifestError::Io {
            path: path.display().to_string(),
            source,
        };
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| ManifestError::Parse(e.to_string()))?
            + "\n";
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Replaces every entry of `provider` with `entries`; other providers'
    /// entries stay as they were. Any signature is dropped: sign again.
    pub fn replace_provider(&mut self, provider: &str, entries: Vec<Entry>, now: OffsetDateTime) {
        self.entries.retain(|e| e.provider != provider);
        self.entries.extend(entries);
        self.entries
            .sort_by(|a, b| (&a.provider, &a.contract).cmp(&(&b.provider, &b.contract)));
        self.generated_at = now_rfc3339(now);
        self.signature = None;
    }

    /// The bytes a signature covers: the canonical JSON without `signature`.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let unsigned = Manifest {
            signature: None,
            ..self.clone()
        };
        serde_jcs::to_vec(&unsigned).unwrap_or_default()
    }

    pub fn sign(&mut self, key: &ed25519_dalek::SigningKey) {
        let value = key.sign(&self.signing_bytes());
        self.signature = Some(Signature {
            algorithm: "ed25519".to_owned(),
            public_key: hex::encode(key.verifying_key().as_bytes()),
            value: hex::encode(value.to_bytes()),
        });
    }

    /// Checks the signature against the configured verifying key.
    pub fn verify(&self, key: &ed25519_dalek::VerifyingKey) -> Result<(), ManifestError> {
        let signature = self.signature.as_ref().ok_or(ManifestError::Unsigned)?;
        if signature.algorithm != "ed25519" {
            return Err(ManifestError::BadSignature(format!(
                "unknown algorithm `{}`",
                signature.algorithm
            )));
        }
        let expected = hex::encode(key.as_bytes());
        if signature.public_key != expected {
            return Err(ManifestError::WrongKey {
                expected,
                found: signature.public_key.clone(),
            });
        }
        let bytes: [u8; 64] = hex::decode(&signature.value)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                ManifestError::BadSignature("the signature is not 64 hex bytes".into())
            })?;
        key.verify(
            &self.signing_bytes(),
            &ed25519_dalek::Signature::from_bytes(&bytes),
        )
        .map_err(|e| ManifestError::BadSignature(e.to_string()))
    }

    pub fn entry(&self, provider: &str, contract: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.provider == provider && e.contract == contract)
    }

    /// May `provider` serve `contract` as it is now (`current`), at `now`?
    /// Only if its entry is certified for this contract digest, these
    /// rendered prompts and this provider behaviour (same fingerprint), and
    /// has not expired.
    pub fn eligibility(
        &self,
        provider: &str,
        contract: &str,
        current: &Current<'_>,
        now: OffsetDateTime,
    ) -> Eligibility {
        let Some(entry) = self.entry(provider, contract) else {
            return Eligibility::Missing;
        };
        if entry.status != Status::Certified {
            return Eligibility::Failed;
        }
        if entry.contract_digest != current.contract_digest {
            return Eligibility::Stale {
                certified_digest: entry.contract_digest.clone(),
            };
        }
        if entry.prompt_digest != current.prompt_digest {
            return Eligibility::PromptChanged {
                certified_digest: entry.prompt_digest.clone(),
            };
        }
        if entry.provider_fingerprint != current.provider.fingerprint() {
            let mut changes = changes(&entry.provider_config, current.provider.value());
            if let (Some(configured), Some(url)) = (
                &entry.base_url_override,
                changes.iter_mut().find(|c| c.field == "base_url"),
            ) {
                url.certified = format!(
                    "{} (certified with --override-base-url; the configuration then said {configured})",
                    url.certified
                );
            }
            if changes.is_empty() {
                // The recorded behaviour does not hash to the recorded fingerprint.
                changes.push(Change {
                    field: "fingerprint".to_owned(),
                    certified: entry.provider_fingerprint.clone(),
                    current: current.provider.fingerprint().to_owned(),
                });
            }
            return Eligibility::ProviderChanged { changes };
        }
        match parse_time(&entry.expires_at) {
            Ok(expiry) if expiry > now => Eligibility::Certified,
            _ => Eligibility::Expired {
                expired_at: entry.expires_at.clone(),
            },
        }
    }
}

/// Reads a signing key: 32 bytes, hex, alone in a file.
pub fn read_signing_key(path: &Path) -> Result<ed25519_dalek::SigningKey, ManifestError> {
    let bytes = read_key_bytes(path)?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&bytes))
}

/// Reads a verifying key: 32 bytes, hex, alone in a file.
pub fn read_verifying_key(path: &Path) -> Result<ed25519_dalek::VerifyingKey, ManifestError> {
    let bytes = read_key_bytes(path)?;
    ed25519_dalek::VerifyingKey::from_bytes(&bytes)
        .map_err(|e| ManifestError::BadKey(e.to_string()))
}

fn read_key_bytes(path: &Path) -> Result<[u8; 32], ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Io {
        path: path.display().to_string(),
        source,
    })?;
    hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            ManifestError::BadKey(format!(
                "{}: expected 32 bytes as 64 hex digits",
                path.display()
            ))
        })
}
