//! What real providers signal beyond an answer, read for what it says, for
//! every kind: retry hints (a 429 with none, Google's RetryInfo,
//! Anthropic's 529), finish reasons (a filter, a reason nobody knows), a
//! thinking model's thoughts; and a case that passes some samples is
//! flaky.

use std::time::Duration;

use serde_json::json;
use surety_fake_provider::{Behavior, FakeProvider};
use surety_harness::{ContractResult, Outcome, RetryBudget, report};

use crate::{certify_within, contract, kind_config, reply, script_for};

/// A budget whose backoff is quick, so that tests do not wait seconds.
fn quick() -> RetryBudget {
    RetryBudget {
        first_backoff: Duration::from_millis(10),
        ..RetryBudget::default()
    }
}

async fn certify_kind(fake: &FakeProvider, kind: &str) -> ContractResult {
    let golden = tempfile::tempdir().unwrap();
    certify_within(
        kind_config(fake, kind, ""),
        &[contract("language-detect")],
        golden.path(),
        true,
        quick(),
    )
    .await
    .remove(0)
}

fn retries(result: &ContractResult) -> Vec<String> {
    result
        .cases
        .iter()
        .flat_map(|c| &c.samples)
        .flat_map(|s| s.retries.clone())
        .collect()
}

/// Each case's first call is refused with the signal, then answered: every
/// kind is certified, each refusal retried once, as its provider asked or,
/// with no hint, after a backoff.
#[tokio::test]
async fn every_documented_retry_signal_is_waited_out_and_the_provider_certified() {
    let no_hint = Behavior::Status {
        status: 429,
        body: json!({"error": {"type": "rate_limit_exceeded", "message": "slow down"}}),
        retry_after: None,
    };
    let retry_info = Behavior::Status {
        status: 429,
        body: json!({"error": {
            "code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Please retry in 1s.",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.05s"}]
        }}),
        retry_after: None,
    };
    let overloaded = Behavior::Status {
        status: 529,
        body: json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        retry_after: None,
    };
    let signals = [
        ("openai", &no_hint, "HTTP 429, no hint, backed off"),
        ("anthropic", &no_hint, "HTTP 429, no hint, backed off"),
        ("gemini", &no_hint, "HTTP 429, no hint, backed off"),
        ("gemini", &retry_info, "HTTP 429, asked to wait 0.05 s"),
        ("anthropic", &overloaded, "HTTP 529, no hint, backed off"),
    ];
    for (kind, signal, noted) in signals {
        let contract = contract("language-detect");
        let once = script_for(&contract, |_, a| {
            Behavior::Sequence(vec![signal.clone(), reply(&a)])
        });
        let fake = FakeProvider::start(once).await.unwrap();
        let result = certify_kind(&fake, kind).await;
        assert!(result.certified, "{kind} {noted}: {:?}", result.failures());
        let retried = retries(&result);
        assert_eq!(
            retried.len(),
            10,
            "{kind}: one refusal per case: {retried:?}"
        );
        assert!(
            retried.iter().all(|r| r.starts_with(noted)),
            "{kind}: {retried:?}"
        );
    }
}

/// A filtered answer is no answer, though its JSON is complete and right;
/// a finish reason the adapter does not know is never taken for one.
/// Either fails the call, named, and the provider is not certified.
#[tokio::test]
async fn a_filtered_answer_or_an_unknown_finish_reason_is_not_certified_and_is_named() {
    let stops = [
        ("openai", "content_filter", "finish_reason content_filter"),
        ("openai", "a_new_reason", "finish_reason `a_new_reason`"),
        ("anthropic", "pause_turn", "stop_reason `pause_turn`"),
        ("gemini", "OTHER", "finishReason `OTHER`"),
        ("gemini", "SAFETY", "finishReason SAFETY"),
    ];
    for (kind, reason, named) in stops {
        let contract = contract("language-detect");
        let script = script_for(&contract, |_, a| Behavior::Finish {
            text: a.to_string(),
            reason: reason.to_owned(),
        });
        let fake = FakeProvider::start(script).await.unwrap();
        let result = certify_kind(&fake, kind).await;
        assert!(!result.certified, "{kind} {reason}");
        let failures = result.failures();
        let call = failures
            .iter()
            .find(|f| f.check == "call" || f.check == "parse")
            .unwrap_or_else(|| panic!("{kind} {reason}: {failures:?}"));
        assert!(call.message.contains(named), "{kind} {reason}: {call:?}");
        assert!(
            result
                .cases
                .iter()
                .all(|c| c.outcome == Outcome::StableFail),
            "{kind} {reason}: no sample passed"
        );
    }
}

/// A thinking Gemini model sends its reasoning as a `thought` part before
/// the answer: certified on the answer alone.
#[tokio::test]
async fn a_thinking_models_answer_alone_is_certified() {
    for kind in ["gemini", "anthropic", "openai"] {
        let contract = contract("language-detect");
        let script = script_for(&contract, |_, a| Behavior::Thought {
            thought: "The text reads like French to me. {\"language\":".into(),
            text: a.to_string(),
        });
        let fake = FakeProvider::start(script).await.unwrap();
        let result = certify_kind(&fake, kind).await;
        assert!(result.certified, "{kind}: {:?}", result.failures());
    }
}

/// A provider whose third sample of each case is wrong passed two of
/// three: every case is flaky — in results.json, the report and JUnit —
/// and, the contract needing all three (k = 3), none passes.
#[tokio::test]
async fn two_of_three_samples_is_flaky_in_the_results_the_report_and_junit() {
    let contract = contract("language-detect");
    let script = script_for(&contract, |_, a| {
        let wrong =
            json!({"language": if a["language"] == "english" { "french" } else { "english" }});
        Behavior::Cycle(vec![a.to_string(), a.to_string(), wrong.to_string()])
    });
    let fake = FakeProvider::start(script).await.unwrap();
    let result = certify_kind(&fake, "openai").await;
    assert!(!result.certified);
    for case in &result.cases {
        assert_eq!(case.outcome, Outcome::Flaky, "{}", case.name);
        assert_eq!(case.samples.iter().filter(|s| s.passed()).count(), 2);
        assert!(!case.passed, "k = 3 and flaky_passes = false");
    }
    let json = serde_json::to_value(&result).unwrap();
    assert!(
        json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["outcome"] == "flaky"),
        "{json}"
    );
    let markdown = report::markdown("fake", std::slice::from_ref(&result));
    assert!(markdown.contains("| 10 | 0 | 10 | 0 |"), "{markdown}");
    let junit = report::junit("fake", std::slice::from_ref(&result));
    assert_eq!(junit.matches("type=\"flaky\"").count(), 10, "{junit}");
}
