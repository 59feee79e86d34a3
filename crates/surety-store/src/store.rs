//! The store: one interface over SQLite and PostgreSQL. Every operation is
//! written once (`ops.rs`); this file validates arguments and runs each
//! operation where its engine wants it: on SQLite's writer thread or a
//! reading connection, on PostgreSQL in a transaction from the pool.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};
use surety_core::{Intent, JobState};

use crate::batch::{self, Batcher};
use crate::conn::ready;
use crate::ops::{self, Insert, Started};
use crate::sql::Sql;
use crate::sqlite::{Checkpoints, Sqlite};
use crate::trust;
/// The longest provider response id kept (OpenAI's and Anthropic's are
/// well under 100 bytes).
const MAX_RESPONSE_ID: usize = 255;

use crate::{
    Answer, Attempt, AttemptHandle, AttemptRef, BudgetStatus, Charge, Created, Demotion, Finish,
    Job, JobId, Lift, LiveOutcome, LiveResult, LiveVerdict, NewJob, Outcome, OwnerId, Question,
    Race, Reservation, Slot, Spend, StartAttempt, StoreError, UnknownAttempt,
};

/// The database engine behind a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// An embedded file: one writer thread, WAL, writes group-committed.
    Sqlite,
    /// A server shared by several router replicas, at READ COMMITTED.
    Postgres,
}

impl Backend {
    /// The engine a database URL names (`sqlite:`, `postgres:` or
    /// `postgresql:`), if any.
    pub fn of_url(url: &str) -> Option<Backend> {
        match url.split(':').next().unwrap_or_default() {
            "sqlite" => Some(Backend::Sqlite),
            "postgres" | "postgresql" => Some(Backend::Postgres),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// `sqlite:path/to/file.db` or `postgres://user@host:port/db`.
    pub url: String,
    /// Reading connections (SQLite) or connections for everything (PostgreSQL).
    pub max_connections: u32,
    /// How long a write waits for SQLite's lock (held by another process)
    /// before failing.
    pub busy_timeout: Duration,
    /// SQLite: whether each commit is fsynced (`Full`) or only each
    /// checkpoint (`Normal`, the default: a crash of the process loses
    /// nothing acknowledged, a power loss may lose the last commits).
    pub sqlite_synchronous: SqliteSync,
    /// SQLite: the most bytes the database file may hold; a write past it
    /// fails as [`Outage::Full`](crate::Outage::Full). `None`: the disk's room.
    pub sqlite_max_bytes: Option<u64>,
    /// PostgreSQL: how long an operation waits for a connection (the
    /// server being away included) before failing as
    /// [`Outage::Unavailable`](crate::Outage::Unavailable).
    pub acquire_timeout: Duration,
}

/// SQLite's `synchronous` in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqliteSync {
    /// Durable across a process crash; the last commits may be lost to a
    /// power loss or an OS crash.
    #[default]
    Normal,
    /// Every commit is fsynced: durable across a power loss too.
    Full,
}

impl SqliteSync {
    pub fn pragma(self) -> &'static str {
        match self {
            SqliteSync::Normal => "NORMAL",
            SqliteSync::Full => "FULL",
        }
    }
}

impl StoreOptions {
    pub fn new(url: impl Into<String>) -> StoreOptions {
        StoreOptions {
            url: url.into(),
            max_connections: 8,
            busy_timeout: Duration::from_secs(5),
            sqlite_synchronous: SqliteSync::Normal,
            sqlite_max_bytes: None,
            acquire_timeout: Duration::from_secs(3),
        }
    }
}

/// An attempt to start, validated.
fn begin(start: &StartAttempt) -> Result<ops::Begin, StoreError> {
    Ok(ops::Begin {
        slot: start.slot,
        provider: start.provider.clone(),
        lease: lease_ms(start.lease)?,
        trust: start.trust.clone(),
        charges: charges(&start.charges)?,
    })
}

/// Charges, validated, in their lock order: by the budgets' names, each once.
fn charges(charges: &[Charge]) -> Result<Vec<Charge>, StoreError> {
    let mut charges = charges.to_vec();
    for charge in &charges {
        check_text("budget", &charge.budget)?;
        if charge.amount < 0 || charge.limit.is_some_and(|limit| limit < 0) {
            return Err(StoreError::Invalid {
                field: "charges",
                reason: format!(
                    "budget `{}`: an amount and a limit are never negative",
                    charge.budget
                ),
            });
        }
    }
    // The budgets' lock order: by name, each once.
    charges.sort_by(|a, b| a.budget.cmp(&b.budget));
    if let Some(twice) = charges.windows(2).find(|w| w[0].budget == w[1].budget) {
        return Err(StoreError::Invalid {
            field: "charges",
            reason: format!("budget `{}` is charged twice", twice[0].budget),
        });
    }
    Ok(charges)
}

/// The longest lease an attempt may take.
const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// How long a PostgreSQL connection may sit idle before it is checked.
const PING_AFTER_IDLE: Duration = Duration::from_secs(5);
/// The most attempts one reaper pass moves.
const REAP_BATCH: i64 = 500;

#[derive(Debug, Clone)]
enum Engine {
    Sqlite(Arc<Sqlite>),
    Postgres(Arc<Pg>),
}

