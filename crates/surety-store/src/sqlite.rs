//! SQLite: one writer thread that owns the only writing connection, and a
//! small pool of reading connections used in place.
//!
//! Writes queue to the writer thread whole (an operation, not a statement),
//! so a write costs one hand-off however many statements it runs. The
//! thread drains what has queued into one `BEGIN IMMEDIATE` transaction
//! and commits once: group commit. The operations run back to back; only
//! when one fails is the transaction rolled back and the batch run again
//! with a savepoint around each operation, so the one that fails is undone
//! alone (see [`run_batch`]). Nobody hears back
//! before the commit that made their write durable has returned. When
//! nothing is queued, the connection is free and no commit ended in the
//! last 200 µs, a write runs in place on the caller's thread instead: an
//! idle store costs no hand-off at all, and a busy one commits together.
//!
//! Reads run on the caller's thread on a pooled connection: in WAL mode a
//! reader sees the last commit and never waits for the writer.
//!
//! SQLite serves one router process. A second process writing the same file
//! makes writes wait in SQLite's busy handler (up to the busy timeout), and
//! a write running in place waits on the caller's thread; several replicas
//! belong on PostgreSQL.
//!
//! Checkpoints (copying the WAL back into the database file, with its
//! fsyncs) run on a thread of their own, never inside a writer's commit:
//! SQLite's automatic checkpoint would stall every write queued behind it.

use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use crate::StoreError;
use crate::conn::Lite;
use crate::{Outage, SqliteSync};

/// The most operations one transaction carries.
const MAX_BATCH: usize = 256;
/// A write runs in place only when no commit ended this recently (µs):
/// under load, writes arrive on each other's heels and a write in place
/// commits alone while blocking a runtime thread, so they queue and
/// commit together instead. Measured (`bench router`, SQLite, 64 clients,
/// same run): in place whenever the connection was free, 5,380 jobs/s and
/// 225 µs of CPU per job; with this window, 5,640–6,070 and 190–204 µs; at
/// 500 jobs/s the p50 stays within 0.06 ms (always queueing cost 0.2 ms).
const QUIET_US: u64 = 200;
/// The least time between two checkpoints. A write transaction took over
/// 1 ms only while a checkpoint ran (5 of 212 then, none of 11,800
/// otherwise, at 500 jobs/s), and the jobs that overlapped one were the
/// slow ones (p90 1.6-1.9 ms against 0.8-0.9): so many short checkpoints,
/// not few long ones. Measured (`bench router`, SQLite, 500 jobs/s, p99
/// past the first 200 ms, five runs each, alternated): every 1 s, longer
/// checkpoints (up to 24 ms) and a worse tail; every 100 ms, median p99
/// 1.41 ms; every 25 ms, 1.05 ms; at 64 clients no change past the runs'
/// spread (10,974-11,761 against 11,480-11,820 jobs/s).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(25);
/// The WAL's bound: past three quarters of it, the checkpointer pauses
/// writes and reads for a moment and restarts the WAL (the last quarter
/// takes what commits while the restart waits for readers: 6 MiB measured
/// at full load); `journal_size_limit` trims the file back to it when it
/// restarts. A commit that finds the file past it (the checkpointer held up
/// by a slow disk) restarts the WAL itself, so the file never holds more
/// than the bound and that commit's batch.
pub const WAL_LIMIT_BYTES: i64 = 64 * 1024 * 1024;

/// How much of the WAL, from where the writer writes next, the
/// checkpointer reads back into the page cache after each checkpoint
/// ([`WalAhead`]): more than the writer appends before the next one (at
/// full load, under 2 MiB in [`CHECKPOINT_EVERY`]).
const WAL_AHEAD_BYTES: u64 = 4 * 1024 * 1024;
/// SQLite's WAL format: the file's header, then frames, each a header of
/// this many bytes and a page.
const WAL_HEADER_BYTES: u64 = 32;
const WAL_FRAME_HEADER_BYTES: u64 = 24;

/// With a size limit, 1/this of it is kept for what acknowledged jobs
/// still write (results, attempts, races): new jobs stop short of it.
const RESERVED_FRACTION: i64 = 8;

/// The schema, in the files PostgreSQL's migrator reads too.
/// `migrations/sqlite/` holds SQLite's own (PostgreSQL's migrator reads
/// only the files directly under `migrations/`), and the files named
/// `*_postgres_*` are PostgreSQL's own, left out here.
const MIGRATIONS: [&str; 12] = [
    include_str!("../migrations/0001_jobs_and_attempts.sql"),
    include_str!("../migrations/0002_job_completion.sql"),
    include_str!("../migrations/0003_settled_jobs_index.sql"),
    include_str!("../migrations/0004_attention_index.sql"),
    include_str!("../migrations/0005_job_kind.sql"),
    include_str!("../migrations/0006_trust.sql"),
    include_str!("../migrations/sqlite/0007_checks_without_value_lists.sql"),
    include_str!("../migrations/0009_job_request.sql"),
    include_str!("../migrations/0010_job_deleted.sql"),
    include_str!("../migrations/0011_reconciliation.sql"),
    include_str!("../migrations/0012_budgets.sql"),
    include_str!("../migrations/0013_held_is_summed.sql"),
];

/// An operation queued for the writer.
trait Write: Send {
    /// Runs the operation; false when it failed (and must be rolled back).
    /// It may run again after its transaction was rolled back: its result
    /// is that of its last run.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller once the transaction's fate is known.
    fn reply(self: Box<Self>, commit: Result<(), Refused>);
}

