//! The operator's pages over HTTP: who may sign in, what the cookie is,
//! what the attention queue and a job's page show, and that model output
//! and client input are shown as text.

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, LOCATION, SET_COOKIE};
use sha2::Digest;
use surety_fake_provider::{Behavior, FakeProvider, Script, When};
use surety_tests::TestDb;

use crate::harness::{ACME, ACME_ADMIN, GLOBEX, OPS, Router, detect};

/// A client that keeps nothing and follows no redirect: each test says
/// what it sends.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Signs in with `key` as a browser does: the sign-in page first, whose
/// form token and cookie go back with the key.
async fn sign_in(router: &Router, key: &str) -> (StatusCode, HeaderMap, String) {
    let form = client()
        .get(format!("{}/ui/sign-in", router.base))
        .send()
        .await
        .unwrap();
    let cookie = form.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let token = token_in(&form.text().await.unwrap());
    let response = client()
        .post(format!("{}/ui/sign-in", router.base))
        .header("cookie", cookie)
        .form(&[("key", key), ("csrf", &token)])
        .send()
        .await
        .unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.text().await.unwrap())
}

/// An admin's session cookie, as the browser would send it back.
pub(crate) async fn admin_session(router: &Router) -> String {
    session_of(router, ACME_ADMIN).await
}

/// The session cookie of `key`, signed in.
async fn session_of(router: &Router, key: &str) -> String {
    let (_, headers, _) = sign_in(router, key).await;
    session_cookie(&headers)
}

/// The session cookie a sign-in set, as the browser sends it back.
fn session_cookie(headers: &HeaderMap) -> String {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .find(|c| c.starts_with("surety_operator="))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

/// The CSRF token of the first form of a page that carries one in `main`,
/// or of its header's sign-out form.
fn token_in(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned()
}

/// The certification matrix's row of `provider`.
pub(crate) fn matrix_row(matrix: &str, provider: &str) -> String {
    matrix
        .split("<tr>")
        .find(|r| r.contains(&format!("<td>{provider}</td>")))
        .unwrap_or_else(|| panic!("no row for {provider}: {matrix}"))
        .to_owned()
}

/// `path` with the session cookie `cookie`.
pub(crate) async fn page(router: &Router, cookie: &str, path: &str) -> (StatusCode, String) {
    let response = client()
        .get(format!("{}{path}", router.base))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

pub async fn only_admins_sign_in_and_a_session_not_the_key_is_in_a_strict_http_only_cookie(
    db: &TestDb,
) {
    let (_fake, router) = Router::behaving(db, Behavior::Hang, "").await;
    let (status, _, body) = sign_in(&router, ACME).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("not an admin key"), "{body}");
    let (status, _, body) = sign_in(&router, "key-nobody").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) = page(&router, "", "/ui").await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "no cookie: to the sign-in page"
    );

    let (status, headers, _) = sign_in(&router, ACME_ADMIN).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[LOCATION], "/ui");
    let cookie = headers
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .find(|c| c.starts_with("surety_operator="))
        .unwrap();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=28800"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    let session = session_cookie(&headers);
    // The cookie is a session, not the key: nothing in it decodes to the
    // key or its hash.
    let value = session.trim_start_matches("surety_operator=");
    let decoded = String::from_utf8_lossy(&hex::decode(value).unwrap()).into_owned();
    let key_hash = hex::encode(sha2::Sha256::digest(ACME_ADMIN.as_bytes()));
    for form in [value, decoded.as_str()] {
        assert!(
            !form.contains(ACME_ADMIN) && !form.contains(&key_hash),
            "{session}"
        );
    }
    let bearer = router
        .client
        .get(format!(
            "{}/v1/jobs/00000000-0000-7000-8000-000000000000",
            router.base
        ))
        .bearer_auth(value)
        .send()
        .await
        .unwrap();
    assert_eq!(
        bearer.status(),
        StatusCode::UNAUTHORIZED,
        "the cookie is no API key"
    );
    let (status, body) = page(&router, &session, "/ui").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("Needs attention"), "{body}");

    // Signing out needs the page's token: a form from elsewhere is refused.
    let token = token_in(&body);
    let out = |csrf: &str| {
        client()
            .post(format!("{}/ui/sign-out", router.base))
            .header("cookie", &session)
            .form(&[("csrf", csrf)])
            .send()
    };
    assert_eq!(out("forged").await.unwrap().status(), StatusCode::FORBIDDEN);
    let signed_out = out(&token).await.unwrap();
    assert_eq!(signed_out.status(), StatusCode::SEE_OTHER);
    assert!(
        signed_out.headers()[SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    // A copy of the cookie opens nothing once signed out.
    let (status, _) = page(&router, &session, "/ui").await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "the session ended at sign-out"
    );
}

