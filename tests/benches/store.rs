//! `cargo xtask bench store`: jobs per second for a job's whole life as the
//! router lives it (create it with its first attempt, finish the attempt
//! with compare-and-swap) through the store, beside a baseline measured in
//! the same run: the same statements issued raw, with no store logic (no
//! validation, no fingerprint, no error mapping, no row decoding, no logs)
//! and no hand-off: on SQLite straight on one rusqlite connection behind a
//! mutex, on PostgreSQL through one sqlx pool of the same size as the store's.
//! The ratio is the cost of the store's code and of its writer thread. Figures go to stdout and, as JSON, to `$SURETY_BENCH_OUT`
//! (default `target/bench/store.json`).

#![expect(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark prints its figures and fails on what it did not expect"
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::Row;
use sqlx::postgres::{PgPool, PgPoolOptions};
use surety_core::{IdempotencyKey, Intent};
use surety_store::{
    Backend, Created, NewJob, Outcome, OwnerId, Returning, Slot, Sql, StartAttempt, Store,
    StoreOptions,
};
use surety_tests::{Engine, TestDb};

const CLIENTS: [usize; 3] = [1, 16, 64];

#[tokio::main]
async fn main() {
    run().await;
}

async fn run() {
    let duration = surety_tests::bench_cell();
    let mut results = Vec::new();
    println!(
        "store benchmark: a job's whole life (create with its first attempt, finish with CAS), {duration:?} per cell"
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
        kind: surety_store::JobKind::Native,
        messages: None,
        request: None,
        fingerprint: None,
    }
}

async fn measure_store(store: &Store, clients: usize, duration: Duration) -> f64 {
    let counter = Arc::new(AtomicU64::new(0));
    let start = StartAttempt {
        provider: "fake".into(),
        slot: Slot::Primary,
        lease: Duration::from_secs(60),
        trust: None,
        charges: Vec::new(),
    };
    let store = store.clone();
    drive(clients, duration, counter.clone(), move |n| {
        let (store, start) = (store.clone(), start.clone());
        async move {
            let new = new_job(n);
            let (Created::New(_), Some(handle)) =
                store.create_and_start(&new, &start).await.unwrap()
            else {
                panic!("not new")
            };
            store
                .finish_attempt(
                    &handle,
                    Outcome::Succeeded(json!({"category": "billing"}).into()),
                )
                .await
                .unwrap();
        }
    })
    .await
}

enum Raw {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(PgPool),
}

async fn open_raw(db: &TestDb, clients: usize) -> Raw {
    // The store runs the migrations; the raw side then talks to the same schema.
    Store::open(&db.url).await.unwrap().close().await;
    match db.engine {
        Engine::Sqlite => {
            let path = db.url.trim_start_matches("sqlite:");
            let path = path.split('?').next().unwrap();
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            conn.pragma_update(None, "journal_mode", "WAL").unwrap();
            conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
            conn.pragma_update(None, "foreign_keys", "ON").unwrap();
            Raw::Sqlite(Arc::new(Mutex::new(conn)))
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

/// The job's life as the store writes it on SQLite, in the store's
/// statements and order, run in place on one connection: no hand-off.
fn raw_sqlite_life(conn: &rusqlite::Connection, sql: &Sql, n: u64, fingerprint: &str) {
    let id = uuid::Uuid::now_v7().to_string();
    let key = format!("bench-{n}");
    let input = r#"{"customer":42,"ticket":"My card was charged twice"}"#;
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let (hedgeable, version): (i64, i64) = returning(
        conn,
        &sql.insert_job,
        rusqlite::params![
            id,
            "bench",
            key,
            "triage",
            "support-triage",
            "sha256:bench",
            input,
            fingerprint,
            0i64,
            "chat",
            None::<String>,
            "running"
        ],
        |row| Ok((row.get(8)?, row.get(10)?)),
    );
    let ordinal: i64 = returning(
        conn,
        &sql.insert_attempt,
        rusqlite::params![
            id,
            0i64,
            hedgeable,
            "fake",
            version,
            60_000i64,
            None::<String>,
            0i64
        ],
        |row| row.get(1),
    );
    conn.execute_batch("COMMIT").unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    returning(
        conn,
        &sql.complete_job,
        rusqlite::params![
            id,
            version,
            r#"{"category":"billing"}"#,
            ordinal,
            None::<String>
        ],
        |_| Ok(()),
    );
    let closed = conn
        .prepare_cached(&sql.close_attempt)
        .unwrap()
        .execute(rusqlite::params![id, ordinal, "succeeded", None::<String>])
        .unwrap();
    assert_eq!(closed, 1);
    conn.execute_batch("COMMIT").unwrap();
}

/// A [`Returning`] write of one row, as the store runs it: the row from
/// the statement, or (SQLite) the write and then its read-back.
fn returning<T>(
    conn: &rusqlite::Connection,
    statement: &Returning,
    params: &[&dyn rusqlite::ToSql],
    row: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> T {
    let Some(read) = &statement.read else {
        return conn
            .prepare_cached(&statement.write)
            .unwrap()
            .query_row(params, row)
            .unwrap();
    };
    let written = conn
        .prepare_cached(&statement.write)
        .unwrap()
        .execute(params);
    assert_eq!(written.unwrap(), 1);
    conn.prepare_cached(read)
        .unwrap()
        .query_row(Returning::read_params(params), row)
        .unwrap()
}

/// The job's life as the store writes it on PostgreSQL: two statements.
async fn raw_postgres_life(pool: &PgPool, sql: &Sql, n: u64, fingerprint: &str) {
    let id = uuid::Uuid::now_v7().to_string();
    let key = format!("bench-{n}");
    let input = r#"{"customer":42,"ticket":"My card was charged twice"}"#;
    let created = sqlx::query(sql.insert_job_and_attempt.as_deref().unwrap())
        .bind(&id)
        .bind("bench")
        .bind(&key)
        .bind("triage")
        .bind("support-triage")
        .bind("sha256:bench")
        .bind(input)
        .bind(fingerprint)
        .bind(0i64)
        .bind("chat")
        .bind(None::<String>)
        .bind("fake")
        .bind(60_000i64)
        .bind(None::<String>)
        .bind(0i64)
        .fetch_one(pool)
        .await
        .unwrap();
    let version: i64 = created.get(10);
    let ordinal: i64 = created.get(19);
    let won = sqlx::query(sql.complete_and_close.as_deref().unwrap())
        .bind(&id)
        .bind(version)
        .bind(r#"{"category":"billing"}"#)
        .bind(ordinal)
        .bind(None::<String>)
        .fetch_optional(pool)
        .await
        .unwrap();
    assert!(won.is_some());
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
        Raw::Sqlite(conn) => {
            let sql = Arc::new(Sql::new(Backend::Sqlite));
            let conn = conn.clone();
            drive(clients, duration, counter, move |n| {
                let (conn, sql, fingerprint) = (conn.clone(), sql.clone(), fingerprint.clone());
                async move {
                    let conn = conn.lock().unwrap();
                    raw_sqlite_life(&conn, &sql, n, &fingerprint);
                }
            })
            .await
        }
        Raw::Postgres(pool) => {
            let sql = Arc::new(Sql::new(Backend::Postgres));
            let pool = pool.clone();
            drive(clients, duration, counter, move |n| {
                let (pool, sql, fingerprint) = (pool.clone(), sql.clone(), fingerprint.clone());
                async move { raw_postgres_life(&pool, &sql, n, &fingerprint).await }
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
