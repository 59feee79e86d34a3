//! What clients read, snapshotted: the problem bodies of the native API's
//! refusals and the OpenAPI document (ids, digests, times and ports
//! redacted the same way everywhere).

use reqwest::StatusCode;
use serde_json::{Value, json};
use surety_tests::{Engine, TestDb};

use crate::harness::{ACME, GLOBEX, Router, detect};

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap()
}

#[tokio::test]
async fn the_problem_bodies_read_as_snapshotted() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (_fake, router) = Router::answering_english(&db, "").await;
    let mut seen = Vec::new();
    let (status, none) = router
        .get("", "/v1/jobs/00000000-0000-7000-8000-000000000000")
        .await;
    seen.push(("no key", status, none));
    let (status, missing) = router
        .get(ACME, "/v1/jobs/00000000-0000-7000-8000-000000000000")
        .await;
    seen.push(("no such job", status, missing));
    let (status, not_an_id) = router.get(ACME, "/v1/jobs/a%00b").await;
    seen.push(("not an id", status, not_an_id));
    let (status, _, route) = router
        .create(
            ACME,
            "s-1",
            &json!({"route": "nowhere", "input": {"text": "Hi"}}),
            None,
        )
        .await;
    seen.push(("unknown route", status, route));
    let (status, _, _) = router
        .create(ACME, "s-2", &detect("Hello there"), Some(10))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, conflict) = router.create(ACME, "s-2", &detect("Guten Tag"), None).await;
    seen.push(("same key, other intent", status, conflict));
    let (status, _, other_owner) = router
        .create(GLOBEX, "s-2", &detect("Guten Tag"), Some(10))
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "keys are per owner: {other_owner}"
    );
    let text: String = seen
        .iter()
        .map(|(what, status, body)| format!("## {what}: {status}\n{}\n", pretty(body)))
        .collect();
    surety_tests::surety_snapshot!("problem-bodies", text);
}

#[tokio::test]
async fn the_openapi_document_reads_as_snapshotted() {
    let db = TestDb::new(Engine::Sqlite).await.unwrap();
    let (_fake, router) = Router::answering_english(&db, "").await;
    let (status, document) = router.get("", "/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    surety_tests::surety_snapshot!("openapi.json", pretty(&document));
}