/// PostgreSQL: the pool, and the batchers of the two statements every job
/// makes (`batch.rs`).
#[derive(Debug)]
struct Pg {
    pool: PgPool,
    creates: Batcher<Insert, Started>,
    completes: Batcher<(AttemptHandle, Answer), ops::AtOnce>,
}

/// The most jobs one batched statement takes.
pub(crate) const BATCH_MOST: usize = 64;
/// How many batched statements of each kind run at once: one, so that
/// every caller that comes while it runs shares the next (measured against
/// two: ×1.26–1.35 jobs/s at 16 and 64 clients, and ×0.64–0.67 of the
/// server's CPU per job).
const BATCH_IN_FLIGHT: usize = 1;

impl Pg {
    fn new(pool: PgPool, sql: &Arc<Sql>) -> Pg {
        let (on, with) = (pool.clone(), sql.clone());
        let creates = Batcher::start(BATCH_MOST, BATCH_IN_FLIGHT, move |inserts| {
            create_batch(on.clone(), with.clone(), inserts)
        });
        let (on, with) = (pool.clone(), sql.clone());
        let completes = Batcher::start(BATCH_MOST, BATCH_IN_FLIGHT, move |items| {
            complete_batch(on.clone(), with.clone(), items)
        });
        Pg {
            pool,
            creates,
            completes,
        }
    }
}

/// A job's insert with its first attempt, logged when it made both.
fn started(out: Started) -> Started {
    if let (Created::New(job), Some(handle)) = &out {
        tracing::info!(job_id = %job.id, attempt = handle.ordinal, provider = %handle.provider, "attempt started");
    }
    out
}

/// New jobs with their first attempts, in one statement; each alone when
/// that statement failed (writing nothing) on what may be one job's fault.
/// Where any reserves of a budget, the batch's statement holds its
/// reservations too ([`charged_batch`]).
pub(crate) async fn create_batch(
    pool: PgPool,
    sql: Arc<Sql>,
    inserts: Vec<Insert>,
) -> Vec<Result<Started, StoreError>> {
    if inserts.iter().any(charged) {
        return charged_batch(&pool, &sql, &inserts).await;
    }
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return batch::none_ran(&e.into(), inserts.len()),
    };
    let failed = match ops::create_many(&mut *conn, &sql, &inserts).await {
        Ok(answers) => return answers,
        Err(e) => e,
    };
    if let Some(each) = batch::shared_failure(&failed, inserts.len()) {
        return each;
    }
    tracing::warn!(error = %failed, jobs = inserts.len(), "a batch of new jobs failed; each is inserted alone");
    let mut answers = Vec::with_capacity(inserts.len());
    for insert in &inserts {
        answers.push(ops::create(&mut *conn, &sql, insert).await);
    }
    answers
}

/// Whether an insert's first attempt reserves of a budget.
fn charged(insert: &Insert) -> bool {
    insert.first.as_ref().is_some_and(|f| !f.charges.is_empty())
}

/// New jobs of which some reserve, in one statement in autocommit: the
/// batch's, its new attempts' charges held of each budget by one call that
/// locks the budgets and guards the holds by each budget's sum
/// ([`ops::create_many_reserving`]). Where a budget has no room for the
/// whole batch, or the statement failed, nothing of it stands, and each job
/// is created alone in a transaction of its own: which of them fit is
/// decided one by one, by the rule a lone job keeps.
async fn charged_batch(
    pool: &PgPool,
    sql: &Sql,
    inserts: &[Insert],
) -> Vec<Result<Started, StoreError>> {
    let together = async {
        let mut conn = pool.acquire().await?;
        ops::create_many_reserving(&mut *conn, sql, inserts).await
    };
    match together.await {
        Ok(Some(answers)) => return answers,
        Ok(None) => {}
        Err(e) => {
            if let Some(each) = batch::shared_failure(&e, inserts.len()) {
                return each;
            }
            tracing::warn!(error = %e, jobs = inserts.len(), "a batch of new jobs failed; each is inserted alone");
        }
    }
    let mut answers = Vec::with_capacity(inserts.len());
    for insert in inserts {
        answers.push(alone(pool, sql, insert).await);
    }
    answers
}

/// One job created in a transaction of its own, its reservation with it.
async fn alone(pool: &PgPool, sql: &Sql, insert: &Insert) -> Result<Started, StoreError> {
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await?;
    let out = ops::create(&mut *tx, sql, insert).await;
    if out.is_ok() {
        tx.commit().await?;
    }
    out
}

/// Compare-and-swaps of attempts, in one statement; each alone when that
/// statement failed (writing nothing) on what may be one attempt's fault.
async fn complete_batch(
    pool: PgPool,
    sql: Arc<Sql>,
    items: Vec<(AttemptHandle, Answer)>,
) -> Vec<Result<ops::AtOnce, StoreError>> {
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => return batch::none_ran(&e.into(), items.len()),
    };
    let failed = match ops::complete_many(&mut *conn, &sql, &items).await {
        Ok(answers) => return answers,
        Err(e) => e,
    };
    if let Some(each) = batch::shared_failure(&failed, items.len()) {
        return each;
    }
    tracing::warn!(error = %failed, attempts = items.len(), "a batch of results failed; each is swapped alone");
    let mut answers = Vec::with_capacity(items.len());
    for (handle, answer) in &items {
        answers.push(ops::complete_at_once(&mut *conn, &sql, handle, answer).await);
    }
    answers
}

