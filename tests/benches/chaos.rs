//! `cargo xtask chaos`: the release `surety serve` under load while faults
//! are injected, on SQLite and on PostgreSQL, then the books: every job a
//! client saw acknowledged must be in the database with its input, and no
//! intent may have reached the provider twice. One table to stdout, every
//! figure to `$SURETY_CHAOS_OUT` (default `target/chaos/report.json`); the
//! exit code is 1 when a job was lost, an intent was called twice, SQLite
//! failed `integrity_check`, or a stated bound (WAL, RSS) was passed.
//!
//! `SURETY_CHAOS_SECS` sets a scenario's length (10 by default),
//! `SURETY_CHAOS_SUSTAINED_SECS` the SQLite sustained-load run's (120),
//! `SURETY_CHAOS_SCENARIOS` / `SURETY_CHAOS_ENGINES` choose a part.

#![expect(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark prints its figures and fails on what it did not expect"
)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Keep, Script, When};
use surety_harness::progress::Progress;
use surety_tests::chaos::{self, Audit, Books, Load, MachineCpu};
use surety_tests::serve::{self, FLOOD_KEY, KEY, RouterProcess};
use surety_tests::{Engine, TestDb};

/// The WAL may not pass this (the store's bound: a RESTART checkpoint past
/// 64 MiB).
const WAL_BOUND: u64 = 64 << 20;
/// New jobs a second in the pruning scenario: a steady load well below
/// saturation, where a latency means the work of one request.
const PRUNING_RATE: u32 = 500;
/// Pruning may raise the p99 at that rate by at most this factor and this
/// many ms: the typical p99 of the windows of this length while pruning,
/// against the same windows of the same load run without pruning
/// (`Books::typical_p99_ms_between`).
const PRUNING_P99_FACTOR: f64 = 1.25;
const PRUNING_P99_SLACK_MS: f64 = 2.0;
const TYPICAL_WINDOW: Duration = Duration::from_secs(2);
/// The router's resident memory may not pass this, whatever providers send.
const RSS_BOUND_KIB: u64 = 256 << 10;
/// Every scenario's router: short leases, so a killed router's attempts
/// turn `unknown` within the run; a short attempt timeout for the hostile
/// providers.
const SERVER: &str = "lease_ms = 2000\nattempt_timeout_ms = 3000\n";
/// The provider answers after this many ms, so kills and outages find
/// attempts in flight.
const ANSWER_MS: u64 = 20;

#[derive(Debug, Serialize)]
struct Row {
    fault: &'static str,
    engine: &'static str,
    requests: u64,
    #[serde(flatten)]
    audit: Audit,
    answers: String,
    p99_ms: f64,
    peak_rss_mib: f64,
    integrity: Option<String>,
    notes: String,
    #[serde(skip_serializing_if = "Value::is_null")]
    series: Value,
    failed: Vec<String>,
}

fn env_secs(var: &str, default: f64) -> Duration {
    Duration::from_secs_f64(
        std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default),
    )
}

fn chosen(var: &str, name: &str) -> bool {
    std::env::var(var).map_or(true, |list| list.split(',').any(|n| n.trim() == name))
}

/// The routers of a scenario and where the load finds them.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    routers: Vec<RouterProcess>,
    targets: tokio::sync::watch::Sender<Vec<String>>,
    peak_rss_kib: u64,
    restarts: u32,
}

impl Cluster {
    async fn start(bin: &Path, dir: tempfile::TempDir, replicas: usize) -> Cluster {
        let mut routers = Vec::new();
        for _ in 0..replicas {
            routers.push(RouterProcess::start(bin, dir.path()).await);
        }
        let (targets, _) =
            tokio::sync::watch::channel(routers.iter().map(|r| r.base.clone()).collect());
        Cluster {
            bin: bin.to_owned(),
            dir,
            routers,
            targets,
            peak_rss_kib: 0,
            restarts: 0,
        }
    }

