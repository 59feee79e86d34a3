//! The router's scenarios, engine-neutral.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use surety_fake_provider::{Behavior, FakeProvider, Latency, Script, When};
use surety_tests::TestDb;

use crate::harness::{
    ACME, ACME_ADMIN, GLOBEX, Router, answering_after, detect, language_script, manifest,
    providers_tried,
};

const LANGUAGE: &str =
    "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n";
const WAIT: Duration = Duration::from_secs(20);

pub async fn double_click_gets_one_job_and_one_provider_call(db: &TestDb) {
    let fake = FakeProvider::start(language_script().rule_with_latency(
        When::Always,
        Behavior::Reply(json!({"language": "french"}).to_string()),
        Latency::FixedMs(200),
    ))
    .await
    .unwrap();
    let other = FakeProvider::start(language_script()).await.unwrap();
    let router = std::sync::Arc::new(
        Router::start(
            db,
            &[("fake-a", &fake), ("fake-b", &other)],
            LANGUAGE,
            &manifest(&[
                ("fake-a", &fake, "language-detect"),
                ("fake-b", &other, "language-detect"),
            ]),
            "",
        )
        .await,
    );
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let mut clicks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (router, barrier) = (router.clone(), barrier.clone());
        clicks.spawn(async move {
            barrier.wait().await;
            router
                .create(
                    ACME,
                    "checkout-7",
                    &detect("Bonjour, je n'arrive pas à télécharger ma facture en PDF."),
                    None,
                )
                .await
        });
    }
    let answers = clicks.join_all().await;
    let ids: std::collections::BTreeSet<String> = answers
        .iter()
        .map(|(_, _, body)| body["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1, "one job id in every answer");
    assert_eq!(
        answers
            .iter()
            .filter(|(s, _, _)| *s == StatusCode::CREATED)
            .count(),
        1
    );
    for (status, headers, _) in answers.iter().filter(|(s, _, _)| *s != StatusCode::CREATED) {
        assert_eq!(*status, StatusCode::OK);
        assert_eq!(headers["idempotent-replayed"], "true");
    }
    let (status, _, job) = router
        .create(
            ACME,
            "checkout-7",
            &detect("Bonjour, je n'arrive pas à télécharger ma facture en PDF."),
            Some(10),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], json!({"language": "french"}));
    assert_eq!(fake.calls() + other.calls(), 1, "the provider saw one call");
    assert_eq!(router.metric("surety_jobs_created_total").await, 1.0);
    assert_eq!(router.metric("surety_job_replays_total").await, 50.0);
}

pub async fn same_key_different_input_is_a_conflict(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::start(
        db,
        &[("fake-a", &fake), ("fake-b", &fake)],
        LANGUAGE,
        &manifest(&[("fake-a", &fake, "language-detect")]),
        "",
    )
    .await;
    let (status, _, first) = router
        .create(ACME, "k-1", &detect("Guten Tag"), Some(10))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let response = router
        .client
        .post(format!("{}/v1/jobs", router.base))
        .bearer_auth(ACME)
        .header("Idempotency-Key", "k-1")
        .json(&detect("Hola"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        problem["type"],
        "https://surety.dev/problems/idempotency-conflict"
    );
    assert_eq!(problem["status"], 409);
    let (_, job) = router
        .get(ACME, &format!("/v1/jobs/{}", first["id"].as_str().unwrap()))
        .await;
    assert_eq!(job, first, "the job is unchanged");
    assert_eq!(fake.calls(), 1);
}

pub async fn timeout_is_unknown_and_retry_waits_for_an_out_of_band_cancel(db: &TestDb) {
    let slow = FakeProvider::start(Script::always(Behavior::Hang))
        .await
        .unwrap();
    let router = Router::one_route(db, &slow, "attempt_timeout_ms = 300").await;
    let (status, _, job) = router
        .create(ACME, "t-1", &detect("Hello there"), Some(10))
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a new job, at rest once unknown: {job}"
    );
    assert_eq!(
        job["state"], "unknown",
        "a timeout is unknown, not failed: {job}"
    );
    assert_eq!(job["attempts"][0]["state"], "unknown");
    let id = job["id"].as_str().unwrap().to_owned();

    let (status, _, problem) = router.post(ACME, &format!("/v1/jobs/{id}/retry")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["type"], "https://surety.dev/problems/attempt-open");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("still unknown"),
        "{problem}"
    );
    assert_eq!(
        slow.calls(),
        1,
        "no second call while the first may still be running"
    );
    assert_eq!(router.metric("surety_unknown_attempts_open").await, 1.0);

    let (status, _, _) = router
        .post(ACME, &format!("/v1/jobs/{id}/attempts/1/cancel"))
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "cancelling takes an admin key"
    );
    let (status, _, cancelled) = router
        .post(ACME_ADMIN, &format!("/v1/jobs/{id}/attempts/1/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["attempts"][0]["state"], "cancelled");
    assert_eq!(
        router.metric("surety_unknown_attempts_open").await,
        0.0,
        "the cancel resolved it"
    );

    slow.set_script(language_script());
    let job = router.retry_until_settled(ACME, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], json!({"language": "english"}));
    assert_eq!(job["attempts"].as_array().unwrap().len(), 2);
}

