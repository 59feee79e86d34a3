//! The official OpenAI Python SDK, unchanged, as a client of the router's
//! `/v1/chat/completions` (installed by `cargo xtask test` into the cache
//! and named by `SURETY_OPENAI_SDK_PYTHON`).

use serde_json::Value;
use surety_fake_provider::FakeProvider;
use surety_tests::TestDb;

use crate::harness::{ACME, Router, contract, language_script};

const CLIENT: &str = r#"
import json, os
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=0)
# The contract's own prompt, rendered: the facade sends only certified prompts.
messages = [
    {"role": "system", "content": os.environ["SYSTEM_PROMPT"]},
    {"role": "user", "content": os.environ["USER_PROMPT"]},
]
first = client.chat.completions.create(model="language", messages=messages, extra_headers={"Idempotency-Key": "sdk-order-1"})
again = client.chat.completions.with_raw_response.create(model="language", messages=messages, extra_headers={"Idempotency-Key": "sdk-order-1"})
second = again.parse()
print(json.dumps({
    "first_id": first.id,
    "second_id": second.id,
    "content": first.choices[0].message.content,
    "model": first.model,
    "replayed": again.headers.get("idempotent-replayed"),
    "prompt_certified": again.headers.get("surety-prompt-certified"),
}))
"#;

pub async fn the_official_openai_sdk_gets_its_answer_once(db: &TestDb) {
    let python = match std::env::var("SURETY_OPENAI_SDK_PYTHON") {
        Ok(python) => python,
        Err(_) if std::env::var_os("CI").is_some() => panic!(
            "SURETY_OPENAI_SDK_PYTHON is not set and CI is set: run through `cargo xtask test`"
        ),
        Err(_) => {
            eprintln!("SKIPPED: the OpenAI SDK is not installed (run through `cargo xtask test`)");
            return;
        }
    };
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let prompt = contract("language-detect")
        .render(&serde_json::json!({"text": "Bonjour, je n'arrive pas à télécharger ma facture en PDF."}))
        .unwrap();
    let output = tokio::process::Command::new(python)
        .args(["-c", CLIENT])
        .env("SYSTEM_PROMPT", &prompt.system)
        .env("USER_PROMPT", &prompt.user)
        .env("BASE_URL", &router.base)
        .env("API_KEY", ACME)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        seen["first_id"], seen["second_id"],
        "the same Idempotency-Key gets the same completion: {seen}"
    );
    assert!(seen["first_id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(
        serde_json::from_str::<Value>(seen["content"].as_str().unwrap()).unwrap(),
        serde_json::json!({"language": "french"})
    );
    assert_eq!(seen["model"], "language");
    assert_eq!(seen["replayed"], "true");
    assert_eq!(seen["prompt_certified"], "true");
    assert_eq!(fake.calls(), 1, "no second provider call");
}
