//! Extractors, so a handler cannot forget authentication or take a body
//! that is not a JSON object: [`Caller`] (the API key's owner and scope,
//! from `Authorization: Bearer <key>`, the scheme in any case, as RFC 9110
//! has it) and [`JsonObject`] (`Content-Type: application/json`, within the
//! size limit, a JSON object). Their rejections are the project's problem
//! details; the facade turns them into OpenAI's format.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::config::ApiKey;
use crate::http::error::{ApiError, Problem};

/// The authenticated caller, admitted within its owner's limits; the
/// admission is held until the handler returns (it counts the owner's
/// requests in flight).
#[derive(Debug)]
pub struct Caller(pub ApiKey, pub Admitted);

/// A request admitted within its owner's rate and concurrency limits.
#[derive(Debug)]
pub struct Admitted(
    #[expect(
        dead_code,
        reason = "held, not read: dropping it frees the owner's slot"
    )]
    tokio::sync::OwnedSemaphorePermit,
);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        Caller::admitted(parts, state, authenticate)
    }
}

impl Caller {
    /// The caller `authenticate` finds in the request's headers, admitted
    /// within its owner's limits.
    pub fn admitted(
        parts: &Parts,
        state: &AppState,
        authenticate: fn(
            &AppState,
            &HeaderMap,
            Option<std::net::IpAddr>,
        ) -> Result<ApiKey, ApiError>,
    ) -> Result<Caller, ApiError> {
        let peer = parts
            .extensions
            .get::<crate::http::listen::Peer>()
            .map(|p| p.0);
        let key = authenticate(state, &parts.headers, peer)?;
        let admitted = admit(state, &key.owner)?;
        Ok(Caller(key, admitted))
    }
}

/// Holds one owner to the configured rate (`owner_requests_per_second`,
/// `owner_burst`) and requests in flight (`owner_max_in_flight`): past
/// either, a 429 with `Retry-After`, and other owners are not touched.
fn admit(state: &AppState, owner: &str) -> Result<Admitted, ApiError> {
    let limits = &state.inner.limits;
    if let Some(rate) = &limits.rate
        && let Err(not_until) = rate.check_key(&owner.to_owned())
    {
        let wait = not_until.wait_time_from(governor::clock::Clock::now(
            &governor::clock::DefaultClock::default(),
        ));
        state.inner.metrics.rate_limited.inc();
        return Err(ApiError {
            retry_after: Some(wait.as_secs_f64().ceil().max(1.0) as u64),
            ..ApiError::new(
                Problem::RateLimited,
                format!("owner `{owner}` is over its rate of requests; wait and ask again"),
            )
        });
    }
    let most = limits.most_in_flight;
    let known = limits
        .gates
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(owner)
        .cloned();
    let gate = match known {
        Some(gate) => gate,
        None => limits
            .gates
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(owner.to_owned())
            .or_insert_with(|| std::sync::Arc::new(tokio::sync::Semaphore::new(most)))
            .clone(),
    };
    match gate.try_acquire_owned() {
        Ok(permit) => Ok(Admitted(permit)),
        Err(_) => {
            state.inner.metrics.rate_limited.inc();
            Err(ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    Problem::RateLimited,
                    format!(
                        "owner `{owner}` has {most} requests in flight, its limit; wait for one to finish"
                    ),
                )
            })
        }
    }
}

/// The API key an `Authorization` header names, among the configured ones.
/// Two `Authorization` headers are refused: which one counts would be the
/// reader's guess.
pub fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<ApiKey, ApiError> {
    key_in(state, headers, peer, |headers| {
        if headers.get_all(header::AUTHORIZATION).iter().count() > 1 {
            return Err(ApiError::new(
                Problem::MalformedBody,
                "this request carries more than one Authorization header; send one",
            ));
        }
        bearer(headers).ok_or_else(|| {
            ApiError::new(
                Problem::Unauthorized,
                "send `Authorization: Bearer <API key>`",
            )
        })
    })
}

/// As [`authenticate`], for Anthropic's SDKs: the key in `x-api-key`
/// (what they send), or else `Authorization: Bearer` (their `auth_token`).
/// Two of either, or both at once, are refused: which one counts would be
/// the reader's guess.
pub fn authenticate_anthropic(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<ApiKey, ApiError> {
    key_in(state, headers, peer, |headers| {
        let keys = headers.get_all(X_API_KEY).iter().count();
        let authorizations = headers.get_all(header::AUTHORIZATION).iter().count();
        if keys + authorizations > 1 {
            return Err(ApiError::new(
                Problem::MalformedBody,
                "this request carries more than one API key (x-api-key, Authorization); send one",
            ));
        }
        match headers.get(X_API_KEY) {
            Some(value) => value.to_str().ok().map(str::trim).filter(|t| !t.is_empty()),
            None => bearer(headers),
        }
        .ok_or_else(|| {
            ApiError::new(
                Problem::Unauthorized,
                "send the API key in `x-api-key` (or `Authorization: Bearer <API key>`)",
            )
        })
    })
}

/// The configured key the request's `token` names: refused at once for an
/// address past its failed authentications; an unknown key counts
/// against `peer`.
fn key_in(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
    token: impl FnOnce(&HeaderMap) -> Result<&str, ApiError>,
) -> Result<ApiKey, ApiError> {
    if let Some(wait) = peer.and_then(|p| state.inner.failures.blocked(p)) {
        return Err(too_many_failures(wait));
    }
    let token = token(headers)?;
    api_key(state, token).map(|(_, key)| key).ok_or_else(|| {
        if let Some(peer) = peer {
            state.inner.failures.failed(peer);
        }
        ApiError::new(Problem::Unauthorized, "unknown API key")
    })
}

/// The token of an `Authorization: Bearer` header, if one is there.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
}