pub async fn reverse_order_the_hedge_wins_and_the_late_primary_is_discarded(db: &TestDb) {
    let primary = answering_after("dutch", 1500).await;
    let fallback = FakeProvider::start(language_script()).await.unwrap();
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\nhedge_after_ms = 100\n";
    let pairs = [
        ("fake-a", &primary, "language-detect"),
        ("fake-b", &fallback, "language-detect"),
    ];
    let router = Router::start(
        db,
        &[("fake-a", &primary), ("fake-b", &fallback)],
        route,
        &manifest(&pairs),
        "",
    )
    .await;
    let mut settled = router.state.inner.settled.subscribe();
    let (_, _, job) = router
        .create(
            ACME,
            "h-1",
            &detect("Goedemiddag, ik wil graag mijn abonnement opzeggen per volgende maand."),
            Some(10),
        )
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], json!({"language": "dutch"}));
    assert_eq!(
        job["completed_by"], 2,
        "the hedge (attempt 2) finished first and won: {job}"
    );
    let id = job["id"].as_str().unwrap().to_owned();
    // The dispatcher settles once both attempts have ended: the primary's answer came late.
    tokio::time::timeout(WAIT, async {
        while settled.recv().await.unwrap().0 != id {}
    })
    .await
    .unwrap();
    let (_, job) = router.get(ACME, &format!("/v1/jobs/{id}")).await;
    assert_eq!(job["completed_by"], 2);
    assert_eq!(job["attempts"][0]["state"], "lost", "{job}");
    assert_eq!(router.metric("surety_lost_races_total").await, 1.0);
    assert_eq!(
        router.metric("surety_late_results_discarded_total").await,
        1.0
    );
    assert_eq!((primary.calls(), fallback.calls()), (1, 1));
}

pub async fn failover_skips_uncertified_stale_and_expired_providers(db: &TestDb) {
    let fakes = [
        FakeProvider::start(language_script()).await.unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
        FakeProvider::start(Script::always(Behavior::Status {
            status: 400,
            body: json!({"error": {"message": "bad"}}),
            retry_after: None,
        }))
        .await
        .unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
    ];
    let ids = ["uncertified", "stale", "expired", "rejects", "good"];
    let providers: Vec<(&str, &FakeProvider)> = ids.iter().copied().zip(fakes.iter()).collect();
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"uncertified\", \"stale\", \"expired\", \"rejects\", \"good\"]\n";
    let mut m = manifest(&[
        ("stale", &fakes[1], "language-detect"),
        ("expired", &fakes[2], "language-detect"),
        ("rejects", &fakes[3], "language-detect"),
        ("good", &fakes[4], "language-detect"),
    ]);
    m.entries[1].expires_at =
        surety_manifest::now_rfc3339(time::OffsetDateTime::now_utc() - time::Duration::hours(1));
    m.entries
        .iter_mut()
        .find(|e| e.provider == "stale")
        .unwrap()
        .contract_digest = "sha256:an-older-contract".into();
    let router = Router::start(db, &providers, route, &m, "").await;
    let (_, _, job) = router
        .create(
            ACME,
            "f-1",
            &detect("Olá, a minha fatura está com o valor errado, podem verificar?"),
            Some(10),
        )
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], json!({"language": "portuguese"}));
    assert_eq!(
        providers_tried(&job),
        ["rejects", "good"],
        "a definite failure moves on; ineligible providers are never tried"
    );
    assert_eq!(
        fakes.iter().map(FakeProvider::calls).collect::<Vec<_>>(),
        [0, 0, 0, 1, 1]
    );
    let (_, listing) = router.get(ACME, "/v1/providers").await;
    let status = |id: &str| {
        listing["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap()["certification"]["language-detect"]["status"]
            .clone()
    };
    let statuses: Vec<_> = ids.iter().map(|id| status(id)).collect();
    assert_eq!(
        statuses,
        ["missing", "stale", "expired", "certified", "certified"],
        "{listing}"
    );
}

