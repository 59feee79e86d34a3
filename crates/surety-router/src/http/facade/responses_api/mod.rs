//! OpenAI's Responses API (`POST /v1/responses`), on the facade's auth,
//! owners, limits and Idempotency-Key rules: a response is a job, its id
//! (`resp_…`) the job's, so a replay answers the same response.
//!
//! On a pinned route `instructions` and the input must be the contract's
//! rendered prompt, read back into its input. On an output-only route the
//! input items pass through, and `previous_response_id` continues an
//! earlier response of the same owner: surety builds the conversation from
//! its own store (that response's conversation, without its instructions,
//! and its output, then the new instructions and input) and sends it to
//! whichever provider of the route is certified now, of any kind. Either
//! way the answer is checked against the contract before a byte is sent.
//!
//! With `background` the request answers at once with the job as it is;
//! `stored` reads it back (`GET /v1/responses/{id}`, its stream resumable
//! by sequence number), cancels it by the job rules, lists its input and
//! deletes it from later lookups.

mod reply;
mod request;
pub mod stored;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use surety_config::Facade;
use surety_core::{Fingerprint, JobState};
use surety_providers::{Message, Role};
use surety_store::{Attempt, Job, JobKind, OwnerId, StoreError};

use super::reply::{answer_calls, unsettled};
use super::request::pin;
use super::{OpenAiCaller, OpenAiError, answer_limit, intent_key, request_model, stamp};
use crate::http::error::ApiError;
use crate::http::extract::{Caller, JsonObject};
use crate::http::responses::{OpenAiFull, OpenAiLimited, OpenAiUnauthorized, OpenAiUncertified};
use crate::http::views::{
    OpenAiErrorView, ResponseEventDoc, ResponseObject, ResponseRequestDoc, response_job,
};
use crate::jobs::{Intake, create_or_replay, job_messages, route_and_contract, wait_at_rest};
use crate::state::AppState;
use reply::{deliver, live, response_of};

use request::{input_messages, parameters};