/// The header Anthropic's SDKs send their key in.
pub const X_API_KEY: &str = "x-api-key";

/// The refusal of an address past its failed authentications.
pub fn too_many_failures(wait: std::time::Duration) -> ApiError {
    ApiError {
        retry_after: Some(wait.as_secs_f64().ceil().max(1.0) as u64),
        ..ApiError::new(
            Problem::RateLimited,
            format!(
                "too many failed authentications from this address (the limit is per {} s); wait and try again",
                crate::auth::FAILURE_WINDOW.as_secs()
            ),
        )
    }
}

/// The configured API key `token` is, with its sha256 (hex): the one
/// lookup of keys, for the API and the operator's sign-in alike. Every
/// configured digest is compared, in constant time, whichever matches.
pub fn api_key(state: &AppState, token: &str) -> Option<(String, ApiKey)> {
    let hash = hex::encode(Sha256::digest(token.as_bytes()));
    let mut found = None;
    for (stored, key) in &state.inner.api_keys {
        if crate::auth::same_token(stored, &hash) {
            found = Some((stored.clone(), key.clone()));
        }
    }
    found
}

/// A request body that is a JSON object, sent as `application/json`, read
/// into `T`.
#[derive(Debug, Clone)]
pub struct JsonObject<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonObject<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<JsonObject<T>, ApiError> {
        json_content_type(request.headers())?;
        let bytes =
            Bytes::from_request(request, state)
                .await
                .map_err(|rejection| match rejection.status() {
                    StatusCode::PAYLOAD_TOO_LARGE => {
                        ApiError::new(Problem::PayloadTooLarge, rejection.body_text())
                    }
                    _ => ApiError::new(Problem::MalformedBody, rejection.body_text()),
                })?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::new(Problem::MalformedBody, format!("not JSON: {e}")))?;
        if !value.is_object() {
            return Err(ApiError::new(
                Problem::MalformedBody,
                "the body must be a JSON object",
            ));
        }
        serde_json::from_value(value)
            .map(JsonObject)
            .map_err(|e| ApiError::new(Problem::MalformedBody, e.to_string()))
    }
}

/// `application/json` (or a `+json` type), parameters such as `charset` aside.
fn json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let mime = given
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let json =
        mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"));
    match json {
        true => Ok(()),
        false => Err(ApiError::new(
            Problem::UnsupportedMediaType,
            format!(
                "send the body as JSON with `Content-Type: application/json`; this request said {}",
                match given {
                    "" => "nothing".to_owned(),
                    other => format!("`{other}`"),
                }
            ),
        )),
    }
}

/// Path parameters, with a problem detail (400) for a segment that does not
/// parse, such as an attempt number that is not a number.
#[derive(Debug, Clone)]
pub struct PathParams<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<AppState> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<PathParams<T>, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| PathParams(value))
            .map_err(|rejection| {
                ApiError::new(
                    Problem::MalformedBody,
                    format!(
                        "the path does not fit this endpoint: {}",
                        rejection.body_text()
                    ),
                )
            })
    }
}

/// A job id from a path: a UUID (as the router makes them), else no such
/// job (404) before anything is asked of the database. What was sent is not
/// echoed.
pub fn job_id(raw: &str) -> Result<surety_store::JobId, ApiError> {
    match uuid::Uuid::try_parse(raw) {
        Ok(id) if id.hyphenated().to_string() == raw => Ok(surety_store::JobId(raw.to_owned())),
        _ => Err(ApiError::new(
            Problem::NotFound,
            "no such job: a job id is a UUID, as the router gave it",
        )),
    }
}

/// The request's `Idempotency-Key`: present, printable, and of the syntax
/// `surety_core::IdempotencyKey` takes.
pub fn idempotency_key(headers: &HeaderMap) -> Result<surety_core::IdempotencyKey, ApiError> {
    let raw = headers.get("idempotency-key").ok_or_else(|| {
        ApiError::new(
            Problem::MissingIdempotencyKey,
            "send an `Idempotency-Key` header naming this intent",
        )
    })?;
    let text = raw
        .to_str()
        .map_err(|_| ApiError::new(Problem::InvalidIdempotencyKey, "not printable ASCII"))?;
    surety_core::IdempotencyKey::parse(text)
        .map_err(|e| ApiError::new(Problem::InvalidIdempotencyKey, e.to_string()))
}
