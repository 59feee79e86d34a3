//! surety's automation, run as `cargo xtask <command>`.
//!
//! - `test`: formatting, clippy with warnings denied, and the whole test
//!   suite, PostgreSQL included. The one test command of the README and CI.
//! - `bench store`: the store benchmark (jobs per second against the raw
//!   driver), figures to stdout and to `target/bench/store.json`.
//! - `demo`: the whole of surety on one machine, printed.
//! - `local-provider [install]`: a real model on a real third-party server.
//! - `openapi-extract`: copies the chat-completions schemas out of OpenAI's
//!   OpenAPI document into the tests' data, recording the source commit.

// A command-line tool: what it prints is its output.
#![expect(
    clippy::print_stdout,
    reason = "a command-line program: its output is its interface"
)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

mod local_provider;
mod openapi;
mod plots;
mod profile;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test           cargo fmt --check, cargo clippy -D warnings, and every test (PostgreSQL included)
  bench store    the store benchmark: jobs/s through the store beside the raw driver
  bench router [--compare GIT-REF]
                 the router benchmark: jobs/s and p50/p99 through `surety serve` beside the fake
                 upstream alone, closed and open loop, SQLite and PostgreSQL, router CPU per job
                 and RSS; with --compare, GIT-REF's release build and the work tree's alternate
                 in each cell (ABAB) and the ratios are printed; the report is drawn as SVG
                 charts beside target/bench/router.json
  bench charts [--docs]
                 draws target/bench/router.json again as SVG charts beside it (bench router does
                 so after each run): router-throughput.svg, router-latency.svg and, after
                 --compare, router-compare.svg; with --docs also into docs/figures
  profile router the release router under `bench router`'s closed 64-client cell on SQLite
                 (SURETY_BENCH_ENGINES / SURETY_BENCH_CELLS / SURETY_BENCH_SECS choose another),
                 sampled by Linux perf: target/profile/router.svg (a flame graph) and the
                 functions that take the most of a job's CPU, in µs per job; on PostgreSQL
                 the whole machine, and the server's processes the same way (postgres.svg)
  chaos          faults under load against the release `surety serve` on SQLite and PostgreSQL
                 (crash loop, database outage and full, hostile providers and clients, sustained
                 load): one table, target/chaos/report.json; exit 1 if an acknowledged job was
                 lost or an intent called twice
  demo           from a fresh clone: the local model and fake providers, certified, behind the
                 router on SQLite; a double-click, a mismatched retry and a failover, printed
  certify <provider>|--all [--accept] [--signing-key FILE] [--manifest FILE] ...
                 run every contract the provider is routed for through it (see surety.toml),
                 write certification/manifest.json and reports under target/certify/;
                 exit 0 certified, 1 failed, 2 could not run
  manifest verify [--public-key FILE] [--require-current] [--config surety.toml]
                 check the manifest's signature and whether each entry matches its contract,
                 its rendered prompts and (with --config) the provider's configuration
  manifest keygen --out PREFIX
                 write an ed25519 key pair for signing manifests
  local-provider [install]
                 install (once, into $SURETY_CACHE or ~/.cache/surety) and serve llama-cpp-python
                 with Gemma 3 270M on loopback; `install` installs (rebuilding a cache built with
                 other settings) and proves the server answers a chat completion and a tokenize call
  openapi-extract [--from PATH]
                 extract CreateChatCompletionRequest/Response from OpenAI's OpenAPI document
                 (default ../shared/openai-openapi) into tests/data/openai/";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let root = workspace_root();
    match args.as_slice() {
        ["test"] => test(&root),
        ["bench", "store"] => bench_store(&root),
        ["bench", "router"] => bench_router(&root, None),
        ["bench", "router", "--compare", base] => bench_router(&root, Some(base)),
        ["bench", "charts"] => router_charts(&root, None, true),
        ["bench", "charts", "--docs"] => {
            router_charts(&root, Some(&root.join("docs/figures")), true)
        }
        ["chaos"] => chaos(&root),
        ["profile", "router"] => profile::router(&root),
        ["local-provider"] => {
            local_provider::serve(&local_provider::Paths::new()?, Some(local_port(&root)?))
        }
        ["local-provider", "install"] => local_provider::install(&local_provider::Paths::new()?),
        ["certify", rest @ ..] => certify(&root, rest),
        ["demo"] => demo(&root),
        ["manifest", "verify", rest @ ..] => exit_with(harness(&root, "verify", rest, &[])?),
        ["manifest", "keygen", rest @ ..] => exit_with(harness(&root, "keygen", rest, &[])?),
        ["openapi-extract"] => openapi::extract(&root, &root.join("../shared/openai-openapi")),
        ["openapi-extract", "--from", from] => openapi::extract(&root, Path::new(from)),
        ["bench", other] => bail!("unknown benchmark `{other}`\n\n{USAGE}"),
        ["help" | "--help" | "-h"] | [] => {
            eprintln!("{USAGE}");
            Ok(())
        }
        _ => bail!("unknown command `{}`\n\n{USAGE}", args.join(" ")),
    }
}

