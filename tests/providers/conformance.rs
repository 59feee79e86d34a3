//! Conformance with OpenAI's published wire format: the requests the adapter
//! builds and the responses the fake returns validate against
//! `CreateChatCompletionRequest` and `CreateChatCompletionResponse`,
//! extracted into `tests/data/openai/` by `cargo xtask openapi-extract`.

use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Script};
use surety_providers::{ChatRequest, Message, OutputFormat, ToolPick, ToolRequest, ToolSpec};

use crate::support::{call, json_request, provider_for};

const SCHEMAS: &str = include_str!("../data/openai/chat-completions.schema.json");

/// Every error `instance` has against the named definition, with its JSON pointer.
fn violations(definition: &str, instance: &Value) -> Vec<String> {
    violations_of(serde_json::from_str(SCHEMAS).unwrap(), definition, instance)
}

/// Every error `instance` has against `schema`'s definition `definition`.
fn violations_of(mut schema: Value, definition: &str, instance: &Value) -> Vec<String> {
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
        cache: Default::default(),
        anthropic_beta: None,
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
    for i in 0..3 {
        let body = json!({"model": "fake-model", "messages": [{"role": "user", "content": format!("call {i}")}]});
        let response: Value = answer_of(
            format!("{}/chat/completions", fake.openai_base_url()),
            &body,
        )
        .await;
        assert_eq!(
            violations("CreateChatCompletionResponse", &response),
            Vec::<String>::new(),
            "{response}"
        );
    }
}

/// What the fake at `url` answers to `body`.
async fn answer_of(url: String, body: &Value) -> Value {
    let response = reqwest::Client::new().post(url).json(body).send().await;
    response.unwrap().json().await.unwrap()
}

/// Runs google-genai's types (tests/data/gemini/validate.py, in the suite's
/// venv) over `requests` and `responses`; `None` when the venv is absent
/// outside CI.
async fn genai_errors(requests: &[Value], responses: &[Value]) -> Option<(String, Vec<String>)> {
    sdk_errors("gemini", "google-genai", requests, responses).await
}

/// Runs `tests/data/<dir>/validate.py` (the `sdk`'s types, in the suite's
/// venv) over `requests` and `responses`: the SDK's version and every
/// error; `None` when the venv is absent outside CI.
async fn sdk_errors(
    dir: &str,
    sdk: &str,
    requests: &[Value],
    responses: &[Value],
) -> Option<(String, Vec<String>)> {
    let python = surety_tests::require("SURETY_OPENAI_SDK_PYTHON", sdk)?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(dir)
        .join("validate.py");
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
    let mut responses = Vec::new();
    for text in ["say hi", "please refuse"] {
        let body = json!({"contents": [{"role": "user", "parts": [{"text": text}]}]});
        let response: Value = answer_of(
            format!(
                "{}/models/fake-model:generateContent",
                fake.gemini_base_url()
            ),
            &body,
        )
        .await;
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

/// Every kind's wire JSON is checked against its provider's own published
/// definition, each by another: never an omission.
#[test]
fn every_kind_names_its_conformance_check() {
    use crate::support::{Conformance, kinds, row, spec};
    let mut checks: Vec<Conformance> = kinds()
        .map(|kind| row(spec(kind).kind).conformance)
        .collect();
    let all = checks.len();
    checks.dedup();
    assert_eq!(checks.len(), all, "{checks:?}");
    assert_eq!(
        checks,
        [
            Conformance::OpenAiDocument,
            Conformance::AnthropicSdk,
            Conformance::GoogleGenai,
            Conformance::OpenAiResponsesSdk,
        ]
    );
}

/// A tool-call request: two tools, any of them, one call.
fn tool_request() -> ChatRequest {
    let tool = |name: &str, property: &str| ToolSpec {
        name: name.to_owned(),
        description: format!("Do `{name}`."),
        parameters: json!({
            "type": "object",
            "properties": {property: {"type": "string"}},
            "required": [property],
            "additionalProperties": false,
        }),
    };
    ChatRequest {
        messages: vec![
            Message::system("Decide what to do with the order."),
            Message::user("Order 1042 arrived broken."),
        ],
        temperature: 0.0,
        max_tokens: 64,
        seed: None,
        output: OutputFormat::Tools(ToolRequest {
            tools: vec![tool("refund", "order_id"), tool("escalate", "queue")],
            pick: ToolPick::Any,
            parallel: false,
        }),
        cache: Default::default(),
        anthropic_beta: None,
    }
}

/// A fake that answers a tool-call request with a call of `refund`.
async fn calling_fake() -> FakeProvider {
    let call = json!({"tool": "refund", "arguments": {"order_id": "1042"}});
    FakeProvider::replying(call.to_string()).await.unwrap()
}

/// A tool-call request to a fake that calls `refund`, through a provider
/// of `kind` declaring each of `modes` in turn: the fake, and what it was sent.
async fn tools_in_every_mode(kind: &str, modes: &[&str]) -> (FakeProvider, Vec<Value>) {
    let fake = calling_fake().await;
    for mode in modes {
        let provider = provider_for(&fake, kind, &format!("structured_output = [\"{mode}\"]"));
        let answer = provider.chat(&tool_request(), &call(1)).await.unwrap();
        let answer = answer.json.unwrap();
        assert_eq!(
            answer,
            json!({"tool": "refund", "arguments": {"order_id": "1042"}})
        );
    }
    let sent = fake.requests().into_iter().map(|r| r.body).collect();
    (fake, sent)
}

/// `schema` closed: every object schema with `properties` and no
/// composition refuses a key it does not declare.
fn closed(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let composed = ["allOf", "anyOf", "oneOf"]
                .iter()
                .any(|k| map.contains_key(*k));
            if map.contains_key("properties")
                && !composed
                && !map.contains_key("additionalProperties")
            {
                map.insert("additionalProperties".into(), json!(false));
            }
            map.values_mut().for_each(closed);
        }
        Value::Array(items) => items.iter_mut().for_each(closed),
        _ => {}
    }
}

