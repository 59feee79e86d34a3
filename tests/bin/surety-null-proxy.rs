//! A proxy that keeps nothing, for `bench router`: the floor under the
//! router's figures on the same machine.
//!
//! It starts as `surety serve` does (`serve --config <surety.toml>`, and
//! the same `surety serving addr=…` line on stderr once it listens), and
//! forwards every request's body to `{base_url}/chat/completions` of the
//! first provider of the config's first route, answering with what came
//! back. No key, no job, no database, no check, not even a parse: what it
//! adds on the same machine, beside what the router adds, is what any
//! proxy stands on there. It is built as the router is, so the difference
//! is the router's own work: the same HTTP server and client (hyper under
//! axum, an HTTP/1.1 connection task per client, `TCP_NODELAY`, the accept
//! loop on the main thread; reqwest with a pool), the same runtime (built
//! by `RouterConfig::runtime`), the same allocator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

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
        // As the router's provider client is built (`surety_providers::http`).
        client: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(config.settings.attempt_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()?,
        url: format!("{}/chat/completions", provider.base_url).into(),
    };
    // The router's own runtime, sized as it sizes it.
    config.runtime()?.block_on(serve(config.listen, upstream))
}

/// Accepts connections on `listen` and serves each on a task of its own.
async fn serve(listen: SocketAddr, upstream: Upstream) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("surety serving addr={}", listener.local_addr()?);
    let app = axum::Router::new()
        .fallback(axum::routing::post(forward))
        .with_state(upstream);
    let builder = http1::Builder::new();
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
}

/// The body, sent on as it came; the answer, back as it came.
async fn forward(State(upstream): State<Upstream>, body: Bytes) -> Response {
    let sent = upstream
        .client
        .post(&*upstream.url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let answered = match sent {
        Ok(answer) => {
            let status = answer.status();
            answer.bytes().await.map(|bytes| (status, bytes))
        }
        Err(e) => Err(e),
    };
    match answered {
        Ok((status, bytes)) => {
            (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
