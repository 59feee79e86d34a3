//! A response read back by its id: retrieved as it is now (or its stream
//! resumed after the events a client saw), cancelled by the job rules,
//! its input listed, deleted from later lookups. Every one only of the
//! caller's owner, and never a provider call.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use surety_store::{Attempt, Job, StoreError};

use super::super::answer_limit;
use super::super::reply::job_hex;
use super::super::{OpenAiCaller, OpenAiError};
use super::reply::{live, response_of};
use super::{find_response, not_found};
use crate::http::error::ApiError;
use crate::http::responses::{OpenAiLimited, OpenAiUnauthorized};
use crate::http::views::{
    InputItemList, OpenAiErrorView, ResponseDeleted, ResponseEventDoc, ResponseObject, response_id,
};
use crate::jobs::CreatedJob;
use crate::state::AppState;

/// The most input items one page lists, and how many without `limit`.
const MAX_ITEMS_PAGE: usize = 100;
const DEFAULT_ITEMS_PAGE: usize = 20;

fn refuse(param: &str, why: impl Into<String>) -> OpenAiError {
    OpenAiError::bad_request("invalid_request", Some(param), why)
}

/// The query's pairs, or why it does not read as one.
fn pairs_of(
    pairs: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Vec<(String, String)>, OpenAiError> {
    pairs
        .map(|Query(pairs)| pairs)
        .map_err(|e| OpenAiError::bad_request("invalid_request", None, e.body_text()))
}

/// The query's parameters by name: only those named in `known`, each once;
/// any other refused by name.
fn query<'q>(
    pairs: &'q [(String, String)],
    known: &[&str],
) -> Result<std::collections::BTreeMap<&'q str, &'q str>, OpenAiError> {
    let mut seen = std::collections::BTreeMap::new();
    for (name, value) in pairs {
        if !known.contains(&name.as_str()) {
            return Err(OpenAiError::bad_request(
                "unsupported_parameter",
                Some(name),
                format!("`{name}` is not a parameter surety honours here"),
            ));
        }
        if seen.insert(name.as_str(), value.as_str()).is_some() {
            return Err(refuse(name, format!("`{name}` is given twice")));
        }
    }
    Ok(seen)
}

fn flag(name: &str, value: Option<&&str>) -> Result<bool, OpenAiError> {
    match value.copied() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(refuse(name, format!("`{name}` must be true or false"))),
    }
}

/// `include` on a read: only empty, as on create.
fn no_include(value: Option<&&str>) -> Result<(), OpenAiError> {
    match value.copied() {
        None | Some("") => Ok(()),
        Some(v) => Err(OpenAiError::bad_request(
            "unsupported_parameter",
            Some("include"),
            format!(
                "`include` of {v} is not supported: a surety response has no reasoning, logprobs or tool outputs to add"
            ),
        )),
    }
}

/// The response a stored job is now, echoing the request it was created from.
fn as_now(state: &AppState, job: &Job, attempts: &[Attempt]) -> ResponseObject {
    let request = job.request.clone().unwrap_or(Value::Null);
    response_of(job, attempts, &request, tool_calls(state, job))
}

/// Whether the response's contract answers with tool calls, as it is
/// served now.
fn tool_calls(state: &AppState, job: &Job) -> bool {
    state
        .inner
        .contracts
        .get(&job.contract)
        .is_some_and(|served| served.contract.tool_calls.is_some())
}

