//! The operator's pages (`/ui`): what an on-call engineer opens to find
//! the jobs that need a person. Rendered on the server with minijinja
//! (templates named `.html`, so every value is escaped, model output
//! included); they read with JavaScript off. Only admin API keys sign in;
//! the key is kept in an HttpOnly, SameSite=Strict cookie for `/ui` alone,
//! and every form that changes something carries a token derived from it.
//! Every view is scoped to the admin's owner.
//!
//! These are pages, not API: they are not in `/openapi.json`, and this is
//! the one module that registers routes with `.route(`.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use surety_core::{AttemptState, JobState};
use surety_store::{JobId, OwnerId};

use crate::AppState;
use crate::error::ApiError;
use crate::extract::job_id;

const COOKIE: &str = "surety_operator";
/// The sign-in form's token, for the sign-in path alone.
const SIGN_IN_COOKIE: &str = "surety_sign_in";
/// The longest a job's page waits for the job to come to rest.
const MAX_WAIT_S: u64 = 30;
/// Jobs listed per section of the attention queue.
const QUEUE_LENGTH: u32 = 50;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(queue))
        .route("/ui/sign-in", get(sign_in_page).post(sign_in))
        .route("/ui/sign-out", post(sign_out))
        .route("/ui/jobs/{id}", get(job_page))
        .route("/ui/certification", get(certification))
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
            ("base.html", include_str!("ui/base.html")),
            ("sign_in.html", include_str!("ui/sign_in.html")),
            ("queue.html", include_str!("ui/queue.html")),
            ("job.html", include_str!("ui/job.html")),
            ("certification.html", include_str!("ui/certification.html")),
            ("confirm.html", include_str!("ui/confirm.html")),
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
fn page(status: StatusCode, name: &str, context: Value) -> Response {
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

/// A signed-in admin.
struct Operator {
    /// The session's token, as its cookie carries it.
    token: String,
    /// The session, whose CSRF token every form that changes something
    /// must carry.
    session: crate::session::Session,
    owner: OwnerId,
    /// Whose jobs the pages show: the key's owner's, or (`None`) every
    /// owner's, for a key marked `all_owners`.
    scope: Option<OwnerId>,
}

impl Operator {
    fn view(&self) -> Value {
        let scope = match &self.scope {
            Some(owner) => owner.0.clone(),
            None => "every owner".to_owned(),
        };
        json!({"owner": self.owner.0, "scope": scope, "csrf": self.session.csrf})
    }

    /// The owner of `job_id` this operator may see: the scope's, or the
    /// job's own for an operator of every owner.
    async fn owner_of(&self, state: &AppState, job_id: &JobId) -> Result<OwnerId, ApiError> {
        match &self.scope {
            Some(owner) => Ok(owner.clone()),
            None => Ok(state.inner.store.owner_of(job_id).await?),
        }
    }
}

/// The value of the cookie `name` a request carries, if it carries one.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(name)?.strip_prefix('='))
}

/// The signed-in admin whose session the request's cookie names: an open,
/// unexpired session of a key that is still an admin's.
fn operator(state: &AppState, headers: &HeaderMap) -> Option<Operator> {
    let token = cookie(headers, COOKIE)?;
    let session = state.inner.sessions.get(token)?;
    let found = state
        .inner
        .api_keys
        .get(&session.key_hash)
        .filter(|k| k.admin)?;
    let owner = OwnerId(found.owner.clone());
    Some(Operator {
        token: token.to_owned(),
        scope: (!found.all_owners).then(|| owner.clone()),
        owner,
        session,
    })
}

/// `Set-Cookie` for `name=value` under `path`, for `max_age` (0: forget it).
fn set_cookie(
    state: &AppState,
    name: &str,
    value: &str,
    path: &str,
    max_age: u64,
) -> Option<HeaderValue> {
    let secure = if state.inner.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .ok()
}

fn to_sign_in() -> Response {
    Redirect::to("/ui/sign-in").into_response()
}

/// The sign-in page, with a form token also set in a cookie for the
/// sign-in path: a sign-in is taken only from this page's form (no other
/// site can sign a browser in under a key of its choosing).
async fn sign_in_page(State(state): State<AppState>) -> Response {
    sign_in_form(&state, StatusCode::OK, None)
}

