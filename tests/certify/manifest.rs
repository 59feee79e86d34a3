//! Contract digests, staleness in the manifest, and signatures.

use std::time::Duration;

use surety_contracts::Contract;
use surety_manifest::{Behaviour, Current, Eligibility, Manifest, ManifestError, Status};
use time::OffsetDateTime;

use crate::{contracts_dir, script_for};

/// A copy of the real contracts to edit.
fn copy_contracts() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(contracts_dir()).unwrap() {
        let from = entry.unwrap().path();
        let to = dir.path().join(from.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for file in std::fs::read_dir(&from).unwrap() {
            let file = file.unwrap().path();
            std::fs::copy(&file, to.join(file.file_name().unwrap())).unwrap();
        }
    }
    dir
}

/// What an entry of provider `behaviour` for `contract` must match now.
fn now_is<'a>(contract: &'a Contract, prompts: &'a str, behaviour: &'a Behaviour) -> Current<'a> {
    Current {
        contract_digest: &contract.digest,
        prompt_digest: prompts,
        provider: behaviour,
    }
}

/// A manifest certifying a fake for `contract`, and the fake's configuration.
async fn certified_manifest(
    contract: &Contract,
    now: OffsetDateTime,
) -> (Manifest, surety_providers::ProviderConfig) {
    let golden = tempfile::tempdir().unwrap();
    let fake = surety_fake_provider::FakeProvider::start(script_for(contract, |_, a| {
        surety_fake_provider::Behavior::Reply(a.to_string())
    }))
    .await
    .unwrap();
    let results = crate::certify(
        &fake,
        "",
        std::slice::from_ref(contract),
        golden.path(),
        true,
    )
    .await;
    let config = crate::fake_config(&fake, "");
    let entries = results
        .iter()
        .map(|r| surety_harness::entry(&config, r, None, None, now, Duration::from_secs(86400)))
        .collect();
    let mut manifest = Manifest::new(now);
    manifest.replace_provider("fake", entries, now);
    (manifest, config)
}

/// The prompt's templates are parsed once, when the contract loads: a
/// template that does not parse is refused then, naming its own file, and
/// the contract never loads.
#[test]
fn a_template_that_does_not_parse_is_refused_at_load_naming_its_file() {
    let copy = copy_contracts();
    let dir = copy.path().join("language-detect");
    let template = std::fs::read_to_string(dir.join("user.jinja")).unwrap();
    std::fs::write(dir.join("user.jinja"), format!("{template}{{% if text %}}")).unwrap();
    let err = Contract::load(&dir).unwrap_err();
    let surety_contracts::ContractError::Invalid { path, message } = &err else {
        panic!("{err:?}");
    };
    assert!(path.ends_with("user.jinja"), "{err}");
    assert!(
        message.starts_with("the template does not parse: "),
        "{err}"
    );
}

#[tokio::test]
async fn editing_a_contract_changes_its_digest_and_makes_its_certification_stale() {
    let copy = copy_contracts();
    let dir = copy.path().join("language-detect");
    let before = Contract::load(&dir).unwrap();
    let now = OffsetDateTime::now_utc();
    let (manifest, config) = certified_manifest(&before, now).await;
    let behaviour = Behaviour::new(config.behaviour());
    let prompts = surety_exchange::prompt_digest(&before).unwrap();
    let current = now_is(&before, &prompts, &behaviour);
    assert_eq!(manifest.entries[0].status, Status::Certified);
    assert_eq!(
        manifest.eligibility("fake", "language-detect", &current, now),
        Eligibility::Certified
    );

    // One word of the prompt changes.
    let template = std::fs::read_to_string(dir.join("system.jinja")).unwrap();
    std::fs::write(
        dir.join("system.jinja"),
        template.replace("customer message", "customer's message"),
    )
    .unwrap();
    let after = Contract::load(&dir).unwrap();
    assert_ne!(before.digest, after.digest);
    assert_eq!(
        manifest.eligibility(
            "fake",
            "language-detect",
            &now_is(&after, &prompts, &behaviour),
            now
        ),
        Eligibility::Stale {
            certified_digest: before.digest.clone()
        }
    );
    // Any file counts, the cases too.
    let cases = std::fs::read_to_string(dir.join("cases.toml")).unwrap();
    std::fs::write(
        dir.join("cases.toml"),
        cases.replace("Thanks, that fixed it!", "Thanks, that fixed it."),
    )
    .unwrap();
    assert_ne!(Contract::load(&dir).unwrap().digest, after.digest);
    // And time: past its expiry, a certification lapses too.
    let later = now + time::Duration::days(2);
    assert!(matches!(
        manifest.eligibility("fake", "language-detect", &current, later),
        Eligibility::Expired { .. }
    ));
    assert_eq!(
        manifest.eligibility("other", "language-detect", &current, now),
        Eligibility::Missing
    );
}

