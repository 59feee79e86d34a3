//! Budgets through the router: an attempt's worst case reserved in the
//! transaction that records it, settled to what the provider reported,
//! held while the attempt is unknown, refused in each dialect.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Latency, Script, When};
use surety_tests::{Engine, TestDb};

use crate::harness::{ACME, ACME_ADMIN, GLOBEX, Router, detect, language_script, manifest, until};

const ROUTE: &str = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n";
const TEXT: &str = "Bonjour, je voudrais réserver une table pour deux ce soir.";
const ENGLISH: &str = r#"{"language": "english"}"#;
const WAIT: Duration = Duration::from_secs(20);

fn gated() -> Behavior {
    Behavior::Gated(Box::new(Behavior::Reply(ENGLISH.to_owned())))
}

/// A router with one route to `fake`, certified, with `budgets` (TOML).
async fn with_budgets(db: &TestDb, fake: &FakeProvider, budgets: &str, server: &str) -> Router {
    Router::start(
        db,
        &[("fake-a", fake)],
        &format!("{ROUTE}{budgets}"),
        &manifest(&[("fake-a", fake, "language-detect")]),
        server,
    )
    .await
}

/// `[[budgets]]` of `limit` tokens a day for `who` (`owner = "acme"`, `key = "acme-app"`).
fn tokens(name: &str, who: &str, limit: i64) -> String {
    format!(
        "[[budgets]]\nname = \"{name}\"\n{who}\nlimit = {limit}\nunit = \"tokens\"\nperiod = \"day\"\n"
    )
}

/// The caller's budget `name` as `GET /v1/budget` shows it.
async fn budget(router: &Router, key: &str, name: &str) -> Value {
    let (status, list) = router.get(key, "/v1/budget").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    list["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no budget {name}: {list}"))
}

/// What one language-detect job of [`TEXT`] reserves at the fake: its
/// worst case, as the router counts it (measured through a router whose
/// budget only records, while the provider holds the call).
async fn worst_case(db: &TestDb) -> i64 {
    let fake = FakeProvider::start(Script::always(gated())).await.unwrap();
    let router = with_budgets(
        db,
        &fake,
        &format!(
            "{}at_limit = \"record\"\n",
            tokens("measure", "owner = \"globex\"", 0)
        ),
        "",
    )
    .await;
    let (status, _, job) = router
        .create(GLOBEX, "measure-1", &detect(TEXT), None)
        .await;
    assert!(status.is_success(), "{job}");
    // Reserved with the attempt, before the answer to the request.
    let reserved = budget(&router, GLOBEX, "measure").await["reserved"]
        .as_f64()
        .unwrap() as i64;
    assert!(reserved > 0);
    let mut settled = router.state.inner.settled.subscribe();
    fake.open_gate();
    tokio::time::timeout(WAIT, settled.recv())
        .await
        .unwrap()
        .unwrap();
    reserved
}