/// A session expires; another session's CSRF token is refused like a
/// forged one; a sign-in that did not come from the sign-in page (no form
/// token, or another's) is refused; every page says how to be handled.
pub async fn sessions_expire_and_tokens_belong_to_their_session(db: &TestDb) {
    let (fake, router) = Router::behaving(db, Behavior::Hang, "operator_session_ms = 300\n").await;
    let first = admin_session(&router).await;
    let (status, body) = page(&router, &first, "/ui").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Waiting for the clock itself: the session's 300 ms pass.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (status, _) = page(&router, &first, "/ui").await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "an expired session opens nothing"
    );

    let router = Router::one_route(db, &fake, "").await;
    let (a, b) = (admin_session(&router).await, admin_session(&router).await);
    let (_, page_b) = page(&router, &b, "/ui").await;
    let token_b = token_in(&page_b);
    let (_, page_a) = page(&router, &a, "/ui").await;
    assert_ne!(token_in(&page_a), token_b, "a token per session");
    let sign_out = |cookie: String, csrf: String| {
        client()
            .post(format!("{}/ui/sign-out", router.base))
            .header("cookie", cookie)
            .form(&[("csrf", csrf)])
            .send()
    };
    let refused = sign_out(a.clone(), token_b).await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::FORBIDDEN,
        "B's token in A's session"
    );
    let (status, _) = page(&router, &a, "/ui").await;
    assert_eq!(status, StatusCode::OK, "and A's session goes on");

    // A sign-in form from elsewhere: no form token, or one without its cookie.
    for (cookie, csrf) in [("", ""), ("", "made-up"), ("surety_sign_in=one", "two")] {
        let response = client()
            .post(format!("{}/ui/sign-in", router.base))
            .header("cookie", cookie)
            .form(&[("key", ACME_ADMIN), ("csrf", csrf)])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{cookie} {csrf}");
        assert!(
            response
                .headers()
                .get_all(SET_COOKIE)
                .iter()
                .all(|c| !c.to_str().unwrap().starts_with("surety_operator=")),
            "no session"
        );
    }
    let form = client()
        .get(format!("{}/ui/sign-in", router.base))
        .send()
        .await
        .unwrap();
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("x-frame-options", "DENY"),
    ] {
        assert_eq!(form.headers()[name], value, "{name}");
    }
    assert!(form.text().await.unwrap().contains("name=\"csrf\""));
}

