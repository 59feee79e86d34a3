//! `cargo xtask bench router`: load through `surety serve` (a separate
//! process, built in release) against a fake upstream that answers at once,
//! beside the same load sent straight to the fake, in the same run, on
//! SQLite and on PostgreSQL. Closed loop at 1, 16 and 64 clients, driven
//! by `wrk` (a second process, in C: the load costs the two cores far less
//! than the router, as when the issue measured surety); open loop at fixed
//! rates, in process. Every job is durable before the provider call and the
//! client waits for the answer (`Prefer: wait`). Each cell also drives a
//! proxy that keeps nothing (`surety-null-proxy`: the router's accept loop,
//! provider client, runtime and allocator, forwarding bytes), so what the router adds
//! beyond what any proxy adds on this machine is measured in the same run,
//! however the host's speed drifts. The `dialects` cell asks one router
//! for the same job through the native API, Chat Completions, the
//! Responses API and Anthropic's Messages, in turn, and reports each beside the native API. Figures go to stdout and,
//! as JSON, to `$SURETY_BENCH_OUT` (default `target/bench/router.json`).
//! `SURETY_BENCH_SECS` sets a cell's length; `SURETY_BENCH_ENGINES` and
//! `SURETY_BENCH_CELLS` (comma-separated engine names and load labels)
//! choose a part of the table; `SURETY_BENCH_BUDGETS=1` gives every cell's
//! router the budgets cell's budgets.

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

use reqwest::Client;
use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Keep, Script};
use surety_harness::progress::Progress;
use surety_tests::serve::{self, KEY, RouterProcess};
use surety_tests::{Engine, TestDb};

const CLIENTS: [usize; 3] = [1, 16, 64];
const RATES: [u64; 2] = [100, 500];

use surety_tests::bench_cell as secs;

#[tokio::main]
async fn main() {
    run().await;
}

/// How many requests completed in how long, and their latencies in
/// microseconds: each one's (the in-process load), or 1,000 quantiles
/// standing for them (`wrk`'s, which keeps a histogram).
struct Sample {
    count: u64,
    /// Requests the router refused with 429 (not in `count`).
    shed: u64,
    latencies: Vec<u64>,
    elapsed: Duration,
    /// Open loop: how late each of [`Lateness`]'s wake-ups came, µs.
    late: Vec<u64>,
}

impl Sample {
    fn empty() -> Sample {
        Sample {
            count: 0,
            shed: 0,
            latencies: Vec::new(),
            elapsed: Duration::ZERO,
            late: Vec::new(),
        }
    }

    fn of(latencies: Vec<u64>, elapsed: Duration) -> Sample {
        Sample {
            count: latencies.len() as u64,
            shed: 0,
            latencies,
            elapsed,
            late: Vec::new(),
        }
    }

    /// Both samples as one: their requests, over both their times (two
    /// `wrk` runs' quantiles pooled weigh alike: ABAB rounds of one length).
    fn merge(&mut self, other: Sample) {
        self.count += other.count;
        self.shed += other.shed;
        self.latencies.extend(other.latencies);
        self.elapsed += other.elapsed;
        self.late.extend(other.late);
    }

    /// Its rate, latencies and count, as the JSON has them.
    fn json(&self) -> Value {
        json!({"per_s": self.rate(), "p50_ms": self.pct(0.5), "p99_ms": self.pct(0.99), "n": self.count})
    }

    fn rate(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }

    fn pct(&self, q: f64) -> f64 {
        quantile(&self.latencies, q) as f64 / 1000.0
    }

    /// The host's wake-up lateness in this sample, µs: p50, p99, max.
    fn lateness(&self) -> (u64, u64, u64) {
        (
            quantile(&self.late, 0.5),
            quantile(&self.late, 0.99),
            quantile(&self.late, 1.0),
        )
    }
}

/// A row's columns from rate to added p99: `through`'s rate, p50 and p99,
/// the upstream's alone (`direct`), and the p99 `through` adds to it.
fn beside(through: &Sample, direct: &Sample) -> String {
    format!(
        "{:>10.0} {:>8.2} {:>8.2} {:>10.0} {:>8.2} {:>8.2} {:>10.2}",
        through.rate(),
        through.pct(0.5),
        through.pct(0.99),
        direct.rate(),
        direct.pct(0.5),
        direct.pct(0.99),
        through.pct(0.99) - direct.pct(0.99),
    )
}

/// The `q` quantile of `values` (0 when there are none).
fn quantile(values: &[u64], q: f64) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(0)
}

/// The machine's own scheduling delay while an open-loop cell runs, as
/// cyclictest measures it: a thread asks to sleep 1 ms, again and again,
/// and records how much later than asked each wake-up comes. A job at 500
/// jobs/s is a chain of such wake-ups (the client's, the router's threads',
/// the upstream's, each side of each socket), so when this thread's p99
/// is a good part of a millisecond, so is the added p99 of any chain of
/// them, whatever the router's own work.
struct Lateness {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<u64>>,
}

impl Lateness {
    fn start() -> Lateness {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let asked = Duration::from_millis(1);
            let mut late = Vec::with_capacity(64 * 1024);
            while !stopped.load(Ordering::Relaxed) {
                let before = Instant::now();
                std::thread::sleep(asked);
                late.push(before.elapsed().saturating_sub(asked).as_micros() as u64);
            }
            late
        });
        Lateness { stop, thread }
    }

    fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// A router build under test: `head` (the work tree's), and with
/// `--compare` the base it is compared with.
struct Build {
    name: String,
    bin: PathBuf,
}

/// One build's figures in one cell.
struct Measured {
    sample: Sample,
    cpu: Cpu,
}

impl Measured {
    /// The router's CPU per job, µs.
    fn cpu_per_job_us(&self) -> f64 {
        self.per_job_us(self.cpu.router)
    }

    fn per_job_us(&self, seconds: f64) -> f64 {
        seconds * 1e6 / self.sample.count.max(1) as f64
    }

