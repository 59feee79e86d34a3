//! The registry of provider kinds: one place that says, per kind, its wire
//! format, its structured-output modes (allowed, and the default), which
//! capabilities it has and their defaults, and how its adapter is built.
//! Configuration validates against it; tests are generated from it.
//!
//! To add a kind: a `ProviderKind` variant, an adapter module, a
//! [`KindSpec`] here (the compiler then asks for it in [`spec`] and in the
//! tests' table of kinds), and the fake provider's wire format.

use std::sync::Arc;

use serde::Serialize;

use crate::config::{ConfigError, ProviderConfig, ProviderKind};
use crate::secret::Secret;
use crate::{Finish, Provider, StructuredMode, anthropic, gemini, openai, responses};

/// Whether a kind has a capability, and if so, whether it is on unless the
/// configuration says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// The kind has no such thing; configuring it on is refused.
    No,
    /// The kind may have it; `default` is what an unset field means.
    Yes { default: bool },
}

impl Support {
    /// The value a configuration ends with, or why it cannot have it.
    pub fn resolve(self, asked: Option<bool>) -> Result<bool, &'static str> {
        match (self, asked) {
            (Support::No, Some(true)) => Err("this kind of provider has no such capability"),
            (Support::No, _) => Ok(false),
            (Support::Yes { default }, asked) => Ok(asked.unwrap_or(default)),
        }
    }
}

/// How a kind's provider can be asked, after an attempt went unknown,
/// whether it did the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reconciliation {
    /// OpenAI's stored chat completions (`store: true`): read back by the
    /// id the answer began with (`GET /chat/completions/{id}`), else found
    /// by the attempt's metadata (`GET /chat/completions?metadata[…]`). Only
    /// where the provider's configuration opts in to `store`.
    StoredCompletions,
    /// OpenAI's stored responses (`store = true`): read back by the id the
    /// create call answered with (`GET /responses/{id}`); there is no list,
    /// so a response whose id was never read cannot be found. A background
    /// one still running is polled on, and can be cancelled there.
    Responses,
    /// It cannot be asked: an unknown attempt waits for a late answer or
    /// an operator.
    None,
}

impl Reconciliation {
    /// Its name, as `/v1/providers` and the pages say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reconciliation::StoredCompletions => "stored-completions",
            Reconciliation::Responses => "responses",
            Reconciliation::None => "none",
        }
    }
}

/// Builds a kind's adapter from a validated configuration and its key.
pub type Build = fn(ProviderConfig, Option<Secret>) -> Result<Arc<dyn Provider>, ConfigError>;

/// One kind of provider.
#[derive(Debug)]
pub struct KindSpec {
    pub kind: ProviderKind,
    /// Its name in `surety.toml` (`kind = "..."`).
    pub name: &'static str,
    /// The API it speaks.
    pub wire_format: &'static str,
    /// The structured-output modes it can be configured with.
    pub structured_modes: &'static [StructuredMode],
    /// What an unset `structured_output` means.
    pub default_modes: &'static [StructuredMode],
    /// The request's `seed` is honoured.
    pub seed: Support,
    /// A tokenize endpoint.
    pub tokenize_endpoint: Support,
    /// A model listing.
    pub models_endpoint: Support,
    /// The header that carries a provider-side idempotency key by default.
    pub idempotency_header: Option<&'static str>,
    /// Tools offered and called (a tool-call contract), each kind in its
    /// own words: OpenAI `tools`/`tool_choice` → `message.tool_calls`;
    /// Anthropic `tools`/`tool_choice` → `tool_use` blocks; Gemini
    /// `functionDeclarations`/`toolConfig` → `functionCall` parts.
    pub tool_calls: Support,
    /// Whether the provider keeps its answers for surety to ask for later
    /// (`store = true`: OpenAI's stored chat completions, which may be
    /// read back by id or found by their metadata). Storage has privacy
    /// consequences: it is off unless the configuration opts in.
    pub store: Support,
    /// Whether each call can run in the background at the provider and be
    /// polled (`background = true`, which needs `store`).
    pub background: Support,
    /// How an unknown attempt can be resolved by asking the provider
    /// whether it did the work, where the kind can tell at all.
    pub reconciliation: Reconciliation,
    /// Where the answer says why it ended (`finish_reason`, ...).
    pub finish_field: &'static str,
    /// Every finish reason the kind documents, and what it means; any
    /// other is [`Finish::Unknown`] and never taken for an answer.
    pub finish_reasons: &'static [(&'static str, Finish)],
    pub build: Build,
}

