//! Every statement the store issues, written once for both engines.
//!
//! The engines differ only in how they read their clock, so each statement
//! names the clock as `{now}` and [`Sql::new`] substitutes the engine's
//! expression once, at open. Values are always bound parameters.
//!
//! The compare-and-swap that makes a result the job's runs after the job's
//! row is locked, so each of its guards (version, `completed_by`, the
//! attempt still open) is read after anything that committed meanwhile. On
//! PostgreSQL a statement that waited for a row lock reads other rows as of
//! when it began, so its one-statement form locks the job in a CTE, closes
//! the attempt with an UPDATE that rechecks the attempt's own row, and
//! completes the job only if that closed it. Its returned row is the proof.

use std::borrow::Cow;

use crate::Backend;

/// The statements, ready for one engine.
#[derive(Debug)]
pub struct Sql {
    pub insert_job: Returning,
    /// New jobs, each with its first attempt, in one statement, where the
    /// engine can (PostgreSQL): a row per job inserted, its columns then its
    /// attempt's. Each of the parameters is an array, an item per job.
    pub insert_jobs_and_attempts: Option<String>,
    /// `insert_jobs_and_attempts` with the first attempts' reservations,
    /// in the same statement (`$17`..`$21`: each hold's job (its place in
    /// the arrays, from 1), budget, amount, unit and bucket; `$22`..`$24`:
    /// the budgets named, their limits and the buckets their spend counts
    /// from): by `surety_hold` (migration 0014), which locks the budgets
    /// and, where one has no room for them all, raises SQLSTATE SU429, so
    /// that nothing of the statement stands.
    pub insert_jobs_attempts_and_holds: Option<String>,
    /// `insert_jobs_and_attempts` for one job, its parameters single values.
    pub insert_job_and_attempt: Option<String>,
    /// `insert_jobs_attempts_and_holds` for one job (see `HELD_ONE`):
    /// cheaper than a batch of one, as `insert_job_and_attempt` is.
    pub insert_job_attempt_and_holds: Option<String>,
    pub select_job_by_key: String,
    pub select_job: String,
    pub lock_job: String,
    pub lock_job_unscoped: String,
    pub insert_attempt: Returning,
    /// The first attempt of a job this transaction inserted (ordinal 1).
    pub insert_first_attempt: Returning,
    pub select_open_attempt: String,
    pub select_attempt: String,
    /// A job's attempts, in order.
    pub select_attempts: String,
    /// The owner's job's columns, then an attempt's (NULL without one), a
    /// row per attempt in order.
    pub select_job_with_attempts: String,
    pub claim_job: String,
    pub heartbeat: String,
    pub complete_job: Returning,
    /// Whether the compare-and-swap must follow the job's lock (PostgreSQL;
    /// see the module's doc). SQLite's one writer reads every guard as the
    /// last commit left it, so it reads the winner only after a loss.
    pub lock_before_swap: bool,
    /// The statements of several budgets or holds (see [`Many`]).
    spelled: Spelled,
    /// The compare-and-swap and the winner's close in one statement, for a
    /// batch of attempts of distinct jobs (arrays: job ids, base versions,
    /// results, ordinals, completions, response ids), where the engine can (PostgreSQL):
    /// rows for each attempt that won, none for one that did not.
    pub complete_and_close: Option<String>,
    /// `complete_and_close` for one attempt, its parameters single values.
    pub complete_and_close_one: Option<String>,
    /// `complete_and_close`, and the settlement of the reservations of the
    /// attempts it closes (two more arrays: what each answer cost in micros
    /// and in tokens, both negative for its worst case), in one statement.
    pub complete_and_settle: Option<String>,
    /// `complete_and_settle` for one attempt ($7, $8: its cost).
    pub complete_and_settle_one: Option<String>,
    pub close_attempt: String,
    pub mark_unknown: String,
    pub record_race: String,
    pub select_races: String,
    pub settle_job_state: String,
    /// Cancels owner `$2`'s job `$1` when it is idle: queued or failed, with
    /// no attempt open (none started, none unknown).
    pub cancel_job: String,
    /// Marks owner `$2`'s Responses job `$1` deleted, once.
    pub delete_response: String,
    pub select_expired: String,
    pub reap_attempt: String,
    pub count_unknown: String,
    /// Notes the provider's id `$3` for attempt `$1`/`$2`'s answer, once.
    pub note_response_id: String,
    /// Provider `$1`'s unknown attempts (their columns, then the job's
    /// owner) unknown for at least `$2` ms, asked last at least `$3` ms ago
    /// (or never), and unknown for less than `$4` ms (past it, left for an
    /// operator); least recently asked first, at most `$5`.
    pub select_due_unknowns: String,
    /// A question about attempt `$1`/`$2` asked of provider `$3` by `$4`
    /// (`id` or `metadata`), its outcome `$5` and detail `$6`; numbered
    /// after the attempt's earlier ones.
    pub insert_question: String,
    /// When attempt `$1`/`$2` was last asked about: now.
    pub mark_asked: String,
    /// Job `$1`'s questions, by attempt, in order.
    pub select_questions: String,
    /// Budget `$1`: what it holds, what its buckets from `$2` on spent,
    /// what unknown attempts hold of it, and its oldest such bucket.
    pub select_budget: String,
    /// Closes attempt `$1`/`$2`'s reservations still held, each spent at
    /// `$3` micros or `$4` tokens by its unit (its whole amount when `$4`
    /// is negative): each one closed as (budget, spent, bucket), none for one closed already.
    pub close_reservations: Closing,
    /// As `close_reservations`, for check `$1`'s holds (`$2` micros, `$3`
    /// tokens).
    pub close_check_holds: Closing,
    /// Job `$1`'s reservations, by attempt and budget.
    pub select_reservations: String,
    /// Attempts' reservations (arrays: job ids, ordinals, budgets,
    /// amounts, units, buckets) in one call, where the engine can
    /// (PostgreSQL): `surety_hold` (migration 0014) opens and locks the
    /// budgets named (arrays: budgets, limits, the buckets spend counts
    /// from), then inserts every hold, guarded as [`Many::Reservations`]
    /// is by each budget's sum, or none; its one column `n` says how many.
    pub insert_reservations: Option<String>,
    /// The checks holding a reservation taken more than `$1` ms ago (their
    /// router gone with them), at most `$2`.
    pub select_stale_checks: String,
    /// Retention: deletes the oldest settled jobs past `$1` ms (at most
    /// `$2`) with their attempts and races. Run in order in one
    /// transaction; the last statement's count is the jobs deleted.
    pub prune_settled: Vec<String>,
    pub ping: String,
    /// Jobs in state `$1` of owner `$2` (every owner when `$2` is empty),
    /// oldest change first, at most `$3`; and the same newest first.
    pub jobs_in_state_oldest: String,
    /// The owner of job `$1`, for an operator of every owner.
    pub select_job_owner: String,
    /// Jobs per state, of owner `$1` (every owner when empty).
    pub count_jobs_by_state: String,
    pub jobs_in_state_newest: String,
    /// A live result (`$1` its id, then its columns in order).
    pub insert_live_result: String,
    /// The newest `$3` live results of provider `$1` on contract `$2`.
    pub select_live_window: String,
    /// As `select_live_window`, only the source, outcome and detail.
    pub select_live_verdicts: String,
    /// Route `$1`'s live results since `$2` ms with outcome `$3` (any
    /// other than `kept` and `failed` when empty), oldest first.
    pub select_live_results: String,
    /// Opens a demotion unless one is open (`demotions_one_open`).
    pub insert_demotion: String,
    pub select_demotions: String,
    /// Closes the open demotion of `$1` × `$2` by `$3` for `$4`, if it
    /// began before `$5` ms.
    pub lift_demotion: String,
    /// The pages the database file holds in use (SQLite).
    pub pages_in_use: Option<String>,
    /// Lets a transaction commit without waiting for its WAL flush
    /// (PostgreSQL): for observations a crash may lose (a live result),
    /// never for a job, an attempt or a demotion.
    pub relaxed_commit: Option<String>,
}

