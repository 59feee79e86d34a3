//! Faults under load against the real `surety serve` binary (run as
//! `serve::RouterProcess`): a load of clients that keep the books (every
//! acknowledged job, every answer by status, latencies), and the audit of
//! those books against the database and the provider's own count of
//! calls. Used by `cargo xtask chaos` (`benches/chaos.rs`) and by the
//! suite's shorter fault tests.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;
use surety_fake_provider::FakeProvider;

use crate::TestDb;

/// The machine's CPU time so far, from the first line of `/proc/stat`, in
/// clock ticks: all of it, and what the hypervisor gave other guests
/// while this one wanted to run (steal). Zero where it cannot be read.
#[derive(Debug, Clone, Copy, Default)]
pub struct MachineCpu {
    pub total: u64,
    pub steal: u64,
}

impl MachineCpu {
    pub fn now() -> MachineCpu {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|t| t.parse().ok())
            .collect();
        MachineCpu {
            // user nice system idle iowait irq softirq steal (guest time is in user).
            total: ticks.iter().take(8).sum(),
            steal: ticks.get(7).copied().unwrap_or(0),
        }
    }

    /// The share of the machine's time stolen between `self` and `later`, in percent.
    pub fn steal_pct_until(self, later: MachineCpu) -> f64 {
        let total = later.total.saturating_sub(self.total);
        match total {
            0 => 0.0,
            total => 100.0 * later.steal.saturating_sub(self.steal) as f64 / total as f64,
        }
    }
}

/// A provider that answers every request after `latency_ms`, counting
/// calls only (a long run's requests are not kept).
pub async fn answering_fake(latency_ms: u64) -> FakeProvider {
    use surety_fake_provider::{Behavior, Keep, Latency, Script, When};
    let english = Behavior::Reply(json!({"language": "english"}).to_string());
    FakeProvider::start(Script {
        keep: Keep::Counts,
        ..Script::always(english.clone()).rule_with_latency(
            When::Always,
            english,
            Latency::FixedMs(latency_ms),
        )
    })
    .await
    .expect("the fake provider starts")
}

/// What the clients saw: every acknowledged job, every answer by status.
#[derive(Debug)]
pub struct Books {
    /// Idempotency-Key → (job id, input, when the request that got it was
    /// sent) for every 200/201/202 with an id.
    pub acknowledged: Mutex<BTreeMap<String, (String, Value, Instant)>>,
    /// Status (or `conn` for a connection that failed) → count.
    pub answers: Mutex<BTreeMap<String, u64>>,
    /// Per answered request: when it was answered (ms since the load
    /// began) and how long it took (µs).
    pub latencies: Mutex<Vec<(u64, u64)>>,
    pub requests: AtomicU64,
    pub began: Instant,
}

impl Books {
    fn new() -> Books {
        Books {
            acknowledged: Mutex::default(),
            answers: Mutex::default(),
            latencies: Mutex::default(),
            requests: AtomicU64::new(0),
            began: Instant::now(),
        }
    }

    fn answered(&self, status: &str, micros: Option<u64>) {
        *lock(&self.answers).entry(status.to_owned()).or_default() += 1;
        if let Some(micros) = micros {
            let at = self.began.elapsed().as_millis() as u64;
            lock(&self.latencies).push((at, micros));
        }
    }

