//! Faults the router survives: the database going away or filling up, and
//! providers that misbehave at the transport. Each test fails when the
//! protection it names is taken out.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Script, When};
use surety_tests::{Engine, TestDb};

use crate::harness::{ACME, Router, detect, until};

const ENGLISH: &str = r#"{"language": "english"}"#;
/// Long enough for anything here; reaching it fails the test.
const BOUND: Duration = Duration::from_secs(20);

fn assert_problem(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    expected: StatusCode,
    slug: &str,
    retry_after: &str,
) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(
        body["type"],
        format!("https://surety.dev/problems/{slug}"),
        "{body}"
    );
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(headers["retry-after"], retry_after);
}

/// PostgreSQL goes away (every connection terminated, new ones refused)
/// while two replicas each have a provider call in flight, and comes back.
/// During the outage: new jobs get 503 problem+json with Retry-After in
/// bounded time, `/readyz` says the database is down, and the answers that
/// arrive are held. After it: each held answer is recorded (no second
/// provider call), and both replicas serve without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_outage_gets_503_holds_the_answers_and_recovers() {
    let Some(db) = TestDb::own_postgres().await else {
        return;
    };
    let fake = FakeProvider::start(Script::always(Behavior::Reply(ENGLISH.to_owned())).rule(
        When::PromptContains("held".to_owned()),
        Behavior::Gated(Box::new(Behavior::Reply(ENGLISH.to_owned()))),
    ))
    .await
    .unwrap();
    let server = "database_timeout_ms = 1000\n";
    let replicas = [
        Router::one_route(&db, &fake, server).await,
        Router::one_route(&db, &fake, server).await,
    ];
    let mut held = Vec::new();
    for (i, router) in replicas.iter().enumerate() {
        let key = format!("held-{i}");
        let (status, _, job) = router
            .create(ACME, &key, &detect(&format!("held {i}")), None)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        held.push((key, job));
    }
    assert!(
        fake.wait_for_calls(2, BOUND).await,
        "both calls reach the provider"
    );

    db.take_away().await;
    for router in &replicas {
        let refused = tokio::time::timeout(
            BOUND,
            router.create(ACME, "during-outage", &detect("Hello"), Some(5)),
        )
        .await
        .expect("a request during the outage is answered, not hung");
        let (status, headers, body) = refused;
        assert_problem(
            status,
            &headers,
            &body,
            StatusCode::SERVICE_UNAVAILABLE,
            "database-unavailable",
            "2",
        );
        let (status, ready) = router.get(ACME, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
        assert_eq!(ready["database"], "down", "{ready}");
        // Why, in words: no driver text, address or user.
        let why = ready["database_error"].as_str().unwrap_or_default();
        assert!(
            [
                "it cannot be reached",
                "it is full",
                "it refused the round trip"
            ]
            .contains(&why)
                || why.starts_with("no answer within"),
            "{ready}"
        );
    }
    // The provider answers while the database is away: each replica holds its answer.
    fake.open_gate();
    for router in &replicas {
        let metrics = &router.state.inner.metrics;
        assert!(
            until(async || metrics.results_held.get() == 1).await,
            "the answer is held, not dropped"
        );
    }

    db.bring_back().await;
    for (router, (key, job)) in replicas.iter().zip(&held) {
        // A replay waits on the job: it settles with the held answer.
        let (status, _, replayed) = router
            .create(ACME, key, &detect(&format!("held {}", &key[5..])), Some(15))
            .await;
        assert_eq!(status, StatusCode::OK, "{replayed}");
        assert_eq!(replayed["id"], job["id"]);
        assert_eq!(replayed["state"], "succeeded", "{replayed}");
        assert_eq!(replayed["result"], json!({"language": "english"}));
        assert_eq!(router.state.inner.metrics.results_held.get(), 0);
        let (status, ready) = router.get(ACME, "/readyz").await;
        assert_eq!(
            (status, &ready["database"]),
            (StatusCode::OK, &json!("up")),
            "{ready}"
        );
        // And new work is served, without a restart.
        let (status, _, fresh) = router
            .create(
                ACME,
                &format!("after-{key}"),
                &detect("Hello again"),
                Some(15),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{fresh}");
        assert_eq!(fresh["state"], "succeeded", "{fresh}");
    }
    for (_, job) in &held {
        let id = job["id"].as_str().unwrap();
        assert_eq!(
            fake.calls_with_key(&format!("surety-{id}-1")),
            1,
            "the held answer was never asked for again"
        );
    }
    assert_eq!(
        fake.calls(),
        4,
        "two held calls and two fresh ones, nothing more"
    );
}

/// SQLite at its configured size: new jobs get 507 problem+json with
/// Retry-After and change nothing; acknowledged jobs stay whole
/// (`integrity_check`); when retention frees room, new jobs are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_sqlite_gets_507_and_serves_again_when_room_returns() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (_fake, router) = Router::answering_english(&db, "sqlite_max_bytes = 1048576\n").await;
    let big = "x".repeat(60_000);
    let mut acknowledged = Vec::new();
    let (status, headers, problem) = loop {
        assert!(acknowledged.len() < 100, "1 MiB never filled");
        let key = format!("fill-{}", acknowledged.len());
        let answer = router
            .create(ACME, &key, &detect(&format!("{big} {key}")), Some(15))
            .await;
        match answer.0 {
            StatusCode::CREATED => acknowledged.push((key, answer.2)),
            _ => break answer,
        }
    };
    assert_problem(
        status,
        &headers,
        &problem,
        StatusCode::INSUFFICIENT_STORAGE,
        "storage-full",
        "30",
    );
    let before = db.snapshot().await;
    let (status, _, _) = router
        .create(
            ACME,
            "one-more",
            &detect(&format!("{big} one-more")),
            Some(5),
        )
        .await;
    assert_eq!(status, StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(db.snapshot().await, before, "a refused job changes nothing");
    for (key, job) in &acknowledged {
        assert_eq!(job["state"], "succeeded", "{job}");
        let (status, _, replayed) = router
            .create(ACME, key, &detect(&format!("{big} {key}")), None)
            .await;
        assert_eq!(status, StatusCode::OK, "a replay needs no room: {replayed}");
        assert_eq!(replayed["result"], json!({"language": "english"}));
    }
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&db.raw)
        .await
        .unwrap();
    assert_eq!(integrity, "ok");
    // Room returns: the jobs pass retention and the pruner removes them.
    db.exec("UPDATE jobs SET updated_at_ms = updated_at_ms - 172800000")
        .await;
    assert_eq!(router.state.prune().await, acknowledged.len() as u64);
    let (status, _, job) = router
        .create(ACME, "after-room", &detect("Hello"), Some(15))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["state"], "succeeded");
}