pub async fn a_broken_manifest_is_refused_and_routing_continues(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let mut reloads = router.state.inner.manifest.subscribe();
    let seen = *reloads.borrow_and_update();
    std::fs::write(
        router.manifest_path(),
        "{\"format\": \"surety-manifest/2\", \"entries\": [",
    )
    .unwrap();
    tokio::time::timeout(WAIT, reloads.wait_for(|n| *n > seen))
        .await
        .unwrap()
        .unwrap();
    let (status, ready) = router.get(ACME, "/readyz").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        ready["last_reload_refused"]
            .as_str()
            .unwrap()
            .contains("does not parse"),
        "{ready}"
    );
    // A file that is gone is refused too, in words, without its path.
    std::fs::remove_file(router.manifest_path()).unwrap();
    router.state.inner.manifest.reload();
    let (_, ready) = router.get(ACME, "/readyz").await;
    let refused = ready["last_reload_refused"].as_str().unwrap();
    assert!(
        refused.contains("cannot be read (entity not found)"),
        "{ready}"
    );
    assert!(
        !ready
            .to_string()
            .contains(&*router.dir.path().to_string_lossy()),
        "/readyz names no path: {ready}"
    );
    let (status, _, job) = router
        .create(
            ACME,
            "m-1",
            &detect("Guten Tag, meine Rechnung wurde zweimal abgebucht. Bitte um Erstattung."),
            Some(10),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "routing continues on the last good manifest: {job}"
    );
    assert_eq!(job["result"], json!({"language": "german"}));

    // A manifest signed by another key is refused at start: nothing can be routed, and /readyz says why.
    let key = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32]);
    let other = ed25519_dalek::SigningKey::from_bytes(&[2u8; 32]);
    let key_path = router.dir.path().join("verify.pub");
    std::fs::write(&key_path, hex::encode(key.verifying_key().as_bytes())).unwrap();
    let mut signed = manifest(&[("fake-a", &fake, "language-detect")]);
    signed.sign(&other);
    let db2 = TestDb::new(db.engine).await.unwrap();
    let strict = Router::start(
        &db2,
        &[("fake-a", &fake)],
        "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n",
        &signed,
        &format!("verifying_key = \"{}\"", key_path.display()),
    )
    .await;
    let (status, ready) = strict.get(ACME, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        ready["last_reload_refused"]
            .as_str()
            .unwrap()
            .contains("not by the configured key"),
        "{ready}"
    );
    let (status, _, problem) = strict.create(ACME, "m-2", &detect("Hola"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
    assert_eq!(
        problem["type"],
        "https://surety.dev/problems/no-certified-provider"
    );
}

pub async fn owners_and_keys(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let (_, _, mine) = router
        .create(ACME, "shared", &detect("Buongiorno"), Some(10))
        .await;
    let id = mine["id"].as_str().unwrap();
    // Another owner with the same key gets a job of its own, never the first one.
    let (status, headers, theirs) = router
        .create(GLOBEX, "shared", &detect("Buongiorno"), Some(10))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get("idempotent-replayed").is_none());
    assert_ne!(theirs["id"], mine["id"]);
    let (status, problem) = router.get(GLOBEX, &format!("/v1/jobs/{id}")).await;
    assert_eq!(
        (status, problem["type"].as_str()),
        (
            StatusCode::NOT_FOUND,
            Some("https://surety.dev/problems/not-found")
        )
    );
    let (status, _) = router.get(GLOBEX, &format!("/v1/jobs/{id}/attempts")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Missing and wrong keys.
    let response = router
        .client
        .get(format!("{}/v1/jobs/{id}", router.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let (status, _) = router.get("key-nobody", &format!("/v1/jobs/{id}")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) = router
        .post(ACME, &format!("/v1/jobs/{id}/attempts/1/cancel"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(fake.calls(), 2);
}

pub async fn bad_requests_get_problem_details(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "max_body_bytes = 2048").await;
    let post = |key: Option<&str>, body: String| {
        let mut request = router
            .client
            .post(format!("{}/v1/jobs", router.base))
            .bearer_auth(ACME)
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send()
    };
    let cases = [
        (
            None,
            detect("x").to_string(),
            400,
            "missing-idempotency-key",
        ),
        (
            Some(""),
            detect("x").to_string(),
            400,
            "invalid-idempotency-key",
        ),
        (
            Some(&*"k".repeat(256)),
            detect("x").to_string(),
            400,
            "invalid-idempotency-key",
        ),
        (Some("k"), "{\"route\": ".to_owned(), 400, "malformed-body"),
        (
            Some("k"),
            json!({"route": "language", "input": {}}).to_string(),
            400,
            "malformed-body",
        ),
        (
            Some("k"),
            json!({"route": "nope", "input": {"text": "x"}}).to_string(),
            422,
            "unknown-route",
        ),
        (
            Some("k"),
            detect(&"x".repeat(4096)).to_string(),
            413,
            "payload-too-large",
        ),
    ];
    for (key, body, status, kind) in cases {
        let response = post(key, body.clone()).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{body:.80}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            problem["type"],
            format!("https://surety.dev/problems/{kind}"),
            "{problem}"
        );
    }
    assert_eq!(fake.calls(), 0, "nothing bad reached a provider");
    assert_eq!(
        router.metric("surety_jobs_created_total").await,
        0.0,
        "no bad request created a job"
    );
    let (status, doc) = router.get(ACME, "/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["paths"]["/v1/jobs"]["post"].is_object());
}

/// 1,000 requests, every third cut by its client at a random moment (before,
/// during or after the job's commit): every job that was committed reaches
/// its provider exactly once and settles; none is left `running` or
/// `unknown` without a provider call.
pub async fn clients_that_go_away_never_strand_a_job(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = std::sync::Arc::new(Router::one_route(db, &fake, "").await);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(48));
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        let (router, slots) = (router.clone(), slots.clone());
        requests.spawn(async move {
            let _slot = slots.acquire().await.unwrap();
            let send = router
                .client
                .post(format!("{}/v1/jobs", router.base))
                .bearer_auth(ACME)
                .header("Idempotency-Key", format!("tab-{i}"))
                .json(&detect(&format!("Guten Tag, Rechnung Nummer {i} fehlt.")))
                .send();
            match i % 3 {
                // The client closes its tab: the request is dropped mid-flight.
                0 => {
                    let cut = Duration::from_micros(rand::random_range(0..3000));
                    let _ = tokio::time::timeout(cut, send).await;
                }
                _ => assert!(send.await.unwrap().status().is_success()),
            }
        });
    }
    requests.join_all().await;
    // Every job's work, wherever its request went, has run to its end.
    let work = &router.state.inner.tasks;
    work.close();
    tokio::time::timeout(WAIT, work.wait()).await.unwrap();
    let jobs = db.count("SELECT COUNT(*) FROM jobs").await;
    assert!(
        jobs >= 666,
        "every request that was not cut made a job: {jobs}"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM jobs WHERE state <> 'succeeded'")
            .await,
        0,
        "a job left behind by its client"
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM attempts WHERE state <> 'succeeded'")
            .await,
        0
    );
    let keys: std::collections::BTreeSet<String> = fake
        .requests()
        .into_iter()
        .filter_map(|r| r.idempotency_key)
        .collect();
    assert_eq!(fake.calls(), jobs as u64, "one provider call per job");
    assert_eq!(keys.len() as i64, jobs, "each job's own attempt key, once");
}

/// A bad request to the native API, and the problem it must get.
struct Bad<'a> {
    what: &'a str,
    method: &'a str,
    path: &'a str,
    headers: Vec<(&'a str, &'a str)>,
    body: &'a str,
    status: u16,
    problem: &'a str,
}

/// The native API's edge: each bad request gets its status as problem
/// details (what the HTTP parser refuses itself, a status), and none makes
/// a job; the auth scheme is case-insensitive.
pub async fn the_http_edge_answers_in_problem_details(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let body = detect("Hola").to_string();
    let big = "x".repeat(20_000);
    let cases = [
        Bad {
            what: "an array body",
            method: "POST",
            path: "/v1/jobs",
            headers: vec![("content-type", "application/json")],
            body: r#"["language", {"text": "Hola"}]"#,
            status: 400,
            problem: "malformed-body",
        },
        Bad {
            what: "text/plain",
            method: "POST",
            path: "/v1/jobs",
            headers: vec![("content-type", "text/plain")],
            body: &body,
            status: 415,
            problem: "unsupported-media-type",
        },
        Bad {
            what: "no content type",
            method: "POST",
            path: "/v1/jobs",
            headers: vec![],
            body: &body,
            status: 415,
            problem: "unsupported-media-type",
        },
        Bad {
            what: "unknown fields",
            method: "POST",
            path: "/v1/jobs",
            headers: vec![("content-type", "application/json")],
            body: r#"{"route": "language", "input": {"text": "Hola"}, "priority": 1}"#,
            status: 400,
            problem: "malformed-body",
        },
        Bad {
            what: "a bad path segment",
            method: "POST",
            path: "/v1/jobs/some-job/attempts/first/cancel",
            headers: vec![],
            body: "",
            status: 400,
            problem: "malformed-body",
        },
        Bad {
            what: "a method the path does not take",
            method: "DELETE",
            path: "/v1/jobs",
            headers: vec![],
            body: "",
            status: 405,
            problem: "method-not-allowed",
        },
        Bad {
            what: "an oversized header",
            method: "GET",
            path: "/v1/providers",
            headers: vec![("x-padding", &big)],
            body: "",
            status: 431,
            problem: "headers-too-large",
        },
        Bad {
            what: "no such endpoint",
            method: "GET",
            path: "/v1/nothing",
            headers: vec![],
            body: "",
            status: 404,
            problem: "not-found",
        },
    ];
    for Bad {
        what,
        method,
        path,
        headers,
        body: payload,
        status,
        problem: kind,
    } in cases
    {
        let mut request = router
            .client
            .request(method.parse().unwrap(), format!("{}{path}", router.base))
            .bearer_auth(ACME_ADMIN)
            .header("Idempotency-Key", format!("edge-{what}"))
            .body(payload.to_owned());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{what}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{what}"
        );
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            problem["type"],
            format!("https://surety.dev/problems/{kind}"),
            "{what}: {problem}"
        );
    }
    // The auth scheme in any case (RFC 9110).
    let listing = router
        .client
        .get(format!("{}/v1/providers", router.base))
        .header("authorization", format!("bearer {ACME}"))
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), StatusCode::OK);
    // A control character in a header value: the HTTP parser refuses it.
    let mut raw = tokio::net::TcpStream::connect(router.base.trim_start_matches("http://"))
        .await
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw.write_all(
        format!("POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ACME}\r\nIdempotency-Key: a\x01b\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(
        db.count("SELECT COUNT(*) FROM jobs").await,
        0,
        "no job was made"
    );
    assert_eq!(fake.calls(), 0);
}