pub async fn the_queue_lists_this_owners_unknown_jobs_and_shows_input_as_text(db: &TestDb) {
    let fake = FakeProvider::start(Script::always(Behavior::Hang).rule(
        When::PromptContains("fine".to_owned()),
        Behavior::Reply(r#"{"language": "english"}"#.to_owned()),
    ))
    .await
    .unwrap();
    let router = Router::one_route(db, &fake, "attempt_timeout_ms = 300\n").await;
    let hostile = "<script>document.body.dataset.pwned = 'yes'</script> hello";
    let (_, _, mine) = router.create(ACME, "op-1", &detect(hostile), Some(5)).await;
    assert_eq!(mine["state"], "unknown", "{mine}");
    let (_, _, theirs) = router
        .create(GLOBEX, "op-2", &detect("hello"), Some(5))
        .await;
    assert_eq!(theirs["state"], "unknown", "{theirs}");
    let (_, _, fine) = router.create(ACME, "op-3", &detect("fine"), Some(5)).await;
    assert_eq!(fine["state"], "succeeded", "{fine}");

    let session = admin_session(&router).await;
    let (status, queue) = page(&router, &session, "/ui").await;
    assert_eq!(status, StatusCode::OK);
    let mine = mine["id"].as_str().unwrap();
    assert!(queue.contains(mine), "{queue}");
    assert!(
        queue.contains("no answer within 0.3 s"),
        "what is known: {queue}"
    );
    assert!(
        !queue.contains(theirs["id"].as_str().unwrap()),
        "another owner's job is listed"
    );
    assert!(
        !queue.contains(fine["id"].as_str().unwrap()),
        "a succeeded job needs no one"
    );

    let (status, job) = page(&router, &session, &format!("/ui/jobs/{mine}")).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert!(job.contains("fake-a") && job.contains("unknown"), "{job}");
    assert!(!job.contains("<script>"), "input is shown as text: {job}");
    assert!(
        job.contains("&lt;script&gt;document.body.dataset.pwned"),
        "{job}"
    );
    let (status, _) = page(
        &router,
        &session,
        &format!("/ui/jobs/{}", theirs["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another owner's job is not shown"
    );

    let (status, matrix) = page(&router, &session, "/ui/certification").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        matrix.contains("language") && matrix.contains("certified"),
        "{matrix}"
    );
}

pub async fn an_unknown_job_is_cancelled_with_confirmation_then_retried_to_success(db: &TestDb) {
    let (fake, router) = Router::behaving(db, Behavior::Hang, "attempt_timeout_ms = 300\n").await;
    let (_, _, job) = router
        .create(ACME, "act-1", &detect("Hello there"), Some(5))
        .await;
    assert_eq!(job["state"], "unknown", "{job}");
    let id = job["id"].as_str().unwrap();
    let session = admin_session(&router).await;
    let (_, job_page) = page(&router, &session, &format!("/ui/jobs/{id}")).await;
    let cancel = format!("/ui/jobs/{id}/attempts/1/cancel");
    assert!(
        job_page.contains(&cancel),
        "the open attempt offers a cancel: {job_page}"
    );
    // The link asks first; the form carries the session's token.
    let (status, ask) = page(&router, &session, &cancel).await;
    assert_eq!(status, StatusCode::OK);
    assert!(ask.contains("may have done the work"), "{ask}");
    let token = token_in(&ask);
    let post = |path: String, csrf: String| {
        client()
            .post(format!("{}{path}", router.base))
            .header("cookie", &session)
            .form(&[("csrf", csrf), ("confirm", "yes".to_owned())])
            .send()
    };
    let forged = post(cancel.clone(), "forged".to_owned()).await.unwrap();
    assert_eq!(
        forged.status(),
        StatusCode::FORBIDDEN,
        "no token, no action"
    );
    let (_, still) = router.get(ACME, &format!("/v1/jobs/{id}")).await;
    assert_eq!(
        still["attempts"][0]["state"], "unknown",
        "a refused action changes nothing"
    );

    let cancelled = post(cancel, token.clone()).await.unwrap();
    assert_eq!(cancelled.status(), StatusCode::SEE_OTHER);
    let (_, job_page) = page(&router, &session, &format!("/ui/jobs/{id}")).await;
    assert!(job_page.contains("cancelled"), "{job_page}");
    assert!(
        job_page.contains(&format!("/ui/jobs/{id}/retry")),
        "then it may be retried: {job_page}"
    );

    fake.set_script(Script::always(Behavior::Reply(
        r#"{"language": "english"}"#.to_owned(),
    )));
    let mut settled = router.state.inner.settled.subscribe();
    let retried = post(format!("/ui/jobs/{id}/retry"), token).await.unwrap();
    assert_eq!(retried.status(), StatusCode::SEE_OTHER);
    tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while settled.recv().await.unwrap().0 != id {}
    })
    .await
    .unwrap();
    let (_, job_page) = page(&router, &session, &format!("/ui/jobs/{id}")).await;
    assert!(job_page.contains("state succeeded"), "{job_page}");
    assert!(job_page.contains("english"), "the answer: {job_page}");
}

