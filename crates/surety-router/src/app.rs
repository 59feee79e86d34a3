//! The whole router: the API and the operator's pages behind the edge,
//! and `serve`, which runs it on a listener until shutdown and then winds
//! down the work in flight.

use std::time::Duration;

use axum::Router;

use crate::state::AppState;

/// The router: the API's routes and the operator's pages, behind the
/// edge's limits.
pub fn app(state: AppState) -> Router {
    crate::http::app(state, crate::ui::routes())
}

/// Serves the API on `listener` until `shutdown` completes, then shuts
/// down gracefully: no new connections; in-flight attempts get
/// `shutdown_grace` to finish; those still waiting on a provider then become
/// `unknown` (the provider may have done the work), so nothing is left
/// `started` for a reaper to find later. Each step is logged.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listening = state.inner.settings.listening;
    let connections =
        crate::http::listen::accept_until(listener, app(state.clone()), listening, shutdown).await;
    // No new connections; open ones finish their request and close.
    let closed = connections.shutdown();
    let grace = state.inner.settings.shutdown_grace;
    let open = state.in_flight().len();
    tracing::info!(
        in_flight = open,
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections; waiting for in-flight attempts"
    );
    let work = &state.inner.tasks;
    work.close();
    if tokio::time::timeout(grace, work.wait()).await.is_err() {
        let left = state.in_flight();
        tracing::warn!(
            attempts = left.len(),
            "shutdown grace period over: the attempts still waiting on a provider become unknown"
        );
        for handle in left {
            let reason = "the router shut down before the provider answered; the provider may have done the work";
            if let Err(e) = state.inner.store.mark_unknown(&handle, reason).await {
                tracing::error!(job_id = %handle.job_id, attempt = handle.ordinal, error = %e, "could not mark the attempt unknown");
            }
        }
    }
    // Answers already on their way get a moment to leave.
    let _ = tokio::time::timeout(Duration::from_millis(500), closed).await;
    tracing::info!("shut down");
    Ok(())
}
