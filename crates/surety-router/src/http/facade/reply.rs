//! A settled job as OpenAI's answer: a typed chat completion, its stream
//! of chunks, or the error that says why there is none.

use std::convert::Infallible;

use axum::Json;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use surety_core::{AttemptState, JobState};
use surety_providers::CalledTool;
use surety_store::{Attempt, Job};

use super::{Delivery, OpenAiError};
use crate::http::views::{
    AnswerMessage, ChatCompletion, ChatCompletionChunk, Choice, ChunkChoice, Delta,
    FunctionCallView, FunctionDelta, PromptTokensDetails, ToolCallDelta, ToolCallView, UsageTotals,
    UsageView, finish_reason,
};

/// The job's answer as a chat completion (or its stream), or why there is none.
pub(super) fn answer(
    job: &Job,
    attempts: &[Attempt],
    delivery: Delivery,
) -> Result<Response, OpenAiError> {
    match (job.state, &job.result) {
        (JobState::Succeeded, Some(result)) => {
            let completion = ChatCompletion::of(job, result, delivery.tool_calls);
            Ok(match delivery.stream {
                true => completion.stream(delivery.include_usage),
                false => Json(completion).into_response(),
            })
        }
        _ => Err(unsettled(job, attempts)),
    }
}

/// Why a job that has not succeeded has no answer: every provider failed
/// (502), it is unknown (504, never retried on its own), or it has not
/// settled yet (504, ask again).
pub(super) fn unsettled(job: &Job, attempts: &[Attempt]) -> OpenAiError {
    let error = |status, code, should_retry, retry_after, message: String| OpenAiError {
        status,
        kind: "server_error",
        code,
        param: None,
        message,
        should_retry: Some(should_retry),
        retry_after,
    };
    match job.state {
        JobState::Failed => {
            let last = attempts
                .last()
                .and_then(|a| a.error.clone())
                .unwrap_or_default();
            error(
                StatusCode::BAD_GATEWAY,
                "provider_error",
                false,
                None,
                format!("every certified provider failed; the last said: {last}"),
            )
        }
        JobState::Unknown => {
            let open = attempts
                .iter()
                .rev()
                .find(|a| a.state == AttemptState::Unknown);
            let (n, provider) = open.map_or((0, ""), |a| (a.ordinal, a.provider.as_str()));
            error(
                StatusCode::GATEWAY_TIMEOUT,
                "job_unknown",
                false,
                None,
                format!(
                    "job {id} is unknown: attempt {n} at provider `{provider}` got no answer in time, and the provider may have done the work, so nothing is retried on its own. A late answer still completes the job (ask again with the same Idempotency-Key to get it); otherwise an admin cancels the attempt (POST /v1/jobs/{id}/attempts/{n}/cancel) and retries the job (POST /v1/jobs/{id}/retry)",
                    id = job.id
                ),
            )
        }
        state_now => error(
            StatusCode::GATEWAY_TIMEOUT,
            "job_not_settled",
            true,
            Some(2),
            format!(
                "job {} is {state_now}; ask again with the same Idempotency-Key and the same body to get its answer, or GET /v1/jobs/{}",
                job.id, job.id
            ),
        ),
    }
}

/// The characters of the answer per chunk of its stream.
const STREAM_PIECE_CHARS: usize = 24;

/// The job's id without its dashes: the stable part of the ids its
/// answer shows in either dialect (`chatcmpl-`, `resp_`, `msg_`, `call_`).
pub(super) fn job_hex(job: &Job) -> String {
    job.id.0.chars().filter(|c| *c != '-').collect()
}

/// A tool-call contract's canonical answer (`{"tool", "arguments"}`, or
/// `{"calls": […]}`) as the calls it makes, each id derived from the job
/// and the call's place (`call_<job>`, `call_<job>_1`, …), so a replay,
/// and either dialect, names the same calls.
pub(super) fn answer_calls(job: &Job, answer: &serde_json::Value) -> Vec<CalledTool> {
    let job_hex = job_hex(job);
    surety_contracts::calls(answer)
        .into_iter()
        .enumerate()
        .map(|(i, (_, call))| CalledTool {
            id: match i {
                0 => format!("call_{job_hex}"),
                i => format!("call_{job_hex}_{i}"),
            },
            name: call["tool"].as_str().unwrap_or_default().to_owned(),
            arguments: call["arguments"].to_string(),
        })
        .collect()
}