/// The pages in Debian's chromium (Playwright, `tests/data/operator/drive.py`):
/// a user key is refused; an admin signs in, sees this owner's unknown and
/// failed jobs and not another owner's; an answer carrying markup is shown
/// as text and nothing of it runs; the unknown job's attempt is cancelled
/// through the confirmation (a form without the token is refused), the job
/// retried and seen `succeeded`; reading works with JavaScript off.
/// Screenshots go to `target/operator/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_pages_in_a_real_browser() {
    let (Some(python), Some(chromium)) = (
        surety_tests::require("SURETY_OPENAI_SDK_PYTHON", "Playwright"),
        surety_tests::require("SURETY_CHROMIUM", "chromium"),
    ) else {
        return;
    };
    let db = TestDb::new(surety_tests::Engine::Sqlite).await.unwrap();
    let english = Behavior::Reply(r#"{"language": "english"}"#.to_owned());
    let markup = r#"{"language": "<img src=x onerror=\"document.body.dataset.pwned='yes'\"><script>document.body.dataset.pwned='yes'</script>"}"#;
    let fake = FakeProvider::start(
        Script::always(Behavior::Hang)
            .rule(
                When::PromptContains("Hello there".to_owned()),
                Behavior::Sequence(vec![Behavior::Hang, english]),
            )
            .rule(
                When::PromptContains("markup".to_owned()),
                Behavior::Reply(markup.to_owned()),
            ),
    )
    .await
    .unwrap();
    // A second route's provider, which the router's own checks demoted
    // (its live result's words carry markup, as a model's answer may).
    let demoted = FakeProvider::start(Script::always(Behavior::Hang))
        .await
        .unwrap();
    let routes = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n\
         [routes.backup]\ncontract = \"language-detect\"\nproviders = [\"fake-b\"]\n";
    let certified = crate::harness::manifest(&[
        ("fake-a", &fake, "language-detect"),
        ("fake-b", &demoted, "language-detect"),
    ]);
    let providers = [("fake-a", &fake), ("fake-b", &demoted)];
    let router = Router::start(
        &db,
        &providers,
        routes,
        &certified,
        "attempt_timeout_ms = 300\n",
    )
    .await;
    let found = format!("schema at `/language`: {markup} is not one of the candidates");
    let broke = surety_store::LiveResult {
        provider: "fake-b".into(),
        contract: "language-detect".into(),
        route: "backup".into(),
        source: surety_store::LiveSource::Shadow,
        outcome: surety_store::LiveOutcome::Broke,
        detail: found.clone(),
        job_id: None,
        case_name: None,
        input: serde_json::json!({"text": "Hello"}),
        expected: None,
        answer: None,
        at_ms: 0,
    };
    let store = &router.state.inner.store;
    store.record_live(&broke).await.unwrap();
    let why = format!("demoted: 1 of the last 1 live checks broke the contract — {found}");
    assert!(
        store
            .demote("fake-b", "language-detect", &why)
            .await
            .unwrap()
    );
    let (_, _, unknown) = router
        .create(ACME, "b-1", &detect("Hello there"), Some(5))
        .await;
    assert_eq!(unknown["state"], "unknown", "{unknown}");
    let (_, _, failed) = router
        .create(ACME, "b-2", &detect("markup please"), Some(5))
        .await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let (_, _, other) = router
        .create(GLOBEX, "b-3", &detect("Hello there"), Some(5))
        .await;
    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/operator");
    std::fs::create_dir_all(&shots).unwrap();
    let id = |job: &serde_json::Value| job["id"].as_str().unwrap().to_owned();
    let output = tokio::process::Command::new(python)
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/operator/drive.py"))
        .env("BASE_URL", &router.base)
        .env("CHROMIUM", chromium)
        .env("ADMIN_KEY", ACME_ADMIN)
        .env("USER_KEY", ACME)
        .env("UNKNOWN_JOB", id(&unknown))
        .env("FAILED_JOB", id(&failed))
        .env("OTHER_JOB", id(&other))
        .env("SHOTS", &shots)
        .output()
        .await;
    let printed = surety_tests::printed(output, "the browser script");
    let seen: serde_json::Value = serde_json::from_str(&printed).unwrap();
    assert!(
        seen["user_refused"]
            .as_str()
            .unwrap()
            .contains("not an admin key"),
        "{seen}"
    );
    assert_eq!(seen["queue_unknown"], 1, "{seen}");
    assert_eq!(seen["queue_failed"], 1, "{seen}");
    assert_eq!(
        seen["queue_other_owner"], 0,
        "another owner's job is listed: {seen}"
    );
    let nothing_ran = serde_json::json!({"scripts": 0, "images": 0, "pwned": ""});
    assert_eq!(seen["queue_injected"], nothing_ran, "{seen}");
    assert_eq!(seen["failed_injected"], nothing_ran, "{seen}");
    assert!(
        seen["failed_error"].as_str().unwrap().contains("<script>"),
        "the answer's words, as text: {seen}"
    );
    assert_eq!(seen["job_state"], "unknown");
    assert!(
        seen["confirm_title"]
            .as_str()
            .unwrap()
            .starts_with("Cancel attempt 1"),
        "{seen}"
    );
    assert_eq!(seen["forged_status"], 403, "{seen}");
    assert!(
        seen["after_cancel"].as_str().unwrap().contains("cancelled"),
        "{seen}"
    );
    assert_eq!(seen["after_retry"], "succeeded", "{seen}");
    assert!(
        seen["answer"].as_str().unwrap().contains("english"),
        "{seen}"
    );
    assert!(
        seen["matrix"].as_str().unwrap().contains("certified"),
        "{seen}"
    );
    assert_eq!(seen["no_js_state"], "succeeded", "{seen}");
    assert!(shots.join("queue.png").is_file() && shots.join("job.png").is_file());
    // The demoted provider: on the matrix, its live results as text, and
    // a reinstate behind a confirmation that needs the token and a reason.
    let text = |key: &str| seen[key].as_str().unwrap().to_owned();
    assert!(
        text("matrix_demoted").contains("demoted") && text("matrix_demoted").contains("1 broke"),
        "{seen}"
    );
    assert!(text("live_results").contains("<script>"), "as text: {seen}");
    assert_eq!(seen["live_injected"], nothing_ran, "{seen}");
    assert_eq!(
        text("reinstate_title"),
        "Reinstate fake-b for language-detect?"
    );
    assert_eq!(seen["reinstate_forged_status"], 403, "{seen}");
    assert!(
        text("reinstate_without_reason").ends_with("/reinstate"),
        "the browser asks for a reason: {seen}"
    );
    assert_eq!(text("after_reinstate"), "certified", "{seen}");
    assert!(store.demotions().await.unwrap().is_empty());
    assert!(shots.join("live.png").is_file());
}

