//! `surety serve` as processes: killed with SIGKILL mid-attempt and
//! restarted, and two replicas on one PostgreSQL.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use surety_fake_provider::{Behavior, FakeProvider, Latency, Script, When};
use surety_tests::{Engine, TestDb};
use tokio::io::{AsyncBufReadExt, BufReader};

const KEY: &str = "key-acme";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes a config and a manifest certifying `fake-a` for language-detect.
fn workspace(db: &TestDb, fake: &FakeProvider) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let contract =
        surety_contracts::Contract::load(&repo().join("contracts/language-detect")).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let mut manifest = surety_manifest::Manifest::new(now);
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndatabase = \"{}\"\nmanifest = \"{}\"\ncontracts = \"{}\"\nlease_ms = 60000\nattempt_timeout_ms = 60000\n\
         [[api_keys]]\nowner = \"acme\"\nsha256 = \"{}\"\n\
         [providers.fake-a]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"a\"\ncontext_window = 16000\n\
         [routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n",
        db.url,
        dir.path().join("manifest.json").display(),
        repo().join("contracts").display(),
        hex::encode(Sha256::digest(KEY.as_bytes())),
        fake.openai_base_url()
    );
    let parsed = surety_router::RouterConfig::from_toml(&config).unwrap();
    manifest.entries.push(surety_tests::certified_entry(
        &parsed.providers["fake-a"],
        &contract,
        now + time::Duration::days(1),
    ));
    manifest.write(&dir.path().join("manifest.json")).unwrap();
    std::fs::write(dir.path().join("surety.toml"), config).unwrap();
    dir
}

struct Serving {
    child: tokio::process::Child,
    base: String,
}

/// Starts `surety serve` and waits for the line that says where it listens.
async fn serve(dir: &Path) -> Serving {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_surety"))
        .args(["serve", "--config"])
        .arg(dir.join("surety.toml"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let base = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(addr) = line.split("addr=").nth(1) {
                return format!("http://{}", addr.split_whitespace().next().unwrap());
            }
        }
        panic!("surety serve exited before listening")
    })
    .await
    .unwrap();
    // Keep draining its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Serving { child, base }
}

async fn create(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    text: &str,
    wait: Option<u64>,
) -> (u16, Value) {
    let mut request = client
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(KEY)
        .header("Idempotency-Key", key)
        .json(&json!({"route": "language", "input": {"text": text}}));
    if let Some(wait) = wait {
        request = request.header("Prefer", format!("wait={wait}"));
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn job(client: &reqwest::Client, base: &str, id: &str) -> Value {
    client
        .get(format!("{base}/v1/jobs/{id}"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn kill_mid_attempt(engine: Engine) {
    let Some(db) = TestDb::new(engine).await else {
        return;
    };
    let fake = FakeProvider::start(Script::always(Behavior::Hang))
        .await
        .unwrap();
    let dir = workspace(&db, &fake);
    let mut first = serve(dir.path()).await;
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..3 {
        let (status, body) = create(
            &client,
            &first.base,
            &format!("crash-{i}"),
            "Hello, my invoice is unpaid.",
            None,
        )
        .await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["id"].as_str().unwrap().to_owned());
    }
    assert!(
        fake.wait_for_calls(3, Duration::from_secs(20)).await,
        "every attempt reached the provider"
    );
    first.child.kill().await.unwrap(); // SIGKILL: no shutdown, no cleanup.

    // The dead router's leases run out (rewound here rather than waited for).
    let rewound = db.exec("UPDATE attempts SET lease_expires_at_ms = lease_expires_at_ms - 3600000 WHERE state = 'started'").await;
    assert_eq!(rewound, 3);
    let second = serve(dir.path()).await;
    for id in &ids {
        let job = job(&client, &second.base, id).await;
        assert_eq!(
            job["state"], "unknown",
            "acknowledged, kept, and unknown: {job}"
        );
        assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
        assert_eq!(job["attempts"][0]["state"], "unknown");
    }
    // A client retrying its request gets the same job, and nothing is re-run.
    let (status, again) = create(
        &client,
        &second.base,
        "crash-0",
        "Hello, my invoice is unpaid.",
        None,
    )
    .await;
    assert_eq!((status, again["id"].as_str()), (200, Some(ids[0].as_str())));
    assert_eq!(fake.calls(), 3, "no provider saw a second call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_attempt_sqlite() {
    kill_mid_attempt(Engine::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_attempt_postgres() {
    kill_mid_attempt(Engine::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_postgres_make_one_job_of_a_split_double_click() {
    let Some(db) = TestDb::new(Engine::Postgres).await else {
        return;
    };
    let answer = Behavior::Reply(json!({"language": "french"}).to_string());
    let fake = FakeProvider::start(Script::default().rule_with_latency(
        When::Always,
        answer,
        Latency::FixedMs(300),
    ))
    .await
    .unwrap();
    let dir = workspace(&db, &fake);
    let (a, b) = (serve(dir.path()).await, serve(dir.path()).await);
    let client = reqwest::Client::new();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(40));
    let mut clicks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let (client, barrier) = (client.clone(), barrier.clone());
        clicks.spawn(async move {
            barrier.wait().await;
            create(
                &client,
                &base,
                "split-click",
                "Bonjour, ma facture est fausse.",
                None,
            )
            .await
        });
    }
    let answers = clicks.join_all().await;
    let ids: std::collections::BTreeSet<&str> = answers
        .iter()
        .map(|(_, body)| body["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 1, "one job across both replicas");
    assert_eq!(answers.iter().filter(|(s, _)| *s == 201).count(), 1);
    let (_, settled) = create(
        &client,
        &b.base,
        "split-click",
        "Bonjour, ma facture est fausse.",
        Some(10),
    )
    .await;
    assert_eq!(settled["state"], "succeeded", "{settled}");
    assert_eq!(fake.calls(), 1, "one provider call");
}
