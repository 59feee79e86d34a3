//! Reconciliation: an unknown attempt resolved by asking the provider
//! whether it did the work — found by its metadata or by the id its answer
//! began with, ended there (and failed over), not found (left unknown, the
//! question recorded), raced by its own late answer (settled once) — and a
//! provider that cannot be asked, said so.

use reqwest::StatusCode;
use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Script};
use surety_tests::TestDb;

use super::harness::*;

const ENGLISH: &str = r#"{"language": "english"}"#;

/// `[providers.<id>]` for a fake that stores its answers.
fn storing(id: &str, fake: &FakeProvider) -> String {
    format!("{}store = true\n", provider_toml(id, fake))
}

/// A router whose `fake-a` stores its answers, on route `language` (with
/// `fake-b` after it, when given); attempts time out after 300 ms, and
/// unknowns are asked about after 1 ms, again after `every_ms`.
async fn router(db: &TestDb, a: &FakeProvider, b: Option<&FakeProvider>, every_ms: u64) -> Router {
    let mut providers = storing("fake-a", a);
    let mut certified = vec![("fake-a", a, "language-detect")];
    let mut order = "\"fake-a\"".to_owned();
    if let Some(b) = b {
        providers.push_str(&provider_toml("fake-b", b));
        certified.push(("fake-b", b, "language-detect"));
        order.push_str(", \"fake-b\"");
    }
    let configs: Vec<surety_providers::ProviderConfig> = certified
        .iter()
        .map(|(id, fake, _)| {
            let toml = match *id {
                "fake-a" => storing(id, fake),
                _ => provider_toml(id, fake),
            };
            surety_providers::ProvidersConfig::from_toml(&toml)
                .unwrap()
                .providers[*id]
                .clone()
        })
        .collect();
    let pairs: Vec<(&surety_providers::ProviderConfig, &str)> =
        configs.iter().map(|c| (c, "language-detect")).collect();
    let route =
        format!("[routes.language]\ncontract = \"language-detect\"\nproviders = [{order}]\n");
    Router::start_with(
        db,
        &providers,
        &route,
        &manifest_of(&pairs),
        &format!(
            "attempt_timeout_ms = 300\nreconcile_after_ms = 1\nreconcile_every_ms = {every_ms}\n"
        ),
    )
    .await
}

/// The job once it is `state`; the test fails if 20 s pass first.
async fn job_once(router: &Router, id: &str, state: &str) -> Value {
    let mut job = Value::Null;
    let reached = until(async || {
        job = router.get(ACME, &format!("/v1/jobs/{id}")).await.1;
        job["state"] == state
    })
    .await;
    assert!(reached, "the job never became {state}: {job}");
    job
}

/// The job's attempts, with the questions asked about each.
async fn attempts(router: &Router, id: &str) -> Vec<Value> {
    let (status, list) = router.get(ACME, &format!("/v1/jobs/{id}/attempts")).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["data"].as_array().unwrap().clone()
}

/// A new job that went unknown: its id.
async fn unknown_job(router: &Router, key: &str) -> String {
    let (status, _, job) = router
        .create(ACME, key, &detect("Hello there"), Some(10))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(
        job["state"], "unknown",
        "the answer was lost on the wire: {job}"
    );
    job["id"].as_str().unwrap().to_owned()
}

pub async fn a_stored_completion_lost_on_the_wire_is_found_by_its_metadata(db: &TestDb) {
    let fake = FakeProvider::start(Script::always(Behavior::Lost(Box::new(Behavior::Reply(
        ENGLISH.to_owned(),
    )))))
    .await
    .unwrap();
    let router = router(db, &fake, None, 60_000).await;
    let id = unknown_job(&router, "lost-1").await;

    // The background loop's reconciler finds it: no one calls it here.
    let job = job_once(&router, &id, "succeeded").await;
    assert_eq!(job["result"], json!({"language": "english"}), "{job}");
    assert_eq!(
        fake.calls(),
        1,
        "one create call: the answer was asked for, never made again"
    );
    assert!(fake.lookups() >= 1, "the provider was asked");

    // What was sent: stored, with the attempt's name in its metadata.
    let sent = &fake.requests()[0].body;
    assert_eq!(sent["store"], json!(true), "{sent}");
    assert_eq!(
        sent["metadata"],
        json!({"surety_attempt": format!("surety-{id}-1")}),
        "{sent}"
    );

    let attempts = attempts(&router, &id).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["state"], "succeeded", "{attempts:?}");
    let asked = attempts[0]["reconciliation"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "asked once, found: {asked:?}");
    assert_eq!(
        asked[0]["asked_by"], "metadata",
        "no id was read: {asked:?}"
    );
    assert_eq!(asked[0]["outcome"], "answered", "{asked:?}");
    assert_eq!(
        attempts[0]["provider_response_id"], "chatcmpl-fake-1",
        "the found answer's id is the attempt's: {attempts:?}"
    );
    assert_eq!(
        router
            .metric("surety_reconciliations_total{outcome=\"answered\",provider=\"fake-a\"}")
            .await,
        1.0
    );

    // The replay answers the same, and asks nobody.
    let (status, _, replay) = router
        .create(ACME, "lost-1", &detect("Hello there"), Some(10))
        .await;
    assert_eq!(status, StatusCode::OK, "{replay}");
    assert_eq!(replay["id"], json!(id));
    assert_eq!(replay["result"], json!({"language": "english"}));
    assert_eq!(fake.calls(), 1);
}