/// The settled jobs past retention (`$1` ms old), oldest first, at most `$2`:
/// never one with an attempt that may still answer.
const PRUNABLE: &str = "SELECT id FROM jobs \
     WHERE {settled} AND updated_at_ms < {now} - $1 \
       AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.state IN {open}) \
     ORDER BY updated_at_ms, id LIMIT $2";

const JOB_COLUMNS: &str = "id, owner_id, idempotency_key, route, contract, contract_digest, input, \
     fingerprint, hedgeable, state, version, result, completed_by, created_at_ms, updated_at_ms, completion, \
     kind, messages, request, deleted_at_ms";

const ATTEMPT_COLUMNS: &str = "job_id, ordinal, slot, provider, state, base_version, started_at_ms, \
     lease_expires_at_ms, unknown_since_ms, finished_at_ms, error, provider_response_id, asked_at_ms";

/// A guarded write that closes holds and answers with what it closed
/// (`RETURNING` on PostgreSQL; on SQLite, whose one writer is alone on the
/// database, `read_first` reads them, as the write will leave them, in the
/// same transaction just before it).
#[derive(Debug)]
pub struct Closing {
    pub write: String,
    pub read_first: Option<String>,
}

/// A write that answers with the row it wrote. PostgreSQL returns it from
/// the statement (`RETURNING`). SQLite runs a `RETURNING` clause as a
/// trigger program that collects its rows in a temporary b-tree, opened and
/// freed on every run; its writer, alone on the database, runs the write
/// bare and then reads back the row it touched, in the same transaction,
/// which sees exactly what the write left.
#[derive(Debug)]
pub struct Returning {
    /// The write; it returns the row itself when `read` is `None`.
    pub write: String,
    /// The row the write touched, read by the write's first parameter
    /// alone (`$1`) when the write changed a row.
    pub read: Option<String>,
}

impl Returning {
    /// The read's parameters, out of the write's: its first, alone.
    pub fn read_params<P>(params: &[P]) -> &[P] {
        params.get(..1).unwrap_or_default()
    }
}

/// A batch's compare-and-swap in one statement, spelled in `Sql::new`.
/// `{arrays}` and `{names}` are the settling statement's two more inputs,
/// `{settle}` its CTEs.
const SWAP_MANY: &str = "WITH input AS ( \
         SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $5::text[], \
             $6::text[]{arrays}) \
             AS i(job_id, base_version, result, ordinal, completion, response_id{names})), \
     seen AS ( \
         SELECT j.* FROM input i CROSS JOIN LATERAL ( \
             SELECT id, xmin AS row_version FROM jobs WHERE id = i.job_id OFFSET 0) j), \
     locked AS ( \
         SELECT j.* FROM (SELECT job_id FROM input ORDER BY job_id) i \
         CROSS JOIN LATERAL ( \
             SELECT id, xmin AS row_version, version, completed_by FROM jobs \
             WHERE id = i.job_id FOR UPDATE) j), \
     closed AS ( \
         UPDATE attempts a SET state = 'succeeded', error = NULL, finished_at_ms = {now}, \
             provider_response_id = COALESCE(a.provider_response_id, i.response_id) \
         FROM input i JOIN locked l ON l.id = i.job_id \
         WHERE a.job_id = i.job_id AND a.ordinal = i.ordinal AND a.state IN {open} \
           AND l.version = i.base_version AND l.completed_by IS NULL \
         RETURNING {a.attempt_columns}), \
     done AS ( \
         UPDATE jobs j SET state = 'succeeded', result = i.result, \
             completed_by = i.ordinal, completion = i.completion, \
             version = j.version + 1, updated_at_ms = {now} \
         FROM input i JOIN closed c ON c.job_id = i.job_id \
         WHERE j.id = i.job_id \
         RETURNING {j.job_columns}), \
     {settle}attempt AS ( \
         SELECT * FROM closed \
         UNION ALL \
         SELECT other.* FROM input i CROSS JOIN LATERAL ( \
             SELECT {a.attempt_columns} FROM attempts a \
             WHERE a.job_id = i.job_id AND a.ordinal <> i.ordinal OFFSET 0) other) \
     SELECT done.*, attempt.* FROM done LEFT JOIN attempt \
         ON attempt.job_id = done.id \
         AND EXISTS (SELECT 1 FROM seen JOIN locked USING (id, row_version) \
             WHERE seen.id = done.id) \
     ORDER BY done.id, attempt.ordinal";

/// One attempt's compare-and-swap in one statement, spelled in `Sql::new`.
const SWAP_ONE: &str = "WITH seen AS (SELECT xmin AS row_version FROM jobs WHERE id = $1), \
     locked AS ( \
         SELECT xmin AS row_version, version, completed_by FROM jobs \
         WHERE id = $1 FOR UPDATE), \
     closed AS ( \
         UPDATE attempts SET state = 'succeeded', error = NULL, finished_at_ms = {now}, \
             provider_response_id = COALESCE(provider_response_id, $6) \
         WHERE job_id = $1 AND ordinal = $4 AND state IN {open} \
         AND EXISTS (SELECT 1 FROM locked WHERE version = $2 AND completed_by IS NULL) \
         RETURNING {attempt_columns}), \
     done AS ( \
         UPDATE jobs SET state = 'succeeded', result = $3, completed_by = $4, \
             completion = $5, version = version + 1, updated_at_ms = {now} \
         WHERE id = $1 AND EXISTS (SELECT 1 FROM closed) \
         RETURNING {job_columns}), \
     {settle}attempt AS ( \
         SELECT * FROM closed \
         UNION ALL \
         SELECT {attempt_columns} FROM attempts WHERE job_id = $1 AND ordinal <> $4) \
     SELECT done.*, attempt.* FROM done LEFT JOIN attempt \
         ON EXISTS (SELECT 1 FROM seen JOIN locked USING (row_version)) \
     ORDER BY attempt.ordinal";