/// Must show 1: 200 jobs at once, each of which may cost at most a tenth of
/// the owner's budget: exactly 10 are admitted and called, 190 refused
/// naming the budget, and the spend never passes the limit. On PostgreSQL
/// the jobs go through two routers sharing the database (two replicas).
pub async fn two_hundred_jobs_at_once_admit_ten_and_call_ten(db: &TestDb) {
    let worst = worst_case(db).await;
    let limit = 10 * worst + worst / 2;
    let fake = FakeProvider::start(Script::always(gated())).await.unwrap();
    let budgets = tokens("acme-day", "owner = \"acme\"", limit);
    let routers = match db.engine {
        Engine::Postgres => vec![
            with_budgets(db, &fake, &budgets, "").await,
            with_budgets(db, &fake, &budgets, "").await,
        ],
        Engine::Sqlite => vec![with_budgets(db, &fake, &budgets, "").await],
    };
    let routers = std::sync::Arc::new(routers);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(200));
    let mut storm = tokio::task::JoinSet::new();
    for n in 0..200 {
        let (routers, barrier) = (routers.clone(), barrier.clone());
        storm.spawn(async move {
            let router = &routers[n % routers.len()];
            barrier.wait().await;
            let (status, headers, body) = router
                .create(ACME, &format!("storm-{n}"), &detect(TEXT), None)
                .await;
            (status, headers, body)
        });
    }
    let answers = storm.join_all().await;
    let admitted: Vec<&Value> = answers
        .iter()
        .filter(|(status, _, _)| status.is_success())
        .map(|(_, _, body)| body)
        .collect();
    let refused: Vec<&(StatusCode, reqwest::header::HeaderMap, Value)> = answers
        .iter()
        .filter(|(status, _, _)| *status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!((admitted.len(), refused.len()), (10, 190), "{answers:?}");
    for (_, headers, body) in &refused {
        assert_eq!(
            body["type"], "https://surety.dev/problems/over-budget",
            "{body}"
        );
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("budget `acme-day` of owner `acme`") && detail.contains("resets at"),
            "{detail}"
        );
        assert!(headers.get("retry-after").is_some(), "{headers:?}");
    }
    // Held, not yet spent: ten worst cases, within the limit.
    let now = budget(&routers[0], ACME, "acme-day").await;
    assert_eq!(
        now["reserved"].as_f64().unwrap() as i64,
        10 * worst,
        "{now}"
    );
    let mut settled = routers[0].state.inner.settled.subscribe();
    let mut others = routers.last().unwrap().state.inner.settled.subscribe();
    fake.open_gate();
    let mut done = std::collections::BTreeSet::new();
    tokio::time::timeout(WAIT, async {
        while done.len() < 10 {
            tokio::select! {
                Ok(id) = settled.recv() => { done.insert(id.0); }
                Ok(id) = others.recv() => { done.insert(id.0); }
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(
        fake.calls(),
        10,
        "one call per admitted job, none for a refused one"
    );
    let after = budget(&routers[0], ACME, "acme-day").await;
    let spent = after["spent"].as_f64().unwrap() as i64;
    assert!(spent > 0 && spent <= limit, "{after}");
    assert_eq!(after["reserved"], 0.0, "{after}");
    assert_eq!(
        routers[0].metric("surety_budget_refusals_total").await as usize
            + if routers.len() > 1 {
                routers[1].metric("surety_budget_refusals_total").await as usize
            } else {
                0
            },
        190
    );
}

/// Must show 2: an answer using fewer tokens than its worst case frees the
/// rest at once: a job refused while the first was held is admitted after
/// the first settles.
pub async fn a_settled_answer_frees_the_rest_for_the_next_job(db: &TestDb) {
    let worst = worst_case(db).await;
    let fake = FakeProvider::start(Script::always(gated())).await.unwrap();
    let router = with_budgets(
        db,
        &fake,
        &tokens("acme-day", "owner = \"acme\"", worst + worst / 2),
        "",
    )
    .await;
    let (status, _, first) = router.create(ACME, "first", &detect(TEXT), None).await;
    assert!(status.is_success(), "{first}");
    let (status, _, refused) = router.create(ACME, "second", &detect(TEXT), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    let mut settled = router.state.inner.settled.subscribe();
    fake.open_gate();
    tokio::time::timeout(WAIT, settled.recv())
        .await
        .unwrap()
        .unwrap();
    let now = budget(&router, ACME, "acme-day").await;
    let spent = now["spent"].as_f64().unwrap() as i64;
    assert!(
        spent > 0 && spent < worst,
        "settled to the usage reported: {now}"
    );
    assert_eq!(now["reserved"], 0.0, "{now}");
    // The refused key was never recorded: the same request now is a new job.
    let (status, _, second) = router.create(ACME, "second", &detect(TEXT), Some(20)).await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    assert_eq!(second["state"], "succeeded", "{second}");
    // A replay reserves nothing.
    let before = budget(&router, ACME, "acme-day").await;
    let (status, _, _) = router.create(ACME, "second", &detect(TEXT), Some(20)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(budget(&router, ACME, "acme-day").await, before);
}

/// Must show 3: an attempt that times out keeps its reservation while
/// unknown (shown as held by unknown attempts); its late result settles it
/// to the real usage. A definite failure frees it.
pub async fn an_unknown_attempt_holds_its_reservation_until_its_late_result(db: &TestDb) {
    let worst = worst_case(db).await;
    let late = Behavior::Reply(ENGLISH.to_owned());
    let fake = FakeProvider::start(Script::always(late.clone()).rule_with_latency(
        When::Always,
        late,
        Latency::FixedMs(1_500),
    ))
    .await
    .unwrap();
    let router = with_budgets(
        db,
        &fake,
        &tokens("acme-day", "owner = \"acme\"", 100 * worst),
        "attempt_timeout_ms = 300\n",
    )
    .await;
    let (status, _, job) = router.create(ACME, "slow", &detect(TEXT), Some(5)).await;
    assert!(status.is_success(), "{job}");
    assert_eq!(job["state"], "unknown", "{job}");
    let mut settled = router.state.inner.settled.subscribe();
    let held = budget(&router, ACME, "acme-day").await;
    assert_eq!(held["reserved"].as_f64().unwrap() as i64, worst, "{held}");
    assert_eq!(
        held["held_by_unknown"].as_f64().unwrap() as i64,
        worst,
        "{held}"
    );
    assert_eq!(held["spent"], 0.0, "{held}");
    // The late result settles the job, and the reservation to its usage.
    tokio::time::timeout(WAIT, settled.recv())
        .await
        .unwrap()
        .unwrap();
    let after = budget(&router, ACME, "acme-day").await;
    assert_eq!(after["reserved"], 0.0, "{after}");
    assert_eq!(after["held_by_unknown"], 0.0, "{after}");
    let spent = after["spent"].as_f64().unwrap() as i64;
    assert!(spent > 0 && spent < worst, "{after}");

    // A definite failure (a 400) frees what it held, spending nothing.
    let failing = FakeProvider::start(Script::always(Behavior::Status {
        status: 400,
        body: json!({"error": {"message": "bad request", "type": "invalid_request_error"}}),
        retry_after: None,
    }))
    .await
    .unwrap();
    let router = with_budgets(
        db,
        &failing,
        &tokens("globex-day", "owner = \"globex\"", 100 * worst),
        "",
    )
    .await;
    let (_, _, job) = router
        .create(GLOBEX, "fails", &detect(TEXT), Some(20))
        .await;
    assert_eq!(job["state"], "failed", "{job}");
    let after = budget(&router, GLOBEX, "globex-day").await;
    assert_eq!(
        (after["spent"].as_f64(), after["reserved"].as_f64()),
        (Some(0.0), Some(0.0)),
        "{after}"
    );
}

/// Must show 5: a key's budget counts inside its owner's: the key's spent,
/// its owner's other keys are still served; `/v1/budget` shows each key
/// its own and its owner's.
pub async fn a_keys_budget_spent_leaves_its_owners_other_keys_served(db: &TestDb) {
    let worst = worst_case(db).await;
    let fake = FakeProvider::start(Script::always(gated())).await.unwrap();
    let budgets = format!(
        "{}{}",
        tokens("acme-month", "owner = \"acme\"", 100 * worst),
        tokens("app-day", "key = \"acme-app\"", worst + worst / 2)
    );
    let router = with_budgets(db, &fake, &budgets, "").await;
    let mut settled = router.state.inner.settled.subscribe();
    let (status, _, job) = router.create(ACME, "k-1", &detect(TEXT), None).await;
    assert!(status.is_success(), "{job}");
    // The key's own budget holds the first job's worst case: what is left
    // is less than another.
    let (status, _, refused) = router.create(ACME, "k-2", &detect(TEXT), None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("budget `app-day` of key `acme-app`"),
        "{refused}"
    );
    // The owner's other key is served, from the owner's budget.
    let (status, _, other) = router.create(ACME_ADMIN, "k-3", &detect(TEXT), None).await;
    assert!(status.is_success(), "{other}");
    let owner = budget(&router, ACME_ADMIN, "acme-month").await;
    let key = budget(&router, ACME, "app-day").await;
    assert_eq!(
        owner["reserved"].as_f64().unwrap() as i64,
        2 * worst,
        "{owner}"
    );
    assert_eq!(key["reserved"].as_f64().unwrap() as i64, worst, "{key}");
    let (_, mine) = router.get(ACME, "/v1/budget").await;
    let names: Vec<&str> = mine["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["acme-month", "app-day"], "{mine}");
    let (_, admins) = router.get(ACME_ADMIN, "/v1/budget").await;
    assert_eq!(admins["budgets"].as_array().unwrap().len(), 1, "{admins}");
    fake.open_gate();
    for _ in 0..2 {
        tokio::time::timeout(WAIT, settled.recv())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(fake.calls(), 2);
}

const OVER_BUDGET_CLIENTS: &str = r#"
import json, os
import anthropic, openai

base, key = os.environ["BASE_URL"], os.environ["API_KEY"]
system, user = os.environ["SYSTEM_PROMPT"], os.environ["USER"]
seen = {}
chat = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=2)
try:
    chat.chat.completions.create(model="language", extra_headers={"Idempotency-Key": "b-1"},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
except openai.APIStatusError as e:
    seen["openai"] = {"class": type(e).__name__, "status": e.status_code, "code": e.code, "type": e.type, "message": e.message,
        "retry_after": e.response.headers.get("retry-after")}
try:
    chat.responses.create(model="language", instructions=system, input=user, extra_headers={"Idempotency-Key": "b-2"})
except openai.APIStatusError as e:
    seen["responses"] = {"class": type(e).__name__, "code": e.code}
claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=2)
try:
    claude.messages.create(model="language", max_tokens=int(os.environ["MAX_TOKENS"]), system=system,
        messages=[{"role": "user", "content": user}], extra_headers={"Idempotency-Key": "b-3"})
except anthropic.APIStatusError as e:
    seen["anthropic"] = {"class": type(e).__name__, "status": e.status_code, "type": e.body["error"]["type"], "message": e.body["error"]["message"]}
print(json.dumps(seen))
"#;

/// Must show 4: each facade refuses an over-budget job in its own dialect,
/// as its official SDK reads it: OpenAI's `RateLimitError` with
/// `insufficient_quota` (Chat Completions and Responses), Anthropic's
/// `RateLimitError` (`rate_limit_error`); none of them retried, none
/// reaching the provider.
pub async fn the_sdks_read_an_over_budget_job_in_their_own_dialects(db: &TestDb) {
    let Some(python) = crate::sdk::sdk_python() else {
        return;
    };
    let fake = FakeProvider::start(Script::always(Behavior::Reply(ENGLISH.to_owned())))
        .await
        .unwrap();
    let router = with_budgets(
        db,
        &fake,
        &tokens("globex-day", "owner = \"globex\"", 0),
        "",
    )
    .await;
    let language = crate::harness::contract("language-detect");
    let prompt = language.render(&json!({ "text": TEXT })).unwrap();
    let max_tokens = language.limits.max_output_tokens.to_string();
    let seen = crate::sdk::run_client(
        &python,
        OVER_BUDGET_CLIENTS,
        &[
            ("BASE_URL", &router.base),
            ("API_KEY", GLOBEX),
            ("SYSTEM_PROMPT", &prompt.system),
            ("USER", &prompt.user),
            ("MAX_TOKENS", &max_tokens),
        ],
    )
    .await;
    let openai = &seen["openai"];
    assert_eq!(openai["class"], "RateLimitError", "{seen}");
    assert_eq!(
        (openai["code"].as_str(), openai["type"].as_str()),
        (Some("insufficient_quota"), Some("insufficient_quota")),
        "{seen}"
    );
    assert!(
        openai["message"]
            .as_str()
            .unwrap()
            .contains("budget `globex-day`"),
        "{seen}"
    );
    assert!(openai["retry_after"].as_str().is_some(), "{seen}");
    assert_eq!(
        seen["responses"],
        json!({"class": "RateLimitError", "code": "insufficient_quota"}),
        "{seen}"
    );
    let claude = &seen["anthropic"];
    assert_eq!(
        (claude["class"].as_str(), claude["type"].as_str()),
        (Some("RateLimitError"), Some("rate_limit_error")),
        "{seen}"
    );
    assert!(
        claude["message"]
            .as_str()
            .unwrap()
            .contains("budget `globex-day`"),
        "{seen}"
    );
    assert_eq!(fake.calls(), 0, "nothing reached the provider");
    // Each refusal was one request: no SDK retried it.
    assert_eq!(router.metric("surety_budget_refusals_total").await, 3.0);
}

const SHADOWED: &str = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n\
     [routes.language.shadow]\nsampling = 1.0\nhourly_budget = 100\n";

/// A router shadowing every language job of fake-a at fake-b, with the
/// route's checks budget of `limit` tokens and acme's own budget.
async fn shadowed(db: &TestDb, limit: i64) -> (FakeProvider, FakeProvider, Router) {
    let (a, b) = (
        FakeProvider::start(language_script()).await.unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
    );
    let budgets = format!(
        "{}{}",
        tokens("language-checks", "route = \"language\"", limit),
        tokens("acme-day", "owner = \"acme\"", 1_000_000),
    );
    let router = Router::certifying(
        db,
        &[("fake-a", &a), ("fake-b", &b)],
        &format!("{SHADOWED}{budgets}"),
    )
    .await;
    (a, b, router)
}

/// The route's checks budget as the database holds it.
async fn checks_budget(router: &Router) -> surety_store::BudgetStatus {
    let store = &router.state.inner.store;
    store.budget("language-checks", 0).await.unwrap()
}

/// What `provider`'s answered job attempts reported using, in tokens.
fn used(router: &Router, provider: &str) -> i64 {
    let tokens = &router.state.inner.metrics.tokens;
    ["prompt", "completion"]
        .iter()
        .map(|kind| tokens.with_label_values(&[provider, kind]).get() as i64)
        .sum()
}

/// Build 4: a route's live checks spend the route's own budget, by the
/// attempts' reservation rule, and never the owner's: with no room the
/// shadow call is not made (and counted); with room its hold is settled to
/// the usage it reported, shown beside the live checks.
pub async fn a_routes_live_checks_spend_its_own_budget_never_an_owners(db: &TestDb) {
    // No room: the check is not asked.
    let (a, b, router) = shadowed(db, 0).await;
    let (status, _, job) = router
        .create(ACME, "shadow-1", &detect(TEXT), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{status} {job}");
    let skipped = &router.state.inner.metrics.live_budget_exhausted;
    assert!(until(async || skipped.with_label_values(&["language"]).get() == 1).await);
    assert_eq!(
        (a.calls(), b.calls()),
        (1, 0),
        "no shadow call without its reservation"
    );
    let checks = checks_budget(&router).await;
    assert_eq!((checks.spent, checks.held), (0, 0));
    let first = used(&router, "fake-a");
    drop(router);

    // Room: asked, and settled to what the call reported.
    let (_a, b, router) = shadowed(db, 1_000_000).await;
    let (_, _, job) = router
        .create(ACME, "shadow-2", &detect(TEXT), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let metrics = &router.state.inner.metrics;
    let kept = || {
        metrics
            .live_checks
            .with_label_values(&["fake-b", "language-detect", "shadow", "kept"])
            .get()
    };
    assert!(until(async || kept() == 1).await, "the shadow call is made");
    assert_eq!(b.calls(), 1);
    let checks = checks_budget(&router).await;
    let spent_by_checks = metrics
        .live_tokens
        .with_label_values(&["fake-b", "language-detect"])
        .get() as i64;
    assert!(spent_by_checks > 0);
    assert_eq!((checks.spent, checks.held), (spent_by_checks, 0));
    // The owner paid for its jobs' attempts and nothing of the checks.
    let owner = budget(&router, ACME, "acme-day").await;
    assert_eq!(
        owner["spent"].as_f64().unwrap() as i64,
        first + used(&router, "fake-a"),
        "{owner}"
    );
    // Beside the live checks, on the operator's page.
    let session = crate::operator::admin_session(&router).await;
    let (_, page) = crate::operator::page(
        &router,
        &session,
        "/ui/certification/fake-b/language-detect",
    )
    .await;
    let line = format!(
        "checks budget `language-checks`: {spent_by_checks} tokens spent and 0 tokens held of 1000000 tokens"
    );
    assert!(page.contains(&line), "{line}: {page}");
}
