//! The store's operations, one engine-neutral implementation over sqlx's
//! `Any` driver.

use std::time::Duration;

use serde_json::Value;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Executor, Row};
use surety_core::{
    AttemptEvent, AttemptState, Fingerprint, Intent, JobEvent, JobState, attempt_after, job_after,
};

use crate::sql::Sql;
use crate::{
    Attempt, AttemptHandle, AttemptRef, Created, Finish, Job, JobId, NewJob, Outcome, OwnerId,
    Race, Slot, StartAttempt, StoreError,
};

/// The database engine behind a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// An embedded file: one writer connection, WAL, writes in `BEGIN IMMEDIATE`.
    Sqlite,
    /// A server shared by several router replicas, at READ COMMITTED.
    Postgres,
}

impl Backend {
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
    /// Connections for reads (SQLite) or for everything (PostgreSQL).
    pub max_connections: u32,
    /// How long a write waits for SQLite's lock before failing.
    pub busy_timeout: Duration,
}

impl StoreOptions {
    pub fn new(url: impl Into<String>) -> StoreOptions {
        StoreOptions {
            url: url.into(),
            max_connections: 8,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// The longest lease an attempt may take.
const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// The most attempts one reaper pass moves.
const REAP_BATCH: i64 = 500;

/// A handle on the database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
    /// Every write goes here. On SQLite it is one connection, so writers
    /// queue in the pool instead of spinning in SQLite's busy handler.
    writer: AnyPool,
    reader: AnyPool,
    sql: std::sync::Arc<Sql>,
}

impl Store {
    /// Opens the database named by `url` and runs the pending migrations.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        Store::open_with(&StoreOptions::new(url)).await
    }

    pub async fn open_with(options: &StoreOptions) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let scheme = options.url.split(':').next().unwrap_or_default();
        let store = match scheme {
            "sqlite" => {
                let url = sqlite_url(&options.url);
                let pragmas = format!(
                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                     PRAGMA foreign_keys = ON; PRAGMA busy_timeout = {};",
                    options.busy_timeout.as_millis()
                );
                let pool = |max: u32| {
                    let pragmas = pragmas.clone();
                    AnyPoolOptions::new()
                        .max_connections(max)
                        .after_connect(move |conn, _| {
                            let pragmas = pragmas.clone();
                            Box::pin(async move {
                                conn.execute(pragmas.as_str()).await?;
                                Ok(())
                            })
                        })
                };
                let writer = pool(1).connect(&url).await?;
                sqlx::migrate!("./migrations").run(&writer).await?;
                let reader = pool(options.max_connections.max(1)).connect(&url).await?;
                Store {
                    backend: Backend::Sqlite,
                    writer,
                    reader,
                    sql: Sql::new(Backend::Sqlite).into(),
                }
            }
            "postgres" | "postgresql" => {
                let pool = AnyPoolOptions::new()
                    .max_connections(options.max_connections.max(1))
                    .connect(&options.url)
                    .await?;
                sqlx::migrate!("./migrations").run(&pool).await?;
                Store {
                    backend: Backend::Postgres,
                    writer: pool.clone(),
                    reader: pool,
                    sql: Sql::new(Backend::Postgres).into(),
                }
            }
            other => return Err(StoreError::UnsupportedUrl(other.to_owned())),
        };
        Ok(store)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }

    /// Records a new job, or finds the one this owner already made with this
    /// key. The unique constraint decides; the fingerprint comparison only
    /// tells a replay from a conflict.
    pub async fn create_or_replay(&self, new: &NewJob) -> Result<Created, StoreError> {
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
        let id = JobId(uuid::Uuid::now_v7().to_string());
        let inserted = sqlx::query(&self.sql.insert_job)
            .bind(&id.0)
            .bind(&new.owner.0)
            .bind(new.key.as_str())
            .bind(&new.route)
            .bind(&new.contract)
            .bind(&new.contract_digest)
            .bind(new.input.to_string())
            .bind(fingerprint.as_str())
            .bind(i64::from(new.hedgeable))
            .fetch_optional(&self.writer)
            .await?;
        if let Some(row) = inserted {
            return Ok(Created::New(job_from_row(&row)?));
        }
        let existing = sqlx::query(&self.sql.select_job_by_key)
            .bind(&new.owner.0)
            .bind(new.key.as_str())
            .fetch_one(&self.writer)
            .await?;
        let job = job_from_row(&existing)?;
        Ok(match job.fingerprint == fingerprint {
            true => Created::Replayed(job),
            false => Created::Conflict,
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
        let lease = lease_ms(start.lease)?;
        let mut tx = self.begin_write().await?;
        // Locks the job and marks it running; a refusal below rolls it back.
        let locked = self
            .lock_job(&mut tx, &self.sql.claim_job, owner, job_id)
            .await?;
        job_after(locked.state, JobEvent::AttemptStarted)?;
        if start.slot == Slot::Hedge {
            if !locked.hedgeable {
                return Err(StoreError::HedgeRefused {
                    job_id: job_id.clone(),
                    reason: "the job's contract has side effects",
                });
            }
            let primary = sqlx::query(&self.sql.select_open_attempt)
                .bind(&job_id.0)
                .bind(Slot::Primary.as_i64())
                .fetch_optional(&mut *tx)
                .await?;
            if primary.is_none() {
                return Err(StoreError::HedgeRefused {
                    job_id: job_id.clone(),
                    reason: "no attempt is open to hedge",
                });
            }
        }
        let inserted = sqlx::query(&self.sql.insert_attempt)
            .bind(&job_id.0)
            .bind(start.slot.as_i64())
            .bind(i64::from(locked.hedgeable))
            .bind(&start.provider)
            .bind(locked.version)
            .bind(lease)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = inserted else {
            let open = sqlx::query(&self.sql.select_open_attempt)
                .bind(&job_id.0)
                .bind(start.slot.as_i64())
                .fetch_one(&mut *tx)
                .await?;
            let open = attempt_from_row(&open)?;
            return Err(StoreError::AttemptOpen {
                job_id: job_id.clone(),
                ordinal: open.ordinal,
                state: open.state,
            });
        };
        let attempt = attempt_from_row(&row)?;
        tx.commit().await?;
        tracing::info!(job_id = %job_id, attempt = attempt.ordinal, provider = %attempt.provider, "attempt started");
        Ok(AttemptHandle {
            job_id: attempt.job_id,
            ordinal: attempt.ordinal,
            slot: attempt.slot,
            provider: attempt.provider,
            base_version: attempt.base_version,
        })
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
        let renewed = sqlx::query(&self.sql.heartbeat)
            .bind(&handle.job_id.0)
            .bind(handle.ordinal)
            .bind(lease)
            .execute(&self.writer)
            .await?
            .rows_affected();
        if renewed == 1 {
            return Ok(());
        }
        let attempt = self
            .attempt_on(&self.reader, &handle.job_id, handle.ordinal)
            .await?;
        match attempt.state {
            AttemptState::Started => Err(StoreError::LeaseExpired {
                job_id: handle.job_id.clone(),
                ordinal: handle.ordinal,
            }),
            state => Err(refusal(state, AttemptEvent::Heartbeat)),
        }
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
        match outcome {
            Outcome::Succeeded(result) => self.complete(handle, &result).await,
            Outcome::Failed { error, give_up } => self.fail(handle, &error, give_up).await,
        }
    }

    async fn complete(&self, handle: &AttemptHandle, result: &Value) -> Result<Finish, StoreError> {
        let mut tx = self.begin_write().await?;
        // The compare-and-swap: one statement; the row it returns is the
        // proof it touched one.
        let won = sqlx::query(&self.sql.complete_job)
            .bind(&handle.job_id.0)
            .bind(handle.base_version)
            .bind(result.to_string())
            .bind(handle.ordinal)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(row) = won {
            let job = job_from_row(&row)?;
            self.close_attempt(&mut tx, handle, AttemptState::Succeeded, None)
                .await?;
            tx.commit().await?;
            tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, "attempt won; job succeeded");
            return Ok(Finish::Won(Box::new(job)));
        }
        // Lost. The update matched no row, so it locked nothing: lock the job
        // now, before the attempt, then close the attempt if it is still
        // open and record the race.
        let winner = self.lock_job_unscoped(&mut tx, &handle.job_id).await?;
        let attempt = self
            .attempt_on(&mut *tx, &handle.job_id, handle.ordinal)
            .await?;
        let reason = match attempt.state {
            AttemptState::Cancelled => "the attempt had been cancelled out of band",
            state if state.is_open() => "another attempt completed the job first",
            state => return Err(refusal(state, AttemptEvent::Won)),
        };
        if attempt.state.is_open() {
            self.close_attempt(&mut tx, handle, AttemptState::Lost, Some(reason))
                .await?;
        }
        sqlx::query(&self.sql.record_race)
            .bind(&handle.job_id.0)
            .bind(uuid::Uuid::now_v7().to_string())
            .bind(handle.ordinal)
            .bind(reason)
            .execute(&mut *tx)
            .await?;
        self.settle(&mut tx, &handle.job_id, JobState::Queued)
            .await?;
        tx.commit().await?;
        tracing::warn!(
            job_id = %handle.job_id,
            attempt = handle.ordinal,
            winner = ?winner,
            reason,
            "attempt lost the race; its result was discarded"
        );
        Ok(Finish::Lost { winner })
    }

    async fn fail(
        &self,
        handle: &AttemptHandle,
        error: &str,
        give_up: bool,
    ) -> Result<Finish, StoreError> {
        let mut tx = self.begin_write().await?;
        self.lock_job_unscoped(&mut tx, &handle.job_id).await?;
        let closed = self
            .close_attempt(&mut tx, handle, AttemptState::Failed, Some(error))
            .await?;
        if !closed {
            let attempt = self
                .attempt_on(&mut *tx, &handle.job_id, handle.ordinal)
                .await?;
            return Err(refusal(attempt.state, AttemptEvent::Failed));
        }
        let idle = if give_up {
            JobState::Failed
        } else {
            JobState::Queued
        };
        self.settle(&mut tx, &handle.job_id, idle).await?;
        tx.commit().await?;
        tracing::info!(job_id = %handle.job_id, attempt = handle.ordinal, error, "attempt failed");
        Ok(Finish::Failed)
    }

    /// The attempt timed out after its request left: it becomes `unknown`,
    /// and so does its job unless another attempt is running.
    pub async fn mark_unknown(
        &self,
        handle: &AttemptHandle,
        reason: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        self.lock_job_unscoped(&mut tx, &handle.job_id).await?;
        let marked = sqlx::query(&self.sql.mark_unknown)
            .bind(&handle.job_id.0)
            .bind(handle.ordinal)
            .bind(reason)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if marked == 0 {
            let attempt = self
                .attempt_on(&mut *tx, &handle.job_id, handle.ordinal)
                .await?;
            return Err(refusal(attempt.state, AttemptEvent::TimedOut));
        }
        self.settle(&mut tx, &handle.job_id, JobState::Queued)
            .await?;
        tx.commit().await?;
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
        let mut tx = self.begin_write().await?;
        self.lock_job(&mut tx, &self.sql.lock_job, owner, job_id)
            .await?;
        let handle = AttemptHandle {
            job_id: job_id.clone(),
            ordinal,
            slot: Slot::Primary,
            provider: String::new(),
            base_version: 0,
        };
        let cancelled = self
            .close_attempt(&mut tx, &handle, AttemptState::Cancelled, Some(reason))
            .await?;
        if !cancelled {
            let attempt = self.attempt_on(&mut *tx, job_id, ordinal).await?;
            return Err(refusal(attempt.state, AttemptEvent::Cancelled));
        }
        self.settle(&mut tx, job_id, JobState::Queued).await?;
        tx.commit().await?;
        tracing::warn!(job_id = %job_id, attempt = ordinal, reason, "attempt cancelled out of band");
        Ok(())
    }

    /// Turns every `started` attempt whose lease has expired (on the
    /// database's clock) into `unknown`, and returns the attempts it moved.
    /// Safe to run from several routers at once: each attempt moves once.
    pub async fn reap_expired(&self) -> Result<Vec<AttemptRef>, StoreError> {
        let expired = sqlx::query(&self.sql.select_expired)
            .bind(REAP_BATCH)
            .fetch_all(&self.reader)
            .await?;
        let mut reaped = Vec::new();
        for row in expired {
            let job_id = JobId(row.try_get("job_id")?);
            let ordinal: i64 = row.try_get("ordinal")?;
            let owner = OwnerId(row.try_get("owner_id")?);
            let mut tx = self.begin_write().await?;
            self.lock_job_unscoped(&mut tx, &job_id).await?;
            let moved = sqlx::query(&self.sql.reap_attempt)
                .bind(&job_id.0)
                .bind(ordinal)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if moved == 1 {
                self.settle(&mut tx, &job_id, JobState::Queued).await?;
            }
            tx.commit().await?;
            if moved == 1 {
                tracing::warn!(job_id = %job_id, attempt = ordinal, "lease expired; attempt unknown");
                reaped.push(AttemptRef {
                    owner,
                    job_id,
                    ordinal,
                });
            }
        }
        Ok(reaped)
    }

    /// How many attempts, of every owner, are `unknown` now: each waits for
    /// a late result, a reconciliation or an admin.
    pub async fn unknown_attempts(&self) -> Result<i64, StoreError> {
        let row = sqlx::query(&self.sql.count_unknown)
            .fetch_one(&self.reader)
            .await?;
        Ok(row.try_get("n")?)
    }

    /// The owner's job; another owner's job is not found.
    pub async fn job(&self, owner: &OwnerId, job_id: &JobId) -> Result<Job, StoreError> {
        let row = sqlx::query(&self.sql.select_job)
            .bind(&job_id.0)
            .bind(&owner.0)
            .fetch_optional(&self.reader)
            .await?
            .ok_or_else(|| StoreError::JobNotFound(job_id.clone()))?;
        job_from_row(&row)
    }

    /// The owner's job's attempts, in order.
    pub async fn attempts(
        &self,
        owner: &OwnerId,
        job_id: &JobId,
    ) -> Result<Vec<Attempt>, StoreError> {
        self.job(owner, job_id).await?;
        let rows = sqlx::query(&self.sql.select_attempts)
            .bind(&job_id.0)
            .fetch_all(&self.reader)
            .await?;
        rows.iter().map(attempt_from_row).collect()
    }

    /// The races the owner's job has seen, oldest first.
    pub async fn races(&self, owner: &OwnerId, job_id: &JobId) -> Result<Vec<Race>, StoreError> {
        self.job(owner, job_id).await?;
        let rows = sqlx::query(&self.sql.select_races)
            .bind(&job_id.0)
            .bind(&owner.0)
            .fetch_all(&self.reader)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(Race {
                    loser_ordinal: row.try_get("loser_ordinal")?,
                    winner_ordinal: row.try_get("winner_ordinal")?,
                    reason: row.try_get("reason")?,
                    at_ms: row.try_get("at_ms")?,
                })
            })
            .collect()
    }

    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        Ok(match self.backend {
            Backend::Sqlite => self.writer.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => {
                self.writer
                    .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
                    .await?
            }
        })
    }

    /// Runs `statement` (`lock_job` or `claim_job`) on the owner's job, which
    /// takes its row lock, and reads back its state.
    async fn lock_job(
        &self,
        tx: &mut AnyTx,
        statement: &str,
        owner: &OwnerId,
        job_id: &JobId,
    ) -> Result<LockedJob, StoreError> {
        let row = sqlx::query(statement)
            .bind(&job_id.0)
            .bind(&owner.0)
            .fetch_optional(&mut **tx)
            .await?
            .ok_or_else(|| StoreError::JobNotFound(job_id.clone()))?;
        Ok(LockedJob {
            state: parse_job_state(&row.try_get::<String, _>("state")?)?,
            hedgeable: row.try_get::<i64, _>("hedgeable")? == 1,
            version: row.try_get("version")?,
        })
    }

    /// Locks the job of an attempt the caller already holds, and returns who
    /// completed it, if anyone.
    async fn lock_job_unscoped(
        &self,
        tx: &mut AnyTx,
        job_id: &JobId,
    ) -> Result<Option<i64>, StoreError> {
        let row = sqlx::query(&self.sql.lock_job_unscoped)
            .bind(&job_id.0)
            .fetch_optional(&mut **tx)
            .await?
            .ok_or_else(|| StoreError::JobNotFound(job_id.clone()))?;
        Ok(row.try_get("completed_by")?)
    }

    /// Moves an open attempt to a closed state; false when it was not open.
    async fn close_attempt(
        &self,
        tx: &mut AnyTx,
        handle: &AttemptHandle,
        to: AttemptState,
        error: Option<&str>,
    ) -> Result<bool, StoreError> {
        let closed = sqlx::query(&self.sql.close_attempt)
            .bind(&handle.job_id.0)
            .bind(handle.ordinal)
            .bind(to.as_str())
            .bind(error)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        Ok(closed == 1)
    }

    async fn settle(
        &self,
        tx: &mut AnyTx,
        job_id: &JobId,
        idle: JobState,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.sql.settle_job_state)
            .bind(&job_id.0)
            .bind(idle.as_str())
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// One attempt, read through a transaction or a pool.
    async fn attempt_on<'e, E>(
        &self,
        executor: E,
        job_id: &JobId,
        ordinal: i64,
    ) -> Result<Attempt, StoreError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Any>,
    {
        let row = sqlx::query(&self.sql.select_attempt)
            .bind(&job_id.0)
            .bind(ordinal)
            .fetch_optional(executor)
            .await?
            .ok_or_else(|| StoreError::AttemptNotFound {
                job_id: job_id.clone(),
                ordinal,
            })?;
        attempt_from_row(&row)
    }
}

