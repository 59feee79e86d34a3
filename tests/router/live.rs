//! The router's own checks, over HTTP (SPEC "Live certification"): a
//! fallback that keeps the certification cases but breaks the contract on
//! real inputs is demoted by shadow checks and then not failed over to; a
//! demotion decided while a job runs stops that job's failover; a newer
//! certification lifts it. The router takes trust away, never grants it.

use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Latency, Script, When};
use surety_tests::TestDb;

use crate::harness::{
    ACME, ACME_ADMIN, Router, detect, language_script, language_script_else, manifest,
    providers_tried, until,
};

const SHADOWED: &str = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n\
     [routes.language.shadow]\nsampling = 1.0\nhourly_budget = 100\n";

/// A primary that answers right, and a fallback that answers the
/// certification cases right but anything else in words the schema refuses.
async fn primary_and_a_fallback_that_breaks_on_real_inputs() -> (FakeProvider, FakeProvider) {
    let primary = FakeProvider::start(language_script()).await.unwrap();
    let breaks = Behavior::Reply(json!({"language": "Englisch"}).to_string());
    let fallback = FakeProvider::start(language_script_else(breaks))
        .await
        .unwrap();
    (primary, fallback)
}

fn server_error() -> Behavior {
    Behavior::Status {
        status: 500,
        body: json!({"error": {"message": "the primary is down"}}),
        retry_after: None,
    }
}

/// Whether this router demotes `provider` for language-detect, waiting
/// for its live checks (on the counter they bump when they do).
async fn demoted(router: &Router, provider: &str) -> bool {
    let demotions = &router.state.inner.metrics.demotions;
    let counted = || {
        demotions
            .with_label_values(&[provider, "language-detect"])
            .get()
    };
    until(async || counted() == 1).await
}

