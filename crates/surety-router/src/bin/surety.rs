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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() -> Result<()> {
    let Command::Serve { config, log_format } = Cli::parse().command;
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
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading {}", config.display()))?;
    let config =
        RouterConfig::from_toml(&text).with_context(|| format!("in {}", config.display()))?;
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