/// A handle on the database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    engine: Engine,
    pub(crate) sql: Arc<Sql>,
}

/// Runs an operation of `ops` on the store's engine. `write` runs it in a
/// transaction of its own (PostgreSQL) or on the writer thread (SQLite);
/// `single` is a write of one guarded statement (or a statement and a read
/// when it is refused), run without a transaction on PostgreSQL; `read` runs
/// it on a reading connection. In the body, `$c` is the connection and `$sql`
/// the statements; what the body borrows is moved to SQLite's writer thread,
/// so bind owned values before.
macro_rules! on_engine {
    ($store:expr, $kind:ident, |$c:ident, $sql:ident| $body:expr) => {{
        let store = $store;
        match &store.engine {
            Engine::Sqlite(lite) => on_engine!(@sqlite $kind, store, lite, |$c, $sql| $body),
            Engine::Postgres(pg) => {
                let pool = &pg.pool;
                on_engine!(@postgres $kind, store, pool, |$c, $sql| $body)
            }
        }
    }};
    (@sqlite read, $store:ident, $lite:ident, |$c:ident, $sql:ident| $body:expr) => {{
        let $sql = &*$store.sql;
        $lite.read(|$c| ready($body))
    }};
    (@sqlite $write:ident, $store:ident, $lite:ident, |$c:ident, $sql:ident| $body:expr) => {{
        let $sql = $store.sql.clone();
        $lite
            .write(move |$c| {
                let $sql = &*$sql;
                ready($body)
            })
            .await
    }};
    (@postgres write, $store:ident, $pool:ident, |$c:ident, $sql:ident| $body:expr) => {{
        let $sql = &*$store.sql;
        let mut tx = $pool
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await?;
        let out = {
            let $c = &mut *tx;
            $body.await
        };
        if out.is_ok() {
            tx.commit().await?;
        }
        out
    }};
    (@postgres $autocommit:ident, $store:ident, $pool:ident, |$c:ident, $sql:ident| $body:expr) => {{
        let $sql = &*$store.sql;
        let mut conn = $pool.acquire().await?;
        let $c = &mut *conn;
        $body.await
    }};
}

