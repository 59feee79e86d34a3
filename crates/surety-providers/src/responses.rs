//! OpenAI's Responses API (`POST {base_url}/responses`) as a provider.
//!
//! System messages become `instructions` (the first) or system input items;
//! the turns become `input` items (a tool call of an earlier turn a
//! `function_call`, its result a `function_call_output`); JSON is asked for
//! in `text.format`, tools as function tools. The answer is read from its
//! `output` items: `message` text (or a `refusal`) and `function_call`s,
//! its finish from `status` and `incomplete_details.reason`.
//!
//! With `background = true` (which needs `store = true`) a call creates the
//! response in the background — the create answers at once with the
//! response's id, told before anything else — and polls it until it ends;
//! a poll that fails on the way (a timeout, a reset) is polled again, so it
//! never makes the attempt unknown. A stored response can be read back by
//! its id afterwards (`GET /responses/{id}`), and a background one
//! cancelled there (`POST /responses/{id}/cancel`, definite).

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{ConfigError, ProviderConfig};
use crate::http::HttpClient;
use crate::secret::Secret;
use crate::tools::{Arguments, Made};
use crate::wire::Wire;
use crate::{
    BoxFuture, CallContext, ChatRequest, ChatResponse, FailureClass, Found, Lookup, OutputFormat,
    Provider, ProviderError, Role, StructuredMode, ToolPick, Usage,
};

#[derive(Debug)]
pub struct ResponsesProvider {
    config: ProviderConfig,
    http: HttpClient,
    /// `{base_url}/responses`.
    create_url: reqwest::Url,
}

impl ResponsesProvider {
    pub fn new(
        config: ProviderConfig,
        key: Option<Secret>,
    ) -> Result<ResponsesProvider, ConfigError> {
        let http = HttpClient::for_provider(&config, key)?;
        Ok(ResponsesProvider {
            create_url: HttpClient::endpoint(&config, "/responses")?,
            config,
            http,
        })
    }

    fn headers(&self, call: Option<&CallContext>) -> Result<HeaderMap, ProviderError> {
        let idempotency = call
            .zip(self.config.capabilities.idempotency_header.as_deref())
            .map(|(c, h)| (h, c.idempotency_key.as_str()));
        self.http.headers(AUTHORIZATION, "Bearer ", idempotency)
    }

    /// `{base_url}/responses/{id}` and what follows it.
    fn response_url(&self, id: &str, then: Option<&str>) -> Result<reqwest::Url, ProviderError> {
        let mut url = self.create_url.clone();
        {
            let mut path = url.path_segments_mut().map_err(|()| {
                ProviderError::not_sent(&self.config.id, "the base URL cannot take a path")
            })?;
            path.push(id);
            if let Some(then) = then {
                path.push(then);
            }
        }
        Ok(url)
    }

