//! `surety serve --config surety.toml`: the router.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use surety_router::{AppState, RouterConfig};

#[derive(Debug, Parser)]
#[command(
    name = "surety",
    version,
    about = "One job per intent; failover only to certified providers"
)]
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
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let Command::Serve { config } = Cli::parse().command;
    let text = std::fs::read_to_string(&config)
        .with_context(|| format!("reading {}", config.display()))?;
    let config =
        RouterConfig::from_toml(&text).with_context(|| format!("in {}", config.display()))?;
    let state = AppState::from_config(&config).await?;
    let _background = state.spawn_background();
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "surety serving");
    surety_router::serve(listener, state, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .context("serving")
}
