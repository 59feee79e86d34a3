//! The fake provider itself: scripting by model, prompt and call number,
//! latency, and waiting on its call counter instead of sleeping.

use std::time::Duration;

use surety_fake_provider::{Behavior, FakeProvider, Keep, Latency, Script, When};

use crate::support::{call, json_request, provider_for};

#[tokio::test]
async fn rules_match_by_call_model_and_prompt_in_order() {
    let script = Script::always(Behavior::Reply(
        r#"{"category": "account", "urgent": false}"#.into(),
    ))
    .rule(
        When::Call(2),
        Behavior::Status {
            status: 503,
            body: serde_json::json!({}),
            retry_after: None,
        },
    )
    .rule(
        When::Model("other-model".into()),
        Behavior::Reply(r#"{"category": "bug", "urgent": true}"#.into()),
    )
    .rule_with_latency(
        When::PromptContains("charged twice".into()),
        Behavior::Cycle(vec![
            r#"{"category": "billing", "urgent": false}"#.into(),
            r#"{"category": "billing", "urgent": true}"#.into(),
        ]),
        Latency::RandomMs { min: 1, max: 5 },
    );
    let fake = FakeProvider::start(script).await.unwrap();
    let provider = provider_for(&fake, "openai", "");
    let first = provider.chat(&json_request(), &call(1)).await.unwrap();
    assert_eq!(first.json.unwrap()["urgent"], false);
    assert_eq!(
        provider
            .chat(&json_request(), &call(1))
            .await
            .unwrap_err()
            .status,
        Some(503),
        "the second call"
    );
    let third = provider.chat(&json_request(), &call(1)).await.unwrap();
    assert_eq!(
        third.json.unwrap()["urgent"],
        true,
        "a cycle answers differently on each call"
    );
    assert_eq!(fake.calls(), 3);
    assert_eq!(provider.served_models().await.unwrap(), ["surety-fake-1"]);
    assert_eq!(fake.calls(), 3, "model listings are not chat calls");
}

#[tokio::test]
async fn tests_wait_on_the_call_counter() {
    let fake = FakeProvider::start(Script::always(Behavior::Hang))
        .await
        .unwrap();
    let provider = provider_for(&fake, "openai", "");
    let pending = tokio::spawn(async move { provider.chat(&json_request(), &call(9)).await });
    assert!(fake.wait_for_calls(1, Duration::from_secs(10)).await);
    assert_eq!(fake.calls_with_key(&call(9).idempotency_key), 1);
    assert!(
        !fake.wait_for_calls(2, Duration::from_millis(50)).await,
        "no second call arrives"
    );
    pending.abort();
}

/// A load run's fake keeps no more than it is asked to: what it keeps grows
/// with every call, and a benchmark's upstream that grows stalls its own
/// answers (page faults) and charges them to the router.
#[tokio::test]
async fn a_fake_keeps_of_each_call_only_what_its_script_asks() {
    // keep, replay by key: requests kept, keys counted, answers kept.
    for (keep, replay_by_key, requests, keys, answers) in [
        (Keep::Requests, false, 2, 2, 0),
        (Keep::Counts, false, 0, 2, 0),
        (Keep::Totals, false, 0, 0, 0),
        (Keep::Totals, true, 0, 0, 2),
    ] {
        let fake = FakeProvider::start(Script {
            keep,
            replay_by_key,
            ..Script::always(Behavior::Reply(
                r#"{"category": "account", "urgent": false}"#.into(),
            ))
        })
        .await
        .unwrap();
        let provider = provider_for(&fake, "openai", "");
        for n in [1, 2] {
            provider.chat(&json_request(), &call(n)).await.unwrap();
        }
        let what = format!("{keep:?}, replay by key {replay_by_key}");
        assert_eq!(fake.calls(), 2, "{what}");
        assert_eq!(fake.requests().len(), requests, "{what}");
        assert_eq!(fake.calls_by_key().len(), keys, "{what}");
        assert_eq!(fake.answers_kept(), answers, "{what}");
    }
}