/// A response as it is now.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}",
    tag = "openai",
    params(
        ("id" = String, Path, description = "The response's id (`resp_…`)"),
        ("stream" = Option<bool>, Query, description = "Its events as server-sent events, sent as the job moves"),
        ("starting_after" = Option<u64>, Query, description = "With `stream`: only the events after this sequence number (a broken stream resumed); without, the whole response is the answer"),
    ),
    responses(
        (status = 200, description = "The response: `queued` or `in_progress` while it runs (an unknown job stays `in_progress`, with `status_reason` saying why), then `completed`, `failed` or `cancelled`; with `stream`, its events", content(
            (ResponseObject = "application/json"),
            (ResponseEventDoc = "text/event-stream"),
        )),
        (status = 400, description = "A query parameter surety does not honour (named in `param`)", body = OpenAiErrorView),
        (status = 404, description = "No response of this owner has this id", body = OpenAiErrorView),
        OpenAiUnauthorized,
        OpenAiLimited,
    )
)]
pub async fn retrieve_response(
    State(state): State<AppState>,
    OpenAiCaller(caller): OpenAiCaller,
    Path(id): Path<String>,
    pairs: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, OpenAiError> {
    // Whose response it is comes first: another owner's, or an id
    // surety never made, is not found whatever the query asks.
    let owner = surety_store::OwnerId(caller.0.owner);
    let (job, attempts) = find_response(&state, &owner, &id, None).await?;
    let pairs = pairs_of(pairs)?;
    let asked = query(
        &pairs,
        &["stream", "starting_after", "include", "include_obfuscation"],
    )?;
    let stream = flag("stream", asked.get("stream"))?;
    no_include(asked.get("include"))?;
    // Obfuscation pads streamed deltas against length side channels; a
    // surety stream is replayed from the store, so there is none to turn off.
    flag("include_obfuscation", asked.get("include_obfuscation"))?;
    let after = match asked.get("starting_after") {
        None => None,
        // A sequence number, in the int64 the document declares it as.
        Some(n) => Some(
            n.parse::<i64>()
                .ok()
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| {
                    refuse(
                        "starting_after",
                        "`starting_after` must be an event's sequence number",
                    )
                })?,
        ),
    };
    // Without `stream` the whole response is the answer, as OpenAI's is:
    // `starting_after` only says where a stream resumes.
    if !stream {
        return Ok(Json(as_now(&state, &job, &attempts)).into_response());
    }
    let request = job.request.clone().unwrap_or(Value::Null);
    let tools = tool_calls(&state, &job);
    let now = CreatedJob::watched(&state, job);
    Ok(live(
        &state,
        &owner,
        now,
        request,
        tools,
        after,
        answer_limit(&state),
    ))
}

/// Cancels a response by the job rules: a job with no attempt open
/// (queued, or failed) is cancelled; one with an attempt started or
/// unknown is refused, as the provider may still be doing the work.
#[utoipa::path(
    post,
    path = "/v1/responses/{id}/cancel",
    tag = "openai",
    params(("id" = String, Path, description = "The response's id (`resp_…`)")),
    responses(
        (status = 200, description = "The response, `cancelled` (cancelling it again answers the same)", body = ResponseObject),
        (status = 404, description = "No response of this owner has this id", body = OpenAiErrorView),
        (status = 409, description = "An attempt is in flight or unknown (the provider may be doing the work), or the response completed", body = OpenAiErrorView),
        OpenAiUnauthorized,
        OpenAiLimited,
    )
)]
pub async fn cancel_response(
    State(state): State<AppState>,
    OpenAiCaller(caller): OpenAiCaller,
    Path(id): Path<String>,
) -> Result<Response, OpenAiError> {
    let owner = surety_store::OwnerId(caller.0.owner);
    let (job, _) = find_response(&state, &owner, &id, None).await?;
    let conflict =
        |code, message: String| OpenAiError::invalid(StatusCode::CONFLICT, code, None, message);
    match state.inner.store.cancel_job(&owner, &job.id).await {
        Ok(()) => state.inner.settled.notify(&job.id),
        Err(StoreError::AttemptOpen {
            ordinal,
            state: open,
            ..
        }) => {
            return Err(conflict(
                "response_in_flight",
                format!(
                    "response `{id}` is not cancelled: its attempt {ordinal} is {open}, and the provider may be doing the work, so surety does not say it was cancelled. A started attempt ends by itself; an unknown one waits for a late answer or an admin (POST /v1/jobs/{job}/attempts/{ordinal}/cancel), after which this cancel succeeds",
                    job = job.id
                ),
            ));
        }
        Err(StoreError::Transition(_)) => {
            return Err(conflict(
                "response_completed",
                format!("response `{id}` completed: there is nothing to cancel"),
            ));
        }
        Err(e) => return Err(ApiError::from(e).into()),
    }
    let (job, attempts) = find_response(&state, &owner, &id, None).await?;
    Ok(Json(as_now(&state, &job, &attempts)).into_response())
}

/// Removes a response from later lookups (by id, `previous_response_id`,
/// its input items). The job stays: its Idempotency-Key still names it,
/// so a retry of the same intent is still answered, never run again.
#[utoipa::path(
    delete,
    path = "/v1/responses/{id}",
    tag = "openai",
    params(("id" = String, Path, description = "The response's id (`resp_…`)")),
    responses(
        (status = 200, description = "Deleted", body = ResponseDeleted),
        (status = 404, description = "No response of this owner has this id (or it was deleted)", body = OpenAiErrorView),
        OpenAiUnauthorized,
        OpenAiLimited,
    )
)]
pub async fn delete_response(
    State(state): State<AppState>,
    OpenAiCaller(caller): OpenAiCaller,
    Path(id): Path<String>,
) -> Result<Response, OpenAiError> {
    let owner = surety_store::OwnerId(caller.0.owner);
    let (job, _) = find_response(&state, &owner, &id, None).await?;
    match state.inner.store.delete_response(&owner, &job.id).await {
        Ok(true) => Ok(Json(ResponseDeleted {
            id: response_id(&job),
            object: "response".to_owned(),
            deleted: true,
        })
        .into_response()),
        // Deleted by another request since it was found.
        Ok(false) => Err(not_found(&id, None)),
        Err(e) => Err(ApiError::from(e).into()),
    }
}