struct Op<T, F> {
    op: F,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Write for Op<T, F>
where
    T: Send,
    F: FnMut(&mut Lite<'_>) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let result = (self.op)(&mut Lite(conn));
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn reply(self: Box<Self>, commit: Result<(), Refused>) {
        let answer = match (self.result, commit) {
            // A failed operation was rolled back whatever became of the rest.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (Some(Ok(_)) | None, Err(refused)) => Err(StoreError::NotCommitted {
                reason: refused.reason,
                outage: refused.outage,
            }),
            (None, Ok(())) => Err(StoreError::not_committed("the write never ran")),
        };
        // The caller may have given up waiting; the write stands regardless.
        let _ = self.reply.send(answer);
    }
}

/// Why a batch did not commit, told to every write in it.
#[derive(Debug, Clone)]
struct Refused {
    reason: String,
    outage: Option<Outage>,
}

enum Msg {
    Write(Box<dyn Write>),
    Close(oneshot::Sender<()>),
}

/// What the writer thread and writing callers share.
#[derive(Debug)]
struct Shared {
    /// The only writing connection.
    conn: Mutex<Connection>,
    /// Writes sent to the writer thread and not yet answered by it.
    queued: AtomicUsize,
    /// When the last commit ended, in µs since `epoch`.
    last_commit_us: AtomicU64,
    epoch: std::time::Instant,
    closed: AtomicBool,
    /// Tells the checkpointer a commit happened.
    committed: mpsc::SyncSender<()>,
    /// Held shared by every read, and alone by a restarting checkpoint,
    /// which needs a moment with no reader in the WAL.
    readers_gate: std::sync::RwLock<()>,
    /// Held through every checkpoint: SQLite lets one run at a time and
    /// refuses a second at once, so a restart waits here for the
    /// checkpointer's to end instead.
    checkpointing: Arc<Mutex<()>>,
    /// The WAL file, and the most bytes it may hold past one batch.
    wal: PathBuf,
    wal_limit: i64,
}

impl Shared {
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether no commit ended in the last [`QUIET_US`]: writes are not
    /// arriving on each other's heels, so one may run in place.
    fn quiet(&self) -> bool {
        let last = self.last_commit_us.load(Ordering::Acquire);
        self.now_us().saturating_sub(last) >= QUIET_US
    }

    /// The connection, if nobody holds it now.
    fn try_conn(&self) -> Option<MutexGuard<'_, Connection>> {
        match self.conn.try_lock() {
            Ok(conn) => Some(conn),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Commits `batch`, of which `queued` came through the writer's queue,
    /// and answers every write in it.
    fn commit(&self, conn: &Connection, batch: &mut Vec<Box<dyn Write>>, queued: usize) {
        let outcome = run_batch(conn, batch);
        self.last_commit_us.store(self.now_us(), Ordering::Release);
        // One pending signal is enough: the checkpointer sees every commit so far.
        let _ = self.committed.try_send(());
        // Counted until committed, so an in-place write never overtakes them;
        // uncounted before anyone is answered, so an answered caller never
        // sees its own write still queued.
        self.queued.fetch_sub(queued, Ordering::AcqRel);
        answer(batch, &outcome);
        // The checkpointer restarts the WAL at three quarters of its bound;
        // when it has not by the bound (a checkpoint held up by a slow
        // disk: the WAL grows by whatever commits meanwhile), the writer
        // does, and writes wait. So the file never holds more than the
        // bound and the one batch that crossed it: the next commit starts
        // the WAL over and trims the file back (`journal_size_limit`).
        if self.wal_past_bound() {
            let restarted = self.restart_wal(conn);
            tracing::warn!(
                ?restarted,
                bound = self.wal_limit,
                "the WAL passed its bound before a checkpoint restarted it: writes waited for the restart"
            );
        }
    }

    /// Whether the WAL file holds more than its bound.
    fn wal_past_bound(&self) -> bool {
        std::fs::metadata(&self.wal)
            .is_ok_and(|m| i64::try_from(m.len()).unwrap_or(i64::MAX) > self.wal_limit)
    }

    /// Checkpoints the whole WAL and restarts it, on `conn`, the writing
    /// connection, which the caller holds (so no write is under way): the
    /// readers' gate keeps new reads out meanwhile and waits for those in
    /// flight (single statements), so nobody is left in the WAL to wait
    /// for. Its busy flag, WAL frames and frames copied.
    fn restart_wal(&self, conn: &Connection) -> rusqlite::Result<(i64, i64, i64)> {
        let _checkpointing = lock(&self.checkpointing);
        let _reads = self
            .readers_gate
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        checkpoint(conn, "RESTART")
    }
}

/// `mutex`, whatever a panic left in it (nothing but `()` is guarded so).
fn lock(mutex: &Mutex<()>) -> MutexGuard<'_, ()> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `PRAGMA wal_checkpoint(mode)` on `conn`: its busy flag (1 when it could
/// not finish), WAL frames and frames copied.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })
}

/// The SQLite engine.
#[derive(Debug)]
pub(crate) struct Sqlite {
    writer: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    readers: Mutex<Vec<Connection>>,
    max_readers: usize,
    path: PathBuf,
    busy_timeout: Duration,
    /// With a size limit: the pages new jobs may leave in use.
    new_job_pages: Option<i64>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Write(_) => "Write",
            Msg::Close(_) => "Close",
        })
    }
}

