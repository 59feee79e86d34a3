//! Provider configuration in TOML: parsed strictly (`deny_unknown_fields`)
//! into raw structs, then validated into a typed [`ProviderConfig`] whose
//! errors name the TOML path. Secrets are never in the file: only the name
//! of the environment variable that holds each one.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::kinds::{Support, spec};
use crate::secret::Secret;
use crate::{Capabilities, Provider, StructuredMode};

/// A configuration error, naming where in the TOML it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", if self.path.is_empty() { self.message.clone() } else { format!("`{}`: {}", self.path, self.message) })]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn at(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            path: path.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI chat completions, and every server that speaks it.
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// Google's Gemini API (generateContent).
    Gemini,
    /// OpenAI's Responses API.
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
}

impl ProviderKind {
    /// Whether this kind takes a client's cache breakpoints
    /// (`cache_control`) and `anthropic-beta` as the client sent them:
    /// Anthropic's own. OpenAI's and Gemini's cache a prompt's prefix
    /// themselves, with nothing to mark.
    pub fn takes_client_caching(self) -> bool {
        self == ProviderKind::Anthropic
    }
}

/// How prompts are counted in tokens for this provider.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum TokenizerConfig {
    /// A tiktoken encoding (`cl100k_base`, `o200k_base`, ...), for OpenAI-family models.
    Tiktoken(String),
    /// The server's own tokenize endpoint.
    Server,
    /// No tokenizer is known: token checks are reported as unverified.
    None,
}

/// `[providers.<id>]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProviderConfig {
    pub kind: ProviderKind,
    pub base_url: String,
    pub model: String,
    pub api_key_env: Option<String>,
    pub structured_output: Option<Vec<StructuredMode>>,
    pub tokenizer: Option<String>,
    pub context_window: u32,
    pub seed: Option<bool>,
    pub idempotency_header: Option<String>,
    pub models_endpoint: Option<bool>,
    pub tokenize_endpoint: Option<bool>,
    /// Whether the server takes tools (an OpenAI-compatible server may not).
    pub tool_calls: Option<bool>,
    /// Whether the provider keeps each answer for surety to ask for later
    /// (OpenAI's stored completions; off by default).
    pub store: Option<bool>,
    /// Whether each call runs in the background at the provider and is
    /// polled (the Responses API; needs `store`).
    pub background: Option<bool>,
    /// Model ids besides `model` (and its dated snapshots) that may answer.
    pub served_models: Option<Vec<String>>,
    /// The most bytes of a response read (default 8 MiB).
    pub max_response_bytes: Option<usize>,
    #[serde(default)]
    pub timeouts: RawTimeouts,
    /// What the model's tokens cost, for budgets.
    pub price: Option<RawPrice>,
}

/// `[providers.<id>.price]` as written: per million tokens, in `currency`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
    pub currency: String,
    pub input_per_million: f64,
    pub output_per_million: f64,
    /// Prompt tokens read from the provider's cache (default: `input_per_million`).
    pub cached_input_per_million: Option<f64>,
}

/// A model's prices, in millionths of `currency` per million tokens (so
/// one token costs that many millionths divided by a million): exact
/// integers, so a budget adds up the same on every replica.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Price {
    /// An ISO 4217 code (`USD`, `EUR`): three upper-case letters.
    pub currency: String,
    pub input_micros_per_million: u64,
    pub output_micros_per_million: u64,
    pub cached_input_micros_per_million: u64,
}

