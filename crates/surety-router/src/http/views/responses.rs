//! The Responses API's wire shapes (`POST /v1/responses`), as OpenAI's
//! SDKs type them: the response object, its output items, and the
//! server-sent events of its stream.

use serde::Serialize;
use serde_json::Value;
use surety_store::{Job, JobId};
use utoipa::ToSchema;

/// The id of the response a job is: `resp_` and the job id's hex.
pub fn response_id(job: &Job) -> String {
    format!("resp_{}", job.id.0.replace('-', ""))
}

/// The job a response id names (`resp_` and the job id's hex), or `None`
/// for an id surety never made.
pub fn response_job(response_id: &str) -> Option<JobId> {
    let hex = response_id.strip_prefix("resp_")?;
    let id = uuid::Uuid::try_parse(hex).ok()?;
    Some(JobId(id.hyphenated().to_string()))
}

/// `POST /v1/responses`, as far as surety reads it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResponseRequestDoc {
    /// A route's id.
    pub model: String,
    /// A string (one user message), or a list of items: `message` (roles
    /// user, system, developer, assistant; `input_text` or `output_text`
    /// content), `function_call` and `function_call_output`.
    pub input: Value,
    /// On a pinned route: the contract's rendered system prompt.
    pub instructions: Option<String>,
    /// An earlier response of the same owner to continue (output-only routes).
    pub previous_response_id: Option<String>,
    /// `{"format": {"type": "text"}}`, or `json_schema` with exactly the
    /// contract's output schema.
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
    /// On a tool-call route: exactly the contract's certified tools.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Only the contract's own.
    pub max_output_tokens: Option<u32>,
    /// Only the contract's own.
    pub temperature: Option<f64>,
    /// Only 1.
    pub top_p: Option<f64>,
    /// Up to 16 pairs of strings, echoed on the response.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// `false`: the response cannot be continued by `previous_response_id`
    /// (surety keeps the job itself, for its Idempotency-Key).
    pub store: Option<bool>,
    pub stream: Option<bool>,
    /// Only an empty list.
    pub include: Option<Vec<String>>,
    /// `disabled` only.
    pub truncation: Option<String>,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
}

/// A response: a job asked for through the Responses API.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseObject {
    /// `resp_` and the job's id: stable per job, so a replay answers the same.
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub created_at: i64,
    #[schema(value_type = String, pattern = "^(queued|in_progress|completed|failed|incomplete|cancelled)$")]
    pub status: String,
    pub completed_at: Option<i64>,
    pub error: Option<ResponseErrorView>,
    #[schema(value_type = Option<Object>)]
    pub incomplete_details: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    /// The route.
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `auto`, `required`, `none`, or a named function.
    pub tool_choice: Value,
    #[schema(value_type = Vec<Object>)]
    pub tools: Value,
    #[schema(value_type = Object)]
    pub text: Value,
    pub truncation: String,
    #[schema(value_type = Object)]
    pub metadata: Value,
    pub store: bool,
    pub background: bool,
    pub usage: Option<ResponseUsage>,
    /// The surety job this response is.
    pub job_id: String,
    /// Why the response has its status, where the status alone would
    /// mislead: a job `unknown` (its attempt timed out after the request
    /// left, so the provider may have done the work) is `in_progress`
    /// with this saying so, and stays so until it is resolved; a job
    /// waiting for a retry is `queued` with this saying why.
    pub status_reason: Option<String>,
}

/// Why a response failed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseErrorView {
    pub code: String,
    pub message: String,
}

/// An item of a response's output.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The answer as text: the contract's JSON.
    Message {
        id: String,
        #[schema(value_type = String, pattern = "^(in_progress|completed|incomplete)$")]
        status: String,
        /// Always `assistant`.
        role: String,
        content: Vec<OutputText>,
    },
    /// A tool-call contract's answer: one call.
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        /// The call's arguments, as JSON text.
        arguments: String,
        #[schema(value_type = String, pattern = "^(in_progress|completed|incomplete)$")]
        status: String,
    },
}

/// A text part of an output message.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputText {
    /// Always `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub logprobs: Vec<Value>,
}

/// Tokens, as the winning provider counted them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: u64,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u64,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InputTokensDetails {
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u64,
}