pub async fn a_lost_answer_whose_id_arrived_is_found_by_its_id_and_its_late_result_settles_once(
    db: &TestDb,
) {
    // The work is done and stored at once; the answer is held, then
    // comes late — after the reconciler found it.
    let fake = FakeProvider::start(Script::always(Behavior::Held(Box::new(Behavior::Reply(
        ENGLISH.to_owned(),
    )))))
    .await
    .unwrap();
    let router = router(db, &fake, None, 60_000).await;
    let id = unknown_job(&router, "held-1").await;
    router.state.reconcile_now().await;
    let job = job_once(&router, &id, "succeeded").await;
    assert_eq!(job["result"], json!({"language": "english"}), "{job}");

    // The late answer arrives now, and loses: the job was settled once.
    let discarded = async || router.metric("surety_late_results_discarded_total").await >= 1.0;
    fake.open_gate();
    assert!(
        until(discarded).await,
        "the late answer came and was discarded"
    );
    assert_eq!(
        router
            .metric("surety_attempts_total{outcome=\"succeeded\",provider=\"fake-a\"}")
            .await,
        1.0,
        "one write won the job"
    );
    let held = attempts(&router, &id).await;
    assert_eq!(held[0]["state"], "succeeded", "{held:?}");
    assert_eq!(fake.calls(), 1);

    // An answer whose first bytes (its id) arrived before it was lost is
    // asked for by that id.
    fake.set_script(Script::always(Behavior::LostAfterId(Box::new(
        Behavior::Reply(ENGLISH.to_owned()),
    ))));
    let id = unknown_job(&router, "by-id-1").await;
    let before = attempts(&router, &id).await;
    assert_eq!(
        before[0]["provider_response_id"], "chatcmpl-fake-2",
        "written on the attempt as it was read: {before:?}"
    );
    router.state.reconcile_now().await;
    job_once(&router, &id, "succeeded").await;
    let asked = attempts(&router, &id).await[0]["reconciliation"].clone();
    assert_eq!(asked[0]["asked_by"], "id", "{asked}");
    assert_eq!(asked[0]["outcome"], "answered", "{asked}");
}