impl Store {
    /// Opens the database named by `url` and runs the pending migrations.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        Store::open_with(&StoreOptions::new(url)).await
    }

    pub async fn open_with(options: &StoreOptions) -> Result<Store, StoreError> {
        let connections = options.max_connections.max(1);
        let (engine, backend) = match Backend::of_url(&options.url) {
            Some(Backend::Sqlite) => {
                let (url, timeout) = (options.url.clone(), options.busy_timeout);
                let writing = Checkpoints {
                    max_bytes: options.sqlite_max_bytes,
                    ..Checkpoints::new(options.sqlite_synchronous)
                };
                // Opening and migrating a file blocks; keep it off the runtime.
                let lite = tokio::task::spawn_blocking(move || {
                    Sqlite::open_with(&url, connections as usize, timeout, writing)
                })
                .await
                .map_err(|e| StoreError::not_committed(format!("opening SQLite: {e}")))??;
                (Engine::Sqlite(lite), Backend::Sqlite)
            }
            Some(Backend::Postgres) => {
                let pool = PgPoolOptions::new()
                    .max_connections(connections)
                    .acquire_timeout(options.acquire_timeout)
                    // sqlx pings every connection it hands out: a round trip
                    // per operation. Ping only one that sat idle a while; a
                    // connection that breaks in between fails its statement,
                    // which is reported and changes nothing.
                    .test_before_acquire(false)
                    .before_acquire(|conn, meta| {
                        Box::pin(async move {
                            if meta.idle_for > PING_AFTER_IDLE {
                                conn.ping().await?;
                            }
                            Ok(true)
                        })
                    })
                    .connect(&options.url)
                    .await?;
                sqlx::migrate!("./migrations").run(&pool).await?;
                let sql = Arc::new(Sql::new(Backend::Postgres));
                let pg = Pg::new(pool, &sql);
                return Ok(Store {
                    engine: Engine::Postgres(Arc::new(pg)),
                    sql,
                });
            }
            None => {
                let scheme = options.url.split(':').next().unwrap_or_default();
                return Err(StoreError::UnsupportedUrl(scheme.to_owned()));
            }
        };
        Ok(Store {
            engine,
            sql: Arc::new(Sql::new(backend)),
        })
    }

    pub fn backend(&self) -> Backend {
        match self.engine {
            Engine::Sqlite(_) => Backend::Sqlite,
            Engine::Postgres(_) => Backend::Postgres,
        }
    }

    /// Closes every connection.
    pub async fn close(&self) {
        match &self.engine {
            Engine::Sqlite(lite) => lite.close().await,
            Engine::Postgres(pg) => pg.pool.close().await,
        }
    }

    /// Records a new job, or finds the one this owner already made with this
    /// key. The unique constraint decides; the fingerprint comparison only
    /// tells a replay from a conflict.
    pub async fn create_or_replay(&self, new: &NewJob) -> Result<Created, StoreError> {
        let insert = self.insert(new, None)?;
        let (created, _) = on_engine!(self, single, |c, sql| ops::create(c, sql, &insert))?;
        Ok(created)
    }

    /// As [`Store::create_or_replay`]; a new job also starts its first
    /// attempt, at `start.provider`, in the same commit (the job is
    /// `running` from the start). A replay or a conflict starts nothing.
    pub async fn create_and_start(
        &self,
        new: &NewJob,
        start: &StartAttempt,
    ) -> Result<(Created, Option<AttemptHandle>), StoreError> {
        check_text("provider", &start.provider)?;
        if start.slot != Slot::Primary {
            return Err(StoreError::Invalid {
                field: "slot",
                reason: "a new job's first attempt takes the primary slot".to_owned(),
            });
        }
        let insert = self.insert(new, Some(begin(start)?))?;
        // PostgreSQL makes both in one statement (`insert_jobs_and_attempts`),
        // so it needs no transaction of its own, and shares it with every
        // other job waiting for it; with their reservations, one
        // transaction for the batch (`create_batch`).
        let insert = match &self.engine {
            Engine::Postgres(pg) => match pg.creates.submit(insert) {
                Ok(answer) => return Ok(started(batch::answer(answer).await?)),
                Err(insert) => insert,
            },
            Engine::Sqlite(_) => insert,
        };
        // A reservation is in the job's own transaction, after its row and
        // its attempt's: several statements.
        let out = match charged(&insert) {
            true => on_engine!(self, write, |c, sql| ops::create(c, sql, &insert))?,
            false => on_engine!(self, single, |c, sql| ops::create(c, sql, &insert))?,
        };
        Ok(started(out))
    }

    /// The job this owner's key already names, if any: `Replayed` when the
    /// intent is the same, `Conflict` when it is not. A read, for answering
    /// a replay before anything else is decided; creating still goes
    /// through [`Store::create_and_start`], whose unique constraint decides.
    pub async fn find(&self, new: &NewJob) -> Result<Option<Created>, StoreError> {
        let insert = self.insert(new, None)?;
        let fingerprint = &insert.fingerprint;
        on_engine!(self, read, |c, sql| ops::find(c, sql, new, fingerprint))
    }

    fn insert(&self, new: &NewJob, first: Option<ops::Begin>) -> Result<Insert, StoreError> {
        check_text("owner", &new.owner.0)?;
        check_text("route", &new.route)?;
        check_text("contract", &new.contract)?;
        let fingerprint = match &new.fingerprint {
            Some(fingerprint) => fingerprint.clone(),
            None => Intent {
                route: &new.route,
                input: &new.input,
            }
            .fingerprint()
            .map_err(|e| StoreError::Invalid {
                field: "input",
                reason: e.to_string(),
            })?,
        };
        Ok(Insert {
            id: JobId(uuid::Uuid::now_v7().to_string()),
            new: new.clone(),
            fingerprint,
            first,
            room: match &self.engine {
                Engine::Sqlite(lite) => lite.new_job_pages(),
                Engine::Postgres(_) => None,
            },
        })
    }

    /// Starts an attempt, if no attempt of the job holds the slot.
    pub async fn start_attempt(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
        start: &StartAttempt,
    ) -> Result<AttemptHandle, StoreError> {
        check_text("provider", &start.provider)?;
        let begin = begin(start)?;
        let (owner, job_id) = (owner.clone(), job_id.clone());
        let handle = on_engine!(self, write, |c, sql| ops::start_attempt(
            c, sql, &owner, &job_id, &begin
        ))?;
        tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, provider = %handle.provider, "attempt started");
        Ok(handle)
    }

    /// Renews a started attempt's lease. Refused once the lease has expired
    /// or the attempt has left `started`, so a heartbeat arriving after the
    /// reaper changes nothing.
    pub async fn heartbeat(
        &self,
        handle: &AttemptHandle,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let lease = lease_ms(lease)?;
        let handle = handle.clone();
        on_engine!(self, single, |c, sql| ops::heartbeat(
            c, sql, &handle, lease
        ))
    }

    /// Records how an attempt ended. A result goes through compare-and-swap:
    /// it becomes the job's only if the job is still at the version the
    /// attempt started from, nobody completed it, and the attempt is still
    /// open. Otherwise the attempt is `lost`, the result is dropped and the
    /// race is recorded.
    pub async fn finish_attempt(
        &self,
        handle: &AttemptHandle,
        outcome: Outcome,
    ) -> Result<Finish, StoreError> {
        Ok(self.finish_attempt_settled(handle, outcome).await?.0)
    }

    /// As [`Store::finish_attempt`]; when the attempt won, also the job's
    /// attempts as the winning commit left them, where the engine reads
    /// them in that write at no extra visit: SQLite on the writer's own
    /// connection, whose pages are warm; PostgreSQL in the compare-and-swap
    /// statement itself, when nothing changed the job between that
    /// statement's snapshot and its lock. `None` otherwise.
    pub async fn finish_attempt_settled(
        &self,
        handle: &AttemptHandle,
        outcome: Outcome,
    ) -> Result<(Finish, Option<Vec<Attempt>>), StoreError> {
        let owned = handle.clone();
        let (finish, attempts) = match &outcome {
            Outcome::Succeeded(answer) => {
                let result = answer.clone();
                // One statement, no transaction, where the engine can; the
                // loss (rare, and several statements) in a transaction.
                let at_once = match &self.engine {
                    Engine::Postgres(pg) => {
                        match pg.completes.submit((owned.clone(), result.clone())) {
                            Ok(answer) => batch::answer(answer).await?,
                            Err((handle, answer)) => {
                                let mut conn = pg.pool.acquire().await?;
                                ops::complete_at_once(&mut *conn, &self.sql, &handle, &answer)
                                    .await?
                            }
                        }
                    }
                    Engine::Sqlite(_) => None,
                };
                match at_once {
                    Some((job, attempts)) => (Finish::Won(Box::new(job)), attempts),
                    None => on_engine!(self, write, |c, sql| ops::complete_with_attempts(
                        c, sql, &owned, &result
                    ))?,
                }
            }
            Outcome::Failed {
                error,
                give_up,
                spend,
            } => {
                let (error, give_up, spend) = (error.clone(), *give_up, *spend);
                let failed = on_engine!(self, write, |c, sql| ops::fail(
                    c,
                    sql,
                    &owned,
                    (&error, give_up),
                    spend
                ))?;
                (failed, None)
            }
        };
        let (job_id, attempt) = (&handle.job_id, handle.ordinal);
        match (&finish, &outcome) {
            (Finish::Won(_), _) => {
                tracing::info!(job_id = %job_id, attempt, "attempt won; job succeeded")
            }
            (Finish::Lost { winner }, _) => tracing::warn!(
                job_id = %job_id,
                attempt,
                winner = ?winner,
                "attempt lost the race; its result was discarded"
            ),
            (Finish::Failed, Outcome::Failed { error, .. }) => {
                tracing::info!(job_id = %job_id, attempt, error, "attempt failed")
            }
            (Finish::Failed, Outcome::Succeeded(_)) => {}
        }
        Ok((finish, attempts))
    }

    /// The attempt timed out after its request left: it becomes `unknown`,
    /// and so does its job unless another attempt is running.
    pub async fn mark_unknown(
        &self,
        handle: &AttemptHandle,
        reason: &str,
    ) -> Result<(), StoreError> {
        let (owned, why) = (handle.clone(), reason.to_owned());
        on_engine!(self, write, |c, sql| ops::mark_unknown(
            c, sql, &owned, &why
        ))?;
        tracing::warn!(job_id = %handle.job_id, attempt = handle.ordinal, reason, "attempt unknown");
        Ok(())
    }

    /// Resolves an open attempt out of band (an admin's call). The attempt
    /// can never finish afterwards; the job's version does not move, so any
    /// other open attempt of the job is unaffected.
    pub async fn cancel_attempt(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
        ordinal: i64,
        reason: &str,
    ) -> Result<(), StoreError> {
        let (owner, id, why) = (owner.clone(), job_id.clone(), reason.to_owned());
        on_engine!(self, write, |c, sql| ops::cancel_attempt(
            c, sql, &owner, &id, ordinal, &why
        ))?;
        tracing::warn!(job_id = %job_id, attempt = ordinal, reason, "attempt cancelled out of band");
        Ok(())
    }

    /// Cancels the owner's job when nothing of it may still run (queued or
    /// failed, no attempt open); a job cancelled already stays so. Refused
    /// with [`StoreError::AttemptOpen`] while an attempt is started or
    /// unknown, and as a transition for a succeeded job.
    pub async fn cancel_job(&self, owner: &OwnerId, job_id: &JobId) -> Result<(), StoreError> {
        let (owner, id) = (owner.clone(), job_id.clone());
        on_engine!(self, write, |c, sql| ops::cancel_job(c, sql, &owner, &id))?;
        tracing::info!(job_id = %job_id, "job cancelled");
        Ok(())
    }

    /// Budget `budget` as the database holds it now: what its buckets from
    /// `counts_from_ms` on spent, what its open reservations hold, and of
    /// that what unknown attempts hold.
    pub async fn budget(
        &self,
        budget: &str,
        counts_from_ms: i64,
    ) -> Result<BudgetStatus, StoreError> {
        let budget = budget.to_owned();
        on_engine!(self, read, |c, sql| ops::budget_status(
            c,
            sql,
            &budget,
            counts_from_ms
        ))
    }

    /// Reserves `charges` for one of the router's own checks (a shadow call,
    /// a re-check), named `id`, by the rule an attempt's reservation keeps:
    /// all of them in one transaction, or none
    /// ([`StoreError::OverBudget`]).
    pub async fn hold_for_check(&self, id: &str, charges: &[Charge]) -> Result<(), StoreError> {
        check_text("check", id)?;
        let (id, charges) = (id.to_owned(), self::charges(charges)?);
        on_engine!(self, write, |c, sql| ops::reserve(
            c,
            sql,
            ops::Holder::Check(&id),
            &charges
        ))
    }

    /// Settles what check `id` holds: to `spend`.
    pub async fn settle_check(&self, id: &str, spend: Spend) -> Result<(), StoreError> {
        let id = id.to_owned();
        on_engine!(self, write, |c, sql| ops::settle_held(
            c,
            sql,
            ops::Holder::Check(&id),
            spend
        ))
    }

    /// Settles, to their worst case, the holds of checks taken more than
    /// `age` ago and never settled (their router stopped or crashed with
    /// the call out), at most `most` checks: the number settled.
    pub async fn settle_stale_checks(&self, age: Duration, most: u32) -> Result<u64, StoreError> {
        let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        on_engine!(self, write, |c, sql| ops::settle_stale_checks(
            c,
            sql,
            age,
            i64::from(most)
        ))
    }

    /// The owner's job's reservations: what each attempt reserved of each
    /// budget, and what it cost once it ended.
    pub async fn reservations(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
    ) -> Result<Vec<Reservation>, StoreError> {
        self.job(owner, job_id).await?;
        let job_id = job_id.clone();
        on_engine!(self, read, |c, sql| ops::reservations(c, sql, &job_id))
    }

    /// Marks the owner's Responses job deleted (it is no longer found as a
    /// response; the job stays); false when there is no such response, or
    /// it was deleted already.
    pub async fn delete_response(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
    ) -> Result<bool, StoreError> {
        let (owner, id) = (owner.clone(), job_id.clone());
        on_engine!(self, write, |c, sql| ops::delete_response(
            c, sql, &owner, &id
        ))
    }

    /// Notes the provider's id for an attempt's answer, as soon as it was
    /// read: kept where one is noted already (true when this one was).
    pub async fn note_response_id(
        &self,
        handle: &AttemptHandle,
        id: &str,
    ) -> Result<bool, StoreError> {
        if id.is_empty() || id.len() > MAX_RESPONSE_ID {
            return Err(StoreError::Invalid {
                field: "provider_response_id",
                reason: format!("must be 1 to {MAX_RESPONSE_ID} bytes"),
            });
        }
        let (job_id, ordinal, id) = (handle.job_id.clone(), handle.ordinal, id.to_owned());
        on_engine!(self, write, |c, sql| ops::note_response_id(
            c, sql, &job_id, ordinal, &id
        ))
    }

    /// Provider `provider`'s unknown attempts due a question (of every
    /// owner): unknown for at least `after`, last asked at least `every`
    /// ago or never, and unknown for less than `horizon` (past it an
    /// attempt is left for an operator); least recently asked first, at
    /// most `limit`.
    pub async fn due_unknowns(
        &self,
        provider: &str,
        (after, every, horizon): (Duration, Duration, Duration),
        limit: u32,
    ) -> Result<Vec<UnknownAttempt>, StoreError> {
        let ms = |field: &'static str, d: Duration| {
            i64::try_from(d.as_millis()).map_err(|_| StoreError::Invalid {
                field,
                reason: "longer than the clock counts".to_owned(),
            })
        };
        let window = (
            ms("after", after)?,
            ms("every", every)?,
            ms("horizon", horizon)?,
        );
        let (provider, limit) = (provider.to_owned(), i64::from(limit.max(1)));
        on_engine!(self, read, |c, sql| ops::due_unknowns(
            c, sql, &provider, window, limit
        ))
    }

    /// Records a question the reconciler asked about an attempt, with the
    /// provider's answer (`question.n` and `asked_at_ms` are the
    /// database's: the next number, and now).
    pub async fn record_question(
        &self,
        job_id: &JobId,
        question: &Question,
    ) -> Result<(), StoreError> {
        const OUTCOMES: [&str; 5] = ["answered", "ended", "running", "not_found", "error"];
        if !["id", "metadata"].contains(&question.asked_by.as_str())
            || !OUTCOMES.contains(&question.outcome.as_str())
        {
            return Err(StoreError::Invalid {
                field: "question",
                reason: format!(
                    "asked by `{}` with outcome `{}`: by id or metadata, outcome one of {}",
                    question.asked_by,
                    question.outcome,
                    OUTCOMES.join(", ")
                ),
            });
        }
        let (job_id, question) = (job_id.clone(), question.clone());
        on_engine!(self, write, |c, sql| ops::record_question(
            c, sql, &question, &job_id
        ))
    }

    /// The questions asked about the owner's job's attempts, by attempt,
    /// in order; another owner's job is not found.
    pub async fn questions(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
    ) -> Result<Vec<Question>, StoreError> {
        self.job(owner, job_id).await?;
        on_engine!(self, read, |c, sql| ops::questions(c, sql, job_id))
    }

    /// Turns every `started` attempt whose lease has expired (on the
    /// database's clock) into `unknown`, and returns the attempts it moved.
    /// Safe to run from several routers at once: each attempt moves once.
    pub async fn reap_expired(&self) -> Result<Vec<AttemptRef>, StoreError> {
        let expired = on_engine!(self, read, |c, sql| ops::expired(c, sql, REAP_BATCH))?;
        let mut reaped = Vec::new();
        for attempt in expired {
            let (job_id, ordinal) = (attempt.job_id.clone(), attempt.ordinal);
            let moved = on_engine!(self, write, |c, sql| ops::reap(c, sql, &job_id, ordinal))?;
            if moved {
                tracing::warn!(job_id = %attempt.job_id, attempt = ordinal, "lease expired; attempt unknown");
                reaped.push(attempt);
            }
        }
        Ok(reaped)
    }

    /// Retention: deletes at most `batch` settled jobs whose last change is
    /// older than `retention` (on the database's clock), with their
    /// attempts and races, in one short write; returns how many went. A job
    /// with an attempt that may still answer is never pruned. Call again
    /// while it returns `batch`.
    pub async fn prune_settled(&self, retention: Duration, batch: u32) -> Result<u64, StoreError> {
        let older_than = i64::try_from(retention.as_millis()).map_err(|_| StoreError::Invalid {
            field: "retention",
            reason: "longer than the clock counts".to_owned(),
        })?;
        let limit = i64::from(batch.max(1));
        on_engine!(self, write, |c, sql| ops::prune_settled(
            c, sql, older_than, limit
        ))
    }

    /// The operator's attention queue: jobs `unknown`, oldest first (the
    /// longest waiting for a person), then jobs `failed`, newest first; of
    /// `owner`, or of every owner with `None`; at most `limit` of each.
    pub async fn attention(
        &self,
        owner: Option<&OwnerId>,
        limit: u32,
    ) -> Result<(Vec<Job>, Vec<Job>), StoreError> {
        let (owner, limit) = (owner.cloned(), i64::from(limit.max(1)));
        let unknown = on_engine!(self, read, |c, sql| ops::jobs_in_state(
            c,
            sql,
            JobState::Unknown,
            owner.as_ref(),
            true,
            limit
        ))?;
        let failed = on_engine!(self, read, |c, sql| ops::jobs_in_state(
            c,
            sql,
            JobState::Failed,
            owner.as_ref(),
            false,
            limit
        ))?;
        Ok((unknown, failed))
    }

    /// The owner of a job, for an operator of every owner: the owner-scoped
    /// operations then take it.
    pub async fn owner_of(&self, job_id: &JobId) -> Result<OwnerId, StoreError> {
        on_engine!(self, read, |c, sql| ops::owner_of(c, sql, job_id))
    }

    /// How many jobs are in each state, of `owner` or of every owner.
    pub async fn jobs_by_state(
        &self,
        owner: Option<&OwnerId>,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        on_engine!(self, read, |c, sql| ops::count_by_state(c, sql, owner))
    }

    /// Whether the database answers a round trip now.
    pub async fn ping(&self) -> Result<(), StoreError> {
        on_engine!(self, read, |c, sql| ops::ping(c, sql))
    }

    /// How many attempts, of every owner, are `unknown` now: each waits for
    /// a late result, a reconciliation or an admin.
    pub async fn unknown_attempts(&self) -> Result<i64, StoreError> {
        on_engine!(self, read, |c, sql| ops::count_unknown(c, sql))
    }

    /// The owner's job; another owner's job is not found.
    pub async fn job(&self, owner: &OwnerId, job_id: &JobId) -> Result<Job, StoreError> {
        on_engine!(self, read, |c, sql| ops::job(c, sql, owner, job_id))
    }

    /// The owner's job's attempts, in order.
    pub async fn attempts(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
    ) -> Result<Vec<Attempt>, StoreError> {
        Ok(self.job_and_attempts(owner, job_id).await?.1)
    }

    /// The owner's job and its attempts, in order, in one visit.
    pub async fn job_and_attempts(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
    ) -> Result<(Job, Vec<Attempt>), StoreError> {
        on_engine!(self, read, |c, sql| ops::job_and_attempts(
            c, sql, owner, job_id
        ))
    }

    /// Records a live check's result (shadow call or re-check).
    pub async fn record_live(&self, result: &LiveResult) -> Result<(), StoreError> {
        let result = result.clone();
        on_engine!(self, write, |c, sql| trust::record_live(c, sql, &result))
    }

    /// The newest `n` live results of `provider` on `contract`, newest first.
    pub async fn live_window(
        &self,
        provider: &str,
        contract: &str,
        n: u32,
    ) -> Result<Vec<LiveResult>, StoreError> {
        let query = trust::LiveQuery::Window {
            provider,
            contract,
            n: i64::from(n),
        };
        on_engine!(self, read, |c, sql| trust::live(c, sql, &query))
    }

    /// As [`Store::live_window`], each result's source, outcome and
    /// detail only: what a demotion is judged on.
    pub async fn live_verdicts(
        &self,
        provider: &str,
        contract: &str,
        n: u32,
    ) -> Result<Vec<LiveVerdict>, StoreError> {
        let n = i64::from(n);
        on_engine!(self, read, |c, sql| trust::live_verdicts(
            c, sql, provider, contract, n
        ))
    }

    /// Route `route`'s live results since `since_ms` (on the database's
    /// clock) with `outcome`, or with `None` those that broke the contract
    /// or disagreed; oldest first.
    pub async fn live_results(
        &self,
        route: &str,
        since_ms: i64,
        outcome: Option<LiveOutcome>,
    ) -> Result<Vec<LiveResult>, StoreError> {
        let query = trust::LiveQuery::Route {
            route,
            since_ms,
            outcome,
        };
        on_engine!(self, read, |c, sql| trust::live(c, sql, &query))
    }

    /// Demotes `provider` for `contract` for `reason`, unless it is demoted
    /// already (the database decides, across replicas): true when this
    /// call demoted it.
    pub async fn demote(
        &self,
        provider: &str,
        contract: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let (p, k, r) = (provider.to_owned(), contract.to_owned(), reason.to_owned());
        let demoted = on_engine!(self, write, |c, sql| trust::demote(c, sql, &p, &k, &r))?;
        if demoted {
            tracing::warn!(provider, contract, reason, "demoted");
        }
        Ok(demoted)
    }

    /// Every open demotion, by provider and contract.
    pub async fn demotions(&self) -> Result<Vec<Demotion>, StoreError> {
        on_engine!(self, read, |c, sql| trust::demotions(c, sql))
    }

    /// Lifts the open demotion of `provider` for `contract` as `lift`
    /// allows (a certification only lifts a demotion older than itself):
    /// true when one was open and is lifted now.
    pub async fn lift(
        &self,
        provider: &str,
        contract: &str,
        lift: &Lift,
    ) -> Result<bool, StoreError> {
        let (p, k, l) = (provider.to_owned(), contract.to_owned(), lift.clone());
        let lifted = on_engine!(self, write, |c, sql| trust::lift(c, sql, &p, &k, &l))?;
        if lifted {
            tracing::info!(provider, contract, lift = ?lift, "demotion lifted");
        }
        Ok(lifted)
    }

    /// The races the owner's job has seen, oldest first.
    pub async fn races(&self, owner: &OwnerId, job_id: &JobId) -> Result<Vec<Race>, StoreError> {
        on_engine!(self, read, |c, sql| ops::races(c, sql, owner, job_id))
    }
}

