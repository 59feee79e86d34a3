//! A TEST TOOL: serves a scripted fake LLM provider on loopback.
//!
//! `surety-fake-provider --listen 127.0.0.1:0 --script script.json` prints
//! `listening on http://ADDR` once it accepts connections, then serves until
//! it is stopped.

// A command-line tool: what it prints is its output.
#![expect(
    clippy::print_stdout,
    reason = "a command-line program: its output is its interface"
)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use surety_fake_provider::{FakeProvider, Script};

/// A fault-injecting fake LLM provider (OpenAI and Anthropic wire formats). A test tool.
#[derive(Debug, Parser)]
#[command(name = "surety-fake-provider", version)]
struct Args {
    /// Where to listen; port 0 lets the system pick one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// A JSON script of rules (see the library's `Script`); without one, every answer is `{}`.
    #[arg(long)]
    script: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let script = match &args.script {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str::<Script>(&text)
                .with_context(|| format!("parsing the script {}", path.display()))?
        }
        None => Script::default(),
    };
    let fake = FakeProvider::start_on(args.listen, script)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    println!("listening on http://{}", fake.addr());
    std::io::stdout().flush()?;
    tokio::signal::ctrl_c()
        .await
        .context("waiting for ctrl-c")?;
    Ok(())
}
