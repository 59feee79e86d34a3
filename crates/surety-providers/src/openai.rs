//! OpenAI chat completions (`POST {base_url}/chat/completions`), which also
//! covers every OpenAI-compatible server: vLLM, llama.cpp, Groq, Together,
//! Azure-style deployments.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use crate::config::{ConfigError, ProviderConfig};
use crate::http::HttpClient;
use crate::secret::Secret;
use crate::tools::{Arguments, Made};
use crate::wire::Wire;
use crate::{
    BoxFuture, CallContext, ChatRequest, ChatResponse, Found, Lookup, OutputFormat, Provider,
    ProviderError, Role, StructuredMode, ToolPick, Usage,
};

#[derive(Debug)]
pub struct OpenAiProvider {
    config: ProviderConfig,
    http: HttpClient,
    /// `{base_url}/chat/completions`.
    chat_url: reqwest::Url,
    /// `{base_url}/models`.
    models_url: reqwest::Url,
    /// `/v1/models`, asked once.
    served: OnceCell<Vec<String>>,
}

impl OpenAiProvider {
    pub fn new(config: ProviderConfig, key: Option<Secret>) -> Result<OpenAiProvider, ConfigError> {
        let http = HttpClient::for_provider(&config, key)?;
        Ok(OpenAiProvider {
            chat_url: HttpClient::endpoint(&config, "/chat/completions")?,
            models_url: HttpClient::endpoint(&config, "/models")?,
            config,
            http,
            served: OnceCell::new(),
        })
    }

    fn headers(&self, call: Option<&CallContext>) -> Result<HeaderMap, ProviderError> {
        let idempotency = call
            .zip(self.config.capabilities.idempotency_header.as_deref())
            .map(|(c, h)| (h, c.idempotency_key.as_str()));
        self.http.headers(AUTHORIZATION, "Bearer ", idempotency)
    }
}

impl Wire for OpenAiProvider {
    type Answer = WireResponse;
    const ANSWER: &'static str = "a chat completion";

    fn parts(&self) -> (&ProviderConfig, &HttpClient) {
        (&self.config, &self.http)
    }

    fn url(&self) -> &reqwest::Url {
        &self.chat_url
    }

    fn headers(
        &self,
        _request: &ChatRequest,
        call: &CallContext,
    ) -> Result<HeaderMap, ProviderError> {
        OpenAiProvider::headers(self, Some(call))
    }

    /// With `store = true`, every call is stored at the provider with the
    /// attempt's name in its metadata, to be found afterwards if its answer
    /// is lost on the wire.
    fn stamp(&self, body: &mut Value, call: &CallContext) {
        if self.config.capabilities.store {
            body["store"] = Value::Bool(true);
            body["metadata"] = json!({ crate::ATTEMPT_METADATA: call.idempotency_key });
        }
    }

