//! surety's provider adapters.
//!
//! One trait, [`Provider`], reached the same way by the harness and the
//! router: a [`ChatRequest`] gives a [`ChatResponse`] or a classified
//! [`ProviderError`]. One module per wire format ([`openai`], [`anthropic`]);
//! the failure table lives in [`failure`]; configuration in [`config`].
//!
//! Architecture invariant: this crate owns the providers' wire types. Nothing
//! else builds or parses a provider's JSON.

pub mod anthropic;
pub mod config;
pub mod failure;
pub mod gemini;
mod http;
pub mod kinds;
pub mod openai;
pub mod responses;
mod secret;
pub mod tokenizer;
mod tools;
mod wire;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use config::{
    ConfigError, Price, ProviderConfig, ProviderKind, ProvidersConfig, TokenizerConfig,
    build_provider, build_provider_with,
};
pub use failure::{FailureClass, FailureKind, Finish, ProviderError};
pub use http::pooled_client;
pub use secret::Secret;
pub use tokenizer::Tokenizer;

/// A boxed future, so that providers can sit behind `dyn Provider`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One provider, whatever its wire format.
pub trait Provider: Send + Sync + fmt::Debug {
    /// Its validated configuration.
    fn config(&self) -> &ProviderConfig;

    /// The id it has in the configuration.
    fn id(&self) -> &str {
        &self.config().id
    }

    /// What it can do. A request that needs a capability the provider lacks
    /// is refused before sending, never silently degraded.
    fn capabilities(&self) -> &Capabilities {
        &self.config().capabilities
    }

    /// Sends one chat request.
    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>>;

    /// Asks the provider whether an earlier call did the work, where the
    /// provider keeps what it did ([`ProviderConfig::reconciliation`]); by
    /// default it cannot be asked, and the question is refused.
    fn look_up<'a>(&'a self, _lookup: Lookup<'a>) -> BoxFuture<'a, Result<Found, ProviderError>> {
        refused(self.id(), NO_LOOKUP)
    }

    /// Cancels, at the provider, the work of an earlier call it is still
    /// doing (a background response), by the provider's id for it; by
    /// default the provider cannot, and the call is refused.
    fn cancel<'a>(&'a self, _response_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        refused(self.id(), NO_CANCEL)
    }

    /// The models the server says it serves (`/v1/models`), when it has
    /// such an endpoint; by default it has none, and the call is refused.
    fn served_models(&self) -> BoxFuture<'_, Result<Vec<String>, ProviderError>> {
        refused(self.id(), NO_MODELS_ENDPOINT)
    }

    /// The server's own tokenization of `text`, when it has a tokenize
    /// endpoint; by default it has none, and the call is refused.
    fn tokenize<'a>(&'a self, _text: &'a str) -> BoxFuture<'a, Result<Vec<u32>, ProviderError>> {
        refused(self.id(), NO_TOKENIZE_ENDPOINT)
    }

    /// The text of `tokens`, by the same server.
    fn detokenize<'a>(
        &'a self,
        _tokens: &'a [u32],
    ) -> BoxFuture<'a, Result<String, ProviderError>> {
        refused(self.id(), NO_TOKENIZE_ENDPOINT)
    }
}

pub(crate) const NO_LOOKUP: &str =
    "this provider keeps nothing to ask about an earlier call (reconciliation: none)";
pub(crate) const NO_CANCEL: &str =
    "this provider cannot cancel an earlier call (only a background response can be)";
pub(crate) const NO_MODELS_ENDPOINT: &str = "this provider declares no models endpoint";
pub(crate) const NO_TOKENIZE_ENDPOINT: &str = "this provider declares no tokenize endpoint";

/// A call the provider cannot take, refused before anything is sent.
fn refused<T: Send + 'static>(
    provider: &str,
    why: &'static str,
) -> BoxFuture<'static, Result<T, ProviderError>> {
    Box::pin(std::future::ready(Err(ProviderError::not_sent(
        provider, why,
    ))))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering an assistant turn's call (an agent
    /// loop's history, sent through an output-only route).
    Tool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant turn's tool calls, as the conversation had them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<CalledTool>,
    /// A tool turn: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A client's cache breakpoint at the end of this turn (Anthropic's
    /// `cache_control`, as the client sent it), passed through an
    /// output-only route to the kinds that take one and left out for the
    /// others ([`ProviderKind::takes_client_caching`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<Value>,
}