/// `provider`'s certification status for language-detect, as `/v1/providers` says.
async fn status(router: &Router, provider: &str) -> (String, String) {
    let (_, list) = router.get(ACME, "/v1/providers").await;
    let of = |p: &Value| p["id"] == provider;
    let entry = &list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| of(p))
        .unwrap()["certification"]["language-detect"];
    (
        entry["status"].as_str().unwrap_or_default().to_owned(),
        entry["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

pub async fn a_fallback_that_breaks_the_contract_on_real_inputs_is_demoted_and_not_failed_over_to(
    db: &TestDb,
) {
    let (primary, fallback) = primary_and_a_fallback_that_breaks_on_real_inputs().await;
    let providers = [("fake-a", &primary), ("fake-b", &fallback)];
    let router = Router::certifying(db, &providers, SHADOWED).await;
    // Real traffic, through the primary: its answer is the job's.
    let text = "Hello, could you move my delivery to next Tuesday?";
    let (_, _, job) = router.create(ACME, "live-1", &detect(text), Some(10)).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job}");
    // The shadow call, off the request path: the fallback breaks the contract, and is demoted.
    assert!(demoted(&router, "fake-b").await, "the fallback is demoted");
    assert_eq!(fallback.calls(), 1, "one shadow call, never an attempt");
    let (code, reason) = status(&router, "fake-b").await;
    assert_eq!(code, "demoted", "{reason}");
    assert!(
        reason.contains("1 of the last 1 live checks broke the contract")
            && reason.contains("schema at `/language`"),
        "the reason in words: {reason}"
    );
    assert_eq!(status(&router, "fake-a").await.0, "certified");
    assert!(router.metric("surety_demotions_total").await >= 1.0);
    // `surety cases export`: the input that broke the contract, as a case
    // the contract loads, expecting the job's answer on its agreement pointers.
    let exported = surety_router::export_cases(&router.config, "language", 0, None)
        .await
        .unwrap();
    assert!(exported.contains("From a shadow call of job"), "{exported}");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("language-detect");
    std::fs::create_dir(&copy).unwrap();
    let source = crate::harness::contracts_dir().join("language-detect");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(copy.join("cases.toml"), &exported).unwrap();
    let proposed = surety_contracts::Contract::load(&copy).unwrap();
    assert_eq!(proposed.cases.len(), 1, "{exported}");
    let case = &proposed.cases[0];
    assert_eq!(case.input, json!({"text": text}));
    assert!(
        proposed
            .check_facts(case, &json!({"language": "english"}))
            .is_empty()
    );
    assert!(
        !proposed
            .check_facts(case, &json!({"language": "german"}))
            .is_empty()
    );
    // The job itself is untouched: the same answer, one attempt, and a replay says so.
    let (status_again, _, again) = router.create(ACME, "live-1", &detect(text), Some(10)).await;
    assert_eq!(status_again, 200, "a replay");
    assert_eq!(again["result"], json!({"language": "english"}));
    assert_eq!(again["attempts"].as_array().unwrap().len(), 1);
    // The primary fails: the demoted fallback is not failed over to.
    primary.set_script(Script::always(server_error()));
    let (_, _, failed) = router
        .create(
            ACME,
            "live-2",
            &detect("Bonjour, ma commande est arrivée cassée."),
            Some(10),
        )
        .await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(
        providers_tried(&failed),
        ["fake-a"],
        "no attempt at the demoted fallback: {failed}"
    );
    assert_eq!(fallback.calls(), 1);
    // A new certification, newer than the demotion, lifts it.
    let recertified = manifest(&[
        ("fake-a", &primary, "language-detect"),
        ("fake-b", &fallback, "language-detect"),
    ]);
    recertified.write(&router.manifest_path()).unwrap();
    router.state.inner.manifest.reload();
    assert_eq!(status(&router, "fake-b").await.0, "certified");
    let store = &router.state.inner.store;
    assert!(
        until(async || store.demotions().await.unwrap().is_empty()).await,
        "the lift is recorded"
    );
    // Eligible again: the failover reaches the fallback (which, still
    // broken on real inputs, fails this job's check and will be demoted
    // again by the next shadow check).
    let input = detect("Hola, mi pedido no ha llegado.");
    let (_, _, retried) = router.create(ACME, "live-3", &input, Some(10)).await;
    assert_eq!(providers_tried(&retried), ["fake-a", "fake-b"], "{retried}");
    // The harness certifies against the exported cases: a provider that
    // answers as the primary did keeps them; one as the fallback did does not.
    let as_primary = certify_against(language_script(), &proposed).await;
    assert!(as_primary.certified, "{:?}", as_primary.failures());
    let breaks = Behavior::Reply(json!({"language": "Englisch"}).to_string());
    let as_fallback = certify_against(language_script_else(breaks), &proposed).await;
    assert!(!as_fallback.certified);
    let failures = as_fallback.failures();
    assert!(
        failures
            .iter()
            .any(|f| f.case == "live-fake-b-1" && f.check == "schema"),
        "the exported case and the check name what broke: {failures:?}"
    );
}

/// A certification run of a fresh fake with `script` against `contract`
/// (golden snapshots accepted in a directory of its own).
async fn certify_against(
    script: Script,
    contract: &surety_contracts::Contract,
) -> surety_harness::ContractResult {
    let fake = FakeProvider::start(script).await.unwrap();
    let config = crate::harness::provider_config("fake-x", &fake);
    let golden = tempfile::tempdir().unwrap();
    let certification = surety_harness::Certification {
        provider: surety_providers::build_provider(&config).unwrap(),
        config,
        golden_root: golden.path().to_path_buf(),
        accept: true,
        retry: surety_harness::RetryBudget::default(),
        on_sample: Box::new(|_, _| {}),
    };
    certification
        .run(std::slice::from_ref(contract))
        .await
        .unwrap()
        .remove(0)
}

pub async fn a_demotion_decided_while_a_job_runs_stops_its_failover(db: &TestDb) {
    // The primary takes its time and then fails; meanwhile another replica
    // (here: the store, directly) demotes the fallback.
    let primary = FakeProvider::start(Script::always(server_error()).rule_with_latency(
        When::Always,
        server_error(),
        Latency::FixedMs(600),
    ))
    .await
    .unwrap();
    let fallback = FakeProvider::start(language_script()).await.unwrap();
    let route =
        "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n";
    let providers = [("fake-a", &primary), ("fake-b", &fallback)];
    let router = Router::certifying(db, &providers, route).await;
    let input = detect("Hello there");
    let create = router.create(ACME, "mid-1", &input, Some(10));
    let demote = async {
        assert!(
            until(async || primary.calls() == 1).await,
            "the first attempt is running"
        );
        demoted_elsewhere(&router, "fake-b").await;
    };
    let ((_, _, job), ()) = tokio::join!(create, demote);
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(
        job["attempts"].as_array().unwrap().len(),
        1,
        "no failover to the demoted fallback: {job}"
    );
    assert_eq!(fallback.calls(), 0);
}

/// `provider` demoted for `language-detect` as another replica would: in
/// the store, behind this router's back.
async fn demoted_elsewhere(router: &Router, provider: &str) {
    let why = "demoted: 3 of the last 50 live checks broke the contract — decided elsewhere";
    assert!(
        router
            .state
            .inner
            .store
            .demote(provider, "language-detect", why)
            .await
            .unwrap()
    );
}

/// A demotion another replica commits counts for the very next job, though
/// this router has not read it since: the attempt's own insert refuses the
/// demoted provider in the database, and the job starts at the next one.
pub async fn a_demotion_made_elsewhere_counts_for_the_next_job_at_once(db: &TestDb) {
    let primary = FakeProvider::start(language_script()).await.unwrap();
    let fallback = FakeProvider::start(language_script()).await.unwrap();
    let route =
        "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n";
    let providers = [("fake-a", &primary), ("fake-b", &fallback)];
    let router = Router::certifying(db, &providers, route).await;
    // A first job: this router has read the demotions (none) by now.
    let (_, _, job) = router
        .create(ACME, "else-1", &detect("Hello there"), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(primary.calls(), 1);
    demoted_elsewhere(&router, "fake-a").await;
    let (_, _, job) = router
        .create(ACME, "else-2", &detect("Guten Tag"), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{job}");
    assert_eq!(attempts[0]["provider"], "fake-b", "{job}");
    assert_eq!(primary.calls(), 1, "the demoted primary was called again");
}

/// A contract whose calls may have side effects is never shadowed: a route
/// that asks for it does not start, and says why.
#[tokio::test]
async fn shadowing_a_contract_with_side_effects_is_refused() {
    let db = TestDb::new(surety_tests::Engine::Sqlite).await.unwrap();
    let fake = FakeProvider::replying("{}").await.unwrap();
    let route = "[routes.invoices]\ncontract = \"invoice-extraction\"\nproviders = [\"fake-a\"]\n\
         [routes.invoices.shadow]\nsampling = 0.5\nhourly_budget = 10\n";
    let why = Router::refused(&db, &[("fake-a", &fake)], route).await;
    assert!(
        why.contains("routes.invoices.shadow.sampling") && why.contains("side effects"),
        "{why}"
    );
}

pub async fn an_admin_reinstates_a_demoted_provider_and_only_an_admin(db: &TestDb) {
    let (primary, fallback) = primary_and_a_fallback_that_breaks_on_real_inputs().await;
    let providers = [("fake-a", &primary), ("fake-b", &fallback)];
    let router = Router::certifying(db, &providers, SHADOWED).await;
    let why = "demoted: 2 of the last 50 live checks broke the contract — decided by a test";
    let store = &router.state.inner.store;
    assert!(
        store
            .demote("fake-b", "language-detect", why)
            .await
            .unwrap()
    );
    assert_eq!(
        status(&router, "fake-b").await,
        ("demoted".to_owned(), why.to_owned())
    );
    let path = "/v1/providers/fake-b/contracts/language-detect/reinstate";
    let reinstate = async |key: &str, body: Value| {
        let (code, _, answer) = router.post_json(key, path, Some(&body)).await;
        (code.as_u16(), answer)
    };
    assert_eq!(reinstate(ACME, json!({"reason": "trust me"})).await.0, 403);
    assert_eq!(reinstate(ACME_ADMIN, json!({"reason": " "})).await.0, 400);
    assert_eq!(reinstate(ACME_ADMIN, json!({"why": "typo"})).await.0, 400);
    assert_eq!(
        status(&router, "fake-b").await.0,
        "demoted",
        "nothing changed"
    );
    let (code, list) =
        reinstate(ACME_ADMIN, json!({"reason": "checked the answers by hand"})).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(status(&router, "fake-b").await.0, "certified");
    assert!(store.demotions().await.unwrap().is_empty());
    let (code, problem) = reinstate(ACME_ADMIN, json!({"reason": "again"})).await;
    assert_eq!(code, 404, "{problem}");
}

pub async fn a_provider_that_regresses_on_its_cases_is_demoted_by_a_recheck_before_a_job_reaches_it(
    db: &TestDb,
) {
    let primary = FakeProvider::start(language_script()).await.unwrap();
    let fallback = FakeProvider::start(language_script()).await.unwrap();
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n\
         recheck_every_ms = 200\n[routes.language.shadow]\nsampling = 0.0\nhourly_budget = 1000\n";
    let providers = [("fake-a", &primary), ("fake-b", &fallback)];
    let router = Router::certifying(db, &providers, route).await;
    // After certifying, the fallback changes behind its stable model id.
    fallback.set_script(Script::always(Behavior::Reply(
        json!({"language": "dutch"}).to_string(),
    )));
    assert!(
        demoted(&router, "fake-b").await,
        "a re-check demotes the fallback"
    );
    let (code, reason) = status(&router, "fake-b").await;
    assert_eq!(code, "demoted", "{reason}");
    assert!(
        reason.contains("scheduled re-check") && reason.contains("case `"),
        "{reason}"
    );
    assert_eq!(
        status(&router, "fake-a").await.0,
        "certified",
        "the primary keeps its cases"
    );
    // No user's job reaches the demoted fallback.
    let before = fallback.calls();
    primary.set_script(Script::always(server_error()));
    let (_, _, job) = router
        .create(ACME, "regressed-1", &detect("Hello there"), Some(10))
        .await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job}");
    let attempts_at_fallback = fallback
        .calls_by_key()
        .keys()
        .filter(|k| !k.starts_with("surety-recheck-"))
        .count();
    assert_eq!(
        attempts_at_fallback, 0,
        "only re-checks called it ({before} then)"
    );
}

/// Jobs of the shadow-check storm, and the shadow calls' budget.
const STORM_JOBS: usize = 1000;
const STORM_BUDGET: u64 = 200;

/// What a job is, less its ids and clocks: its state, answer, books and
/// attempts (provider, state, hedge, error).
fn shape(job: &Value) -> Value {
    let mut job = job.clone();
    let object = job.as_object_mut().unwrap();
    object.remove("id");
    object.remove("created_at_ms");
    for attempt in object["attempts"].as_array_mut().unwrap() {
        let attempt = attempt.as_object_mut().unwrap();
        attempt.remove("started_at_ms");
        attempt.remove("finished_at_ms");
        // The provider's name for its answer counts its calls, shadow
        // calls among them: whether one was made, not what it was.
        let named = attempt.remove("provider_response_id");
        attempt.insert(
            "named".to_owned(),
            json!(named.is_some_and(|id| !id.is_null())),
        );
    }
    job
}

/// `STORM_JOBS` jobs through a router with `route` on its own database,
/// eight at a time, each created and then replayed; each job's shape and
/// status, in order, with its replay's. Every tenth primary call fails, so
/// those jobs fail over.
async fn storm(
    db: &TestDb,
    providers: &[(&str, &FakeProvider)],
    route: &str,
) -> (Router, Vec<Value>) {
    use futures_util::StreamExt;
    let router = Router::certifying(db, providers, route).await;
    let router_ref = &router;
    let jobs = futures_util::stream::iter(0..STORM_JOBS)
        .map(|i| async move {
            let down = if i % 10 == 0 { " [down]" } else { "" };
            let input = detect(&format!("Message {i}: where is my parcel?{down}"));
            let key = format!("storm-{i}");
            let (code, _, job) = router_ref.create(ACME, &key, &input, Some(10)).await;
            let (replayed, _, replay) = router_ref.create(ACME, &key, &input, Some(10)).await;
            assert_eq!(replay, job, "a replay is the job");
            json!({"status": code.as_u16(), "replay": replayed.as_u16(), "job": shape(&job)})
        })
        .buffered(8)
        .collect::<Vec<Value>>()
        .await;
    (router, jobs)
}

pub async fn shadow_checks_never_change_a_job(db: &TestDb) {
    let down = When::PromptContains("[down]".to_owned());
    let primary = FakeProvider::start(language_script().rule(down, server_error()))
        .await
        .unwrap();
    let fallbacks = [
        FakeProvider::start(language_script()).await.unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
    ];
    let providers = [
        ("fake-a", &primary),
        ("fake-b", &fallbacks[0]),
        ("fake-c", &fallbacks[1]),
    ];
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\", \"fake-c\"]\n";
    let (plain, without) = storm(db, &providers, route).await;
    drop(plain);
    let attempts_without: Vec<u64> = providers.iter().map(|(_, f)| f.calls()).collect();
    // The same jobs on a database of their own, with every job sampled.
    let other = TestDb::new(db.engine).await.unwrap();
    let shadowed = format!(
        "{route}[routes.language.shadow]\nsampling = 1.0\nhourly_budget = {STORM_BUDGET}\nmax_concurrent = 4\n"
    );
    let (router, with) = storm(&other, &providers, &shadowed).await;
    let checks = async || router.metric("surety_live_checks_total").await;
    assert!(
        until(async || checks().await >= STORM_BUDGET as f64).await,
        "the shadow calls are made"
    );
    // Every shadow call this router started ends before it is counted.
    router.state.inner.tasks.close();
    router.state.inner.tasks.wait().await;
    for (i, (a, b)) in without.iter().zip(&with).enumerate() {
        assert_eq!(a, b, "job {i} is not what it is without shadow checks");
    }
    assert_eq!(checks().await, STORM_BUDGET as f64, "exactly the budget");
    let mut shadow_calls = 0;
    for ((id, fake), before) in providers.iter().zip(&attempts_without) {
        let keys = fake.calls_by_key();
        let shadow: Vec<(&String, &u64)> = keys
            .iter()
            .filter(|(k, _)| k.starts_with("surety-shadow-"))
            .collect();
        for (key, calls) in &shadow {
            assert_eq!(**calls, 1, "one shadow call per job at {id}: {key}");
            assert!(key.ends_with(&format!("-{id}")), "{key}");
        }
        shadow_calls += shadow.len() as u64;
        // What was not a shadow call is an attempt: as many as without them.
        let attempts = fake.calls() - before - shadow.len() as u64;
        assert_eq!(attempts, *before, "{id}: a shadow call is never an attempt");
    }
    assert_eq!(
        shadow_calls, STORM_BUDGET,
        "exactly the budget, and no more"
    );
    assert_eq!(
        router.state.inner.budgets.used("language"),
        STORM_BUDGET as u32
    );
    assert!(router.metric("surety_live_budget_exhausted_total").await >= 1.0);
    assert!(
        router
            .state
            .inner
            .store
            .demotions()
            .await
            .unwrap()
            .is_empty(),
        "the fallbacks keep the contract"
    );
}

/// Two replicas on one PostgreSQL database: a demotion that one decides,
/// the other honours at once (it reads the demotions at every decision),
/// and an admin's reinstate on the other is seen by the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_demotion_decided_by_one_replica_is_honoured_by_the_other_at_once() {
    let Some(db) = TestDb::new(surety_tests::Engine::Postgres).await else {
        return;
    };
    let (primary, fallback) = primary_and_a_fallback_that_breaks_on_real_inputs().await;
    let providers = [("fake-a", &primary), ("fake-b", &fallback)];
    let deciding = Router::certifying(&db, &providers, SHADOWED).await;
    let other = Router::certifying(&db, &providers, SHADOWED).await;
    let (_, _, job) = deciding
        .create(
            ACME,
            "replica-1",
            &detect("Hello, where is my parcel?"),
            Some(10),
        )
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(demoted(&deciding, "fake-b").await, "one replica demotes");
    // The other replica, at once: no metric of its own moved, yet it says so and acts on it.
    let (code, reason) = status(&other, "fake-b").await;
    assert_eq!(code, "demoted", "{reason}");
    assert!(reason.contains("schema at `/language`"), "{reason}");
    primary.set_script(Script::always(server_error()));
    let (_, _, failed) = other
        .create(
            ACME,
            "replica-2",
            &detect("Bonjour, où est mon colis ?"),
            Some(10),
        )
        .await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(providers_tried(&failed), ["fake-a"], "{failed}");
    assert_eq!(fallback.calls(), 1, "only the shadow call reached it");
    // An admin reinstates it on the other replica: the first sees it too.
    let path = "/v1/providers/fake-b/contracts/language-detect/reinstate";
    let body = json!({"reason": "the fallback's answers were checked by hand"});
    let (code, _, _) = other.post_json(ACME_ADMIN, path, Some(&body)).await;
    assert_eq!(code.as_u16(), 200);
    assert_eq!(status(&deciding, "fake-b").await.0, "certified");
}
