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

/// A JSON request and a text request to `fake`, through a provider of
/// `kind` declaring each of `modes` in turn.
async fn ask_in_every_mode(fake: &FakeProvider, kind: &str, modes: &[&str]) {
    for mode in modes {
        let provider = provider_for(fake, kind, &format!("structured_output = [\"{mode}\"]"));
        provider.chat(&json_request(), &call(1)).await.unwrap();
        provider.chat(&text_request(), &call(2)).await.unwrap();
    }
}

#[tokio::test]
async fn every_request_the_openai_adapter_sends_conforms() {
    let reply = r#"{"category": "billing", "urgent": false}"#;
    let fake = FakeProvider::replying(reply).await.unwrap();
    let modes = [
        "json_schema",
        "json_object_schema",
        "json_object",
        "prompt_only",
    ];
    ask_in_every_mode(&fake, "openai", &modes).await;
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

/// Runs google-genai's types (tests/data/gemini/validate.py, in the suite's
/// venv) over `requests` and `responses`; `None` when the venv is absent
/// outside CI.
async fn genai_errors(requests: &[Value], responses: &[Value]) -> Option<(String, Vec<String>)> {
    let python = surety_tests::require("SURETY_OPENAI_SDK_PYTHON", "google-genai")?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/gemini/validate.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let input = json!({"requests": requests, "responses": responses}).to_string();
    use tokio::io::AsyncWriteExt;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .await
        .unwrap();
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let verdict: Value = serde_json::from_slice(&output.stdout).unwrap();
    let errors = verdict["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_owned())
        .collect();
    Some((verdict["sdk"].as_str().unwrap().to_owned(), errors))
}

#[tokio::test]
async fn gemini_requests_and_the_fakes_responses_fit_googles_types() {
    let reply = r#"{"category": "billing", "urgent": false}"#;
    let fake = FakeProvider::start(Script::always(Behavior::Reply(reply.into())).rule(
        surety_fake_provider::When::PromptContains("refuse".into()),
        Behavior::Refuse("Blocked for safety.".into()),
    ))
    .await
    .unwrap();
    let modes = ["response_json_schema", "response_schema", "prompt_only"];
    ask_in_every_mode(&fake, "gemini", &modes).await;
    let requests: Vec<Value> = fake.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(requests.len(), 6);
    // The fake's answers: a reply, and a refusal.
    let client = reqwest::Client::new();
    let mut responses = Vec::new();
    for text in ["say hi", "please refuse"] {
        let body = json!({"contents": [{"role": "user", "parts": [{"text": text}]}]});
        let response: Value = client
            .post(format!(
                "{}/models/fake-model:generateContent",
                fake.gemini_base_url()
            ))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        responses.push(response);
    }
    let Some((sdk, errors)) = genai_errors(&requests, &responses).await else {
        return;
    };
    assert_eq!(errors, Vec::<String>::new(), "google-genai {sdk}");
    eprintln!("validated against google-genai {sdk}");
    // The validation can fail: an invented field is rejected.
    let mut invented = requests[0].clone();
    invented["generationConfig"]["temperatureBoost"] = json!(2);
    let mut answer = responses[0].clone();
    answer["candidates"][0]["confidence"] = json!(0.9);
    let (_, errors) = genai_errors(&[invented], &[answer]).await.unwrap();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].contains("temperatureBoost"), "{errors:?}");
    assert!(errors[1].contains("confidence"), "{errors:?}");
}

/// Every kind says what its wire JSON is checked against, or why nothing:
/// never an omission.
#[test]
fn every_kind_names_its_conformance_check() {
    use crate::support::{Conformance, kinds, row, spec};
    let checks: Vec<(&str, Conformance)> = kinds()
        .map(|kind| (kind, row(spec(kind).kind).conformance))
        .collect();
    assert!(checks.iter().all(|(_, c)| match c {
        Conformance::Unchecked(why) => why.len() > 20,
        _ => true,
    }));
    assert_eq!(
        checks
            .iter()
            .filter(|(_, c)| !matches!(c, Conformance::Unchecked(_)))
            .count(),
        2,
        "{checks:?}"
    );
}
