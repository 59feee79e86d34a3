//! The edge, tried as an attacker would: a body dripped slowly, bodies
//! sent without a key, ids that cannot be ids, a crafted confirmation
//! path, two `Authorization` headers, an oversized request id.

use std::time::Duration;

use reqwest::StatusCode;
use surety_tests::{Engine, TestDb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{ACME, ACME_ADMIN, GLOBEX, Router, detect, until};

/// Far past any timeout the tests set; only a broken edge waits this long.
const BOUND: Duration = Duration::from_secs(15);

/// Sends a request's head (and no body yet) on a new connection.
async fn head_only(router: &Router, head: &str) -> tokio::net::TcpStream {
    let addr = router.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// What the server sent on `stream` until it closed it, or `None` if it
/// kept it open past `limit`.
async fn until_closed_within(
    stream: &mut tokio::net::TcpStream,
    limit: Duration,
) -> Option<String> {
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .ok()
    .map(|()| String::from_utf8_lossy(&seen).into_owned())
}

fn chat_head(key: Option<&str>, length: usize) -> String {
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: surety\r\n{auth}Idempotency-Key: drip-1\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// A body sent one byte per (timeout − 0.2 s) keeps every byte inside the
/// read timeout, and is still cut when the whole has not arrived by the
/// timeout; a request without a key is answered 401 before its body is read
/// at all; the operator's sign-in, which takes no key, is cut at the same
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slowly_dripped_body_is_cut_at_the_timeout_and_a_keyless_one_is_never_read() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (fake, router) = Router::answering_english(&db, "request_read_timeout_ms = 800\n").await;
    let sign_in = "POST /ui/sign-in HTTP/1.1\r\nHost: surety\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 60000\r\n\r\n";
    for (what, head) in [
        ("a keyed completion", chat_head(Some(ACME), 60_000)),
        ("the sign-in form", sign_in.to_owned()),
    ] {
        let started = std::time::Instant::now();
        let mut stream = head_only(&router, &head).await;
        let (mut reader, mut writer) = stream.split();
        let drip = async {
            loop {
                if writer.write_all(b" ").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(600)).await;
            }
        };
        let mut seen = Vec::new();
        let read = async {
            let mut chunk = [0u8; 4096];
            loop {
                match reader.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&chunk[..n]),
                }
            }
        };
        let closed = tokio::time::timeout(BOUND, async {
            tokio::select! {
                () = read => {},
                () = drip => {},
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "{what}: the dripped body held the connection past {BOUND:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: cut after {:?}",
            started.elapsed()
        );
        let seen = String::from_utf8_lossy(&seen);
        assert!(
            seen.is_empty() || seen.starts_with("HTTP/1.1 4"),
            "{what}: {seen}"
        );
    }
    // No key: answered at once, the body never read (this router would
    // wait 10 s for a body).
    let patient = Router::one_route(&db, &fake, "request_read_timeout_ms = 10000\n").await;
    let mut stream = head_only(&patient, &chat_head(None, 60_000)).await;
    let answer = until_closed_within(&mut stream, Duration::from_secs(5))
        .await
        .expect("answered and closed before any body came");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer.contains("authentication_error"),
        "OpenAI's format: {answer}"
    );
}

/// As many keyless drips as the router takes connections, less two: each
/// is answered and closed at once — well before the 10 s read timeout
/// would close it — so another owner is served and `/healthz` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keyless_drips_cannot_hold_the_connections() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (_fake, router) = Router::answering_english(
        &db,
        "max_connections = 22\nrequest_read_timeout_ms = 10000\n",
    )
    .await;
    let mut drips = Vec::new();
    for _ in 0..20 {
        drips.push(head_only(&router, &chat_head(None, 60_000)).await);
    }
    let served = tokio::time::timeout(BOUND, async {
        let health = router
            .client
            .get(format!("{}/healthz", router.base))
            .send()
            .await
            .unwrap();
        let (status, _, job) = router
            .create(GLOBEX, "other-1", &detect("Hello there"), Some(10))
            .await;
        (health.status(), status, job)
    })
    .await
    .expect("another owner is served while the drips are open");
    assert_eq!(served.0, StatusCode::OK);
    assert_eq!(served.1, StatusCode::CREATED, "{}", served.2);
    for (i, drip) in drips.iter_mut().enumerate() {
        let answer = until_closed_within(drip, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("drip {i} was kept open: its body was waited for"));
        assert!(answer.starts_with("HTTP/1.1 401"), "drip {i}: {answer}");
    }
}

