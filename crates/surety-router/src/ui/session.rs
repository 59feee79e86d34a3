//! Signing in and out: an admin key, posted once from this page's own form,
//! opens a session; the browser keeps the session's random token, never
//! the key; sign-out ends the session.

use axum::extract::{Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use surety_store::{JobId, OwnerId};

use super::views::{OperatorView, SignInPage};
use super::{COOKIE, SIGN_IN_COOKIE, page};
use crate::http::error::ApiError;
use crate::state::AppState;

/// A signed-in admin.
pub(super) struct Operator {
    /// The session's token, as its cookie carries it.
    pub(super) token: String,
    /// The session, whose CSRF token every form that changes something
    /// must carry.
    pub(super) session: crate::auth::Session,
    pub(super) owner: OwnerId,
    /// Whose jobs the pages show: the key's owner's, or (`None`) every
    /// owner's, for a key marked `all_owners`.
    pub(super) scope: Option<OwnerId>,
}

impl Operator {
    pub(super) fn view(&self) -> OperatorView {
        let scope = match &self.scope {
            Some(owner) => owner.0.clone(),
            None => "every owner".to_owned(),
        };
        OperatorView {
            owner: self.owner.0.clone(),
            scope,
            csrf: self.session.csrf.clone(),
        }
    }

    /// The owner of `job_id` this operator may see: the scope's, or the
    /// job's own for an operator of every owner.
    pub(super) async fn owner_of(
        &self,
        state: &AppState,
        job_id: &JobId,
    ) -> Result<OwnerId, ApiError> {
        match &self.scope {
            Some(owner) => Ok(owner.clone()),
            None => Ok(state.inner.store.owner_of(job_id).await?),
        }
    }
}

/// The value of the cookie `name` a request carries, if it carries one.
pub(super) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(name)?.strip_prefix('='))
}

/// The signed-in admin whose session the request's cookie names: an open,
/// unexpired session of a key that is still an admin's.
pub(super) fn operator(state: &AppState, headers: &HeaderMap) -> Option<Operator> {
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
pub(super) fn set_cookie(
    state: &AppState,
    name: &str,
    value: &str,
    path: &str,
    max_age: u64,
) -> Option<HeaderValue> {
    let secure = if state.inner.settings.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .ok()
}

pub(super) fn to_sign_in() -> Response {
    Redirect::to("/ui/sign-in").into_response()
}

/// The sign-in page, with a form token also set in a cookie for the
/// sign-in path: a sign-in is taken only from this page's form (no other
/// site can sign a browser in under a key of its choosing).
pub(super) async fn sign_in_page(State(state): State<AppState>) -> Response {
    sign_in_form(&state, StatusCode::OK, None)
}

pub(super) fn sign_in_form(state: &AppState, status: StatusCode, error: Option<&str>) -> Response {
    let token = crate::auth::random_token();
    let mut response = page(
        status,
        "sign_in.html",
        SignInPage {
            error,
            csrf: &token,
        },
    );
    if let Some(value) = set_cookie(state, SIGN_IN_COOKIE, &token, "/ui/sign-in", 600) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[derive(Deserialize)]
pub(super) struct SignIn {
    pub(super) key: String,
    #[serde(default)]
    pub(super) csrf: String,
}

pub(super) async fn sign_in(
    State(state): State<AppState>,
    peer: Option<axum::Extension<crate::http::listen::Peer>>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    let peer = peer.map(|axum::Extension(p)| p.0);
    if let Some(wait) = peer.and_then(|p| state.inner.failures.blocked(p)) {
        return crate::http::extract::too_many_failures(wait).into_response();
    }
    let expected = cookie(&headers, SIGN_IN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !crate::auth::same_token(expected, &form.csrf) {
        return sign_in_form(
            &state,
            StatusCode::FORBIDDEN,
            Some("This sign-in form was not this page's, or it is stale: sign in again here."),
        );
    }
    let refused = match crate::http::extract::api_key(&state, &form.key) {
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
pub(super) struct Token {
    /// Missing is refused as any other token that does not match.
    #[serde(default)]
    pub(super) csrf: String,
}

pub(super) async fn sign_out(
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

/// Why a form that changes something was not acted on.
pub(super) enum Refused {
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

/// The operator of a form that changes something, if its token matches.
pub(super) fn acting(
    state: &AppState,
    headers: &HeaderMap,
    form: &Token,
) -> Result<Operator, Refused> {
    let op = operator(state, headers).ok_or(Refused::NotSignedIn)?;
    match op.session.csrf_matches(&form.csrf) {
        true => Ok(op),
        false => Err(Refused::Forged),
    }
}
