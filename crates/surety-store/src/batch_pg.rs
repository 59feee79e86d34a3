//! The batched statements on a real PostgreSQL (`SURETY_TEST_DATABASE_URL`,
//! by default the machine's): each test on a schema of its own. Skipped,
//! and said so, where no PostgreSQL answers, unless `CI` is set.

use serde_json::json;
use sqlx::{Executor, PgPool};
use surety_core::{AttemptState, IdempotencyKey, JobState};

use crate::ops::{self, Begin, Insert};
use crate::store::Store;
use crate::{
    Answer, AttemptHandle, Created, JobId, JobKind, NewJob, Outcome, OwnerId, Slot, StartAttempt,
    StoreError, Trust,
};

/// A store on a fresh schema, its pool, and the schema's name.
async fn postgres() -> Option<(Store, PgPool, String)> {
    let base = surety_testkit::postgres_url();
    let admin = match PgPool::connect(&base).await {
        Ok(admin) => admin,
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("PostgreSQL at {base} is unreachable and CI is set: {e}")
        }
        Err(e) => {
            surety_testkit::skipped(&format!(
                "a PostgreSQL batch test: {base} is unreachable ({e})"
            ));
            return None;
        }
    };
    let schema = format!("surety_b_{}", uuid::Uuid::now_v7().simple());
    admin
        .execute(format!("CREATE SCHEMA {schema}").as_str())
        .await
        .unwrap();
    admin.close().await;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}options[search_path]={schema}");
    let store = Store::open(&url).await.unwrap();
    let pool = PgPool::connect(&url).await.unwrap();
    Some((store, pool, schema))
}

async fn drop_schema(pool: PgPool, schema: &str) {
    pool.execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
        .await
        .unwrap();
    pool.close().await;
}

fn new_job(owner: &str, key: &str, input: serde_json::Value) -> NewJob {
    NewJob {
        owner: OwnerId(owner.to_owned()),
        key: IdempotencyKey::parse(key).unwrap(),
        route: "summarize".to_owned(),
        contract: "summary".to_owned(),
        contract_digest: "sha256:c".to_owned(),
        input,
        kind: JobKind::Native,
        messages: None,
        request: None,
        hedgeable: true,
        fingerprint: None,
    }
}

/// An insert with its first attempt at `provider`, trusting a
/// certification made at `certified_at_ms`.
fn insert(new: NewJob, provider: &str, certified_at_ms: i64) -> Insert {
    let fingerprint = surety_core::Intent {
        route: &new.route,
        input: &new.input,
    }
    .fingerprint()
    .unwrap();
    Insert {
        id: JobId(uuid::Uuid::now_v7().to_string()),
        new,
        fingerprint,
        first: Some(Begin {
            slot: Slot::Primary,
            provider: provider.to_owned(),
            lease: 60_000,
            trust: Some(Trust {
                contract: "summary".to_owned(),
                certified_at_ms,
            }),
            charges: Vec::new(),
        }),
        room: None,
    }
}

/// `n` jobs of another owner in `state` (and, asked, an attempt each),
/// with no statistics gathered: a table in use.
async fn filler(pool: &PgPool, n: u32, state: &str, attempts: bool) {
    pool.execute(
        format!(
            "INSERT INTO jobs (id, owner_id, idempotency_key, route, contract, contract_digest, \
                 input, fingerprint, hedgeable, kind, state, version, created_at_ms, updated_at_ms) \
             SELECT 'filler-' || n, 'filler', 'k' || n, 'r', 'c', 'd', '{{}}', 'f', 0, 'native', \
                 '{state}', 0, 0, 0 FROM generate_series(1, {n}) AS n"
        )
        .as_str(),
    )
    .await
    .unwrap();
    if attempts {
        pool.execute(
            format!(
                "INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, \
                     base_version, started_at_ms, lease_expires_at_ms) \
                 SELECT 'filler-' || n, 1, 0, 0, 'p', 'started', 0, 0, 0 \
                 FROM generate_series(1, {n}) AS n"
            )
            .as_str(),
        )
        .await
        .unwrap();
        // Each attempt reserved of a budget, as a settling swap finds it.
        pool.execute(
            format!(
                "INSERT INTO budget_accounts (account) VALUES ('filler') ON CONFLICT DO NOTHING; \
                 INSERT INTO reservations (job_id, ordinal, account, unit, amount, bucket_ms, \
                     reserved_at_ms) \
                 SELECT 'filler-' || n, 1, 'filler', 'micros', 1, 0, 0 \
                 FROM generate_series(1, {n}) AS n"
            )
            .as_str(),
        )
        .await
        .unwrap();
    }
}