/// Ids that cannot be job ids (a NUL byte, not a UUID) are a 404 before
/// anything is asked of the database, on every job path and the job's
/// page; a confirmation path crafted to act on another path is a 404.
pub async fn ids_that_cannot_be_ids_are_not_found(db: &TestDb) {
    let (_fake, router) = Router::answering_english(db, "").await;
    for path in [
        "/v1/jobs/a%00b",
        "/v1/jobs/a%00b/attempts",
        "/v1/jobs/not-a-uuid",
    ] {
        let (status, problem) = router.get(ACME, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {problem}");
        assert!(!problem.to_string().contains('\u{0}'), "{problem}");
    }
    for path in ["/v1/jobs/a%00b/retry", "/v1/jobs/a%00b/attempts/1/cancel"] {
        let (status, _, problem) = router.post(ACME_ADMIN, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {problem}");
    }
    let (_, _, job) = router
        .create(ACME, "real-1", &detect("Hello there"), Some(10))
        .await;
    let id = job["id"].as_str().unwrap();
    let crafted = format!("/ui/jobs/{id}%2Fattempts%2F1%2Fcancel%3F/retry");
    for path in [crafted.as_str(), "/ui/jobs/a%00b", "/ui/jobs/a%00b/retry"] {
        let response = router
            .client
            .get(format!("{}{path}", router.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
    }
}

/// Two `Authorization` headers are refused (which counts would be a
/// guess); a 15,000-byte request id is not echoed, and the answer carries
/// one the router made.
#[tokio::test]
async fn two_keys_are_refused_and_a_huge_request_id_is_not_echoed() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (_fake, router) = Router::answering_english(&db, "").await;
    let response = router
        .client
        .get(format!("{}/v1/providers", router.base))
        .header("authorization", format!("Bearer {ACME}"))
        .header("authorization", format!("Bearer {GLOBEX}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let problem: serde_json::Value = response.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("more than one Authorization header"),
        "{problem}"
    );
    let huge = "r".repeat(15_000);
    let response = router
        .client
        .get(format!("{}/healthz", router.base))
        .header("x-request-id", &huge)
        .send()
        .await
        .unwrap();
    let echoed = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(uuid::Uuid::try_parse(&echoed).is_ok(), "{echoed:.80}");
    // A plain one is kept, as before.
    let response = router
        .client
        .get(format!("{}/healthz", router.base))
        .header("x-request-id", "trace-abc.123")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "trace-abc.123");
}

/// One owner's waits (`Prefer: wait`) on a provider that never answers,
/// as many as the router takes connections, at the default limits: past
/// its in-flight limit (a quarter of the connections) it is told 429 and
/// its connections are given back, so another owner is served and
/// `/healthz` answers while its waits go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_owners_waits_cannot_hold_every_connection() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let fake = surety_fake_provider::FakeProvider::start(surety_fake_provider::Script::always(
        surety_fake_provider::Behavior::Hang,
    ))
    .await
    .unwrap();
    let router = Router::one_route(
        &db,
        &fake,
        "max_connections = 16\nattempt_timeout_ms = 30000\nrequest_read_timeout_ms = 30000\n",
    )
    .await;
    let mut waits = Vec::new();
    for i in 0..16 {
        let body = detect(&format!("Hello there, number {i}"));
        let key = format!("wait-{i}");
        let base = router.base.clone();
        waits.push(tokio::spawn(async move {
            // A client of its own per wait: one connection each.
            reqwest::Client::new()
                .post(format!("{base}/v1/jobs"))
                .bearer_auth(ACME)
                .header("Idempotency-Key", key)
                .header("Prefer", "wait=25")
                .json(&body)
                .send()
                .await
                .map(|r| r.status())
        }));
    }
    // Every one of them is in: admitted (its provider called) or turned away.
    let limited = || router.state.inner.metrics.rate_limited.get();
    assert!(
        until(async || fake.calls() + limited() >= 16).await,
        "every wait was taken or turned away"
    );
    assert_eq!(
        (fake.calls(), limited()),
        (4, 12),
        "a quarter of 16 connections for one owner"
    );
    let served = tokio::time::timeout(Duration::from_secs(10), async {
        let health = reqwest::Client::new()
            .get(format!("{}/healthz", router.base))
            .send()
            .await
            .unwrap()
            .status();
        let (status, _, job) = router
            .create(GLOBEX, "other-1", &detect("Guten Tag"), None)
            .await;
        (health, status, job)
    })
    .await
    .expect("another owner is served while one owner waits on every connection it can");
    assert_eq!(served.0, StatusCode::OK);
    assert_eq!(served.1, StatusCode::CREATED, "{}", served.2);
    for wait in waits {
        wait.abort();
    }
}

/// Keys cannot be guessed at the speed of the network: past 20 failed
/// authentications in 10 s, an address is refused (429 with Retry-After)
/// before its key is looked at — a good key too, until the window ends.
#[tokio::test]
async fn wrong_keys_are_rate_limited_per_address() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (_fake, router) = Router::answering_english(&db, "").await;
    for i in 0..20 {
        let (status, _) = router.get(&format!("guess-{i}"), "/v1/providers").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {i}");
    }
    let (status, problem) = router.get("guess-20", "/v1/providers").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("too many failed authentications"),
        "{problem}"
    );
    let (status, _) = router.get(ACME, "/v1/providers").await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the address is refused before any key is looked at"
    );
    // Another router (another address's view) is not affected.
    let (_fake, other) = Router::answering_english(&db, "").await;
    let (status, _) = other.get(ACME, "/v1/providers").await;
    assert_eq!(status, StatusCode::OK);
    // Behind a proxy every client has one address: the limit can be turned off.
    let (_fake, proxied) = Router::answering_english(&db, "max_failed_auth = 0\n").await;
    for i in 0..25 {
        let (status, _) = proxied.get(&format!("guess-{i}"), "/v1/providers").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {i}");
    }
}