impl Price {
    /// `tokens` at `micros_per_million`, in millionths of the currency,
    /// rounded up (a budget is never under-charged).
    fn of(tokens: u64, micros_per_million: u64) -> u64 {
        let micros = u128::from(tokens) * u128::from(micros_per_million);
        u64::try_from(micros.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }

    /// The most a call of `prompt_tokens` that may answer `max_output_tokens`
    /// can cost: every prompt token uncached.
    pub fn worst_case(&self, prompt_tokens: u64, max_output_tokens: u64) -> u64 {
        Price::of(prompt_tokens, self.input_micros_per_million)
            .saturating_add(Price::of(max_output_tokens, self.output_micros_per_million))
    }

    /// What a call that used `usage` cost: cached prompt tokens at the
    /// cached price, the rest of the prompt (cache writes included) at the
    /// input price, the answer at the output price.
    pub fn cost(&self, usage: &crate::Usage) -> u64 {
        let cached = usage.cache_read_tokens.min(usage.prompt_tokens);
        Price::of(usage.prompt_tokens - cached, self.input_micros_per_million)
            .saturating_add(Price::of(cached, self.cached_input_micros_per_million))
            .saturating_add(Price::of(
                usage.completion_tokens,
                self.output_micros_per_million,
            ))
    }

    /// What the configuration gives, checked: a currency code and prices
    /// that are finite and not negative.
    fn from_raw(raw: RawPrice, path: &dyn Fn(&str) -> String) -> Result<Price, ConfigError> {
        if raw.currency.len() != 3 || !raw.currency.chars().all(|c| c.is_ascii_uppercase()) {
            return Err(ConfigError::at(
                path("price.currency"),
                format!(
                    "`{}` is not a currency code (three upper-case letters, as `USD`)",
                    raw.currency
                ),
            ));
        }
        let micros = |field: &str, value: f64| {
            if !value.is_finite() || !(0.0..=1e9).contains(&value) {
                return Err(ConfigError::at(
                    path(&format!("price.{field}")),
                    "must be a price of at least 0 (per million tokens)",
                ));
            }
            Ok((value * 1e6).round() as u64)
        };
        let input = micros("input_per_million", raw.input_per_million)?;
        Ok(Price {
            input_micros_per_million: input,
            output_micros_per_million: micros("output_per_million", raw.output_per_million)?,
            cached_input_micros_per_million: match raw.cached_input_per_million {
                Some(cached) => micros("cached_input_per_million", cached)?,
                None => input,
            },
            currency: raw.currency,
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTimeouts {
    pub connect_ms: Option<u64>,
    pub request_ms: Option<u64>,
    /// Between polls of a background call.
    pub poll_ms: Option<u64>,
}

/// One validated provider. It holds no secret, so it can be shown, logged
/// and fingerprinted as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderConfig {
    pub id: String,
    pub kind: ProviderKind,
    pub base_url: String,
    pub model: String,
    pub api_key_env: Option<String>,
    #[serde(serialize_with = "serialize_capabilities")]
    pub capabilities: Capabilities,
    pub tokenizer: TokenizerConfig,
    pub context_window: u32,
    /// Model ids besides `model` that may answer (see [`ProviderConfig::serves`]).
    pub served_models: Vec<String>,
    /// The most bytes of a response read; past it the call fails.
    pub max_response_bytes: usize,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Between polls of a background call.
    pub poll_interval: Duration,
    /// What its tokens cost, where the configuration says.
    pub price: Option<Price>,
}

/// Every configured provider, by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvidersConfig {
    pub providers: BTreeMap<String, ProviderConfig>,
}

impl ProvidersConfig {
    /// The `[providers.*]` of a `surety.toml`, validated; its other
    /// sections are not read here (`surety_config::SuretyFile` reads the
    /// whole file, strictly).
    pub fn from_toml(text: &str) -> Result<ProvidersConfig, ConfigError> {
        let mut file: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::at("", e.to_string().trim_end()))?;
        let raw = match file.remove("providers") {
            None => BTreeMap::new(),
            Some(table) => table.try_into().map_err(|e: toml::de::Error| {
                ConfigError::at("providers", e.to_string().trim_end())
            })?,
        };
        Ok(ProvidersConfig {
            providers: validate_providers(raw)?,
        })
    }
}

impl ProviderConfig {
    /// Validates `[providers.<id>]`.
    pub fn validate(id: &str, raw: RawProviderConfig) -> Result<ProviderConfig, ConfigError> {
        let path = |field: &str| format!("providers.{id}.{field}");
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::at(
                format!("providers.{id}"),
                "a provider id is letters, digits, `-` and `_`",
            ));
        }
        let base_url = raw.base_url.trim_end_matches('/').to_owned();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(ConfigError::at(
                path("base_url"),
                "must start with http:// or https://",
            ));
        }
        if base_url.contains('@') || base_url.contains('?') {
            return Err(ConfigError::at(
                path("base_url"),
                "must not carry credentials or a query; put the key's variable name in api_key_env",
            ));
        }
        if raw.model.trim().is_empty() {
            return Err(ConfigError::at(path("model"), "must not be empty"));
        }
        if let Some(var) = &raw.api_key_env
            && (var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            return Err(ConfigError::at(
                path("api_key_env"),
                "must be the name of an environment variable",
            ));
        }
        let kind = spec(raw.kind);
        let (allowed, default_modes) = (kind.structured_modes, kind.default_modes);
        let structured_output = raw
            .structured_output
            .unwrap_or_else(|| default_modes.to_vec());
        if structured_output.is_empty() {
            return Err(ConfigError::at(
                path("structured_output"),
                "must list at least one mode",
            ));
        }
        if let Some(mode) = structured_output.iter().find(|m| !allowed.contains(m)) {
            let names: Vec<_> = allowed.iter().map(|m| m.as_str()).collect();
            return Err(ConfigError::at(
                path("structured_output"),
                format!(
                    "`{}` is not a mode of this kind of provider; it has {}",
                    mode.as_str(),
                    names.join(", ")
                ),
            ));
        }
        let capability = |field: &str, support: Support, asked: Option<bool>| {
            support.resolve(asked).map_err(|why| {
                ConfigError::at(
                    path(field),
                    format!(
                        "{why}: a `{}` provider cannot declare `{field} = true`",
                        kind.name
                    ),
                )
            })
        };
        let tokenize_endpoint = capability(
            "tokenize_endpoint",
            kind.tokenize_endpoint,
            raw.tokenize_endpoint,
        )?;
        let models_endpoint =
            capability("models_endpoint", kind.models_endpoint, raw.models_endpoint)?;
        let seed = capability("seed", kind.seed, raw.seed)?;
        let tool_calls = capability("tool_calls", kind.tool_calls, raw.tool_calls)?;
        let store = capability("store", kind.store, raw.store)?;
        let background = capability("background", kind.background, raw.background)?;
        if background && !store {
            return Err(ConfigError::at(
                path("background"),
                "a background call is kept at the provider to be polled: it needs `store = true`",
            ));
        }
        let tokenizer = match raw.tokenizer.as_deref() {
            None | Some("none") => TokenizerConfig::None,
            Some("server") if tokenize_endpoint => TokenizerConfig::Server,
            Some("server") => {
                return Err(ConfigError::at(
                    path("tokenizer"),
                    "`server` needs `tokenize_endpoint = true`",
                ));
            }
            Some(other) => match other.strip_prefix("tiktoken:") {
                Some(encoding) if !encoding.is_empty() => {
                    TokenizerConfig::Tiktoken(encoding.to_owned())
                }
                _ => {
                    return Err(ConfigError::at(
                        path("tokenizer"),
                        format!("`{other}` is not `none`, `server` or `tiktoken:<encoding>`"),
                    ));
                }
            },
        };
        if raw.context_window == 0 {
            return Err(ConfigError::at(
                path("context_window"),
                "must be at least 1 token",
            ));
        }
        let millis = |field: &str, value: Option<u64>, default: u64| match value.unwrap_or(default)
        {
            0 => Err(ConfigError::at(path(field), "must be at least 1 ms")),
            ms => Ok(Duration::from_millis(ms)),
        };
        let idempotency_header = match raw.idempotency_header {
            Some(header) if header.is_empty() => None,
            Some(header)
                if !header
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-') =>
            {
                return Err(ConfigError::at(
                    path("idempotency_header"),
                    "must be an HTTP header name",
                ));
            }
            Some(header) => Some(header),
            None => kind.idempotency_header.map(str::to_owned),
        };
        Ok(ProviderConfig {
            id: id.to_owned(),
            kind: raw.kind,
            base_url,
            model: raw.model,
            api_key_env: raw.api_key_env,
            capabilities: Capabilities {
                structured_output,
                tokenize_endpoint,
                models_endpoint,
                seed,
                idempotency_header,
                tool_calls,
                store,
                background,
            },
            tokenizer,
            context_window: raw.context_window,
            served_models: match raw.served_models {
                Some(ids) if ids.iter().any(|m| m.trim().is_empty()) => {
                    return Err(ConfigError::at(
                        path("served_models"),
                        "a model id must not be empty",
                    ));
                }
                ids => ids.unwrap_or_default(),
            },
            max_response_bytes: match raw.max_response_bytes {
                None => crate::http::DEFAULT_MAX_BODY,
                Some(n) if n >= 1024 => n,
                Some(_) => {
                    return Err(ConfigError::at(
                        path("max_response_bytes"),
                        "must be at least 1024 bytes",
                    ));
                }
            },
            connect_timeout: millis("timeouts.connect_ms", raw.timeouts.connect_ms, 5_000)?,
            request_timeout: millis("timeouts.request_ms", raw.timeouts.request_ms, 120_000)?,
            poll_interval: millis("timeouts.poll_ms", raw.timeouts.poll_ms, 500)?,
            price: raw
                .price
                .map(|price| Price::from_raw(price, &path))
                .transpose()?,
        })
    }

    /// The structured-output mode JSON is asked for with: the first declared.
    pub fn structured_mode(&self) -> StructuredMode {
        self.capabilities
            .structured_output
            .first()
            .copied()
            .unwrap_or(StructuredMode::PromptOnly)
    }

    /// Whether an answer naming model `id` comes from the configured model:
    /// the same id; a dated or versioned snapshot of it (`gpt-4o-mini` →
    /// `gpt-4o-mini-2024-07-18`, `claude-haiku-4-5` →
    /// `claude-haiku-4-5-20251001`: the configured id, `-` or `@`, then a
    /// digit); or an id the provider declares in `served_models`.
    pub fn serves(&self, id: &str) -> bool {
        let snapshot = id
            .strip_prefix(self.model.as_str())
            .and_then(|rest| rest.strip_prefix(['-', '@']))
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
        id == self.model || snapshot || self.served_models.iter().any(|m| m == id)
    }

    /// Everything in this configuration that changes what the provider
    /// answers, as a JSON object of words: kind, base URL, model, the
    /// structured-output mode JSON is asked with, tokenizer, context window
    /// and whether a seed is sent. Never a secret, never a timeout. A
    /// certificate is bound to its canonical hash; the router compares it
    /// field by field to say what changed.
    pub fn behaviour(&self) -> serde_json::Value {
        let mut behaviour = serde_json::json!({
            "kind": self.kind.to_string(),
            "base_url": self.base_url,
            "model": self.model,
            "structured_mode": self.structured_mode().as_str(),
            "tokenizer": self.tokenizer.to_string(),
            "context_window": self.context_window,
            "seed": self.capabilities.seed,
        });
        // Storing every answer (with its attempt's metadata) is part of
        // the certified request where it is on; a certificate made before
        // it was named keeps its hash.
        if self.capabilities.store {
            behaviour["store"] = serde_json::Value::Bool(true);
        }
        if self.capabilities.background {
            behaviour["background"] = serde_json::Value::Bool(true);
        }
        behaviour
    }

    /// How this provider's unknown attempts can be resolved by asking it:
    /// its kind's way, where the configuration allows it (stored
    /// completions need `store = true`).
    pub fn reconciliation(&self) -> crate::kinds::Reconciliation {
        use crate::kinds::Reconciliation;
        match spec(self.kind).reconciliation {
            Reconciliation::StoredCompletions | Reconciliation::Responses
                if !self.capabilities.store =>
            {
                Reconciliation::None
            }
            way => way,
        }
    }

    /// Reads the API key through `lookup` (the environment, in
    /// [`build_provider`]), if the provider names one.
    pub fn api_key(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Secret>, ConfigError> {
        let Some(var) = &self.api_key_env else {
            return Ok(None);
        };
        match lookup(var) {
            Some(value) if !value.is_empty() => Ok(Some(Secret::new(value))),
            _ => Err(ConfigError::at(
                format!("providers.{}.api_key_env", self.id),
                format!(
                    "the environment variable {var} is not set; it must hold the API key of provider `{}`",
                    self.id
                ),
            )),
        }
    }
}