    fn json(&self) -> Value {
        let c = &self.cpu;
        let (late_p50, late_p99, late_max) = self.sample.lateness();
        json!({"router_run_queue_wait_per_job_us": self.per_job_us(c.router_waiting),
            "router_disk_read_per_job_bytes": c.router_disk_read / self.sample.count.max(1) as f64,
            "router_disk_read_ahead_per_job_bytes": c.router_disk_read_ahead / self.sample.count.max(1) as f64,
            "host_wake_up_late_us": {"p50": late_p50, "p99": late_p99, "max": late_max, "n": self.sample.late.len()},
            "per_s": self.sample.rate(), "p50_ms": self.sample.pct(0.5), "p99_ms": self.sample.pct(0.99), "n": self.sample.count, "shed": self.sample.shed, "cpu_per_job_us": self.cpu_per_job_us(),
            "cpu_per_job_us_by_process": {"router": self.per_job_us(c.router), "postgres": self.per_job_us(c.postgres), "bench": self.per_job_us(c.bench), "wrk": self.per_job_us(c.wrk)}})
    }
}

/// CPU seconds used by each process a cell runs on the machine's cores:
/// the router; every PostgreSQL process (server, backends, background
/// workers: zero-ish on SQLite); this benchmark's process (the fake
/// upstream, and the open loop's client); `wrk` (the closed loops' client).
#[derive(Debug, Default, Clone, Copy)]
struct Cpu {
    router: f64,
    /// Seconds the router's threads were ready to run but waited for a core.
    router_waiting: f64,
    /// Bytes the router had read from the disk: by the threads that serve
    /// requests and commit, and by the SQLite checkpointer (ahead of them).
    router_disk_read: f64,
    router_disk_read_ahead: f64,
    postgres: f64,
    bench: f64,
    wrk: f64,
}

impl Cpu {
    fn now(router: &RouterProcess) -> Cpu {
        let me = serve::cpu_seconds_of("self");
        let reads = router.disk_read_bytes();
        Cpu {
            router: router.cpu_seconds(),
            router_waiting: router.run_queue_seconds(),
            router_disk_read: (reads.all - reads.checkpointer) as f64,
            router_disk_read_ahead: reads.checkpointer as f64,
            postgres: serve::postgres_cpu_seconds(),
            bench: me.own,
            wrk: me.children,
        }
    }

    /// Adds what was used since `before`, read against `router`.
    fn add_since(&mut self, before: Cpu, router: &RouterProcess) {
        let now = Cpu::now(router);
        self.router += now.router - before.router;
        self.router_waiting += now.router_waiting - before.router_waiting;
        self.router_disk_read += now.router_disk_read - before.router_disk_read;
        self.router_disk_read_ahead += now.router_disk_read_ahead - before.router_disk_read_ahead;
        self.postgres += now.postgres - before.postgres;
        self.bench += now.bench - before.bench;
        self.wrk += now.wrk - before.wrk;
    }
}

fn builds() -> Vec<Build> {
    let head = Build {
        name: "head".to_owned(),
        bin: PathBuf::from(
            std::env::var("SURETY_BIN")
                .expect("SURETY_BIN: run through `cargo xtask bench router`"),
        ),
    };
    match std::env::var("SURETY_BASE_BIN") {
        Ok(base) => vec![
            Build {
                name: std::env::var("SURETY_BASE_NAME").unwrap_or_else(|_| "base".to_owned()),
                bin: PathBuf::from(base),
            },
            head,
        ],
        Err(_) => vec![head],
    }
}

