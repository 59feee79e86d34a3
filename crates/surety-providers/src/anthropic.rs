//! Anthropic Messages (`POST {base_url}/v1/messages`).
//!
//! System messages go to the top-level `system` field; JSON comes through a
//! single forced tool whose input schema is the contract's, or through a
//! prefilled `{` on the assistant turn.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{ConfigError, ProviderConfig};
use crate::http::HttpClient;
use crate::secret::Secret;
use crate::tools::{Arguments, Made};
use crate::wire::Wire;
use crate::{
    CallContext, ChatRequest, ChatResponse, Message, OutputFormat, Provider, ProviderError, Role,
    StructuredMode, ToolPick, Usage,
};

/// The API version this adapter speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The name of the forced tool.
const TOOL_NAME: &str = "answer";

#[derive(Debug)]
pub struct AnthropicProvider {
    config: ProviderConfig,
    http: HttpClient,
    /// Where a chat call goes.
    chat_url: reqwest::Url,
}

impl AnthropicProvider {
    pub fn new(
        config: ProviderConfig,
        key: Option<Secret>,
    ) -> Result<AnthropicProvider, ConfigError> {
        let http = HttpClient::for_provider(&config, key)?;
        Ok(AnthropicProvider {
            chat_url: HttpClient::endpoint(&config, "/v1/messages")?,
            config,
            http,
        })
    }
}

impl Wire for AnthropicProvider {
    type Answer = WireResponse;
    const ANSWER: &'static str = "a Messages response";

    fn parts(&self) -> (&ProviderConfig, &HttpClient) {
        (&self.config, &self.http)
    }

    fn url(&self) -> &reqwest::Url {
        &self.chat_url
    }