/// Every error `instance` has against the named definition, closed.
fn closed_violations(definition: &str, instance: &Value) -> Vec<String> {
    let mut schema: Value = serde_json::from_str(SCHEMAS).unwrap();
    closed(&mut schema);
    violations_of(schema, definition, instance)
}

#[tokio::test]
async fn openai_tool_requests_and_the_fakes_tool_calls_conform() {
    let (fake, sent) = tools_in_every_mode("openai", &["json_schema", "json_object_schema"]).await;
    for body in &sent {
        assert_eq!(
            violations("CreateChatCompletionRequest", body),
            Vec::<String>::new(),
            "{body}"
        );
        for tool in body["tools"].as_array().unwrap() {
            assert_eq!(
                closed_violations("ChatCompletionTool", tool),
                Vec::<String>::new(),
                "{tool}"
            );
        }
        assert_eq!(
            violations("ChatCompletionToolChoiceOption", &body["tool_choice"]),
            Vec::<String>::new()
        );
    }
    assert_eq!(
        sent[0]["tools"][0]["function"]["strict"], true,
        "strict where the mode is json_schema"
    );
    // The fake's answer to it, as OpenAI answers a tool call.
    let response: Value = answer_of(
        format!("{}/chat/completions", fake.openai_base_url()),
        &sent[0],
    )
    .await;
    assert_eq!(
        violations("CreateChatCompletionResponse", &response),
        Vec::<String>::new(),
        "{response}"
    );
    let tool_call = &response["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(
        closed_violations("ChatCompletionMessageToolCall", tool_call),
        Vec::<String>::new()
    );
    // An invented field in a tool or a tool call is refused.
    let mut tool = sent[0]["tools"][0].clone();
    tool["function"]["confidence"] = json!(0.9);
    assert!(
        closed_violations("ChatCompletionTool", &tool)
            .iter()
            .any(|e| e.contains("confidence"))
    );
    let mut invented = tool_call.clone();
    invented["function"]["confidence"] = json!(0.9);
    assert!(
        closed_violations("ChatCompletionMessageToolCall", &invented)
            .iter()
            .any(|e| e.contains("confidence"))
    );
}

#[tokio::test]
async fn gemini_tool_requests_and_the_fakes_function_calls_fit_googles_types() {
    let (fake, requests) =
        tools_in_every_mode("gemini", &["response_json_schema", "response_schema"]).await;
    let declaration = &requests[0]["tools"][0]["functionDeclarations"][0];
    assert!(
        declaration["parametersJsonSchema"].is_object(),
        "{declaration}"
    );
    assert!(requests[1]["tools"][0]["functionDeclarations"][0]["parameters"].is_object());
    let response: Value = answer_of(
        format!(
            "{}/models/fake-model:generateContent",
            fake.gemini_base_url()
        ),
        &requests[0],
    )
    .await;
    assert!(
        response["candidates"][0]["content"]["parts"][0]["functionCall"].is_object(),
        "{response}"
    );
    let Some((sdk, errors)) = genai_errors(&requests, std::slice::from_ref(&response)).await else {
        return;
    };
    assert_eq!(errors, Vec::<String>::new(), "google-genai {sdk}");
    let mut invented = requests[0].clone();
    invented["tools"][0]["functionDeclarations"][0]["priority"] = json!(1);
    let mut answer = response.clone();
    answer["candidates"][0]["content"]["parts"][0]["functionCall"]["confidence"] = json!(0.9);
    let (_, errors) = genai_errors(&[invented], &[answer]).await.unwrap();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("priority") && errors[1].contains("confidence"),
        "{errors:?}"
    );
}