async fn run() {
    let builds = builds();
    let comparing = builds.len() > 1;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // An upstream that keeps nothing per call. A fake that recorded each
    // call grew with every job (only the router's calls carry a key), and
    // its page faults stalled its answers for 5-8 ms at a time, which the
    // open loop charged to the router (p99 at 500 jobs/s 3.5-4.4 ms, 1.6
    // ms without).
    let fake = FakeProvider::start(Script {
        keep: Keep::Totals,
        ..Script::always(Behavior::Reply(json!({"language": "english"}).to_string()))
    })
    .await
    .unwrap();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let mut cells = Vec::new();
    let mut ratios = Vec::new();
    println!(
        "router benchmark: {:?} per closed-loop cell, {:?} per open-loop cell; fake upstream answers at once; latencies in ms",
        secs(),
        secs() * 4
    );
    if comparing {
        println!(
            "comparing {} (base) with the work tree (head): each cell runs base, head, base, head, and each build's figures are over its two runs",
            builds[0].name
        );
    }
    println!(
        "{:<11} {:<9} {:<14} {:>10} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "build",
        "engine",
        "load",
        "router/s",
        "p50",
        "p99",
        "direct/s",
        "p50",
        "p99",
        "added p99",
        "cpu/job µs",
        "pg µs",
        "fake µs",
        "wrk µs"
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
        // PostgreSQL with four times the default pool: do more connections
        // (more commits in flight for the server to group) raise throughput?
        (
            Engine::Postgres,
            "postgres-32",
            "database_connections = 32\n",
        ),
    ];
    // The closed and open cells chosen, the same for every engine.
    let loads: Vec<(String, Load)> = CLIENTS
        .iter()
        .map(|c| (format!("closed {c}"), Load::Closed(*c)))
        .chain(
            RATES
                .iter()
                .map(|r| (format!("open {r}/s"), Load::Open(*r))),
        )
        .filter(|(label, _)| chosen("SURETY_BENCH_CELLS", label))
        .collect();
    // Where the run is: a bar on a terminal, a line per cell off one.
    const SPECIAL: [&str; 4] = ["streams", "dialects", "shadow", "budgets"];
    let total = engines
        .iter()
        .filter(|(_, name, _)| chosen("SURETY_BENCH_ENGINES", name))
        .count()
        * loads.len()
        + ["sqlite", "postgres"]
            .iter()
            .filter(|name| chosen("SURETY_BENCH_ENGINES", name))
            .count()
            * SPECIAL
                .iter()
                .filter(|c| chosen("SURETY_BENCH_CELLS", c))
                .count();
    let mut progress = Progress::new("bench router", total as u64);
    for (engine, name, server) in engines {
        if !chosen("SURETY_BENCH_ENGINES", name) {
            continue;
        }
        if loads.is_empty() {
            continue;
        }
        // A router per build, each on a database of its own.
        let mut routers = Vec::new();
        for build in &builds {
            let Some(db) = TestDb::new(engine).await else {
                break;
            };
            // SURETY_BENCH_BUDGETS=1: every cell's router counts the
            // owner's budgets (to profile them: `cargo xtask profile router`).
            let budgets = match std::env::var_os("SURETY_BENCH_BUDGETS") {
                Some(_) => BUDGETS,
                None => "",
            };
            let dir =
                serve::workspace_routed(&repo, &db.url, &[("fake-a", &fake)], budgets, server);
            let log = router_log();
            let router = RouterProcess::start_with(&build.bin, dir.path(), &[], &log).await;
            routers.push((router, dir, db));
        }
        if routers.len() < builds.len() {
            continue;
        }
        // The floor: a proxy that keeps nothing, built and sized as the
        // router is, on the same machine, to the same upstream (its config
        // is the first router's, so its runtime is sized for this engine).
        let proxy = RouterProcess::start_with(
            Path::new(env!("CARGO_BIN_EXE_surety-null-proxy")),
            routers[0].1.path(),
            &[],
            "warn",
        )
        .await;
        let counter = Arc::new(AtomicU64::new(0));
        for (label, load) in loads.iter().cloned() {
            let mut measured: Vec<Measured> = builds
                .iter()
                .map(|_| Measured {
                    sample: Sample::empty(),
                    cpu: Cpu::default(),
                })
                .collect();
            // The proxy that keeps nothing, driven in each round after the
            // builds, so the machine's drift weighs on it as on them.
            let (mut floor, mut floor_cpu) = (Sample::empty(), 0.0);
            // Compared builds alternate, ABAB, so a drift of the machine
            // weighs on both alike.
            for _round in 0..if comparing { 2 } else { 1 } {
                for ((router, _, _), m) in routers.iter().zip(&mut measured) {
                    // With SURETY_PROFILE_OUT, the first cell runs under `perf record`.
                    let profiling = profile(router, engine, &mut profiled);
                    let cpu_before = Cpu::now(router);
                    let round = drive(
                        &client,
                        load,
                        Target::Router(router.base.clone()),
                        counter.clone(),
                    )
                    .await;
                    m.cpu.add_since(cpu_before, router);
                    if let Some(profiling) = profiling {
                        stop_profile(profiling, round.count).await;
                    }
                    m.sample.merge(round);
                }
                let cpu_before = proxy.cpu_seconds();
                let round = drive(
                    &client,
                    load,
                    Target::Direct(format!("{}/v1", proxy.base)),
                    counter.clone(),
                )
                .await;
                floor_cpu += proxy.cpu_seconds() - cpu_before;
                floor.merge(round);
            }
            let direct = drive(
                &client,
                load,
                Target::Direct(fake.openai_base_url()),
                counter.clone(),
            )
            .await;
            let direct_late = direct.lateness();
            let floor_cpu_per_job = floor_cpu * 1e6 / floor.count.max(1) as f64;
            let floor_added = floor.pct(0.99) - direct.pct(0.99);
            println!(
                "{:<11} {name:<9} {label:<14} {} {floor_cpu_per_job:>10.0}",
                "null-proxy",
                beside(&floor, &direct),
            );
            let mut cell = json!({
                "engine": name, "load": label,
                "direct": {"per_s": direct.rate(), "p50_ms": direct.pct(0.5), "p99_ms": direct.pct(0.99), "n": direct.count,
                    "host_wake_up_late_us": {"p50": direct_late.0, "p99": direct_late.1, "max": direct_late.2, "n": direct.late.len()}},
            });
            cell["null_proxy"] = json!({"per_s": floor.rate(), "p50_ms": floor.pct(0.5), "p99_ms": floor.pct(0.99), "n": floor.count,
                "added_p99_ms": floor_added, "cpu_per_job_us": floor_cpu_per_job});
            if !floor.late.is_empty() {
                // Open loop only: the host's wake-up lateness while it ran.
                cell["null_proxy"]["host_wake_up_late_us"] =
                    json!({"p99": floor.lateness().1, "n": floor.late.len()});
            }
            for (build, m) in builds.iter().zip(&measured) {
                let through = &m.sample;
                let added = through.pct(0.99) - direct.pct(0.99);
                println!(
                    "{:<11} {name:<9} {label:<14} {} {:>10.0} {:>8.0} {:>8.0} {:>8.0}",
                    build.name,
                    beside(through, &direct),
                    m.cpu_per_job_us(),
                    m.per_job_us(m.cpu.postgres),
                    m.per_job_us(m.cpu.bench),
                    m.per_job_us(m.cpu.wrk),
                );
                if !through.late.is_empty() {
                    let (p50, p99, max) = through.lateness();
                    let (_, direct_p99, _) = direct_late;
                    println!(
                        "{:<11} {name:<9} {label:<14} the router read {:.0} bytes per job from the disk (and its checkpointer {:.0} ahead of it); its threads waited {:.0} µs per job for a core; a 1 ms sleep woke late by p50 {p50} µs, p99 {p99}, max {max} (while the upstream alone was driven: p99 {direct_p99})",
                        build.name,
                        m.cpu.router_disk_read / through.count.max(1) as f64,
                        m.cpu.router_disk_read_ahead / through.count.max(1) as f64,
                        m.per_job_us(m.cpu.router_waiting),
                    );
                }
                println!(
                    "{:<11} {name:<9} {label:<14} beyond the proxy that keeps nothing, the router adds p50 {:.2} ms, p99 {:.2} ms, {:.0} µs of CPU per job",
                    build.name,
                    through.pct(0.5) - floor.pct(0.5),
                    through.pct(0.99) - floor.pct(0.99),
                    m.cpu_per_job_us() - floor_cpu_per_job,
                );
                if through.shed > 0 {
                    println!(
                        "{:<11} {name:<9} {label:<14} {} requests shed (429): this rate is past what the router serves here",
                        build.name, through.shed
                    );
                }
                let key = if build.name == "head" {
                    "router"
                } else {
                    "base"
                };
                cell[key] = m.json();
                cell[key]["added_p99_ms"] = json!(added);
                if key == "router" {
                    // The fields earlier reports had at the top of a cell.
                    cell["added_p99_ms"] = json!(added);
                    cell["added_p99_beyond_null_proxy_ms"] =
                        json!(through.pct(0.99) - floor.pct(0.99));
                    cell["router_cpu_per_job_us"] = json!(m.cpu_per_job_us());
                }
            }
            if let [base, head] = &measured[..] {
                let ratio = json!({
                    "throughput": head.sample.rate() / base.sample.rate(),
                    "p50": head.sample.pct(0.5) / base.sample.pct(0.5),
                    "p99": head.sample.pct(0.99) / base.sample.pct(0.99),
                    "cpu_per_job": head.cpu_per_job_us() / base.cpu_per_job_us(),
                });
                ratios.push((name, label.clone(), ratio.clone()));
                cell["ratio_head_to_base"] = ratio;
            }
            cells.push(cell);
            progress.advance(1, &format!("{name} {label}"), true);
        }
        for (build, (router, _, _)) in builds.iter().zip(&routers) {
            let rss = router.rss_kib();
            println!(
                "{:<11} {name:<9} router RSS after the run: {} MiB",
                build.name,
                rss / 1024
            );
            cells.push(json!({"engine": name, "build": build.name, "router_rss_kib": rss}));
        }
        proxy.kill().await;
        let mut dbs = Vec::new();
        for (router, _, db) in routers {
            router.kill().await;
            dbs.push(db);
        }
        if name == "postgres"
            && let Some(db) = dbs.first()
        {
            // The floor under every PostgreSQL job: it commits durably twice
            // (the job before the provider call, the result before the answer).
            let commit = durable_commits(db, 300).await;
            println!(
                "{name:<9} one durable commit (a job makes two): p50 {:.2} ms, p99 {:.2} ms",
                commit.pct(0.5),
                commit.pct(0.99)
            );
            cells.push(json!({"engine": name, "durable_commit": {"p50_ms": commit.pct(0.5), "p99_ms": commit.pct(0.99), "n": commit.count}}));
        }
    }
    if !ratios.is_empty() {
        println!(
            "head / {} (above 1 is more for throughput, below 1 is less for latency and CPU):",
            builds[0].name
        );
        println!(
            "{:<9} {:<14} {:>10} {:>8} {:>8} {:>10}",
            "engine", "load", "jobs/s", "p50", "p99", "cpu/job"
        );
        for (engine, label, r) in &ratios {
            println!(
                "{engine:<9} {label:<14} {:>10.3} {:>8.3} {:>8.3} {:>10.3}",
                r["throughput"].as_f64().unwrap_or(f64::NAN),
                r["p50"].as_f64().unwrap_or(f64::NAN),
                r["p99"].as_f64().unwrap_or(f64::NAN),
                r["cpu_per_job"].as_f64().unwrap_or(f64::NAN),
            );
        }
    }
    let head = &builds[builds.len() - 1].bin;
    for (engine, name) in [(Engine::Sqlite, "sqlite"), (Engine::Postgres, "postgres")] {
        if !chosen("SURETY_BENCH_ENGINES", name) {
            continue;
        }
        for special in SPECIAL.iter().filter(|c| chosen("SURETY_BENCH_CELLS", c)) {
            match *special {
                "streams" => cells.extend(streams(head, &repo, &fake, engine, name).await),
                "dialects" => {
                    cells.extend(dialects(head, &repo, &fake, engine, name, counter_base()).await);
                }
                "shadow" => {
                    cells.extend(
                        shadow_cost(head, &repo, &client, engine, name, counter_base()).await,
                    );
                }
                _ => {
                    let cell = (&fake, engine, name);
                    cells.extend(budgets_cost(head, &repo, &client, cell, counter_base()).await);
                }
            }
            progress.advance(1, &format!("{name} {special}"), true);
        }
    }
    progress.finish();
    println!(
        "targets: >= 8000 jobs/s on SQLite and >= 3000 on PostgreSQL at 64 clients; p99 added <= 1 ms at 500 jobs/s on SQLite (see the JSON)"
    );
    let out = std::env::var("SURETY_BENCH_OUT")
        .unwrap_or_else(|_| "../target/bench/router.json".to_owned());
    let out = Path::new(&out);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let compared = comparing.then(|| builds[0].name.clone());
    std::fs::write(out, serde_json::to_vec_pretty(&json!({"benchmark": "router", "compared_with": compared, "seconds_per_closed_cell": secs().as_secs_f64(), "seconds_per_open_cell": (secs() * 4).as_secs_f64(), "cells": cells})).unwrap()).unwrap();
    println!("wrote {}", out.display());
}