/// One server-sent event of a streamed response; each names its `type` in
/// the SSE `event` field too, and carries its place in the stream
/// (`sequence_number`, from 0).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type")]
pub enum ResponseEvent {
    #[serde(rename = "response.created")]
    Created {
        response: Box<ResponseObject>,
        sequence_number: u64,
    },
    #[serde(rename = "response.in_progress")]
    InProgress {
        response: Box<ResponseObject>,
        sequence_number: u64,
    },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: u64,
        item: OutputItem,
        sequence_number: u64,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: u64,
        content_index: u64,
        part: OutputText,
        sequence_number: u64,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: u64,
        content_index: u64,
        delta: String,
        #[schema(value_type = Vec<Object>)]
        logprobs: Vec<Value>,
        sequence_number: u64,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: u64,
        content_index: u64,
        text: String,
        #[schema(value_type = Vec<Object>)]
        logprobs: Vec<Value>,
        sequence_number: u64,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: u64,
        content_index: u64,
        part: OutputText,
        sequence_number: u64,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: u64,
        delta: String,
        sequence_number: u64,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: u64,
        name: String,
        arguments: String,
        sequence_number: u64,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: u64,
        item: OutputItem,
        sequence_number: u64,
    },
    #[serde(rename = "response.completed")]
    Completed {
        response: Box<ResponseObject>,
        sequence_number: u64,
    },
    #[serde(rename = "response.failed")]
    Failed {
        response: Box<ResponseObject>,
        sequence_number: u64,
    },
}

impl ResponseEvent {
    /// The event's `type`, for the SSE `event` field.
    pub fn kind(&self) -> &'static str {
        match self {
            ResponseEvent::Created { .. } => "response.created",
            ResponseEvent::InProgress { .. } => "response.in_progress",
            ResponseEvent::OutputItemAdded { .. } => "response.output_item.added",
            ResponseEvent::ContentPartAdded { .. } => "response.content_part.added",
            ResponseEvent::OutputTextDelta { .. } => "response.output_text.delta",
            ResponseEvent::OutputTextDone { .. } => "response.output_text.done",
            ResponseEvent::ContentPartDone { .. } => "response.content_part.done",
            ResponseEvent::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            ResponseEvent::FunctionCallArgumentsDone { .. } => {
                "response.function_call_arguments.done"
            }
            ResponseEvent::OutputItemDone { .. } => "response.output_item.done",
            ResponseEvent::Completed { .. } => "response.completed",
            ResponseEvent::Failed { .. } => "response.failed",
        }
    }

    /// The event's place in its stream.
    pub fn sequence_number(&self) -> u64 {
        match self {
            ResponseEvent::Created {
                sequence_number, ..
            }
            | ResponseEvent::InProgress {
                sequence_number, ..
            }
            | ResponseEvent::OutputItemAdded {
                sequence_number, ..
            }
            | ResponseEvent::ContentPartAdded {
                sequence_number, ..
            }
            | ResponseEvent::OutputTextDelta {
                sequence_number, ..
            }
            | ResponseEvent::OutputTextDone {
                sequence_number, ..
            }
            | ResponseEvent::ContentPartDone {
                sequence_number, ..
            }
            | ResponseEvent::FunctionCallArgumentsDelta {
                sequence_number, ..
            }
            | ResponseEvent::FunctionCallArgumentsDone {
                sequence_number, ..
            }
            | ResponseEvent::OutputItemDone {
                sequence_number, ..
            }
            | ResponseEvent::Completed {
                sequence_number, ..
            }
            | ResponseEvent::Failed {
                sequence_number, ..
            } => *sequence_number,
        }
    }
}

/// `GET /v1/responses/{id}/input_items`: a page of a response's input
/// items, as it was sent (a string input is one user message).
#[derive(Debug, Serialize, ToSchema)]
pub struct InputItemList {
    /// Always `list`.
    pub object: String,
    /// Items: `message` (with `input_text` or `output_text` content),
    /// `function_call`, `function_call_output`; each with an `id`.
    #[schema(value_type = Vec<Object>)]
    pub data: Vec<Value>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}

/// `DELETE /v1/responses/{id}`: the response is no longer found.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResponseDeleted {
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub deleted: bool,
}

/// One server-sent event of a streamed response: `event` is its type and
/// `data` a [`ResponseEvent`] as JSON text.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResponseEventDoc {
    pub event: String,
    pub data: String,
}
