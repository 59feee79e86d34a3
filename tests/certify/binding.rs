//! What a certification is bound to and how it treats a provider that is
//! not what it says: another model answering, answers replayed from an
//! earlier run, transient refusals, refusals and error bodies.

use std::collections::BTreeSet;

use serde_json::json;
use surety_fake_provider::{Behavior, FakeProvider, Script};
use surety_harness::report;

use crate::{certify_one, contract, failed_checks, reply, script_for};

/// The Markdown report of one contract's run.
fn report_of(result: &surety_harness::ContractResult) -> String {
    report::markdown("fake", std::slice::from_ref(result))
}

/// `text` says `words`.
#[track_caller]
fn says(text: &str, words: &str) {
    assert!(text.contains(words), "{words:?} is not in: {text}");
}

#[tokio::test]
async fn a_provider_answering_with_another_model_fails_naming_both() {
    let golden = tempfile::tempdir().unwrap();
    let contract = contract("language-detect");
    let mut script = script_for(&contract, |_, a| reply(&a));
    script.answer_model = Some("llama-3-8b-instruct".to_owned());
    let fake = FakeProvider::start(script).await.unwrap();
    let result = certify_one(&fake, "", &contract, golden.path(), true).await;
    assert!(!result.certified);
    assert_eq!(failed_checks(&result), ["model"]);
    let markdown = report_of(&result);
    says(
        &markdown,
        "answered by model `llama-3-8b-instruct`, but the provider is configured for `fake-model`",
    );
    says(&markdown, "Answered by `llama-3-8b-instruct`"); // the report names the model that answered

    // A dated snapshot of the configured model, or a declared id, is the same model.
    for (model, extra) in [
        ("fake-model-2025-06-01", ""),
        ("fake-model@20250601", ""),
        ("my-deployment", "served_models = [\"my-deployment\"]"),
    ] {
        let mut script = script_for(&contract, |_, a| reply(&a));
        script.answer_model = Some(model.to_owned());
        fake.set_script(script);
        let result = certify_one(&fake, extra, &contract, golden.path(), true).await;
        assert!(result.certified, "{model}: {:?}", failed_checks(&result));
    }
}

#[tokio::test]
async fn a_provider_that_replays_by_key_cannot_answer_a_new_run_from_an_old_one() {
    let golden = tempfile::tempdir().unwrap();
    let contract = contract("language-detect");
    let mut good = script_for(&contract, |_, a| reply(&a));
    good.replay_by_key = true;
    let fake = FakeProvider::start(good).await.unwrap();
    let first = certify_one(&fake, "", &contract, golden.path(), true).await;
    assert!(first.certified);
    let first_keys: BTreeSet<String> = fake
        .requests()
        .iter()
        .filter_map(|r| r.idempotency_key.clone())
        .collect();
    assert_eq!(first_keys.len(), 30, "one key per sample");

    // The provider degrades, but still answers a key it has seen from its cache.
    let mut degraded = Script::always(Behavior::Reply(json!({"language": "english"}).to_string()));
    degraded.replay_by_key = true;
    fake.set_script(degraded);
    let second = certify_one(&fake, "", &contract, golden.path(), false).await;
    assert!(
        !second.certified,
        "the second run's keys are new, so the degraded answers are seen"
    );
    assert!(failed_checks(&second).contains(&"facts".to_owned()));
    let second_keys: BTreeSet<String> = fake.requests()[30..]
        .iter()
        .filter_map(|r| r.idempotency_key.clone())
        .collect();
    assert_eq!(second_keys.len(), 30);
    assert!(
        second_keys.is_disjoint(&first_keys),
        "no key of the first run is sent again"
    );
}