#[tokio::test]
async fn a_tampered_manifest_fails_verification() {
    let contract = crate::contract("language-detect");
    let now = OffsetDateTime::now_utc();
    let (mut manifest, _) = certified_manifest(&contract, now).await;
    let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
    manifest.sign(&key);
    let text = serde_json::to_string_pretty(&manifest).unwrap();
    let reread = Manifest::parse(&text).unwrap();
    reread.verify(&key.verifying_key()).unwrap();

    // A failed certification edited into a passing one.
    let mut tampered = reread.clone();
    tampered.entries[0].counts.stable_fail += 1;
    assert!(matches!(
        tampered.verify(&key.verifying_key()),
        Err(ManifestError::BadSignature(_))
    ));
    // Text edits of the file, byte by byte, are caught too.
    let edited = text.replace("\"certified\"", "\"failed\"");
    assert!(
        Manifest::parse(&edited)
            .unwrap()
            .verify(&key.verifying_key())
            .is_err()
    );
    // Another key's signature, and no signature at all.
    let other = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
    assert!(matches!(
        reread.verify(&other.verifying_key()),
        Err(ManifestError::WrongKey { .. })
    ));
    let mut unsigned = reread.clone();
    unsigned.signature = None;
    assert!(matches!(
        unsigned.verify(&key.verifying_key()),
        Err(ManifestError::Unsigned)
    ));
    // A file that is not a manifest at all.
    assert!(Manifest::parse("{\"format\": \"surety-manifest/2\"").is_err());
    assert!(matches!(
        Manifest::parse(&text.replace("surety-manifest/2", "surety-manifest/9")),
        Err(ManifestError::Format(_))
    ));
}

#[test]
fn certifying_one_provider_replaces_only_its_entries() {
    let now = OffsetDateTime::now_utc();
    let entry = |provider: &str, contract: &str| surety_manifest::Entry {
        provider: provider.into(),
        contract: contract.into(),
        status: Status::Certified,
        contract_digest: "sha256:x".into(),
        prompt_digest: "sha256:y".into(),
        system_prompt_digest: None,
        provider_fingerprint: "sha256:z".into(),
        provider_config: serde_json::json!({}),
        base_url_override: None,
        price: None,
        served_model: Default::default(),
        tokenizer: "unverified".into(),
        structured_mode: "json_schema".into(),
        lint: vec![],
        counts: Default::default(),
        failures: vec![],
        tokens: Default::default(),
        latency_ms: Default::default(),
        generated_at: surety_manifest::now_rfc3339(now),
        expires_at: surety_manifest::now_rfc3339(now + time::Duration::days(1)),
        harness_version: "test".into(),
    };
    let mut manifest = Manifest::new(now);
    manifest.replace_provider("a", vec![entry("a", "c1"), entry("a", "c2")], now);
    manifest.replace_provider("b", vec![entry("b", "c1")], now);
    manifest.replace_provider("a", vec![entry("a", "c3")], now);
    let pairs: Vec<_> = manifest
        .entries
        .iter()
        .map(|e| (e.provider.as_str(), e.contract.as_str()))
        .collect();
    assert_eq!(pairs, [("a", "c3"), ("b", "c1")]);
}

/// The tool definitions are part of the prompt: editing a tool changes the
/// prompt digest (and the contract's), so its certificates lapse.
#[test]
fn editing_a_tool_changes_the_prompt_digest() {
    let copy = copy_contracts();
    let dir = copy.path().join("support-action");
    let before = Contract::load(&dir).unwrap();
    let prompts = surety_exchange::prompt_digest(&before).unwrap();
    let tools = std::fs::read_to_string(dir.join("tools.json")).unwrap();
    std::fs::write(
        dir.join("tools.json"),
        tools.replace("Refund part or all of the order", "Refund the order"),
    )
    .unwrap();
    let after = Contract::load(&dir).unwrap();
    assert_eq!(
        after.render(&after.cases[0].input).unwrap(),
        before.render(&before.cases[0].input).unwrap(),
        "the rendered messages are the same"
    );
    assert_ne!(surety_exchange::prompt_digest(&after).unwrap(), prompts);
    assert_ne!(after.digest, before.digest);
}