/// The checkout `cargo xtask` was run in: `cargo run` says where xtask's
/// manifest is as it runs (the path built in may be another checkout's,
/// when two share a target directory and cargo reused its build).
fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().unwrap_or(&manifest).to_path_buf()
}

fn test(root: &Path) -> Result<()> {
    check_postgres()?;
    cargo(root, &["fmt", "--all", "--check"])
        .context("cargo fmt found unformatted code; run `cargo fmt`")?;
    cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    let paths = local_provider::Paths::new()?;
    let server = match (paths.state(), std::env::var_os("CI").is_some()) {
        (local_provider::InstallState::Installed, _) => Some(local_provider::start(&paths, None)?),
        (state, true) => bail!(
            "the local model server is not installed as this checkout builds it ({state:?}) and CI is set: run `cargo xtask local-provider install`"
        ),
        (state, false) => {
            eprintln!(
                "warning: the local model server is not installed ({state:?}); its tests will be skipped (`cargo xtask local-provider install`)"
            );
            None
        }
    };
    let sdk = local_provider::openai_sdk()?;
    let schemathesis = sdk.with_file_name("st");
    let (sdk, schemathesis) = (sdk.to_string_lossy(), schemathesis.to_string_lossy());
    let pid = server.as_ref().map(|s| s.pid().to_string());
    let mut env: Vec<(&str, &str)> = Vec::new();
    if let (Some(server), Some(pid)) = (&server, &pid) {
        env.push(("SURETY_LOCAL_PROVIDER_URL", server.base_url.as_str()));
        env.push(("SURETY_LOCAL_PROVIDER_PID", pid.as_str()));
    }
    env.push(("SURETY_OPENAI_SDK_PYTHON", &sdk));
    env.push(("SURETY_SCHEMATHESIS", &schemathesis));
    let chromium = chromium()?;
    let chromium = chromium.to_string_lossy();
    env.push(("SURETY_CHROMIUM", &chromium));
    // Anthropic's TypeScript SDK, run by node.
    let node = debian_package("/usr/bin/node", "nodejs", "the suite's node clients")?;
    let npm = debian_package("/usr/bin/npm", "npm", "installing the suite's node clients")?;
    let node_clients = local_provider::node_clients(root, &npm)?;
    let (node, node_clients) = (node.to_string_lossy(), node_clients.to_string_lossy());
    env.push(("SURETY_NODE", &node));
    env.push(("SURETY_NODE_CLIENTS", &node_clients));
    // Where skipped tests say so (`surety_testkit::skipped`), past libtest's capture.
    let skips = target_dir(root).join("test-skips.txt");
    remove_if_present(&skips)?;
    let skips_env = skips.to_string_lossy().into_owned();
    env.push(("SURETY_SKIPS", &skips_env));
    // A snapshot that changed, or a new one, fails until it is reviewed.
    env.push(("INSTA_UPDATE", "no"));
    let tested = cargo_test(root, &["test", "--workspace", "--locked"], &env);
    // A server that died during the run is said first: its tests' failures are that.
    if let Some(notice) = server.as_ref().and_then(local_provider::Server::died) {
        let tested = match &tested {
            Ok((passed, failed)) => format!("{passed} passed, {failed} failed"),
            Err(e) => format!("{e:#}"),
        };
        bail!("{notice}\nthe suite ran against a dead model server ({tested})");
    }
    let (passed, failed) = tested?;
    drop(server);
    let skipped: Vec<String> = std::fs::read_to_string(&skips)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    for skip in &skipped {
        println!("skipped: {skip}");
    }
    println!(
        "tests: {passed} passed, {failed} failed, {} skipped in part or whole",
        skipped.len()
    );
    if passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// `cargo xtask demo`: the local model server, then the demo, which does
/// the rest in one process (see `crates/surety-router/examples/demo.rs`).
fn demo(root: &Path) -> Result<()> {
    let paths = local_provider::Paths::new()?;
    local_provider::ensure_installed(&paths)?;
    let server = local_provider::start(&paths, None)?;
    let url = server.base_url.clone();
    let status = cargo_run(
        root,
        &["-p", "surety-router", "--example", "demo"],
        &[],
        &[
            ("SURETY_LOCAL_PROVIDER_URL", url.as_str()),
            ("RUST_LOG", "warn"),
        ],
    )?;
    if let Some(notice) = server.died() {
        bail!(
            "{notice}\nthe demo's real-model step ran against a dead server: its verdict is not the model's"
        );
    }
    drop(server);
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}

/// `cargo xtask certify`: the harness binary, with the local model server
/// started when `local-gemma` is certified, at the URL `surety.toml` gives
/// it: the certificate is bound to that URL, so `surety serve` with the same
/// file (and `cargo xtask local-provider` serving) routes to the model it
/// certified.
fn certify(root: &Path, args: &[&str]) -> Result<()> {
    let needs_local = args.iter().any(|a| *a == "local-gemma" || *a == "--all");
    let server = match needs_local {
        true => {
            let paths = local_provider::Paths::new()?;
            local_provider::ensure_installed(&paths)?;
            Some(local_provider::start(&paths, Some(local_port(root)?))?)
        }
        false => None,
    };
    let manifest = manifest_path(root, args);
    let before = std::fs::read(&manifest).ok();
    let code = harness(root, "certify", args, &[])?;
    if let Some(notice) = server.as_ref().and_then(local_provider::Server::died) {
        // Its connection resets are not the model's answers: the manifest
        // is put back as it was, and the run could not be made (exit 2).
        match &before {
            Some(bytes) => std::fs::write(&manifest, bytes)
                .with_context(|| format!("restoring {}", manifest.display()))?,
            None => remove_if_present(&manifest)?,
        }
        eprintln!(
            "error: {notice}\nthe certification ran against a dead server; {} is left as it was",
            manifest.display()
        );
        std::process::exit(2);
    }
    // Stop the server before leaving with the harness's status.
    drop(server);
    exit_with(code)
}

/// Removes `path`; one that is not there is already removed.
fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// The manifest `certify` writes: `--manifest FILE`, else the default.
fn manifest_path(root: &Path, args: &[&str]) -> PathBuf {
    let given = args
        .iter()
        .position(|a| *a == "--manifest")
        .and_then(|i| args.get(i + 1))
        .map(|m| m.to_string())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix("--manifest=").map(str::to_owned))
        });
    match given {
        Some(path) => root.join(path),
        None => root.join("certification/manifest.json"),
    }
}