type AnyTx = sqlx::Transaction<'static, sqlx::Any>;

struct LockedJob {
    state: JobState,
    hedgeable: bool,
    version: i64,
}

/// The typed refusal for an event an attempt in `state` does not accept.
fn refusal(state: AttemptState, event: AttemptEvent) -> StoreError {
    match attempt_after(state, event) {
        Err(e) => StoreError::Transition(e),
        Ok(_) => StoreError::Corrupt(format!(
            "attempt is {state} yet the guarded update touched no row"
        )),
    }
}

/// SQLite creates the file only when asked to.
fn sqlite_url(url: &str) -> String {
    if url.contains("mode=") {
        return url.to_owned();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}mode=rwc")
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

fn parse_job_state(s: &str) -> Result<JobState, StoreError> {
    JobState::parse(s).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn parse_json(column: &str, text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{column}: {e}")))
}

fn job_from_row(row: &AnyRow) -> Result<Job, StoreError> {
    let result: Option<String> = row.try_get("result")?;
    Ok(Job {
        id: JobId(row.try_get("id")?),
        owner: OwnerId(row.try_get("owner_id")?),
        key: row.try_get("idempotency_key")?,
        route: row.try_get("route")?,
        contract: row.try_get("contract")?,
        contract_digest: row.try_get("contract_digest")?,
        input: parse_json("input", &row.try_get::<String, _>("input")?)?,
        fingerprint: Fingerprint::from_stored(row.try_get("fingerprint")?),
        hedgeable: row.try_get::<i64, _>("hedgeable")? == 1,
        state: parse_job_state(&row.try_get::<String, _>("state")?)?,
        version: row.try_get("version")?,
        result: result.map(|text| parse_json("result", &text)).transpose()?,
        completed_by: row.try_get("completed_by")?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
    })
}

fn attempt_from_row(row: &AnyRow) -> Result<Attempt, StoreError> {
    let slot: i64 = row.try_get("slot")?;
    let state: String = row.try_get("state")?;
    Ok(Attempt {
        job_id: JobId(row.try_get("job_id")?),
        ordinal: row.try_get("ordinal")?,
        slot: Slot::from_i64(slot).ok_or_else(|| StoreError::Corrupt(format!("slot {slot}")))?,
        provider: row.try_get("provider")?,
        state: AttemptState::parse(&state).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        base_version: row.try_get("base_version")?,
        started_at_ms: row.try_get("started_at_ms")?,
        lease_expires_at_ms: row.try_get("lease_expires_at_ms")?,
        unknown_since_ms: row.try_get("unknown_since_ms")?,
        finished_at_ms: row.try_get("finished_at_ms")?,
        error: row.try_get("error")?,
    })
}