#[tokio::test]
async fn anthropic_requests_and_the_fakes_responses_fit_the_sdks_types() {
    let fake = calling_fake().await;
    // Text in each structured-output mode, and a tool-call request.
    for mode in ["tool", "prefill", "prompt_only"] {
        let provider = provider_for(
            &fake,
            "anthropic",
            &format!("structured_output = [\"{mode}\"]"),
        );
        provider.chat(&json_request(), &call(1)).await.ok();
        provider.chat(&text_request(), &call(2)).await.unwrap();
    }
    let provider = provider_for(&fake, "anthropic", "");
    let answer = provider.chat(&tool_request(), &call(3)).await.unwrap();
    assert_eq!(answer.json.unwrap()["tool"], "refund");
    let requests: Vec<Value> = fake.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(
        requests.last().unwrap()["tool_choice"],
        json!({"type": "any", "disable_parallel_tool_use": true})
    );
    let mut responses = Vec::new();
    for request in [&requests[0], requests.last().unwrap()] {
        let response: Value = answer_of(
            format!("{}/v1/messages", fake.anthropic_base_url()),
            request,
        )
        .await;
        responses.push(response);
    }
    assert_eq!(
        responses[1]["content"][0]["type"], "tool_use",
        "{}",
        responses[1]
    );
    let Some((sdk, errors)) = sdk_errors("anthropic", "anthropic", &requests, &responses).await
    else {
        return;
    };
    assert_eq!(errors, Vec::<String>::new(), "anthropic {sdk}");
    eprintln!("validated against anthropic {sdk}");
    let mut invented = requests.last().unwrap().clone();
    invented["tools"][0]["priority"] = json!(1);
    let mut answer = responses[1].clone();
    answer["content"][0]["confidence"] = json!(0.9);
    let (_, errors) = sdk_errors("anthropic", "anthropic", &[invented], &[answer])
        .await
        .unwrap();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("priority") && errors[1].contains("confidence"),
        "{errors:?}"
    );
}

#[tokio::test]
async fn responses_requests_and_the_fakes_responses_fit_the_sdks_types() {
    let fake = calling_fake().await;
    // JSON and text in each structured-output mode, a stored call, and a
    // tool-call request with an earlier turn's call and its result.
    for mode in ["json_schema", "json_object", "prompt_only"] {
        let provider = provider_for(
            &fake,
            "openai-responses",
            &format!("structured_output = [\"{mode}\"]"),
        );
        provider.chat(&json_request(), &call(1)).await.ok();
        provider.chat(&text_request(), &call(2)).await.unwrap();
    }
    let stored = provider_for(&fake, "openai-responses", "store = true");
    stored.chat(&text_request(), &call(3)).await.unwrap();
    let provider = provider_for(&fake, "openai-responses", "");
    let mut asked = tool_request();
    asked.messages.push(Message::assistant(
        "",
        vec![surety_providers::CalledTool {
            id: "call_1".into(),
            name: "refund".into(),
            arguments: r#"{"order_id": "1041"}"#.into(),
        }],
    ));
    asked.messages.push(Message::tool("call_1", "refunded"));
    asked.messages.push(Message::user("And order 1042?"));
    let answer = provider.chat(&asked, &call(4)).await.unwrap();
    assert_eq!(answer.json.unwrap()["tool"], "refund");
    let requests: Vec<Value> = fake.requests().into_iter().map(|r| r.body).collect();
    let last = requests.last().unwrap();
    assert_eq!(last["tool_choice"], json!("required"), "{last}");
    assert_eq!(last["input"][1]["type"], "function_call", "{last}");
    assert_eq!(last["input"][2]["type"], "function_call_output", "{last}");
    assert_eq!(
        requests[0]["store"],
        json!(false),
        "nothing kept unless configured"
    );
    let mut responses = Vec::new();
    for request in [&requests[1], last] {
        responses.push(answer_of(format!("{}/responses", fake.openai_base_url()), request).await);
    }
    assert_eq!(
        responses[1]["output"][0]["type"], "function_call",
        "{}",
        responses[1]
    );
    let Some((sdk, errors)) = sdk_errors("openai-responses", "openai", &requests, &responses).await
    else {
        return;
    };
    assert_eq!(errors, Vec::<String>::new(), "openai {sdk}");
    eprintln!("validated against openai {sdk}");
    let mut invented = last.clone();
    invented["tools"][0]["priority"] = json!(1);
    let mut answer = responses[1].clone();
    answer["output"][0]["confidence"] = json!(0.9);
    let (_, errors) = sdk_errors("openai-responses", "openai", &[invented], &[answer])
        .await
        .unwrap();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("priority") && errors[1].contains("confidence"),
        "{errors:?}"
    );
}