/// Records what `settled` closed (rows of budget, bucket, spent) in each
/// budget's bucket, in the buckets' order.
const RECORDED: &str = "recorded AS ( \
         INSERT INTO budget_spend (account, bucket_ms, spent) \
         SELECT account, bucket_ms, CAST(SUM(spent) AS BIGINT) FROM settled \
         GROUP BY account, bucket_ms HAVING SUM(spent) > 0 ORDER BY account, bucket_ms \
         ON CONFLICT (account, bucket_ms) DO UPDATE SET spent = budget_spend.spent + excluded.spent), ";

/// A live result's columns, in the order `trust::live_from` reads them.
const LIVE_COLUMNS: &str = "provider, contract, route, source, outcome, detail, job_id, case_name, \
     input, expected, answer, at_ms";

/// The states in which an attempt may still produce a result.
const OPEN: &str = "('started', 'unknown')";

/// The demotion guard of an attempt's insert: an open demotion of provider
/// `$p` on contract `$c` at or after the certification made at `$t` (ms).
/// A NULL contract (an attempt that rests on no certification) matches none.
fn demoted(p: u8, c: u8, t: u8) -> String {
    format!(
        "SELECT 1 FROM demotions d WHERE d.provider = ${p} AND d.contract = ${c} \
         AND d.lifted_at_ms IS NULL AND d.demoted_at_ms >= ${t}"
    )
}

