//! The whole router: the API and the operator's pages behind the edge;
//! `serve`, which runs it on a listener until shutdown and then winds down
//! the work in flight; and the background work of a running router
//! (manifest reloads, lifting demotions a newer certification lifts, the
//! reaper, the reconciler, pruning).

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
    warm_tokenizers(&state).await;
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

/// Loads every provider's tokenizer before the first request where budgets
/// count each attempt's worst case with it: loading an encoding takes a
/// while (o200k's, most of a second here), and the first jobs would
/// otherwise all wait for it.
async fn warm_tokenizers(state: &AppState) {
    if state.inner.spending.budgets.is_empty() {
        return;
    }
    for (id, provider) in &state.inner.providers {
        let started = std::time::Instant::now();
        match provider.tokenizer().await {
            Ok(tokenizer) => {
                tracing::info!(provider = %id, tokenizer = %tokenizer.describe(), ms = started.elapsed().as_millis() as u64, "tokenizer loaded for the budgets' worst cases")
            }
            Err(e) => {
                tracing::warn!(provider = %id, error = %e, "no tokenizer: the budgets' worst cases count a token per byte")
            }
        }
    }
}

/// Settled jobs deleted per write when pruning past retention: a write of
/// a few ms, so the writes queued behind it barely wait.
const PRUNE_BATCH: u32 = 64;

impl AppState {
    /// The background work of a running router: reload the manifest when it
    /// changes, reap the leases of routers that died, and prune settled
    /// jobs past retention.
    pub fn spawn_background(&self) -> tokio::task::JoinHandle<()> {
        let state = self.clone();
        #[expect(
            clippy::disallowed_methods,
            reason = "not a job's work: its handle is the caller's, who stops it at shutdown"
        )]
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n: u64 = 0;
            loop {
                tick.tick().await;
                state.inner.manifest.reload_if_changed();
                // Scheduled re-checks, one (provider, case) pair at a time.
                crate::live::recheck_due(&state);
                n += 1;
                if n.is_multiple_of(4) {
                    // A certification newer than a demotion lifts it: recorded here.
                    crate::live::lift_certified(&state).await;
                    match state.inner.store.reap_expired().await {
                        Ok(reaped) if !reaped.is_empty() => {
                            tracing::warn!(count = reaped.len(), "reaped expired leases")
                        }
                        Ok(_) => {}
                        Err(e) => tracing::error!(error = %e, "reaper failed"),
                    }
                    state.reconcile();
                    crate::live::settle_stale_checks(&state).await;
                }
                // Every tick, so each pass is short (at 500 jobs/s, four
                // batches instead of sixteen back to back every 2 s).
                state.prune().await;
            }
        })
    }

    /// Starts a reconciler's pass on the task tracker (stopped with the
    /// rest of the work at shutdown), unless one is running.
    pub fn reconcile(&self) {
        use std::sync::atomic::Ordering;
        if self.inner.reconciling.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next pass start when this one ends, however it ends.
        struct Done(AppState);
        impl Drop for Done {
            fn drop(&mut self) {
                self.0.inner.reconciling.store(false, Ordering::Release);
            }
        }
        let done = Done(self.clone());
        self.inner.tasks.spawn(async move {
            crate::jobs::reconcile::pass(&done.0).await;
        });
    }

    /// One reconciler's pass, here and now (what the background loop starts
    /// every 2 s); the attempts it resolves settle on tasks of their own.
    pub async fn reconcile_now(&self) {
        crate::jobs::reconcile::pass(self).await;
    }

    /// Deletes the settled jobs past retention, a small batch per write so
    /// the writers' queue never waits long behind it; returns how many went.
    pub async fn prune(&self) -> u64 {
        let mut pruned = 0;
        loop {
            match self
                .inner
                .store
                .prune_settled(self.inner.settings.retention, PRUNE_BATCH)
                .await
            {
                Ok(n) => {
                    pruned += n;
                    self.inner.metrics.pruned_jobs.inc_by(n);
                    if n < u64::from(PRUNE_BATCH) {
                        break;
                    }
                    // Between batches, the jobs being made go first.
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pruning settled jobs failed; the next pass tries again");
                    break;
                }
            }
        }
        if pruned > 0 {
            tracing::info!(
                jobs = pruned,
                retention_s = self.inner.settings.retention.as_secs(),
                "pruned settled jobs past retention"
            );
        }
        pruned
    }
}
