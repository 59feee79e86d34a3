//! `cargo xtask bench store`: jobs per second for a job's whole life
//! (create, start an attempt, finish it with compare-and-swap) through the
//! store, beside a baseline measured in the same run: the same SQL issued
//! raw through sqlx's native driver, with no store logic (no validation, no
//! fingerprint, no error mapping, no row decoding, no logs).
//!
//! Both sides get the same connection layout (SQLite: one writer
//! connection; PostgreSQL: one pool), so the ratio is the cost of the store's
//! code. Figures go to stdout and, as JSON, to `$SURETY_BENCH_OUT`
//! (default `target/bench/store.json`).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::Row;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use surety_core::{IdempotencyKey, Intent};
use surety_store::{
    Backend, Created, NewJob, Outcome, OwnerId, Slot, Sql, StartAttempt, Store, StoreOptions,
};
use surety_tests::{Engine, TestDb};

const CLIENTS: [usize; 3] = [1, 16, 64];

fn cell_duration() -> Duration {
    let secs = std::env::var("SURETY_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let duration = cell_duration();
    let mut results = Vec::new();
    println!(
        "store benchmark: a job's whole life (create, start attempt, finish with CAS), {duration:?} per cell"
    );
    println!(
        "{:<9} {:>7} {:>12} {:>12} {:>10}",
        "engine", "clients", "store job/s", "raw job/s", "store/raw"
    );
    for engine in [Engine::Sqlite, Engine::Postgres] {
        for clients in CLIENTS {
            // Fresh databases per cell, so no cell inherits another's bloat.
            let Some(store_db) = TestDb::new(engine).await else {
                continue;
            };
            let raw_db = TestDb::new(engine).await.expect("second database");
            let store = open_store(&store_db, clients).await;
            let raw = open_raw(&raw_db, clients).await;
            // Alternate the order, so neither side always runs on a warmer machine.
            let (store_jps, raw_jps) = if clients % 2 == 0 {
                let s = measure_store(&store, clients, duration).await;
                (s, measure_raw(&raw, clients, duration).await)
            } else {
                let r = measure_raw(&raw, clients, duration).await;
                (measure_store(&store, clients, duration).await, r)
            };
            let ratio = store_jps / raw_jps;
            let name = match engine {
                Engine::Sqlite => "sqlite",
                Engine::Postgres => "postgres",
            };
            println!("{name:<9} {clients:>7} {store_jps:>12.0} {raw_jps:>12.0} {ratio:>10.2}");
            results.push(json!({
                "engine": name, "clients": clients, "store_jobs_per_s": store_jps,
                "raw_jobs_per_s": raw_jps, "ratio": ratio,
            }));
            store.close().await;
        }
    }
    let at_64: Vec<_> = results.iter().filter(|r| r["clients"] == 64).collect();
    let meets = at_64
        .iter()
        .all(|r| r["ratio"].as_f64().unwrap_or(0.0) >= 0.7);
    println!(
        "target: store/raw >= 0.7 at 64 clients on both engines: {}",
        if meets { "met" } else { "NOT met" }
    );
    let out = std::env::var("SURETY_BENCH_OUT")
        .unwrap_or_else(|_| "../target/bench/store.json".to_owned());
    let out = std::path::Path::new(&out);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let report = json!({
        "benchmark": "store", "seconds_per_cell": duration.as_secs_f64(), "target_ratio_at_64": 0.7,
        "target_met": meets, "cells": results,
    });
    std::fs::write(out, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
    println!("wrote {}", out.display());
}

async fn open_store(db: &TestDb, clients: usize) -> Store {
    let mut options = StoreOptions::new(&db.url);
    options.max_connections = clients.clamp(1, 16) as u32;
    Store::open_with(&options).await.unwrap()
}

/// A job for one iteration: a fresh key, the same small input.
fn new_job(n: u64) -> NewJob {
    NewJob {
        owner: OwnerId("bench".into()),
        key: IdempotencyKey::parse(&format!("bench-{n}")).unwrap(),
        route: "triage".into(),
        contract: "support-triage".into(),
        contract_digest: "sha256:bench".into(),
        input: json!({"ticket": "My card was charged twice", "customer": 42}),
        hedgeable: false,
        fingerprint: None,
    }
}

async fn measure_store(store: &Store, clients: usize, duration: Duration) -> f64 {
    let counter = Arc::new(AtomicU64::new(0));
    let start = StartAttempt {
        provider: "fake".into(),
        slot: Slot::Primary,
        lease: Duration::from_secs(60),
    };
    let store = store.clone();
    drive(clients, duration, counter.clone(), move |n| {
        let (store, start) = (store.clone(), start.clone());
        async move {
            let new = new_job(n);
            let Created::New(job) = store.create_or_replay(&new).await.unwrap() else {
                panic!("not new")
            };
            let handle = store
                .start_attempt(&new.owner, &job.id, &start)
                .await
                .unwrap();
            store
                .finish_attempt(&handle, Outcome::Succeeded(json!({"category": "billing"})))
                .await
                .unwrap();
        }
    })
    .await
}

enum Raw {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

async fn open_raw(db: &TestDb, clients: usize) -> Raw {
    // The store runs the migrations; the raw side then talks to the same schema.
    Store::open(&db.url).await.unwrap().close().await;
    match db.engine {
        Engine::Sqlite => {
            let options = SqliteConnectOptions::from_str(&db.url)
                .unwrap()
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true);
            Raw::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(options)
                    .await
                    .unwrap(),
            )
        }
        Engine::Postgres => {
            let max = clients.clamp(1, 16) as u32;
            Raw::Postgres(
                PgPoolOptions::new()
                    .max_connections(max)
                    .connect(&db.url)
                    .await
                    .unwrap(),
            )
        }
    }
}

/// The store's own statements, in the store's order, bound and sent as is.
macro_rules! raw_life {
    ($pool:expr, $sql:expr, $begin:expr, $n:expr, $fingerprint:expr) => {{
        let (pool, sql) = ($pool, $sql);
        let id = uuid::Uuid::now_v7().to_string();
        let key = format!("bench-{}", $n);
        let input = r#"{"customer":42,"ticket":"My card was charged twice"}"#;
        sqlx::query(&sql.insert_job)
            .bind(&id)
            .bind("bench")
            .bind(&key)
            .bind("triage")
            .bind("support-triage")
            .bind("sha256:bench")
            .bind(input)
            .bind($fingerprint)
            .bind(0i64)
            .fetch_one(pool)
            .await
            .unwrap();
        let mut tx = pool.begin_with($begin).await.unwrap();
        let locked = sqlx::query(&sql.claim_job)
            .bind(&id)
            .bind("bench")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let version: i64 = locked.get("version");
        let attempt = sqlx::query(&sql.insert_attempt)
            .bind(&id)
            .bind(0i64)
            .bind(0i64)
            .bind("fake")
            .bind(version)
            .bind(60_000i64)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let ordinal: i64 = attempt.get("ordinal");
        tx.commit().await.unwrap();
        let mut tx = pool.begin_with($begin).await.unwrap();
        let won = sqlx::query(&sql.complete_job)
            .bind(&id)
            .bind(version)
            .bind(r#"{"category":"billing"}"#)
            .bind(ordinal)
            .fetch_optional(&mut *tx)
            .await
            .unwrap();
        assert!(won.is_some());
        sqlx::query(&sql.close_attempt)
            .bind(&id)
            .bind(ordinal)
            .bind("succeeded")
            .bind(None::<String>)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }};
}

async fn measure_raw(raw: &Raw, clients: usize, duration: Duration) -> f64 {
    let counter = Arc::new(AtomicU64::new(1 << 40));
    let input = json!({"ticket": "My card was charged twice", "customer": 42});
    let fingerprint = Intent {
        route: "triage",
        input: &input,
    }
    .fingerprint()
    .unwrap()
    .to_string();
    match raw {
        Raw::Sqlite(pool) => {
            let sql = Arc::new(Sql::new(Backend::Sqlite));
            let pool = pool.clone();
            drive(clients, duration, counter, move |n| {
                let (pool, sql, fingerprint) = (pool.clone(), sql.clone(), fingerprint.clone());
                async move { raw_life!(&pool, &*sql, "BEGIN IMMEDIATE", n, &fingerprint) }
            })
            .await
        }
        Raw::Postgres(pool) => {
            let sql = Arc::new(Sql::new(Backend::Postgres));
            let pool = pool.clone();
            drive(clients, duration, counter, move |n| {
                let (pool, sql, fingerprint) = (pool.clone(), sql.clone(), fingerprint.clone());
                async move {
                    raw_life!(
                        &pool,
                        &*sql,
                        "BEGIN ISOLATION LEVEL READ COMMITTED",
                        n,
                        &fingerprint
                    )
                }
            })
            .await
        }
    }
}

/// Runs `clients` closed-loop clients until `duration` has passed and
/// returns completed lives per second. Each life gets a fresh number.
async fn drive<F, Fut>(clients: usize, duration: Duration, counter: Arc<AtomicU64>, life: F) -> f64
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (life, counter, done) = (life.clone(), counter.clone(), done.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                life(counter.fetch_add(1, Ordering::Relaxed)).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tasks.join_all().await;
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