impl Sqlite {
    /// Opens (creating) the file at `url` (`sqlite:path`, `sqlite://path`,
    /// with or without `?mode=...`), migrates it, and starts the writer and
    /// the checkpointer, writing as `checkpoints` says.
    pub(crate) fn open_with(
        url: &str,
        max_readers: usize,
        busy_timeout: Duration,
        checkpoints: Checkpoints,
    ) -> Result<Arc<Sqlite>, StoreError> {
        let path = sqlite_path(url)?;
        let conn = connect(&path, busy_timeout)?;
        conn.pragma_update(None, "synchronous", checkpoints.sync.pragma())?;
        migrate(&conn)?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        conn.pragma_update(None, "journal_size_limit", checkpoints.wal_limit)?;
        let mut new_job_pages = None;
        if let Some(max) = checkpoints.max_bytes {
            // The writer alone writes, so its limit is the file's. A limit
            // below what the file holds keeps the file as it is, full.
            let page: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
            let pages = (i64::try_from(max).unwrap_or(i64::MAX) / page.max(1)).max(1);
            conn.pragma_update(None, "max_page_count", pages)?;
            // An eighth is kept for the results of jobs already acknowledged.
            new_job_pages = Some(pages - pages / RESERVED_FRACTION);
        }
        let checkpointer = connect(&path, busy_timeout)?;
        let (committed, commits) = mpsc::sync_channel(1);
        let (writer, queue) = mpsc::channel();
        let checkpointing = Arc::new(Mutex::new(()));
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
        let wal = wal_path(&path);
        let ahead = WalAhead::new(wal.clone(), page_size);
        let spawn = |name: &str, work: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(work)
                .map_err(|e| StoreError::not_committed(format!("cannot start {name}: {e}")))
        };
        let shared = Arc::new(Shared {
            conn: Mutex::new(conn),
            queued: AtomicUsize::new(0),
            last_commit_us: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            closed: AtomicBool::new(false),
            committed,
            readers_gate: std::sync::RwLock::new(()),
            checkpointing: checkpointing.clone(),
            wal,
            wal_limit: checkpoints.wal_limit,
        });
        // Weak: the checkpointer ends with the store, when the last commit
        // signal's sender (in `Shared`) is gone.
        let for_checkpoints = Arc::downgrade(&shared);
        spawn(
            "surety-sqlite-checkpoint",
            Box::new(move || {
                let checkpointer = (&checkpointer, &*checkpointing);
                checkpoint_loop(checkpointer, ahead, &commits, checkpoints, &for_checkpoints)
            }),
        )?;
        let for_writer = shared.clone();
        spawn(
            "surety-sqlite-writer",
            Box::new(move || write_loop(&for_writer, &queue)),
        )?;
        Ok(Arc::new(Sqlite {
            writer,
            shared,
            readers: Mutex::new(Vec::new()),
            max_readers: max_readers.max(1),
            path,
            busy_timeout,
            new_job_pages,
        }))
    }

    /// Traces every statement the writing connection runs (tests).
    #[cfg(test)]
    pub(crate) fn trace_writes(&self, trace: fn(&str)) {
        self.shared.conn().trace(Some(trace));
    }

    /// Runs `op` in a write transaction and returns once it has committed:
    /// in place when the writer is idle, else queued for the writer thread.
    /// `op` may run more than once (its transaction rolled back between,
    /// when another write of its batch failed); what it returns is from
    /// the run that committed.
    pub(crate) async fn write<T, F>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&mut Lite<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        let (reply, mut answer) = oneshot::channel();
        let mut op: Vec<Box<dyn Write>> = vec![Box::new(Op {
            op,
            result: None,
            reply,
        })];
        // Queued writes go first; and a busy connection means a batch is on.
        if self.shared.queued.load(Ordering::Acquire) == 0
            && self.shared.quiet()
            && let Some(conn) = self.shared.try_conn()
        {
            self.shared.commit(&conn, &mut op, 0);
            drop(conn);
            return answer.try_recv().map_err(|_| StoreError::Closed)?;
        }
        let Some(op) = op.pop() else {
            return Err(StoreError::Closed);
        };
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        if self.writer.send(Msg::Write(op)).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(StoreError::Closed);
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// With a size limit, the pages in use past which new jobs are refused.
    pub(crate) fn new_job_pages(&self) -> Option<i64> {
        self.new_job_pages
    }

    /// Runs `op` on a reading connection, here and now.
    pub(crate) fn read<T>(
        &self,
        op: impl FnOnce(&mut Lite<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = self.pool().pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => connect(&self.path, self.busy_timeout)?,
        };
        let result = {
            let _reading = self
                .shared
                .readers_gate
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            op(&mut Lite(&conn))
        };
        let mut pool = self.pool();
        if pool.len() < self.max_readers {
            pool.push(conn);
        }
        result
    }

    fn pool(&self) -> MutexGuard<'_, Vec<Connection>> {
        // A panic while holding the lock leaves only a list of connections.
        self.readers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the writer after what is queued, and closes every connection.
    pub(crate) async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        let (done, closed) = oneshot::channel();
        if self.writer.send(Msg::Close(done)).is_ok() {
            let _ = closed.await;
        }
        self.pool().clear();
    }
}

fn sqlite_path(url: &str) -> Result<PathBuf, StoreError> {
    let rest = url
        .strip_prefix("sqlite:")
        .ok_or_else(|| StoreError::UnsupportedUrl(url.to_owned()))?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path.contains(":memory:") {
        return Err(StoreError::Invalid {
            field: "database url",
            reason: "SQLite needs a file path (an in-memory database cannot be shared by the writer and the readers)".to_owned(),
        });
    }
    Ok(PathBuf::from(path))
}

/// The WAL file of the database at `path`: its name with `-wal` after it.
fn wal_path(path: &std::path::Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

fn connect(path: &PathBuf, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(busy_timeout)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Applies the migrations the file has not seen; `user_version` counts them.
/// Foreign keys are off meanwhile, as SQLite's procedure for rebuilding a
/// table asks (a referenced table is dropped and its copy renamed), and
/// every reference is checked before the migrations commit.
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let applied = (|| -> Result<(), StoreError> {
        let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
        let start = usize::try_from(version).unwrap_or(usize::MAX);
        for (i, migration) in MIGRATIONS.iter().enumerate().skip(start) {
            conn.execute_batch(migration)?;
            conn.pragma_update(None, "user_version", i + 1)?;
        }
        let dangling: i64 =
            conn.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |row| {
                row.get(0)
            })?;
        if dangling > 0 {
            return Err(StoreError::Corrupt(format!(
                "rows that reference rows that do not exist: {dangling}; no migration was applied"
            )));
        }
        Ok(())
    })();
    let ended = match applied {
        Ok(()) => conn.execute_batch("COMMIT").map_err(StoreError::from),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    };
    conn.pragma_update(None, "foreign_keys", "ON")?;
    ended
}

