//! The router's accept loop, so hostile clients cannot starve the rest:
//! at most `max_connections` connections are open at once (past it, new
//! ones wait in the kernel's backlog until one closes), and a client gets
//! `request_read_timeout` to send a request's headers — an idle keep-alive
//! connection too — before its connection is closed (slowloris, idle
//! floods). The whole body then has the same time, however its bytes are
//! paced ([`DeadlineBody`], laid over every request in `app`). On shutdown, the loop stops accepting and hands back the
//! handle that closes every open connection gracefully.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use crate::config::Listening;

/// The address a request's connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub std::net::IpAddr);

/// Accepts connections on `listener` and serves `app` on each until
/// `shutdown` completes; returns the handle that closes them.
pub async fn accept_until(
    listener: tokio::net::TcpListener,
    app: Router,
    listening: Listening,
    shutdown: impl Future<Output = ()>,
) -> GracefulShutdown {
    let permits = Arc::new(Semaphore::new(listening.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    // HTTP/1.1 only: the clients of an HTTP API speak it, and telling
    // HTTP/2 apart first would read the connection with no timeout at all.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(listening.request_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut at_limit = false;
    loop {
        if permits.available_permits() == 0 && !at_limit {
            tracing::warn!(
                max_connections = listening.max_connections,
                "the connection limit is reached: new connections wait until one closes"
            );
        }
        at_limit = permits.available_permits() == 0;
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => (stream, peer),
                Err(e) => {
                    // Out of file descriptors, or a connection reset before
                    // it was taken: the listener itself is fine.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let (stream, peer) = stream;
        let _ = stream.set_nodelay(true);
        // Each request knows the address it came from (`Peer`).
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            app.clone(),
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(Peer(peer.ip()));
                request
            },
        ));
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        #[expect(
            clippy::disallowed_methods,
            reason = "a connection, not a job's work: `graceful` watches it, and shutdown closes it"
        )]
        tokio::spawn(async move {
            // An error here is the client's: it went away, or was too slow.
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a connection ended with an error");
            }
            drop(permit);
        });
    }
    graceful
}

/// How long accepting pauses after it failed (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A request body with a deadline for all of it: past `deadline` the next
/// read fails, however recently a byte arrived.
pub(crate) struct DeadlineBody {
    inner: axum::body::Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl DeadlineBody {
    pub(crate) fn new(
        inner: axum::body::Body,
        deadline: tokio::time::Instant,
        limit: Duration,
    ) -> DeadlineBody {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            limit,
        }
    }
}

/// The body did not arrive within its time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive whole within {0:?}")]
pub(crate) struct BodyTooSlow(Duration);

impl http_body::Body for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.deadline.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Some(Err(axum::Error::new(BodyTooSlow(this.limit)))));
        }
        std::pin::Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