    fn rss(&mut self) -> u64 {
        for router in &self.routers {
            self.peak_rss_kib = self.peak_rss_kib.max(router.peak_rss_kib());
        }
        self.peak_rss_kib
    }

    /// SIGKILL router `i` and start it again (on a new port).
    async fn kill_and_restart(&mut self, i: usize) {
        self.rss();
        let old = std::mem::replace(
            &mut self.routers[i],
            RouterProcess::start(&self.bin, self.dir.path()).await,
        );
        // Killed after its successor listens: the load never finds no router.
        old.kill().await;
        self.restarts += 1;
        self.targets
            .send_replace(self.routers.iter().map(|r| r.base.clone()).collect());
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.routers[0].base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap_or_default();
        surety_tests::metric_value(&text, name)
    }
}

/// A running load and its books.
struct Running {
    books: Arc<Books>,
    stop: Arc<AtomicBool>,
    clients: tokio::task::JoinSet<()>,
}

impl Running {
    fn start(cluster: &Cluster, load: Load) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let (books, clients) = load.spawn(cluster.targets.subscribe(), stop.clone());
        Running {
            books,
            stop,
            clients,
        }
    }

    async fn stop(mut self) -> Arc<Books> {
        self.stop.store(true, Ordering::Release);
        while self.clients.join_next().await.is_some() {}
        self.books
    }
}

fn hello(n: u64) -> String {
    format!("Hello there, number {n}")
}

fn acme(clients: usize, prefix: &str, text: fn(u64) -> String) -> Load {
    Load {
        api_key: KEY.to_owned(),
        clients,
        rate: None,
        prefix: prefix.to_owned(),
        wait: Some(5),
        text,
    }
}

/// After the load: once no attempt is `started` any more (the live
/// router's reaper turns a killed router's into `unknown` when their 2 s
/// leases end), the books are audited.
async fn settle_and_audit(
    db: &TestDb,
    books: &Books,
    fake: &FakeProvider,
    retention: Option<Duration>,
) -> (Audit, bool) {
    let settled = tokio::time::timeout(Duration::from_secs(30), async {
        while db
            .count("SELECT COUNT(*) FROM attempts WHERE state = 'started'")
            .await
            > 0
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok();
    (
        chaos::audit(db, "acme", books, fake, retention).await,
        settled,
    )
}

struct Scenario<'a> {
    fault: &'static str,
    engine: Engine,
    bin: &'a Path,
    repo: &'a Path,
    length: Duration,
    /// The router's retention, where the scenario sets one.
    retention: Option<Duration>,
}

impl Scenario<'_> {
    fn engine_name(&self) -> &'static str {
        match self.engine {
            Engine::Sqlite => "sqlite",
            Engine::Postgres => "postgres",
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one row of the report: each argument is one of its columns' inputs"
    )]
    async fn row(
        &self,
        db: &TestDb,
        fake: &FakeProvider,
        cluster: &mut Cluster,
        books: &Books,
        notes: String,
        series: Value,
        mut failed: Vec<String>,
    ) -> Row {
        let (audit, settled) = settle_and_audit(db, books, fake, self.retention).await;
        if !settled {
            failed.push("attempts still `started` 30 s after the load".to_owned());
        }
        if audit.lost > 0 {
            failed.push(format!("{} acknowledged jobs lost", audit.lost));
        }
        if audit.max_calls_per_intent > 1 {
            failed.push(format!(
                "an intent reached the provider {} times",
                audit.max_calls_per_intent
            ));
        }
        let integrity = match self.engine {
            Engine::Sqlite => Some(chaos::integrity(db).await),
            Engine::Postgres => None,
        };
        if integrity.as_deref().is_some_and(|i| i != "ok") {
            failed.push(format!("integrity_check: {integrity:?}"));
        }
        let peak = cluster.rss();
        Row {
            fault: self.fault,
            engine: self.engine_name(),
            requests: books.requests.load(Ordering::Relaxed),
            audit,
            answers: books.answers_line(),
            p99_ms: books.p99_ms(),
            peak_rss_mib: peak as f64 / 1024.0,
            integrity,
            notes,
            series,
            failed,
        }
    }
}

