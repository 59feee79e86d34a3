//! The operator's pages (`/ui`): what an on-call engineer opens to find
//! the jobs that need a person. Rendered on the server with minijinja
//! (templates named `.html`, so every value is escaped, model output
//! included); they read with JavaScript off. Only admin API keys sign in,
//! and what a browser keeps is a session (`session.rs`): a random token in
//! an HttpOnly, SameSite=Strict cookie for `/ui` alone, never the key; every
//! form that changes something carries the session's CSRF token. Every view
//! is scoped to the admin's owner, or to every owner for a key marked
//! `all_owners`.
//!
//! These are pages, not API: they are not in `/openapi.json`, and this is
//! the one module that registers routes with `.route(`.

mod actions;
mod pages;
mod session;
mod views;

use std::sync::OnceLock;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};

use crate::state::AppState;

use actions::{cancel, confirm_cancel, confirm_reinstate, confirm_retry, reinstate, retry};
use pages::{certification, job_page, live_page, queue};
use session::{sign_in, sign_in_page, sign_out};

pub(super) const COOKIE: &str = "surety_operator";
/// The sign-in form's token, for the sign-in path alone.
pub(super) const SIGN_IN_COOKIE: &str = "surety_sign_in";
/// The longest a job's page waits for the job to come to rest.
pub(super) const MAX_WAIT_S: u64 = 30;
/// Jobs listed per section of the attention queue.
pub(super) const QUEUE_LENGTH: u32 = 50;

/// The pages' routes, merged into the router by `app`.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(queue))
        .route("/ui/sign-in", get(sign_in_page).post(sign_in))
        .route("/ui/sign-out", post(sign_out))
        .route("/ui/jobs/{id}", get(job_page))
        .route("/ui/certification", get(certification))
        .route("/ui/certification/{provider}/{contract}", get(live_page))
        .route(
            "/ui/certification/{provider}/{contract}/reinstate",
            get(confirm_reinstate).post(reinstate),
        )
        .route(
            "/ui/jobs/{id}/attempts/{n}/cancel",
            get(confirm_cancel).post(cancel),
        )
        .route("/ui/jobs/{id}/retry", get(confirm_retry).post(retry))
        // The pages' forms are a key or a token: a few bytes, never more.
        .layer(axum::extract::DefaultBodyLimit::max(FORM_LIMIT))
}

/// The most bytes a page's form may send.
const FORM_LIMIT: usize = 8 * 1024;

fn templates() -> &'static minijinja::Environment<'static> {
    static ENV: OnceLock<minijinja::Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = minijinja::Environment::new();
        for (name, source) in [
            ("base.html", include_str!("base.html")),
            ("sign_in.html", include_str!("sign_in.html")),
            ("queue.html", include_str!("queue.html")),
            ("job.html", include_str!("job.html")),
            ("certification.html", include_str!("certification.html")),
            ("live.html", include_str!("live.html")),
            ("confirm.html", include_str!("confirm.html")),
        ] {
            // The templates are part of the binary; a broken one fails every test.
            if let Err(e) = env.add_template(name, source) {
                tracing::error!(template = name, error = %e, "an operator page does not parse");
            }
        }
        env
    })
}

/// Renders `name` with `context`, as `status`.
pub(super) fn page(status: StatusCode, name: &str, context: impl serde::Serialize) -> Response {
    let rendered = templates()
        .get_template(name)
        .and_then(|t| t.render(context));
    match rendered {
        Ok(body) => {
            let mut response = (status, Html(body)).into_response();
            let headers = response.headers_mut();
            // No script runs here, and nothing frames the page.
            headers.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(
                    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'",
                ),
            );
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            headers.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            headers.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            );
            headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
            response
        }
        Err(e) => {
            tracing::error!(template = name, error = %e, "an operator page did not render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page did not render; the details are in the log",
            )
                .into_response()
        }
    }
}
