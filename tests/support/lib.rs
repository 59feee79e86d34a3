//! Shared test support: a fresh database per test, on SQLite or PostgreSQL.
//!
//! Every test gets its own SQLite file in a temporary directory, or its own
//! PostgreSQL schema in the test database, so tests run in parallel and
//! leave nothing behind. PostgreSQL is at `SURETY_TEST_DATABASE_URL`, or
//! `postgres://postgres@127.0.0.1:5432/test` as on the project's machines.
//! When it cannot be reached, a test fails if `CI` is set, and otherwise
//! says loudly that it skipped PostgreSQL.

#![expect(
    clippy::expect_used,
    reason = "test support fails the test on setup errors"
)]

pub mod chaos;
pub mod serve;

/// mimalloc in every test and benchmark binary, as in the router. With
/// glibc's malloc, `cargo xtask chaos` measured its own load generator (in
/// this process) for a second or more after `sustained` freed its books
/// and audit (over a gigabyte in small allocations): every allocation
/// after that walked glibc's free lists (`_int_malloc`, `unlink_chunk`,
/// `malloc_consolidate`: a fifth of the process's samples under `perf`),
/// so `pruning`'s first requests waited on their own client, and were
/// shed as a burst, while the router's writes never took 30 ms.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Executor, Row};
use surety_store::{Store, StoreOptions};
use surety_testkit::{postgres_url, skipped};

/// A benchmark cell's length: `SURETY_BENCH_SECS` seconds, 3 by default.
pub fn bench_cell() -> std::time::Duration {
    let secs = std::env::var("SURETY_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    std::time::Duration::from_secs_f64(secs)
}

/// The sum of the samples of metric `name` in Prometheus text `text`.
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What `command` printed, once it exited successfully; a command that
/// fails fails the test with what it wrote to stderr.
pub fn printed(output: std::io::Result<std::process::Output>, what: &str) -> String {
    let output = output.unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a test needs that `cargo xtask test` provides, named by the
/// environment variable `var` (`what` says what it is): its value; or,
/// when it is not set, a failed test under `CI`, and elsewhere `None` with
/// the skip recorded by [`skipped`].
pub fn require(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) => Some(value),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!(
                "{what} is not set up ({var} is not set) and CI is set: run through `cargo xtask test`"
            )
        }
        Err(_) => {
            skipped(&format!(
                "{what} is not set up ({var}; run through `cargo xtask test`)"
            ));
            None
        }
    }
}

/// What every snapshot hides, the same way: what changes from run to run
/// (ids, times, digests, ports, temporary paths, durations, tokens) is
/// replaced by its name, so a snapshot shows the behaviour alone.
pub const SNAPSHOT_FILTERS: &[(&str, &str)] = &[
    (
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "[uuid]",
    ),
    (r"sha256:[0-9a-f]{64}", "sha256:[digest]"),
    (r"\b[0-9a-f]{64}\b", "[hex64]"),
    (r"sha256:[0-9a-f]{8,63}\b", "sha256:[short]"),
    (
        r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})",
        "[time]",
    ),
    (r"127\.0\.0\.1:\d+", "127.0.0.1:[port]"),
    (r"/tmp/[^\s\)\]`\x22]+", "[tmp]"),
    (r"\b\d+(\.\d+)? ?ms\b", "[n] ms"),
    (
        r"\x22(\w+_ms|latency_ms|created|p50|p95|max)\x22: \d+",
        "\x22$1\x22: [n]",
    ),
];

/// An insta snapshot of `value` (text) under `name`, with the shared
/// [`SNAPSHOT_FILTERS`]; snapshots live in `snapshots/` beside the test.
/// `cargo xtask test` runs them with `INSTA_UPDATE=no`: a changed or new
/// snapshot fails until accepted (`cargo insta review`).
#[macro_export]
macro_rules! surety_snapshot {
    ($name:expr, $value:expr) => {
        insta::with_settings!({
            filters => $crate::SNAPSHOT_FILTERS.to_vec(),
            prepend_module_to_snapshot => false,
            omit_expression => true,
        }, {
            insta::assert_snapshot!($name, $value);
        })
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// One test's private database.
#[derive(Debug)]
pub struct TestDb {
    pub engine: Engine,
    /// The URL a [`Store`] opens; on PostgreSQL it selects the test's schema.
    pub url: String,
    /// A connection pool of the test's own, for what only a test may do
    /// (rewinding a lease) and for looking at raw rows.
    pub raw: AnyPool,
    _dir: Option<tempfile::TempDir>,
    /// What to drop at the end: `(server URL, what)`.
    cleanup: Option<(String, Cleanup)>,
}

#[derive(Debug)]
enum Cleanup {
    Schema(String),
    Database(String),
}

/// `url` naming the database `name` instead of its own.
fn with_database(url: &str, name: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, format!("?{query}")),
        None => (url, String::new()),
    };
    let server = head.rsplit_once('/').map_or(head, |(server, _)| server);
    format!("{server}/{name}{query}")
}

/// The test's own pool on `url`, for what only a test may do.
async fn raw_pool(url: &str) -> AnyPool {
    AnyPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to the test database: {e}"))
}