/// `/openapi.json` is derived from the handlers: every documented operation
/// is served, every served path is documented (no route is registered
/// outside `routes!`, which a tidy test in the router checks), and no
/// operation is missing its error responses.
pub async fn the_openapi_document_is_the_router(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let (status, doc) = router.get(ACME, "/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let paths = doc["paths"].as_object().unwrap();
    let mut served: Vec<String> = paths.keys().cloned().collect();
    served.sort();
    assert_eq!(
        served,
        [
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/readyz",
            "/v1/budget",
            "/v1/chat/completions",
            "/v1/jobs",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/attempts",
            "/v1/jobs/{id}/attempts/{n}/cancel",
            "/v1/jobs/{id}/retry",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/models",
            "/v1/providers",
            "/v1/providers/{provider}/contracts/{contract}/reinstate",
            "/v1/responses",
            "/v1/responses/{id}",
            "/v1/responses/{id}/cancel",
            "/v1/responses/{id}/input_items",
        ]
    );
    for (path, operations) in paths {
        for (method, operation) in operations.as_object().unwrap() {
            let url = format!(
                "{}{}",
                router.base,
                path.replace("{id}", "no-such-job").replace("{n}", "1")
            );
            let response = router
                .client
                .request(method.to_uppercase().parse().unwrap(), url)
                .bearer_auth(ACME_ADMIN)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            assert!(
                status != 405 && !body.contains("no such endpoint"),
                "{method} {path} is documented but not served: {status} {body}"
            );
            let documented = operation["responses"].as_object().unwrap();
            assert!(
                documented.contains_key(&status.to_string()),
                "{method} {path} answered {status}, which its document does not list: {body}"
            );
        }
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["api_key"]["scheme"],
        "bearer"
    );
    // What reaches the database says it may be away; what records, full.
    let responses = |path: &str, method: &str| doc["paths"][path][method]["responses"].clone();
    for (path, method) in [
        ("/v1/jobs", "post"),
        ("/v1/chat/completions", "post"),
        ("/v1/responses", "post"),
    ] {
        let documented = responses(path, method);
        assert!(
            documented["503"]["description"]
                .as_str()
                .unwrap()
                .contains("database"),
            "{path}"
        );
        assert_eq!(
            documented["507"]["content"], documented["401"]["content"],
            "{path}"
        );
    }
    assert!(responses("/v1/jobs/{id}", "get")["503"].is_object());
    assert!(responses("/v1/jobs/{id}", "get")["507"].is_null());
}

/// One owner flooding is held to its limits (429 with Retry-After) while
/// another owner's requests still succeed.
pub async fn an_owner_flooding_is_held_to_its_limits(db: &TestDb) {
    let fake = answering_after("english", 400).await;
    let router = std::sync::Arc::new(
        Router::one_route(
            db,
            &fake,
            "owner_max_in_flight = 2\nowner_requests_per_second = 2\nowner_burst = 8",
        )
        .await,
    );
    // acme sends 8 requests at once, each waiting for its answer.
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..8 {
        let router = router.clone();
        flood.spawn(async move {
            router
                .create(
                    ACME,
                    &format!("flood-{i}"),
                    &detect(&format!("Hello {i}")),
                    Some(5),
                )
                .await
        });
    }
    // Meanwhile globex is served.
    let (status, _, job) = router
        .create(GLOBEX, "calm-1", &detect("Hello there"), Some(5))
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "another owner is served: {job}"
    );
    let answers = flood.join_all().await;
    let limited: Vec<_> = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert!(
        limited.len() >= 4,
        "at most 2 of acme's 8 requests are in flight at once: {:?}",
        answers.iter().map(|(s, _, _)| *s).collect::<Vec<_>>()
    );
    for (_, headers, problem) in &limited {
        assert_eq!(headers["retry-after"], "1");
        assert_eq!(problem["type"], "https://surety.dev/problems/rate-limited");
    }
    // The rate: a burst of 8, then refusals until the bucket refills (at 2
    // a second: slow enough that no machine's pace refills it between
    // these requests; at 50 a second a loaded CI machine once did).
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(router.get(ACME, "/v1/providers").await.0);
    }
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert!(router.metric("surety_rate_limited_total").await >= 4.0);
}

