//! A job as a response object, and its stream of events: the same for the
//! job's first answer and for every replay of it, so ids, items and
//! sequence numbers never change.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use surety_core::JobState;
use surety_store::{Attempt, Job, OwnerId};

use super::super::reply::{answer_calls, job_hex, pieces, unsettled};
use crate::http::views::{
    InputTokensDetails, OutputItem, OutputText, OutputTokensDetails, ResponseErrorView,
    ResponseEvent, ResponseObject, ResponseUsage, UsageView, response_id,
};
use crate::jobs::{CreatedJob, wait_at_rest};
use crate::state::AppState;

/// A succeeded job's answer as output items: its JSON as an output message,
/// or a tool-call contract's calls as function calls (call ids as the Chat
/// facade gives them, so a history sent back through either names the same
/// calls).
fn output(job: &Job, result: &Value, tool_calls: bool) -> Vec<OutputItem> {
    match tool_calls {
        false => vec![OutputItem::Message {
            id: format!("msg_{}", job_hex(job)),
            status: "completed".to_owned(),
            role: "assistant".to_owned(),
            content: vec![text_part(result.to_string())],
        }],
        true => answer_calls(job, result)
            .into_iter()
            .map(|call| OutputItem::FunctionCall {
                id: call.id.replacen("call_", "fc_", 1),
                call_id: call.id,
                name: call.name,
                arguments: call.arguments,
                status: "completed".to_owned(),
            })
            .collect(),
    }
}

fn text_part(text: String) -> OutputText {
    OutputText {
        kind: "output_text".to_owned(),
        text,
        annotations: Vec::new(),
        logprobs: Vec::new(),
    }
}

/// The response a job is, as it is now, echoing the request it was
/// created from. A job `unknown` is `in_progress` (the SDK keeps polling
/// it) with `status_reason` saying why, never `failed` or `completed`.
pub(super) fn response_of(
    job: &Job,
    attempts: &[Attempt],
    request: &Value,
    tool_calls: bool,
) -> ResponseObject {
    let (status, output_items) = match (job.state, &job.result) {
        (JobState::Succeeded, Some(result)) => ("completed", output(job, result, tool_calls)),
        (JobState::Failed, _) => ("failed", Vec::new()),
        (JobState::Cancelled, _) => ("cancelled", Vec::new()),
        (JobState::Queued, _) => ("queued", Vec::new()),
        _ => ("in_progress", Vec::new()),
    };
    let error = (job.state == JobState::Failed).then(|| ResponseErrorView {
        code: "server_error".to_owned(),
        message: unsettled(job, attempts).message,
    });
    let status_reason = match job.state {
        JobState::Unknown => Some(unsettled(job, attempts).message),
        JobState::Queued => Some(format!(
            "job {id} has no attempt open: it waits for a retry (POST /v1/jobs/{id}/retry) or a cancel (POST /v1/responses/{resp}/cancel)",
            id = job.id,
            resp = response_id(job)
        )),
        _ => None,
    };
    let usage = UsageView::of(job).map(|u| ResponseUsage {
        input_tokens: u.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: u.cache_read_tokens,
        },
        output_tokens: u.completion_tokens,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: 0,
        },
        total_tokens: u.prompt_tokens + u.completion_tokens,
    });
    let or = |name: &str, default: Value| match &request[name] {
        Value::Null => default,
        sent => sent.clone(),
    };
    ResponseObject {
        id: response_id(job),
        object: "response".to_owned(),
        created_at: job.created_at_ms / 1000,
        status: status.to_owned(),
        completed_at: (status == "completed").then_some(job.updated_at_ms / 1000),
        error,
        incomplete_details: None,
        instructions: request["instructions"].as_str().map(str::to_owned),
        max_output_tokens: request["max_output_tokens"].as_u64(),
        model: job.route.clone(),
        output: output_items,
        parallel_tool_calls: request["parallel_tool_calls"].as_bool().unwrap_or(true),
        previous_response_id: request["previous_response_id"].as_str().map(str::to_owned),
        temperature: request["temperature"].as_f64(),
        top_p: request["top_p"].as_f64(),
        tool_choice: or("tool_choice", json!("auto")),
        tools: or("tools", json!([])),
        text: or("text", json!({"format": {"type": "text"}})),
        truncation: "disabled".to_owned(),
        metadata: or("metadata", json!({})),
        store: request["store"].as_bool().unwrap_or(true),
        background: request["background"].as_bool().unwrap_or(false),
        usage,
        job_id: job.id.0.clone(),
        status_reason,
    }
}

/// An event as server-sent: its type in the `event` field, itself as `data`.
fn sse(event: &ResponseEvent) -> Result<Event, Infallible> {
    let sse = Event::default().event(event.kind());
    Ok(match sse.json_data(event) {
        Ok(sse) => sse,
        // Plain structs of strings and numbers always serialise.
        Err(e) => Event::default().data(format!("{{\"error\":\"{e}\"}}")),
    })
}

/// The response as JSON, or with `stream` as its events.
pub(super) fn deliver(response: ResponseObject, stream: bool) -> Response {
    match stream {
        false => Json(response).into_response(),
        true => {
            let events = events(&response);
            Sse::new(futures_util::stream::iter(
                events.iter().map(sse).collect::<Vec<_>>(),
            ))
            .into_response()
        }
    }
}