#[tokio::main]
async fn main() {
    let bin = PathBuf::from(
        std::env::var("SURETY_BIN").expect("SURETY_BIN: run through `cargo xtask chaos`"),
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let length = env_secs("SURETY_CHAOS_SECS", 10.0);
    let sustained = env_secs("SURETY_CHAOS_SUSTAINED_SECS", 120.0);
    let mut rows: Vec<Row> = Vec::new();
    println!("chaos: {length:?} per scenario, {sustained:?} of sustained load on SQLite");
    // Where the run is: a bar on a terminal, a line per scenario off one.
    const FAULTS: [&str; 8] = [
        "crash-loop",
        "crash-reconcile",
        "database-outage",
        "database-full",
        "hostile-providers",
        "hostile-clients",
        "sustained",
        "pruning",
    ];
    let runs_on = |engine: Engine, fault: &str| match fault {
        "database-outage" => engine == Engine::Postgres,
        "database-full" => engine == Engine::Sqlite,
        _ => true,
    };
    let total = [(Engine::Sqlite, "sqlite"), (Engine::Postgres, "postgres")]
        .into_iter()
        .filter(|(_, name)| chosen("SURETY_CHAOS_ENGINES", name))
        .map(|(engine, _)| {
            FAULTS
                .iter()
                .filter(|f| runs_on(engine, f) && chosen("SURETY_CHAOS_SCENARIOS", f))
                .count()
        })
        .sum::<usize>();
    let mut bar = Progress::new("chaos", total as u64);
    let mut progress = |rows: &[Row]| {
        if let Some(r) = rows.last() {
            bar.advance(1, &format!("{} on {}", r.fault, r.engine), true);
        }
    };
    for engine in [Engine::Sqlite, Engine::Postgres] {
        let scenario = |fault: &'static str| Scenario {
            fault,
            engine,
            bin: &bin,
            repo: &repo,
            length,
            retention: None,
        };
        let name = scenario("").engine_name();
        if !chosen("SURETY_CHAOS_ENGINES", name) {
            continue;
        }
        let picked = |fault: &str| chosen("SURETY_CHAOS_SCENARIOS", fault);
        if picked("crash-loop") {
            rows.push(crash_loop(&scenario("crash-loop")).await);
            progress(&rows);
        }
        if picked("crash-reconcile") {
            rows.push(crash_reconcile(&scenario("crash-reconcile")).await);
            progress(&rows);
        }
        if engine == Engine::Postgres && picked("database-outage") {
            rows.push(database_outage(&scenario("database-outage")).await);
            progress(&rows);
        }
        if engine == Engine::Sqlite && picked("database-full") {
            let retention = Some(Duration::from_secs(3));
            rows.push(
                database_full(&Scenario {
                    retention,
                    ..scenario("database-full")
                })
                .await,
            );
            progress(&rows);
        }
        if picked("hostile-providers") {
            rows.push(hostile_providers(&scenario("hostile-providers")).await);
            progress(&rows);
        }
        if picked("hostile-clients") {
            rows.push(hostile_clients(&scenario("hostile-clients")).await);
            progress(&rows);
        }
        if picked("sustained") {
            let run = match engine {
                Engine::Sqlite => sustained,
                Engine::Postgres => length * 3,
            };
            // Pruning runs for the last three quarters of the run.
            let retention = Some(run / 4);
            let full = acme(64, "sustained", hello);
            let scenario = Scenario {
                length: run,
                retention,
                ..scenario("sustained")
            };
            rows.push(sustained_load(&scenario, full).await);
            progress(&rows);
        }
        if picked("pruning") {
            let run = length * 4;
            let steady = Load {
                rate: Some(PRUNING_RATE),
                ..acme(0, "pruning", hello)
            };
            let scenario = Scenario {
                length: run,
                retention: Some(run / 4),
                ..scenario("pruning")
            };
            rows.push(sustained_load(&scenario, steady).await);
            progress(&rows);
        }
    }
    bar.finish();
    print_table(&rows);
    let out = std::env::var("SURETY_CHAOS_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo.join("target/chaos/report.json"));
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&out, serde_json::to_string_pretty(&rows).unwrap()).unwrap();
    println!("report: {}", out.display());
    let failed: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.failed
                .iter()
                .map(move |f| format!("{} on {}: {f}", r.fault, r.engine))
        })
        .collect();
    if !failed.is_empty() {
        for f in &failed {
            println!("FAILED {f}");
        }
        std::process::exit(1);
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<18} {:<9} {:>8} {:>8} {:>5} {:>6} {:>9} {:>9}  {:<40} notes",
        "fault", "engine", "requests", "acked", "lost", "calls", "p99 ms", "RSS MiB", "answers"
    );
    for r in rows {
        println!(
            "{:<18} {:<9} {:>8} {:>8} {:>5} {:>6} {:>9.1} {:>9.1}  {:<40} {}",
            r.fault,
            r.engine,
            r.requests,
            r.audit.acknowledged,
            r.audit.lost,
            r.audit.max_calls_per_intent,
            r.p99_ms,
            r.peak_rss_mib,
            r.answers,
            r.notes
        );
    }
}