pub async fn the_certification_matrix_says_why_a_provider_is_not_eligible(db: &TestDb) {
    let fakes = [
        FakeProvider::start(Script::always(Behavior::Hang))
            .await
            .unwrap(),
        FakeProvider::start(Script::always(Behavior::Hang))
            .await
            .unwrap(),
        FakeProvider::start(Script::always(Behavior::Hang))
            .await
            .unwrap(),
        FakeProvider::start(Script::always(Behavior::Hang))
            .await
            .unwrap(),
    ];
    let elsewhere = FakeProvider::start(Script::always(Behavior::Hang))
        .await
        .unwrap();
    let ids = ["stale", "expired", "moved", "good"];
    let providers: Vec<(&str, &FakeProvider)> = ids.iter().copied().zip(fakes.iter()).collect();
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"stale\", \"expired\", \"moved\", \"good\"]\n";
    // `moved` was certified at another URL than the one configured now.
    let mut m = crate::harness::manifest(&[
        ("stale", &fakes[0], "language-detect"),
        ("expired", &fakes[1], "language-detect"),
        ("moved", &elsewhere, "language-detect"),
        ("good", &fakes[3], "language-detect"),
    ]);
    m.entries[0].contract_digest = "sha256:an-older-contract".into();
    m.entries[1].expires_at =
        surety_manifest::now_rfc3339(time::OffsetDateTime::now_utc() - time::Duration::hours(1));
    let router = Router::start(db, &providers, route, &m, "").await;
    let session = admin_session(&router).await;
    let (status, matrix) = page(&router, &session, "/ui/certification").await;
    assert_eq!(status, StatusCode::OK);
    let row = |provider: &str| matrix_row(&matrix, provider);
    for (provider, status, why) in [
        ("stale", "stale", "contract"),
        ("expired", "expired", "expired at"),
        ("moved", "provider_changed", "base_url"),
        ("good", "certified", "certified"),
    ] {
        let row = row(provider);
        assert!(row.contains(&format!("class=\"state {status}\"")), "{row}");
        assert!(row.contains(why), "the reason says {why}: {row}");
    }
    assert!(matrix.contains("Manifest generated at"), "{matrix}");
}