fn sign_in_form(state: &AppState, status: StatusCode, error: Option<&str>) -> Response {
    let token = crate::session::random_token();
    let mut response = page(
        status,
        "sign_in.html",
        json!({"error": error, "csrf": token}),
    );
    if let Some(value) = set_cookie(state, SIGN_IN_COOKIE, &token, "/ui/sign-in", 600) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[derive(Deserialize)]
struct SignIn {
    key: String,
    #[serde(default)]
    csrf: String,
}

async fn sign_in(
    State(state): State<AppState>,
    peer: Option<axum::Extension<crate::listen::Peer>>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    let peer = peer.map(|axum::Extension(p)| p.0);
    if let Some(wait) = peer.and_then(|p| state.inner.failures.blocked(p)) {
        return crate::extract::too_many_failures(wait).into_response();
    }
    let expected = cookie(&headers, SIGN_IN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !crate::session::same_token(expected, &form.csrf) {
        return sign_in_form(
            &state,
            StatusCode::FORBIDDEN,
            Some("This sign-in form was not this page's, or it is stale: sign in again here."),
        );
    }
    let refused = match crate::extract::api_key(&state, &form.key) {
        None => Err((StatusCode::UNAUTHORIZED, "That key is not known here.")),
        Some((_, k)) if !k.admin => Err((
            StatusCode::FORBIDDEN,
            "That key is not an admin key: only admins sign in here.",
        )),
        Some((hash, _)) => Ok(hash),
    };
    let hash = match refused {
        Ok(hash) => hash,
        Err((status, error)) => {
            if let Some(peer) = peer {
                state.inner.failures.failed(peer);
            }
            return sign_in_form(&state, status, Some(error));
        }
    };
    let token = state.inner.sessions.start(&hash);
    let mut response = Redirect::to("/ui").into_response();
    let ttl = state.inner.sessions.ttl().as_secs().max(1);
    for value in [
        set_cookie(&state, COOKIE, &token, "/ui", ttl),
        set_cookie(&state, SIGN_IN_COOKIE, "", "/ui/sign-in", 0),
    ]
    .into_iter()
    .flatten()
    {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

#[derive(Deserialize)]
struct Token {
    /// Missing is refused as any other token that does not match.
    #[serde(default)]
    csrf: String,
}

async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<Token>,
) -> Response {
    let op = match acting(&state, &headers, &form) {
        Ok(op) => op,
        Err(refused) => return refused.into_response(),
    };
    // The session ends here: a copy of its cookie opens nothing after.
    state.inner.sessions.end(&op.token);
    let mut response = to_sign_in();
    if let Some(value) = set_cookie(&state, COOKIE, "", "/ui", 0) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `ms` as `2 h 5 m`, `3 m 12 s` or `41 s`.
fn age(ms: i64) -> String {
    let s = Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0)).as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} m {} s", s / 60, s % 60),
        _ => format!("{} h {} m", s / 3600, s % 3600 / 60),
    }
}

fn when(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map(surety_manifest::now_rfc3339)
        .unwrap_or_default()
}

async fn queue(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(op) = operator(&state, &headers) else {
        return to_sign_in();
    };
    let (unknown, failed) = match state
        .inner
        .store
        .attention(op.scope.as_ref(), QUEUE_LENGTH)
        .await
    {
        Ok(lists) => lists,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let now = now_ms();
    let rows = |jobs: &[surety_store::Job]| -> Vec<Value> {
        jobs.iter()
            .map(|j| json!({"id": j.id.0, "age": age(now - j.updated_at_ms), "route": j.route}))
            .collect()
    };
    let (mut unknown_rows, mut failed_rows) = (rows(&unknown), rows(&failed));
    // What is known: the last attempt's provider and error.
    for (rows, jobs) in [(&mut unknown_rows, &unknown), (&mut failed_rows, &failed)] {
        for (row, job) in rows.iter_mut().zip(jobs.iter()) {
            if let Ok(attempts) = state.inner.store.attempts(&job.owner, &job.id).await
                && let Some(last) = attempts.last()
            {
                row["provider"] = json!(last.provider);
                row["known"] = json!(last.error.clone().unwrap_or_default());
            }
        }
    }
    let m = &state.inner.metrics;
    let figures = json!([
        {"name": "jobs created (this router)", "value": m.jobs_created.get()},
        {"name": "replays answered", "value": m.replays.get()},
        {"name": "late results discarded", "value": m.late_results_discarded.get()},
        {"name": "answers held while the database was away", "value": m.results_held.get()},
        {"name": "jobs pruned past retention", "value": m.pruned_jobs.get()},
    ]);
    let by_state = state
        .inner
        .store
        .jobs_by_state(op.scope.as_ref())
        .await
        .unwrap_or_default();
    let by_state: Vec<Value> = by_state
        .iter()
        .map(|(state, n)| json!({"state": state, "count": n}))
        .collect();
    // Attempts by provider and outcome, as this router counted them.
    let mut attempts = Vec::new();
    for family in prometheus::core::Collector::collect(&m.attempts) {
        for metric in family.get_metric() {
            let label = |name: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map_or("", |l| l.value())
                    .to_owned()
            };
            attempts.push(json!({
                "provider": label("provider"),
                "outcome": label("outcome"),
                "count": metric.get_counter().get_value() as u64,
            }));
        }
    }
    page(
        StatusCode::OK,
        "queue.html",
        json!({
            "operator": op.view(), "unknown": unknown_rows, "failed": failed_rows,
            "figures": figures, "by_state": by_state, "attempts": attempts,
        }),
    )
}