pub static OPENAI: KindSpec = KindSpec {
    kind: ProviderKind::Openai,
    name: "openai",
    wire_format: "OpenAI chat completions (POST {base_url}/chat/completions)",
    structured_modes: &[
        StructuredMode::JsonSchema,
        StructuredMode::JsonObjectSchema,
        StructuredMode::JsonObject,
        StructuredMode::PromptOnly,
    ],
    default_modes: &[StructuredMode::JsonSchema],
    seed: Support::Yes { default: true },
    tokenize_endpoint: Support::Yes { default: false },
    models_endpoint: Support::Yes { default: true },
    idempotency_header: Some("Idempotency-Key"),
    tool_calls: Support::Yes { default: true },
    store: Support::Yes { default: false },
    background: Support::No,
    reconciliation: Reconciliation::StoredCompletions,
    finish_field: "finish_reason",
    finish_reasons: &[
        ("stop", Finish::Complete),
        // The model called a tool of a tool-call request (a named
        // `tool_choice` ends with `stop`).
        ("tool_calls", Finish::Complete),
        ("length", Finish::Truncated),
        // Azure OpenAI's content filters (and OpenAI's own moderation).
        ("content_filter", Finish::Refused),
        // Hugging Face TGI's OpenAI-compatible server.
        ("eos_token", Finish::Complete),
        ("stop_sequence", Finish::Complete),
        // `function_call` (the deprecated functions API) is not listed:
        // surety offers `tools`, so an answer in the old form is unknown.
    ],
    build: |config, key| Ok(Arc::new(openai::OpenAiProvider::new(config, key)?)),
};

pub static ANTHROPIC: KindSpec = KindSpec {
    kind: ProviderKind::Anthropic,
    name: "anthropic",
    wire_format: "Anthropic Messages (POST {base_url}/v1/messages)",
    structured_modes: &[
        StructuredMode::Tool,
        StructuredMode::Prefill,
        StructuredMode::PromptOnly,
    ],
    default_modes: &[StructuredMode::Tool],
    seed: Support::No,
    tokenize_endpoint: Support::No,
    models_endpoint: Support::No,
    idempotency_header: None,
    tool_calls: Support::Yes { default: true },
    store: Support::No,
    background: Support::No,
    // Anthropic keeps no message to read back: an unknown stays unknown.
    reconciliation: Reconciliation::None,
    finish_field: "stop_reason",
    finish_reasons: &[
        ("end_turn", Finish::Complete),
        ("stop_sequence", Finish::Complete),
        // The forced tool of `tool` mode was called (its input is the
        // answer), or a tool of a tool-call request.
        ("tool_use", Finish::Complete),
        ("max_tokens", Finish::Truncated),
        ("model_context_window_exceeded", Finish::Truncated),
        ("refusal", Finish::Refused),
        // `pause_turn` (a long turn paused for the client to resume) is not
        // listed: it is not an answer.
    ],
    build: |config, key| Ok(Arc::new(anthropic::AnthropicProvider::new(config, key)?)),
};

pub static GEMINI: KindSpec = KindSpec {
    kind: ProviderKind::Gemini,
    name: "gemini",
    wire_format: "Gemini generateContent (POST {base_url}/models/{model}:generateContent)",
    structured_modes: &[
        StructuredMode::ResponseJsonSchema,
        StructuredMode::ResponseSchema,
        StructuredMode::PromptOnly,
    ],
    default_modes: &[StructuredMode::ResponseJsonSchema],
    seed: Support::Yes { default: true },
    // countTokens counts; it does not give the tokens back, so the
    // tokenizer's round trip cannot run on it.
    tokenize_endpoint: Support::No,
    models_endpoint: Support::No,
    idempotency_header: None,
    tool_calls: Support::Yes { default: true },
    store: Support::No,
    background: Support::No,
    // generateContent keeps nothing to read back: an unknown stays unknown.
    reconciliation: Reconciliation::None,
    finish_field: "finishReason",
    finish_reasons: &[
        ("STOP", Finish::Complete),
        ("MAX_TOKENS", Finish::Truncated),
        ("SAFETY", Finish::Refused),
        ("RECITATION", Finish::Refused),
        ("LANGUAGE", Finish::Refused),
        ("BLOCKLIST", Finish::Refused),
        ("PROHIBITED_CONTENT", Finish::Refused),
        ("SPII", Finish::Refused),
        ("IMAGE_SAFETY", Finish::Refused),
        // OTHER, MALFORMED_FUNCTION_CALL, UNEXPECTED_TOOL_CALL,
        // FINISH_REASON_UNSPECIFIED and any newer reason are unknown.
    ],
    build: |config, key| Ok(Arc::new(gemini::GeminiProvider::new(config, key)?)),
};

impl KindSpec {
    /// Reads an answer's finish reason against this kind's table: the
    /// answer is complete or truncated (for the adapter to judge against
    /// what it asked), or it is not an answer at all (a refusal naming the
    /// reason in the provider's `words`, or a reason not in the table).
    pub fn finish(
        &self,
        provider: &str,
        reason: Option<&str>,
        words: Option<&str>,
    ) -> Result<Finish, crate::ProviderError> {
        let finish = Finish::of(self.finish_reasons, reason);
        match crate::ProviderError::from_finish(provider, self.finish_field, finish, reason, words)
        {
            Some(error) => Err(error),
            None => Ok(finish),
        }
    }
}

