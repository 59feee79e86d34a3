//! Anthropic's Messages API's wire shapes (`POST /v1/messages`), as
//! Anthropic's SDKs type them: the message, its content blocks, the
//! server-sent events of its stream, and the error body.

use serde::Serialize;
use serde_json::Value;
use surety_store::Job;
use utoipa::ToSchema;

/// The id of the message a job is: `msg_` and the job id's hex.
pub fn message_id(job: &Job) -> String {
    format!("msg_{}", job.id.0.replace('-', ""))
}

/// `POST /v1/messages`, as far as surety reads it.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessagesRequestDoc {
    /// A route's id.
    pub model: String,
    /// The turns: `user` and `assistant`, their content text or blocks
    /// (`text`; an assistant's `tool_use` and `thinking`; a user's
    /// `tool_result`), a turn's last block (or a `tool_result`) with a
    /// `cache_control` on an output-only route.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    /// Required: at least the contract's output limit (the provider is
    /// asked for the contract's own, which this bounds).
    pub max_tokens: u64,
    /// On a pinned route: the contract's rendered system prompt (text, or
    /// text blocks, the last with `cache_control` where the contract
    /// caches it, or on an output-only route).
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    /// On a tool-call contract: exactly its certified tools.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// The contract's own, or none.
    pub temperature: Option<f64>,
    /// 1, or none.
    pub top_p: Option<f64>,
    /// None, or empty: the contract's request has none.
    pub stop_sequences: Option<Vec<String>>,
    /// `user_id`, for the caller's records.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    pub stream: Option<bool>,
}

/// `POST /v1/messages/count_tokens`, as far as surety reads it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CountTokensRequestDoc {
    /// A route's id.
    pub model: String,
    /// The turns, as `POST /v1/messages` takes them.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    /// Text, or text blocks.
    #[schema(value_type = Option<Object>)]
    pub system: Option<Value>,
    /// Counted as their definitions' JSON.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// Read, not counted.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
}

/// The tokens of a request's prompt, by the tokenizer the route's
/// provider is certified with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageTokensCount {
    pub input_tokens: u64,
}

/// A message: the job's answer, in Anthropic's shape.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageObject {
    /// `msg_` and the job's id: the same on every replay.
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Always `assistant`.
    pub role: String,
    pub content: Vec<ContentBlock>,
    /// The route's id.
    pub model: String,
    /// `end_turn`, `tool_use` or `max_tokens`; none in a stream's
    /// `message_start`.
    #[schema(value_type = Option<String>, pattern = "^(end_turn|max_tokens|tool_use|stop_sequence|refusal)$")]
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
}

/// A block of a message's content.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// The contract's JSON answer, as text.
    Text { text: String },
    /// A tool-call contract's answer: one call (`id` = the Chat facade's
    /// `call_…`).
    ToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

/// Tokens, as the winning provider counted them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessagesUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

/// `message_delta`'s change to the message.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageDelta {
    pub stop_reason: String,
    pub stop_sequence: Option<String>,
}

/// `message_delta`'s usage: the output's tokens.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeltaUsage {
    pub output_tokens: u64,
}

/// A content block's piece in a stream.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
}

/// One server-sent event of a streamed message; each names its `type` in
/// the SSE `event` field too.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessageEvent {
    MessageStart {
        message: Box<MessageObject>,
    },
    ContentBlockStart {
        index: u64,
        content_block: ContentBlock,
    },
    Ping,
    ContentBlockDelta {
        index: u64,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: u64,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: DeltaUsage,
    },
    MessageStop,
}

impl MessageEvent {
    /// The event's `type`, for the SSE `event` field.
    pub fn kind(&self) -> &'static str {
        match self {
            MessageEvent::MessageStart { .. } => "message_start",
            MessageEvent::ContentBlockStart { .. } => "content_block_start",
            MessageEvent::Ping => "ping",
            MessageEvent::ContentBlockDelta { .. } => "content_block_delta",
            MessageEvent::ContentBlockStop { .. } => "content_block_stop",
            MessageEvent::MessageDelta { .. } => "message_delta",
            MessageEvent::MessageStop => "message_stop",
        }
    }
}

/// One server-sent event of a streamed message: `event` is its type and
/// `data` a [`MessageEvent`] as JSON text.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageEventDoc {
    pub event: String,
    pub data: String,
}

/// An error, in Anthropic's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorView {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`,
    /// `permission_error`, `not_found_error`, `request_too_large`,
    /// `rate_limit_error`, `api_error`, `timeout_error`,
    /// `overloaded_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// `GET /v1/models` with `anthropic-version`: the routes, in Anthropic's
/// shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicModelList {
    pub data: Vec<AnthropicModel>,
    pub has_more: bool,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicModel {
    /// A route's id.
    pub id: String,
    /// Always `model`.
    #[serde(rename = "type")]
    pub kind: String,
    pub display_name: String,
    /// RFC 3339.
    pub created_at: String,
}

/// `GET /v1/models`: the routes in OpenAI's shape, or in Anthropic's to a
/// request that carries `anthropic-version`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ModelsAnswer {
    OpenAi(super::ModelList),
    Anthropic(AnthropicModelList),
}

/// An error of `GET /v1/models`: in OpenAI's format, or in Anthropic's
/// shape to a request that carries `anthropic-version`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
pub enum ModelsError {
    OpenAi(super::OpenAiErrorView),
    Anthropic(AnthropicErrorView),
}