/// `perf record` of the router's threads while the first cell runs, when
/// `SURETY_PROFILE_OUT` names where its data goes (`cargo xtask profile
/// router`): the `cpu-clock` event (so each sample's period is
/// nanoseconds of CPU), call graphs by DWARF unwinding, at 999 Hz. On
/// PostgreSQL every CPU is sampled, so the server's processes (which the
/// router's statements keep busy, and which start as the pool connects)
/// are in the profile too.
struct Profiling {
    perf: tokio::process::Child,
    out: String,
    router_pid: u32,
    whole_machine: bool,
}

fn profile(router: &RouterProcess, engine: Engine, profiled: &mut bool) -> Option<Profiling> {
    let out = std::env::var("SURETY_PROFILE_OUT").ok()?;
    if std::mem::replace(profiled, true) {
        return None;
    }
    let whole_machine = engine == Engine::Postgres;
    let mut perf = tokio::process::Command::new("perf");
    perf.args([
        "record",
        "-e",
        "cpu-clock",
        "-F",
        "999",
        "--call-graph",
        "dwarf,16384",
    ]);
    if whole_machine {
        perf.arg("-a");
    } else {
        perf.arg("-p").arg(router.pid.to_string());
    }
    let perf = perf
        .arg("-o")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("perf record starts (the profile needs Linux perf)");
    Some(Profiling {
        perf,
        out,
        router_pid: router.pid,
        whole_machine,
    })
}