/// A tool call of an earlier assistant turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalledTool {
    pub id: String,
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

impl CalledTool {
    /// The arguments as JSON, for the kinds that send them parsed (an
    /// empty object where the history's text is not JSON).
    pub fn arguments_json(&self) -> Value {
        serde_json::from_str(&self.arguments).unwrap_or_else(|_| serde_json::json!({}))
    }
}

/// The tool call of `earlier` turns whose id is `id`: what a tool result
/// answers.
pub fn called<'a>(earlier: &'a [Message], id: &str) -> Option<&'a CalledTool> {
    earlier
        .iter()
        .flat_map(|m| &m.tool_calls)
        .find(|c| c.id == id)
}

impl Message {
    fn of(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            cache_control: None,
        }
    }

    /// This turn, with the client's cache breakpoint at its end.
    pub fn cached(self, cache_control: Option<Value>) -> Message {
        Message {
            cache_control,
            ..self
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::of(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::of(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>, tool_calls: Vec<CalledTool>) -> Message {
        Message {
            tool_calls,
            ..Message::of(Role::Assistant, content)
        }
    }

    /// A tool's result for the call `id`.
    pub fn tool(id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(id.into()),
            ..Message::of(Role::Tool, content)
        }
    }
}

/// What shape of answer a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    Text,
    /// A JSON value that should match `schema`; `name` labels it on the wire.
    Json {
        name: String,
        schema: Value,
    },
    /// A call of one of these tools: the answer's JSON is its canonical
    /// form, `{"tool": <name>, "arguments": {…}}` (with `parallel`,
    /// `{"calls": [<that>, …]}`).
    Tools(ToolRequest),
}

/// A tool the model may call, as it is sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// The arguments' JSON Schema.
    pub parameters: Value,
}

/// Which of the tools the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolPick {
    /// Any of them, but one of them.
    Any,
    /// This one.
    Named(String),
}

/// The tools of a tool-call request, which to call, and whether more than
/// one call may come back.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<ToolSpec>,
    pub pick: ToolPick,
    pub parallel: bool,
}

/// What of a prompt its contract marks cacheable: where a kind that
/// takes cache breakpoints (Anthropic's `cache_control`) is sent one. The
/// marking is part of the certified request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PromptCache {
    /// The system prompt (and, by the prefix, the tools before it).
    pub system: bool,
    /// The tools' definitions.
    pub tools: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub temperature: f32,
    pub max_tokens: u32,
    pub seed: Option<u64>,
    pub output: OutputFormat,
    /// The contract's cache marking.
    pub cache: PromptCache,
    /// A client's `anthropic-beta` header on an output-only route: sent to
    /// the kinds that take client caching, left out for the others.
    pub anthropic_beta: Option<String>,
}

/// What of a client's `messages` (and its `anthropic-beta`, when `beta`) a
/// provider of `kind` is not sent.
pub fn not_sent(messages: &[Message], beta: bool, kind: ProviderKind) -> Vec<&'static str> {
    if kind.takes_client_caching() {
        return Vec::new();
    }
    let cached = messages.iter().any(|m| m.cache_control.is_some());
    [(cached, "cache_control"), (beta, "anthropic-beta")]
        .into_iter()
        .filter_map(|(left_out, what)| left_out.then_some(what))
        .collect()
}

/// Per call: what ties it to surety's attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallContext {
    /// Sent as the provider-side idempotency key where the provider takes
    /// one; derived from the attempt, so a retry of the same attempt reuses
    /// it. It also names the attempt in a stored answer's metadata
    /// ([`ATTEMPT_METADATA`]), where the provider stores answers.
    pub idempotency_key: String,
    /// Where the adapter tells the provider's id for its answer as soon as
    /// it has read it, before the rest of the answer.
    pub ids: ResponseIds,
}

impl CallContext {
    /// The key for one attempt of one job.
    pub fn for_attempt(job_id: &str, ordinal: i64) -> CallContext {
        CallContext {
            idempotency_key: format!("surety-{job_id}-{ordinal}"),
            ids: ResponseIds::default(),
        }
    }

    /// This call, telling the provider's response id to `ids`.
    pub fn telling(self, ids: ResponseIds) -> CallContext {
        CallContext { ids, ..self }
    }
}