/// OpenAI's tool calls of a tool-call contract's answer.
fn tool_calls_of(job: &Job, answer: &serde_json::Value) -> Vec<ToolCallView> {
    answer_calls(job, answer)
        .into_iter()
        .map(|call| ToolCallView {
            id: call.id,
            kind: "function".to_owned(),
            function: FunctionCallView {
                name: call.name,
                arguments: call.arguments,
            },
        })
        .collect()
}

/// `text` in the pieces a stream sends it in.
pub(super) fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .chunks(STREAM_PIECE_CHARS)
        .map(|piece| piece.iter().collect())
        .collect()
}

impl ChatCompletion {
    /// A succeeded job's answer (`result`) as a chat completion: its JSON
    /// as content, or a tool-call contract's as `tool_calls`.
    fn of(job: &Job, result: &serde_json::Value, tool_calls: bool) -> ChatCompletion {
        let usage = UsageView::of(job).unwrap_or_default();
        let (prompt, completion) = (usage.prompt_tokens, usage.completion_tokens);
        let (content, calls, finish) = match tool_calls {
            true => (
                None,
                Some(tool_calls_of(job, result)),
                "tool_calls".to_owned(),
            ),
            false => (
                Some(result.to_string()),
                None,
                finish_reason(job).unwrap_or_else(|| "stop".to_owned()),
            ),
        };
        ChatCompletion {
            id: format!("chatcmpl-{}", job.id),
            object: "chat.completion".to_owned(),
            created: job.created_at_ms / 1000,
            model: job.route.clone(),
            choices: vec![Choice {
                index: 0,
                message: AnswerMessage {
                    role: "assistant".to_owned(),
                    content,
                    refusal: None,
                    tool_calls: calls,
                },
                logprobs: None,
                finish_reason: finish,
            }],
            usage: UsageTotals {
                prompt_tokens: prompt,
                completion_tokens: completion,
                total_tokens: prompt + completion,
                prompt_tokens_details: PromptTokensDetails {
                    cached_tokens: usage.cache_read_tokens,
                },
            },
        }
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<UsageTotals>) -> Event {
        let chunk = ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        };
        match Event::default().json_data(&chunk) {
            Ok(event) => event,
            // Plain structs of strings and numbers always serialise.
            Err(e) => Event::default().data(format!("{{\"error\":\"{e}\"}}")),
        }
    }

    /// Server-sent events in OpenAI's chunk format: the role, the content
    /// in pieces, the finish reason, the usage when asked for, then
    /// `[DONE]`. The answer was checked before the first byte.
    fn stream(self, include_usage: bool) -> Response {
        let Some(choice) = self.choices.first() else {
            return Sse::new(futures_util::stream::empty::<Result<Event, Infallible>>())
                .into_response();
        };
        let delta = |role: Option<&str>, content: Option<String>, finish: Option<String>| {
            vec![ChunkChoice {
                index: 0,
                delta: Delta {
                    role: role.map(str::to_owned),
                    content,
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: finish,
            }]
        };
        let mut events = Vec::new();
        match (&choice.message.content, &choice.message.tool_calls) {
            (_, Some(calls)) => {
                // Each call: its id, type and name first, then its
                // arguments in pieces, as OpenAI streams `delta.tool_calls`.
                for (i, call) in calls.iter().enumerate() {
                    let index = u32::try_from(i).unwrap_or(u32::MAX);
                    let calling = |head: bool, arguments: String| {
                        let mut chunk =
                            delta(head.then_some("assistant").filter(|_| i == 0), None, None);
                        chunk[0].delta.tool_calls = Some(vec![ToolCallDelta {
                            index,
                            id: head.then(|| call.id.clone()),
                            kind: head.then(|| call.kind.clone()),
                            function: FunctionDelta {
                                name: head.then(|| call.function.name.clone()),
                                arguments,
                            },
                        }]);
                        chunk
                    };
                    events.push(self.chunk(calling(true, String::new()), None));
                    for piece in pieces(&call.function.arguments) {
                        events.push(self.chunk(calling(false, piece), None));
                    }
                }
            }
            (content, None) => {
                events.push(self.chunk(delta(Some("assistant"), Some(String::new()), None), None));
                for piece in pieces(content.as_deref().unwrap_or_default()) {
                    events.push(self.chunk(delta(None, Some(piece), None), None));
                }
            }
        }
        events.push(self.chunk(delta(None, None, Some(choice.finish_reason.clone())), None));
        if include_usage {
            events.push(self.chunk(Vec::new(), Some(self.usage.clone())));
        }
        events.push(Event::default().data("[DONE]"));
        let stream = futures_util::stream::iter(events.into_iter().map(Ok::<Event, Infallible>));
        Sse::new(stream).into_response()
    }
}