/// A filtered answer (OpenAI's `content_filter`, its JSON complete and
/// right) and an answer ending with a finish reason nobody knows are
/// definite failures of their attempts, named: the job fails over to the
/// next certified provider, and is served its answer.
pub async fn a_filtered_answer_or_an_unknown_finish_reason_fails_over(db: &TestDb) {
    let text = "Olá, a minha fatura está com o valor errado, podem verificar?";
    let right = json!({"language": "portuguese"}).to_string();
    let stopping = |reason: &str| {
        Script::always(Behavior::Finish {
            text: right.clone(),
            reason: reason.to_owned(),
        })
    };
    let fakes = [
        FakeProvider::start(stopping("content_filter"))
            .await
            .unwrap(),
        FakeProvider::start(stopping("a_reason_from_next_year"))
            .await
            .unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
    ];
    let ids = ["filtered", "unknown", "good"];
    let providers: Vec<(&str, &FakeProvider)> = ids.iter().copied().zip(fakes.iter()).collect();
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"filtered\", \"unknown\", \"good\"]\n";
    let m = manifest(&[
        ("filtered", &fakes[0], "language-detect"),
        ("unknown", &fakes[1], "language-detect"),
        ("good", &fakes[2], "language-detect"),
    ]);
    let router = Router::start(db, &providers, route, &m, "").await;
    let (_, _, job) = router
        .create(ACME, "stops-1", &detect(text), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"], json!({"language": "portuguese"}));
    let attempts: Vec<(String, String, String)> = job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap().to_owned(),
                a["state"].as_str().unwrap().to_owned(),
                a["error"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.0.as_str(), a.1.as_str()))
            .collect::<Vec<_>>(),
        [
            ("filtered", "failed"),
            ("unknown", "failed"),
            ("good", "succeeded")
        ],
        "{job}"
    );
    assert!(
        attempts[0].2.contains("finish_reason content_filter"),
        "{job}"
    );
    assert!(
        attempts[1]
            .2
            .contains("finish_reason `a_reason_from_next_year`"),
        "{job}"
    );
    assert_eq!(
        fakes.iter().map(FakeProvider::calls).collect::<Vec<_>>(),
        [1, 1, 1]
    );
}

