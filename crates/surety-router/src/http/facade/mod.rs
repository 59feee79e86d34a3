//! The OpenAI-compatible facade: `POST /v1/chat/completions` and
//! `GET /v1/models`, so clients built for OpenAI work by changing their base
//! URL. Every answer and every error here is in OpenAI's format, with the
//! statuses its SDKs map to typed exceptions and `x-should-retry` saying
//! whether a retry can help.
//!
//! `model` names a route. On a pinned route (the default) the messages must
//! be a rendering of the contract's templates: they are read back into the
//! contract's input, and the job is that input, sent as the harness
//! certified it. On an `output-only` route the messages pass through.
//! Either way the answer is checked against the contract before a byte of
//! it is sent, streamed or not. A parameter surety does not honour is
//! refused by name, never dropped.

mod error;
pub mod messages_api;
mod reply;
mod request;
pub mod responses_api;

use std::time::Duration;

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use surety_config::Facade;
use surety_core::{Fingerprint, IdempotencyKey};
use surety_store::{Job, JobKind, OwnerId};

pub use error::OpenAiError;
use reply::answer;
use request::{chat_messages, parameters, pin};

use super::error::{ApiError, Problem};
use super::extract::{Caller, JsonObject, idempotency_key};
use super::responses::{OpenAiFull, OpenAiLimited, OpenAiUnauthorized, OpenAiUncertified};
use super::views::{
    AnthropicModel, AnthropicModelList, ChatCompletion, ChatRequestDoc, ChunkEventDoc, ModelList,
    ModelView, ModelsAnswer, ModelsError, OpenAiErrorView,
};
use crate::jobs::{Intake, create_or_replay, route_and_contract, wait_at_rest};
use crate::state::AppState;

/// Says on every facade answer whether its prompt was certified
/// (`true` on a pinned route, `false` on an output-only one).
pub const PROMPT_CERTIFIED: &str = "surety-prompt-certified";

/// Says `off` on an answer to a request that came without an
/// Idempotency-Key (when the operator allows those): it was a one-off job,
/// and a repeat of it is a new job.
pub const DEDUPLICATION: &str = "surety-deduplication";

/// The routes, as OpenAI lists models; in Anthropic's shape to a request
/// that carries `anthropic-version` (its key then in `x-api-key` or a
/// bearer token, its errors in Anthropic's shape).
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    params(("anthropic-version" = Option<String>, Header, nullable = false, description = "Any version (`2023-06-01`): answer in Anthropic's shape (`data`, `has_more`, `first_id`, `last_id`); empty or none: OpenAI's")),
    responses(
        (status = 200, description = "The routes", body = ModelsAnswer),
        (status = 401, description = "No or an unknown API key", body = ModelsError),
        (status = 429, description = "This owner's rate or concurrency limit, or too many failed authentications from this address (Retry-After says when)", body = ModelsError),
    ))]
pub async fn models(State(state): State<AppState>, caller: ModelsCaller) -> Response {
    let ids = state.inner.routes.values().map(|r| r.id.clone());
    match caller {
        ModelsCaller::OpenAi(_) => Json(ModelsAnswer::OpenAi(ModelList {
            object: "list".to_owned(),
            data: ids
                .map(|id| ModelView {
                    id,
                    object: "model".to_owned(),
                    created: 0,
                    owned_by: "surety".to_owned(),
                })
                .collect(),
        }))
        .into_response(),
        ModelsCaller::Anthropic(_) => {
            let data: Vec<AnthropicModel> = ids
                .map(|id| AnthropicModel {
                    display_name: id.clone(),
                    id,
                    kind: "model".to_owned(),
                    created_at: "1970-01-01T00:00:00Z".to_owned(),
                })
                .collect();
            Json(ModelsAnswer::Anthropic(AnthropicModelList {
                first_id: data.first().map(|m| m.id.clone()),
                last_id: data.last().map(|m| m.id.clone()),
                has_more: false,
                data,
            }))
            .into_response()
        }
    }
}

