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
    fn empty() -> Sample {
        Sample {
            latencies: Vec::new(),
            elapsed: Duration::ZERO,
        }
    }

    /// Both samples as one: their requests, over both their times.
    fn merge(&mut self, other: Sample) {
        self.latencies.extend(other.latencies);
        self.elapsed += other.elapsed;
    }

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
        "{:<9} {:<14} {:>10} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10} {:>10}",
        "engine",
        "load",
        "router/s",
        "p50",
        "p99",
        "direct/s",
        "p50",
        "p99",
        "added p99",
        "cpu/job µs"
    );
    let mut profiled = false;
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
        let mut loads: Vec<(String, Load)> = CLIENTS
            .iter()
            .map(|c| (format!("closed {c}"), Load::Closed(*c)))
            .collect();
        loads.extend(
            RATES
                .iter()
                .map(|r| (format!("open {r}/s"), Load::Open(*r))),
        );
        loads.retain(|(label, _)| chosen("SURETY_BENCH_CELLS", label));
        if loads.is_empty() {
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
        for (label, load) in loads {
            // With SURETY_PROFILE_OUT, the first cell runs under `perf record`.
            let profiling = profile(&router, &mut profiled);
            let cpu_before = router.cpu_seconds();
            let through = drive(&client, load, Target::Router(base.clone()), counter.clone()).await;
            let cpu_per_job_us =
                (router.cpu_seconds() - cpu_before) * 1e6 / through.latencies.len().max(1) as f64;
            if let Some(perf) = profiling {
                stop_profile(perf, through.latencies.len()).await;
            }
            let direct = drive(
                &client,
                load,
                Target::Direct(fake.openai_base_url()),
                counter.clone(),
            )
            .await;
            let added = through.pct(0.99) - direct.pct(0.99);
            println!(
                "{name:<9} {label:<14} {:>10.0} {:>8.2} {:>8.2} {:>10.0} {:>8.2} {:>8.2} {:>10.2} {:>10.0}",
                through.rate(),
                through.pct(0.5),
                through.pct(0.99),
                direct.rate(),
                direct.pct(0.5),
                direct.pct(0.99),
                added,
                cpu_per_job_us
            );
            cells.push(json!({
                "engine": name, "load": label,
                "router": {"per_s": through.rate(), "p50_ms": through.pct(0.5), "p99_ms": through.pct(0.99), "n": through.latencies.len()},
                "direct": {"per_s": direct.rate(), "p50_ms": direct.pct(0.5), "p99_ms": direct.pct(0.99), "n": direct.latencies.len()},
                "added_p99_ms": added,
                "router_cpu_per_job_us": cpu_per_job_us,
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
    for (engine, name) in [(Engine::Sqlite, "sqlite"), (Engine::Postgres, "postgres")] {
        if chosen("SURETY_BENCH_ENGINES", name) && chosen("SURETY_BENCH_CELLS", "shadow") {
            cells.extend(shadow_cost(&bin, &repo, &client, engine, name, counter_base()).await);
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

/// `perf record` of the router's threads while the first cell runs, when
/// `SURETY_PROFILE_OUT` names where its data goes (`cargo xtask profile
/// router`): the `cpu-clock` event (so each sample's period is
/// nanoseconds of CPU), call graphs by DWARF unwinding, at 999 Hz.
fn profile(router: &RouterProcess, profiled: &mut bool) -> Option<tokio::process::Child> {
    let out = std::env::var("SURETY_PROFILE_OUT").ok()?;
    if std::mem::replace(profiled, true) {
        return None;
    }
    let perf = tokio::process::Command::new("perf")
        .args([
            "record",
            "-e",
            "cpu-clock",
            "-F",
            "999",
            "--call-graph",
            "dwarf,16384",
            "-p",
        ])
        .arg(router.pid.to_string())
        .arg("-o")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("perf record starts (the profile needs Linux perf)");
    Some(perf)
}

/// Stops `perf` (SIGINT, so it writes its data out) and says how many jobs
/// the profile covers, for the per-job figures.
async fn stop_profile(mut perf: tokio::process::Child, jobs: usize) {
    if let Some(pid) = perf.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .await;
    }
    let _ = perf.wait().await;
    let out = std::env::var("SURETY_PROFILE_OUT").unwrap_or_default();
    std::fs::write(format!("{out}.jobs"), jobs.to_string()).expect("the profile's job count");
}

/// Where the shadow cells' idempotency keys start: clear of the main
/// table's, which count from 0.
fn counter_base() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(1 << 40))
}

/// Shadow checks' price (SPEC "Live certification"): the same closed-loop
/// load through a route of a primary and two fallbacks, without shadow
/// checks and with `[shadow] sampling = 0.05` (a budget that never runs
/// out), alternated ABAB in the same run; each cell's throughput ratio
/// and p99 added by the shadow checks, and the shadow calls the fallbacks
/// saw.
async fn shadow_cost(
    bin: &Path,
    repo: &Path,
    client: &reqwest::Client,
    engine: Engine,
    name: &str,
    counter: Arc<AtomicU64>,
) -> Vec<Value> {
    let mut fakes = Vec::new();
    for _ in 0..3 {
        let reply = json!({"language": "english"}).to_string();
        fakes.push(FakeProvider::replying(reply).await.unwrap());
    }
    let providers = [
        ("fake-a", &fakes[0]),
        ("fake-b", &fakes[1]),
        ("fake-c", &fakes[2]),
    ];
    let shadow = "[routes.language.shadow]\nsampling = 0.05\nhourly_budget = 100000000\n";
    let log = "info,surety_store=warn,surety_router=warn,tower_http=warn";
    let mut routers = Vec::new();
    let mut dbs = Vec::new();
    for route in ["", shadow] {
        let Some(db) = TestDb::new(engine).await else {
            return Vec::new();
        };
        let dir = serve::workspace_routed(repo, &db.url, &providers, route, "");
        routers.push((
            RouterProcess::start_with(bin, dir.path(), &[], log).await,
            dir,
        ));
        dbs.push(db);
    }
    let mut out = Vec::new();
    // Throughput where the router is the bottleneck (closed loops); the
    // p99 it adds where it is not (an open loop at 500 jobs/s).
    let loads = [
        ("closed 16", Load::Closed(16)),
        ("closed 64", Load::Closed(64)),
        ("open 500/s", Load::Open(500)),
    ];
    for (load_label, load) in loads {
        let label = format!("shadow 0.05, {load_label}");
        let mut samples = [Sample::empty(), Sample::empty()];
        // The primary answers every job: each call a fallback sees is a shadow call.
        let fallback_calls = || fakes[1..].iter().map(FakeProvider::calls).sum::<u64>();
        let before = fallback_calls();
        // The two rounds without shadow checks, apart: how far p99 moves
        // between identical runs, against which "p99 added" is read.
        let mut plain_p99 = Vec::new();
        for _round in 0..2 {
            for (i, ((router, _), sample)) in routers.iter().zip(&mut samples).enumerate() {
                let target = Target::Router(router.base.clone());
                let round = drive(client, load, target, counter.clone()).await;
                if i == 0 {
                    plain_p99.push(round.pct(0.99));
                }
                sample.merge(round);
            }
        }
        let spread = (plain_p99[0] - plain_p99[1]).abs();
        let shadow_calls = fallback_calls() - before;
        let [plain, shadowed] = &samples;
        let ratio = shadowed.rate() / plain.rate();
        let added = shadowed.pct(0.99) - plain.pct(0.99);
        let jobs = shadowed.latencies.len();
        println!(
            "{name:<9} {label:<24} without {:>7.0}/s p99 {:>6.2} ms; with {:>7.0}/s p99 {:>6.2} ms: throughput ratio {ratio:.3} (target >= 0.90), p99 added {added:+.2} ms (target <= 0.5; without vs without: {spread:.2} ms apart); {shadow_calls} shadow calls for {jobs} jobs",
            plain.rate(),
            plain.pct(0.99),
            shadowed.rate(),
            shadowed.pct(0.99),
        );
        out.push(json!({
            "engine": name, "load": label,
            "without_shadow": {"per_s": plain.rate(), "p50_ms": plain.pct(0.5), "p99_ms": plain.pct(0.99), "n": plain.latencies.len()},
            "with_shadow": {"per_s": shadowed.rate(), "p50_ms": shadowed.pct(0.5), "p99_ms": shadowed.pct(0.99), "n": jobs},
            "throughput_ratio": ratio,
            "p99_added_ms": added,
            "p99_spread_without_ms": spread,
            "shadow_calls": shadow_calls,
        }));
    }
    for (router, _) in routers {
        router.kill().await;
    }
    out
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