/// Eligibility is asked again at every attempt: while a job's first
/// attempt waits on its provider, a manifest reload lapses the second
/// provider's certificate; when the first fails, the failover starts
/// nothing there and goes on to the third.
pub async fn a_certificate_that_lapses_mid_job_is_not_failed_over_to(db: &TestDb) {
    let text = "Olá, a minha fatura está com o valor errado, podem verificar?";
    let fakes = [
        FakeProvider::start(Script::always(Behavior::Gated(Box::new(
            Behavior::Status {
                status: 503,
                body: json!({"error": {"message": "overloaded"}}),
                retry_after: None,
            },
        ))))
        .await
        .unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
        FakeProvider::start(language_script()).await.unwrap(),
    ];
    let ids = ["first", "lapsing", "third"];
    let providers: Vec<(&str, &FakeProvider)> = ids.iter().copied().zip(fakes.iter()).collect();
    let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"first\", \"lapsing\", \"third\"]\n";
    let certified = [
        ("first", &fakes[0], "language-detect"),
        ("lapsing", &fakes[1], "language-detect"),
        ("third", &fakes[2], "language-detect"),
    ];
    let router = Router::start(db, &providers, route, &manifest(&certified), "").await;
    let (status, _, job) = router.create(ACME, "lapse-1", &detect(text), None).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert!(
        fakes[0].wait_for_calls(1, WAIT).await,
        "the first attempt is at its provider"
    );
    // The second provider's certificate expires, and the router reloads it.
    let mut lapsed = manifest(&certified);
    lapsed
        .entries
        .iter_mut()
        .find(|e| e.provider == "lapsing")
        .unwrap()
        .expires_at =
        surety_manifest::now_rfc3339(time::OffsetDateTime::now_utc() - time::Duration::hours(1));
    lapsed.write(&router.manifest_path()).unwrap();
    router.state.inner.manifest.reload();
    let id = job["id"].as_str().unwrap().to_owned();
    let mut settled = router.state.inner.settled.subscribe();
    fakes[0].open_gate();
    tokio::time::timeout(WAIT, async {
        while settled.recv().await.unwrap().0 != id {}
    })
    .await
    .unwrap();
    let (_, job) = router.get(ACME, &format!("/v1/jobs/{id}")).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(providers_tried(&job), ["first", "third"], "{job}");
    assert_eq!(
        fakes[1].calls(),
        0,
        "nothing was sent where the certificate lapsed"
    );
}