/// Checkpoints after commits, at most every [`CHECKPOINT_EVERY`]. PASSIVE:
/// it copies what no reader still needs and never blocks the writer. Ends
/// when the writer does.
///
/// Busy readers keep the WAL from ever being restarted, so under sustained
/// load it grows without bound (a RESTART from this connection would
/// starve behind the writer, and one from the writer's behind the
/// readers). Past 3/4 of `wal_limit` bytes, this takes the writer's connection
/// (writes queue meanwhile) and restarts the WAL on it
/// ([`Shared::restart_wal`]): a pause of one checkpoint's length, once per
/// bound. RESTART, not TRUNCATE: an emptied file makes every later commit
/// extend it, which the router benchmark measured as 2-3 ms of added p99
/// at 500 jobs/s.
fn checkpoint_loop(
    (conn, checkpointing): (&Connection, &Mutex<()>),
    mut ahead: WalAhead,
    commits: &mpsc::Receiver<()>,
    every: Checkpoints,
    shared: &std::sync::Weak<Shared>,
) {
    let page_size = ahead.page_size;
    while commits.recv().is_ok() {
        let passive = {
            let _checkpointing = lock(checkpointing);
            checkpoint(conn, "PASSIVE")
        };
        match &passive {
            &Ok((_, wal, copied))
                if wal * i64::try_from(page_size).unwrap_or(i64::MAX) > every.wal_limit / 4 * 3 =>
            {
                if let Some(shared) = shared.upgrade() {
                    let restarted = shared.restart_wal(&shared.conn());
                    tracing::debug!(
                        wal,
                        copied,
                        ?restarted,
                        "the WAL passed its bound: restarted"
                    );
                }
            }
            &Ok((_, wal, copied)) => tracing::trace!(wal, copied, "checkpoint"),
            Err(e) => {
                tracing::warn!(error = %e, "a SQLite checkpoint failed; the WAL grows until one succeeds")
            }
        }
        if let Ok((_, wal, _)) = passive {
            ahead.advise(wal);
        }
        std::thread::sleep(every.every);
    }
}

/// Keeps the part of the WAL the writer writes next in the page cache.
///
/// SQLite writes each WAL frame as a 24-byte header and then its page, so
/// no write covers a whole file block, and a block the kernel has dropped
/// from its cache is first read from disk, inside the commit. The kernel
/// may drop the WAL's blocks however recently they were written: a write
/// does not count as a use of the page (this machine kind's proactive
/// reclaim, `kdamond`, dropped 378 of the WAL's pages in 6 s at 500 jobs/s,
/// and 8 % of commits then waited on a disk read, 834 in 10 s, every one
/// under `walWriteOneFrame`). After each checkpoint, this asks the kernel
/// to read back what it dropped of the next [`WAL_AHEAD_BYTES`], both
/// after the last frame and from the start (where the writer begins again
/// once a checkpoint has copied every frame); pages still cached cost a
/// lookup each.
struct WalAhead {
    path: PathBuf,
    /// Opened once the WAL exists (at the first commit).
    file: Option<std::fs::File>,
    page_size: u64,
}

impl WalAhead {
    fn new(path: PathBuf, page_size: i64) -> WalAhead {
        WalAhead {
            path,
            file: None,
            page_size: u64::try_from(page_size).unwrap_or(4096),
        }
    }

    /// `frames`: how many frames the WAL holds now.
    fn advise(&mut self, frames: i64) {
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.path).ok();
        }
        let Some(file) = &self.file else {
            return;
        };
        let frame = self.page_size + WAL_FRAME_HEADER_BYTES;
        let next = WAL_HEADER_BYTES + u64::try_from(frames).unwrap_or(0) * frame;
        // From the start, and past the last frame unless that is well
        // inside the first range.
        let past_the_last = Some(next).filter(|next| *next > WAL_AHEAD_BYTES / 2);
        for start in std::iter::once(0).chain(past_the_last) {
            let advised = rustix::fs::fadvise(
                file,
                start,
                NonZeroU64::new(WAL_AHEAD_BYTES),
                rustix::fs::Advice::WillNeed,
            );
            if let Err(e) = advised {
                tracing::debug!(error = %e, "the WAL's next pages could not be read ahead");
            }
        }
    }
}

/// How the store writes: checkpoints at most every `every`; past
/// `wal_limit` bytes of WAL, a restarting checkpoint; the writer's
/// `synchronous`; the most bytes the file may hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checkpoints {
    pub every: Duration,
    pub wal_limit: i64,
    pub sync: SqliteSync,
    pub max_bytes: Option<u64>,
}

impl Checkpoints {
    pub(crate) fn new(sync: SqliteSync) -> Checkpoints {
        Checkpoints {
            every: CHECKPOINT_EVERY,
            wal_limit: WAL_LIMIT_BYTES,
            sync,
            max_bytes: None,
        }
    }
}

