//! `surety serve`: one job per intent behind idempotency keys, every try an
//! attempt under the job, failover only to providers the manifest certifies
//! for the job's contract at its current digest.
//!
//! The crate is in layers, lowest first; a module imports only from lower
//! layers (the test in `layers.rs` reads the sources and holds it):
//! `config`, `metrics`, `auth`, `settled` (what everything stands on) →
//! `certification` (what may be served, from the manifest and the
//! configuration now) → `state` (the shared state) → `dispatch` (driving a
//! job's attempts) → `jobs` (intake, wait, retry, cancel; its own errors) →
//! `http` (the API, the facade, the edge) → `ui` (the operator's pages) →
//! `app` (the whole router, and `serve`).
//!
//! Architecture invariant: only this crate knows the HTTP API and its error
//! shape (RFC 9457 problem details, `http/error.rs`).

mod app;
mod auth;
mod certification;
mod config;
mod dispatch;
mod http;
mod jobs;
#[cfg(test)]
mod layers;
mod live;
mod metrics;
mod settled;
mod spend;
mod state;
mod ui;

pub use app::{app, serve};
pub use config::{ApiKey, Listening, RouterConfig};
pub use http::listen::accept_until;
pub use http::{DEDUPLICATION, MAX_HEADER_BYTES, MAX_REQUEST_ID, PROMPT_CERTIFIED, REQUEST_ID};
pub use live::export_cases;
pub use state::{AppState, Inner};
