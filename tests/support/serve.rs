//! `surety serve` as a process of the tests and benchmarks: the workspace
//! it runs in (a config with one certified route to a fake provider, and
//! its manifest), starting it and waiting until it listens, its log, its
//! memory, and stopping it (SIGTERM) or killing it (SIGKILL).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sha2::{Digest, Sha256};
use surety_fake_provider::FakeProvider;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The API key of the owner whose jobs the books follow.
pub const KEY: &str = "key-acme";
/// The API key of an owner that floods.
pub const FLOOD_KEY: &str = "key-flood";

/// A directory with `surety.toml` (one route, `language`, to the fake as
/// `fake-a`; owners `acme` and `flood`; `server` added to `[server]`) and a
/// manifest certifying it.
pub fn workspace(
    repo: &Path,
    db_url: &str,
    fake: &FakeProvider,
    server: &str,
) -> tempfile::TempDir {
    workspace_routed(repo, db_url, &[("fake-a", fake)], "", server)
}

/// As [`workspace`], with the route `language` to each of `providers`
/// (`(id, fake)`, in order), each certified, and `route` added to the
/// route's table (e.g. its `[routes.language.shadow]`).
pub fn workspace_routed(
    repo: &Path,
    db_url: &str,
    providers: &[(&str, &FakeProvider)],
    route: &str,
    server: &str,
) -> tempfile::TempDir {
    workspace_of(repo, db_url, (providers, ""), route, server)
}

/// As [`workspace`], the provider storing its answers (`store = true`):
/// its unknown attempts can be reconciled.
pub fn workspace_storing(
    repo: &Path,
    db_url: &str,
    fake: &FakeProvider,
    server: &str,
) -> tempfile::TempDir {
    workspace_of(
        repo,
        db_url,
        (&[("fake-a", fake)], "store = true\n"),
        "",
        server,
    )
}

/// As [`workspace_routed`], with `extra` in every provider's table.
fn workspace_of(
    repo: &Path,
    db_url: &str,
    (providers, extra): (&[(&str, &FakeProvider)], &str),
    route: &str,
    server: &str,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let contract = surety_contracts::Contract::load(&repo.join("contracts/language-detect"))
        .expect("the contract");
    let now = time::OffsetDateTime::now_utc();
    let mut manifest = surety_manifest::Manifest::new(now);
    let hash = |key: &str| hex::encode(Sha256::digest(key.as_bytes()));
    let tables: String = providers
        .iter()
        .map(|(id, fake)| {
            format!(
                "[providers.{id}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{id}\"\ncontext_window = 16000\ntokenizer = \"tiktoken:o200k_base\"\n{extra}",
                fake.openai_base_url()
            )
        })
        .collect();
    let ids: Vec<String> = providers
        .iter()
        .map(|(id, _)| format!("\"{id}\""))
        .collect();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndatabase = \"{}\"\nmanifest = \"{}\"\ncontracts = \"{}\"\n{server}\n\
         [[api_keys]]\nowner = \"acme\"\nsha256 = \"{}\"\n\
         [[api_keys]]\nowner = \"flood\"\nsha256 = \"{}\"\n\
         {tables}\
         [routes.language]\ncontract = \"language-detect\"\nproviders = [{}]\n{route}",
        db_url,
        dir.path().join("manifest.json").display(),
        repo.join("contracts").display(),
        hash(KEY),
        hash(FLOOD_KEY),
        ids.join(", ")
    );
    let parsed = surety_router::RouterConfig::from_toml(&config).expect("a valid config");
    for (id, _) in providers {
        manifest.entries.push(crate::certified_entry(
            &parsed.providers[*id],
            &contract,
            now + time::Duration::days(1),
        ));
    }
    manifest
        .write(&dir.path().join("manifest.json"))
        .expect("the manifest");
    std::fs::write(dir.path().join("surety.toml"), config).expect("the config");
    dir
}

/// A running `surety serve`.
#[derive(Debug)]
pub struct RouterProcess {
    child: tokio::process::Child,
    pub base: String,
    pub pid: u32,
    /// Every line it logged so far.
    log: tokio::sync::watch::Receiver<Vec<String>>,
}

impl RouterProcess {
    /// Starts `bin serve --config <dir>/surety.toml` logging only warnings
    /// (and its own lines), and waits until it listens.
    pub async fn start(bin: &Path, dir: &Path) -> RouterProcess {
        RouterProcess::start_with(bin, dir, &[], "warn,surety=info").await
    }