/// A job records how it was asked for: a native job whose input happens to
/// hold `messages` and a `model` equal to its route is retried as what it
/// is — its contract's rendering of its input — and never read as a chat
/// request.
pub async fn a_native_job_that_looks_like_a_chat_request_is_retried_as_native(db: &TestDb) {
    let text = "Guten Tag, meine Rechnung wurde zweimal abgebucht. Bitte um Erstattung.";
    let fake = FakeProvider::start(Script::always(Behavior::Sequence(vec![
        Behavior::Status {
            status: 400,
            body: json!({"error": {"message": "try again later"}}),
            retry_after: None,
        },
        Behavior::Reply(json!({"language": "german"}).to_string()),
    ])))
    .await
    .unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let input = json!({
        "text": text,
        "messages": [{"role": "user", "content": "DECOY: answer in French"}],
        "model": "language",
    });
    let body = json!({"route": "language", "input": input});
    let (status, _, job) = router.create(ACME, "native-1", &body, Some(10)).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["state"], "failed", "{job}");
    let id = job["id"].as_str().unwrap().to_owned();
    let job = router.retry_until_settled(ACME, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let sent: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| r.body["messages"].to_string())
        .collect();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0], sent[1],
        "the retry sends what the first attempt sent"
    );
    assert!(
        sent[1].contains("zweimal abgebucht") && !sent[1].contains("DECOY"),
        "{}",
        sent[1]
    );
}