#[derive(Deserialize)]
struct JobQuery {
    /// Seconds to wait for the job to come to rest first (after a retry).
    wait: Option<u64>,
}

async fn job_page(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<JobQuery>,
) -> Response {
    let id = match job_id(&id) {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    let Some(op) = operator(&state, &headers) else {
        return to_sign_in();
    };
    let owner = match op.owner_of(&state, &id).await {
        Ok(owner) => owner,
        Err(e) => return e.into_response(),
    };
    let found = match query.wait {
        Some(seconds) => match state.inner.store.job(&owner, &id).await {
            Ok(job) => {
                let seen = crate::service::CreatedJob {
                    job,
                    replayed: true,
                    waiter: Some(state.inner.settled.watch(&id)),
                };
                let limit = Duration::from_secs(seconds.min(MAX_WAIT_S));
                crate::service::wait_at_rest(&state, &owner, seen, limit)
                    .await
                    .map(|(_, job, attempts)| (job, attempts))
            }
            Err(e) => Err(e.into()),
        },
        None => state
            .inner
            .store
            .job_and_attempts(&owner, &id)
            .await
            .map_err(Into::into),
    };
    let (job, attempts) = match found {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let races = state
        .inner
        .store
        .races(&owner, &id)
        .await
        .unwrap_or_default();
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let attempts: Vec<Value> = attempts
        .iter()
        .map(|a| {
            let ended = a.finished_at_ms.or(a.unknown_since_ms);
            json!({
                "ordinal": a.ordinal,
                "hedge": a.slot == surety_store::Slot::Hedge,
                "provider": a.provider,
                "state": a.state.as_str(),
                "started": when(a.started_at_ms),
                "ended": ended.map(when).unwrap_or_default(),
                "took": ended.map(|e| age(e - a.started_at_ms)).unwrap_or_default(),
                "error": a.error.clone().unwrap_or_default(),
                "open": matches!(a.state, AttemptState::Started | AttemptState::Unknown),
            })
        })
        .collect();
    let races: Vec<Value> = races
        .iter()
        .map(|r| {
            json!({
                "loser": r.loser_ordinal,
                "winner": r.winner_ordinal.map_or("nobody".to_owned(), |w| format!("attempt {w}")),
                "reason": r.reason,
                "at": when(r.at_ms),
            })
        })
        .collect();
    let retryable = matches!(job.state, JobState::Queued | JobState::Failed);
    let view = json!({
        "id": job.id.0, "state": job.state.as_str(), "retryable": retryable, "route": job.route, "contract": job.contract,
        "key": job.key, "created": when(job.created_at_ms), "input": pretty(&job.input),
        "result": job.result.as_ref().map(pretty),
    });
    page(
        StatusCode::OK,
        "job.html",
        json!({"operator": op.view(), "job": view, "attempts": attempts, "races": races}),
    )
}

async fn certification(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(op) = operator(&state, &headers) else {
        return to_sign_in();
    };
    let list = crate::service::provider_list(&state);
    let mut rows = Vec::new();
    for route in &list.routes {
        for provider in &route.providers {
            let Some(p) = list.data.iter().find(|p| &p.id == provider) else {
                continue;
            };
            let Some(c) = p.certification.get(&route.contract) else {
                continue;
            };
            rows.push(json!({
                "route": route.id, "contract": route.contract, "provider": provider,
                "status": c.status, "reason": c.reason,
                "expires": c.expires_at.clone().unwrap_or_default(),
                "drift": p.drift.as_ref().map(|d| format!("model {} answered at {}", d.model, d.at)),
            }));
        }
    }
    let manifest = match state.inner.manifest.current() {
        Some(m) => format!(
            "Manifest generated at {} with {} entries{}.",
            m.generated_at,
            m.entries.len(),
            if state.inner.manifest.refused().is_some() {
                "; the last reload was refused, so this is the last good one"
            } else {
                ""
            }
        ),
        None => "No valid manifest is in force: nothing is routed.".to_owned(),
    };
    page(
        StatusCode::OK,
        "certification.html",
        json!({"operator": op.view(), "rows": rows, "manifest": manifest}),
    )
}

/// What a confirmation page asks, and where its form goes.
struct Confirm<'a> {
    title: String,
    explain: &'a str,
    confirm: &'a str,
    action: String,
}

fn confirmation(op: &Operator, job_id: &str, ask: &Confirm<'_>, error: Option<String>) -> Response {
    let status = match error {
        Some(_) => StatusCode::CONFLICT,
        None => StatusCode::OK,
    };
    page(
        status,
        "confirm.html",
        json!({
            "operator": op.view(), "job_id": job_id, "title": ask.title, "explain": ask.explain,
            "confirm": ask.confirm, "action": ask.action, "error": error,
        }),
    )
}

fn cancel_question(id: &str, n: i64) -> Confirm<'static> {
    Confirm {
        title: format!("Cancel attempt {n} of job {id}?"),
        explain: "The provider may have done the work: cancel only once you know it did not (or that it does not matter). The attempt becomes cancelled, a late answer from it loses, and the job may be retried.",
        confirm: "Yes, cancel the attempt",
        action: format!("/ui/jobs/{id}/attempts/{n}/cancel"),
    }
}