/// The metadata key a stored answer carries its attempt under
/// (`{"surety_attempt": <the call's idempotency key>}`), by which an
/// answer lost on the wire is found afterwards.
pub const ATTEMPT_METADATA: &str = "surety_attempt";

/// Where an adapter tells the provider's id for the answer it is reading
/// (`chatcmpl-…`, `msg_…`, Gemini's `responseId`) the moment it reads it.
/// Told at most once; nobody listening is fine.
#[derive(Debug, Clone, Default)]
pub struct ResponseIds(Option<std::sync::Arc<tokio::sync::watch::Sender<Option<String>>>>);

impl ResponseIds {
    /// A sink and the receiver that sees what it is told.
    pub fn channel() -> (ResponseIds, tokio::sync::watch::Receiver<Option<String>>) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        (ResponseIds(Some(std::sync::Arc::new(tx))), rx)
    }

    /// Tells `id`, unless an id was told already.
    pub(crate) fn tell(&self, id: &str) {
        if let Some(tx) = &self.0 {
            tx.send_if_modified(|held| {
                let first = held.is_none();
                if first {
                    *held = Some(id.to_owned());
                }
                first
            });
        }
    }

    /// Whether anyone is told (an attempt's call, not a certification's).
    pub(crate) fn listening(&self) -> bool {
        self.0.is_some()
    }
}

/// A sink says nothing of the call it belongs to: every two are alike.
impl PartialEq for ResponseIds {
    fn eq(&self, _: &ResponseIds) -> bool {
        true
    }
}

impl Eq for ResponseIds {}

/// A question about an earlier call: did the provider do the work?
#[derive(Debug, Clone, Copy)]
pub struct Lookup<'a> {
    /// The request the call sent (its answer is read as that request's).
    pub request: &'a ChatRequest,
    /// The provider's id for the answer, where the call read it.
    pub response_id: Option<&'a str>,
    /// The call's idempotency key: the attempt's name in the stored
    /// answer's metadata.
    pub attempt: &'a str,
}

impl Lookup<'_> {
    /// How the question is asked: by the id where there is one, else by
    /// the attempt's metadata.
    pub fn by(&self) -> &'static str {
        match self.response_id {
            Some(_) => "id",
            None => "metadata",
        }
    }
}