fn check_text(field: &'static str, value: &str) -> Result<(), StoreError> {
    let invalid = |reason: &str| {
        Err(StoreError::Invalid {
            field,
            reason: reason.to_owned(),
        })
    };
    match value.len() {
        0 => invalid("must not be empty"),
        n if n > 255 => invalid("must be at most 255 bytes"),
        _ if value.chars().any(char::is_control) => invalid("must not contain control characters"),
        _ => Ok(()),
    }
}

fn lease_ms(lease: Duration) -> Result<i64, StoreError> {
    if lease.is_zero() || lease > MAX_LEASE {
        return Err(StoreError::Invalid {
            field: "lease",
            reason: format!("must be between 1 ms and {} s", MAX_LEASE.as_secs()),
        });
    }
    i64::try_from(lease.as_millis()).map_err(|_| StoreError::Invalid {
        field: "lease",
        reason: "does not fit in milliseconds".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;
    use surety_core::IdempotencyKey;

    use super::*;
    use crate::{Created, JobKind, Slot};

    /// Every statement SQLite's writing connection ran, in order.
    static WRITES: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn traced(sql: &str) {
        WRITES.lock().unwrap().push(sql.to_owned());
    }

    /// A job's two writes on SQLite (the job with its first attempt, and
    /// the attempt's win) run no `RETURNING` (a trigger program and a
    /// temporary b-tree each), no statement that builds a temporary b-tree
    /// (an `IN` list of more than two values in a statement, a CHECK or a
    /// partial index's WHERE), and no read of the job's winner before the
    /// compare-and-swap; they answer what a read after them finds.
    #[tokio::test]
    async fn a_job_and_its_win_cost_sqlite_no_temporary_btree_and_no_read_before_the_swap() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("s.db").display());
        let store = Store::open(&url).await.unwrap();
        let Engine::Sqlite(lite) = &store.engine else {
            panic!("a SQLite store")
        };
        lite.trace_writes(traced);
        let owner = OwnerId("acme".to_owned());
        let new = NewJob {
            owner: owner.clone(),
            key: IdempotencyKey::parse("k-1").unwrap(),
            route: "triage".to_owned(),
            contract: "support-triage".to_owned(),
            contract_digest: "sha256:0000".to_owned(),
            input: json!({"text": "hello"}),
            kind: JobKind::Native,
            messages: None,
            request: None,
            hedgeable: false,
            fingerprint: None,
        };
        let start = StartAttempt {
            provider: "primary".to_owned(),
            slot: Slot::Primary,
            lease: Duration::from_secs(30),
            trust: None,
            charges: Vec::new(),
        };
        let (Created::New(job), Some(handle)) = store.create_and_start(&new, &start).await.unwrap()
        else {
            panic!("a new job with its first attempt")
        };
        let (finish, attempts) = store
            .finish_attempt_settled(&handle, Outcome::Succeeded(json!({"answer": 42}).into()))
            .await
            .unwrap();
        let ran = std::mem::take(&mut *WRITES.lock().unwrap());

        let Finish::Won(won) = finish else {
            panic!("the only attempt wins: {finish:?}")
        };
        let (read, read_attempts) = store.job_and_attempts(&owner, &job.id).await.unwrap();
        assert_eq!(*won, read, "the win answers the job as it was committed");
        assert_eq!(attempts, Some(read_attempts));
        assert_eq!((job.id, handle.ordinal), (read.id.clone(), 1));
        assert!(ran.len() >= 4, "the writes were traced: {ran:?}");
        let returning: Vec<_> = ran.iter().filter(|s| s.contains("RETURNING")).collect();
        assert!(returning.is_empty(), "{returning:?}");
        assert!(
            !ran.iter().any(|s| s.starts_with("SELECT completed_by")),
            "the winner was read before the swap: {ran:?}"
        );
        // What SQLite would run for each statement: no temporary b-tree.
        let explain = rusqlite::Connection::open(dir.path().join("s.db")).unwrap();
        let ephemeral: Vec<_> = ran
            .iter()
            .filter(|statement| {
                let mut program = explain.prepare(&format!("EXPLAIN {statement}")).unwrap();
                let opcodes: Vec<String> = program
                    .query_map([], |row| row.get(1))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                assert!(!opcodes.is_empty(), "{statement}");
                opcodes.iter().any(|op| op == "OpenEphemeral")
            })
            .collect();
        assert!(ephemeral.is_empty(), "{ephemeral:#?}");
    }
}