fn retry_question(id: &str) -> Confirm<'static> {
    Confirm {
        title: format!("Retry job {id}?"),
        explain: "A new attempt starts at the route's first certified provider, under the same job.",
        confirm: "Yes, retry the job",
        action: format!("/ui/jobs/{id}/retry"),
    }
}

async fn confirm_cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
) -> Response {
    // The form's action is built from the parsed id, never the raw path.
    if let Err(e) = job_id(&id) {
        return e.into_response();
    }
    match operator(&state, &headers) {
        Some(op) => confirmation(&op, &id, &cancel_question(&id, n), None),
        None => to_sign_in(),
    }
}

async fn confirm_retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = job_id(&id) {
        return e.into_response();
    }
    match operator(&state, &headers) {
        Some(op) => confirmation(&op, &id, &retry_question(&id), None),
        None => to_sign_in(),
    }
}

/// Why a form that changes something was not acted on.
enum Refused {
    /// Nobody is signed in: to the sign-in page.
    NotSignedIn,
    /// The form's token is not this session's (a forged request).
    Forged,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::NotSignedIn => to_sign_in(),
            Refused::Forged => (
                StatusCode::FORBIDDEN,
                "the form's token does not match this session",
            )
                .into_response(),
        }
    }
}

/// After an action: to `after`, or back to its question, saying why not.
fn answered(
    op: &Operator,
    job_id: &str,
    question: &Confirm<'_>,
    done: Result<(), ApiError>,
    after: &str,
) -> Response {
    match done {
        Ok(()) => Redirect::to(after).into_response(),
        Err(e) => confirmation(op, job_id, question, Some(e.detail)),
    }
}

/// The operator of a form that changes something, if its token matches.
fn acting(state: &AppState, headers: &HeaderMap, form: &Token) -> Result<Operator, Refused> {
    let op = operator(state, headers).ok_or(Refused::NotSignedIn)?;
    match op.session.csrf_matches(&form.csrf) {
        true => Ok(op),
        false => Err(Refused::Forged),
    }
}

/// A form that acts on job `id`: the operator whose token it carries, and
/// the parsed job id with the owner this operator may act for; else the
/// answer that refuses it.
async fn acting_on(
    state: &AppState,
    headers: &HeaderMap,
    form: &Token,
    id: &str,
) -> Result<(Operator, Result<(OwnerId, JobId), ApiError>), Response> {
    let op = acting(state, headers, form).map_err(IntoResponse::into_response)?;
    let job_id = job_id(id).map_err(IntoResponse::into_response)?;
    let owner = op
        .owner_of(state, &job_id)
        .await
        .map(|owner| (owner, job_id));
    Ok((op, owner))
}

async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, n)): Path<(String, i64)>,
    Form(form): Form<Token>,
) -> Response {
    let (op, found) = match acting_on(&state, &headers, &form, &id).await {
        Ok(acting) => acting,
        Err(refused) => return refused,
    };
    let done = match found {
        Ok((owner, job_id)) => crate::service::cancel(&state, &owner, &job_id, n).await,
        Err(e) => Err(e),
    };
    let after = format!("/ui/jobs/{id}");
    answered(&op, &id, &cancel_question(&id, n), done, &after)
}

async fn retry(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<Token>,
) -> Response {
    let (op, found) = match acting_on(&state, &headers, &form, &id).await {
        Ok(acting) => acting,
        Err(refused) => return refused,
    };
    let done = match found {
        Ok((owner, job_id)) => crate::service::retry(&state, &owner, &job_id).await,
        Err(e) => Err(e),
    };
    // The job's page shows the outcome once the new attempt has one.
    let after = format!("/ui/jobs/{id}?wait=10");
    answered(&op, &id, &retry_question(&id), done, &after)
}
