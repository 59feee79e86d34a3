//! `surety serve --config surety.toml`: the router.
//!
//! Logs go to stderr (ANSI colours only on a terminal), as text or, with
//! `--log-format json`, one JSON object per line. SIGTERM and SIGINT shut it
//! down gracefully (see `surety_router::serve`) and it exits 0.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use surety_router::{AppState, RouterConfig};

/// mimalloc, not glibc's malloc: under load the router's allocations and
/// frees took about a sixth of its CPU (`cargo xtask profile router`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
/// One job per intent; failover only to certified providers.
#[command(name = "surety", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve {
        #[arg(long, default_value = "surety.toml")]
        config: PathBuf,
        /// How log lines are written to stderr.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Contract cases from production, for a person to review.
    Cases {
        #[command(subcommand)]
        command: CasesCommand,
    },
}

#[derive(Debug, Subcommand)]
enum CasesCommand {
    /// Write the inputs on which a route's fallbacks broke the contract or
    /// disagreed as proposed cases (`cases.toml`'s format).
    Export {
        #[arg(long, default_value = "surety.toml")]
        config: PathBuf,
        #[arg(long)]
        route: String,
        /// Only results recorded since this time (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Only `broke` or only `disagreed` (default: both).
        #[arg(long, value_enum)]
        outcome: Option<Outcome>,
        /// The file to write (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Outcome {
    Broke,
    Disagreed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn read_config(path: &PathBuf) -> Result<RouterConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    RouterConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))
}

/// `surety cases export`.
async fn export(
    config: &PathBuf,
    route: &str,
    since: Option<&str>,
    outcome: Option<Outcome>,
    out: Option<&PathBuf>,
) -> Result<()> {
    let config = read_config(config)?;
    let since_ms = match since {
        None => 0,
        Some(text) => {
            let at = surety_manifest::parse_time(text)
                .with_context(|| format!("`--since {text}` is not an RFC 3339 time"))?;
            i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
        }
    };
    let outcome = outcome.map(|o| match o {
        Outcome::Broke => surety_store::LiveOutcome::Broke,
        Outcome::Disagreed => surety_store::LiveOutcome::Disagreed,
    });
    let cases = surety_router::export_cases(&config, route, since_ms, outcome).await?;
    match out {
        Some(path) => {
            std::fs::write(path, cases).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            use std::io::Write;
            std::io::stdout()
                .write_all(cases.as_bytes())
                .context("writing the cases")
        }
    }
}

fn main() -> Result<()> {
    let (config, log_format) = match Cli::parse().command {
        Command::Serve { config, log_format } => (config, log_format),
        Command::Cases {
            command:
                CasesCommand::Export {
                    config,
                    route,
                    since,
                    outcome,
                    out,
                },
        } => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            return runtime.block_on(export(
                &config,
                &route,
                since.as_deref(),
                outcome,
                out.as_ref(),
            ));
        }
    };
    let filter =
        || tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    match log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(filter())
            .with_writer(std::io::stderr)
            .init(),
    }
    let config = read_config(&config)?;
    let runtime = config.runtime().context("starting the runtime")?;
    runtime.block_on(serve(config))
}

/// `surety serve`: until SIGINT or SIGTERM.
async fn serve(config: RouterConfig) -> Result<()> {
    let state = AppState::from_config(&config).await?;
    let background = state.spawn_background();
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "surety serving");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let result = surety_router::serve(listener, state, async move {
        let signal = tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        };
        tracing::info!(signal, "shutdown asked for");
    })
    .await
    .context("serving");
    background.abort();
    result
}