async fn admin(base: &str) -> AnyPool {
    AnyPoolOptions::new()
        .max_connections(1)
        .connect(base)
        .await
        .expect("connect to PostgreSQL as its admin")
}

impl TestDb {
    /// A fresh database, or `None` when PostgreSQL is unreachable outside CI.
    pub async fn new(engine: Engine) -> Option<TestDb> {
        sqlx::any::install_default_drivers();
        match engine {
            Engine::Sqlite => {
                let dir = tempfile::tempdir().expect("temporary directory");
                let url = format!("sqlite:{}?mode=rwc", dir.path().join("surety.db").display());
                let raw = raw_pool(&url).await;
                Some(TestDb {
                    engine,
                    url,
                    raw,
                    _dir: Some(dir),
                    cleanup: None,
                })
            }
            Engine::Postgres => {
                let base = postgres_url();
                let admin = match AnyPoolOptions::new()
                    .max_connections(1)
                    .connect(&base)
                    .await
                {
                    Ok(pool) => pool,
                    Err(e) if std::env::var_os("CI").is_some() => {
                        panic!("PostgreSQL at {base} is unreachable and CI is set: {e}")
                    }
                    Err(e) => {
                        skipped(&format!(
                            "the PostgreSQL half of this test: {base} is unreachable ({e})"
                        ));
                        return None;
                    }
                };
                let schema = format!("surety_t_{}", uuid::Uuid::now_v7().simple());
                admin
                    .execute(format!("CREATE SCHEMA {schema}").as_str())
                    .await
                    .expect("create schema");
                admin.close().await;
                let sep = if base.contains('?') { '&' } else { '?' };
                let url = format!("{base}{sep}options[search_path]={schema}");
                let raw = raw_pool(&url).await;
                Some(TestDb {
                    engine,
                    url,
                    raw,
                    _dir: None,
                    cleanup: Some((base, Cleanup::Schema(schema))),
                })
            }
        }
    }

    /// A PostgreSQL database of the test's own, not a schema: one the test
    /// may take away ([`TestDb::take_away`]) without touching anyone
    /// else's. `None` as [`TestDb::new`] says.
    pub async fn own_postgres() -> Option<TestDb> {
        // Reachable, or skipped as every PostgreSQL test is.
        let probe = TestDb::new(Engine::Postgres).await?;
        drop(probe);
        let base = postgres_url();
        let name = format!("surety_d_{}", uuid::Uuid::now_v7().simple());
        let admin = admin(&base).await;
        admin
            .execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .expect("create database");
        admin.close().await;
        let url = with_database(&base, &name);
        let raw = raw_pool(&url).await;
        Some(TestDb {
            engine: Engine::Postgres,
            url,
            raw,
            _dir: None,
            cleanup: Some((base, Cleanup::Database(name))),
        })
    }