/// kill -9 at random moments (the writer group-commits 16 clients' jobs
/// most of the time), 20 times, each followed by a restart.
async fn crash_loop(s: &Scenario<'_>) -> Row {
    use rand::Rng;
    let db = TestDb::new(s.engine).await.unwrap();
    let fake = chaos::answering_fake(ANSWER_MS).await;
    let dir = serve::workspace(s.repo, &db.url, &fake, SERVER);
    let mut cluster = Cluster::start(s.bin, dir, 1).await;
    let load = Running::start(&cluster, acme(16, "crash", hello));
    let every = s.length / 20;
    for _ in 0..20 {
        let pause = rand::rng().random_range(every / 4..every.max(Duration::from_millis(2)));
        tokio::time::sleep(pause).await;
        cluster.kill_and_restart(0).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let books = load.stop().await;
    let unknown = format!("{} kills and restarts", cluster.restarts);
    s.row(
        &db,
        &fake,
        &mut cluster,
        &books,
        unknown,
        Value::Null,
        Vec::new(),
    )
    .await
}

/// kill -9 with attempts in flight at a provider that stores its answers
/// (`store = true`), ten times, each followed by a restart: the attempts
/// the reaper turns `unknown` are reconciled — each found at the provider
/// by its metadata and settled by compare-and-swap — so none is left for an
/// operator, nothing acknowledged is lost, and no intent reaches the
/// provider twice.
async fn crash_reconcile(s: &Scenario<'_>) -> Row {
    use rand::Rng;
    let db = TestDb::new(s.engine).await.unwrap();
    // Answers take 100 ms: a kill finds attempts at the provider.
    let fake = chaos::answering_fake(ANSWER_MS * 5).await;
    let server = format!("{SERVER}reconcile_after_ms = 200\nreconcile_every_ms = 500\n");
    let dir = serve::workspace_storing(s.repo, &db.url, &fake, &server);
    let mut cluster = Cluster::start(s.bin, dir, 1).await;
    let load = Running::start(&cluster, acme(16, "reconcile", hello));
    let every = s.length / 10;
    for _ in 0..10 {
        let pause = rand::rng().random_range(every / 4..every.max(Duration::from_millis(2)));
        tokio::time::sleep(pause).await;
        cluster.kill_and_restart(0).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let books = load.stop().await;
    // The last router reaps what its predecessors left and reconciles it.
    let open = "SELECT COUNT(*) FROM attempts WHERE state IN ('started', 'unknown')";
    let resolved = tokio::time::timeout(Duration::from_secs(60), async {
        while db.count(open).await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok();
    let mut failed = Vec::new();
    if !resolved {
        failed.push(format!(
            "{} attempts still open 60 s after the load",
            db.count(open).await
        ));
    }
    let found = db
        .count("SELECT COUNT(*) FROM reconciliations WHERE outcome = 'answered'")
        .await;
    let asked = db.count("SELECT COUNT(*) FROM reconciliations").await;
    if found == 0 {
        failed.push("no unknown attempt was reconciled: the kills found none in flight".to_owned());
    }
    let notes = format!(
        "{} kills and restarts; {found} unknowns found at the provider and settled ({asked} questions)",
        cluster.restarts
    );
    s.row(&db, &fake, &mut cluster, &books, notes, Value::Null, failed)
        .await
}

/// PostgreSQL goes away for 4 s under two replicas (every connection
/// terminated, new ones refused), then comes back.
async fn database_outage(s: &Scenario<'_>) -> Row {
    let db = TestDb::own_postgres().await.unwrap();
    let fake = chaos::answering_fake(ANSWER_MS).await;
    let dir = serve::workspace(
        s.repo,
        &db.url,
        &fake,
        &format!("{SERVER}database_timeout_ms = 1000\n"),
    );
    let mut cluster = Cluster::start(s.bin, dir, 2).await;
    let load = Running::start(&cluster, acme(16, "outage", hello));
    tokio::time::sleep(s.length / 3).await;
    db.take_away().await;
    let away = Instant::now();
    let mut ready_said_down = false;
    while away.elapsed() < Duration::from_secs(4) {
        let ready: Value = reqwest::get(format!("{}/readyz", cluster.routers[1].base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null);
        ready_said_down |= ready["database"] == "down";
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let held = cluster.metric("surety_results_held").await;
    db.bring_back().await;
    tokio::time::sleep(s.length / 2).await;
    let books = load.stop().await;
    let mut failed = Vec::new();
    if !ready_said_down {
        failed.push("/readyz never said the database was down".to_owned());
    }
    let notes = format!(
        "2 replicas; down 4 s; /readyz said down: {ready_said_down}; answers held at once on one replica: {held}"
    );
    s.row(&db, &fake, &mut cluster, &books, notes, Value::Null, failed)
        .await
}

/// SQLite capped at 2 MiB with a 3 s retention: it fills, refuses new
/// jobs (507), and serves again as the pruner frees room.
async fn database_full(s: &Scenario<'_>) -> Row {
    let db = TestDb::new(s.engine).await.unwrap();
    let fake = chaos::answering_fake(ANSWER_MS).await;
    let retention = s.retention.unwrap_or_default().as_millis();
    let server = format!("{SERVER}sqlite_max_bytes = 2097152\nretention_ms = {retention}\n");
    let dir = serve::workspace(s.repo, &db.url, &fake, &server);
    let mut cluster = Cluster::start(s.bin, dir, 1).await;
    let load = Running::start(
        &cluster,
        acme(16, "full", |n| format!("{} {n}", "x".repeat(4000))),
    );
    tokio::time::sleep(s.length * 2).await;
    let pruned = cluster.metric("surety_pruned_jobs_total").await;
    let books = load.stop().await;
    let mut failed = Vec::new();
    if !books.answers_line().contains("507:") {
        failed.push("the database never filled".to_owned());
    }
    let notes = format!("capped at 2 MiB, retention 3 s; pruned {pruned} jobs");
    s.row(&db, &fake, &mut cluster, &books, notes, Value::Null, failed)
        .await
}

/// One request in ten meets a hostile provider: a 300 MiB body, a byte a
/// second, no answer at all, or a reset connection.
async fn hostile_providers(s: &Scenario<'_>) -> Row {
    let db = TestDb::new(s.engine).await.unwrap();
    let ok = Behavior::Reply(json!({"language": "english"}).to_string());
    let fake = FakeProvider::start(Script {
        keep: Keep::Counts,
        ..Script::always(ok)
            .rule(
                When::PromptContains("huge".to_owned()),
                Behavior::Huge { bytes: 300 << 20 },
            )
            .rule(
                When::PromptContains("drip".to_owned()),
                Behavior::Drip { every_ms: 1000 },
            )
            .rule(When::PromptContains("hang".to_owned()), Behavior::Hang)
            .rule(
                When::PromptContains("reset".to_owned()),
                Behavior::ResetAfter { bytes: 0 },
            )
    })
    .await
    .unwrap();
    let dir = serve::workspace(s.repo, &db.url, &fake, SERVER);
    let mut cluster = Cluster::start(s.bin, dir, 1).await;
    let text = |n: u64| {
        let kind = match n % 10 {
            1 => "huge",
            3 => "drip",
            5 => "hang",
            7 => "reset",
            _ => "fine",
        };
        format!("Hello, {kind} {n}")
    };
    let load = Running::start(&cluster, acme(16, "hostile", text));
    tokio::time::sleep(s.length).await;
    let books = load.stop().await;
    let peak = cluster.rss();
    let mut failed = Vec::new();
    if peak > RSS_BOUND_KIB {
        failed.push(format!(
            "RSS reached {} MiB, past the bound of {} MiB",
            peak / 1024,
            RSS_BOUND_KIB / 1024
        ));
    }
    let notes = format!(
        "RSS bound {} MiB; provider bytes sent {} MiB",
        RSS_BOUND_KIB / 1024,
        fake.bytes_streamed() >> 20
    );
    s.row(&db, &fake, &mut cluster, &books, notes, Value::Null, failed)
        .await
}

/// 2,000 idle connections and 100 slowloris clients (reconnecting as soon
/// as they are closed) against a limit of 1,024 connections, and an owner
/// flooding past its limits, while `acme` sends its jobs.
async fn hostile_clients(s: &Scenario<'_>) -> Row {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDb::new(s.engine).await.unwrap();
    let fake = chaos::answering_fake(ANSWER_MS).await;
    let server = format!(
        "{SERVER}max_connections = 1024\nrequest_read_timeout_ms = 1000\n\
         owner_requests_per_second = 400\nowner_burst = 400\nowner_max_in_flight = 16\n"
    );
    let dir = serve::workspace(s.repo, &db.url, &fake, &server);
    let mut cluster = Cluster::start(s.bin, dir, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut hostile = tokio::task::JoinSet::new();
    let addr = cluster.routers[0]
        .base
        .trim_start_matches("http://")
        .to_owned();
    for i in 0..2100 {
        let (addr, stop) = (addr.clone(), stop.clone());
        hostile.spawn(async move {
            let mut opened = 0u64;
            while !stop.load(Ordering::Acquire) {
                let Ok(mut stream) = tokio::net::TcpStream::connect(&addr).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                opened += 1;
                if i < 100 {
                    let _ = stream
                        .write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                        .await;
                }
                let mut sink = [0u8; 512];
                // Held until the server closes it (or the scenario ends).
                let _ = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut sink)).await;
            }
            opened
        });
    }
    let flood = Running::start(
        &cluster,
        Load {
            api_key: FLOOD_KEY.to_owned(),
            clients: 64,
            rate: None,
            prefix: "flood".to_owned(),
            wait: None,
            text: hello,
        },
    );
    let load = Running::start(&cluster, acme(8, "calm", hello));
    tokio::time::sleep(s.length).await;
    let books = load.stop().await;
    let flooded = flood.stop().await;
    stop.store(true, Ordering::Release);
    let mut reconnects = 0;
    while let Some(opened) = hostile.join_next().await {
        reconnects += opened.unwrap_or(0);
    }
    let mut failed = Vec::new();
    // By status, not in the line's text: 1,429 answers of 201 are no 429.
    if books.answers_with("429") > 0 {
        failed.push("the calm owner was rate limited".to_owned());
    }
    if flooded.answers_with("429") == 0 {
        failed.push("the flooding owner was never limited".to_owned());
    }
    let notes = format!(
        "2,000 idle + 100 slowloris (opened {reconnects} times), limit 1,024; flood: {}",
        flooded.answers_line()
    );
    s.row(&db, &fake, &mut cluster, &books, notes, Value::Null, failed)
        .await
}

/// `load` for `s.length` on a database of its own, with a retention past
/// the run's end: nothing is pruned. Its answers are the reference for the
/// windows of a run that prunes.
async fn without_pruning(s: &Scenario<'_>, load: Load) -> Arc<Books> {
    let (_db, _fake, cluster) = retaining(s, s.length * 10).await;
    let load = Running::start(&cluster, load);
    tokio::time::sleep(s.length).await;
    let books = load.stop().await;
    let pruned = cluster.metric("surety_pruned_jobs_total").await;
    assert_eq!(pruned, 0.0, "the reference run pruned");
    books
}

/// A router on a database of its own, its provider a fake that answers at
/// once, pruning settled jobs past `retention`.
async fn retaining(s: &Scenario<'_>, retention: Duration) -> (TestDb, FakeProvider, Cluster) {
    let db = TestDb::new(s.engine).await.unwrap();
    let fake = chaos::answering_fake(0).await;
    let server = format!("{SERVER}retention_ms = {}\n", retention.as_millis());
    let dir = serve::workspace(s.repo, &db.url, &fake, &server);
    let cluster = Cluster::start(s.bin, dir, 1).await;
    (db, fake, cluster)
}

/// `load` for the whole length (the provider answering at once), with a
/// retention short enough that pruning runs for most of it: the WAL and
/// the database sampled every 5 s (the WAL's peak every 100 ms), p99
/// before and while pruning. At a fixed rate (`load.rate`) the p99 while
/// pruning is held to a margin; at full load (a closed loop) every delete
/// is work the saturated writer queues, so it is only reported.
async fn sustained_load(s: &Scenario<'_>, load: Load) -> Row {
    let retention = s.retention.unwrap_or(s.length);
    let fixed_rate = load.rate.is_some();
    // At a fixed rate, the reference: the same load first, on a database of
    // its own with nothing to prune, so the two runs differ by pruning alone
    // (the first seconds of a run, its tables still small, are no steady
    // state to compare with).
    let reference = if fixed_rate {
        Some(without_pruning(s, load.clone()).await)
    } else {
        None
    };
    let (db, fake, mut cluster) = retaining(s, retention).await;
    let load = Running::start(&cluster, load);
    let (file, wal) = chaos::sqlite_files(&db);
    let began = Instant::now();
    let mut series = Vec::new();
    let (mut wal_peak, mut pruning_from) = (0u64, None);
    // The machine's steal at the start, where pruning began, and at the end.
    let (first_cpu, mut pruning_cpu) = (MachineCpu::now(), None);
    while began.elapsed() < s.length {
        // The WAL's peak every 100 ms, the rest every 5 s.
        let sample = Instant::now();
        while sample.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            wal_peak = wal_peak.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        let (wal_bytes, db_bytes) = match s.engine {
            Engine::Sqlite => (
                std::fs::metadata(&wal).map_or(0, |m| m.len()),
                std::fs::metadata(&file).map_or(0, |m| m.len()),
            ),
            Engine::Postgres => (
                0,
                db.count("SELECT CAST(pg_total_relation_size('jobs') + pg_total_relation_size('attempts') AS BIGINT)")
                    .await as u64,
            ),
        };
        let pruned = cluster.metric("surety_pruned_jobs_total").await;
        if pruned > 0.0 && pruning_from.is_none() {
            pruning_from = Some(began.elapsed());
            pruning_cpu = Some(MachineCpu::now());
        }
        wal_peak = wal_peak.max(wal_bytes);
        series.push(json!({
            "at_s": began.elapsed().as_secs(),
            "wal_bytes": wal_bytes,
            "db_bytes": db_bytes,
            "jobs_pruned": pruned,
            "requests": load.books.requests.load(Ordering::Relaxed),
        }));
    }
    let books = load.stop().await;
    let last_cpu = MachineCpu::now();
    let warm = Duration::from_secs(2);
    let before = books.p99_ms_between(warm, pruning_from.unwrap_or(s.length));
    let during = pruning_from.map(|from| books.p99_ms_between(from, s.length));
    // What the margin holds: the typical p99 of the 2 s windows while
    // pruning, and of the same windows of the run without pruning.
    let typical_during =
        pruning_from.map(|from| books.typical_p99_ms_between(from, s.length, TYPICAL_WINDOW));
    let typical_without = reference.as_ref().map(|reference| {
        let from = pruning_from.unwrap_or(s.length);
        reference.typical_p99_ms_between(from, s.length, TYPICAL_WINDOW)
    });
    // A shared host's steal decides a window's p99 as much as the router:
    // said beside the comparison, so a rise that follows it reads as such.
    let steal_before = first_cpu.steal_pct_until(pruning_cpu.unwrap_or(last_cpu));
    let steal_during = pruning_cpu.map(|from| from.steal_pct_until(last_cpu));
    let steal = format!(
        "CPU steal {steal_before:.0} % before, {} while",
        steal_during.map_or("-".to_owned(), |d| format!("{d:.0} %"))
    );
    let mut failed = Vec::new();
    if let (Some(during), Some(without)) = (typical_during, typical_without)
        && during > without * PRUNING_P99_FACTOR + PRUNING_P99_SLACK_MS
    {
        failed.push(format!(
            "the typical p99 of {}s windows was {during:.1} ms while pruning against {without:.1} ms in the same windows without pruning, past {PRUNING_P99_FACTOR}x + {PRUNING_P99_SLACK_MS} ms ({steal})",
            TYPICAL_WINDOW.as_secs()
        ));
    }
    if wal_peak > WAL_BOUND {
        failed.push(format!(
            "the WAL reached {} MiB, past {} MiB",
            wal_peak >> 20,
            WAL_BOUND >> 20
        ));
    }
    let last = series.last().cloned().unwrap_or(Value::Null);
    let notes = format!(
        "{:.0} s; {}; db {:.1} MiB at the end; retention {} s, pruned {}; p99 {before:.1} ms before pruning, {} while pruning (typical of {}s windows while pruning {}, without pruning {}); {steal}",
        s.length.as_secs_f64(),
        match s.engine {
            Engine::Sqlite => format!(
                "WAL peak {:.1} MiB (bound {} MiB)",
                wal_peak as f64 / (1 << 20) as f64,
                WAL_BOUND >> 20
            ),
            Engine::Postgres => "PostgreSQL's own WAL".to_owned(),
        },
        last["db_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        retention.as_secs(),
        last["jobs_pruned"],
        during.map_or("-".to_owned(), |d| format!("{d:.1} ms")),
        TYPICAL_WINDOW.as_secs(),
        typical_during.map_or("-".to_owned(), |d| format!("{d:.1} ms")),
        typical_without.map_or("-".to_owned(), |d| format!("{d:.1} ms"))
    );
    let series = json!({"samples": series, "p99_ms_before_pruning": before, "p99_ms_while_pruning": during, "typical_p99_ms_while_pruning": typical_during, "typical_p99_ms_same_windows_without_pruning": typical_without, "wal_peak_bytes": wal_peak, "steal_pct_before_pruning": steal_before, "steal_pct_while_pruning": steal_during});
    s.row(&db, &fake, &mut cluster, &books, notes, series, failed)
        .await
}
