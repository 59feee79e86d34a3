//! Building providers against a running fake.

use std::sync::Arc;

use serde_json::{Value, json};
use surety_fake_provider::FakeProvider;
use surety_providers::{
    CallContext, ChatRequest, Message, OutputFormat, Provider, ProvidersConfig, build_provider,
};

/// One provider of `kind` pointed at `fake`, with extra TOML lines.
pub fn provider_for(fake: &FakeProvider, kind: &str, extra: &str) -> Arc<dyn Provider> {
    let base_url = match kind {
        "anthropic" => fake.anthropic_base_url(),
        _ => fake.openai_base_url(),
    };
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
    }
}

pub fn call(n: u32) -> CallContext {
    CallContext::for_attempt("0190f1d2-aaaa-7bbb-8ccc-000000000001", i64::from(n))
}