pub async fn an_operator_of_every_owner_sees_and_acts_on_every_owners_jobs(db: &TestDb) {
    let (_fake, router) = Router::behaving(db, Behavior::Hang, "attempt_timeout_ms = 300\n").await;
    let (_, _, mine) = router
        .create(ACME, "all-1", &detect("hello"), Some(5))
        .await;
    let (_, _, theirs) = router
        .create(GLOBEX, "all-2", &detect("hello"), Some(5))
        .await;
    let id = |job: &serde_json::Value| job["id"].as_str().unwrap().to_owned();
    let session = session_of(&router, OPS).await;
    let (status, queue) = page(&router, &session, "/ui").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        queue.contains(&id(&mine)) && queue.contains(&id(&theirs)),
        "{queue}"
    );
    assert!(queue.contains("every owner"), "{queue}");
    // The figures: jobs by state, attempts by provider and outcome.
    let by_state = queue.split("id=\"by-state\"").nth(1).unwrap();
    assert!(by_state.contains("unknown</span></td><td>2"), "{by_state}");
    let attempts = queue.split("id=\"attempts\"").nth(1).unwrap();
    assert!(
        attempts.contains("<td>fake-a</td><td>unknown</td><td>2</td>"),
        "{attempts}"
    );
    // Another owner's job opens, and its attempt can be cancelled.
    let (status, job) = page(&router, &session, &format!("/ui/jobs/{}", id(&theirs))).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    let cancel = format!("/ui/jobs/{}/attempts/1/cancel", id(&theirs));
    let (_, ask) = page(&router, &session, &cancel).await;
    let done = client()
        .post(format!("{}{cancel}", router.base))
        .header("cookie", &session)
        .form(&[("csrf", token_in(&ask))])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let (_, after) = router
        .get(GLOBEX, &format!("/v1/jobs/{}", id(&theirs)))
        .await;
    assert_eq!(after["attempts"][0]["state"], "cancelled", "{after}");
    // An admin of one owner still sees only that owner's.
    let (_, acme_queue) = page(&router, &admin_session(&router).await, "/ui").await;
    assert!(!acme_queue.contains(&id(&theirs)), "{acme_queue}");
}

/// One operator page as the browser gets it: the certification matrix of
/// a router with one certified provider, snapshotted (tokens, times and
/// ports redacted).
#[tokio::test]
async fn the_certification_page_reads_as_snapshotted() {
    let db = TestDb::new(surety_tests::Engine::Sqlite).await.unwrap();
    let (_fake, router) = Router::answering_english(&db, "").await;
    let session = admin_session(&router).await;
    let (status, body) = page(&router, &session, "/ui/certification").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    surety_tests::surety_snapshot!("certification-page.html", body);
}

