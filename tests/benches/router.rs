//! `cargo xtask bench router`: load through `surety serve` (a separate
//! process, built in release) against a fake upstream that answers at once,
//! beside the same load sent straight to the fake, in the same run, on
//! SQLite and on PostgreSQL. Closed loop at 1, 16 and 64 clients; open loop
//! at fixed rates. Every job is durable before the provider call and the
//! client waits for the answer (`Prefer: wait`). Figures go to stdout and,
//! as JSON, to `$SURETY_BENCH_OUT` (default `target/bench/router.json`).
//! `SURETY_BENCH_SECS` sets a cell's length; `SURETY_BENCH_ENGINES` and
//! `SURETY_BENCH_CELLS` (comma-separated engine names and load labels)
//! choose a part of the table.

#![expect(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark prints its figures and fails on what it did not expect"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use surety_fake_provider::FakeProvider;
use surety_tests::serve::{self, KEY, RouterProcess};
use surety_tests::{Engine, TestDb};

const CLIENTS: [usize; 3] = [1, 16, 64];
const RATES: [u64; 2] = [100, 500];

use surety_tests::bench_cell as secs;

#[tokio::main]
async fn main() {
    run().await;
}

/// Latencies in microseconds, and how many requests completed in how long.
struct Sample {
    latencies: Vec<u64>,
    elapsed: Duration,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    fn pct(&self, q: f64) -> f64 {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        l.get(((l.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    }
}

async fn run() {
    let bin = PathBuf::from(
        std::env::var("SURETY_BIN").expect("SURETY_BIN: run through `cargo xtask bench router`"),
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fake = FakeProvider::replying(json!({"language": "english"}).to_string())
        .await
        .unwrap();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let mut cells = Vec::new();
    println!(
        "router benchmark: {:?} per closed-loop cell, {:?} per open-loop cell; fake upstream answers at once; latencies in ms",
        secs(),
        secs() * 4
    );
    println!(
        "{:<9} {:<14} {:>10} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10}",
        "engine", "load", "router/s", "p50", "p99", "direct/s", "p50", "p99", "added p99"
    );
    // SQLite twice: as shipped (synchronous = NORMAL) and with an fsync per
    // commit, so the durability setting's cost is measured in the same run.
    let engines = [
        (Engine::Sqlite, "sqlite", ""),
        (
            Engine::Sqlite,
            "sqlite-full",
            "sqlite_synchronous = \"full\"\n",
        ),
        (Engine::Postgres, "postgres", ""),
    ];
    for (engine, name, server) in engines {
        if !chosen("SURETY_BENCH_ENGINES", name) {
            continue;
        }
        let Some(db) = TestDb::new(engine).await else {
            continue;
        };
        let dir = serve::workspace(&repo, &db.url, &fake, server);
        // The router's own lines only: a line per request would be the load.
        let log = "info,surety_store=warn,surety_router=warn,tower_http=warn";
        let router = RouterProcess::start_with(&bin, dir.path(), &[], log).await;
        let base = router.base.clone();
        let counter = Arc::new(AtomicU64::new(0));
        let mut loads: Vec<(String, Load)> = CLIENTS
            .iter()
            .map(|c| (format!("closed {c}"), Load::Closed(*c)))
            .collect();
        loads.extend(
            RATES
                .iter()
                .map(|r| (format!("open {r}/s"), Load::Open(*r))),
        );
        for (label, load) in loads {
            if !chosen("SURETY_BENCH_CELLS", &label) {
                continue;
            }
            let through = drive(&client, load, Target::Router(base.clone()), counter.clone()).await;
            let direct = drive(
                &client,
                load,
                Target::Direct(fake.openai_base_url()),
                counter.clone(),
            )
            .await;
            let added = through.pct(0.99) - direct.pct(0.99);
            println!(
                "{name:<9} {label:<14} {:>10.0} {:>8.2} {:>8.2} {:>10.0} {:>8.2} {:>8.2} {:>10.2}",
                through.rate(),
                through.pct(0.5),
                through.pct(0.99),
                direct.rate(),
                direct.pct(0.5),
                direct.pct(0.99),
                added
            );
            cells.push(json!({
                "engine": name, "load": label,
                "router": {"per_s": through.rate(), "p50_ms": through.pct(0.5), "p99_ms": through.pct(0.99), "n": through.latencies.len()},
                "direct": {"per_s": direct.rate(), "p50_ms": direct.pct(0.5), "p99_ms": direct.pct(0.99), "n": direct.latencies.len()},
                "added_p99_ms": added,
            }));
        }
        let rss = router.rss_kib();
        println!("{name:<9} router RSS after the run: {} MiB", rss / 1024);
        cells.push(json!({"engine": name, "router_rss_kib": rss}));
        router.kill().await;
        if engine == Engine::Postgres {
            // The floor under every PostgreSQL job: it commits durably twice
            // (the job before the provider call, the result before the answer).
            let commit = durable_commits(&db, 300).await;
            println!(
                "{name:<9} one durable commit (a job makes two): p50 {:.2} ms, p99 {:.2} ms",
                commit.pct(0.5),
                commit.pct(0.99)
            );
            cells.push(json!({"engine": name, "durable_commit": {"p50_ms": commit.pct(0.5), "p99_ms": commit.pct(0.99), "n": commit.latencies.len()}}));
        }
    }
    println!(
        "targets: p99 added < 2 ms at 500 jobs/s; >= 3000 jobs/s on SQLite and >= 1000 on PostgreSQL (see the JSON)"
    );
    let out = std::env::var("SURETY_BENCH_OUT")
        .unwrap_or_else(|_| "../target/bench/router.json".to_owned());
    let out = Path::new(&out);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(out, serde_json::to_vec_pretty(&json!({"benchmark": "router", "seconds_per_closed_cell": secs().as_secs_f64(), "seconds_per_open_cell": (secs() * 4).as_secs_f64(), "cells": cells})).unwrap()).unwrap();
    println!("wrote {}", out.display());
}

/// `n` one-row inserts, each its own durable commit, one after another.
async fn durable_commits(db: &TestDb, n: usize) -> Sample {
    db.exec("CREATE TABLE bench_commit (x BIGINT)").await;
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let one = Instant::now();
        db.exec("INSERT INTO bench_commit (x) VALUES (1)").await;
        latencies.push(one.elapsed().as_micros() as u64);
    }
    Sample {
        latencies,
        elapsed: started.elapsed(),
    }
}

/// Whether `item` is in the comma-separated list in `var` (all when unset),
/// e.g. `SURETY_BENCH_ENGINES=sqlite SURETY_BENCH_CELLS="open 500/s"`.
fn chosen(var: &str, item: &str) -> bool {
    std::env::var(var).map_or(true, |list| list.split(',').any(|x| x.trim() == item))
}

#[derive(Debug, Clone, Copy)]
enum Load {
    Closed(usize),
    Open(u64),
}

#[derive(Debug, Clone)]
enum Target {
    Router(String),
    Direct(String),
}

async fn one(client: &reqwest::Client, target: &Target, n: u64) -> u64 {
    let started = Instant::now();
    let response = match target {
        Target::Router(base) => {
            client
                .post(format!("{base}/v1/jobs"))
                .bearer_auth(KEY)
                .header("Idempotency-Key", format!("bench-{n}"))
                .header("Prefer", "wait=30")
                .json(&json!({"route": "language", "input": {"text": "Hello there"}}))
                .send()
                .await
        }
        Target::Direct(base) => client
            .post(format!("{base}/chat/completions"))
            .json(
                &json!({"model": "fake", "messages": [{"role": "user", "content": "Hello there"}]}),
            )
            .send()
            .await,
    };
    let body: Value = response.unwrap().json().await.unwrap_or(Value::Null);
    if let Target::Router(_) = target {
        assert_eq!(body["state"], "succeeded", "{body}");
    }
    started.elapsed().as_micros() as u64
}

async fn drive(
    client: &reqwest::Client,
    load: Load,
    target: Target,
    counter: Arc<AtomicU64>,
) -> Sample {
    // An open-loop cell's p99 rests on its slowest 1%: four times the cell
    // length (12 s by default, 6,000 requests at 500/s) keeps it steady.
    let duration = match load {
        Load::Closed(_) => secs(),
        Load::Open(_) => secs() * 4,
    };
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    match load {
        Load::Closed(clients) => {
            for _ in 0..clients {
                let (client, target, counter) = (client.clone(), target.clone(), counter.clone());
                tasks.spawn(async move {
                    let mut latencies = Vec::new();
                    while started.elapsed() < duration {
                        latencies.push(
                            one(&client, &target, counter.fetch_add(1, Ordering::Relaxed)).await,
                        );
                    }
                    latencies
                });
            }
        }
        Load::Open(rate) => {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while started.elapsed() < duration {
                tick.tick().await;
                let (client, target, n) = (
                    client.clone(),
                    target.clone(),
                    counter.fetch_add(1, Ordering::Relaxed),
                );
                tasks.spawn(async move { vec![one(&client, &target, n).await] });
            }
        }
    }
    let latencies = tasks.join_all().await.into_iter().flatten().collect();
    Sample {
        latencies,
        elapsed: started.elapsed(),
    }
}