    /// The 99th percentile latency of the requests answered between `from`
    /// and `to` after the load began, in ms.
    pub fn p99_ms_between(&self, from: Duration, to: Duration) -> f64 {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let (from, to) = (ms(from), ms(to));
        let mut l: Vec<u64> = lock(&self.latencies)
            .iter()
            .filter(|(at, _)| (from..to).contains(at))
            .map(|(_, micros)| *micros)
            .collect();
        l.sort_unstable();
        l.get(((l.len() as f64 - 1.0) * 0.99).round() as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    }

    /// The typical p99 between `from` and `to`: the median of the p99s of
    /// its consecutive `window`s (a last window shorter than half of one is
    /// left out), in ms. A burst on a shared host (steal, another tenant's
    /// IO) lifts the window it falls in; what the router does throughout a
    /// span lifts them all. Two spans of different lengths compare fairly
    /// this way, where a longer span's p99 holds more bursts.
    pub fn typical_p99_ms_between(&self, from: Duration, to: Duration, window: Duration) -> f64 {
        let mut p99s = Vec::new();
        let mut start = from;
        while start + window / 2 <= to {
            p99s.push(self.p99_ms_between(start, (start + window).min(to)));
            start += window;
        }
        p99s.sort_by(f64::total_cmp);
        match p99s.len() {
            0 => self.p99_ms_between(from, to),
            n if n % 2 == 1 => p99s[n / 2],
            n => (p99s[n / 2 - 1] + p99s[n / 2]) / 2.0,
        }
    }

    /// How many requests were answered with `status` (`"429"`, `"conn"`).
    pub fn answers_with(&self, status: &str) -> u64 {
        lock(&self.answers).get(status).copied().unwrap_or(0)
    }

    /// The answers by status, as `201:950 503:12`.
    pub fn answers_line(&self) -> String {
        lock(&self.answers)
            .iter()
            .map(|(status, n)| format!("{status}:{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The 99th percentile latency of every answered request, in ms.
    pub fn p99_ms(&self) -> f64 {
        self.p99_ms_between(Duration::ZERO, Duration::MAX)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A load: `clients` closed-loop clients of one owner (or, with `rate`,
/// that many new intents a second, open loop), each sending new intents
/// (`<prefix>-<n>`) and, until it is acknowledged, the same intent again
/// with the same key, as a careful client does when the router is down or
/// says to retry.
#[derive(Debug, Clone)]
pub struct Load {
    pub api_key: String,
    pub clients: usize,
    /// Open loop: new intents per second (`clients` is then unused).
    pub rate: Option<u32>,
    pub prefix: String,
    /// `Prefer: wait` in seconds; `None` answers at once.
    pub wait: Option<u64>,
    /// The input text of intent n.
    pub text: fn(u64) -> String,
}

/// Where the load goes: the routers' base URLs, changed as they restart.
pub type Targets = tokio::sync::watch::Receiver<Vec<String>>;

impl Load {
    /// Runs until `stop` is set; a client finishes the intent it is on only
    /// if it is acknowledged first (an intent never acknowledged is no loss).
    pub fn spawn(
        self,
        targets: Targets,
        stop: Arc<AtomicBool>,
    ) -> (Arc<Books>, tokio::task::JoinSet<()>) {
        let books = Arc::new(Books::new());
        let next = Arc::new(AtomicU64::new(0));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build()
            .expect("an HTTP client");
        let mut clients = tokio::task::JoinSet::new();
        if let Some(rate) = self.rate {
            // Open loop: a new intent every 1/rate s, whatever the answers.
            let (load, kept, client, stop) = (self, books.clone(), client, stop);
            clients.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
                let mut intents = tokio::task::JoinSet::new();
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    tick.tick().await;
                    let (load, books, client, targets, stop) = (
                        load.clone(),
                        kept.clone(),
                        client.clone(),
                        targets.clone(),
                        stop.clone(),
                    );
                    intents.spawn(async move {
                        load.one_intent(n as usize, n, &client, &targets, &books, &stop)
                            .await;
                    });
                    n += 1;
                    while intents.try_join_next().is_some() {}
                }
                while intents.join_next().await.is_some() {}
            });
            return (books, clients);
        }
        for i in 0..self.clients {
            let (load, books, next, client, targets, stop) = (
                self.clone(),
                books.clone(),
                next.clone(),
                client.clone(),
                targets.clone(),
                stop.clone(),
            );
            clients.spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    load.one_intent(i, n, &client, &targets, &books, &stop)
                        .await;
                }
            });
        }
        (books, clients)
    }

    async fn one_intent(
        &self,
        client_no: usize,
        n: u64,
        client: &reqwest::Client,
        targets: &Targets,
        books: &Books,
        stop: &AtomicBool,
    ) {
        let key = format!("{}-{n}", self.prefix);
        let input = json!({"text": (self.text)(n)});
        let body = json!({"route": "language", "input": input});
        while !stop.load(Ordering::Acquire) {
            let base = {
                let all = targets.borrow();
                all.get(client_no % all.len().max(1))
                    .cloned()
                    .unwrap_or_default()
            };
            books.requests.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            let mut request = client
                .post(format!("{base}/v1/jobs"))
                .bearer_auth(&self.api_key)
                .header("Idempotency-Key", &key)
                .json(&body);
            if let Some(wait) = self.wait {
                request = request.header("Prefer", format!("wait={wait}"));
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(_) => {
                    // The router is down or restarting: the same intent again.
                    books.answered("conn", None);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            let status = response.status().as_u16();
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            let micros = started.elapsed().as_micros() as u64;
            books.answered(&status.to_string(), Some(micros));
            match (status, answer["id"].as_str()) {
                (200..=202, Some(id)) => {
                    lock(&books.acknowledged).insert(key, (id.to_owned(), input, started));
                    return;
                }
                // Nothing recorded (503, 507, 429): the same intent again.
                _ => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
    }
}

/// How long a client waits before it sends an unacknowledged intent again.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The audit of one scenario's books.
#[derive(Debug, Clone, Serialize)]
pub struct Audit {
    pub acknowledged: usize,
    /// Acknowledged jobs missing from the database, or stored with another
    /// id or input.
    pub lost: usize,
    /// Acknowledged jobs gone because retention allowed it: asked for
    /// longer than the retention ago, so settled and pruned since.
    pub past_retention: usize,
    /// The most provider calls any one intent (job) caused.
    pub max_calls_per_intent: u64,
    /// Attempts by state at the end.
    pub attempts: BTreeMap<String, i64>,
}

/// Checks `books` against the database and the fake's count of calls. A
/// job missing is lost unless `retention` allowed it to go: a job settles
/// no earlier than the request that made it was sent, and is pruned no
/// earlier than the retention after it settled.
pub async fn audit(
    db: &TestDb,
    owner: &str,
    books: &Books,
    fake: &FakeProvider,
    retention: Option<Duration>,
) -> Audit {
    let rows = sqlx::query(&format!(
        "SELECT idempotency_key, id, input FROM jobs WHERE owner_id = '{owner}'"
    ))
    .fetch_all(&db.raw)
    .await
    .expect("the jobs");
    let stored: HashMap<String, (String, Value)> = rows
        .iter()
        .map(|row| {
            let input: String = row.get(2);
            (
                row.get::<String, _>(0),
                (
                    row.get::<String, _>(1),
                    serde_json::from_str(&input).unwrap_or(Value::Null),
                ),
            )
        })
        .collect();
    let acknowledged = lock(&books.acknowledged).clone();
    let (mut lost, mut past_retention) = (0, 0);
    for (key, (id, input, sent)) in &acknowledged {
        match stored.get(key) {
            Some((sid, sinput)) if sid == id && sinput == input => {}
            None if retention.is_some_and(|r| sent.elapsed() > r) => past_retention += 1,
            _ => lost += 1,
        }
    }
    // The router's key per attempt is `surety-<job id>-<ordinal>`.
    let mut per_job: HashMap<String, u64> = HashMap::new();
    for (key, calls) in fake.calls_by_key() {
        if let Some(job) = key
            .strip_prefix("surety-")
            .and_then(|rest| rest.rsplit_once('-'))
            .map(|(job, _)| job.to_owned())
        {
            *per_job.entry(job).or_default() += calls;
        }
    }
    let attempts = sqlx::query("SELECT state, COUNT(*) FROM attempts GROUP BY state")
        .fetch_all(&db.raw)
        .await
        .expect("the attempts")
        .iter()
        .map(|row| (row.get::<String, _>(0), row.get::<i64, _>(1)))
        .collect();
    Audit {
        acknowledged: acknowledged.len(),
        lost,
        past_retention,
        max_calls_per_intent: per_job.values().copied().max().unwrap_or(0),
        attempts,
    }
}

/// `PRAGMA integrity_check` of a SQLite test database.
pub async fn integrity(db: &TestDb) -> String {
    sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&db.raw)
        .await
        .unwrap_or_else(|e| format!("cannot check: {e}"))
}

/// The SQLite file of a test database's URL, and its WAL beside it.
pub fn sqlite_files(db: &TestDb) -> (PathBuf, PathBuf) {
    let path = db
        .url
        .trim_start_matches("sqlite:")
        .split('?')
        .next()
        .unwrap_or_default()
        .to_owned();
    (PathBuf::from(&path), PathBuf::from(format!("{path}-wal")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_lifts_its_window_and_not_the_typical_p99_a_steady_rise_lifts_them_all() {
        let books = Books::new();
        {
            let mut latencies = lock(&books.latencies);
            // 10 s at one request a ms: 1 ms each, but a 200 ms burst of
            // 50 ms in the fourth second, and 5 ms from 6 s on.
            for at in 0..10_000u64 {
                let micros = match at {
                    3_000..3_200 => 50_000,
                    6_000.. => 5_000,
                    _ => 1_000,
                };
                latencies.push((at, micros));
            }
        }
        let s = Duration::from_secs;
        let window = s(2);
        assert_eq!(books.p99_ms_between(s(0), s(6)), 50.0);
        assert_eq!(books.typical_p99_ms_between(s(0), s(6), window), 1.0);
        assert_eq!(books.typical_p99_ms_between(s(6), s(10), window), 5.0);
        // A last window shorter than half of one is left out.
        assert_eq!(
            books.typical_p99_ms_between(s(0), s(6) + Duration::from_millis(900), window),
            1.0
        );
        // Shorter than half a window: the span's own p99.
        assert_eq!(
            books.typical_p99_ms_between(s(3), s(3) + Duration::from_millis(900), window),
            50.0
        );
    }
}