/// The input items a response was created with, as sent: a string input
/// is one user message; each item has an id (its own, or one derived from
/// the response and its place).
fn items(job: &Job) -> Vec<Value> {
    let hex = job_hex(job);
    let input = job
        .request
        .as_ref()
        .map_or(Value::Null, |r| r["input"].clone());
    let sent = match input {
        Value::String(text) => vec![json!({"type": "message", "role": "user", "content": text})],
        Value::Array(items) => items,
        _ => Vec::new(),
    };
    sent.into_iter()
        .enumerate()
        .map(|(i, item)| {
            let mut item = match item {
                Value::Object(item) => item,
                other => [("content".to_owned(), other)].into_iter().collect(),
            };
            let kind = item
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("message")
                .to_owned();
            let prefix = match kind.as_str() {
                "function_call" => "fc",
                "function_call_output" => "fco",
                _ => "msg",
            };
            item.insert("type".to_owned(), Value::String(kind.clone()));
            item.entry("id")
                .or_insert_with(|| Value::String(format!("{prefix}_{hex}_{i}")));
            if kind == "message" {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                let part = match role {
                    "assistant" => "output_text",
                    _ => "input_text",
                };
                if let Some(Value::String(text)) = item.get("content") {
                    let text = text.clone();
                    item.insert("content".to_owned(), json!([{"type": part, "text": text}]));
                }
                item.entry("status").or_insert_with(|| json!("completed"));
            }
            Value::Object(item)
        })
        .collect()
}

/// A response's input items, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/responses/{id}/input_items",
    tag = "openai",
    params(
        ("id" = String, Path, description = "The response's id (`resp_…`)"),
        ("limit" = Option<u64>, Query, description = "Items per page, 1 to 100 (20 without)", minimum = 1, maximum = 100),
        ("order" = Option<String>, Query, description = "`desc` (newest first, without) or `asc`", pattern = "^(asc|desc)$"),
        ("after" = Option<String>, Query, description = "An item's id: the page starts after it"),
    ),
    responses(
        (status = 200, description = "A page of the input items", body = InputItemList),
        (status = 400, description = "A bad or unknown query parameter (named in `param`)", body = OpenAiErrorView),
        (status = 404, description = "No response of this owner has this id, or `after` names no input item of it", body = OpenAiErrorView),
        OpenAiUnauthorized,
        OpenAiLimited,
    )
)]
pub async fn input_items(
    State(state): State<AppState>,
    OpenAiCaller(caller): OpenAiCaller,
    Path(id): Path<String>,
    pairs: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, OpenAiError> {
    // Whose response it is comes first: another owner's, or an id
    // surety never made, is not found whatever the query asks.
    let owner = surety_store::OwnerId(caller.0.owner);
    let (job, _) = find_response(&state, &owner, &id, None).await?;
    let pairs = pairs_of(pairs)?;
    let asked = query(&pairs, &["limit", "order", "after", "include"])?;
    no_include(asked.get("include"))?;
    let limit = match asked.get("limit") {
        None => DEFAULT_ITEMS_PAGE,
        Some(n) => n
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_ITEMS_PAGE).contains(n))
            .ok_or_else(|| refuse("limit", format!("`limit` must be 1 to {MAX_ITEMS_PAGE}")))?,
    };
    let newest_first = match asked.get("order").copied() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(_) => return Err(refuse("order", "`order` must be `asc` or `desc`")),
    };
    let mut all = items(&job);
    if newest_first {
        all.reverse();
    }
    let start = match asked.get("after") {
        None => 0,
        Some(after) => {
            all.iter()
                .position(|item| item["id"] == *after)
                .ok_or_else(|| {
                    OpenAiError::invalid(
                        StatusCode::NOT_FOUND,
                        "input_item_not_found",
                        Some("after"),
                        format!("no input item `{after}` in response `{id}`"),
                    )
                })?
                + 1
        }
    };
    let rest = all.get(start..).unwrap_or_default();
    let data: Vec<Value> = rest.iter().take(limit).cloned().collect();
    let id_of = |item: Option<&Value>| item.and_then(|i| i["id"].as_str()).map(str::to_owned);
    Ok(Json(InputItemList {
        object: "list".to_owned(),
        first_id: id_of(data.first()),
        last_id: id_of(data.last()),
        has_more: rest.len() > data.len(),
        data,
    })
    .into_response())
}