fn write_loop(shared: &Shared, queue: &mpsc::Receiver<Msg>) {
    let mut batch: Vec<Box<dyn Write>> = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = queue.recv() {
        let mut close = None;
        match first {
            Msg::Write(w) => batch.push(w),
            Msg::Close(done) => close = Some(done),
        }
        while close.is_none() && batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(Msg::Write(w)) => batch.push(w),
                Ok(Msg::Close(done)) => close = Some(done),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let taken = batch.len();
            shared.commit(&shared.conn(), &mut batch, taken);
        }
        if let Some(done) = close {
            let _ = done.send(());
            return;
        }
    }
}

/// One transaction for the whole batch; the outcome is the transaction's,
/// each operation keeps its own result.
///
/// Optimistic: the operations run back to back, with no savepoint. When
/// one fails, the transaction is rolled back and the batch runs again, each
/// operation inside a savepoint of its own, so the one that fails is undone
/// alone and the rest commit. A savepoint costs a copy of every page its
/// operation first writes (SQLite's sub-journal: 4 % of the router's CPU at
/// 64 clients under `cargo xtask profile router`), and an operation seldom
/// fails.
fn run_batch(conn: &Connection, batch: &mut [Box<dyn Write>]) -> Result<(), Refused> {
    let commit = (|| -> Result<(), rusqlite::Error> {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        if batch.iter_mut().all(|op| op.run(conn)) {
            return conn.execute_batch("COMMIT");
        }
        // Some errors roll SQLite's transaction back by themselves.
        if !conn.is_autocommit() {
            conn.execute_batch("ROLLBACK")?;
        }
        if batch.len() == 1 {
            // The only operation failed: nothing is left to commit.
            return Ok(());
        }
        conn.execute_batch("BEGIN IMMEDIATE")?;
        for op in batch.iter_mut() {
            conn.prepare_cached("SAVEPOINT op")?.execute([])?;
            if !op.run(conn) {
                conn.prepare_cached("ROLLBACK TO op")?.execute([])?;
            }
            conn.prepare_cached("RELEASE op")?.execute([])?;
        }
        conn.execute_batch("COMMIT")
    })();
    commit.map_err(|e| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        tracing::error!(error = %e, writes = batch.len(), "a SQLite write batch did not commit");
        Refused {
            reason: e.to_string(),
            outage: crate::error::sqlite_outage(&e),
        }
    })
}