async fn jobs(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn one_statement_answers_each_job_of_a_batch_as_if_it_came_alone() {
    let Some((store, pool, schema)) = postgres().await else {
        return;
    };
    assert!(store.demote("demoted", "summary", "a test").await.unwrap());
    let mut conn = pool.acquire().await.unwrap();
    let batch = [
        insert(new_job("acme", "k-b", json!({"n": 1})), "p", 0),
        // The same key twice in one batch, the same intent: one job.
        insert(new_job("acme", "k-a", json!({"n": 2})), "p", 0),
        insert(new_job("acme", "k-a", json!({"n": 2})), "p", 0),
        // The same key with another intent: a conflict.
        insert(new_job("acme", "k-b", json!({"n": 3})), "p", 0),
        // Another owner's key of the same name: a job of its own.
        insert(new_job("other", "k-a", json!({"n": 2})), "p", 0),
        // A provider demoted after its certification: refused, nothing written.
        insert(new_job("acme", "k-c", json!({"n": 4})), "demoted", 0),
    ];
    let answers = ops::create_many(&mut *conn, &store.sql, &batch)
        .await
        .unwrap();
    assert_eq!(answers.len(), batch.len());
    let new = |i: usize| match &answers[i] {
        Ok((Created::New(job), Some(handle))) => (job.clone(), handle.clone()),
        other => panic!("item {i}: expected a new job with its attempt, got {other:?}"),
    };
    let (b, b_first) = new(0);
    assert_eq!(
        (b.key.as_str(), b.state, b.version),
        ("k-b", JobState::Running, 0)
    );
    assert_eq!((b_first.ordinal, b_first.provider.as_str()), (1, "p"));
    // Each answer is its own item's, whatever order the statement took.
    assert_eq!(b.id, batch[0].id);
    let (a, _) = new(1);
    assert_eq!(a.id, batch[1].id);
    match &answers[2] {
        Ok((Created::Replayed(job), None)) => assert_eq!(job.id, a.id),
        other => panic!("the key's second item is its replay, got {other:?}"),
    }
    assert!(matches!(answers[3], Ok((Created::Conflict, None))));
    let (other, _) = new(4);
    assert_eq!(other.owner.0, "other");
    assert!(matches!(
        &answers[5],
        Err(StoreError::Demoted { provider, .. }) if provider == "demoted"
    ));
    assert_eq!(jobs(&pool).await, 3);
    let attempts: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM attempts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 3);
    drop(conn);
    store.close().await;
    drop_schema(pool, &schema).await;
}