impl Sql {
    pub fn new(backend: Backend) -> Sql {
        let now = clock(backend);
        // A settled job: the WHERE of the `jobs_settled_at` index, as each
        // engine's schema spells it (SQLite's without a list of values: see
        // `migrations/sqlite/`), so that the planner matches the two.
        let settled = match backend {
            Backend::Sqlite => "(state = 'succeeded' OR state = 'failed' OR state = 'cancelled')",
            Backend::Postgres => "state IN ('succeeded', 'failed', 'cancelled')",
        };
        let fill = |template: &str| {
            let filled = template
                .replace("{now}", now)
                .replace("{settled}", settled)
                .replace("{job_columns}", JOB_COLUMNS)
                .replace("{attempt_columns}", ATTEMPT_COLUMNS)
                .replace("{live_columns}", LIVE_COLUMNS)
                .replace("{j.job_columns}", &qualified("j", JOB_COLUMNS))
                .replace("{a.attempt_columns}", &qualified("a", ATTEMPT_COLUMNS))
                .replace("{open}", OPEN)
                .replace("{demoted_4_7_8}", &demoted(4, 7, 8))
                .replace("{demoted_13_15_16}", &demoted(13, 15, 16));
            match backend {
                Backend::Postgres => filled,
                Backend::Sqlite => numbered_params(&filled),
            }
        };
        // `write` returning `columns`; on SQLite, read back `FROM …` (`read`).
        let returning = |write: &str, columns: &str, read: &str| match backend {
            Backend::Postgres => Returning {
                write: fill(&format!("{write} RETURNING {columns}")),
                read: None,
            },
            Backend::Sqlite => Returning {
                write: fill(write),
                read: Some(fill(&format!("SELECT {columns} {read}"))),
            },
        };
        // Closes the holds `which` names of `table`, spent at `spent`:
        // PostgreSQL answers with what it closed; SQLite's one writer reads
        // them first, as the write will leave them.
        let closing = |table: &str, which: &str, spent: &str| {
            let close = format!(
                "UPDATE {table} SET spent = {spent}, settled_at_ms = {{now}} \
                 WHERE {which} AND spent IS NULL"
            );
            let columns = "account, spent, bucket_ms";
            match backend {
                Backend::Postgres => Closing {
                    write: fill(&format!("{close} RETURNING {columns}")),
                    read_first: None,
                },
                Backend::Sqlite => Closing {
                    write: fill(&close),
                    read_first: Some(fill(&format!(
                        "SELECT account, {spent} AS spent, bucket_ms FROM {table} \
                         WHERE {which} AND spent IS NULL"
                    ))),
                },
            }
        };
        // An attempt's insert: its ordinal, and what precedes the demotion
        // guard (the rows the ordinal is read from, if any).
        let attempt = |ordinal: &str, guard: &str| {
            returning(
                &format!(
                    "INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, \
                         base_version, started_at_ms, lease_expires_at_ms) \
                     SELECT $1, {ordinal}, $2, $3, $4, 'started', $5, {{now}}, {{now}} + $6 \
                     {guard} NOT EXISTS ({{demoted_4_7_8}}) \
                     ON CONFLICT (job_id, slot) WHERE state IN {{open}} DO NOTHING"
                ),
                "{attempt_columns}",
                "FROM attempts WHERE rowid = last_insert_rowid() AND job_id = $1",
            )
        };
        // The compare-and-swap of a batch of attempts of distinct jobs, and
        // (`settles`) the settlement of what the attempts it closes reserved
        // (two more arrays: what each answer cost in micros and in tokens,
        // both negative for its worst case): their reservations still open
        // closed to that cost, and the spend recorded in each one's bucket,
        // in the buckets' order, so two statements never wait on each other
        // in a cycle. The answer is one statement, committed alone.
        let swap_many = |settles: bool| {
            let (arrays, names, settle) = match settles {
                true => (
                    ", $7::int8[], $8::int8[]",
                    ", micros, tokens",
                    "settled AS ( \
                         UPDATE reservations r SET settled_at_ms = {now}, spent = CASE \
                             WHEN i.tokens < 0 THEN r.amount \
                             WHEN r.unit = 'tokens' THEN i.tokens ELSE i.micros END \
                         FROM input i JOIN closed c ON c.job_id = i.job_id AND c.ordinal = i.ordinal \
                         WHERE r.job_id = i.job_id AND r.ordinal = i.ordinal AND r.spent IS NULL \
                         RETURNING r.account, r.bucket_ms, r.spent), \
                     {recorded}",
                ),
                false => ("", "", ""),
            };
            fill(
                &SWAP_MANY
                    .replace("{arrays}", arrays)
                    .replace("{names}", names)
                    .replace("{settle}", settle)
                    .replace("{recorded}", RECORDED),
            )
        };
        // The same for one attempt, its parameters single values ($7, $8:
        // its cost, where it `settles`).
        let swap_one = |settles: bool| {
            let settle = match settles {
                true => {
                    "settled AS ( \
                         UPDATE reservations SET settled_at_ms = {now}, spent = CASE \
                             WHEN $8 < 0 THEN amount WHEN unit = 'tokens' THEN $8 ELSE $7 END \
                         WHERE job_id = $1 AND ordinal = $4 AND spent IS NULL \
                         AND EXISTS (SELECT 1 FROM closed) \
                         RETURNING account, bucket_ms, spent), \
                     {recorded}"
                }
                false => "",
            };
            fill(
                &SWAP_ONE
                    .replace("{settle}", settle)
                    .replace("{recorded}", RECORDED),
            )
        };
        Sql {
            insert_job: returning(
                "INSERT INTO jobs (id, owner_id, idempotency_key, route, contract, contract_digest, \
                     input, fingerprint, hedgeable, kind, messages, request, state, version, \
                     created_at_ms, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 0, {now}, {now}) \
                 ON CONFLICT (owner_id, idempotency_key) DO NOTHING",
                "{job_columns}",
                "FROM jobs WHERE rowid = last_insert_rowid() AND id = $1",
            ),
            // Data-modifying CTEs: PostgreSQL only. The attempt's foreign key
            // is checked at the end of the statement, when the job exists.
            // A batch's jobs come as arrays, a column each (`unnest`), and
            // are inserted in their order: callers sort them by key, so two
            // batches that share keys take them in one order and never wait
            // on each other in a cycle. A key twice in one batch, or already
            // taken, inserts nothing (ON CONFLICT); nor does a job whose
            // provider has an open demotion newer than its certification.
            insert_jobs_and_attempts: (backend == Backend::Postgres)
                .then(|| fill(&INSERT_JOBS.replace("{held}", "").replace("{with_held}", ""))),
            insert_jobs_attempts_and_holds: (backend == Backend::Postgres).then(|| {
                fill(
                    &INSERT_JOBS
                        .replace("{held}", &format!(", held AS ({})", HELD))
                        .replace("{with_held}", " CROSS JOIN held"),
                )
            }),
            // The same for one job, where a batch holds one: cheaper per
            // statement than a batch of one (pgbench, prepared: ×1.31).
            insert_job_and_attempt: (backend == Backend::Postgres)
                .then(|| fill(&INSERT_JOB.replace("{held}", "").replace("{with_held}", ""))),
            insert_job_attempt_and_holds: (backend == Backend::Postgres).then(|| {
                fill(
                    &INSERT_JOB
                        .replace("{held}", &format!(", held AS ({})", HELD_ONE))
                        .replace("{with_held}", " CROSS JOIN held"),
                )
            }),
            select_job_by_key: fill(
                "SELECT {job_columns} FROM jobs WHERE owner_id = $1 AND idempotency_key = $2",
            ),
            select_job: fill("SELECT {job_columns} FROM jobs WHERE id = $1 AND owner_id = $2"),
            // A write that changes nothing: it takes the job's row lock on
            // PostgreSQL, so every transaction locks the job before its
            // attempts and two transactions never wait on each other in a cycle.
            // SQLite has no row locks: its one writer's transaction excludes
            // every other writer already, so a read is the same lock there
            // and costs no write.
            lock_job: fill(match backend {
                Backend::Postgres => {
                    "UPDATE jobs SET version = version WHERE id = $1 AND owner_id = $2 \
                     RETURNING state, hedgeable, version"
                }
                Backend::Sqlite => {
                    "SELECT state, hedgeable, version FROM jobs WHERE id = $1 AND owner_id = $2"
                }
            }),
            lock_job_unscoped: fill(match backend {
                Backend::Postgres => {
                    "UPDATE jobs SET version = version WHERE id = $1 RETURNING completed_by"
                }
                Backend::Sqlite => "SELECT completed_by FROM jobs WHERE id = $1",
            }),
            // The partial unique index decides; ON CONFLICT turns its refusal
            // into zero rows instead of an aborted transaction. So does an
            // open demotion of the provider newer than the certification
            // the attempt rests on ($7, $8): the database has the last word
            // on trust, whatever the router last read.
            insert_attempt: attempt(
                "COALESCE(MAX(ordinal), 0) + 1",
                "FROM attempts WHERE job_id = $1 HAVING",
            ),
            // A job inserted by the same transaction has no attempt yet: its
            // first is number 1, and the insert reads no attempts (SQLite
            // copies a SELECT that reads the table it inserts into to a
            // temporary b-tree first).
            insert_first_attempt: attempt("1", "WHERE"),
            select_open_attempt: fill(
                "SELECT {attempt_columns} FROM attempts WHERE job_id = $1 AND slot = $2 AND state IN {open}",
            ),
            select_attempt: fill(
                "SELECT {attempt_columns} FROM attempts WHERE job_id = $1 AND ordinal = $2",
            ),
            select_attempts: fill(
                "SELECT {attempt_columns} FROM attempts WHERE job_id = $1 ORDER BY ordinal",
            ),
            select_job_with_attempts: fill(
                "SELECT {j.job_columns}, {a.attempt_columns} \
                 FROM jobs j LEFT JOIN attempts a ON a.job_id = j.id \
                 WHERE j.id = $1 AND j.owner_id = $2 ORDER BY a.ordinal",
            ),
            // Locks the job and marks it running in one statement, unless it
            // is over (then it is left as it is, and the caller refuses).
            claim_job: fill(
                "UPDATE jobs SET updated_at_ms = {now}, \
                     state = CASE WHEN state IN ('succeeded', 'cancelled') THEN state ELSE 'running' END \
                 WHERE id = $1 AND owner_id = $2 \
                 RETURNING state, hedgeable, version",
            ),
            heartbeat: fill(
                "UPDATE attempts SET lease_expires_at_ms = {now} + $3 \
                 WHERE job_id = $1 AND ordinal = $2 AND state = 'started' AND lease_expires_at_ms > {now}",
            ),
            // The compare-and-swap: the first open attempt to finish wins.
            complete_job: returning(
                "UPDATE jobs SET state = 'succeeded', result = $3, completed_by = $4, \
                     completion = $5, version = version + 1, updated_at_ms = {now} \
                 WHERE id = $1 AND version = $2 AND completed_by IS NULL \
                 AND EXISTS (SELECT 1 FROM attempts a \
                             WHERE a.job_id = $1 AND a.ordinal = $4 AND a.state IN {open})",
                "{job_columns}",
                "FROM jobs WHERE id = $1",
            ),
            lock_before_swap: backend == Backend::Postgres,
            spelled: Spelled::new(backend),
            // Each job's row is locked first (`locked`, which reads its
            // latest version), then its attempt is closed only if still open
            // (an UPDATE rechecks its own row's latest version), then the job
            // takes the result only if its attempt was closed. Every guard is
            // read after the lock, so a cancel that committed while this
            // waited is seen. A batch's items come as arrays (`unnest`), at
            // most one per job (the caller's rule: two attempts of one job
            // would both pass the guards read before either closed); their
            // jobs are locked in the order of their ids, so two batches never
            // wait on each other in a cycle.
            //
            // A win comes back as the job after it (`done`) beside each of
            // its attempts: the one closed here, and the others as this
            // statement's snapshot has them (the winning commit's view, which
            // spares the waiter a read). That snapshot is exact only if no
            // transaction changed the job's row between it and the lock: every
            // write of the store that changes attempts (but a heartbeat's
            // lease) writes the job's row first, so an unchanged `xmin` (the
            // row version the snapshot saw is the one locked) proves the
            // attempts unchanged too. Otherwise the job comes alone, with NULL
            // attempt columns, and the waiter reads.
            //
            // Each job of the batch, and each job's other attempts, is
            // reached by an index lookup of its own (`CROSS JOIN LATERAL`,
            // kept from being flattened into a join by `OFFSET 0` or its
            // lock): a planner without statistics guesses that a value
            // matches one row in 200, so a condition on many ids at once
            // (`= ANY`, `IN`, a join) seemed to match so much of a small
            // table that it read the whole table instead.
            complete_and_close: (backend == Backend::Postgres).then(|| swap_many(false)),
            complete_and_settle: (backend == Backend::Postgres).then(|| swap_many(true)),
            complete_and_close_one: (backend == Backend::Postgres).then(|| swap_one(false)),
            complete_and_settle_one: (backend == Backend::Postgres).then(|| swap_one(true)),
            close_attempt: fill(
                "UPDATE attempts SET state = $3, error = $4, finished_at_ms = {now}, \
                     provider_response_id = COALESCE(provider_response_id, $5) \
                 WHERE job_id = $1 AND ordinal = $2 AND state IN {open}",
            ),
            mark_unknown: fill(
                "UPDATE attempts SET state = 'unknown', error = $3, unknown_since_ms = {now} \
                 WHERE job_id = $1 AND ordinal = $2 AND state = 'started'",
            ),
            record_race: fill(
                "INSERT INTO races (id, job_id, loser_ordinal, winner_ordinal, reason, at_ms) \
                 SELECT $2, id, $3, completed_by, $4, {now} FROM jobs WHERE id = $1",
            ),
            select_races: fill(
                "SELECT r.loser_ordinal, r.winner_ordinal, r.reason, r.at_ms FROM races r \
                 JOIN jobs j ON j.id = r.job_id WHERE r.job_id = $1 AND j.owner_id = $2 ORDER BY r.at_ms, r.id",
            ),
            // A job that is not over takes its state from its open attempts;
            // with none open it takes `$2` (queued, or failed once given up).
            settle_job_state: fill(
                "UPDATE jobs SET updated_at_ms = {now}, state = CASE \
                     WHEN EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.state = 'started') \
                         THEN 'running' \
                     WHEN EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.state = 'unknown') \
                         THEN 'unknown' \
                     ELSE $2 END \
                 WHERE id = $1 AND state NOT IN ('succeeded', 'cancelled')",
            ),
            cancel_job: fill(
                "UPDATE jobs SET updated_at_ms = {now}, state = 'cancelled' \
                 WHERE id = $1 AND owner_id = $2 AND state IN ('queued', 'failed') \
                   AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.state IN {open})",
            ),
            delete_response: fill(
                "UPDATE jobs SET deleted_at_ms = {now} \
                 WHERE id = $1 AND owner_id = $2 AND kind = 'responses' AND deleted_at_ms IS NULL",
            ),
            select_expired: fill(
                "SELECT a.job_id, a.ordinal, j.owner_id FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE a.state = 'started' AND a.lease_expires_at_ms <= {now} \
                 ORDER BY a.lease_expires_at_ms LIMIT $1",
            ),
            // Guarded by the state and the lease, so two reapers move an
            // attempt once, and a heartbeat that got in first keeps it.
            count_unknown: fill("SELECT COUNT(*) AS n FROM attempts WHERE state = 'unknown'"),
            note_response_id: fill(
                "UPDATE attempts SET provider_response_id = $3 \
                 WHERE job_id = $1 AND ordinal = $2 AND provider_response_id IS NULL",
            ),
            select_due_unknowns: fill(
                "SELECT {a.attempt_columns}, j.owner_id FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE a.state = 'unknown' AND a.provider = $1 \
                   AND a.unknown_since_ms <= {now} - $2 \
                   AND (a.asked_at_ms IS NULL OR a.asked_at_ms <= {now} - $3) \
                   AND a.unknown_since_ms > {now} - $4 \
                 ORDER BY COALESCE(a.asked_at_ms, 0), a.unknown_since_ms LIMIT $5",
            ),
            insert_question: fill(
                "INSERT INTO reconciliations \
                     (job_id, ordinal, n, provider, asked_at_ms, asked_by, outcome, detail) \
                 SELECT $1, $2, COALESCE(MAX(n), 0) + 1, $3, {now}, $4, $5, $6 \
                 FROM reconciliations WHERE job_id = $1 AND ordinal = $2",
            ),
            mark_asked: fill(
                "UPDATE attempts SET asked_at_ms = {now} WHERE job_id = $1 AND ordinal = $2",
            ),
            select_questions: fill(
                "SELECT ordinal, n, provider, asked_at_ms, asked_by, outcome, detail \
                 FROM reconciliations WHERE job_id = $1 ORDER BY ordinal, n",
            ),
            select_budget: fill(&format!(
                "SELECT CAST({} AS BIGINT) AS held, \
                     CAST(COALESCE((SELECT SUM(spent) FROM budget_spend s \
                         WHERE s.account = $1 AND s.bucket_ms >= $2), 0) AS BIGINT) AS spent, \
                     CAST(COALESCE((SELECT SUM(r.amount) FROM reservations r \
                         JOIN attempts a ON a.job_id = r.job_id AND a.ordinal = r.ordinal \
                         WHERE r.account = $1 AND r.spent IS NULL AND a.state = 'unknown'), 0) AS BIGINT) AS unknown, \
                     (SELECT MIN(bucket_ms) FROM budget_spend s \
                         WHERE s.account = $1 AND s.bucket_ms >= $2 AND s.spent > 0) AS oldest \
                 FROM budget_accounts b WHERE b.account = $1",
                held("$1")
            )),
            close_reservations: closing(
                "reservations",
                "job_id = $1 AND ordinal = $2",
                "CASE WHEN $4 < 0 THEN amount WHEN unit = 'tokens' THEN $4 ELSE $3 END",
            ),
            close_check_holds: closing(
                "check_holds",
                "id = $1",
                "CASE WHEN $3 < 0 THEN amount WHEN unit = 'tokens' THEN $3 ELSE $2 END",
            ),
            select_stale_checks: fill(
                "SELECT DISTINCT id FROM check_holds \
                 WHERE spent IS NULL AND reserved_at_ms < {now} - $1 ORDER BY id LIMIT $2",
            ),
            insert_reservations: (backend == Backend::Postgres).then(|| HOLD.to_owned()),
            select_reservations: fill(
                "SELECT ordinal, account, unit, amount, reserved_at_ms, spent, settled_at_ms \
                 FROM reservations WHERE job_id = $1 ORDER BY ordinal, account",
            ),
            reap_attempt: fill(
                "UPDATE attempts SET state = 'unknown', unknown_since_ms = {now}, \
                     error = 'lease expired: its lease was not renewed in time (the router holding it stopped, or could not reach the database); the provider may have done the work' \
                 WHERE job_id = $1 AND ordinal = $2 AND state = 'started' AND lease_expires_at_ms <= {now}",
            ),
            prune_settled: match backend {
                // One writer: the three picks inside its transaction agree.
                Backend::Sqlite => [
                    format!("DELETE FROM races WHERE job_id IN ({PRUNABLE})"),
                    format!("DELETE FROM reconciliations WHERE job_id IN ({PRUNABLE})"),
                    format!("DELETE FROM reservations WHERE job_id IN ({PRUNABLE})"),
                    format!("DELETE FROM attempts WHERE job_id IN ({PRUNABLE})"),
                    format!("DELETE FROM jobs WHERE id IN ({PRUNABLE})"),
                ]
                .iter()
                .map(|s| fill(s))
                .collect(),
                // One statement: the foreign keys are checked at its end; the
                // picked jobs are locked, and jobs another pruner holds skipped.
                Backend::Postgres => vec![fill(&format!(
                    "WITH doomed AS ({PRUNABLE} FOR UPDATE SKIP LOCKED), \
                          r AS (DELETE FROM races WHERE job_id IN (SELECT id FROM doomed)), \
                          q AS (DELETE FROM reconciliations WHERE job_id IN (SELECT id FROM doomed)), \
                          m AS (DELETE FROM reservations WHERE job_id IN (SELECT id FROM doomed)), \
                          a AS (DELETE FROM attempts WHERE job_id IN (SELECT id FROM doomed)) \
                     DELETE FROM jobs WHERE id IN (SELECT id FROM doomed)"
                ))],
            },
            ping: fill("SELECT CAST(1 AS BIGINT) AS up"),
            select_job_owner: fill("SELECT owner_id FROM jobs WHERE id = $1"),
            count_jobs_by_state: fill(
                "SELECT state, COUNT(*) AS n FROM jobs WHERE ($1 = '' OR owner_id = $1) \
                 GROUP BY state ORDER BY state",
            ),
            jobs_in_state_oldest: fill(
                "SELECT {job_columns} FROM jobs WHERE state = $1 AND ($2 = '' OR owner_id = $2) \
                 ORDER BY updated_at_ms, id LIMIT $3",
            ),
            jobs_in_state_newest: fill(
                "SELECT {job_columns} FROM jobs WHERE state = $1 AND ($2 = '' OR owner_id = $2) \
                 ORDER BY updated_at_ms DESC, id LIMIT $3",
            ),
            insert_live_result: fill(
                "INSERT INTO live_results (id, provider, contract, route, source, outcome, detail, \
                     job_id, case_name, input, expected, answer, at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, {now})",
            ),
            select_live_window: fill(
                "SELECT {live_columns} FROM live_results WHERE provider = $1 AND contract = $2 \
                 ORDER BY id DESC LIMIT $3",
            ),
            select_live_verdicts: fill(
                "SELECT source, outcome, detail FROM live_results WHERE provider = $1 AND contract = $2 \
                 ORDER BY id DESC LIMIT $3",
            ),
            select_live_results: fill(
                "SELECT {live_columns} FROM live_results WHERE route = $1 AND at_ms >= $2 \
                 AND (outcome = $3 OR ($3 = '' AND outcome IN ('broke', 'disagreed'))) ORDER BY id",
            ),
            insert_demotion: fill(
                "INSERT INTO demotions (id, provider, contract, reason, demoted_at_ms) \
                 VALUES ($1, $2, $3, $4, {now}) ON CONFLICT DO NOTHING",
            ),
            select_demotions: fill(
                "SELECT provider, contract, reason, demoted_at_ms FROM demotions \
                 WHERE lifted_at_ms IS NULL ORDER BY provider, contract",
            ),
            lift_demotion: fill(
                "UPDATE demotions SET lifted_at_ms = {now}, lifted_by = $3, lift_reason = $4 \
                 WHERE provider = $1 AND contract = $2 AND lifted_at_ms IS NULL AND demoted_at_ms < $5",
            ),
            pages_in_use: (backend == Backend::Sqlite).then(|| {
                "SELECT (SELECT page_count FROM pragma_page_count()) \
                      - (SELECT freelist_count FROM pragma_freelist_count()) AS pages"
                    .to_owned()
            }),
            relaxed_commit: (backend == Backend::Postgres)
                .then(|| "SET LOCAL synchronous_commit TO OFF".to_owned()),
        }
    }
}