/// Stops `perf` (SIGINT, so it writes its data out) and says, in
/// `<out>.json`, what the profile covers: how many jobs (for the per-job
/// figures), which process is the router, and whether the whole machine
/// was sampled.
async fn stop_profile(mut profiling: Profiling, jobs: u64) {
    if let Some(pid) = profiling.perf.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .await;
    }
    let _ = profiling.perf.wait().await;
    let covers = json!({
        "jobs": jobs,
        "router_pid": profiling.router_pid,
        "whole_machine": profiling.whole_machine,
    });
    std::fs::write(format!("{}.json", profiling.out), covers.to_string())
        .expect("what the profile covers");
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
    let Some((routers, _dbs)) = pair(bin, repo, engine, &providers, ["", shadow]).await else {
        return Vec::new();
    };
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
        // The primary answers every job: each call a fallback sees is a shadow call.
        let fallback_calls = || fakes[1..].iter().map(FakeProvider::calls).sum::<u64>();
        let before = fallback_calls();
        let (samples, spread) = alternated(client, load, &routers, &counter).await;
        let shadow_calls = fallback_calls() - before;
        let [plain, shadowed] = &samples;
        let ratio = shadowed.rate() / plain.rate();
        let added = shadowed.pct(0.99) - plain.pct(0.99);
        let jobs = shadowed.count;
        println!(
            "{name:<9} {label:<24} without {:>7.0}/s p99 {:>6.2} ms; with {:>7.0}/s p99 {:>6.2} ms: throughput ratio {ratio:.3} (target >= 0.90), p99 added {added:+.2} ms (target <= 0.5; without vs without: {spread:.2} ms apart); {shadow_calls} shadow calls for {jobs} jobs",
            plain.rate(),
            plain.pct(0.99),
            shadowed.rate(),
            shadowed.pct(0.99),
        );
        out.push(json!({
            "engine": name, "load": label,
            "without_shadow": plain.json(),
            "with_shadow": shadowed.json(),
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

/// Two routers of `providers`, each on a database of its own: the first
/// with `routes[0]` after its route, the second with `routes[1]`.
async fn pair(
    bin: &Path,
    repo: &Path,
    engine: Engine,
    providers: &[(&str, &FakeProvider)],
    routes: [&str; 2],
) -> Option<(Vec<(RouterProcess, tempfile::TempDir)>, Vec<TestDb>)> {
    let log = router_log();
    let mut routers = Vec::new();
    let mut dbs = Vec::new();
    for route in routes {
        let db = TestDb::new(engine).await?;
        let dir = serve::workspace_routed(repo, &db.url, providers, route, "");
        routers.push((
            RouterProcess::start_with(bin, dir.path(), &[], &log).await,
            dir,
        ));
        dbs.push(db);
    }
    Some((routers, dbs))
}

/// `load` through the two routers (without and with what is measured),
/// alternated ABAB in the same run: each one's two rounds merged, and how
/// far the first's two rounds' p99 lie apart (against which a p99 added
/// is read).
async fn alternated(
    client: &reqwest::Client,
    load: Load,
    routers: &[(RouterProcess, tempfile::TempDir)],
    counter: &Arc<AtomicU64>,
) -> ([Sample; 2], f64) {
    let mut samples = [Sample::empty(), Sample::empty()];
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
    (samples, (plain_p99[0] - plain_p99[1]).abs())
}

/// The owner's two budgets of the budgets cell (tokens a day, tokens a
/// rolling hour), never reached.
const BUDGETS: &str = "[[budgets]]\nname = \"acme-day\"\nowner = \"acme\"\nlimit = 1e15\nunit = \"tokens\"\nperiod = \"day\"\n\
                       [[budgets]]\nname = \"acme-hour\"\nowner = \"acme\"\nlimit = 1e15\nunit = \"tokens\"\nperiod = \"rolling\"\nwindow_ms = 3600000\n";

/// Budgets' price: the same closed-loop load through one route, without
/// budgets and with the owner's two (tokens a day, tokens a rolling hour,
/// never reached), so every attempt's worst case is counted by the
/// provider's tokenizer and reserved of both in the transaction that
/// records it, and settled as it ends; alternated ABAB in the same run.
async fn budgets_cost(
    bin: &Path,
    repo: &Path,
    client: &reqwest::Client,
    (fake, engine, name): (&FakeProvider, Engine, &str),
    counter: Arc<AtomicU64>,
) -> Vec<Value> {
    let providers = [("fake-a", fake)];
    let Some((routers, _dbs)) = pair(bin, repo, engine, &providers, ["", BUDGETS]).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (load_label, load) in [
        ("closed 16", Load::Closed(16)),
        ("closed 64", Load::Closed(64)),
    ] {
        let label = format!("budgets, {load_label}");
        let (samples, spread) = alternated(client, load, &routers, &counter).await;
        let [plain, budgeted] = &samples;
        let ratio = budgeted.rate() / plain.rate();
        let added = budgeted.pct(0.99) - plain.pct(0.99);
        println!(
            "{name:<9} {label:<24} without {:>7.0}/s p99 {:>6.2} ms; with {:>7.0}/s p99 {:>6.2} ms: throughput ratio {ratio:.3} (target >= 0.90), p99 added {added:+.2} ms (without vs without: {spread:.2} ms apart)",
            plain.rate(),
            plain.pct(0.99),
            budgeted.rate(),
            budgeted.pct(0.99),
        );
        out.push(json!({
            "engine": name, "load": label,
            "without_budgets": plain.json(),
            "with_budgets": budgeted.json(),
            "throughput_ratio": ratio,
            "p99_added_ms": added,
            "p99_spread_without_ms": spread,
        }));
    }
    for (router, _) in routers {
        router.kill().await;
    }
    out
}

/// Concurrent streams through the facade.
const STREAMS: usize = 512;

/// [`STREAMS`] streamed chat completions through the facade at once (a
/// pinned prompt, each its own key): every stream must arrive whole — a
/// `chat.completion.chunk` frame per piece, whose content makes the
/// contract's answer, a `stop` finish and `data: [DONE]` last — or the
/// benchmark fails. The time to the first frame, beside the same number
/// of calls sent straight to the fake at once (which answers whole, at
/// once): the added time to first byte.
async fn streams(
    bin: &Path,
    repo: &Path,
    fake: &FakeProvider,
    engine: Engine,
    name: &str,
) -> Vec<Value> {
    let Some(db) = TestDb::new(engine).await else {
        return Vec::new();
    };
    let server = "max_connections = 4096\nowner_max_in_flight = 1024\n";
    let dir = serve::workspace(repo, &db.url, fake, server);
    let log = router_log();
    let router = RouterProcess::start_with(bin, dir.path(), &[], &log).await;
    let contract =
        surety_contracts::Contract::load(&repo.join("contracts/language-detect")).unwrap();
    let rendered = contract.render(&json!({"text": "Hello there"})).unwrap();
    let messages = json!([
        {"role": "system", "content": rendered.system},
        {"role": "user", "content": rendered.user},
    ]);
    // A client of its own: a connection per stream, none reused mid-cell.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(STREAMS)
        .build()
        .unwrap();
    let go = Arc::new(tokio::sync::Barrier::new(STREAMS));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..STREAMS {
        let (client, go, base, messages) = (
            client.clone(),
            go.clone(),
            router.base.clone(),
            messages.clone(),
        );
        tasks.spawn(async move {
            go.wait().await;
            let sent = Instant::now();
            let mut response = client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(KEY)
                .header("Idempotency-Key", format!("stream-{n}"))
                .json(&json!({"model": "language", "messages": messages, "stream": true}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "stream {n}");
            let mut first = None;
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.unwrap() {
                first.get_or_insert_with(|| sent.elapsed());
                body.extend_from_slice(&chunk);
            }
            let whole = whole_stream(&String::from_utf8(body).unwrap());
            assert_eq!(whole, Ok(json!({"language": "english"})), "stream {n}");
            (
                first.unwrap_or_default().as_micros() as u64,
                sent.elapsed().as_micros() as u64,
            )
        });
    }
    let results = tasks.join_all().await;
    let elapsed = started.elapsed();
    let first = Sample::of(results.iter().map(|r| r.0).collect(), elapsed);
    let whole = Sample::of(results.iter().map(|r| r.1).collect(), elapsed);
    // The upstream alone, as many at once.
    let go = Arc::new(tokio::sync::Barrier::new(STREAMS));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        let (client, go, base) = (client.clone(), go.clone(), fake.openai_base_url());
        tasks.spawn(async move {
            go.wait().await;
            let sent = Instant::now();
            let response = client
                .post(format!("{base}/chat/completions"))
                .json(&json!({"model": "fake", "messages": [{"role": "user", "content": "Hello there"}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            sent.elapsed().as_micros() as u64
        });
    }
    let direct = Sample::of(tasks.join_all().await, elapsed);
    let rss = router.rss_kib();
    router.kill().await;
    let added = (
        first.pct(0.5) - direct.pct(0.5),
        first.pct(0.99) - direct.pct(0.99),
    );
    println!(
        "{name:<9} {STREAMS} streams at once: {STREAMS} complete in {:.0} ms; first frame p50 {:.2} ms, p99 {:.2} ms (upstream alone, as many at once: p50 {:.2}, p99 {:.2}; added p50 {:.2}, p99 {:.2}); whole stream p99 {:.2} ms; RSS {} MiB",
        elapsed.as_secs_f64() * 1e3,
        first.pct(0.5),
        first.pct(0.99),
        direct.pct(0.5),
        direct.pct(0.99),
        added.0,
        added.1,
        whole.pct(0.99),
        rss / 1024,
    );
    vec![json!({
        "engine": name, "load": format!("{STREAMS} streams at once"),
        "complete": STREAMS,
        "first_frame": {"p50_ms": first.pct(0.5), "p99_ms": first.pct(0.99)},
        "whole_stream": {"p50_ms": whole.pct(0.5), "p99_ms": whole.pct(0.99)},
        "direct": {"p50_ms": direct.pct(0.5), "p99_ms": direct.pct(0.99)},
        "added_first_frame_ms": {"p50": added.0, "p99": added.1},
        "router_rss_kib": rss,
    })]
}

/// Clients of each dialect at once, in the dialects cell.
const DIALECT_CLIENTS: usize = 16;

/// The same job asked for in each dialect, one router, the same run: the
/// native API, Chat Completions, the Responses API and Anthropic's
/// Messages on a pinned route
/// (the contract's prompt), [`DIALECT_CLIENTS`] closed-loop clients each,
/// in turn, twice (ABCDABCD, so the machine's drift weighs on all alike);
/// jobs/s and latency per dialect, and each facade's ratio to the native
/// API.
async fn dialects(
    bin: &Path,
    repo: &Path,
    fake: &FakeProvider,
    engine: Engine,
    name: &str,
    counter: Arc<AtomicU64>,
) -> Vec<Value> {
    let Some(db) = TestDb::new(engine).await else {
        return Vec::new();
    };
    let dir = serve::workspace(repo, &db.url, fake, "");
    let log = router_log();
    let router = RouterProcess::start_with(bin, dir.path(), &[], &log).await;
    let contract =
        surety_contracts::Contract::load(&repo.join("contracts/language-detect")).unwrap();
    let rendered = contract.render(&json!({"text": "Hello there"})).unwrap();
    let base = &router.base;
    let targets = [
        ("native", Target::Router(base.clone())),
        (
            "chat",
            Target::Facade {
                url: format!("{base}/v1/chat/completions"),
                body: json!({"model": "language", "messages": [
                    {"role": "system", "content": rendered.system},
                    {"role": "user", "content": rendered.user},
                ]}),
                expect: r#""finish_reason":"stop""#,
            },
        ),
        (
            "responses",
            Target::Facade {
                url: format!("{base}/v1/responses"),
                body: json!({"model": "language", "instructions": rendered.system, "input": rendered.user}),
                expect: r#""status":"completed""#,
            },
        ),
        (
            "messages",
            Target::Facade {
                url: format!("{base}/v1/messages"),
                body: json!({"model": "language", "max_tokens": contract.limits.max_output_tokens,
                    "system": rendered.system, "messages": [{"role": "user", "content": rendered.user}]}),
                expect: r#""stop_reason":"end_turn""#,
            },
        ),
    ];
    let mut samples: Vec<Sample> = targets.iter().map(|_| Sample::empty()).collect();
    let load = Load::Closed(DIALECT_CLIENTS);
    for _round in 0..2 {
        for ((_, target), sample) in targets.iter().zip(&mut samples) {
            sample.merge(drive(&Client::new(), load, target.clone(), counter.clone()).await);
        }
    }
    router.kill().await;
    let native = &samples[0];
    let mut cell = json!({"engine": name, "load": format!("dialects closed {DIALECT_CLIENTS}")});
    for ((dialect, _), sample) in targets.iter().zip(&samples) {
        println!(
            "{name:<9} {dialect:<10} closed {DIALECT_CLIENTS}: {:>8.0} jobs/s, p50 {:.2} ms, p99 {:.2} ms; to the native API: jobs/s {:.3}, p99 {:.3}",
            sample.rate(),
            sample.pct(0.5),
            sample.pct(0.99),
            sample.rate() / native.rate(),
            sample.pct(0.99) / native.pct(0.99),
        );
        cell[*dialect] = json!({
            "per_s": sample.rate(), "p50_ms": sample.pct(0.5), "p99_ms": sample.pct(0.99), "n": sample.count,
            "ratio_to_native": {"throughput": sample.rate() / native.rate(), "p99": sample.pct(0.99) / native.pct(0.99)},
        });
    }
    vec![cell]
}

/// The answer a streamed completion's frames make, if it arrived whole:
/// every `data:` frame a chunk (or the final `[DONE]`), a `stop` finish.
fn whole_stream(text: &str) -> Result<Value, String> {
    let frames: Vec<&str> = text
        .split("\n\n")
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    let Some((last, chunks)) = frames.split_last() else {
        return Err("no frame".to_owned());
    };
    if *last != "data: [DONE]" {
        return Err(format!("the last frame is `{last}`"));
    }
    let mut content = String::new();
    let mut finish = None;
    for frame in chunks {
        let data = frame
            .strip_prefix("data: ")
            .ok_or_else(|| format!("not a data frame: `{frame}`"))?;
        let chunk: Value = serde_json::from_str(data).map_err(|e| format!("{e}: `{data}`"))?;
        if chunk["object"] != "chat.completion.chunk" {
            return Err(format!("not a chunk: {chunk}"));
        }
        content.push_str(
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or_default(),
        );
        if let Some(reason) = chunk["choices"][0]["finish_reason"].as_str() {
            finish = Some(reason.to_owned());
        }
    }
    if finish.as_deref() != Some("stop") {
        return Err(format!("finished with {finish:?}"));
    }
    serde_json::from_str(&content).map_err(|e| format!("{e}: `{content}`"))
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
    Sample::of(latencies, started.elapsed())
}

/// The router's log filter: by default its own lines only at `warn` (a
/// line per request would be the load); `SURETY_BENCH_LOG` sets another
/// (`info`, the shipped default, to price the per-job lines).
fn router_log() -> String {
    std::env::var("SURETY_BENCH_LOG")
        .unwrap_or_else(|_| "info,surety_store=warn,surety_router=warn,tower_http=warn".to_owned())
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
    /// A job by the native API.
    Router(String),
    /// The same prompt straight to the fake (or through the null proxy).
    Direct(String),
    /// The same job asked for through a facade: its url, its body (the
    /// contract's pinned prompt) and what a good answer contains.
    Facade {
        url: String,
        body: Value,
        expect: &'static str,
    },
}

impl Target {
    /// Where a request goes: a job, or the same prompt straight to the fake.
    fn url(&self) -> String {
        match self {
            Target::Router(base) => format!("{base}/v1/jobs"),
            Target::Direct(base) => format!("{base}/chat/completions"),
            Target::Facade { url, .. } => url.clone(),
        }
    }

    fn body(&self) -> Value {
        match self {
            Target::Router(_) => json!({"route": "language", "input": {"text": "Hello there"}}),
            Target::Direct(_) => {
                json!({"model": "fake", "messages": [{"role": "user", "content": "Hello there"}]})
            }
            Target::Facade { body, .. } => body.clone(),
        }
    }

    /// What every good answer's body contains.
    fn expect(&self) -> &'static str {
        match self {
            Target::Router(_) => r#""state":"succeeded""#,
            Target::Direct(_) => r#""choices""#,
            Target::Facade { expect, .. } => expect,
        }
    }

    /// Whether surety is asked (with a key and an Idempotency-Key).
    fn through_surety(&self) -> bool {
        !matches!(self, Target::Direct(_))
    }
}

/// One request of the open loop, in process (reqwest): its latency (µs),
/// or none when the router shed it (429: the owner's in-flight limit, an
/// open loop past what the machine serves).
async fn one(client: &reqwest::Client, target: &Target, n: u64) -> Option<u64> {
    let started = Instant::now();
    let request = client.post(target.url()).json(&target.body());
    let response = match target.through_surety() {
        true => {
            request
                .bearer_auth(KEY)
                .header("Idempotency-Key", format!("bench-{n}"))
                .header("Prefer", "wait=30")
                .header("anthropic-version", "2023-06-01")
                .send()
                .await
        }
        false => request.send().await,
    };
    let response = response.unwrap();
    let shed = response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS;
    let body = response.text().await.unwrap_or_default();
    if target.through_surety() {
        if shed {
            return None;
        }
        assert!(body.contains(target.expect()), "{body}");
    }
    Some(started.elapsed().as_micros() as u64)
}

/// `wrk`'s script: a fresh Idempotency-Key per request (the run's nonce,
/// the thread, a count), every answer checked (a status below 300 and the
/// expected text in the body), and at the end one line of JSON: requests,
/// time, socket errors, bad answers (the first as an example) and 1,000
/// latency quantiles (µs).
const WRK_SCRIPT: &str = r#"
local threads = {}
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end
function init(args)
  count, bad, example = 0, 0, ""
  prefix, body, expect = args[1], args[2], args[3]
  headers = {["Content-Type"] = "application/json"}
  if args[4] ~= "" then
    headers["Authorization"] = "Bearer " .. args[4]
    headers["Prefer"] = "wait=30"
    -- What the Messages API requires; the other endpoints ignore it.
    headers["anthropic-version"] = "2023-06-01"
  end
end
function request()
  count = count + 1
  if prefix ~= "" then
    headers["Idempotency-Key"] = prefix .. "-" .. id .. "-" .. count
  end
  return wrk.format("POST", nil, headers, body)
end
function response(status, _, answer)
  if status >= 300 or not string.find(answer, expect, 1, true) then
    bad = bad + 1
    if example == "" then example = status .. " " .. answer end
  end
end
function done(summary, latency, _)
  local bad_total, first = 0, ""
  for _, thread in ipairs(threads) do
    bad_total = bad_total + thread:get("bad")
    if first == "" then first = thread:get("example") end
  end
  local q = {}
  for i = 0, 999 do q[#q + 1] = string.format("%d", latency:percentile((i + 0.5) / 10)) end
  local e = summary.errors
  io.write(string.format(
    'SURETY-WRK {"requests":%d,"duration_us":%d,"socket_errors":%d,"bad":%d,"example":"%s","quantiles_us":[%s]}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout,
    bad_total, (first:gsub('[%c"\\]', " ")), table.concat(q, ",")))
end
"#;

/// A closed-loop cell: `clients` connections, each sending its next
/// request as soon as its last is answered, for `duration`, by `wrk`
/// (`SURETY_WRK`, which `cargo xtask bench router` installs); the
/// benchmark fails on any socket error or bad answer.
async fn wrk(clients: usize, duration: Duration, target: &Target, nonce: u64) -> Sample {
    let program = std::env::var_os("SURETY_WRK")
        .expect("SURETY_WRK: run through `cargo xtask bench router`, which installs wrk");
    // Removed when dropped, at the end of the cell.
    let script = tempfile::Builder::new().suffix(".lua").tempfile().unwrap();
    std::fs::write(script.path(), WRK_SCRIPT).unwrap();
    let (url, body) = (target.url(), target.body().to_string());
    let expect = target.expect().to_owned();
    let args = match target.through_surety() {
        true => [format!("wrk{nonce}"), body, expect, KEY.to_owned()],
        false => [String::new(), body, expect, String::new()],
    };
    let output = tokio::process::Command::new(program)
        .args(["--threads", &clients.min(2).to_string()])
        .args(["--connections", &clients.to_string()])
        // wrk counts time in whole seconds.
        .args(["--duration", &format!("{}s", duration.as_secs().max(1))])
        .args(["--timeout", "30s"])
        .arg("--script")
        .arg(script.path())
        .arg(&url)
        .arg("--")
        .args(&args)
        .output()
        .await
        .expect("wrk runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SURETY-WRK "))
        .unwrap_or_else(|| {
            panic!(
                "wrk said no figures ({}): {stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let figures: Value = serde_json::from_str(line).unwrap();
    assert_eq!(figures["socket_errors"], 0, "wrk against {url}: {stdout}");
    assert_eq!(
        figures["bad"], 0,
        "wrk against {url}: {}",
        figures["example"]
    );
    Sample {
        count: figures["requests"].as_u64().unwrap(),
        shed: 0,
        latencies: serde_json::from_value(figures["quantiles_us"].clone()).unwrap(),
        elapsed: Duration::from_micros(figures["duration_us"].as_u64().unwrap()),
        late: Vec::new(),
    }
}

async fn drive(
    client: &reqwest::Client,
    load: Load,
    target: Target,
    counter: Arc<AtomicU64>,
) -> Sample {
    let rate = match load {
        Load::Closed(clients) => {
            let nonce = counter.fetch_add(1, Ordering::Relaxed);
            return wrk(clients, secs(), &target, nonce).await;
        }
        Load::Open(rate) => rate,
    };
    // An open-loop cell's p99 rests on its slowest 1%: four times the cell
    // length (12 s by default, 6,000 requests at 500/s) keeps it steady.
    let duration = secs() * 4;
    let lateness = Lateness::start();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while started.elapsed() < duration {
        tick.tick().await;
        let (client, target, n) = (
            client.clone(),
            target.clone(),
            counter.fetch_add(1, Ordering::Relaxed),
        );
        tasks.spawn(async move { one(&client, &target, n).await });
    }
    let answers = tasks.join_all().await;
    let mut sample = Sample::of(
        answers.iter().flatten().copied().collect(),
        started.elapsed(),
    );
    sample.shed = answers.iter().filter(|a| a.is_none()).count() as u64;
    sample.late = lateness.stop();
    sample
}
