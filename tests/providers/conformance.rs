//! Conformance with OpenAI's published wire format: the requests the adapter
//! builds and the responses the fake returns validate against
//! `CreateChatCompletionRequest` and `CreateChatCompletionResponse`,
//! extracted into `tests/data/openai/` by `cargo xtask openapi-extract`.

use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Script};
use surety_providers::{ChatRequest, Message, OutputFormat};

use crate::support::{call, json_request, provider_for};

const SCHEMAS: &str = include_str!("../data/openai/chat-completions.schema.json");

/// Every error `instance` has against the named definition, with its JSON pointer.
fn violations(definition: &str, instance: &Value) -> Vec<String> {
    let mut schema: Value = serde_json::from_str(SCHEMAS).unwrap();
    schema["$ref"] = json!(format!("#/$defs/{definition}"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    validator
        .iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

#[test]
fn the_extracted_schemas_can_fail() {
    assert!(
        !violations("CreateChatCompletionRequest", &json!({"model": "m"})).is_empty(),
        "messages are required"
    );
    assert!(
        !violations(
            "CreateChatCompletionRequest",
            &json!({"model": "m", "messages": []})
        )
        .is_empty()
    );
    assert!(
        !violations(
            "CreateChatCompletionResponse",
            &json!({"id": "x", "object": "chat.completion"})
        )
        .is_empty()
    );
}

fn text_request() -> ChatRequest {
    ChatRequest {
        messages: vec![Message::system("Be brief."), Message::user("Say hi.")],
        temperature: 0.2,
        max_tokens: 16,
        seed: None,
        output: OutputFormat::Text,
    }
}

#[tokio::test]
async fn every_request_the_openai_adapter_sends_conforms() {
    let reply = r#"{"category": "billing", "urgent": false}"#;
    let fake = FakeProvider::start(Script::always(Behavior::Reply(reply.into())))
        .await
        .unwrap();
    for modes in [
        "json_schema",
        "json_object_schema",
        "json_object",
        "prompt_only",
    ] {
        let provider = provider_for(
            &fake,
            "openai",
            &format!("structured_output = [\"{modes}\"]"),
        );
        provider.chat(&json_request(), &call(1)).await.unwrap();
        provider.chat(&text_request(), &call(2)).await.unwrap();
    }
    let sent = fake.requests();
    assert_eq!(sent.len(), 8);
    for request in &sent {
        assert_eq!(
            violations("CreateChatCompletionRequest", &request.body),
            Vec::<String>::new(),
            "{}",
            request.body
        );
    }
    let formats: Vec<_> = sent
        .iter()
        .map(|r| r.body["response_format"]["type"].clone())
        .collect();
    assert!(formats.contains(&json!("json_schema")) && formats.contains(&json!("json_object")));
}

#[tokio::test]
async fn every_openai_response_the_fake_returns_conforms() {
    let fake = FakeProvider::start(Script::always(Behavior::Cycle(vec![
        r#"{"category": "billing", "urgent": false}"#.into(),
        "plain prose".into(),
        String::new(),
    ])))
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for i in 0..3 {
        let body = json!({"model": "fake-model", "messages": [{"role": "user", "content": format!("call {i}")}]});
        let response: Value = client
            .post(format!("{}/chat/completions", fake.openai_base_url()))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            violations("CreateChatCompletionResponse", &response),
            Vec::<String>::new(),
            "{response}"
        );
    }
}
