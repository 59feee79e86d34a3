//! Google's Gemini API (`POST {base_url}/models/{model}:generateContent`,
//! the base URL being e.g. `https://generativelanguage.googleapis.com/v1beta`).
//!
//! The key travels in the `x-goog-api-key` header, never in the URL, so it
//! cannot reach a log. System messages go to `systemInstruction`; sampling
//! and JSON to `generationConfig` (`responseMimeType: application/json` with
//! `responseJsonSchema`, or `responseSchema` cut to Google's OpenAPI
//! subset). `modelVersion` is the served model; `usageMetadata` the usage.
//! A `finishReason` of SAFETY, RECITATION, PROHIBITED_CONTENT (and the
//! like), or a prompt blocked in `promptFeedback`, is a definite refusal
//! naming the reason; MAX_TOKENS is a truncated answer.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::config::{ConfigError, ProviderConfig};
use crate::http::HttpClient;
use crate::secret::Secret;
use crate::tools::{Arguments, Made};
use crate::wire::Wire;
use crate::{
    CallContext, ChatRequest, ChatResponse, FailureKind, OutputFormat, Provider, ProviderError,
    Role, StructuredMode, ToolPick, Usage,
};

#[derive(Debug)]
pub struct GeminiProvider {
    config: ProviderConfig,
    http: HttpClient,
    /// Where a chat call goes.
    chat_url: reqwest::Url,
}

/// The keywords Google's OpenAPI-subset `responseSchema` takes.
const RESPONSE_SCHEMA_KEYWORDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

impl GeminiProvider {
    pub fn new(config: ProviderConfig, key: Option<Secret>) -> Result<GeminiProvider, ConfigError> {
        let http = HttpClient::for_provider(&config, key)?;
        Ok(GeminiProvider {
            chat_url: HttpClient::endpoint(
                &config,
                &format!("/models/{}:generateContent", config.model),
            )?,
            config,
            http,
        })
    }
}

impl Wire for GeminiProvider {
    type Answer = WireResponse;
    const ANSWER: &'static str = "a generateContent response";
    const ID_MEMBER: &'static str = "responseId";

    fn parts(&self) -> (&ProviderConfig, &HttpClient) {
        (&self.config, &self.http)
    }

    fn url(&self) -> &reqwest::Url {
        &self.chat_url
    }

    fn headers(
        &self,
        _request: &ChatRequest,
        _call: &CallContext,
    ) -> Result<HeaderMap, ProviderError> {
        self.http
            .headers(HeaderName::from_static("x-goog-api-key"), "", None)
    }

