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
use crate::error::{ApiError, Problem};

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller(pub ApiKey);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        authenticate(state, &parts.headers).map(Caller)
    }
}

/// The API key an `Authorization` header names, among the configured ones.
pub fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<ApiKey, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                Problem::Unauthorized,
                "send `Authorization: Bearer <API key>`",
            )
        })?;
    let hash = hex::encode(Sha256::digest(token.as_bytes()));
    state
        .inner
        .api_keys
        .get(&hash)
        .cloned()
        .ok_or_else(|| ApiError::new(Problem::Unauthorized, "unknown API key"))
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