    fn headers(
        &self,
        request: &ChatRequest,
        call: &CallContext,
    ) -> Result<HeaderMap, ProviderError> {
        let idempotency = self
            .config
            .capabilities
            .idempotency_header
            .as_deref()
            .map(|h| (h, call.idempotency_key.as_str()));
        let mut headers =
            self.http
                .headers(HeaderName::from_static("x-api-key"), "", idempotency)?;
        headers.insert(
            "anthropic-version",
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        // A client's betas, as it sent them (an output-only route's).
        if let Some(beta) = &request.anthropic_beta {
            let value = HeaderValue::from_str(beta).map_err(|_| {
                ProviderError::not_sent(
                    &self.config.id,
                    "the client's anthropic-beta is not a header value",
                )
            })?;
            headers.insert("anthropic-beta", value);
        }
        Ok(headers)
    }

    /// The request body this adapter sends for `request`.
    fn request_body(&self, request: &ChatRequest) -> Result<Value, ProviderError> {
        let system: Vec<&Message> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .collect();
        let mut messages: Vec<Value> = Vec::new();
        for m in request.messages.iter().filter(|m| m.role != Role::System) {
            match m.role {
                Role::Assistant if !m.tool_calls.is_empty() => {
                    // An earlier turn's calls, as `tool_use` blocks.
                    let mut blocks = Vec::new();
                    if !m.content.is_empty() {
                        blocks.push(json!({ "type": "text", "text": m.content }));
                    }
                    for call in &m.tool_calls {
                        blocks.push(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments_json() }));
                    }
                    breakpoint(&mut blocks, m.cache_control.as_ref());
                    messages.push(json!({ "role": "assistant", "content": blocks }));
                }
                Role::Tool => {
                    // A tool's result is a `tool_result` block of the user's
                    // turn; results in a row share one turn.
                    let mut block = json!({ "type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content });
                    if let Some(control) = &m.cache_control {
                        block["cache_control"] = control.clone();
                    }
                    let joins = messages.last().is_some_and(|last| {
                        last["role"] == "user" && last["content"][0]["type"] == "tool_result"
                    });
                    match (joins, messages.last_mut()) {
                        (true, Some(last)) => {
                            if let Some(blocks) = last["content"].as_array_mut() {
                                blocks.push(block);
                            }
                        }
                        _ => messages.push(json!({ "role": "user", "content": [block] })),
                    }
                }
                Role::Assistant => {
                    messages.push(json!({ "role": "assistant", "content": text(m) }))
                }
                Role::User | Role::System => {
                    messages.push(json!({ "role": "user", "content": text(m) }))
                }
            }
        }
        let mut body = json!({
            "model": self.config.model,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        });
        if !system.is_empty() {
            let text: Vec<&str> = system.iter().map(|m| m.content.as_str()).collect();
            let text = text.join("\n\n");
            // The contract's marking, else the client's breakpoint.
            let control = match request.cache.system {
                true => Some(ephemeral()),
                false => system.iter().rev().find_map(|m| m.cache_control.clone()),
            };
            body["system"] = match control {
                Some(control) => {
                    json!([{ "type": "text", "text": text, "cache_control": control }])
                }
                None => json!(text),
            };
        }
        if let OutputFormat::Tools(asked) = &request.output {
            let tools: Vec<Value> = asked
                .tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "description": t.description,
                        "input_schema": t.parameters,
                    })
                })
                .collect();
            body["tools"] = json!(tools);
            if let (true, Some(tools)) = (request.cache.tools, body["tools"].as_array_mut()) {
                breakpoint(tools, Some(&ephemeral()));
            }
            let mut choice = match &asked.pick {
                ToolPick::Any => json!({ "type": "any" }),
                ToolPick::Named(name) => json!({ "type": "tool", "name": name }),
            };
            if !asked.parallel {
                choice["disable_parallel_tool_use"] = json!(true);
            }
            body["tool_choice"] = choice;
        }
        if let OutputFormat::Json { schema, .. } = &request.output {
            match self.config.structured_mode() {
                StructuredMode::Tool => {
                    body["tools"] = json!([{
                        "name": TOOL_NAME,
                        "description": "Give the answer, in exactly this structure.",
                        "input_schema": schema,
                    }]);
                    body["tool_choice"] = json!({ "type": "tool", "name": TOOL_NAME });
                }
                StructuredMode::Prefill => {
                    messages.push(json!({ "role": "assistant", "content": "{" }))
                }
                StructuredMode::PromptOnly => {}
                other => {
                    return Err(ProviderError::not_sent(
                        &self.config.id,
                        format!(
                            "structured-output mode `{}` is not an Anthropic mode",
                            other.as_str()
                        ),
                    ));
                }
            }
        }
        body["messages"] = json!(messages);
        Ok(body)
    }

    fn read(
        &self,
        request: &ChatRequest,
        wire: WireResponse,
        latency: Duration,
    ) -> Result<ChatResponse, ProviderError> {
        let mode = self.config.structured_mode();
        let asked_tools = matches!(request.output, OutputFormat::Tools(_));
        let mut text = String::new();
        let mut tool_input = None;
        let mut made = Vec::new();
        for block in wire.content {
            match block {
                Block::Text { text: t } => text.push_str(&t),
                Block::ToolUse { name, input } if asked_tools => made.push(Made {
                    name,
                    arguments: Arguments::Parsed(input),
                }),
                Block::ToolUse { name, input } if name == TOOL_NAME => tool_input = Some(input),
                Block::ToolUse { name, .. } => {
                    return Err(self
                        .http
                        .bad_response(format!("the model called an unknown tool `{name}`")));
                }
                Block::Other => {}
            }
        }
        let stop_reason = wire.stop_reason;
        // `refusal` is a refusal in the model's words, from the kind's table.
        let finish = self.http.finish(
            &crate::kinds::ANTHROPIC,
            stop_reason.as_deref(),
            Some(&text),
        )?;
        let truncated = finish == crate::Finish::Truncated;
        let json = match (&request.output, mode) {
            (OutputFormat::Text, _) => None,
            (OutputFormat::Tools(asked), _) => {
                let answer =
                    self.http
                        .tool_answer(asked, made, &text, finish, request.max_tokens)?;
                text = answer.to_string();
                Some(answer)
            }
            (OutputFormat::Json { .. }, StructuredMode::Tool) => {
                let input = tool_input.ok_or_else(|| {
                    self.http
                        .bad_response("the model did not call the forced tool")
                })?;
                // A tool input cut at the limit is not the model's whole
                // answer, even where what arrived still fits the schema.
                if truncated {
                    return Err(self.http.bad_response(format!(
                        "the tool input was cut at max_tokens ({}, stop_reason {}): {input}",
                        request.max_tokens,
                        stop_reason.as_deref().unwrap_or_default()
                    )));
                }
                text = input.to_string();
                Some(input)
            }
            (OutputFormat::Json { .. }, _) => {
                if mode == StructuredMode::Prefill {
                    text.insert(0, '{');
                }
                Some(
                    self.http
                        .json_answer(&text, finish, "max_tokens", request.max_tokens)?,
                )
            }
        };
        Ok(ChatResponse {
            structured_mode: json.as_ref().map(|_| mode),
            text,
            json,
            model: wire.model,
            finish_reason: stop_reason,
            // Anthropic's `input_tokens` leaves out what the cache read and
            // wrote; surety's prompt tokens are all of them.
            usage: Usage {
                prompt_tokens: wire.usage.input_tokens
                    + wire.usage.cache_read_input_tokens
                    + wire.usage.cache_creation_input_tokens,
                completion_tokens: wire.usage.output_tokens,
                cache_read_tokens: wire.usage.cache_read_input_tokens,
                cache_write_tokens: wire.usage.cache_creation_input_tokens,
            },
            latency,
        })
    }
}

impl Provider for AnthropicProvider {
    crate::wire::provider_methods!();
}

#[derive(Deserialize)]
pub(crate) struct WireResponse {
    model: String,
    content: Vec<Block>,
    stop_reason: Option<String>,
    usage: WireUsage,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Text {
        text: String,
    },
    ToolUse {
        name: String,
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

/// The cache breakpoint a contract's marking sends.
fn ephemeral() -> Value {
    json!({ "type": "ephemeral" })
}

/// A turn's text: a string, or (with the client's breakpoint) one text
/// block carrying it.
fn text(m: &Message) -> Value {
    match &m.cache_control {
        Some(control) => json!([{ "type": "text", "text": m.content, "cache_control": control }]),
        None => json!(m.content),
    }
}

/// `control` on the last of `blocks`, when there is one.
fn breakpoint(blocks: &mut [Value], control: Option<&Value>) {
    if let (Some(last), Some(control)) = (blocks.last_mut(), control) {
        last["cache_control"] = control.clone();
    }
}