pub async fn a_stored_answer_that_is_none_fails_over_and_a_miss_stays_unknown(db: &TestDb) {
    // The provider did the work, and its answer is a refusal: a definite
    // end, so the job fails over to the next certified provider.
    let fake = FakeProvider::start(Script::always(Behavior::Lost(Box::new(Behavior::Refuse(
        "I cannot help with that".to_owned(),
    )))))
    .await
    .unwrap();
    let fallback = FakeProvider::start(language_script()).await.unwrap();
    let router = router(db, &fake, Some(&fallback), 60_000).await;
    let id = unknown_job(&router, "refused-1").await;
    router.state.reconcile_now().await;
    let job = job_once(&router, &id, "succeeded").await;
    assert_eq!(providers_tried(&job), ["fake-a", "fake-b"], "{job}");
    let attempts_now = attempts(&router, &id).await;
    assert_eq!(attempts_now[0]["state"], "failed", "{attempts_now:?}");
    assert_eq!(attempts_now[0]["reconciliation"][0]["outcome"], "ended");
    assert_eq!(fake.calls(), 1);

    // Nothing stored (the call never got anywhere it could be found): a
    // miss proves nothing, and the attempt stays unknown, the question
    // recorded with when and how it was asked.
    fake.set_script(Script::always(Behavior::Hang));
    let id = unknown_job(&router, "missed-1").await;
    router.state.reconcile_now().await;
    let attempts_now = attempts(&router, &id).await;
    assert_eq!(attempts_now[0]["state"], "unknown", "{attempts_now:?}");
    let asked = &attempts_now[0]["reconciliation"];
    assert_eq!(asked[0]["outcome"], "not_found", "{asked}");
    assert_eq!(asked[0]["asked_by"], "metadata", "{asked}");
    assert!(asked[0]["asked_at_ms"].as_i64().unwrap() > 0, "{asked}");
    let (_, job) = router.get(ACME, &format!("/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "unknown", "{job}");
    assert_eq!(fallback.calls(), 1, "no failover on a miss");
}

pub async fn an_unknown_at_a_provider_that_cannot_be_asked_stays_unknown_and_says_so(db: &TestDb) {
    let fake = FakeProvider::start(Script::always(Behavior::Hang))
        .await
        .unwrap();
    let providers = format!(
        "[providers.fake-a]\nkind = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"fake-a\"\ncontext_window = 16000\n",
        fake.anthropic_base_url()
    );
    let config = surety_providers::ProvidersConfig::from_toml(&providers)
        .unwrap()
        .providers["fake-a"]
        .clone();
    let router = Router::start_with(
        db,
        &providers,
        "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n",
        &manifest_of(&[(&config, "language-detect")]),
        "attempt_timeout_ms = 300\nreconcile_after_ms = 1\n",
    )
    .await;
    let id = unknown_job(&router, "anthropic-1").await;
    router.state.reconcile_now().await;
    let attempts_now = attempts(&router, &id).await;
    assert_eq!(attempts_now[0]["state"], "unknown", "{attempts_now:?}");
    assert!(
        attempts_now[0].get("reconciliation").is_none(),
        "nobody was asked: {attempts_now:?}"
    );
    let (_, providers) = router.get(ACME, "/v1/providers").await;
    let shown = &providers["data"][0]["reconciliation"];
    assert_eq!(shown["way"], "none", "{providers}");
    assert_eq!(shown["can_ask"], false, "{providers}");
    assert!(
        shown["how"].as_str().unwrap().contains("cannot be asked"),
        "{shown}"
    );

    let cookie = super::operator::admin_session(&router).await;
    let (status, page) = super::operator::page(&router, &cookie, &format!("/ui/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("cannot be asked: the provider keeps nothing to read back"),
        "{page}"
    );
}

/// `[providers.<id>]` for a Responses-kind fake that runs every call in the
/// background and polls it, each poll (and the create) given 200 ms.
fn in_background(id: &str, fake: &FakeProvider) -> String {
    format!(
        "[providers.{id}]\nkind = \"openai-responses\"\nbase_url = \"{}\"\nmodel = \"{id}\"\ncontext_window = 16000\n\
         store = true\nbackground = true\ntimeouts = {{ request_ms = 200, poll_ms = 20 }}\n",
        fake.openai_base_url()
    )
}

/// A router whose `fake-a` runs in the background, `fake-b` (chat) after it.
async fn background_router(db: &TestDb, a: &FakeProvider, b: &FakeProvider) -> Router {
    let providers = format!(
        "{}{}",
        in_background("fake-a", a),
        provider_toml("fake-b", b)
    );
    let parsed = surety_providers::ProvidersConfig::from_toml(&providers).unwrap();
    let configs = [&parsed.providers["fake-a"], &parsed.providers["fake-b"]];
    let pairs: Vec<(&surety_providers::ProviderConfig, &str)> =
        configs.iter().map(|c| (*c, "language-detect")).collect();
    Router::start_with(
        db,
        &providers,
        "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n",
        &manifest_of(&pairs),
        "attempt_timeout_ms = 5000\n",
    )
    .await
}

pub async fn a_background_response_outlives_a_poll_that_times_out_and_a_cancel_there_fails_over(
    db: &TestDb,
) {
    // The first poll never answers: it times out, and is polled again.
    let fake = FakeProvider::start(Script {
        hang_polls: 1,
        ..Script::always(Behavior::Reply(ENGLISH.to_owned()))
    })
    .await
    .unwrap();
    let fallback = FakeProvider::start(language_script()).await.unwrap();
    let router = background_router(db, &fake, &fallback).await;
    let (status, _, job) = router
        .create(ACME, "bg-1", &detect("Hello there"), Some(10))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(
        job["state"], "succeeded",
        "a poll that timed out is no unknown: {job}"
    );
    assert_eq!(job["result"], json!({"language": "english"}));
    assert_eq!(
        job["attempts"][0]["provider_response_id"], "resp_fake_1",
        "{job}"
    );
    assert!(fake.polls() >= 2, "polled past the one that hung");
    assert_eq!(fake.calls(), 1, "created once");
    assert_eq!(router.metric("surety_unknown_attempts_open").await, 0.0);
    assert_eq!(fallback.calls(), 0);

    // Work that never ends there: an admin cancels the attempt, the
    // provider is asked to cancel it (definite), and the job fails over.
    fake.set_script(Script::always(Behavior::Hang));
    let (status, _, job) = router
        .create(ACME, "bg-2", &detect("Hello there"), Some(0))
        .await;
    assert!(status.is_success(), "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let named =
        until(async || attempts(&router, &id).await[0]["provider_response_id"].is_string()).await;
    assert!(
        named,
        "the create's id is on the attempt while it is polled"
    );
    let (status, _, cancelled) = router
        .post(ACME_ADMIN, &format!("/v1/jobs/{id}/attempts/1/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(fake.cancels(), 1, "cancelled at the provider");
    let job = job_once(&router, &id, "succeeded").await;
    assert_eq!(providers_tried(&job), ["fake-a", "fake-b"], "{job}");
    assert_eq!(job["attempts"][0]["state"], "cancelled", "{job}");
    assert_eq!(fake.calls(), 2);
}