#[tokio::test]
async fn a_row_the_schema_refuses_fails_its_batch_whole_and_then_only_itself() {
    let Some((store, pool, schema)) = postgres().await else {
        return;
    };
    let mut batch = vec![
        insert(new_job("acme", "k-1", json!({"n": 1})), "p", 0),
        insert(new_job("acme", "k-2", json!({"n": 2})), "p", 0),
    ];
    // Past every check in Rust: the domain of the owner's name refuses it.
    batch[1].new.owner = OwnerId(String::new());
    let mut conn = pool.acquire().await.unwrap();
    let failed = ops::create_many(&mut *conn, &store.sql, &batch).await;
    assert!(matches!(failed, Err(StoreError::Database(_))), "{failed:?}");
    assert_eq!(jobs(&pool).await, 0, "a failed batch writes nothing");
    drop(conn);
    // The batch's runner then inserts each alone: the good one lands.
    let answers = crate::store::create_batch(pool.clone(), store.sql.clone(), batch).await;
    assert!(
        matches!(answers[0], Ok((Created::New(_), Some(_)))),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Err(StoreError::Database(_))),
        "{:?}",
        answers[1]
    );
    assert_eq!(jobs(&pool).await, 1);
    store.close().await;
    drop_schema(pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_that_share_keys_in_opposite_orders_never_deadlock() {
    let Some((store, pool, schema)) = postgres().await else {
        return;
    };
    for round in 0..4 {
        let keys: Vec<String> = (0..40).map(|i| format!("r{round}-k{i:02}")).collect();
        let batch = |keys: &mut dyn Iterator<Item = &String>| -> Vec<Insert> {
            keys.map(|k| insert(new_job("acme", k, json!({"k": k})), "p", 0))
                .collect()
        };
        let (forward, backward) = (batch(&mut keys.iter()), batch(&mut keys.iter().rev()));
        let (sql_a, sql_b) = (store.sql.clone(), store.sql.clone());
        // Both connections open before either statement is sent.
        let (mut conn_a, mut conn_b) =
            (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
        let a = tokio::spawn(async move { ops::create_many(&mut *conn_a, &sql_a, &forward).await });
        let b =
            tokio::spawn(async move { ops::create_many(&mut *conn_b, &sql_b, &backward).await });
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        // Every key: one job, made by exactly one of the two batches, and
        // the other batch's item is its replay.
        let made = a
            .iter()
            .chain(&b)
            .filter(|x| matches!(x, Ok((Created::New(_), _))))
            .count();
        let replayed = a
            .iter()
            .chain(&b)
            .filter(|x| matches!(x, Ok((Created::Replayed(_), None))))
            .count();
        assert_eq!((made, replayed), (40, 40));
    }
    assert_eq!(jobs(&pool).await, 160);
    store.close().await;
    drop_schema(pool, &schema).await;
}

/// A new job, started at `p`, through the store.
async fn started(store: &Store, key: &str) -> AttemptHandle {
    let start = StartAttempt {
        provider: "p".to_owned(),
        slot: Slot::Primary,
        lease: std::time::Duration::from_secs(60),
        trust: None,
        charges: Vec::new(),
    };
    match store
        .create_and_start(&new_job("acme", key, json!({"key": key})), &start)
        .await
        .unwrap()
    {
        (Created::New(_), Some(handle)) => handle,
        other => panic!("{other:?}"),
    }
}

fn answer(n: i64) -> Answer {
    Answer {
        result: json!({"n": n}),
        completion: None,
        response_id: None,
        cost: None,
    }
}

#[tokio::test]
async fn one_statement_swaps_each_result_as_if_it_came_alone() {
    let Some((store, pool, schema)) = postgres().await else {
        return;
    };
    let a = started(&store, "a").await;
    let b = started(&store, "b").await;
    let c = started(&store, "c").await;
    // The hedge of `a`: two attempts of one job in one batch, of which the
    // first listed must win and the second lose.
    let hedge = store
        .start_attempt(
            &OwnerId("acme".to_owned()),
            &a.job_id,
            &StartAttempt {
                provider: "q".to_owned(),
                slot: Slot::Hedge,
                lease: std::time::Duration::from_secs(60),
                trust: None,
                charges: Vec::new(),
            },
        )
        .await
        .unwrap();
    // `c` is cancelled first: its result must not win.
    store
        .cancel_attempt(&OwnerId("acme".to_owned()), &c.job_id, c.ordinal, "a test")
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let items = [
        (b.clone(), answer(2)),
        (a.clone(), answer(1)),
        (hedge.clone(), answer(10)),
        (c.clone(), answer(3)),
    ];
    let answers = ops::complete_many(&mut *conn, &store.sql, &items)
        .await
        .unwrap();
    assert_eq!(answers.len(), 4);
    let won = |i: usize| {
        answers[i]
            .as_ref()
            .unwrap()
            .clone()
            .unwrap_or_else(|| panic!("item {i} did not win"))
    };
    let (job_b, attempts_b) = won(0);
    assert_eq!(
        (job_b.id.clone(), job_b.result.clone()),
        (b.job_id.clone(), Some(json!({"n": 2})))
    );
    let attempts_b =
        attempts_b.expect("nothing changed the job meanwhile: its attempts come with it");
    assert_eq!(attempts_b.len(), 1);
    assert_eq!(attempts_b[0].state, AttemptState::Succeeded);
    let (job_a, attempts_a) = won(1);
    assert_eq!((job_a.completed_by, job_a.version), (Some(a.ordinal), 1));
    let states: Vec<_> = attempts_a.unwrap().iter().map(|x| x.state).collect();
    assert_eq!(states, [AttemptState::Succeeded, AttemptState::Started]);
    assert!(
        matches!(answers[2], Ok(None)),
        "the hedge came second: it did not win"
    );
    assert!(
        matches!(answers[3], Ok(None)),
        "a cancelled attempt does not win"
    );
    drop(conn);
    // The losers go the way of a loss alone: recorded, the job unchanged.
    let lost = store
        .finish_attempt(&hedge, Outcome::Succeeded(answer(10)))
        .await
        .unwrap();
    assert!(matches!(lost, crate::Finish::Lost { winner: Some(n) } if n == a.ordinal));
    let job_a = store
        .job(&OwnerId("acme".to_owned()), &a.job_id)
        .await
        .unwrap();
    assert_eq!(job_a.result, Some(json!({"n": 1})));
    store.close().await;
    drop_schema(pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_that_swap_the_same_jobs_in_opposite_orders_never_deadlock_and_each_wins_once() {
    let Some((store, pool, schema)) = postgres().await else {
        return;
    };
    // Jobs enough that the planner reaches each by its index, in the
    // order the batch lists them, as it does on a database in use.
    filler(&pool, 20_000, "queued", false).await;
    pool.execute("ANALYZE jobs").await.unwrap();
    for round in 0..3 {
        let mut handles = Vec::new();
        for i in 0..30 {
            handles.push(started(&store, &format!("r{round}-k{i:02}")).await);
        }
        let mut own = Vec::new();
        for i in 0..200 {
            own.push(started(&store, &format!("r{round}-own{i:03}")).await);
        }
        // The shared jobs, listed in opposite orders; one batch holds jobs
        // of its own too, so that the two listings differ in size as well.
        let forward: Vec<_> = handles
            .iter()
            .chain(&own)
            .map(|h| (h.clone(), answer(1)))
            .collect();
        let backward: Vec<_> = handles
            .iter()
            .rev()
            .map(|h| (h.clone(), answer(2)))
            .collect();
        let (sql_a, sql_b) = (store.sql.clone(), store.sql.clone());
        // Both connections open before either statement is sent.
        let (mut conn_a, mut conn_b) =
            (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
        let a =
            tokio::spawn(async move { ops::complete_many(&mut *conn_a, &sql_a, &forward).await });
        let b =
            tokio::spawn(async move { ops::complete_many(&mut *conn_b, &sql_b, &backward).await });
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        let wins = a
            .iter()
            .chain(&b)
            .filter(|x| matches!(x, Ok(Some(_))))
            .count();
        assert_eq!(wins, 230, "each job won exactly once");
    }
    let settled: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE state = 'succeeded' AND version = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(settled, 690);
    store.close().await;
    drop_schema(pool, &schema).await;
}

/// The plan of a batched statement: `generic`, as PostgreSQL may keep for a
/// prepared statement, or custom, made for the arrays given, as it makes
/// for a prepared statement's first runs (and later ones, when the generic
/// plan seems dearer).
async fn plan(pool: &PgPool, generic: bool, types: &str, statement: &str, args: &str) -> String {
    let mut conn = pool.acquire().await.unwrap();
    let mode = if generic {
        "force_generic_plan"
    } else {
        "force_custom_plan"
    };
    conn.execute(format!("SET plan_cache_mode = {mode}").as_str())
        .await
        .unwrap();
    conn.execute(format!("PREPARE batch({types}) AS {statement}").as_str())
        .await
        .unwrap();
    let rows: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN EXECUTE batch({args})"))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    conn.execute("DEALLOCATE batch").await.unwrap();
    rows.join("\n")
}

/// `ARRAY[…]` of `n` values made by `value`, cast to `ty`.
fn array(n: usize, ty: &str, value: impl Fn(usize) -> String) -> String {
    let values: Vec<String> = (0..n).map(value).collect();
    format!("ARRAY[{}]::{ty}", values.join(", "))
}

/// Whether a plan reads a whole table of jobs, attempts or reservations.
fn scans_whole(plan: &str) -> bool {
    ["jobs", "attempts", "reservations"]
        .iter()
        .any(|table| plan.contains(&format!("Seq Scan on {table}")))
}

/// The types of `complete_and_close`'s parameters, and values for `n` of
/// the filler's attempts.
const SWAP_TYPES: &str = "text[], int8[], text[], int8[], text[], text[]";
fn swap_args(n: usize) -> String {
    [
        array(n, "text[]", |i| format!("'filler-{}'", i * 7 + 1)),
        array(n, "int8[]", |_| "0".to_owned()),
        array(n, "text[]", |_| "'{}'".to_owned()),
        array(n, "int8[]", |_| "1".to_owned()),
        array(n, "text[]", |_| "NULL".to_owned()),
        array(n, "text[]", |_| "NULL".to_owned()),
    ]
    .join(", ")
}

/// The types of `insert_jobs_and_attempts`'s parameters, and values for `n`
/// new jobs.
const INSERT_TYPES: &str = "text[], text[], text[], text[], text[], text[], text[], text[], \
     int8[], text[], text[], text[], text[], int8[], text[], int8[]";
fn insert_args(n: usize) -> String {
    let texts = |value: &str| array(n, "text[]", |i| format!("'{value}{i}'"));
    let ints = || array(n, "int8[]", |_| "0".to_owned());
    [
        texts("new-"),
        texts("owner-"),
        texts("key-"),
        texts("route"),
        texts("contract"),
        texts("digest"),
        texts("{}"),
        texts("fingerprint"),
        ints(),
        texts("native"),
        array(n, "text[]", |_| "NULL".to_owned()),
        array(n, "text[]", |_| "NULL".to_owned()),
        texts("provider"),
        ints(),
        texts("contract"),
        ints(),
    ]
    .join(", ")
}

#[tokio::test]
async fn a_batch_reaches_its_jobs_and_attempts_by_index_however_many_rows_there_are() {
    // No statistics (a server whose autovacuum is off, as this machine's):
    // the planner guesses that a value of a column matches one row in 200,
    // so a condition on many ids at once seemed to match much of a table.
    let Some((store, pool, schema)) = postgres().await else {
        return;
    };
    let swap = store.sql.complete_and_close.as_deref().unwrap();
    let settle = store.sql.complete_and_settle.as_deref().unwrap();
    let insert = store.sql.insert_jobs_and_attempts.as_deref().unwrap();
    let settle_types = format!("{SWAP_TYPES}, int8[], int8[]");
    let settle_args = |n: usize| {
        let costs = array(n, "int8[]", |_| "1".to_owned());
        format!("{}, {costs}, {costs}", swap_args(n))
    };
    // A plan a connection keeps for its prepared statement may be made
    // while the tables are empty, and serves it for as long as it lives.
    let swap_empty = plan(&pool, true, SWAP_TYPES, swap, &swap_args(2)).await;
    assert!(!scans_whole(&swap_empty), "{swap_empty}");
    let settle_empty = plan(&pool, true, &settle_types, settle, &settle_args(2)).await;
    assert!(!scans_whole(&settle_empty), "{settle_empty}");
    let insert_empty = plan(&pool, true, INSERT_TYPES, insert, &insert_args(2)).await;
    assert!(!scans_whole(&insert_empty), "{insert_empty}");
    // Many rows, and batches of the most a batch takes, planned for their
    // arrays or kept generic.
    filler(&pool, 20_000, "running", true).await;
    let n = crate::store::BATCH_MOST;
    for generic in [true, false] {
        let swap = plan(&pool, generic, SWAP_TYPES, swap, &swap_args(n)).await;
        assert!(!scans_whole(&swap), "{swap}");
        let settle = plan(&pool, generic, &settle_types, settle, &settle_args(n)).await;
        assert!(!scans_whole(&settle), "{settle}");
        let insert = plan(&pool, generic, INSERT_TYPES, insert, &insert_args(n)).await;
        assert!(!scans_whole(&insert), "{insert}");
    }
    store.close().await;
    drop_schema(pool, &schema).await;
}