    /// The stored response `id`; `None` when the provider has none by it.
    async fn retrieve(&self, id: &str) -> Result<Option<WireResponse>, ProviderError> {
        let url = self.response_url(id, None)?;
        match self
            .http
            .get_json::<WireResponse>(&url, self.headers(None)?, "a response")
            .await
        {
            Ok(answer) => Ok(Some(answer.body)),
            Err(e) if e.status == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A background call: the create answers with the response's id (told
    /// as it arrives), then the response is polled until it ends. A poll
    /// that fails on the way is polled again; a definite failure ends it.
    async fn in_background(
        &self,
        request: &ChatRequest,
        call: &CallContext,
    ) -> Result<ChatResponse, ProviderError> {
        let started = std::time::Instant::now();
        let (config, _) = self.parts();
        config.capabilities.check(&config.id, request)?;
        let mut body = self.request_body(request)?;
        self.stamp(&mut body, call);
        let mut answer = self
            .http
            .post_json_telling::<WireResponse>(
                &self.create_url,
                Wire::headers(self, request, call)?,
                &body,
                Self::ANSWER,
                (Self::ID_MEMBER, &call.ids),
            )
            .await?
            .body;
        let id = answer.id.clone().ok_or_else(|| {
            self.http
                .bad_response("the background response names no id")
        })?;
        loop {
            if !answer.running() {
                return self.read(request, answer, started.elapsed());
            }
            tokio::time::sleep(self.config.poll_interval).await;
            match self.retrieve(&id).await {
                Ok(Some(polled)) => answer = polled,
                Ok(None) => {
                    return Err(self
                        .http
                        .bad_response(format!("the background response {id} is no longer found")));
                }
                // The response runs on at the provider: ask again.
                Err(e) if e.class() == FailureClass::Unknown => {
                    tracing::info!(provider = %self.config.id, response = %id, error = %e, "a poll did not answer; polling again");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Wire for ResponsesProvider {
    type Answer = WireResponse;
    const ANSWER: &'static str = "a response";

    fn parts(&self) -> (&ProviderConfig, &HttpClient) {
        (&self.config, &self.http)
    }

    fn url(&self) -> &reqwest::Url {
        &self.create_url
    }

    fn headers(
        &self,
        _request: &ChatRequest,
        call: &CallContext,
    ) -> Result<HeaderMap, ProviderError> {
        ResponsesProvider::headers(self, Some(call))
    }

    /// Every call says whether the provider keeps it (`store`, off unless
    /// configured: the API keeps responses by default); a stored call
    /// carries its attempt's name in its metadata, and a background one
    /// says so.
    fn stamp(&self, body: &mut Value, call: &CallContext) {
        let caps = &self.config.capabilities;
        body["store"] = Value::Bool(caps.store);
        if caps.store {
            body["metadata"] = json!({ crate::ATTEMPT_METADATA: call.idempotency_key });
        }
        if caps.background {
            body["background"] = Value::Bool(true);
        }
    }

    fn request_body(&self, request: &ChatRequest) -> Result<Value, ProviderError> {
        let mut instructions: Option<&str> = None;
        let mut input: Vec<Value> = Vec::new();
        for (i, m) in request.messages.iter().enumerate() {
            match m.role {
                Role::System if i == 0 => instructions = Some(&m.content),
                Role::System => input.push(json!({ "role": "system", "content": m.content })),
                Role::User => input.push(json!({ "role": "user", "content": m.content })),
                Role::Assistant => {
                    if !m.content.is_empty() || m.tool_calls.is_empty() {
                        input.push(json!({ "role": "assistant", "content": m.content }));
                    }
                    input.extend(m.tool_calls.iter().map(|c| {
                        json!({
                            "type": "function_call",
                            "call_id": c.id,
                            "name": c.name,
                            "arguments": c.arguments,
                        })
                    }));
                }
                Role::Tool => input.push(json!({
                    "type": "function_call_output",
                    "call_id": m.tool_call_id,
                    "output": m.content,
                })),
            }
        }
        let mut body = json!({
            "model": self.config.model,
            "input": input,
            "temperature": request.temperature,
            "max_output_tokens": request.max_tokens,
        });
        if let Some(instructions) = instructions {
            body["instructions"] = json!(instructions);
        }
        let strict = self.config.structured_mode() == StructuredMode::JsonSchema;
        match &request.output {
            OutputFormat::Text => {}
            OutputFormat::Tools(asked) => {
                let tools: Vec<Value> = asked
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "function",
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.parameters,
                            "strict": strict,
                        })
                    })
                    .collect();
                body["tools"] = json!(tools);
                body["tool_choice"] = match &asked.pick {
                    ToolPick::Any => json!("required"),
                    ToolPick::Named(name) => json!({ "type": "function", "name": name }),
                };
                if !asked.parallel {
                    body["parallel_tool_calls"] = json!(false);
                }
            }
            OutputFormat::Json { name, schema } => match self.config.structured_mode() {
                StructuredMode::JsonSchema => {
                    body["text"] = json!({ "format": {
                        "type": "json_schema",
                        "name": crate::openai::wire_name(name),
                        "schema": schema,
                        "strict": true,
                    }});
                }
                StructuredMode::JsonObject => {
                    body["text"] = json!({ "format": { "type": "json_object" } });
                }
                StructuredMode::PromptOnly => {}
                other => {
                    return Err(ProviderError::not_sent(
                        &self.config.id,
                        format!(
                            "structured-output mode `{}` is not a Responses API mode",
                            other.as_str()
                        ),
                    ));
                }
            },
        }
        Ok(body)
    }

    fn read(
        &self,
        request: &ChatRequest,
        wire: WireResponse,
        latency: Duration,
    ) -> Result<ChatResponse, ProviderError> {
        let status = wire.status.as_deref().unwrap_or("completed");
        match status {
            "failed" => {
                let why = wire.error.as_ref().map_or_else(
                    || "no reason given".to_owned(),
                    |e| format!("{}: {}", e.code.as_deref().unwrap_or("error"), e.message),
                );
                return Err(ProviderError::new(
                    &self.config.id,
                    crate::FailureKind::ServerError,
                    self.http.scrub(&format!("the response failed: {why}")),
                ));
            }
            "cancelled" => {
                return Err(ProviderError::new(
                    &self.config.id,
                    crate::FailureKind::ServerError,
                    "the response was cancelled at the provider".to_owned(),
                ));
            }
            "queued" | "in_progress" => {
                return Err(self
                    .http
                    .bad_response(format!("the response is still `{status}`: not an answer")));
            }
            _ => {}
        }
        let mut text = String::new();
        let mut made = Vec::new();
        for item in wire.output {
            match item {
                OutputItem::Message { content } => {
                    for part in content {
                        match part {
                            ContentPart::OutputText { text: t } => text.push_str(&t),
                            ContentPart::Refusal { refusal } => {
                                return Err(ProviderError::new(
                                    &self.config.id,
                                    crate::FailureKind::Refused,
                                    self.http.scrub(&format!("the model refused: {refusal}")),
                                ));
                            }
                            ContentPart::Other => {}
                        }
                    }
                }
                OutputItem::FunctionCall { name, arguments } => made.push(Made {
                    name,
                    arguments: Arguments::Text(arguments),
                }),
                OutputItem::Other => {}
            }
        }
        // `status` says how it ended; an incomplete one says why.
        let reason = match status {
            "incomplete" => wire
                .incomplete_details
                .and_then(|d| d.reason)
                .unwrap_or_else(|| "incomplete".to_owned()),
            other => other.to_owned(),
        };
        let finish = self
            .http
            .finish(&crate::kinds::OPENAI_RESPONSES, Some(&reason), None)?;
        let mode = Some(self.config.structured_mode());
        let (text, json, structured_mode) = match &request.output {
            OutputFormat::Text => (text, None, None),
            OutputFormat::Tools(asked) => {
                let answer =
                    self.http
                        .tool_answer(asked, made, &text, finish, request.max_tokens)?;
                (answer.to_string(), Some(answer), mode)
            }
            OutputFormat::Json { .. } => {
                let json = self.http.json_answer(
                    &text,
                    finish,
                    "max_output_tokens",
                    request.max_tokens,
                )?;
                (text, Some(json), mode)
            }
        };
        Ok(ChatResponse {
            text,
            json,
            model: wire.model,
            finish_reason: Some(reason),
            usage: wire
                .usage
                .map(|u| Usage {
                    prompt_tokens: u.input_tokens,
                    completion_tokens: u.output_tokens,
                    cache_read_tokens: u.input_tokens_details.map_or(0, |d| d.cached_tokens),
                    cache_write_tokens: 0,
                })
                .unwrap_or_default(),
            latency,
            structured_mode,
        })
    }
}

impl ResponsesProvider {
    /// A stored response, by the id the call read (the API has no list to
    /// find one without it).
    async fn stored(&self, lookup: Lookup<'_>) -> Result<Found, ProviderError> {
        if !self.config.capabilities.store {
            return Err(ProviderError::not_sent(&self.config.id, crate::NO_LOOKUP));
        }
        let Some(id) = lookup.response_id else {
            return Ok(Found::NotFound);
        };
        let Some(answer) = self.retrieve(id).await? else {
            return Ok(Found::NotFound);
        };
        if answer.running() {
            let status = answer.status.unwrap_or_default();
            return Ok(Found::Running(format!("the response is `{status}`")));
        }
        let id = answer.id.clone();
        match self.read(lookup.request, answer, Duration::ZERO) {
            Ok(response) => Ok(Found::Answered { response, id }),
            Err(e) if e.class() == FailureClass::Definite => Ok(Found::Ended(e.to_string())),
            Err(e) => Err(e),
        }
    }

    async fn cancel_at(&self, id: &str) -> Result<(), ProviderError> {
        if !self.config.capabilities.background {
            return Err(ProviderError::not_sent(&self.config.id, crate::NO_CANCEL));
        }
        let url = self.response_url(id, Some("cancel"))?;
        self.http
            .post_json::<WireResponse>(&url, self.headers(None)?, &json!({}), "a response")
            .await?;
        Ok(())
    }
}

impl Provider for ResponsesProvider {
    fn config(&self) -> &ProviderConfig {
        &self.config
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        call: &'a CallContext,
    ) -> BoxFuture<'a, Result<ChatResponse, ProviderError>> {
        match self.config.capabilities.background {
            true => Box::pin(self.in_background(request, call)),
            false => Box::pin(crate::wire::chat(self, request, call)),
        }
    }

    fn look_up<'a>(&'a self, lookup: Lookup<'a>) -> BoxFuture<'a, Result<Found, ProviderError>> {
        Box::pin(self.stored(lookup))
    }

    fn cancel<'a>(&'a self, response_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(self.cancel_at(response_id))
    }

    fn served_models(&self) -> BoxFuture<'_, Result<Vec<String>, ProviderError>> {
        Box::pin(async move {
            if !self.config.capabilities.models_endpoint {
                return Err(ProviderError::not_sent(
                    &self.config.id,
                    crate::NO_MODELS_ENDPOINT,
                ));
            }
            let url = HttpClient::endpoint(&self.config, "/models")
                .map_err(|e| ProviderError::not_sent(&self.config.id, e.to_string()))?;
            let list: crate::openai::ModelList = self
                .http
                .get_json(&url, self.headers(None)?, "a model list")
                .await?
                .body;
            Ok(list.data.into_iter().map(|m| m.id).collect())
        })
    }
}

#[derive(Deserialize)]
pub(crate) struct WireResponse {
    /// `resp_…`.
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    model: String,
    #[serde(default)]
    output: Vec<OutputItem>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
    #[serde(default)]
    error: Option<WireError>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

impl WireResponse {
    /// Not ended yet (a background response).
    fn running(&self) -> bool {
        matches!(self.status.as_deref(), Some("queued" | "in_progress"))
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutputItem {
    Message {
        #[serde(default)]
        content: Vec<ContentPart>,
    },
    FunctionCall {
        name: String,
        arguments: String,
    },
    /// Reasoning and every other item: not part of an answer.
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentPart {
    OutputText {
        text: String,
    },
    Refusal {
        refusal: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    reason: Option<String>,
}

#[derive(Deserialize)]
struct WireError {
    code: Option<String>,
    message: String,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: u64,
}
