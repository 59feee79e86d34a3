//! A real model (Gemma 3 270M, Q4_K_M) on a real third-party server
//! (llama-cpp-python's OpenAI-compatible server), started by
//! `cargo xtask test` through `cargo xtask local-provider`, which passes its
//! URL in `SURETY_LOCAL_PROVIDER_URL`.

use std::sync::Arc;

use serde_json::{Value, json};
use surety_providers::{
    ChatRequest, FailureClass, FailureKind, Message, OutputFormat, Provider, StructuredMode,
};

use crate::support::{call, provider_at};

/// The server's URL, or `None` (loudly) outside CI when it is not running.
fn local_server() -> Option<String> {
    surety_tests::require("SURETY_LOCAL_PROVIDER_URL", "the local model server")
}

/// A call to the server failed: the error, and whether the server process
/// `cargo xtask test` started (`SURETY_LOCAL_PROVIDER_PID`) is gone, so a
/// dead server is named, not taken for the model's answer.
fn server_failed(error: impl std::fmt::Display) -> String {
    let gone = std::env::var("SURETY_LOCAL_PROVIDER_PID")
        .ok()
        .filter(|pid| {
            // Gone, or a zombie not yet reaped.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z'))
            })
        });
    match gone {
        Some(pid) => format!(
            "{error}\nthe local model server (pid {pid}) is no longer running: it died, and `cargo xtask test` says of what, with the end of its log"
        ),
        None => error.to_string(),
    }
}

fn gemma(url: &str, modes: &str) -> Arc<dyn Provider> {
    provider_at(
        url,
        "openai",
        &format!(
            "structured_output = {modes}\ntokenize_endpoint = true\ntokenizer = \"server\"\n\
             [providers.fake.timeouts]\nrequest_ms = 120000"
        ),
    )
}

fn language_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"language": {"type": "string", "enum": ["english", "french", "german", "spanish"]}},
        "required": ["language"],
        "additionalProperties": false
    })
}

fn detect(text: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![
            Message::system(
                "You name the language a text is written in. Answer with a JSON object.",
            ),
            Message::user(format!("Text: {text}\nLanguage:")),
        ],
        temperature: 0.0,
        max_tokens: 32,
        seed: Some(42),
        output: OutputFormat::Json {
            name: "language".into(),
            schema: language_schema(),
        },
        cache: Default::default(),
        anthropic_beta: None,
    }
}

#[tokio::test]
async fn a_real_prompt_gets_a_schema_valid_answer_and_the_server_says_what_it_serves() {
    let Some(url) = local_server() else { return };
    // The server declares json_object + schema; the adapter takes it from the capabilities.
    let provider = gemma(&url, "[\"json_object_schema\", \"json_object\"]");
    let response = provider
        .chat(
            &detect("Bonjour, je voudrais réserver une table pour deux."),
            &call(1),
        )
        .await
        .unwrap_or_else(|e| panic!("{}", server_failed(e)));
    assert_eq!(
        response.structured_mode,
        Some(StructuredMode::JsonObjectSchema)
    );
    let answer = response.json.clone().unwrap();
    let validator = jsonschema::validator_for(&language_schema()).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&answer)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{answer} breaks the schema: {errors:?}");
    // The response's `model` echoes the request; the listing names the weights.
    assert_eq!(response.model, "fake-model");
    let served = provider
        .served_models()
        .await
        .unwrap_or_else(|e| panic!("{}", server_failed(e)));
    assert!(
        served
            .iter()
            .any(|m| m.contains("gemma-3-270m") && m.ends_with(".gguf")),
        "{served:?}"
    );
    assert!(
        response.usage.prompt_tokens > 0 && response.usage.completion_tokens > 0,
        "{:?}",
        response.usage
    );
    eprintln!(
        "gemma answered {answer} in {:?}; the server serves {served:?}",
        response.latency
    );
}

#[tokio::test]
async fn asking_this_server_for_json_schema_is_a_definite_failure_with_its_message() {
    let Some(url) = local_server() else { return };
    let provider = gemma(&url, "[\"json_schema\"]");
    let error = provider
        .chat(&detect("Guten Morgen"), &call(2))
        .await
        .unwrap_err();
    assert!(error.answered(), "{}", server_failed(&error));
    assert_eq!(
        (error.kind, error.class(), error.status),
        (FailureKind::ServerError, FailureClass::Definite, Some(500))
    );
    assert!(
        error.message.contains("internal_server_error"),
        "the server's message is kept: {error}"
    );
}

#[tokio::test]
async fn the_server_tokenizes_with_its_own_vocabulary() {
    let Some(url) = local_server() else { return };
    let provider = gemma(&url, "[\"json_object_schema\"]");
    let tokens = provider
        .tokenize("Bonjour tout le monde")
        .await
        .unwrap_or_else(|e| panic!("{}", server_failed(e)));
    assert!(tokens.len() >= 2, "{tokens:?}");
    assert_eq!(
        tokens[0], 2,
        "Gemma's token list starts with BOS (id 2): {tokens:?}"
    );
}