/// OpenAI's Responses API, on a route's contract.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Names this intent: the same on every retry of it (required unless the operator allows one-off jobs)", min_length = 1, max_length = 255, pattern = r"^[!#-~]([ -~]*[!-~])?$"),
    ),
    request_body(content = ResponseRequestDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "The response, as JSON, or with `stream` as server-sent events (`response.created` … `response.completed`), each with its `sequence_number`. With `background`, at once: the response as its job is (`in_progress`), read later by `GET /v1/responses/{id}`; a background stream sends its opening events at once and the rest as the job ends", content(
            (ResponseObject = "application/json"),
            (ResponseEventDoc = "text/event-stream"),
        )),
        (status = 400, description = "A bad request, a prompt the certificate does not cover, a parameter surety does not honour (named in `param`), or a `previous_response_id` that cannot be continued", body = OpenAiErrorView),
        (status = 404, description = "`previous_response_id` names no response of this owner", body = OpenAiErrorView),
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
pub async fn create_response(
    State(state): State<AppState>,
    OpenAiCaller(caller): OpenAiCaller,
    headers: HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Response {
    match respond(&state, caller, &headers, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn respond(
    state: &AppState,
    caller: Caller,
    headers: &HeaderMap,
    body: Result<JsonObject<Value>, ApiError>,
) -> Result<Response, OpenAiError> {
    let Caller(key, _admitted) = caller;
    let JsonObject(body) = body?;
    let (request, model) = request_model(&body)?;
    let (route, served) = route_and_contract(state, model)?;
    let asked = parameters(request, served)?;
    let (idempotency, keyless) = intent_key(state, headers)?;
    let owner = OwnerId(key.owner);
    let history = match (&asked.previous, route.facade) {
        (None, _) => Vec::new(),
        (Some(_), Facade::Pinned) => {
            return Err(OpenAiError::bad_request(
                "unsupported_parameter",
                Some("previous_response_id"),
                format!(
                    "route `{}` is pinned: it serves its contract's one certified prompt, which no conversation extends; continue a conversation on an output-only route",
                    route.id
                ),
            ));
        }
        (Some(previous), Facade::OutputOnly) => conversation(state, &owner, previous).await?,
    };
    if body["input"].is_null() {
        return Err(OpenAiError::bad_request(
            "invalid_request",
            Some("input"),
            "`input` is required: text, or a list of items",
        ));
    }
    let mut messages: Vec<Message> = asked
        .instructions
        .iter()
        .map(|text| Message::system(text.clone()))
        .collect();
    let input = input_messages(&body["input"], &history)?;
    messages.extend(history);
    messages.extend(input);
    let job_input = match route.facade {
        Facade::OutputOnly => body.clone(),
        Facade::Pinned => pin(served, &messages).map_err(|message| {
            OpenAiError::bad_request("prompt_not_certified", Some("input"), message)
        })?,
    };
    let fingerprint = Fingerprint::of(&body)
        .map_err(|e| OpenAiError::bad_request("invalid_request", None, e.to_string()))?;
    let intake = Intake::new(
        (owner.clone(), key.name, idempotency),
        (route.clone(), served.clone()),
        job_input,
        JobKind::Responses,
        messages,
    )
    .fingerprinted(fingerprint)
    .requesting(body.clone());
    // A pinned job's messages are its contract's rendering of its input;
    // an output-only job's are the whole conversation, kept with it.
    let intake = match route.facade {
        Facade::OutputOnly => intake.keeping_messages()?,
        Facade::Pinned => intake,
    };
    // In the background only a stream waits for the job.
    let watch = !asked.background || asked.stream;
    let created = create_or_replay(state, intake, watch).await?;
    let replayed = created.replayed;
    let limit = answer_limit(state);
    let (job, mut response) = match (asked.background, asked.stream) {
        (true, true) => {
            let job = created.job.clone();
            let live = live(state, &owner, created, body, asked.tool_calls, None, limit);
            (job, live)
        }
        (true, false) => {
            // A new job is as it was just recorded (an attempt started);
            // a replay's may have moved since it was found.
            let (job, attempts) = match replayed {
                false => (created.job, Vec::new()),
                true => {
                    let (_, job, attempts) = wait_at_rest(state, &owner, created, limit).await?;
                    (job, attempts)
                }
            };
            let now = response_of(&job, &attempts, &body, asked.tool_calls);
            (job, deliver(now, false))
        }
        (false, _) => {
            let (_, job, attempts) = wait_at_rest(state, &owner, created, limit).await?;
            let response = match job.state {
                JobState::Succeeded => deliver(
                    response_of(&job, &attempts, &body, asked.tool_calls),
                    asked.stream,
                ),
                _ => return Err(unsettled(&job, &attempts)),
            };
            (job, response)
        }
    };
    stamp(&mut response, replayed, keyless, &job, route.facade);
    Ok(response)
}

/// No response `id` of the caller's owner (`param` carried the id, if one did).
fn not_found(id: &str, param: Option<&str>) -> OpenAiError {
    let code = match param {
        Some(_) => "previous_response_not_found",
        None => "response_not_found",
    };
    let message = format!("no response `{id}` of this API key's owner");
    OpenAiError::invalid(StatusCode::NOT_FOUND, code, param, message)
}

/// The owner's response `id`, unless it was deleted: a 404 in OpenAI's
/// format for an id surety never made, another owner's, or another kind
/// of job's. `param` names the parameter that carried the id, if one did.
async fn find_response(
    state: &AppState,
    owner: &OwnerId,
    id: &str,
    param: Option<&str>,
) -> Result<(Job, Vec<Attempt>), OpenAiError> {
    let job_id = response_job(id).ok_or_else(|| not_found(id, param))?;
    match state.inner.store.job_and_attempts(owner, &job_id).await {
        Ok((job, attempts)) if job.kind == JobKind::Responses && job.deleted_at_ms.is_none() => {
            Ok((job, attempts))
        }
        Ok(_) | Err(StoreError::JobNotFound(_)) => Err(not_found(id, param)),
        Err(e) => Err(ApiError::from(e).into()),
    }
}

/// The conversation a response continues: the earlier response's own
/// conversation (as its job sent it, without its instructions, which
/// OpenAI does not carry over) and its output, as messages any provider
/// kind is sent. Only a completed, stored response of this owner.
async fn conversation(
    state: &AppState,
    owner: &OwnerId,
    id: &str,
) -> Result<Vec<Message>, OpenAiError> {
    let param = Some("previous_response_id");
    let (job, _) = find_response(state, owner, id, param).await?;
    let request = job.request.clone().unwrap_or_default();
    if request["store"] == false {
        return Err(OpenAiError::bad_request(
            "previous_response_not_stored",
            param,
            format!(
                "response `{id}` was created with `store: false`, so it cannot be continued; send its conversation as `input` instead"
            ),
        ));
    }
    let Some(result) = job
        .result
        .as_ref()
        .filter(|_| job.state == JobState::Succeeded)
    else {
        return Err(OpenAiError::bad_request(
            "previous_response_not_completed",
            param,
            format!(
                "response `{id}` is {}: only a completed response can be continued",
                job.state
            ),
        ));
    };
    let served = state.inner.contracts.get(&job.contract).ok_or_else(|| {
        OpenAiError::bad_request(
            "previous_response_not_served",
            param,
            format!(
                "response `{id}` was answered under contract `{}`, which this router no longer serves",
                job.contract
            ),
        )
    })?;
    let earlier = job_messages(&job, served).map_err(|why| {
        OpenAiError::bad_request(
            "previous_response_not_served",
            param,
            format!("the conversation of response `{id}` cannot be rebuilt: {why}"),
        )
    })?;
    let mut history: Vec<Message> = earlier
        .into_iter()
        .filter(|m| m.role != Role::System)
        .collect();
    history.push(match served.contract.tool_calls.is_some() {
        false => Message::assistant(result.to_string(), Vec::new()),
        true => Message::assistant(String::new(), answer_calls(&job, result)),
    });
    Ok(history)
}
