//! A proxy that keeps nothing, for `bench router`: the floor under the
//! router's figures on the same machine.
//!
//! It starts as `surety serve` does (`serve --config <surety.toml>`, and
//! the same `surety serving addr=…` line on stderr once it listens), and
//! forwards every request's body to `{base_url}/chat/completions` of the
//! first provider of the config's first route, answering with what came
//! back. No key, no job, no database, no check, not even a parse: what it
//! adds on the same machine, beside what the router adds, is what any
//! proxy stands on there. It is built of the router's own pieces, so the
//! difference is the router's own work: its accept loop
//! (`surety_router::accept_until`, on the main thread, with
//! the config's connection limit and header timeout), its provider client
//! (`surety_providers::pooled_client`), its runtime
//! (`RouterConfig::runtime`) and its allocator.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: surety-null-proxy serve --config <surety.toml>";

/// Where every request goes.
#[derive(Clone)]
struct Upstream {
    client: reqwest::Client,
    url: Arc<str>,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [command, flag, path] = args.as_slice() else {
        bail!(USAGE);
    };
    if command != "serve" || flag != "--config" {
        bail!(USAGE);
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let config = surety_router::RouterConfig::from_toml(&text)?;
    let provider = config
        .routes
        .values()
        .next()
        .and_then(|route| route.providers.first())
        .and_then(|id| config.providers.get(id))
        .context("the config names no route with a provider")?;
    let upstream = Upstream {
        client: surety_providers::pooled_client(provider)?,
        url: format!("{}/chat/completions", provider.base_url).into(),
    };
    // The router's own runtime, sized as it sizes it.
    config.runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        eprintln!("surety serving addr={}", listener.local_addr()?);
        let app = axum::Router::new()
            .fallback(axum::routing::post(forward))
            .with_state(upstream);
        let listening = config.settings.listening;
        // Until the benchmark kills it.
        let shutdown = std::future::pending();
        surety_router::accept_until(listener, app, listening, shutdown).await;
        Ok(())
    })
}

/// The body, sent on as it came; the answer, back as it came.
async fn forward(State(upstream): State<Upstream>, body: Bytes) -> Response {
    let answered = async {
        let answer = upstream
            .client
            .post(&*upstream.url)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        let status = answer.status();
        Ok::<_, reqwest::Error>((status, answer.bytes().await?))
    };
    match answered.await {
        Ok((status, bytes)) => {
            (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