/// The port of `providers.local-gemma.base_url` in `surety.toml`.
fn local_port(root: &Path) -> Result<u16> {
    let path = root.join("surety.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let config: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let url = config
        .get("providers")
        .and_then(|p| p.get("local-gemma"))
        .and_then(|p| p.get("base_url"))
        .and_then(|u| u.as_str())
        .context("surety.toml has no providers.local-gemma.base_url")?;
    url.strip_prefix("http://127.0.0.1:")
        .and_then(|rest| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .with_context(|| {
            format!(
                "providers.local-gemma.base_url is `{url}`; it must be http://127.0.0.1:<port>/v1"
            )
        })
}

fn exit_with(code: i32) -> Result<()> {
    match code {
        0 => Ok(()),
        code => std::process::exit(code),
    }
}

/// Runs `surety-certify <command> <args>` and returns its exit status.
fn harness(root: &Path, command: &str, args: &[&str], extra: &[&str]) -> Result<i32> {
    let mut all = vec![command];
    all.extend_from_slice(args);
    all.extend_from_slice(extra);
    let status = cargo_run(
        root,
        &["-p", "surety-harness", "--bin", "surety-certify"],
        &all,
        &[],
    )?;
    status
        .code()
        .with_context(|| format!("surety-certify was killed ({status})"))
}

/// `cargo run --quiet --locked <target> -- <args>` in the workspace.
fn cargo_run(
    root: &Path,
    target: &[&str],
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<std::process::ExitStatus> {
    Command::new(cargo_bin())
        .current_dir(root)
        .args(["run", "--quiet", "--locked"])
        .args(target)
        .arg("--")
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("could not run cargo run {}", target.join(" ")))
}

/// Runs `cargo test`, passing its output through, and adds up the
/// `test result:` lines of every test binary.
fn cargo_test(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<(u64, u64)> {
    eprintln!("$ cargo {}", args.join(" "));
    let mut child = Command::new(cargo_bin())
        .current_dir(root)
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not run cargo {}", args.join(" ")))?;
    let (mut passed, mut failed) = (0, 0);
    let stdout = child.stdout.take().context("cargo test has no stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test's output")?;
        println!("{line}");
        if let Some(result) = line.strip_prefix("test result: ") {
            passed += count_before(result, " passed");
            failed += count_before(result, " failed");
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    if !status.success() {
        bail!(
            "`cargo {}` failed ({status}): {passed} passed, {failed} failed",
            args.join(" ")
        );
    }
    Ok((passed, failed))
}

/// The number just before `label` in a line like `ok. 12 passed; 0 failed; ...`.
fn count_before(line: &str, label: &str) -> u64 {
    line.split(';')
        .find_map(|part| part.trim().strip_suffix(label.trim_start()))
        .and_then(|n| n.trim_end().rsplit(" ").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn bench_store(root: &Path) -> Result<()> {
    check_postgres()?;
    bench(root, "store", &[])
}

fn bench_router(root: &Path, compare: Option<&str>) -> Result<()> {
    check_postgres()?;
    let dir = target_dir(root).join("bench/bin");
    std::fs::create_dir_all(&dir)?;
    // The base first: every build leaves its binary at `release/surety`, so
    // each is copied aside as soon as it is built.
    let base = match compare {
        None => None,
        Some(git_ref) => Some(base_surety(root, git_ref, &dir)?),
    };
    let head = dir.join("surety-head");
    std::fs::copy(release_surety(root)?, &head).context("copying the release surety aside")?;
    let mut env = vec![
        ("SURETY_BIN", head.clone().into_os_string()),
        ("SURETY_WRK", wrk()?.into_os_string()),
    ];
    if let Some((base, name)) = base {
        if std::fs::read(&base)? == std::fs::read(&head)? {
            bail!("`{name}` builds the very same binary as the work tree: nothing to compare");
        }
        env.push(("SURETY_BASE_BIN", base.into_os_string()));
        env.push(("SURETY_BASE_NAME", name.into()));
    }
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    bench(root, "router", &env)?;
    router_charts(root, None, false)
}

/// Draws `target/bench/router.json` as SVG charts beside it and, given
/// `docs`, into that directory too (docs/figures, which docs/operations.md
/// shows). A report of only the feature cells (`budgets`, `shadow`, …)
/// has nothing to draw: that is an error only when charts were asked for.
fn router_charts(root: &Path, docs: Option<&Path>, asked: bool) -> Result<()> {
    let dir = target_dir(root).join("bench");
    let report_path = dir.join("router.json");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).with_context(|| {
            format!(
                "reading {} (run `cargo xtask bench router` first)",
                report_path.display()
            )
        })?)
        .with_context(|| format!("{} is not JSON", report_path.display()))?;
    if !asked && !plots::drawable(&report) {
        println!("no closed or open cells were run: no charts");
        return Ok(());
    }
    let charts = plots::write(&report, &dir)?;
    print!("{}", plots::tables(&report));
    for path in charts {
        println!("chart: {}", path.display());
        if let Some(docs) = docs {
            let to = docs.join(path.file_name().context("a chart has a file name")?);
            std::fs::create_dir_all(docs)?;
            std::fs::copy(&path, &to).with_context(|| format!("copying to {}", to.display()))?;
            println!("chart: {}", to.display());
        }
    }
    Ok(())
}

/// `surety` as `git_ref` builds it in release: the commit checked out
/// into a worktree under the target directory (made once per commit),
/// built in a target directory of its own, and copied aside. Returns the
/// binary and the commit's short name.
fn base_surety(root: &Path, git_ref: &str, dir: &Path) -> Result<(PathBuf, String)> {
    let rev = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--verify", "--short=12"])
        .arg(format!("{git_ref}^{{commit}}"))
        .output()
        .context("git rev-parse")?;
    if !rev.status.success() {
        bail!("`{git_ref}` names no commit here");
    }
    let rev = String::from_utf8_lossy(&rev.stdout).trim().to_owned();
    let tree = target_dir(root).join("bench/compare").join(&rev);
    if !tree.join("Cargo.toml").is_file() {
        let _ = std::fs::remove_dir_all(&tree);
        let _ = Command::new("git")
            .current_dir(root)
            .args(["worktree", "prune"])
            .status();
        let added = Command::new("git")
            .current_dir(root)
            .args(["worktree", "add", "--detach"])
            .arg(&tree)
            .arg(&rev)
            .status()
            .context("git worktree add")?;
        if !added.success() {
            bail!("could not check out {rev} into {}", tree.display());
        }
    }
    eprintln!(
        "building {rev} ({git_ref}) in release from {}",
        tree.display()
    );
    // A target directory per commit: two trees' crates have the same names
    // and versions, and cargo mixes their artifacts in one directory (a
    // base built after another base failed against that one's crates).
    let target = target_dir(root).join("bench/compare-target").join(&rev);
    let status = Command::new(cargo_bin())
        .current_dir(&tree)
        .args(BUILD_SURETY)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .context("building the base")?;
    if !status.success() {
        bail!("{rev} does not build ({status})");
    }
    let out = dir.join(format!("surety-{rev}"));
    std::fs::copy(target.join("release/surety"), &out).context("copying the base surety aside")?;
    Ok((out, rev))
}

fn chaos(root: &Path) -> Result<()> {
    check_postgres()?;
    let surety = release_surety(root)?;
    let out = root.join("target/chaos/report.json");
    bench(
        root,
        "chaos",
        &[
            ("SURETY_BIN", surety.as_os_str()),
            ("SURETY_CHAOS_OUT", out.as_os_str()),
        ],
    )
}

/// `cargo build` of the `surety` binary in release.
const BUILD_SURETY: [&str; 7] = [
    "build",
    "--release",
    "--locked",
    "-p",
    "surety-router",
    "--bin",
    "surety",
];

/// Builds `surety` in release and returns its path.
pub(crate) fn release_surety(root: &Path) -> Result<PathBuf> {
    cargo(root, &BUILD_SURETY)?;
    Ok(target_dir(root).join("release/surety"))
}

/// Debian's Chromium, for the tests that look at pages in a real browser.
fn chromium() -> Result<PathBuf> {
    debian_package("/usr/bin/chromium", "chromium", "the browser tests")
}

/// `wrk`, the load generator of `bench router`'s closed-loop cells (C,
/// event-driven: it costs the two cores far less per request than the
/// router does, so the cells measure the router).
pub(crate) fn wrk() -> Result<PathBuf> {
    debian_package("/usr/bin/wrk", "wrk", "bench router's load")
}

/// `path`, installed from Debian's `package` when it is missing (nothing
/// is downloaded from anywhere else).
fn debian_package(path: &str, package: &str, why: &str) -> Result<PathBuf> {
    let path = PathBuf::from(path);
    if path.is_file() {
        return Ok(path);
    }
    eprintln!("installing Debian's {package} for {why}");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    if !install().is_ok_and(|s| s.success()) {
        let updated = Command::new("apt-get").arg("update").status();
        if !updated.is_ok_and(|s| s.success()) || !install().is_ok_and(|s| s.success()) {
            bail!("could not install Debian's {package} (apt-get install {package})");
        }
    }
    Ok(path)
}

pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Runs `benches/<name>.rs` of the tests package; its figures go to `target/bench/<name>.json`.
pub(crate) fn bench(root: &Path, name: &str, env: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
    let out = target_dir(root).join("bench").join(format!("{name}.json"));
    let status = Command::new(cargo_bin())
        .current_dir(root)
        .args(["bench", "--locked", "-p", "surety-tests", "--bench", name])
        .env("SURETY_BENCH_OUT", &out)
        .envs(env.iter().copied())
        .status()
        .context("could not run cargo bench")?;
    if !status.success() {
        bail!("the {name} benchmark failed ({status})");
    }
    Ok(())
}

/// The PostgreSQL the tests use must answer when CI is set; elsewhere a
/// missing one is reported, and the tests say what they skipped.
fn check_postgres() -> Result<()> {
    let url = std::env::var("SURETY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let reachable = postgres_addr(&url)
        .map(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(3)).is_ok())
        .unwrap_or(false);
    match (reachable, std::env::var_os("CI").is_some()) {
        (true, _) => Ok(()),
        (false, true) => bail!(
            "PostgreSQL is not reachable at {} and CI is set: the store suite needs it",
            redact(&url)
        ),
        (false, false) => {
            eprintln!(
                "warning: PostgreSQL is not reachable at {}; its tests will be skipped (set CI to make this an error)",
                redact(&url)
            );
            Ok(())
        }
    }
}

/// host:port of a postgres:// URL.
fn postgres_addr(url: &str) -> Option<SocketAddr> {
    let rest = url.split("://").nth(1)?;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let with_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    with_port.to_socket_addrs().ok()?.next()
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}@{}", &url[..scheme_end + 3], user, &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(cargo_bin())
        .current_dir(root)
        .args(args)
        .status()
        .with_context(|| format!("could not run cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tidy {
    //! What every source file of the workspace keeps, read from the tree.

    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() && !name.starts_with('.') && name != "target" {
                rust_files(&path, out);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    /// Every Rust file of the workspace.
    fn workspace_files() -> Vec<PathBuf> {
        let root = super::workspace_root();
        let mut files = Vec::new();
        for dir in ["crates", "tests", "xtask"] {
            rust_files(&root.join(dir), &mut files);
        }
        assert!(files.len() > 50, "the tree was read: {} files", files.len());
        files
    }

    /// A lint is silenced only with `#[expect(…, reason = "…")]`: the
    /// reason is written down, and the compiler says when it no longer
    /// applies. `text`'s offences, by line.
    fn silenced_without_reason(text: &str) -> Vec<usize> {
        let mut offences = Vec::new();
        let allow = concat!("#", "[allow(");
        let inner_allow = concat!("#!", "[allow(");
        let expect = concat!("#", "[expect(");
        let inner_expect = concat!("#!", "[expect(");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let line = line.trim_start();
            if line.starts_with(allow) || line.starts_with(inner_allow) {
                offences.push(i + 1);
            } else if line.starts_with(expect) || line.starts_with(inner_expect) {
                // The attribute runs to its `)]`, on this line or a later one.
                let attribute: String = lines[i..]
                    .iter()
                    .take_while(|l| !l.trim_end().ends_with(")]"))
                    .chain(lines[i..].iter().find(|l| l.trim_end().ends_with(")]")))
                    .copied()
                    .collect();
                if !attribute.contains("reason = ") {
                    offences.push(i + 1);
                }
            }
        }
        offences
    }

    #[test]
    fn every_silenced_lint_says_why() {
        let allowed = format!(
            "{}clippy::unwrap_used)]\nfn f() {{}}\n",
            concat!("#", "[allow(")
        );
        let reasonless = format!(
            "{}\n    clippy::unwrap_used,\n)]\n",
            concat!("#!", "[expect(")
        );
        let said = format!(
            "{}\n    clippy::unwrap_used,\n    reason = \"why\"\n)]\n",
            concat!("#", "[expect(")
        );
        assert_eq!(silenced_without_reason(&allowed), [1]);
        assert_eq!(silenced_without_reason(&reasonless), [1]);
        assert_eq!(silenced_without_reason(&said), Vec::<usize>::new());
        let offences: Vec<String> = workspace_files()
            .iter()
            .flat_map(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                silenced_without_reason(&text)
                    .into_iter()
                    .map(move |line| format!("{}:{line}", f.display()))
            })
            .collect();
        assert!(
            offences.is_empty(),
            "lints silenced with `allow`, or without a reason (use `#[expect(lint, reason = \"…\")]`): {offences:#?}"
        );
    }

    /// Every Rust file opens with a `//!` line saying what it is for.
    #[test]
    fn every_source_file_says_what_it_is_for() {
        let files = workspace_files();
        let silent: Vec<String> = files
            .iter()
            .filter(|f| {
                !std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .starts_with("//!")
            })
            .map(|f| f.display().to_string())
            .collect();
        assert!(
            silent.is_empty(),
            "files without a `//!` first line: {silent:#?}"
        );
    }
}