/// A provider that sends its headers and then one byte a second is cut off
/// by the attempt timeout, however long it would go on: the attempt is
/// `unknown` (the provider may have done the work), never `failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dripping_provider_is_cut_off_at_the_attempt_timeout_as_unknown() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let fake = FakeProvider::start(Script::always(Behavior::Drip { every_ms: 200 }))
        .await
        .unwrap();
    let router = Router::one_route(&db, &fake, "attempt_timeout_ms = 600\n").await;
    let (status, _, job) = router
        .create(ACME, "drip-1", &detect("Hello"), Some(10))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["state"], "unknown", "{job}");
    let id = job["id"].as_str().unwrap();
    let (_, attempts) = router.get(ACME, &format!("/v1/jobs/{id}/attempts")).await;
    let error = attempts["data"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("no answer within 0.6 s"), "{attempts}");
    assert_eq!(fake.calls(), 1);
}

/// Reads from `stream` until the server closes it: true when it did within
/// `BOUND` (an EOF or a reset), false when it kept the connection open.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut sink = [0u8; 4096];
    tokio::time::timeout(BOUND, async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Hundreds of idle connections, slowloris clients sending headers a piece
/// at a time, and a keep-alive connection left idle, all past the
/// connection limit: each is closed at the request read timeout, and a
/// normal client is served meanwhile. Without the timeout the idle ones
/// would hold every connection the limit allows, forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_and_slow_clients_are_closed_and_others_are_served() {
    use tokio::io::AsyncWriteExt;
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (_fake, router) =
        Router::answering_english(&db, "max_connections = 50\nrequest_read_timeout_ms = 300\n")
            .await;
    let addr = router.base.trim_start_matches("http://").to_owned();
    let mut hostile = Vec::new();
    for _ in 0..150 {
        hostile.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    for stream in hostile.iter_mut().take(20) {
        // Slowloris: a request line and part of a header, never finished.
        let _ = stream
            .write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: surety\r\nX-Slow: ")
            .await;
    }
    let mut kept_alive = tokio::net::TcpStream::connect(&addr).await.unwrap();
    kept_alive
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: surety\r\n\r\n")
        .await
        .unwrap();
    // A normal client, queued behind all of them, is served.
    let served = tokio::time::timeout(
        BOUND,
        router.create(ACME, "calm-1", &detect("Hello there"), Some(10)),
    )
    .await;
    let (status, _, job) = served.expect("a normal client is served, not starved");
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["state"], "succeeded", "{job}");
    for (i, stream) in hostile.iter_mut().enumerate() {
        assert!(
            closed_by_server(stream).await,
            "hostile connection {i} was kept open"
        );
    }
    assert!(
        closed_by_server(&mut kept_alive).await,
        "an idle keep-alive connection was kept open"
    );
}