/// A fallback that real traffic found breaking the contract: the matrix
/// shows it demoted with the reason, what its live checks found and cost,
/// and a way to reinstate it; its page lists the live results; the
/// reinstate asks first, needs the session's token and a reason, and is
/// recorded with who and why.
pub async fn a_demoted_provider_shows_its_live_results_and_is_reinstated_behind_a_confirmation(
    db: &TestDb,
) {
    let primary = FakeProvider::start(crate::harness::language_script())
        .await
        .unwrap();
    let breaks = Behavior::Reply(r#"{"language": "Englisch"}"#.to_owned());
    let fallback = FakeProvider::start(crate::harness::language_script_else(breaks))
        .await
        .unwrap();
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n\
         [routes.language.shadow]\nsampling = 1.0\nhourly_budget = 100\n";
    let providers = [("fake-a", &primary), ("fake-b", &fallback)];
    let router = Router::certifying(db, &providers, route).await;
    let (_, _, job) = router
        .create(ACME, "shown-1", &detect("Where is my parcel?"), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let store = &router.state.inner.store;
    assert!(
        crate::harness::until(async || !store.demotions().await.unwrap().is_empty()).await,
        "the shadow call demotes the fallback"
    );
    let session = admin_session(&router).await;
    let (_, matrix) = page(&router, &session, "/ui/certification").await;
    let row = |provider: &str| matrix_row(&matrix, provider);
    // As the browser reads it: minijinja escapes `/`, `'` and `"` too.
    let demoted = row("fake-b")
        .replace("&#x2f;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"");
    let live = "/ui/certification/fake-b/language-detect";
    for shown in [
        "class=\"state demoted\"",
        "1 of the last 1 live checks broke the contract",
        "1 broke of the last 1 live checks",
        "calls: 1, tokens: ",
        "budget: 1 of the route's 100 calls this hour (1 %)",
        "schema at `/language`: \"Englisch\" is not one of",
        &format!("href=\"{live}/reinstate\""),
    ] {
        assert!(demoted.contains(shown), "{shown}: {demoted}");
    }
    let kept = row("fake-a");
    assert!(kept.contains("class=\"state certified\""), "{kept}");
    assert!(
        kept.contains("no live checks yet") && !kept.contains("Reinstate"),
        "{kept}"
    );
    // Its page: the live results, and the reinstate.
    let (status, results) = page(&router, &session, live).await;
    assert_eq!(status, StatusCode::OK, "{results}");
    let job_id = job["id"].as_str().unwrap();
    for shown in [
        "shadow",
        "state broke",
        &format!("job {job_id}"),
        "Englisch",
    ] {
        assert!(results.contains(shown), "{shown}: {results}");
    }
    let reinstate = format!("{live}/reinstate");
    let (status, ask) = page(&router, &session, &reinstate).await;
    assert_eq!(status, StatusCode::OK, "{ask}");
    assert!(
        ask.contains("Reinstate fake-b for language-detect?"),
        "{ask}"
    );
    assert!(ask.contains("name=\"reason\""), "{ask}");
    let token = token_in(&ask);
    let post = |csrf: &str, reason: &str| {
        client()
            .post(format!("{}{reinstate}", router.base))
            .header("cookie", &session)
            .form(&[("csrf", csrf), ("reason", reason), ("confirm", "yes")])
            .send()
    };
    let forged = post("forged", "trust me").await.unwrap();
    assert_eq!(
        forged.status(),
        StatusCode::FORBIDDEN,
        "no token, no reinstate"
    );
    let unexplained = post(&token, "  ").await.unwrap();
    assert_eq!(unexplained.status(), StatusCode::CONFLICT);
    assert!(
        unexplained
            .text()
            .await
            .unwrap()
            .contains("`reason` says why")
    );
    assert_eq!(store.demotions().await.unwrap().len(), 1, "nothing changed");
    let done = post(&token, "checked its answers by hand").await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(done.headers()[LOCATION], live);
    assert!(store.demotions().await.unwrap().is_empty(), "reinstated");
    let (_, results) = page(&router, &session, live).await;
    assert!(results.contains("class=\"state certified\""), "{results}");
    let (by, why): (String, String) =
        sqlx::query_as("SELECT lifted_by, lift_reason FROM demotions")
            .fetch_one(&db.raw)
            .await
            .unwrap();
    assert_eq!(by, "an admin of acme, on the operator pages");
    assert_eq!(why, "checked its answers by hand");
    // Only what the configuration names: anything else is not found.
    for path in [
        "/ui/certification/nobody/language-detect",
        "/ui/certification/fake-b/no-contract/reinstate",
        "/ui/certification/fake-b%2F..%2Fx/language-detect/reinstate",
    ] {
        let (status, _) = page(&router, &session, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
    // The budget's share, per provider, in the metrics.
    let metrics = router.metrics().await;
    assert!(
        metrics.contains("surety_live_budget_share{provider=\"fake-b\",route=\"language\"} 0.01"),
        "{metrics}"
    );
}

/// A tool-call job's page shows the tool it called and its arguments, as text.
pub async fn a_tool_call_jobs_page_shows_the_tool_and_its_arguments(db: &TestDb) {
    let fake = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    let router = crate::tools::support_router(db, &[("claude", "anthropic", &fake)]).await;
    let contract = crate::harness::contract("support-action");
    let case = contract
        .cases
        .iter()
        .find(|c| c.name == "lawyer-letter")
        .unwrap();
    let body = serde_json::json!({"route": "support", "input": case.input});
    let (_, _, job) = router.create(ACME, "page-tool-1", &body, Some(10)).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        job["result"]["tool"], "escalate",
        "the canonical answer: {job}"
    );
    let session = admin_session(&router).await;
    let id = job["id"].as_str().unwrap();
    let (status, shown) = page(&router, &session, &format!("/ui/jobs/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        shown.contains("Tool call: <strong>escalate</strong>"),
        "{shown}"
    );
    assert!(
        shown.contains("&quot;queue&quot;: &quot;legal&quot;"),
        "the arguments, as text: {shown}"
    );
}