    /// As [`RouterProcess::start`], with more arguments and `RUST_LOG`.
    pub async fn start_with(
        bin: &Path,
        dir: &Path,
        args: &[&str],
        rust_log: &str,
    ) -> RouterProcess {
        let mut child = tokio::process::Command::new(bin)
            .args(["serve", "--config"])
            .arg(dir.join("surety.toml"))
            .args(args)
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("surety serve starts");
        let mut lines = BufReader::new(child.stderr.take().expect("its log")).lines();
        let (keep, mut log) = tokio::sync::watch::channel(Vec::new());
        // Keep reading its log so it never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep.send_modify(|l| l.push(line));
            }
        });
        let listening = tokio::time::timeout(
            Duration::from_secs(30),
            log.wait_for(|l| l.iter().any(|line| line.contains("surety serving"))),
        )
        .await
        .expect("surety serve listens within 30 s")
        .expect("surety serve listens")
        .iter()
        .find(|line| line.contains("surety serving"))
        .cloned()
        .unwrap_or_default();
        // `addr=127.0.0.1:1234` as text, `"addr":"127.0.0.1:1234"` as JSON.
        let addr = listening
            .split(|c: char| c.is_whitespace() || c == '"' || c == '=' || c == ',' || c == '}')
            .find(|w| w.starts_with("127.0.0.1:"))
            .expect("surety serve said where it listens")
            .to_owned();
        RouterProcess {
            pid: child.id().expect("a pid"),
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    /// Waits until a logged line satisfies `found`, and returns it.
    pub async fn logged(&mut self, found: impl Fn(&str) -> bool) -> String {
        let lines = tokio::time::timeout(
            Duration::from_secs(20),
            self.log.wait_for(|lines| lines.iter().any(|l| found(l))),
        )
        .await
        .expect("the line was logged")
        .expect("the log is read");
        lines.iter().find(|l| found(l)).cloned().unwrap_or_default()
    }

    /// The CPU time it has used so far, user and system, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(&self.pid.to_string()).own
    }

    /// The time its threads have spent ready to run but waiting for a
    /// core, in seconds: the sum of `/proc/<pid>/task/*/schedstat`'s
    /// `run_delay` over the threads alive now.
    pub fn run_queue_seconds(&self) -> f64 {
        let nanos: u64 = self
            .threads()
            .filter_map(|task| std::fs::read_to_string(task.join("schedstat")).ok())
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        nanos as f64 / 1e9
    }

    /// The bytes it has had read from storage so far (`read_bytes` of
    /// `/proc/<pid>/io`): all of them, and those its SQLite checkpointer
    /// thread read (ahead of the writer, off every request's path).
    pub fn disk_read_bytes(&self) -> DiskReads {
        let read = |io: &Path| proc_number(io, "read_bytes:");
        let checkpointer = self
            .threads()
            .filter(|task| {
                std::fs::read_to_string(task.join("comm"))
                    .is_ok_and(|comm| comm.trim() == "surety-sqlite-c")
            })
            .map(|task| read(&task.join("io")))
            .sum();
        DiskReads {
            all: read(Path::new(&format!("/proc/{}/io", self.pid))),
            checkpointer,
        }
    }

    /// Its threads alive now, as their `/proc/<pid>/task/<tid>` directories.
    fn threads(&self) -> impl Iterator<Item = PathBuf> {
        std::fs::read_dir(format!("/proc/{}/task", self.pid))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|task| task.path())
    }

    /// Its resident memory now, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        proc_status_kib(self.pid, "VmRSS:")
    }

    /// Its peak resident memory so far, in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        proc_status_kib(self.pid, "VmHWM:")
    }

    /// SIGKILL: no shutdown, no cleanup. Returns its peak RSS in KiB.
    pub async fn kill(mut self) -> u64 {
        let peak = self.peak_rss_kib();
        self.child.kill().await.expect("SIGKILL");
        peak
    }

    /// SIGTERM, and its exit code.
    pub async fn terminate(mut self) -> Option<i32> {
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM was not sent");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("surety serve exits within 30 s of SIGTERM")
            .expect("its exit status")
            .code()
    }
}

/// Bytes a process has had read from storage (see
/// [`RouterProcess::disk_read_bytes`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiskReads {
    pub all: u64,
    pub checkpointer: u64,
}

/// A `field` of `/proc/<pid>/status` in KiB; 0 where it cannot be read.
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    proc_number(Path::new(&format!("/proc/{pid}/status")), field)
}

/// The number after `field` on its line of a `/proc` file (`VmRSS:  1234
/// kB`, `read_bytes: 5678`); 0 where it cannot be read.
fn proc_number(file: &Path, field: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// A process's CPU time so far, user and system, in seconds: its own, and
/// its children's that it has waited for (`/proc/<pid>/stat`, in the
/// kernel's USER_HZ of 100 per second). `pid` may be `self`.
pub fn cpu_seconds_of(pid: &str) -> ProcessCpu {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime, stime,
    // cutime and cstime are the 14th to 17th of the line.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    ProcessCpu {
        own: (ticks(11) + ticks(12)) as f64 / 100.0,
        children: (ticks(13) + ticks(14)) as f64 / 100.0,
    }
}

/// CPU seconds of a process and of its waited-for children.
#[derive(Debug, Clone, Copy)]
pub struct ProcessCpu {
    pub own: f64,
    pub children: f64,
}

/// The CPU time every running `postgres` process (the server, its
/// backends and background workers) has used so far, in seconds.
pub fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .map(|pid| cpu_seconds_of(&pid).own)
        .sum()
}