/// How many events open every response's stream (created, in progress):
/// the same whatever becomes of the job, so they are sent before it ends.
const OPENING_EVENTS: usize = 2;

/// The events of the response after sequence number `after` (all of them
/// without), sent as the job moves: the opening events at once, then the
/// rest when the job comes to rest (or `limit` passes). A job that ends
/// `unknown`, cancelled or still running has no closing event, so the
/// stream ends after the opening ones: the client reads the response
/// (`GET /v1/responses/{id}`), or resumes the stream, later. Each event is
/// the same, with the same number, however often and from wherever the
/// stream is read, so a resumed stream gets exactly the events it missed.
pub(super) fn live(
    state: &AppState,
    owner: &OwnerId,
    now: CreatedJob,
    request: Value,
    tool_calls: bool,
    after: Option<u64>,
    limit: Duration,
) -> Response {
    let unseen = move |event: &ResponseEvent| after.is_none_or(|n| event.sequence_number() > n);
    let (state, owner) = (state.clone(), owner.clone());
    let opening: Vec<_> = events(&response_of(&now.job, &[], &request, tool_calls))
        .into_iter()
        .take(OPENING_EVENTS)
        .filter(unseen)
        .collect();
    let rest = futures_util::stream::once(async move {
        let rest = match wait_at_rest(&state, &owner, now, limit).await {
            Ok((_, job, attempts)) => events(&response_of(&job, &attempts, &request, tool_calls))
                .into_iter()
                .skip(OPENING_EVENTS)
                .filter(unseen)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "a response's stream could not read its job");
                Vec::new()
            }
        };
        futures_util::stream::iter(rest)
    })
    .flatten();
    let all = futures_util::stream::iter(opening)
        .chain(rest)
        .map(|event| sse(&event));
    Sse::new(all)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A response's events, numbered from 0: created and in progress (with no
/// output yet); then, once completed, each output item added, its content
/// in deltas, done, and completed with the whole response; once failed,
/// failed with it; otherwise nothing more yet.
pub(super) fn events(done: &ResponseObject) -> Vec<ResponseEvent> {
    let mut events = Vec::new();
    let mut next = 0u64;
    let mut seq = || {
        next += 1;
        next - 1
    };
    let mut opening = done.clone();
    opening.status = "in_progress".to_owned();
    opening.output = Vec::new();
    opening.usage = None;
    opening.completed_at = None;
    opening.error = None;
    opening.status_reason = None;
    events.push(ResponseEvent::Created {
        response: Box::new(opening.clone()),
        sequence_number: seq(),
    });
    events.push(ResponseEvent::InProgress {
        response: Box::new(opening),
        sequence_number: seq(),
    });
    match done.status.as_str() {
        "completed" => {}
        "failed" => {
            events.push(ResponseEvent::Failed {
                response: Box::new(done.clone()),
                sequence_number: seq(),
            });
            return events;
        }
        _ => return events,
    }
    for (index, item) in done.output.iter().enumerate() {
        let output_index = index as u64;
        match item {
            OutputItem::Message {
                id, role, content, ..
            } => {
                events.push(ResponseEvent::OutputItemAdded {
                    output_index,
                    item: OutputItem::Message {
                        id: id.clone(),
                        status: "in_progress".to_owned(),
                        role: role.clone(),
                        content: Vec::new(),
                    },
                    sequence_number: seq(),
                });
                for (part_index, part) in content.iter().enumerate() {
                    let content_index = part_index as u64;
                    events.push(ResponseEvent::ContentPartAdded {
                        item_id: id.clone(),
                        output_index,
                        content_index,
                        part: text_part(String::new()),
                        sequence_number: seq(),
                    });
                    for delta in pieces(&part.text) {
                        events.push(ResponseEvent::OutputTextDelta {
                            item_id: id.clone(),
                            output_index,
                            content_index,
                            delta,
                            logprobs: Vec::new(),
                            sequence_number: seq(),
                        });
                    }
                    events.push(ResponseEvent::OutputTextDone {
                        item_id: id.clone(),
                        output_index,
                        content_index,
                        text: part.text.clone(),
                        logprobs: Vec::new(),
                        sequence_number: seq(),
                    });
                    events.push(ResponseEvent::ContentPartDone {
                        item_id: id.clone(),
                        output_index,
                        content_index,
                        part: part.clone(),
                        sequence_number: seq(),
                    });
                }
            }
            OutputItem::FunctionCall {
                id,
                call_id,
                name,
                arguments,
                ..
            } => {
                events.push(ResponseEvent::OutputItemAdded {
                    output_index,
                    item: OutputItem::FunctionCall {
                        id: id.clone(),
                        call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                        status: "in_progress".to_owned(),
                    },
                    sequence_number: seq(),
                });
                for delta in pieces(arguments) {
                    events.push(ResponseEvent::FunctionCallArgumentsDelta {
                        item_id: id.clone(),
                        output_index,
                        delta,
                        sequence_number: seq(),
                    });
                }
                events.push(ResponseEvent::FunctionCallArgumentsDone {
                    item_id: id.clone(),
                    output_index,
                    name: name.clone(),
                    arguments: arguments.clone(),
                    sequence_number: seq(),
                });
            }
        }
        events.push(ResponseEvent::OutputItemDone {
            output_index,
            item: item.clone(),
            sequence_number: seq(),
        });
    }
    events.push(ResponseEvent::Completed {
        response: Box::new(done.clone()),
        sequence_number: seq(),
    });
    events
}