/// What the provider said of an earlier call.
#[derive(Debug)]
pub enum Found {
    /// It did the work: its answer, read as the call's would have been,
    /// and the provider's id for it.
    Answered {
        response: ChatResponse,
        id: Option<String>,
    },
    /// It did not, and never will (failed, cancelled or expired there):
    /// the provider's words.
    Ended(String),
    /// It is still at work there.
    Running(String),
    /// Nothing found: no proof either way.
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Every prompt token, cached or not (OpenAI's sense).
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of the prompt, the tokens read from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Of the prompt, the tokens written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatResponse {
    /// The answer's text (for a forced tool call, the tool input as JSON
    /// text; for a tool-call request, the canonical answer as JSON text).
    pub text: String,
    /// The parsed answer, when JSON was asked for.
    pub json: Option<Value>,
    /// The model id the response names: the served model, as the provider
    /// tells it with this answer. (Some servers echo the request's `model`;
    /// certification also records the server's listing, off the job path.)
    pub model: String,
    /// How the provider said generation stopped (`stop`, `length`, `end_turn`, ...).
    pub finish_reason: Option<String>,
    pub usage: Usage,
    pub latency: Duration,
    /// How JSON was asked for on the wire.
    pub structured_mode: Option<StructuredMode>,
}

impl ChatResponse {
    /// Why generation stopped, in OpenAI's words whatever the wire format:
    /// `stop` (a natural end, a stop sequence, or the forced tool call that
    /// carries the answer), `length` (the token limit), `content_filter`
    /// (a refusal or a filter); another provider's own word as it is.
    pub fn finish_reason_word(&self) -> Option<String> {
        let raw = self.finish_reason.as_deref()?;
        Some(
            match raw {
                "stop" | "end_turn" | "stop_sequence" | "tool_use" | "tool_calls" | "STOP" => {
                    "stop"
                }
                "length" | "max_tokens" | "MAX_TOKENS" => "length",
                "content_filter" | "refusal" | "SAFETY" | "RECITATION" | "PROHIBITED_CONTENT"
                | "BLOCKLIST" | "SPII" => "content_filter",
                other => other,
            }
            .to_owned(),
        )
    }
}

/// How a provider can be made to answer in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredMode {
    /// OpenAI `response_format: {type: "json_schema", json_schema: {strict: true, ...}}`.
    JsonSchema,
    /// `response_format: {type: "json_object", schema: {...}}`: llama.cpp's
    /// servers grammar-constrain the output to the schema.
    JsonObjectSchema,
    /// `response_format: {type: "json_object"}`: any JSON object.
    JsonObject,
    /// Anthropic: a single tool whose input schema is the contract's, forced by `tool_choice`.
    Tool,
    /// Anthropic: the assistant turn is prefilled with `{`.
    Prefill,
    /// Gemini: `responseMimeType: application/json` with `responseJsonSchema`
    /// (JSON Schema).
    ResponseJsonSchema,
    /// Gemini: `responseMimeType: application/json` with `responseSchema`
    /// (Google's OpenAPI subset: keywords outside it are left out).
    ResponseSchema,
    /// Nothing on the wire: the prompt alone asks for JSON.
    PromptOnly,
}

impl StructuredMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StructuredMode::JsonSchema => "json_schema",
            StructuredMode::JsonObjectSchema => "json_object_schema",
            StructuredMode::JsonObject => "json_object",
            StructuredMode::Tool => "tool",
            StructuredMode::Prefill => "prefill",
            StructuredMode::ResponseJsonSchema => "response_json_schema",
            StructuredMode::ResponseSchema => "response_schema",
            StructuredMode::PromptOnly => "prompt_only",
        }
    }

    /// Whether the schema itself reaches the provider (and may constrain it).
    pub fn sends_schema(self) -> bool {
        match self {
            StructuredMode::JsonSchema
            | StructuredMode::JsonObjectSchema
            | StructuredMode::Tool
            | StructuredMode::ResponseJsonSchema
            | StructuredMode::ResponseSchema => true,
            StructuredMode::JsonObject | StructuredMode::Prefill | StructuredMode::PromptOnly => {
                false
            }
        }
    }
}

impl Capabilities {
    /// Refuses, before anything is sent, a request that needs what the
    /// provider does not declare: a capability is never skipped in silence.
    pub fn check(&self, provider: &str, request: &ChatRequest) -> Result<(), ProviderError> {
        if request.seed.is_some() && !self.seed {
            return Err(ProviderError::not_sent(
                provider,
                "this provider declares no `seed` support; send the request without one",
            ));
        }
        if matches!(request.output, OutputFormat::Tools(_)) && !self.tool_calls {
            return Err(ProviderError::not_sent(
                provider,
                "this provider declares no tool calls (`tool_calls = false`); a tool-call contract needs them",
            ));
        }
        for (i, m) in request.messages.iter().enumerate() {
            let answered = m
                .tool_call_id
                .as_ref()
                .is_some_and(|id| called(&request.messages[..i], id).is_some());
            if m.role == Role::Tool && !answered {
                return Err(ProviderError::not_sent(
                    provider,
                    format!("message {i} is a tool result that answers no earlier tool call"),
                ));
            }
        }
        if request.messages.is_empty() {
            return Err(ProviderError::not_sent(
                provider,
                "a chat request needs at least one message",
            ));
        }
        Ok(())
    }
}

/// What a provider declares it can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Structured-output modes, most preferred first. Never empty.
    pub structured_output: Vec<StructuredMode>,
    /// A `/extras/tokenize` endpoint (llama.cpp servers).
    pub tokenize_endpoint: bool,
    /// A `/v1/models` listing.
    pub models_endpoint: bool,
    /// The request's `seed` is honoured.
    pub seed: bool,
    /// The header that carries a provider-side idempotency key, if the provider takes one.
    pub idempotency_header: Option<String>,
    /// Tools can be offered and called (a tool-call contract).
    pub tool_calls: bool,
    /// Every answer is stored at the provider, with the attempt's
    /// metadata, to be asked for later (OpenAI's `store: true`).
    pub store: bool,
    /// Every call runs in the background at the provider and is polled
    /// (the Responses API's `background: true`).
    pub background: bool,
}