/// `columns` ("a, b") as `table`'s ("t.a, t.b").
fn qualified(table: &str, columns: &str) -> String {
    columns
        .split(',')
        .map(|c| format!("{table}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// New jobs, each with its first attempt, in one statement (PostgreSQL);
/// `{held}` and `{with_held}` add their reservations to it, or nothing.
const INSERT_JOBS: &str = "WITH input AS ( \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], \
             $5::text[], $6::text[], $7::text[], $8::text[], $9::int8[], $10::text[], \
             $11::text[], $12::text[], $13::text[], $14::int8[], $15::text[], \
             $16::int8[]) \
             WITH ORDINALITY AS i(id, owner_id, idempotency_key, route, contract, \
                 contract_digest, input, fingerprint, hedgeable, kind, messages, \
                 request, provider, lease, trusted_contract, certified_at_ms, n)), \
     job AS ( \
         INSERT INTO jobs (id, owner_id, idempotency_key, route, contract, \
             contract_digest, input, fingerprint, hedgeable, kind, messages, request, \
             state, version, created_at_ms, updated_at_ms) \
         SELECT id, owner_id, idempotency_key, route, contract, contract_digest, \
             input, fingerprint, hedgeable, kind, messages, request, 'running', 0, \
             {now}, {now} \
         FROM input i \
         WHERE NOT EXISTS (SELECT 1 FROM demotions d WHERE d.provider = i.provider \
             AND d.contract = i.trusted_contract AND d.lifted_at_ms IS NULL \
             AND d.demoted_at_ms >= i.certified_at_ms) \
         ORDER BY n \
         ON CONFLICT (owner_id, idempotency_key) DO NOTHING \
         RETURNING {job_columns}), \
     attempt AS ( \
         INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, \
             base_version, started_at_ms, lease_expires_at_ms) \
         SELECT job.id, 1, 0, job.hedgeable, i.provider, 'started', job.version, \
             {now}, {now} + i.lease \
         FROM job JOIN input i ON i.id = job.id \
         RETURNING {attempt_columns}){held} \
     SELECT job.*, attempt.* FROM job JOIN attempt ON attempt.job_id = job.id{with_held}";

/// A new job with its first attempt, in one statement (PostgreSQL), its
/// parameters single values; `{held}` and `{with_held}` add its
/// reservations to it, or nothing.
const INSERT_JOB: &str = "WITH job AS ( \
         INSERT INTO jobs (id, owner_id, idempotency_key, route, contract, \
             contract_digest, input, fingerprint, hedgeable, kind, messages, request, \
             state, version, created_at_ms, updated_at_ms) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'running', 0, \
             {now}, {now} \
         WHERE NOT EXISTS ({demoted_13_15_16}) \
         ON CONFLICT (owner_id, idempotency_key) DO NOTHING \
         RETURNING {job_columns}), \
     attempt AS ( \
         INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, \
             base_version, started_at_ms, lease_expires_at_ms) \
         SELECT id, 1, 0, hedgeable, $13, 'started', version, {now}, {now} + $14 \
         FROM job \
         RETURNING {attempt_columns}){held} \
     SELECT job.*, attempt.* FROM job JOIN attempt ON attempt.job_id = job.id{with_held}";

/// The one job's holds (`$17`..`$20`: each hold's budget, amount, unit and
/// bucket; `$21`..`$23`: the budgets named, their limits and the buckets
/// their spend counts from), reserved after its attempt is inserted; no
/// call where nothing was (a replay, or a demoted provider).
const HELD_ONE: &str = "SELECT surety_hold(array_fill(a.job_id, ARRAY[cardinality($17::text[])]), \
         array_fill(a.ordinal, ARRAY[cardinality($17::text[])]), $17::text[], $18::int8[], \
         $19::text[], $20::int8[], $21::text[], $22::int8[], $23::int8[], true) AS n \
     FROM attempt a";

/// `surety_hold`'s call for holds of attempts already written, its count
/// returned (none inserted is a refusal the caller explains).
const HOLD: &str = "SELECT surety_hold($1::text[], $2::int8[], $3::text[], $4::int8[], \
     $5::text[], $6::int8[], $7::text[], $8::int8[], $9::int8[], false) AS n";

/// The batch's holds, reserved after its attempts are inserted (they are
/// read from `attempt`, so every one of them is in before the call).
const HELD: &str = "SELECT surety_hold(array_agg(a.job_id ORDER BY c.k), \
         array_agg(a.ordinal ORDER BY c.k), array_agg(c.account ORDER BY c.k), \
         array_agg(c.amount ORDER BY c.k), array_agg(c.unit ORDER BY c.k), \
         array_agg(c.bucket_ms ORDER BY c.k), $22::text[], $23::int8[], $24::int8[], true) AS n \
     FROM attempt a JOIN input i ON i.id = a.job_id \
     JOIN unnest($17::int8[], $18::text[], $19::int8[], $20::text[], $21::int8[]) \
         WITH ORDINALITY AS c(n, account, amount, unit, bucket_ms, k) ON c.n = i.n";

/// PostgreSQL's `$N` as SQLite's `?N`: SQLite reads `$N` as a named
/// parameter and numbers those by first appearance, not by `N`.
/// What budget `account` (an SQL expression) holds: the amounts of its
/// open reservations and checks' holds (each table's partial index on the
/// held ones).
fn held(account: &str) -> String {
    format!(
        "(COALESCE((SELECT SUM(r.amount) FROM reservations r \
             WHERE r.account = {account} AND r.spent IS NULL), 0) \
         + COALESCE((SELECT SUM(h.amount) FROM check_holds h \
             WHERE h.account = {account} AND h.spent IS NULL), 0))"
    )
}

/// Whether `amount` more of budget `account` passes its limit `limit`
/// (negative: none) with what it holds and what it spent in its buckets
/// from `from` on (each an SQL expression).
fn over(account: &str, amount: &str, limit: &str, from: &str) -> String {
    format!(
        "({limit} >= 0 AND {held} + {amount} + COALESCE((SELECT SUM(x.spent) FROM budget_spend x \
             WHERE x.account = {account} AND x.bucket_ms >= {from}), 0) > {limit})",
        held = held(account)
    )
}

/// The engine's clock, in ms since the epoch, as SQL.
fn clock(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "CAST(unixepoch('subsec') * 1000 AS BIGINT)",
        Backend::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    }
}

/// `template` as `backend` spells it: its clock and its parameters.
fn spell(backend: Backend, template: &str) -> String {
    let filled = template.replace("{now}", clock(backend));
    match backend {
        Backend::Postgres => filled,
        Backend::Sqlite => numbered_params(&filled),
    }
}

/// The statements of `n` budgets or holds spelled once, for the few a
/// transaction of one job takes; more are spelled as they come.
const SPELLED: usize = 4;

/// What a statement of `n` budgets or holds is, spelled.
#[derive(Debug, Clone, Copy)]
enum Many {
    /// Opens `n` budgets (`$1`…`$n`, in the order of their names), so
    /// that each is there for its holds to name; on PostgreSQL it also
    /// locks their rows in that order until the transaction ends, so two
    /// reservations of a budget take turns and the guard of the second
    /// reads every hold the first committed.
    OpenBudgets,
    /// `n` reservations of one attempt (the `k`-th: job id `$6k+1`,
    /// ordinal, budget, amount, unit, bucket), each of a budget of its own,
    /// inserted where no budget passes its limit with it (then budget
    /// `$6n+4k+1`, amount, limit, bucket its spend counts from): all of
    /// them, or none.
    Reservations,
    /// As `Reservations`, for one check's holds (each its id, budget,
    /// amount, unit and bucket: `$5k+1`…).
    CheckHolds,
    /// Records of each of `n` buckets (the `k`-th: budget `$3k+1`, bucket
    /// `$3k+2`, amount `$3k+3`; no two the same budget and bucket) its
    /// amount more spent.
    AddSpends,
}

impl Many {
    fn spell(self, backend: Backend, n: usize) -> String {
        let template = match self {
            Many::OpenBudgets => {
                let rows: Vec<String> = (1..=n).map(|k| format!("(${k})")).collect();
                let then = match backend {
                    Backend::Postgres => "DO UPDATE SET account = excluded.account",
                    Backend::Sqlite => "DO NOTHING",
                };
                format!(
                    "INSERT INTO budget_accounts (account) VALUES {} ON CONFLICT (account) {then}",
                    rows.join(", ")
                )
            }
            Many::AddSpends => {
                let rows: Vec<String> = (0..n)
                    .map(|k| format!("(${}, ${}, ${})", 3 * k + 1, 3 * k + 2, 3 * k + 3))
                    .collect();
                format!(
                    "INSERT INTO budget_spend (account, bucket_ms, spent) VALUES {} \
                     ON CONFLICT (account, bucket_ms) DO UPDATE SET spent = budget_spend.spent + excluded.spent",
                    rows.join(", ")
                )
            }
            Many::Reservations | Many::CheckHolds => {
                let (table, columns): (&str, &[&str]) = match self {
                    Many::Reservations => (
                        "reservations",
                        &[
                            "job_id",
                            "ordinal",
                            "account",
                            "amount",
                            "unit",
                            "bucket_ms",
                        ],
                    ),
                    _ => (
                        "check_holds",
                        &["id", "account", "amount", "unit", "bucket_ms"],
                    ),
                };
                let width = columns.len();
                let rows: Vec<String> = (0..n)
                    .map(|r| {
                        let values: Vec<String> =
                            (1..=width).map(|i| format!("${}", r * width + i)).collect();
                        format!("({})", values.join(", "))
                    })
                    .collect();
                let sums: Vec<String> = (0..n)
                    .map(|k| {
                        let at = width * n + 4 * k;
                        format!("(${}, ${}, ${}, ${})", at + 1, at + 2, at + 3, at + 4)
                    })
                    .collect();
                let picked: Vec<String> = (1..=width).map(|i| format!("v.column{i}")).collect();
                format!(
                    "INSERT INTO {table} ({}, reserved_at_ms) \
                     SELECT {}, {{now}} FROM (VALUES {}) AS v \
                     WHERE NOT EXISTS (SELECT 1 FROM (VALUES {}) AS s WHERE {})",
                    columns.join(", "),
                    picked.join(", "),
                    rows.join(", "),
                    sums.join(", "),
                    over("s.column1", "s.column2", "s.column3", "s.column4"),
                )
            }
        };
        spell(backend, &template)
    }
}

/// Each [`Many`] spelled for 1…[`SPELLED`].
#[derive(Debug)]
pub struct Spelled {
    backend: Backend,
    statements: Vec<[String; SPELLED]>,
}

impl Spelled {
    fn new(backend: Backend) -> Spelled {
        let all = [
            Many::OpenBudgets,
            Many::Reservations,
            Many::CheckHolds,
            Many::AddSpends,
        ];
        Spelled {
            backend,
            statements: all
                .iter()
                .map(|many| std::array::from_fn(|i| many.spell(backend, i + 1)))
                .collect(),
        }
    }

    fn get(&self, many: Many, n: usize) -> Cow<'_, str> {
        match n.checked_sub(1).filter(|&i| i < SPELLED) {
            Some(i) => Cow::Borrowed(&self.statements[many as usize][i]),
            None => Cow::Owned(many.spell(self.backend, n)),
        }
    }
}

impl Sql {
    /// See [`Many::OpenBudgets`].
    pub fn open_budgets(&self, n: usize) -> Cow<'_, str> {
        self.spelled.get(Many::OpenBudgets, n)
    }

    /// See [`Many::Reservations`].
    pub fn insert_reservation_rows(&self, n: usize) -> Cow<'_, str> {
        self.spelled.get(Many::Reservations, n)
    }

    /// See [`Many::AddSpends`].
    pub fn add_spends(&self, n: usize) -> Cow<'_, str> {
        self.spelled.get(Many::AddSpends, n)
    }

    /// See [`Many::CheckHolds`].
    pub fn insert_check_hold_rows(&self, n: usize) -> Cow<'_, str> {
        self.spelled.get(Many::CheckHolds, n)
    }
}