    /// The request body this adapter sends for `request`; public so that
    /// conformance tests can check it against OpenAI's published schema.
    fn request_body(&self, request: &ChatRequest) -> Result<Value, ProviderError> {
        let messages: Vec<Value> = request
            .messages
            .iter()
            .map(|m| match m.role {
                Role::System => json!({ "role": "system", "content": m.content }),
                Role::User => json!({ "role": "user", "content": m.content }),
                Role::Assistant if m.tool_calls.is_empty() => {
                    json!({ "role": "assistant", "content": m.content })
                }
                Role::Assistant => {
                    let calls: Vec<Value> = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": { "name": c.name, "arguments": c.arguments },
                            })
                        })
                        .collect();
                    let content = (!m.content.is_empty()).then_some(&m.content);
                    json!({ "role": "assistant", "content": content, "tool_calls": calls })
                }
                Role::Tool => json!({
                    "role": "tool",
                    "tool_call_id": m.tool_call_id,
                    "content": m.content,
                }),
            })
            .collect();
        let mut body = json!({
            "model": self.config.model,
            "messages": messages,
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        });
        if let Some(seed) = request.seed {
            body["seed"] = json!(seed);
        }
        if let OutputFormat::Tools(asked) = &request.output {
            // Strict function schemas where the provider takes strict JSON
            // schemas (the lint says what that asks of a parameter schema).
            let strict = self.config.structured_mode() == StructuredMode::JsonSchema;
            let tools: Vec<Value> = asked
                .tools
                .iter()
                .map(|t| {
                    let mut function = json!({
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    });
                    if strict {
                        function["strict"] = json!(true);
                    }
                    json!({ "type": "function", "function": function })
                })
                .collect();
            body["tools"] = json!(tools);
            body["tool_choice"] = match &asked.pick {
                ToolPick::Any => json!("required"),
                ToolPick::Named(name) => {
                    json!({ "type": "function", "function": { "name": name } })
                }
            };
            if !asked.parallel {
                body["parallel_tool_calls"] = json!(false);
            }
        }
        if let OutputFormat::Json { name, schema } = &request.output {
            match self.config.structured_mode() {
                StructuredMode::JsonSchema => {
                    body["response_format"] = json!({
                        "type": "json_schema",
                        "json_schema": { "name": wire_name(name), "schema": schema, "strict": true },
                    });
                }
                StructuredMode::JsonObjectSchema => {
                    body["response_format"] = json!({ "type": "json_object", "schema": schema });
                }
                StructuredMode::JsonObject => {
                    body["response_format"] = json!({ "type": "json_object" })
                }
                StructuredMode::PromptOnly => {}
                other => {
                    return Err(ProviderError::not_sent(
                        &self.config.id,
                        format!(
                            "structured-output mode `{}` is not an OpenAI mode",
                            other.as_str()
                        ),
                    ));
                }
            }
        }
        Ok(body)
    }

    fn read(
        &self,
        request: &ChatRequest,
        wire: WireResponse,
        latency: Duration,
    ) -> Result<ChatResponse, ProviderError> {
        let choice = wire
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| self.http.bad_response("the response has no choices"))?;
        if let Some(refusal) = choice.message.refusal.filter(|r| !r.is_empty()) {
            return Err(ProviderError::new(
                &self.config.id,
                crate::FailureKind::Refused,
                self.http.scrub(&format!("the model refused: {refusal}")),
            ));
        }
        let text = choice.message.content.unwrap_or_default();
        let calls = choice.message.tool_calls.unwrap_or_default();
        let finish_reason = choice.finish_reason;
        // A filtered answer is no answer, whatever its JSON; an unknown
        // reason is never taken for one.
        let finish = self
            .http
            .finish(&crate::kinds::OPENAI, finish_reason.as_deref(), None)?;
        let mode = Some(self.config.structured_mode());
        let (text, json, structured_mode) = match &request.output {
            OutputFormat::Text => (text, None, None),
            OutputFormat::Tools(asked) => {
                let made = calls
                    .into_iter()
                    .map(|c| Made {
                        name: c.function.name,
                        arguments: Arguments::Text(c.function.arguments),
                    })
                    .collect();
                let answer =
                    self.http
                        .tool_answer(asked, made, &text, finish, request.max_tokens)?;
                (answer.to_string(), Some(answer), mode)
            }
            OutputFormat::Json { .. } => {
                let json =
                    self.http
                        .json_answer(&text, finish, "max_tokens", request.max_tokens)?;
                (text, Some(json), mode)
            }
        };
        // Nothing after this point may fail: the provider has done the work.
        // (The model listing is asked for at certification, never here.)
        Ok(ChatResponse {
            text,
            json,
            model: wire.model,
            finish_reason,
            usage: wire
                .usage
                .map(|u| Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    // OpenAI caches a prompt's prefix itself, and counts
                    // what it read within `prompt_tokens`.
                    cache_read_tokens: u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
                    cache_write_tokens: 0,
                })
                .unwrap_or_default(),
            latency,
            structured_mode,
        })
    }
}

impl OpenAiProvider {
    async fn models(&self) -> Result<&Vec<String>, ProviderError> {
        self.served
            .get_or_try_init(|| async {
                let list: ModelList = self
                    .http
                    .get_json(&self.models_url, self.headers(None)?, "a model list")
                    .await?
                    .body;
                Ok(list.data.into_iter().map(|m| m.id).collect())
            })
            .await
    }

    /// `POST <root>/extras/<what>`, its answer read as `T` (`answer` says
    /// what it should be): llama.cpp servers serve their tokenizer beside
    /// `/v1`, not under it.
    async fn extras<T: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        body: &Value,
        answer: &str,
    ) -> Result<T, ProviderError> {
        if !self.config.capabilities.tokenize_endpoint {
            return Err(ProviderError::not_sent(
                &self.config.id,
                crate::NO_TOKENIZE_ENDPOINT,
            ));
        }
        let root = self.config.base_url.trim_end_matches("/v1");
        let url = format!("{root}/extras/{what}");
        let url = reqwest::Url::parse(&url).map_err(|e| {
            ProviderError::not_sent(&self.config.id, format!("`{url}` is not a URL: {e}"))
        })?;
        Ok(self
            .http
            .post_json(&url, self.headers(None)?, body, answer)
            .await?
            .body)
    }

    async fn server_tokenize(&self, text: &str) -> Result<Vec<u32>, ProviderError> {
        let body = json!({ "input": text, "model": self.config.model });
        let tokens: Tokens = self.extras("tokenize", &body, "a token list").await?;
        Ok(tokens.tokens)
    }

    async fn server_detokenize(&self, tokens: &[u32]) -> Result<String, ProviderError> {
        let body = json!({ "tokens": tokens, "model": self.config.model });
        let text: Detokenized = self.extras("detokenize", &body, "a detokenization").await?;
        Ok(text.text)
    }
}

