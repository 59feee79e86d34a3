//! A tool-call contract (`support-action`) certified like any other, for
//! each kind of provider: the fake answers each case with a call of the
//! right tool in its own wire format. A fake that answers one case in
//! prose, one that calls `escalate` where `refund` is expected and one that
//! sends the amount as text each fail, naming the case and the check.

use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider};

use crate::{certify_as, contract, failed_checks, kind_config, reply, script_for};

const KINDS: [&str; 4] = ["openai", "anthropic", "gemini", "openai-responses"];

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

#[tokio::test]
async fn a_cacheable_contract_is_certified_as_sent_with_its_breakpoints_and_its_marking_is_in_the_prompt_digest()
 {
    let contract = contract("support-action");
    assert_eq!(contract.cache.names(), ["system", "tools"]);
    let golden = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(script_for(&contract, |_, a| reply(&a)))
        .await
        .unwrap();
    let result = certify_as(
        kind_config(&fake, "anthropic", ""),
        std::slice::from_ref(&contract),
        golden.path(),
        true,
    )
    .await
    .remove(0);
    assert!(result.certified, "{:?}", result.failures());
    // Every request certification sent carries the breakpoints: on the
    // system prompt, and on the last tool.
    let sent = fake.requests();
    assert_eq!(sent.len(), 30, "ten cases, three samples each");
    let ephemeral = json!({"type": "ephemeral"});
    for request in &sent {
        let body = &request.body;
        assert_eq!(body["system"][0]["cache_control"], ephemeral, "{body}");
        assert!(body["system"][0]["text"].as_str().unwrap().len() > 100);
        let tools = body["tools"].as_array().unwrap();
        assert_eq!(tools.last().unwrap()["cache_control"], ephemeral, "{body}");
        assert!(tools[0].get("cache_control").is_none(), "{body}");
        assert!(
            request
                .raw
                .contains(r#""cache_control":{"type":"ephemeral"}"#),
            "{}",
            request.raw
        );
    }
    // A kind that caches by itself is sent no breakpoint.
    let openai = FakeProvider::start(script_for(&contract, |_, a| reply(&a)))
        .await
        .unwrap();
    let result = certify_as(
        kind_config(&openai, "openai", ""),
        std::slice::from_ref(&contract),
        golden.path(),
        false,
    )
    .await
    .remove(0);
    assert!(result.certified, "{:?}", result.failures());
    assert!(
        openai
            .requests()
            .iter()
            .all(|r| !r.raw.contains("cache_control")),
        "{:?}",
        openai.requests()[0].raw
    );

    // The marking is part of the prompt: without it, the prompt digest
    // differs, and a certificate of the marked prompt lapses.
    let unmarked_dir = tempfile::tempdir().unwrap();
    let copied = unmarked_dir.path().join("support-action");
    std::fs::create_dir(&copied).unwrap();
    for file in std::fs::read_dir(&contract.dir).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, copied.join(file.file_name().unwrap())).unwrap();
    }
    let toml = std::fs::read_to_string(copied.join("contract.toml")).unwrap();
    let edited = toml.replace(
        "cache = [\"system\", \"tools\"]\n",
        "cache = [\"system\"]\n",
    );
    assert_ne!(edited, toml);
    std::fs::write(copied.join("contract.toml"), edited).unwrap();
    let system_only = surety_contracts::Contract::load(&copied).unwrap();
    let certified = surety_exchange::prompt_digest(&contract).unwrap();
    let now = surety_exchange::prompt_digest(&system_only).unwrap();
    assert_ne!(certified, now, "the marking is part of the prompt");
    let config = kind_config(&fake, "anthropic", "");
    let mut manifest = surety_manifest::Manifest::new(time::OffsetDateTime::now_utc());
    manifest.entries.push(surety_tests::certified_entry(
        &config,
        &contract,
        time::OffsetDateTime::now_utc() + time::Duration::days(1),
    ));
    let behaviour = surety_manifest::Behaviour::new(config.behaviour());
    let current = surety_manifest::Current {
        contract_digest: &contract.digest,
        prompt_digest: &now,
        provider: &behaviour,
    };
    let eligibility = manifest.eligibility(
        &config.id,
        "support-action",
        &current,
        time::OffsetDateTime::now_utc(),
    );
    assert!(
        matches!(eligibility, surety_manifest::Eligibility::PromptChanged { ref certified_digest } if *certified_digest == certified),
        "{eligibility:?}"
    );
    // And the contract's own digest moved with its file.
    assert_ne!(system_only.digest, contract.digest);
    // A marking a contract cannot have is refused, naming it.
    let json_contract = unmarked_dir.path().join("language-detect");
    std::fs::create_dir(&json_contract).unwrap();
    for file in std::fs::read_dir(crate::contracts_dir().join("language-detect")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, json_contract.join(file.file_name().unwrap())).unwrap();
    }
    let toml = std::fs::read_to_string(json_contract.join("contract.toml")).unwrap();
    std::fs::write(
        json_contract.join("contract.toml"),
        toml.replace("[prompt]\n", "[prompt]\ncache = [\"tools\"]\n"),
    )
    .unwrap();
    let refused = surety_contracts::Contract::load(&json_contract)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("`prompt.cache`: `tools` is a tool-call contract's"),
        "{refused}"
    );
}
