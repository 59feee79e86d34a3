//! The store's record of the router's own checks, engine-neutral: live
//! results read back in order, and a demotion is opened once however many
//! replicas decide it, lifted only as its lift allows, and kept on record.

use serde_json::json;
use surety_store::{
    Created, JobId, Lift, LiveOutcome, LiveResult, LiveSource, NewJob, OwnerId, Slot, StartAttempt,
    Store, StoreError, Trust,
};
use surety_tests::TestDb;

fn result(provider: &str, outcome: LiveOutcome, n: u32) -> LiveResult {
    LiveResult {
        provider: provider.to_owned(),
        contract: "language-detect".to_owned(),
        route: "language".to_owned(),
        source: LiveSource::Shadow,
        outcome,
        detail: format!("check {n}"),
        job_id: Some(JobId(format!("job-{n}"))),
        case_name: None,
        input: json!({"text": format!("message {n}")}),
        expected: Some(json!({"/language": "english"})),
        answer: Some(json!({"language": "Englisch"})),
        at_ms: 0,
    }
}

pub async fn live_results_read_back_newest_first_per_provider(db: &TestDb) {
    let store = db.store().await;
    for n in 0..5 {
        let outcome = if n % 2 == 0 {
            LiveOutcome::Kept
        } else {
            LiveOutcome::Broke
        };
        store
            .record_live(&result("fallback", outcome, n))
            .await
            .unwrap();
    }
    store
        .record_live(&result("other", LiveOutcome::Disagreed, 9))
        .await
        .unwrap();
    let window = store
        .live_window("fallback", "language-detect", 3)
        .await
        .unwrap();
    let details: Vec<&str> = window.iter().map(|r| r.detail.as_str()).collect();
    assert_eq!(details, ["check 4", "check 3", "check 2"]);
    let newest = &window[0];
    assert_eq!(newest.outcome, LiveOutcome::Kept);
    assert_eq!(newest.job_id, Some(JobId("job-4".to_owned())));
    assert_eq!(newest.input, json!({"text": "message 4"}));
    assert_eq!(newest.answer, Some(json!({"language": "Englisch"})));
    assert!(newest.at_ms > 0, "recorded on the database's clock");
    // What a demotion is judged on: the same window, without its JSON.
    let verdicts = store
        .live_verdicts("fallback", "language-detect", 3)
        .await
        .unwrap();
    let judged: Vec<(LiveSource, LiveOutcome, &str)> = window
        .iter()
        .map(|r| (r.source, r.outcome, r.detail.as_str()))
        .collect();
    let light: Vec<(LiveSource, LiveOutcome, &str)> = verdicts
        .iter()
        .map(|v| (v.source, v.outcome, v.detail.as_str()))
        .collect();
    assert_eq!(light, judged);
    // What an export reads: the route's broken and disagreeing inputs, oldest first.
    let exported = store.live_results("language", 0, None).await.unwrap();
    let details: Vec<&str> = exported.iter().map(|r| r.detail.as_str()).collect();
    assert_eq!(details, ["check 1", "check 3", "check 9"]);
    let disagreed = store
        .live_results("language", 0, Some(LiveOutcome::Disagreed))
        .await
        .unwrap();
    assert_eq!(disagreed.len(), 1);
}

pub async fn a_demotion_is_opened_once_and_lifted_only_as_its_lift_allows(db: &TestDb) {
    let store = db.store().await;
    let why = "3 of the last 50 real inputs broke the contract";
    // Two replicas deciding the same demotion at once: the database records it once.
    let other: Store = db.store().await;
    let (a, b) = tokio::join!(
        store.demote("fallback", "language-detect", why),
        other.demote("fallback", "language-detect", "the other replica's words"),
    );
    assert_eq!(
        [a.unwrap(), b.unwrap()].iter().filter(|d| **d).count(),
        1,
        "one of the two opened it"
    );
    let open = store.demotions().await.unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    let demotion = &open[0];
    assert_eq!(
        (demotion.provider.as_str(), demotion.contract.as_str()),
        ("fallback", "language-detect")
    );
    assert!(
        !store
            .demote("fallback", "language-detect", why)
            .await
            .unwrap()
    );
    // Another contract of the same provider is its own.
    assert!(
        store
            .demote("fallback", "support-triage", why)
            .await
            .unwrap()
    );
    // A certification older than the demotion does not lift it; a newer one does.
    let older = Lift::Certification {
        certified_at_ms: demotion.demoted_at_ms - 1,
    };
    assert!(
        !store
            .lift("fallback", "language-detect", &older)
            .await
            .unwrap()
    );
    assert_eq!(
        other.demotions().await.unwrap().len(),
        2,
        "still demoted, seen by every replica"
    );
    let newer = Lift::Certification {
        certified_at_ms: demotion.demoted_at_ms + 1,
    };
    assert!(
        other
            .lift("fallback", "language-detect", &newer)
            .await
            .unwrap()
    );
    assert!(
        !store
            .lift("fallback", "language-detect", &newer)
            .await
            .unwrap(),
        "lifted once"
    );
    // An admin's reinstate lifts whatever is open, and is recorded.
    let admin = Lift::Admin {
        by: "admin of acme".to_owned(),
        why: "checked by hand".to_owned(),
    };
    assert!(
        store
            .lift("fallback", "support-triage", &admin)
            .await
            .unwrap()
    );
    assert!(store.demotions().await.unwrap().is_empty());
    // Demoted again later: a new demotion, the old ones stay on record.
    assert!(
        store
            .demote("fallback", "language-detect", "again")
            .await
            .unwrap()
    );
    assert_eq!(store.demotions().await.unwrap()[0].reason, "again");
}

