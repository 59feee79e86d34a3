//! A tool-call contract (`support-action`) certified like any other, for
//! each kind of provider: the fake answers each case with a call of the
//! right tool in its own wire format. A fake that answers one case in
//! prose, one that calls `escalate` where `refund` is expected and one that
//! sends the amount as text each fail, naming the case and the check.

use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider};

use crate::{certify_as, contract, failed_checks, kind_config, reply, script_for};

const KINDS: [&str; 3] = ["openai", "anthropic", "gemini"];

/// Certifies `support-action` for a fake of `kind` whose answers pass
/// through `edit`, golden snapshots accepted first from a well-behaved
/// one; with the well-behaved fake's first request.
async fn certify_kind(
    kind: &str,
    edit: impl Fn(&str, Value) -> Behavior,
) -> (surety_harness::ContractResult, Value) {
    let contract = contract("support-action");
    let golden = tempfile::tempdir().unwrap();
    let good = FakeProvider::start(script_for(&contract, |_, a| reply(&a)))
        .await
        .unwrap();
    let accepted = certify_as(
        kind_config(&good, kind, ""),
        std::slice::from_ref(&contract),
        golden.path(),
        true,
    )
    .await;
    assert!(
        accepted[0].certified,
        "{kind}: {:?}",
        accepted[0].failures()
    );
    let fake = FakeProvider::start(script_for(&contract, edit))
        .await
        .unwrap();
    let result = certify_as(
        kind_config(&fake, kind, ""),
        std::slice::from_ref(&contract),
        golden.path(),
        false,
    )
    .await
    .remove(0);
    (result, good.requests()[0].body.clone())
}

/// The names of the tools a request of `kind` offers, in its own words.
fn offered(kind: &str, body: &Value) -> Vec<String> {
    let tools = match kind {
        "gemini" => &body["tools"][0]["functionDeclarations"],
        _ => &body["tools"],
    };
    let name = |t: &Value| match kind {
        "openai" => t["function"]["name"].clone(),
        _ => t["name"].clone(),
    };
    tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| name(t).as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn support_action_certifies_for_every_kind_that_calls_the_right_tools() {
    for kind in KINDS {
        let (result, sent) = certify_kind(kind, |_, a| reply(&a)).await;
        assert!(result.certified, "{kind}: {:?}", result.failures());
        assert_eq!(result.cases.len(), 10);
        assert_eq!(
            offered(kind, &sent),
            ["refund", "escalate", "reply"],
            "{kind}: {sent}"
        );
    }
}

/// The failures of `result` as (case, check, message).
fn failures(result: &surety_harness::ContractResult) -> Vec<(String, String, String)> {
    result
        .failures()
        .into_iter()
        .map(|f| (f.case, f.check, f.message))
        .collect()
}

#[tokio::test]
async fn a_fake_that_answers_in_prose_calls_the_wrong_tool_or_sends_text_for_a_number_fails() {
    for kind in KINDS {
        // One case answered in prose.
        let (prose, _) = certify_kind(kind, |case, a| match case {
            "damaged-teapot" => Behavior::Reply("I have refunded your 30 euros.".to_owned()),
            _ => reply(&a),
        })
        .await;
        assert!(!prose.certified, "{kind}");
        let found = failures(&prose);
        assert!(
            found.iter().all(|(case, _, _)| case == "damaged-teapot"),
            "{kind}: {found:?}"
        );
        assert!(
            found.iter().any(|(_, check, message)| check == "parse"
                && message.contains("answered in text, not a tool call: I have refunded")),
            "{kind}: {found:?}"
        );
        // `escalate` where `refund` is expected: a valid call, the wrong decision.
        let escalate = json!({"tool": "escalate", "arguments": {"order_id": "3307", "queue": "billing", "reason": "Two charges."}});
        let (escalated, _) = certify_kind(kind, |case, a| match case {
            "charged-twice" => reply(&escalate),
            _ => reply(&a),
        })
        .await;
        assert!(!escalated.certified, "{kind}");
        let found = failures(&escalated);
        assert!(
            found
                .iter()
                .any(|(case, check, message)| case == "charged-twice"
                    && check == "facts"
                    && message.contains("/tool")),
            "{kind}: {found:?}"
        );
        // `"amount": "30"` where 30 was meant.
        let (text_amount, _) = certify_kind(kind, |case, mut a| {
            if case == "damaged-teapot" {
                a["arguments"]["amount"] = json!("30");
            }
            reply(&a)
        })
        .await;
        assert!(!text_amount.certified, "{kind}");
        let found = failures(&text_amount);
        assert!(
            found
                .iter()
                .any(|(case, check, message)| case == "damaged-teapot"
                    && check == "arguments"
                    && message.contains("/arguments/amount")
                    && message.contains("`refund`'s parameters")),
            "{kind}: {found:?}"
        );
        assert!(failed_checks(&text_amount).contains(&"arguments".to_owned()));
    }
}