/// Who asks for the models, in which dialect: Anthropic's when the
/// request carries `anthropic-version`, else OpenAI's.
#[derive(Debug)]
pub enum ModelsCaller {
    OpenAi(#[expect(dead_code, reason = "held: the owner's admission")] Caller),
    Anthropic(#[expect(dead_code, reason = "held: the owner's admission")] Caller),
}

impl FromRequestParts<AppState> for ModelsCaller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<ModelsCaller, Response> {
        // An empty `anthropic-version` names no version: OpenAI's shape.
        let anthropic = parts
            .headers
            .get_all(messages_api::ANTHROPIC_VERSION)
            .iter()
            .any(|v| !v.is_empty());
        match anthropic {
            // Listing models needs no particular version: any names the dialect.
            true => Caller::admitted(parts, state, super::extract::authenticate_anthropic)
                .map(ModelsCaller::Anthropic)
                .map_err(|e| messages_api::AnthropicError::from(e).into_response()),
            false => OpenAiCaller::from_request_parts(parts, state)
                .await
                .map(|c| ModelsCaller::OpenAi(c.0))
                .map_err(IntoResponse::into_response),
        }
    }
}

/// OpenAI's chat completions, on a route's certified prompt.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Names this intent: the same on every retry of it (required unless the operator allows one-off jobs)", min_length = 1, max_length = 255, pattern = r"^[!#-~]([ -~]*[!-~])?$"),
    ),
    request_body(content = ChatRequestDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "The completion, as JSON, or with `stream` as server-sent `chat.completion.chunk` events ending with `data: [DONE]`", content(
            (ChatCompletion = "application/json"),
            (ChunkEventDoc = "text/event-stream"),
        )),
        (status = 400, description = "A bad request, a prompt the certificate does not cover, or a parameter surety does not honour (named in `param`)", body = OpenAiErrorView),
        (status = 409, description = "The key names a job with a different request", body = OpenAiErrorView),
        (status = 413, description = "The body is too large", body = OpenAiErrorView),
        (status = 415, description = "The body is not application/json", body = OpenAiErrorView),
        (status = 422, description = "No such route", body = OpenAiErrorView),
        (status = 431, description = "The headers are too large", body = OpenAiErrorView),
        (status = 502, description = "Every certified provider failed", body = OpenAiErrorView),
        (status = 504, description = "The job is still running, or unknown", body = OpenAiErrorView),
        OpenAiUnauthorized,
        OpenAiLimited,
        OpenAiUncertified,
        OpenAiFull,
    )
)]
pub async fn chat_completions(
    State(state): State<AppState>,
    OpenAiCaller(caller): OpenAiCaller,
    headers: HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Response {
    match chat(&state, caller, &headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// What the request asks of the answer's delivery.
#[derive(Debug, Clone, Copy)]
pub(super) struct Delivery {
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    /// The route's contract answers with a tool call: the answer is
    /// OpenAI's `tool_calls`, not content.
    pub(super) tool_calls: bool,
}

/// The caller, authenticated before the body is read (a request without a
/// good key is answered at once, in OpenAI's format, and its body never
/// read).
#[derive(Debug)]
pub struct OpenAiCaller(pub Caller);

impl FromRequestParts<AppState> for OpenAiCaller {
    type Rejection = OpenAiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<OpenAiCaller, OpenAiError> {
        Caller::from_request_parts(parts, state)
            .await
            .map(OpenAiCaller)
            .map_err(OpenAiError::from)
    }
}

async fn chat(
    state: &AppState,
    caller: Caller,
    headers: &HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Result<Response, OpenAiError> {
    let Caller(key, _admitted) = caller;
    let JsonObject(body) = body?;
    let (request, model) = request_model(&body)?;
    let (route, served) = route_and_contract(state, model)?;
    let delivery = parameters(request, served)?;
    let (idempotency, keyless) = intent_key(state, headers)?;
    let sent = chat_messages(&body)?;
    let owner = OwnerId(key.owner);
    let (replayed, job, attempts) = settled_job(
        state,
        (owner, key.name, idempotency),
        (route.clone(), served.clone()),
        (&body, None),
        (JobKind::Chat, sent),
    )
    .await?;
    let mut response = answer(&job, &attempts, delivery)?;
    stamp(&mut response, replayed, keyless, &job, route.facade);
    Ok(response)
}

/// A facade request's body as an object, and the route its `model` names.
fn request_model(body: &Value) -> Result<(&serde_json::Map<String, Value>, &str), OpenAiError> {
    let Some(request) = body.as_object() else {
        return Err(OpenAiError::bad_request(
            "invalid_request",
            None,
            "the body must be a JSON object",
        ));
    };
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            OpenAiError::bad_request(
                "invalid_request",
                Some("model"),
                "`model` must name a route",
            )
        })?;
    Ok((request, model))
}

/// The job a facade request of `kind` asks for, by its route's rules: on
/// a pinned route its input is the contract's, read back from the
/// client's `messages`; on an output-only route it is the request itself,
/// with the messages kept for its retries. Fingerprinted by the body,
/// created or replayed, and waited for: whether it was a replay, the job
/// at rest and its attempts.
async fn settled_job(
    state: &AppState,
    (owner, key_name, idempotency): (OwnerId, Option<String>, IdempotencyKey),
    (route, served): (
        crate::config::Route,
        std::sync::Arc<crate::certification::ServedContract>,
    ),
    (body, kept): (&Value, Option<Value>),
    (kind, messages): (JobKind, Vec<surety_providers::Message>),
) -> Result<(bool, Job, Vec<surety_store::Attempt>), OpenAiError> {
    let input = match route.facade {
        Facade::OutputOnly => body.clone(),
        Facade::Pinned => pin(&served, &messages).map_err(|message| {
            OpenAiError::bad_request("prompt_not_certified", Some("messages"), message)
        })?,
    };
    let fingerprint = Fingerprint::of(body)
        .map_err(|e| OpenAiError::bad_request("invalid_request", None, e.to_string()))?;
    let facade = route.facade;
    let intake = Intake::new(
        (owner.clone(), key_name, idempotency),
        (route, served),
        input,
        kind,
        messages,
    )
    .fingerprinted(fingerprint);
    // What the request asks of its providers beyond the messages.
    let intake = match kept {
        Some(request) => intake.requesting(request),
        None => intake,
    };
    // A pinned job's messages are its contract's rendering of its input;
    // an output-only job's are the client's, kept with it.
    let intake = match facade {
        Facade::OutputOnly => intake.keeping_messages()?,
        Facade::Pinned => intake,
    };
    let created = create_or_replay(state, intake, true).await?;
    let replayed = created.replayed;
    let (_, job, attempts) = wait_at_rest(state, &owner, created, answer_limit(state)).await?;
    Ok((replayed, job, attempts))
}

/// The request's Idempotency-Key, and whether it came without one (a
/// one-off job, when the operator allows those).
/// How long a request waits for its job's answer: an attempt's whole
/// time, and a little for its commit.
fn answer_limit(state: &AppState) -> Duration {
    state.inner.settings.attempt_timeout + Duration::from_secs(5)
}

fn intent_key(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<(IdempotencyKey, bool), OpenAiError> {
    match (
        idempotency_key(headers),
        state.inner.settings.allow_keyless_chat,
    ) {
        (Ok(key), _) => Ok((key, false)),
        (Err(e), true) if e.problem == Problem::MissingIdempotencyKey => {
            let one_off = format!("one-off-{}", uuid::Uuid::now_v7());
            let key =
                IdempotencyKey::parse(&one_off).map_err(|e| ApiError::internal(e.to_string()))?;
            Ok((key, true))
        }
        (Err(e), _) if e.problem == Problem::MissingIdempotencyKey => {
            Err(OpenAiError::bad_request(
                "missing_idempotency_key",
                None,
                "this request has no Idempotency-Key header: send one naming this intent (e.g. `Idempotency-Key: order-1042-refund`), the same on every retry of it; docs/clients.md shows how each SDK sends it",
            ))
        }
        (Err(e), _) => Err(e.into()),
    }
}

/// The headers every facade answer carries: whether it is a replay, a
/// one-off job, which job it is, and whether its prompt was certified.
fn stamp(response: &mut Response, replayed: bool, keyless: bool, job: &Job, facade: Facade) {
    let out = response.headers_mut();
    if replayed {
        out.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if keyless {
        out.insert(DEDUPLICATION, HeaderValue::from_static("off"));
    }
    if let Ok(value) = HeaderValue::from_str(&job.id.0) {
        out.insert("surety-job-id", value);
    }
    // Whether a certificate covers the prompt that was sent, not only the answer.
    out.insert(
        PROMPT_CERTIFIED,
        HeaderValue::from_static(match facade {
            Facade::Pinned => "true",
            Facade::OutputOnly => "false",
        }),
    );
}
