//! Building providers against a running fake.

use std::sync::Arc;

use serde_json::{Value, json};
use surety_fake_provider::FakeProvider;
use surety_providers::kinds::{KINDS, KindSpec};
use surety_providers::{
    CallContext, ChatRequest, Message, OutputFormat, Provider, ProviderKind, ProvidersConfig,
    build_provider,
};

/// What the provider suites need to know of a kind beyond the registry:
/// one row per kind, written as an exhaustive match, so a kind without a
/// row does not compile, and the suites iterate the registry, so a row
/// without a kind is never run.
pub struct Row {
    /// Where the fake serves this kind's wire format.
    pub base_url: fn(&FakeProvider) -> String,
    /// TOML that makes the provider ask for JSON without constraining it,
    /// so that prose can come back.
    pub unconstrained: &'static str,
    /// Where a request's seed is on the wire.
    pub seed_at: &'static str,
    /// What its requests and the fake's responses are checked against.
    pub conformance: Conformance,
}

/// The published definition a kind's wire JSON is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conformance {
    /// OpenAI's OpenAPI document (`conformance::every_request_the_openai_adapter_sends_conforms`).
    OpenAiDocument,
    /// google-genai's pydantic types (`conformance::gemini_requests_and_the_fakes_responses_fit_googles_types`).
    GoogleGenai,
    /// The `anthropic` SDK's types, closed to unknown fields
    /// (`conformance::anthropic_requests_and_the_fakes_responses_fit_the_sdks_types`).
    AnthropicSdk,
    /// The `openai` SDK's Responses types, closed to unknown fields
    /// (`conformance::responses_requests_and_the_fakes_responses_fit_the_sdks_types`).
    OpenAiResponsesSdk,
}

pub fn row(kind: ProviderKind) -> Row {
    match kind {
        ProviderKind::Openai => Row {
            base_url: FakeProvider::openai_base_url,
            unconstrained: "structured_output = [\"json_object\"]",
            seed_at: "/seed",
            conformance: Conformance::OpenAiDocument,
        },
        ProviderKind::Anthropic => Row {
            base_url: FakeProvider::anthropic_base_url,
            unconstrained: "structured_output = [\"prefill\"]",
            // Anthropic takes no seed: a seeded request is refused before sending.
            seed_at: "",
            conformance: Conformance::AnthropicSdk,
        },
        ProviderKind::Gemini => Row {
            base_url: FakeProvider::gemini_base_url,
            unconstrained: "structured_output = [\"prompt_only\"]",
            seed_at: "/generationConfig/seed",
            conformance: Conformance::GoogleGenai,
        },
        ProviderKind::OpenaiResponses => Row {
            base_url: FakeProvider::openai_base_url,
            unconstrained: "structured_output = [\"json_object\"]",
            // The Responses API takes no seed: refused before sending.
            seed_at: "",
            conformance: Conformance::OpenAiResponsesSdk,
        },
    }
}

/// Every kind of the registry, by name.
pub fn kinds() -> impl Iterator<Item = &'static str> {
    KINDS.iter().map(|k| k.name)
}

/// The registry's spec of the kind named `kind`; an unknown name fails the test.
pub fn spec(kind: &str) -> &'static KindSpec {
    KINDS
        .iter()
        .find(|k| k.name == kind)
        .unwrap_or_else(|| panic!("no provider kind `{kind}` in the registry"))
}

/// One provider of `kind` pointed at `fake`, with extra TOML lines.
pub fn provider_for(fake: &FakeProvider, kind: &str, extra: &str) -> Arc<dyn Provider> {
    let base_url = (row(spec(kind).kind).base_url)(fake);
    provider_at(&base_url, kind, extra)
}

pub fn provider_at(base_url: &str, kind: &str, extra: &str) -> Arc<dyn Provider> {
    let toml = format!(
        "[providers.fake]\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"fake-model\"\ncontext_window = 8192\n{extra}\n"
    );
    let config = ProvidersConfig::from_toml(&toml).unwrap();
    build_provider(&config.providers["fake"]).unwrap()
}

pub fn ticket_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "category": {"type": "string", "enum": ["billing", "bug", "account"]},
            "urgent": {"type": "boolean"}
        },
        "required": ["category", "urgent"],
        "additionalProperties": false
    })
}

pub fn json_request() -> ChatRequest {
    ChatRequest {
        messages: vec![
            Message::system("Classify the support ticket. Answer with JSON only."),
            Message::user("I was charged twice for my subscription this month."),
        ],
        temperature: 0.0,
        max_tokens: 64,
        seed: None,
        output: OutputFormat::Json {
            name: "ticket".into(),
            schema: ticket_schema(),
        },
        cache: Default::default(),
        anthropic_beta: None,
    }
}

pub fn call(n: u32) -> CallContext {
    CallContext::for_attempt("0190f1d2-aaaa-7bbb-8ccc-000000000001", i64::from(n))
}