fn numbered_params(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        let numbered = c == '$' && chars.peek().is_some_and(char::is_ascii_digit);
        out.push(if numbered { '?' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `surety_hold`'s guard (migration 0014, PostgreSQL) is the guard every
    /// other reservation statement spells, over its sums `s`.
    #[test]
    fn the_hold_functions_guard_is_the_statements_guard() {
        let migration = include_str!("../migrations/0014_hold_in_one_call.sql");
        let guard = over("s.account", "s.amount", "s.lim", "s.from_ms");
        assert!(
            migration.contains(&format!("WHERE {guard});")),
            "migration 0014's guard is not `{guard}`"
        );
    }

    #[test]
    fn statements_spelled_once_are_the_ones_spelled_as_they_come() {
        for backend in [Backend::Sqlite, Backend::Postgres] {
            let sql = Sql::new(backend);
            for many in [
                Many::OpenBudgets,
                Many::Reservations,
                Many::CheckHolds,
                Many::AddSpends,
            ] {
                for n in 1..=SPELLED + 1 {
                    assert_eq!(
                        sql.spelled.get(many, n),
                        many.spell(backend, n),
                        "{many:?} {n}"
                    );
                }
            }
            // Two budgets: reserved of both or neither.
            let hold = sql.insert_reservation_rows(2);
            assert!(hold.contains("NOT EXISTS") && hold.matches("budget_spend").count() == 1);
        }
    }

    #[test]
    fn sqlite_parameters_are_numbered_by_their_digits() {
        assert_eq!(
            numbered_params("SELECT $2, $1, $10 FROM t WHERE a = '$' AND b = $3"),
            "SELECT ?2, ?1, ?10 FROM t WHERE a = '$' AND b = ?3"
        );
        let sql = Sql::new(Backend::Sqlite);
        assert!(
            !sql.insert_attempt.write.contains('$'),
            "{}",
            sql.insert_attempt.write
        );
        assert!(
            Sql::new(Backend::Postgres)
                .insert_attempt
                .write
                .contains("$6")
        );
    }
}