/// Answers every write of a batch with its result and the batch's outcome.
fn answer(batch: &mut Vec<Box<dyn Write>>, outcome: &Result<(), Refused>) {
    for op in batch.drain(..) {
        op.reply(outcome.clone());
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn insert(x: i64, fail: bool) -> (Box<dyn Write>, oneshot::Receiver<Result<(), StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let op = Op {
            op: move |c: &mut Lite<'_>| {
                c.0.execute("INSERT INTO t (x) VALUES (?1)", [x])?;
                match fail {
                    true => Err(StoreError::Corrupt(format!("refused after writing {x}"))),
                    false => Ok(()),
                }
            },
            result: None,
            reply,
        };
        (Box::new(op), answer)
    }

    /// Every statement a traced connection ran, in order.
    static TRACED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn traced(sql: &str) {
        TRACED.lock().unwrap().push(sql.to_owned());
    }

    fn rows(conn: &Connection) -> Vec<i64> {
        conn.prepare("SELECT x FROM t ORDER BY x")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    type Answer = oneshot::Receiver<Result<(), StoreError>>;

    /// Runs and answers `batch` on `conn` (traced): the statements it ran,
    /// and what each write was answered.
    fn run_traced(
        conn: &Connection,
        batch: Vec<(Box<dyn Write>, Answer)>,
    ) -> (Vec<String>, Vec<Result<(), StoreError>>) {
        let (mut batch, answers): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        TRACED.lock().unwrap().clear();
        let outcome = run_batch(conn, &mut batch);
        answer(&mut batch, &outcome);
        let answers = answers
            .into_iter()
            .map(|mut a: Answer| a.try_recv().unwrap())
            .collect();
        (std::mem::take(&mut *TRACED.lock().unwrap()), answers)
    }

    #[test]
    fn a_batch_commits_once_and_takes_savepoints_only_to_undo_a_failed_write_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = connect(&dir.path().join("t.db"), Duration::from_secs(1)).unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER NOT NULL)")
            .unwrap();
        conn.trace(Some(traced));
        let count =
            |ran: &[String], prefix: &str| ran.iter().filter(|s| s.starts_with(prefix)).count();

        let (statements, answers) = run_traced(
            &conn,
            vec![insert(1, false), insert(2, false), insert(3, false)],
        );
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(count(&statements, "SAVEPOINT"), 0, "{statements:?}");
        assert_eq!(
            count(&statements, "INSERT"),
            3,
            "each write ran once: {statements:?}"
        );
        assert_eq!(count(&statements, "COMMIT"), 1, "{statements:?}");

        let (statements, answers) = run_traced(
            &conn,
            vec![insert(4, false), insert(5, true), insert(6, false)],
        );
        assert!(answers[0].is_ok(), "{answers:?}");
        assert!(
            matches!(answers[1], Err(StoreError::Corrupt(_))),
            "{answers:?}"
        );
        assert!(answers[2].is_ok(), "{answers:?}");
        assert_eq!(
            count(&statements, "SAVEPOINT"),
            3,
            "run again, one savepoint each: {statements:?}"
        );
        assert_eq!(count(&statements, "COMMIT"), 1, "{statements:?}");
        assert_eq!(
            rows(&conn),
            [1, 2, 3, 4, 6],
            "the refused write's row was kept, or another's lost"
        );
        assert!(conn.is_autocommit(), "the batch left a transaction open");
    }

    /// The largest the WAL file gets while `writes` commits of 1 KiB land
    /// beside a reader that never rests (through the store's read path),
    /// with the WAL bounded at `limit`.
    async fn wal_peak(limit: i64, writes: i64) -> u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let url = format!("sqlite:{}", path.display());
        // Checkpoints as often as the writes go, so a short run sees many.
        let checkpoints = Checkpoints {
            every: Duration::from_millis(2),
            wal_limit: limit,
            ..Checkpoints::new(SqliteSync::Normal)
        };
        let lite = Sqlite::open_with(&url, 2, Duration::from_secs(5), checkpoints).unwrap();
        lite.write(|c| Ok(c.0.execute_batch("CREATE TABLE t (x BLOB NOT NULL)")?))
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (lite, stop) = (lite.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let _: i64 = lite
                        .read(|c| Ok(c.0.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?))
                        .unwrap();
                }
            })
        };
        let wal = path.with_extension("db-wal");
        let mut peak = 0;
        for _ in 0..writes {
            lite.write(|c| {
                Ok(c.0.execute("INSERT INTO t (x) VALUES (zeroblob(1024))", [])?)
            })
            .await
            .unwrap();
            peak = peak.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
        }
        stop.store(true, Ordering::Release);
        reader.join().unwrap();
        peak
    }

    /// Bytes this thread has read from storage so far (`/proc/thread-self/io`).
    fn read_from_disk() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines()
            .find_map(|l| l.strip_prefix("read_bytes: "))
            .unwrap()
            .parse()
            .unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_writer_finds_the_wal_it_writes_next_in_the_page_cache() {
        // On a disk, not tmpfs: what is dropped from the cache must be read back.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("ahead.db");
        let url = format!("sqlite:{}", path.display());
        // The checkpointer's first checkpoint is its last in this test:
        // the test checkpoints and advises by hand.
        let checkpoints = Checkpoints {
            every: Duration::from_secs(3600),
            ..Checkpoints::new(SqliteSync::Normal)
        };
        let lite = Sqlite::open_with(&url, 1, Duration::from_secs(5), checkpoints).unwrap();
        lite.write(|c| Ok(c.0.execute_batch("CREATE TABLE t (x BLOB NOT NULL)")?))
            .await
            .unwrap();
        let insert = || {
            lite.write(|c| {
                Ok(c.0.execute("INSERT INTO t (x) VALUES (zeroblob(1024))", [])?)
            })
        };
        for _ in 0..100 {
            insert().await.unwrap();
        }
        let side = connect(&path, Duration::from_secs(5)).unwrap();
        let wal = wal_path(&path);
        // What the kernel's reclaim does: the WAL's clean pages dropped,
        // from `from` to its end.
        let drop_the_wal = |from: u64| {
            let file = std::fs::File::open(&wal).unwrap();
            file.sync_all().unwrap();
            rustix::fs::fadvise(&file, from, None, rustix::fs::Advice::DontNeed).unwrap();
        };
        let mut ahead = WalAhead::new(wal.clone(), 4096);
        // Twice each way: with every frame copied, the writer begins
        // again at the start of the WAL; else it writes past the last frame.
        for (i, advised) in [false, true, false, true].into_iter().enumerate() {
            let (frames, from) = if i < 2 {
                // Every frame copied: the commit reads nothing from the WAL.
                (checkpoint(&side, "PASSIVE").unwrap().1, 0)
            } else {
                // A reader in the WAL keeps the writer from starting over,
                // and the WAL grows past what is read ahead from its start.
                insert().await.unwrap();
                side.execute_batch("BEGIN; SELECT count(*) FROM t;")
                    .unwrap();
                for _ in 0..1000 {
                    insert().await.unwrap();
                }
                let frames = checkpoint(&lite.shared.conn(), "PASSIVE").unwrap().1;
                let end = WAL_HEADER_BYTES + u64::try_from(frames).unwrap() * (4096 + 24);
                assert!(end > WAL_AHEAD_BYTES, "the WAL ends at {end}");
                // The frames before are the pages the commit reads (not
                // what this is about: a read is a use the kernel sees).
                (frames, end / 4096 * 4096)
            };
            drop_the_wal(from);
            if advised {
                ahead.advise(frames);
            }
            // Committed here, as a write in place is, so what it reads is
            // this thread's.
            let (reply, mut answer) = oneshot::channel();
            let mut batch: Vec<Box<dyn Write>> = vec![Box::new(Op {
                op: |c: &mut Lite<'_>| {
                    Ok(c.0.execute("INSERT INTO t (x) VALUES (zeroblob(1024))", [])?)
                },
                result: None,
                reply,
            })];
            let before = read_from_disk();
            lite.shared.commit(&lite.shared.conn(), &mut batch, 0);
            let read = read_from_disk() - before;
            assert_eq!(answer.try_recv().unwrap().unwrap(), 1);
            if i >= 2 {
                side.execute_batch("COMMIT").unwrap();
            }
            if advised {
                assert_eq!(read, 0, "the commit read the WAL from disk (run {i})");
            } else {
                assert!(
                    read > 0,
                    "dropping the WAL made no commit read it (run {i})"
                );
            }
        }
    }

    #[test]
    fn the_writer_syncs_as_configured() {
        let dir = tempfile::tempdir().unwrap();
        for (sync, expected) in [(SqliteSync::Normal, 1), (SqliteSync::Full, 2)] {
            let url = format!(
                "sqlite:{}",
                dir.path().join(format!("{expected}.db")).display()
            );
            let lite =
                Sqlite::open_with(&url, 1, Duration::from_secs(1), Checkpoints::new(sync)).unwrap();
            let level: i64 = lite
                .shared
                .conn()
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap();
            assert_eq!(level, expected, "{sync:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_stays_bounded_beside_busy_readers() {
        // 8,000 commits make about 55 MiB of WAL beside a busy reader when
        // nothing bounds it. Bounded at 1 MiB, it passes the bound by at
        // most the one commit that crossed it, however long a checkpoint
        // takes: the checkpointer alone let it grow by what landed while
        // its checkpoint ran (1.2-4.7 MiB here; 6-9.6 MiB while the disk
        // wrote back gigabytes; 27 MiB in a CI run).
        let limit = 1024 * 1024;
        let peak = wal_peak(limit, 8000).await;
        eprintln!("the WAL peaked at {peak} bytes");
        // One commit here writes a few pages, each a frame of 4 KiB and
        // its 24-byte header.
        let one_commit = 16 * (4096 + 24);
        assert!(
            peak <= (limit + one_commit) as u64,
            "the WAL reached {peak} bytes with a bound of {limit}"
        );
    }

    #[test]
    fn a_batch_that_cannot_commit_answers_every_write_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = connect(&path, Duration::from_millis(10)).unwrap();
        conn.execute_batch("CREATE TABLE t (x INTEGER NOT NULL)")
            .unwrap();
        // Another process's writer holds the lock past the busy timeout.
        let other = connect(&path, Duration::from_millis(10)).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (a, mut a_answer) = insert(1, false);
        let (b, mut b_answer) = insert(2, false);
        let mut batch = vec![a, b];
        let outcome = run_batch(&conn, &mut batch);
        answer(&mut batch, &outcome);
        for answer in [a_answer.try_recv(), b_answer.try_recv()] {
            assert!(matches!(
                answer.unwrap(),
                Err(StoreError::NotCommitted { .. })
            ));
        }
        other.execute_batch("ROLLBACK").unwrap();
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0);
    }

    #[expect(
        clippy::await_holding_lock,
        reason = "holding the connection across the awaits is the point: writes must queue"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_queue_while_the_connection_is_busy_and_commit_together() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("q.db").display());
        let lite = Sqlite::open_with(
            &url,
            2,
            Duration::from_secs(1),
            Checkpoints::new(SqliteSync::Normal),
        )
        .unwrap();
        lite.write(|c| Ok(c.0.execute_batch("CREATE TABLE t (x INTEGER NOT NULL)")?))
            .await
            .unwrap();
        // Somebody holds the connection: every write must queue.
        let held = lite.shared.conn();
        let mut writes = tokio::task::JoinSet::new();
        for x in 0..10_i64 {
            let lite = lite.clone();
            writes.spawn(async move {
                lite.write(move |c| Ok(c.0.execute("INSERT INTO t (x) VALUES (?1)", [x])?))
                    .await
            });
        }
        let all_queued = tokio::time::timeout(Duration::from_secs(10), async {
            while lite.shared.queued.load(Ordering::Acquire) < 10 {
                tokio::task::yield_now().await;
            }
        });
        assert!(all_queued.await.is_ok(), "the writes did not queue");
        drop(held);
        for written in writes.join_all().await {
            assert_eq!(written.unwrap(), 1);
        }
        assert_eq!(lite.shared.queued.load(Ordering::Acquire), 0);
        let n = lite
            .read(|c| {
                Ok(c.0.query_row("SELECT COUNT(*) FROM t", [], |r| r.get::<_, i64>(0))?)
            })
            .unwrap();
        assert_eq!(n, 10);
        lite.close().await;
        assert!(matches!(
            lite.write(|_| Ok(())).await,
            Err(StoreError::Closed)
        ));
    }

    /// A file of the schema before SQLite's own migration, with a row in
    /// each of the tables it rebuilds, and in the table that references one.
    fn file_of_the_previous_schema(path: &std::path::Path, extra: &str) {
        let old = Connection::open(path).unwrap();
        for migration in &MIGRATIONS[..6] {
            old.execute_batch(migration).unwrap();
        }
        old.pragma_update(None, "user_version", 6).unwrap();
        old.execute_batch(
            "INSERT INTO jobs (id, owner_id, idempotency_key, route, contract, contract_digest, \
                 input, fingerprint, hedgeable, state, version, result, completed_by, \
                 created_at_ms, updated_at_ms, completion, kind, messages) \
             VALUES ('j1', 'acme', 'k1', 'triage', 'c', 'sha256:0', '{}', 'f', 1, 'succeeded', 2, \
                 '{\"a\":1}', 2, 10, 20, '{\"usage\":{}}', 'chat', '[]'), \
                 ('j2', 'acme', 'k2', 'triage', 'c', 'sha256:0', '{}', 'f', 0, 'unknown', 1, \
                 NULL, NULL, 11, 21, NULL, 'native', NULL); \
             INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, base_version, \
                 started_at_ms, lease_expires_at_ms, unknown_since_ms, finished_at_ms, error) \
             VALUES ('j1', 1, 0, 1, 'p', 'lost', 0, 10, 40, NULL, 15, 'timeout'), \
                 ('j1', 2, 1, 1, 'q', 'succeeded', 0, 12, 42, NULL, 19, NULL), \
                 ('j2', 1, 0, 0, 'p', 'unknown', 0, 11, 41, 30, NULL, NULL); \
             INSERT INTO races (id, job_id, loser_ordinal, winner_ordinal, reason, at_ms) \
             VALUES ('r1', 'j1', 1, 2, 'lost the swap', 19); \
             INSERT INTO live_results (id, provider, contract, route, source, outcome, detail, \
                 job_id, case_name, input, expected, answer, at_ms) \
             VALUES ('l1', 'q', 'c', 'triage', 'shadow', 'disagreed', 'd', 'j1', NULL, '{}', \
                 '{}', '{}', 25);",
        )
        .unwrap();
        old.execute_batch(extra).unwrap();
    }

    /// Every row of every table, and the schema version.
    fn contents(c: &Connection) -> (i64, Vec<String>) {
        let mut all = Vec::new();
        for table in ["jobs", "attempts", "races", "live_results", "demotions"] {
            let mut rows = c
                .prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2"))
                .unwrap();
            let width = rows.column_count();
            let mut query = rows.query([]).unwrap();
            while let Some(row) = query.next().unwrap() {
                let values: Vec<_> = (0..width)
                    .map(|i| format!("{:?}", row.get_ref(i).unwrap()))
                    .collect();
                all.push(format!("{table}: {}", values.join(", ")));
            }
        }
        let version = c
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        (version, all)
    }

    /// SQLite's own migration rebuilds `jobs`, `attempts` and
    /// `live_results` without lists of values in their CHECKs and indexes:
    /// every row is kept as it was, every rule still holds, foreign keys
    /// are enforced again after it, and writing a state builds no temporary
    /// b-tree any more.
    #[tokio::test]
    async fn a_file_of_the_previous_schema_keeps_its_rows_and_rules_when_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        file_of_the_previous_schema(&path, "");
        let (version, before) = contents(&Connection::open(&path).unwrap());
        assert_eq!((version, before.len()), (6, 7), "{before:#?}");

        let url = format!("sqlite:{}", path.display());
        let lite = Sqlite::open_with(
            &url,
            1,
            Duration::from_secs(1),
            Checkpoints::new(SqliteSync::Normal),
        )
        .unwrap();
        let (version, after) = lite.read(|c| Ok(contents(c.0))).unwrap();
        // Every row as it was; a job gains the later migrations' `request`
        // and `deleted_at_ms`, an attempt `provider_response_id` and
        // `asked_at_ms`, unset.
        let kept: Vec<String> = before
            .iter()
            .map(
                |row| match row.starts_with("jobs: ") || row.starts_with("attempts: ") {
                    true => format!("{row}, Null, Null"),
                    false => row.clone(),
                },
            )
            .collect();
        assert_eq!((version, &after), (MIGRATIONS.len() as i64, &kept));

        let refused = [
            // A state no job has.
            "UPDATE jobs SET state = 'done' WHERE id = 'j2'",
            // A result without a winner.
            "UPDATE jobs SET result = '{}' WHERE id = 'j2'",
            // An attempt of no job: foreign keys are on again.
            "INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, base_version, \
                 started_at_ms, lease_expires_at_ms) VALUES ('nobody', 1, 0, 0, 'p', 'started', 0, 1, 2)",
            // A second open attempt in a slot.
            "INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, base_version, \
                 started_at_ms, lease_expires_at_ms) VALUES ('j2', 2, 0, 0, 'p', 'started', 0, 1, 2)",
            // A hedge of a job with side effects.
            "UPDATE attempts SET slot = 1 WHERE job_id = 'j2'",
            "UPDATE live_results SET outcome = 'fine'",
            "DELETE FROM jobs WHERE id = 'j1'",
        ];
        for statement in refused {
            let wrote = lite.write(move |c| Ok(c.0.execute(statement, [])?)).await;
            assert!(wrote.is_err(), "{statement}: {wrote:?}");
        }
        let settled = "UPDATE jobs SET state = 'failed', updated_at_ms = 22 WHERE id = 'j2'";
        assert_eq!(
            lite.write(move |c| Ok(c.0.execute(settled, [])?))
                .await
                .unwrap(),
            1
        );
        let (ephemeral, plan) = lite
            .read(|c| {
                let opcodes: Vec<String> =
                    c.0.prepare(&format!("EXPLAIN {settled}"))?
                        .query_map([], |row| row.get(1))?
                        .collect::<Result<_, _>>()?;
                // The pruner's scan still finds the settled jobs by their index.
                let sql = crate::sql::Sql::new(crate::Backend::Sqlite);
                let prune = sql.prune_settled.last().cloned().unwrap_or_default();
                let mut explain = c.0.prepare(&format!("EXPLAIN QUERY PLAN {prune}"))?;
                let nulls = vec![rusqlite::types::Null; explain.parameter_count()];
                let plan: Vec<String> = explain
                    .query_map(rusqlite::params_from_iter(nulls), |row| row.get(3))?
                    .collect::<Result<_, _>>()?;
                Ok((opcodes.iter().any(|op| op == "OpenEphemeral"), plan))
            })
            .unwrap();
        assert!(!ephemeral, "a state's write builds a temporary b-tree");
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX jobs_settled_at")),
            "{plan:#?}"
        );
        let settled_at: i64 = lite
            .read(|c| {
                Ok(c.0.query_row(
                    "SELECT count(*) FROM jobs INDEXED BY jobs_settled_at \
                     WHERE (state = 'succeeded' OR state = 'failed' OR state = 'cancelled') \
                     AND updated_at_ms > 0",
                    [],
                    |r| r.get(0),
                )?)
            })
            .unwrap();
        assert_eq!(settled_at, 2, "the index holds the settled jobs");
        lite.close().await;
    }

    /// A file whose rows already break a reference is not migrated: the
    /// store refuses to open it, and the file is left as it was.
    #[test]
    fn a_file_with_a_broken_reference_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        file_of_the_previous_schema(
            &path,
            "PRAGMA foreign_keys = OFF; \
             INSERT INTO races (id, job_id, loser_ordinal, winner_ordinal, reason, at_ms) \
             VALUES ('r2', 'gone', 1, NULL, 'x', 1);",
        );
        let before = contents(&Connection::open(&path).unwrap());
        let url = format!("sqlite:{}", path.display());
        let opened = Sqlite::open_with(
            &url,
            1,
            Duration::from_secs(1),
            Checkpoints::new(SqliteSync::Normal),
        );
        let Err(StoreError::Corrupt(reason)) = opened else {
            panic!("opened: {opened:?}")
        };
        assert!(reason.contains("rows that do not exist: 1;"), "{reason}");
        assert_eq!(contents(&Connection::open(&path).unwrap()), before);
    }
}