impl OpenAiProvider {
    /// A stored completion: by its id (`GET /chat/completions/{id}`), else
    /// the newest whose metadata names the attempt
    /// (`GET /chat/completions?metadata[surety_attempt]=…`), read as the
    /// call's own answer would have been.
    async fn stored(&self, lookup: Lookup<'_>) -> Result<Found, ProviderError> {
        if !self.config.capabilities.store {
            return Err(ProviderError::not_sent(&self.config.id, crate::NO_LOOKUP));
        }
        let mut url = self.chat_url.clone();
        let answer = match lookup.response_id {
            Some(id) => {
                url.path_segments_mut()
                    .map_err(|()| {
                        ProviderError::not_sent(&self.config.id, "the base URL cannot take a path")
                    })?
                    .push(id);
                match self
                    .http
                    .get_json::<WireResponse>(&url, self.headers(None)?, "a stored chat completion")
                    .await
                {
                    Ok(answer) => Some(answer.body),
                    Err(e) if e.status == Some(404) => None,
                    Err(e) => return Err(e),
                }
            }
            None => {
                url.query_pairs_mut()
                    .append_pair(
                        &format!("metadata[{}]", crate::ATTEMPT_METADATA),
                        lookup.attempt,
                    )
                    .append_pair("limit", "1");
                let list: StoredList = self
                    .http
                    .get_json(
                        &url,
                        self.headers(None)?,
                        "a list of stored chat completions",
                    )
                    .await?
                    .body;
                list.data.into_iter().next()
            }
        };
        let Some(answer) = answer else {
            return Ok(Found::NotFound);
        };
        // The answer is read as the call's: one that is no answer (a
        // refusal, a cut) is a definite end, the work done and unusable.
        let id = answer.id.clone();
        match self.read(lookup.request, answer, Duration::ZERO) {
            Ok(response) => Ok(Found::Answered { response, id }),
            Err(e) if e.class() == crate::FailureClass::Definite => Ok(Found::Ended(e.to_string())),
            Err(e) => Err(e),
        }
    }
}

/// `GET /chat/completions?metadata[…]`: a page of stored completions.
#[derive(Deserialize)]
struct StoredList {
    data: Vec<WireResponse>,
}

impl Provider for OpenAiProvider {
    crate::wire::provider_methods!();

    fn look_up<'a>(&'a self, lookup: Lookup<'a>) -> BoxFuture<'a, Result<Found, ProviderError>> {
        Box::pin(self.stored(lookup))
    }

    fn served_models(&self) -> BoxFuture<'_, Result<Vec<String>, ProviderError>> {
        Box::pin(async move {
            if !self.config.capabilities.models_endpoint {
                return Err(ProviderError::not_sent(
                    &self.config.id,
                    crate::NO_MODELS_ENDPOINT,
                ));
            }
            Ok(self.models().await?.clone())
        })
    }

    fn tokenize<'a>(&'a self, text: &'a str) -> BoxFuture<'a, Result<Vec<u32>, ProviderError>> {
        Box::pin(self.server_tokenize(text))
    }

    fn detokenize<'a>(&'a self, tokens: &'a [u32]) -> BoxFuture<'a, Result<String, ProviderError>> {
        Box::pin(self.server_detokenize(tokens))
    }
}

/// OpenAI limits schema names to `[a-zA-Z0-9_-]{1,64}`.
pub(crate) fn wire_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if cleaned.is_empty() {
        "answer".to_owned()
    } else {
        cleaned
    }
}

#[derive(Deserialize)]
pub(crate) struct WireResponse {
    /// `chatcmpl-…`.
    #[serde(default)]
    id: Option<String>,
    model: String,
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: WireMessage,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    /// The arguments as JSON text, as the model wrote them.
    arguments: String,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<WirePromptDetails>,
}

#[derive(Deserialize)]
struct WirePromptDetails {
    #[serde(default)]
    cached_tokens: u64,
}

#[derive(Deserialize)]
pub(crate) struct ModelList {
    pub(crate) data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
pub(crate) struct ModelEntry {
    pub(crate) id: String,
}

#[derive(Deserialize)]
struct Detokenized {
    text: String,
}

#[derive(Deserialize)]
struct Tokens {
    tokens: Vec<u32>,
}