pub static OPENAI_RESPONSES: KindSpec = KindSpec {
    kind: ProviderKind::OpenaiResponses,
    name: "openai-responses",
    wire_format: "OpenAI Responses (POST {base_url}/responses)",
    structured_modes: &[
        StructuredMode::JsonSchema,
        StructuredMode::JsonObject,
        StructuredMode::PromptOnly,
    ],
    default_modes: &[StructuredMode::JsonSchema],
    // The Responses API takes no seed.
    seed: Support::No,
    tokenize_endpoint: Support::No,
    models_endpoint: Support::Yes { default: true },
    idempotency_header: Some("Idempotency-Key"),
    tool_calls: Support::Yes { default: true },
    store: Support::Yes { default: false },
    background: Support::Yes { default: false },
    reconciliation: Reconciliation::Responses,
    // `status`, and an incomplete response's `incomplete_details.reason`.
    finish_field: "status",
    finish_reasons: &[
        ("completed", Finish::Complete),
        ("max_output_tokens", Finish::Truncated),
        ("content_filter", Finish::Refused),
    ],
    build: |config, key| Ok(Arc::new(responses::ResponsesProvider::new(config, key)?)),
};

/// Every kind, in the order they are documented.
pub static KINDS: [&KindSpec; 4] = [&OPENAI, &ANTHROPIC, &GEMINI, &OPENAI_RESPONSES];

/// The spec of `kind`: a new kind without one does not compile.
pub fn spec(kind: ProviderKind) -> &'static KindSpec {
    match kind {
        ProviderKind::Openai => &OPENAI,
        ProviderKind::Anthropic => &ANTHROPIC,
        ProviderKind::Gemini => &GEMINI,
        ProviderKind::OpenaiResponses => &OPENAI_RESPONSES,
    }
}

impl StructuredMode {
    /// The JSON Schema keywords this mode is known to ignore while
    /// constraining the output; `["*"]` when the schema does not reach the
    /// model at all. The answer is validated afterwards anyway.
    pub fn dropped_keywords(self) -> &'static [&'static str] {
        match self {
            // llama.cpp's JSON-Schema-to-grammar conversion.
            StructuredMode::JsonObjectSchema => &[
                "uniqueItems",
                "not",
                "if",
                "then",
                "else",
                "contains",
                "minimum",
                "maximum",
                "exclusiveMinimum",
                "exclusiveMaximum",
                "multipleOf",
                "format",
                "dependentSchemas",
            ],
            // OpenAI strict mode rejects or ignores these.
            StructuredMode::JsonSchema => &[
                "format",
                "minLength",
                "maxLength",
                "minItems",
                "maxItems",
                "uniqueItems",
                "not",
                "if",
                "then",
                "else",
                "contains",
            ],
            // The schema does not reach the model at all.
            StructuredMode::JsonObject | StructuredMode::Prefill | StructuredMode::PromptOnly => {
                &["*"]
            }
            StructuredMode::Tool => &["format", "uniqueItems", "not", "if", "then", "else"],
            // Gemini's JSON Schema support leaves these out of its decoding.
            StructuredMode::ResponseJsonSchema => &[
                "not",
                "if",
                "then",
                "else",
                "uniqueItems",
                "contains",
                "multipleOf",
                "patternProperties",
                "dependentSchemas",
            ],
            // Google's OpenAPI subset: what it does not know is left out.
            StructuredMode::ResponseSchema => &[
                "$schema",
                "additionalProperties",
                "const",
                "not",
                "if",
                "then",
                "else",
                "allOf",
                "oneOf",
                "uniqueItems",
                "contains",
                "exclusiveMinimum",
                "exclusiveMaximum",
                "multipleOf",
                "patternProperties",
                "dependentSchemas",
            ],
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    /// Every variant's place: a new kind does not compile until it is
    /// counted here, and the test below fails until `KINDS` lists it.
    fn ordinal(kind: ProviderKind) -> usize {
        match kind {
            ProviderKind::Openai => 0,
            ProviderKind::Anthropic => 1,
            ProviderKind::Gemini => 2,
            ProviderKind::OpenaiResponses => 3,
        }
    }
    const VARIANTS: usize = 4;

    #[test]
    fn the_registry_lists_every_kind_once() {
        let mut seen = [false; VARIANTS];
        for spec in KINDS {
            seen[ordinal(spec.kind)] = true;
        }
        assert_eq!(KINDS.len(), VARIANTS);
        assert!(seen.iter().all(|s| *s), "a kind is missing from KINDS");
    }

    #[test]
    fn every_kind_has_one_spec_and_its_defaults_are_allowed() {
        for (i, spec) in KINDS.iter().enumerate() {
            assert!(std::ptr::eq(super::spec(spec.kind), *spec), "{}", spec.name);
            let named: ProviderKind = serde_json::from_value(serde_json::json!(spec.name)).unwrap();
            assert_eq!(
                named, spec.kind,
                "`kind = \"{}\"` names this kind",
                spec.name
            );
            assert!(
                KINDS[i + 1..].iter().all(|other| other.kind != spec.kind),
                "{} is listed twice",
                spec.name
            );
            assert!(
                spec.default_modes
                    .iter()
                    .all(|m| spec.structured_modes.contains(m)),
                "{}",
                spec.name
            );
        }
    }
}
