//! A settled job as Anthropic's message, or its stream of events: the
//! same for the job's first answer and every replay, so ids and blocks
//! never change.

use std::convert::Infallible;

use axum::Json;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use surety_core::JobState;
use surety_store::{Attempt, Job};

use super::super::reply::{answer_calls, pieces, unsettled};
use super::AnthropicError;
use super::request::Asked;
use crate::http::views::{
    BlockDelta, ContentBlock, DeltaUsage, MessageDelta, MessageEvent, MessageObject, MessagesUsage,
    UsageView, finish_reason, message_id,
};

/// The job's answer as a message (or its stream), or why there is none.
pub(super) fn answer(
    job: &Job,
    attempts: &[Attempt],
    asked: Asked,
) -> Result<Response, AnthropicError> {
    match (job.state, &job.result) {
        (JobState::Succeeded, Some(result)) => {
            let message = message_of(job, result, asked.tool_calls);
            Ok(match asked.stream {
                true => stream(message),
                false => Json(message).into_response(),
            })
        }
        _ => Err(unsettled(job, attempts).into()),
    }
}

/// A succeeded job's answer (`result`) as a message: its JSON as a text
/// block, or a tool-call contract's calls as `tool_use` blocks.
fn message_of(job: &Job, result: &serde_json::Value, tool_calls: bool) -> MessageObject {
    let usage = UsageView::of(job).unwrap_or_default();
    let (content, stop) = match tool_calls {
        true => (
            answer_calls(job, result)
                .into_iter()
                .map(|call| ContentBlock::ToolUse {
                    input: call.arguments_json(),
                    id: call.id,
                    name: call.name,
                })
                .collect(),
            "tool_use",
        ),
        false => (
            vec![ContentBlock::Text {
                text: result.to_string(),
            }],
            match finish_reason(job).as_deref() {
                Some("length") => "max_tokens",
                _ => "end_turn",
            },
        ),
    };
    MessageObject {
        id: message_id(job),
        kind: "message".to_owned(),
        role: "assistant".to_owned(),
        content,
        model: job.route.clone(),
        stop_reason: Some(stop.to_owned()),
        stop_sequence: None,
        // Anthropic's `input_tokens` are the ones the cache neither read
        // nor wrote.
        usage: MessagesUsage {
            input_tokens: usage
                .prompt_tokens
                .saturating_sub(usage.cache_read_tokens + usage.cache_write_tokens),
            output_tokens: usage.completion_tokens,
            cache_creation_input_tokens: usage.cache_write_tokens,
            cache_read_input_tokens: usage.cache_read_tokens,
        },
    }
}

fn event(message: &MessageEvent) -> Event {
    Event::default()
        .event(message.kind())
        .json_data(message)
        // Plain structs of strings and numbers always serialise.
        .unwrap_or_else(|e| {
            Event::default().event("error").data(format!(
                "{{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"{e}\"}}}}"
            ))
        })
}

/// The message as Anthropic's events: `message_start` (no content yet,
/// no stop reason), a `ping`, each block started, sent in pieces
/// (`text_delta`, or a call's `input_json_delta`) and stopped, then
/// `message_delta` (the stop reason and the output's tokens) and
/// `message_stop`. The answer was checked before the first byte.
fn stream(message: MessageObject) -> Response {
    let start = MessageObject {
        content: Vec::new(),
        stop_reason: None,
        usage: MessagesUsage {
            output_tokens: 0,
            ..message.usage.clone()
        },
        ..message.clone()
    };
    let mut events = vec![
        MessageEvent::MessageStart {
            message: Box::new(start),
        },
        MessageEvent::Ping,
    ];
    for (index, block) in message.content.iter().enumerate() {
        let index = index as u64;
        let (opening, rest) = match block {
            ContentBlock::Text { text } => (
                ContentBlock::Text {
                    text: String::new(),
                },
                pieces(text)
                    .into_iter()
                    .map(|text| BlockDelta::TextDelta { text })
                    .collect::<Vec<_>>(),
            ),
            ContentBlock::ToolUse { id, name, input } => (
                ContentBlock::ToolUse {
                    id: id.clone(),
                    name: name.clone(),
                    input: serde_json::json!({}),
                },
                pieces(&input.to_string())
                    .into_iter()
                    .map(|partial_json| BlockDelta::InputJsonDelta { partial_json })
                    .collect(),
            ),
        };
        events.push(MessageEvent::ContentBlockStart {
            index,
            content_block: opening,
        });
        events.extend(
            rest.into_iter()
                .map(|delta| MessageEvent::ContentBlockDelta { index, delta }),
        );
        events.push(MessageEvent::ContentBlockStop { index });
    }
    events.push(MessageEvent::MessageDelta {
        delta: MessageDelta {
            stop_reason: message.stop_reason.clone().unwrap_or_default(),
            stop_sequence: None,
        },
        usage: DeltaUsage {
            output_tokens: message.usage.output_tokens,
        },
    });
    events.push(MessageEvent::MessageStop);
    let events: Vec<Event> = events.iter().map(event).collect();
    Sse::new(futures_util::stream::iter(
        events.into_iter().map(Ok::<Event, Infallible>),
    ))
    .into_response()
}