    /// The request body this adapter sends for `request`; public so that
    /// conformance tests can check it against Google's own types.
    fn request_body(&self, request: &ChatRequest) -> Result<Value, ProviderError> {
        let system: Vec<Value> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::System)
            .map(|m| json!({ "text": m.content }))
            .collect();
        let contents: Vec<Value> = request
            .messages
            .iter()
            .filter(|m| m.role != Role::System)
            .map(|m| match m.role {
                Role::Assistant => {
                    // An earlier turn's calls, as `functionCall` parts.
                    let mut parts = Vec::new();
                    if !m.content.is_empty() || m.tool_calls.is_empty() {
                        parts.push(json!({ "text": m.content }));
                    }
                    for call in &m.tool_calls {
                        parts.push(json!({ "functionCall": { "name": call.name, "args": call.arguments_json() } }));
                    }
                    json!({ "role": "model", "parts": parts })
                }
                Role::Tool => {
                    // Gemini names the function a result answers, not the call.
                    let name = m
                        .tool_call_id
                        .as_deref()
                        .and_then(|id| crate::called(&request.messages, id))
                        .map_or("", |c| c.name.as_str());
                    let response = match serde_json::from_str::<Value>(&m.content) {
                        Ok(object @ Value::Object(_)) => object,
                        _ => json!({ "result": m.content }),
                    };
                    json!({ "role": "user", "parts": [{ "functionResponse": { "name": name, "response": response } }] })
                }
                Role::User | Role::System => json!({ "role": "user", "parts": [{ "text": m.content }] }),
            })
            .collect();
        let mut generation = json!({
            "temperature": request.temperature,
            "maxOutputTokens": request.max_tokens,
        });
        if let Some(seed) = request.seed {
            generation["seed"] = json!(seed);
        }
        if let OutputFormat::Json { schema, .. } = &request.output {
            match self.config.structured_mode() {
                StructuredMode::ResponseJsonSchema => {
                    generation["responseMimeType"] = json!("application/json");
                    generation["responseJsonSchema"] = without_schema_uri(schema);
                }
                StructuredMode::ResponseSchema => {
                    generation["responseMimeType"] = json!("application/json");
                    generation["responseSchema"] = openapi_subset(schema);
                }
                StructuredMode::PromptOnly => {}
                other => {
                    return Err(ProviderError::not_sent(
                        &self.config.id,
                        format!(
                            "structured-output mode `{}` is not a Gemini mode",
                            other.as_str()
                        ),
                    ));
                }
            }
        }
        let mut body = json!({ "contents": contents, "generationConfig": generation });
        if let OutputFormat::Tools(asked) = &request.output {
            // Parameters as JSON Schema, or cut to Google's OpenAPI subset,
            // as the provider's structured-output mode says for answers.
            let json_schema = self.config.structured_mode() != StructuredMode::ResponseSchema;
            let declarations: Vec<Value> = asked
                .tools
                .iter()
                .map(|t| {
                    let mut declaration = json!({ "name": t.name, "description": t.description });
                    match json_schema {
                        true => {
                            declaration["parametersJsonSchema"] = without_schema_uri(&t.parameters)
                        }
                        false => declaration["parameters"] = openapi_subset(&t.parameters),
                    }
                    declaration
                })
                .collect();
            body["tools"] = json!([{ "functionDeclarations": declarations }]);
            let mut calling = json!({ "mode": "ANY" });
            if let ToolPick::Named(name) = &asked.pick {
                calling["allowedFunctionNames"] = json!([name]);
            }
            body["toolConfig"] = json!({ "functionCallingConfig": calling });
        }
        if !system.is_empty() {
            body["systemInstruction"] = json!({ "parts": system });
        }
        Ok(body)
    }

    fn read(
        &self,
        request: &ChatRequest,
        wire: WireResponse,
        latency: Duration,
    ) -> Result<ChatResponse, ProviderError> {
        let refused = |reason: &str, words: Option<&str>| {
            let words = words.map(|w| format!("{w} ")).unwrap_or_default();
            ProviderError::new(
                &self.config.id,
                FailureKind::Refused,
                self.http.scrub(&format!(
                    "the model refused: {words}(finish reason {reason})"
                )),
            )
        };
        if let Some(reason) = wire
            .prompt_feedback
            .as_ref()
            .and_then(|f| f.block_reason.as_deref())
        {
            return Err(refused(&format!("prompt blocked: {reason}"), None));
        }
        let candidate = wire
            .candidates
            .into_iter()
            .next()
            .ok_or_else(|| self.http.bad_response("the response has no candidates"))?;
        let finish_reason = candidate.finish_reason;
        let finish = self.http.finish(
            &crate::kinds::GEMINI,
            finish_reason.as_deref(),
            candidate.finish_message.as_deref(),
        )?;
        // The answer is the parts that are not thoughts: a thinking model
        // sends its reasoning as parts flagged `thought`.
        let parts: Vec<WirePart> = candidate
            .content
            .map(|c| c.parts)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.thought != Some(true))
            .collect();
        let mut text = String::new();
        let mut made = Vec::new();
        for part in parts {
            if let Some(t) = part.text {
                text.push_str(&t);
            }
            if let Some(call) = part.function_call {
                made.push(Made {
                    name: call.name,
                    arguments: Arguments::Parsed(call.args.unwrap_or_else(|| json!({}))),
                });
            }
        }
        let json = match &request.output {
            OutputFormat::Text => None,
            OutputFormat::Tools(asked) => {
                let answer =
                    self.http
                        .tool_answer(asked, made, &text, finish, request.max_tokens)?;
                text = answer.to_string();
                Some(answer)
            }
            OutputFormat::Json { .. } => {
                Some(
                    self.http
                        .json_answer(&text, finish, "maxOutputTokens", request.max_tokens)?,
                )
            }
        };
        let usage = wire.usage_metadata.unwrap_or_default();
        Ok(ChatResponse {
            structured_mode: json.as_ref().map(|_| self.config.structured_mode()),
            text,
            json,
            // The served model, as Google names it with the answer.
            model: wire.model_version.unwrap_or_default(),
            finish_reason,
            usage: Usage {
                prompt_tokens: usage.prompt_token_count,
                completion_tokens: usage.candidates_token_count,
                // Gemini's implicit cache: counted within the prompt's.
                cache_read_tokens: usage.cached_content_token_count,
                cache_write_tokens: 0,
            },
            latency,
        })
    }
}

impl Provider for GeminiProvider {
    crate::wire::provider_methods!();
}

/// `schema` without its `$schema` URI, which Google's JSON Schema fields refuse.
fn without_schema_uri(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
    }
    schema
}

/// `schema` cut to Google's OpenAPI subset (what the lint says
/// `response_schema` drops is left out), recursively.
fn openapi_subset(schema: &Value) -> Value {
    let Some(object) = schema.as_object() else {
        return schema.clone();
    };
    let mut kept = Map::new();
    for (key, value) in object {
        if !RESPONSE_SCHEMA_KEYWORDS.contains(&key.as_str()) {
            continue;
        }
        let value = match (key.as_str(), value) {
            ("properties", Value::Object(properties)) => Value::Object(
                properties
                    .iter()
                    .map(|(name, s)| (name.clone(), openapi_subset(s)))
                    .collect(),
            ),
            ("items", s) => openapi_subset(s),
            ("anyOf", Value::Array(options)) => {
                Value::Array(options.iter().map(openapi_subset).collect())
            }
            (_, value) => value.clone(),
        };
        kept.insert(key.clone(), value);
    }
    Value::Object(kept)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WireResponse {
    #[serde(default)]
    candidates: Vec<WireCandidate>,
    prompt_feedback: Option<WireFeedback>,
    usage_metadata: Option<WireUsage>,
    model_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireCandidate {
    content: Option<WireContent>,
    finish_reason: Option<String>,
    finish_message: Option<String>,
}

#[derive(Deserialize)]
struct WireContent {
    #[serde(default)]
    parts: Vec<WirePart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    /// A thinking model's reasoning, not its answer.
    thought: Option<bool>,
    function_call: Option<WireFunctionCall>,
}

#[derive(Deserialize)]
struct WireFunctionCall {
    name: String,
    args: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireFeedback {
    block_reason: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
}