/// Builds the adapter for a provider, reading its key from the environment.
pub fn build_provider(config: &ProviderConfig) -> Result<Arc<dyn Provider>, ConfigError> {
    build_provider_with(config, &|var| std::env::var(var).ok())
}

/// Builds the adapter for a provider, reading its key through `lookup`.
pub fn build_provider_with(
    config: &ProviderConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Provider>, ConfigError> {
    let key = config.api_key(lookup)?;
    (spec(config.kind).build)(config.clone(), key)
}

fn serialize_capabilities<S: serde::Serializer>(
    caps: &Capabilities,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Shown<'a> {
        structured_output: &'a [StructuredMode],
        tokenize_endpoint: bool,
        models_endpoint: bool,
        seed: bool,
        idempotency_header: Option<&'a str>,
        tool_calls: bool,
        store: bool,
        background: bool,
    }
    Shown {
        structured_output: &caps.structured_output,
        tokenize_endpoint: caps.tokenize_endpoint,
        models_endpoint: caps.models_endpoint,
        seed: caps.seed,
        idempotency_header: caps.idempotency_header.as_deref(),
        tool_calls: caps.tool_calls,
        store: caps.store,
        background: caps.background,
    }
    .serialize(s)
}

impl fmt::Display for TokenizerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizerConfig::Tiktoken(encoding) => write!(f, "tiktoken:{encoding}"),
            TokenizerConfig::Server => f.write_str("server"),
            TokenizerConfig::None => f.write_str("none"),
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(spec(*self).name)
    }
}

/// Validates every `[providers.<id>]`.
pub fn validate_providers(
    raw: BTreeMap<String, RawProviderConfig>,
) -> Result<BTreeMap<String, ProviderConfig>, ConfigError> {
    raw.into_iter()
        .map(|(id, p)| Ok((id.clone(), ProviderConfig::validate(&id, p)?)))
        .collect()
}