/// The database has the last word on trust: an attempt that rests on a
/// certification is refused by its own insert while its provider has an
/// open demotion on the contract at or after that certification (a new
/// job with it is not recorded at all); a certification newer than the
/// demotion, another contract, an attempt resting on none, or a lifted
/// demotion starts.
pub async fn an_attempt_at_a_provider_demoted_since_its_certification_is_refused(db: &TestDb) {
    let store = db.store().await;
    let acme = OwnerId("acme".to_owned());
    let new = |key: &str| NewJob {
        owner: acme.clone(),
        key: surety_core::IdempotencyKey::parse(key).unwrap(),
        route: "language".to_owned(),
        contract: "language-detect".to_owned(),
        contract_digest: "sha256:0000".to_owned(),
        input: json!({"text": key}),
        hedgeable: true,
        kind: surety_store::JobKind::Native,
        messages: None,
        request: None,
        fingerprint: None,
    };
    let at = |provider: &str, slot, trust: Option<Trust>| StartAttempt {
        provider: provider.to_owned(),
        slot,
        lease: std::time::Duration::from_secs(60),
        trust,
        charges: Vec::new(),
    };
    let certified = |contract: &str, at_ms| {
        Some(Trust {
            contract: contract.to_owned(),
            certified_at_ms: at_ms,
        })
    };
    assert!(
        store
            .demote("fallback", "language-detect", "broke")
            .await
            .unwrap()
    );
    // Certified long before the demotion: refused, and nothing recorded.
    let refused = store
        .create_and_start(
            &new("g-1"),
            &at("fallback", Slot::Primary, certified("language-detect", 0)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, StoreError::Demoted { provider, contract } if provider == "fallback" && contract == "language-detect"),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("open demotion"), "{refused}");
    assert_eq!(
        db.count("SELECT COUNT(*) FROM jobs").await,
        0,
        "a refused job was recorded"
    );
    // Certified after the demotion (the certification lifts it): starts.
    let later = certified("language-detect", i64::MAX);
    let (Created::New(job), Some(_)) = store
        .create_and_start(&new("g-2"), &at("fallback", Slot::Primary, later))
        .await
        .unwrap()
    else {
        panic!("a certification newer than the demotion starts")
    };
    // Another contract, or no certification to rest on: starts.
    for (key, trust) in [("g-3", certified("support-triage", 0)), ("g-4", None)] {
        let (created, handle) = store
            .create_and_start(&new(key), &at("fallback", Slot::Primary, trust))
            .await
            .unwrap();
        assert!(
            matches!(created, Created::New(_)) && handle.is_some(),
            "{key}"
        );
    }
    // A later attempt (a hedge here) is guarded the same way.
    let refused = store
        .start_attempt(
            &acme,
            &job.id,
            &at("fallback", Slot::Hedge, certified("language-detect", 0)),
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, StoreError::Demoted { .. }), "{refused:?}");
    assert_eq!(store.attempts(&acme, &job.id).await.unwrap().len(), 1);
    // Lifted: the same attempt starts.
    let lift = Lift::Admin {
        by: "ops".to_owned(),
        why: "checked by hand".to_owned(),
    };
    assert!(
        store
            .lift("fallback", "language-detect", &lift)
            .await
            .unwrap()
    );
    store
        .start_attempt(
            &acme,
            &job.id,
            &at("fallback", Slot::Hedge, certified("language-detect", 0)),
        )
        .await
        .unwrap();
}