#[tokio::test]
async fn a_transient_429_is_retried_and_a_lasting_one_fails_naming_it() {
    let golden = tempfile::tempdir().unwrap();
    let contract = contract("language-detect");
    let limited = |retry_after: &str| Behavior::Status {
        status: 429,
        body: json!({"error": {"type": "rate_limit_exceeded", "message": "slow down"}}),
        retry_after: Some(retry_after.to_owned()),
    };
    // Each case's first call is refused with Retry-After: 1, then answered.
    let once = script_for(&contract, |_, a| {
        Behavior::Sequence(vec![limited("1"), reply(&a)])
    });
    let fake = FakeProvider::start(once).await.unwrap();
    let result = certify_one(&fake, "", &contract, golden.path(), true).await;
    assert!(result.certified, "{:?}", result.failures());
    let retried: usize = result
        .cases
        .iter()
        .flat_map(|c| &c.samples)
        .map(|s| s.retries.len())
        .sum();
    assert_eq!(retried, 10, "one refusal per case, each waited out");
    let markdown = report_of(&result);
    assert!(
        markdown.contains("10 transient refusals retried"),
        "{markdown}"
    );

    // Refused on every call: the budget runs out and the call fails, naming the status.
    fake.set_script(Script::always(limited("0.01")));
    let result = certify_one(&fake, "", &contract, golden.path(), false).await;
    assert!(!result.certified);
    let failure = result
        .failures()
        .into_iter()
        .find(|f| f.check == "call")
        .unwrap();
    assert!(
        failure.message.contains("rate limited (HTTP 429)")
            && failure.message.contains("slow down")
            && failure.message.contains("after 3 retries"),
        "{failure:?}"
    );
}

#[tokio::test]
async fn a_refusal_and_an_error_in_a_200_are_reported_in_the_providers_words() {
    let golden = tempfile::tempdir().unwrap();
    let contract = contract("language-detect");
    let script = script_for(&contract, |case, a| match case {
        "english" => Behavior::Refuse("I can't help with identifying that message.".to_owned()),
        "french" => Behavior::Status {
            status: 200,
            body: json!({"error": {"type": "server_error", "message": "The engine is currently overloaded, please try again later"}}),
            retry_after: None,
        },
        _ => reply(&a),
    });
    let fake = FakeProvider::start(script).await.unwrap();
    let result = certify_one(&fake, "", &contract, golden.path(), true).await;
    assert!(!result.certified);
    let markdown = report_of(&result);
    says(
        &markdown,
        "`english`, sample 1, **call**: provider `fake`: refused by the model, definite failure: the model refused: I can't help with identifying that message.",
    );
    assert!(
        markdown.contains("`french`, sample 1, **call**")
            && markdown.contains(
                "HTTP 200 carrying an error: server_error: The engine is currently overloaded, please try again later"
            ),
        "{markdown}"
    );
}

/// A Gemini-kind provider at the fake, as `surety.toml` would configure it.
fn gemini_config(fake: &FakeProvider) -> surety_providers::ProviderConfig {
    let toml = format!(
        "[providers.gem]\nkind = \"gemini\"\nbase_url = \"{}\"\nmodel = \"gemini-fake\"\ncontext_window = 16000\n",
        fake.gemini_base_url()
    );
    surety_providers::ProvidersConfig::from_toml(&toml)
        .unwrap()
        .providers["gem"]
        .clone()
}

#[tokio::test]
async fn a_gemini_provider_certifies_and_a_safety_stop_is_named() {
    let golden = tempfile::tempdir().unwrap();
    let contract = contract("language-detect");
    let fake = FakeProvider::start(script_for(&contract, |_, a| reply(&a)))
        .await
        .unwrap();
    let result = crate::certify_as(
        gemini_config(&fake),
        std::slice::from_ref(&contract),
        golden.path(),
        true,
    )
    .await
    .remove(0);
    assert!(result.certified, "{:?}", result.failures());
    let sent = &fake.requests()[0];
    assert_eq!(sent.format, surety_fake_provider::WireFormat::Gemini);
    assert_eq!(
        sent.body["generationConfig"]["seed"], 7,
        "the contract's seed"
    );
    // The same provider now stops for safety on every case.
    fake.set_script(script_for(&contract, |_, _| {
        Behavior::Refuse("The response was blocked.".to_owned())
    }));
    let result = crate::certify_as(
        gemini_config(&fake),
        std::slice::from_ref(&contract),
        golden.path(),
        false,
    )
    .await
    .remove(0);
    assert!(!result.certified);
    let failure = result
        .failures()
        .into_iter()
        .find(|f| f.check == "call")
        .unwrap();
    assert!(
        failure.message.contains("refused by the model")
            && failure.message.contains("(finishReason SAFETY)"),
        "{failure:?}"
    );
}