    /// The outage of [`TestDb::own_postgres`]'s database: every connection
    /// to it is terminated and new ones are refused until
    /// [`TestDb::bring_back`].
    pub async fn take_away(&self) {
        let Some((base, Cleanup::Database(name))) = &self.cleanup else {
            panic!("only a database of the test's own can be taken away");
        };
        let admin = admin(base).await;
        for sql in [
            format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"),
            format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
            ),
        ] {
            admin
                .execute(sql.as_str())
                .await
                .expect("take the database away");
        }
        admin.close().await;
    }

    /// Ends [`TestDb::take_away`]'s outage.
    pub async fn bring_back(&self) {
        let Some((base, Cleanup::Database(name))) = &self.cleanup else {
            panic!("only a database of the test's own can be brought back");
        };
        let admin = admin(base).await;
        admin
            .execute(format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true").as_str())
            .await
            .expect("bring the database back");
        admin.close().await;
    }

    /// Opens a store on this database, running its migrations.
    pub async fn store(&self) -> Store {
        let mut options = StoreOptions::new(&self.url);
        options.max_connections = 8;
        Store::open_with(&options).await.expect("open store")
    }

    /// Runs a statement on the raw connection and returns the rows it touched.
    pub async fn exec(&self, sql: &str) -> u64 {
        self.raw.execute(sql).await.expect(sql).rows_affected()
    }

    /// Runs a statement on the raw connection and returns its error.
    pub async fn exec_err(&self, sql: &str) -> sqlx::Error {
        self.raw.execute(sql).await.expect_err(sql)
    }

    /// Waits until a session of PostgreSQL waits on a lock that the session
    /// `pid` holds: the event a test needs before it lets that lock go.
    /// Polls `pg_blocking_pids`, the only place PostgreSQL tells it.
    pub async fn wait_until_blocked_by(&self, pid: i32) {
        let sql = format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE {pid} = ANY(pg_blocking_pids(pid))"
        );
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while self.count(&sql).await < 1 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "nobody came to wait on session {pid}'s lock"
        );
    }

    pub async fn count(&self, sql: &str) -> i64 {
        let row = sqlx::query(sql).fetch_one(&self.raw).await.expect(sql);
        row.try_get::<i64, _>(0).expect("a count")
    }

    /// Every row of every table, as text: equal snapshots mean an unchanged database.
    pub async fn snapshot(&self) -> Vec<String> {
        let queries = [
            "SELECT 'job ' || id || ' ' || owner_id || ' ' || idempotency_key || ' ' || state || ' v' \
             || CAST(version AS TEXT) || ' ' || COALESCE(result, '-') || ' ' \
             || COALESCE(CAST(completed_by AS TEXT), '-') || ' ' || CAST(updated_at_ms AS TEXT) FROM jobs ORDER BY id",
            "SELECT 'attempt ' || job_id || ' ' || CAST(ordinal AS TEXT) || ' ' || state || ' ' \
             || CAST(lease_expires_at_ms AS TEXT) || ' ' || COALESCE(error, '-') FROM attempts ORDER BY job_id, ordinal",
            "SELECT 'race ' || job_id || ' ' || CAST(loser_ordinal AS TEXT) || ' ' || reason FROM races ORDER BY id",
            "SELECT 'budget ' || account FROM budget_accounts ORDER BY account",
            "SELECT 'spend ' || account || ' ' || CAST(bucket_ms AS TEXT) || ' ' || CAST(spent AS TEXT) \
             FROM budget_spend ORDER BY account, bucket_ms",
            "SELECT 'reservation ' || job_id || ' ' || CAST(ordinal AS TEXT) || ' ' || account || ' ' \
             || CAST(amount AS TEXT) || ' ' || COALESCE(CAST(spent AS TEXT), '-') FROM reservations \
             ORDER BY job_id, ordinal, account",
            "SELECT 'check ' || id || ' ' || account || ' ' || CAST(amount AS TEXT) || ' ' \
             || COALESCE(CAST(spent AS TEXT), '-') FROM check_holds ORDER BY id, account",
        ];
        let mut rows = Vec::new();
        for sql in queries {
            for row in sqlx::query(sql).fetch_all(&self.raw).await.expect(sql) {
                rows.push(row.try_get::<String, _>(0).expect("text"));
            }
        }
        rows
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((base, what)) = self.cleanup.take() else {
            return;
        };
        let drop_it = match what {
            Cleanup::Schema(schema) => format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
            Cleanup::Database(name) => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        };
        // Drop runs inside the test's runtime, which cannot block on async
        // work: drop the schema from a thread with a runtime of its own.
        let dropped = std::thread::spawn(
            move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async {
                    let admin = AnyPoolOptions::new()
                        .max_connections(1)
                        .connect(&base)
                        .await?;
                    admin.execute(drop_it.as_str()).await?;
                    admin.close().await;
                    Ok(())
                })
            },
        )
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop a test's schema or database: {dropped:?}");
        }
    }
}

/// Runs each named `async fn(&TestDb)` of module `$scenarios` once per
/// engine, each on a database of its own: `mod sqlite { ... }` and
/// `mod postgres { ... }` of `#[tokio::test]`s.
#[expect(
    clippy::crate_in_macro_def,
    reason = "`crate::` is meant: the scenarios live in the test binary that calls this"
)]
#[macro_export]
macro_rules! both_engines {
    ($scenarios:ident: $($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let db = $crate::TestDb::new($crate::Engine::Sqlite).await.unwrap();
                    crate::$scenarios::$name(&db).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some(db) = $crate::TestDb::new($crate::Engine::Postgres).await {
                        crate::$scenarios::$name(&db).await;
                    }
                }
            )*
        }
    };
}

/// A manifest entry certifying the provider `config` for `contract` until
/// `expires_at`, bound as the harness binds one: to the contract's digest
/// and rendered prompts, to the provider's behaviour, and to the model id
/// that answered (the configured one, as the fake echoes it).
pub fn certified_entry(
    config: &surety_providers::ProviderConfig,
    contract: &surety_contracts::Contract,
    expires_at: time::OffsetDateTime,
) -> surety_manifest::Entry {
    let now = time::OffsetDateTime::now_utc();
    let behaviour = config.behaviour();
    surety_manifest::Entry {
        provider: config.id.clone(),
        contract: contract.id.clone(),
        status: surety_manifest::Status::Certified,
        contract_digest: contract.digest.clone(),
        prompt_digest: surety_exchange::prompt_digest(contract).expect("the contract renders"),
        system_prompt_digest: surety_exchange::system_prompt_digest(contract),
        provider_fingerprint: surety_manifest::fingerprint(&behaviour),
        provider_config: behaviour,
        base_url_override: None,
        price: None,
        served_model: surety_manifest::ServedModel {
            response_models: vec![config.model.clone()],
            models_endpoint: None,
        },
        tokenizer: "unverified".into(),
        structured_mode: config.structured_mode().as_str().into(),
        lint: Vec::new(),
        counts: surety_manifest::Counts::default(),
        failures: Vec::new(),
        tokens: surety_manifest::Tokens::default(),
        latency_ms: surety_manifest::Latency::default(),
        generated_at: surety_manifest::now_rfc3339(now),
        expires_at: surety_manifest::now_rfc3339(expires_at),
        harness_version: "test".into(),
    }
}
