//! A fault-injecting fake LLM provider — a TEST TOOL, never a provider.
//!
//! It speaks OpenAI chat completions (`POST /v1/chat/completions`,
//! `GET /v1/models`), Anthropic Messages (`POST /v1/messages`) and Gemini
//! (`POST /v1beta/models/{model}:generateContent`) on
//! 127.0.0.1, and answers as a [`Script`] says: per request, by model name,
//! by prompt text or by call number, with fixed or random latency, a hang,
//! any status, a connection reset after N bytes, a malformed body, or any
//! reply text (schema-valid but wrong answers, invented keys, prose instead
//! of JSON, a different answer on every call). It counts calls, per
//! idempotency key too, and lets tests wait on those counts instead of
//! sleeping.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;

/// What the fake does, rule by rule: the first rule that matches a request
/// answers it; with none, `default` does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default = "Behavior::default_reply")]
    pub default: Behavior,
    /// What `GET /v1/models` lists.
    #[serde(default = "default_served")]
    pub served_models: Vec<String>,
    /// When set, `GET /v1/models` answers this status instead of the list.
    #[serde(default)]
    pub models_status: Option<u16>,
    /// The `model` every answer names; by default it echoes the request's,
    /// as llama.cpp's servers do.
    #[serde(default)]
    pub answer_model: Option<String>,
    /// Answers a request whose Idempotency-Key it has answered before with
    /// that first answer again, as a provider that honours the header does.
    #[serde(default)]
    pub replay_by_key: bool,
    /// What it keeps of each request.
    #[serde(default)]
    pub keep: Keep,
    /// The first this many polls of a background response (`GET
    /// /v1/responses/{id}`) never answer.
    #[serde(default)]
    pub hang_polls: u64,
}

/// What the fake keeps of each request it receives. Whatever it keeps
/// grows with every call, and memory taken from the system as it grows is
/// paid for in page faults on the answers of the moment: a load run keeps
/// as little as it reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Each request whole ([`FakeProvider::requests`]) and the counts.
    #[default]
    Requests,
    /// The counts: in all, per rule and per Idempotency-Key
    /// ([`FakeProvider::calls_by_key`]): for long load runs that still
    /// count calls per intent.
    Counts,
    /// The counts in all and per rule: an upstream that keeps nothing per
    /// request, for benchmarks.
    Totals,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub when: When,
    pub then: Behavior,
    #[serde(default)]
    pub latency: Latency,
}

/// Which requests a rule answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum When {
    Always,
    /// The request's `model` is exactly this.
    Model(String),
    /// Some message of the request contains this text.
    PromptContains(String),
    /// The n-th call the fake receives (1-based).
    Call(u64),
}

/// How a rule answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    /// A normal answer whose content is this text.
    Reply(String),
    /// A normal answer, a different text on each call that reaches the rule
    /// (the nondeterminism of a provider that ignores temperature 0).
    Cycle(Vec<String>),
    /// An error status with this JSON body, and optionally a Retry-After header.
    Status {
        status: u16,
        body: Value,
        retry_after: Option<String>,
    },
    /// Never answers.
    Hang,
    /// Sends the headers and the first `bytes` bytes of a normal answer, then drops the connection.
    ResetAfter { bytes: usize },
    /// HTTP 200 with a body that is not JSON.
    MalformedBody,
    /// HTTP 401 whose message repeats the credentials the request carried,
    /// as careless servers do.
    EchoCredentials,
    /// A normal answer in which the model refuses, in these words
    /// (OpenAI: `content: null`, `refusal`; Anthropic: `stop_reason: refusal`).
    Refuse(String),
    /// The n-th call that reaches the rule behaves as the n-th entry; the
    /// last entry repeats.
    Sequence(Vec<Behavior>),
    /// HTTP 200 whose body goes on for this many bytes, made as it is read
    /// (never held whole); `bytes_streamed` counts what was read.
    Huge { bytes: u64 },
    /// Waits until [`FakeProvider::open_gate`] opens the gate, then
    /// behaves as the inner behavior (a provider answering at a moment the
    /// test chooses).
    Gated(Box<Behavior>),
    /// HTTP 200 whose body is one byte every `every_ms`, and never ends.
    Drip { every_ms: u64 },
    /// A normal answer with this text that ends with this finish reason,
    /// in the wire format's own words (OpenAI `finish_reason`, Anthropic
    /// `stop_reason`, Gemini `finishReason`).
    Finish { text: String, reason: String },
    /// Does the work of the inner behavior (a normal answer, stored where
    /// the request asked to `store` it), and the answer is lost on the
    /// wire: nothing of it is sent, and the call never ends.
    Lost(Box<Behavior>),
    /// As [`Behavior::Lost`], but the answer's bytes up to its `id` are
    /// sent before the rest is lost.
    LostAfterId(Box<Behavior>),
    /// Does the work of the inner behavior (stored where asked), then
    /// holds the answer until [`FakeProvider::open_gate`] opens the gate:
    /// an answer that arrives late, at a moment the test chooses.
    Held(Box<Behavior>),
    /// A thinking model's answer: its reasoning first (Gemini: a part
    /// flagged `thought`; Anthropic: a `thinking` block; OpenAI-compatible
    /// servers: `reasoning_content`), then the answer's text.
    Thought { thought: String, text: String },
}

impl Behavior {
    fn default_reply() -> Behavior {
        Behavior::Reply("{}".to_owned())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Latency {
    #[default]
    None,
    FixedMs(u64),
    RandomMs {
        min: u64,
        max: u64,
    },
}

fn default_served() -> Vec<String> {
    vec!["surety-fake-1".to_owned()]
}

impl Default for Script {
    fn default() -> Script {
        Script {
            rules: Vec::new(),
            default: Behavior::default_reply(),
            served_models: default_served(),
            models_status: None,
            answer_model: None,
            replay_by_key: false,
            keep: Keep::Requests,
            hang_polls: 0,
        }
    }
}

impl Script {
    /// Every request gets `behavior`.
    pub fn always(behavior: Behavior) -> Script {
        Script {
            default: behavior,
            ..Script::default()
        }
    }

    pub fn rule(mut self, when: When, then: Behavior) -> Script {
        self.rules.push(Rule {
            when,
            then,
            latency: Latency::None,
        });
        self
    }

    pub fn rule_with_latency(mut self, when: When, then: Behavior, latency: Latency) -> Script {
        self.rules.push(Rule {
            when,
            then,
            latency,
        });
        self
    }
}

/// Which wire format a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WireFormat {
    OpenAi,
    Anthropic,
    Gemini,
    /// OpenAI's Responses API.
    Responses,
}

/// A request as the fake received it (credentials left out).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recorded {
    pub format: WireFormat,
    pub model: String,
    pub idempotency_key: Option<String>,
    pub body: Value,
    /// The body's bytes, exactly as they came.
    pub raw: String,
    /// The request's headers, but its credentials (`authorization`,
    /// `x-api-key`, `x-goog-api-key`), by name (a repeated one joined by
    /// `, `).
    pub headers: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Log {
    total: u64,
    by_key: HashMap<String, u64>,
    by_rule: HashMap<usize, u64>,
    requests: Vec<Recorded>,
    /// The prompt prefixes an Anthropic request marked for caching.
    cached: std::collections::HashSet<String>,
    /// The first answer given per Idempotency-Key (for `replay_by_key`).
    answered: HashMap<String, Bytes>,
    /// The chat completions a request asked to `store`, oldest first.
    stored: Vec<Value>,
    /// How many times a stored completion was asked for (by id or by
    /// metadata): never counted as calls.
    lookups: u64,
    /// Polls of background responses so far.
    polls: u64,
    /// Cancels asked for.
    cancels: u64,
}

#[derive(Debug)]
struct Shared {
    script: RwLock<Script>,
    log: Mutex<Log>,
    calls: watch::Sender<u64>,
    /// Bytes of `Huge` bodies made so far.
    streamed: Arc<std::sync::atomic::AtomicU64>,
    /// Open: `Gated` calls go on.
    gate: watch::Sender<bool>,
}

/// A running fake. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeProvider {
    /// Starts a fake on 127.0.0.1 at a port the system picks.
    /// A fake that answers every request with `answer`.
    pub async fn replying(answer: impl Into<String>) -> std::io::Result<FakeProvider> {
        FakeProvider::start(Script::always(Behavior::Reply(answer.into()))).await
    }

    pub async fn start(script: Script) -> std::io::Result<FakeProvider> {
        FakeProvider::start_on(
            "127.0.0.1:0".parse().map_err(std::io::Error::other)?,
            script,
        )
        .await
    }

    pub async fn start_on(addr: SocketAddr, script: Script) -> std::io::Result<FakeProvider> {
        let (calls, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            script: RwLock::new(script),
            log: Mutex::new(Log::default()),
            calls,
            streamed: Arc::default(),
            gate: watch::channel(false).0,
        });
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let app = router(shared.clone());
        let server = tokio::spawn(async move {
            // The server runs until the fake is dropped; an accept error ends it.
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeProvider {
            addr,
            shared,
            server,
        })
    }

    /// Lets every `Gated` call, waiting or still to come, go on.
    pub fn open_gate(&self) {
        self.shared.gate.send_replace(true);
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL an OpenAI-format provider config takes (`.../v1`).
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The base URL an Anthropic-format provider config takes.
    pub fn anthropic_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The base URL a Gemini-format provider config takes (`.../v1beta`).
    pub fn gemini_base_url(&self) -> String {
        format!("http://{}/v1beta", self.addr)
    }

    /// Replaces the script; calls already counted stay counted.
    pub fn set_script(&self, script: Script) {
        *write(&self.shared.script) = script;
    }

    /// Chat calls received so far (model listings are not counted).
    pub fn calls(&self) -> u64 {
        lock(&self.shared.log).total
    }

    /// Chat calls received with this idempotency key.
    pub fn calls_with_key(&self, key: &str) -> u64 {
        lock(&self.shared.log).by_key.get(key).copied().unwrap_or(0)
    }

    /// Chat calls received per idempotency key.
    pub fn calls_by_key(&self) -> HashMap<String, u64> {
        lock(&self.shared.log).by_key.clone()
    }

    /// Answers kept to replay by key (none unless `replay_by_key`).
    /// How many times a stored completion was asked for.
    pub fn lookups(&self) -> u64 {
        lock(&self.shared.log).lookups
    }

    /// How many cancels were asked for (`POST /v1/responses/{id}/cancel`).
    pub fn cancels(&self) -> u64 {
        lock(&self.shared.log).cancels
    }

    /// How many polls of background responses came.
    pub fn polls(&self) -> u64 {
        lock(&self.shared.log).polls
    }

    /// The chat completions stored so far (each with its `metadata`).
    pub fn stored(&self) -> Vec<Value> {
        lock(&self.shared.log).stored.clone()
    }

    pub fn answers_kept(&self) -> usize {
        lock(&self.shared.log).answered.len()
    }

    /// Bytes of `Huge` bodies the fake has made, that is, that a client read
    /// (or that sat in buffers on their way).
    pub fn bytes_streamed(&self) -> u64 {
        self.shared
            .streamed
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every chat request received, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.log).requests.clone()
    }

    /// Waits until at least `n` chat calls have arrived. `limit` only bounds
    /// a test that would otherwise hang; returns false if it ran out.
    pub async fn wait_for_calls(&self, n: u64, limit: Duration) -> bool {
        let mut calls = self.shared.calls.subscribe();
        tokio::time::timeout(limit, calls.wait_for(|&c| c >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai_chat).get(stored_list))
        .route("/v1/chat/completions/{id}", get(stored_one))
        .route("/v1/responses", post(responses_create))
        .route("/v1/responses/{id}", get(response_get))
        .route("/v1/responses/{id}/cancel", post(response_cancel))
        .route("/v1/messages", post(anthropic_messages))
        .route("/v1beta/models/{call}", post(gemini_generate))
        .route("/v1/models", get(models))
        .with_state(shared)
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let script = read(&shared.script).clone();
    if let Some(status) = script.models_status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let body = json!({"error": {"type": "server_error", "message": "the model listing is unavailable"}});
        return (status, axum::Json(body)).into_response();
    }
    let served = script.served_models;
    let data: Vec<Value> = served
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "surety-fake"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// What one request asks and how the fake will answer it.
struct Plan {
    call: u64,
    /// The model the answer names.
    model: String,
    /// The request's Idempotency-Key, when the fake replays by key: its
    /// answer is kept under it.
    key: Option<String>,
    /// The first answer to this key, when the fake replays by key.
    replay: Option<Bytes>,
    behavior: Behavior,
    latency: Latency,
    /// For `Cycle`: how many calls reached the rule before this one.
    rule_calls: u64,
}

fn plan(
    shared: &Shared,
    format: WireFormat,
    headers: &HeaderMap,
    (body, model): (&Value, String),
    raw: &Bytes,
) -> Plan {
    let prompt = prompt_text(body);
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut log = lock(&shared.log);
    log.total += 1;
    let call = log.total;
    let script = read(&shared.script);
    if let (Some(key), Keep::Requests | Keep::Counts) = (&key, script.keep) {
        *log.by_key.entry(key.clone()).or_default() += 1;
    }
    if script.keep == Keep::Requests {
        log.requests.push(Recorded {
            format,
            model: model.clone(),
            idempotency_key: key.clone(),
            body: body.clone(),
            raw: String::from_utf8_lossy(raw).into_owned(),
            headers: uncredentialed(headers),
        });
    }
    let replay = match (&key, script.replay_by_key) {
        (Some(key), true) => log.answered.get(key).cloned(),
        _ => None,
    };
    let key = key.filter(|_| script.replay_by_key);
    let matched = script
        .rules
        .iter()
        .enumerate()
        .find(|(_, rule)| match &rule.when {
            When::Always => true,
            When::Model(m) => *m == model,
            When::PromptContains(text) => prompt.contains(text.as_str()),
            When::Call(n) => *n == call,
        });
    let (index, behavior, latency) = match matched {
        Some((i, rule)) => (i, rule.then.clone(), rule.latency),
        None => (usize::MAX, script.default.clone(), Latency::None),
    };
    let counter = log.by_rule.entry(index).or_default();
    let rule_calls = *counter;
    *counter += 1;
    drop(log);
    shared.calls.send_replace(call);
    Plan {
        call,
        model: script.answer_model.clone().unwrap_or(model),
        key,
        replay,
        behavior,
        latency,
        rule_calls,
    }
}

/// Every message's text, for matching rules, in any of the wire formats.
/// `headers` by name, but credentials.
fn uncredentialed(headers: &HeaderMap) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::<String, String>::new();
    for (name, value) in headers {
        if matches!(
            name.as_str(),
            "authorization" | "x-api-key" | "x-goog-api-key"
        ) {
            continue;
        }
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        out.entry(name.as_str().to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    out
}

/// The prefix of an Anthropic request up to its last cache breakpoint
/// (`cache_control` on a tool, a system block or a message's block), as
/// the words a cache would keep; none without a breakpoint. Anthropic's
/// order: tools, then system, then messages.
fn cached_prefix(body: &Value) -> Option<String> {
    let mut seen = String::new();
    let mut prefix = None;
    let mut visit = |block: &Value, text: String| {
        seen.push_str(&text);
        seen.push('\n');
        if block.get("cache_control").is_some_and(|c| !c.is_null()) {
            prefix = Some(seen.clone());
        }
    };
    for tool in body["tools"].as_array().into_iter().flatten() {
        visit(tool, tool.to_string());
    }
    for block in body["system"].as_array().into_iter().flatten() {
        visit(block, block["text"].as_str().unwrap_or_default().to_owned());
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        for block in message["content"].as_array().into_iter().flatten() {
            let text = match &block["content"] {
                Value::String(t) => t.clone(),
                _ => block["text"]
                    .as_str()
                    .map_or_else(|| block.to_string(), str::to_owned),
            };
            visit(block, text);
        }
    }
    prefix
}

fn prompt_text(body: &Value) -> String {
    let mut text = String::new();
    match &body["system"] {
        Value::String(system) => {
            text.push_str(system);
            text.push('\n');
        }
        Value::Array(blocks) => {
            for block in blocks {
                text.push_str(block["text"].as_str().unwrap_or_default());
            }
            text.push('\n');
        }
        _ => {}
    }
    let parts = |content: &Value| -> String {
        content["parts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["text"].as_str())
            .collect()
    };
    text.push_str(&parts(&body["systemInstruction"]));
    for content in body["contents"].as_array().into_iter().flatten() {
        text.push_str(&parts(content));
        text.push('\n');
    }
    if let Some(instructions) = body["instructions"].as_str() {
        text.push_str(instructions);
        text.push('\n');
    }
    for item in body["input"].as_array().into_iter().flatten() {
        match &item["content"] {
            Value::String(s) => text.push_str(s),
            Value::Array(parts) => {
                for part in parts {
                    text.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            _ => text.push_str(item["output"].as_str().unwrap_or_default()),
        }
        text.push('\n');
    }
    for message in body["messages"].as_array().into_iter().flatten() {
        match &message["content"] {
            Value::String(s) => text.push_str(s),
            Value::Array(parts) => {
                for part in parts {
                    text.push_str(part["text"].as_str().unwrap_or_default());
                }
            }
            _ => {}
        }
        text.push('\n');
    }
    text
}

async fn wait(latency: Latency) {
    let ms = match latency {
        Latency::None => return,
        Latency::FixedMs(ms) => ms,
        Latency::RandomMs { min, max } => rand::random_range(min..=max.max(min)),
    };
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// How a normal answer is made, per wire format: from the reply text, or
/// as a refusal in these words.
trait Answers {
    fn reply(&self, text: &str) -> Value;
    fn refusal(&self, words: &str) -> Value;
    /// The reply, ending with `reason` instead of the normal one.
    fn finish(&self, text: &str, reason: &str) -> Value;
    /// The reply, after a thinking model's `thought`.
    fn thought(&self, thought: &str, text: &str) -> Value;
    /// The metadata to store the answer with, when the request asked to
    /// `store` it (OpenAI's stored completions).
    fn stored(&self) -> Option<&Value> {
        None
    }
}

/// How an answer is lost on the wire.
#[derive(Clone, Copy, PartialEq)]
enum Lost {
    Not,
    Silently,
    AfterId,
    /// Not lost: held until the gate opens.
    Held,
}

/// Answers a request as its plan says.
async fn answer(shared: &Shared, plan: Plan, headers: &HeaderMap, ok: &impl Answers) -> Response {
    wait(plan.latency).await;
    if let Some(first) = plan.replay {
        return ([(header::CONTENT_TYPE, "application/json")], first).into_response();
    }
    let key = plan.key.clone();
    let mut behavior = plan.behavior.clone();
    let mut lost = Lost::Not;
    loop {
        behavior = match behavior {
            Behavior::Lost(inner) => {
                lost = Lost::Silently;
                *inner
            }
            Behavior::LostAfterId(inner) => {
                lost = Lost::AfterId;
                *inner
            }
            Behavior::Held(inner) => {
                lost = Lost::Held;
                *inner
            }
            Behavior::Sequence(steps) => {
                let at = (plan.rule_calls as usize).min(steps.len().saturating_sub(1));
                steps.get(at).cloned().unwrap_or(Behavior::Hang)
            }
            Behavior::Gated(inner) => {
                let mut gate = shared.gate.subscribe();
                // The sender lives in `shared`, as long as this request.
                let _ = gate.wait_for(|open| *open).await;
                *inner
            }
            other => break behavior = other,
        };
    }
    let body = match behavior {
        Behavior::Reply(text) => ok.reply(&text),
        Behavior::Refuse(words) => ok.refusal(&words),
        Behavior::Finish { text, reason } => ok.finish(&text, &reason),
        Behavior::Thought { thought, text } => ok.thought(&thought, &text),
        Behavior::Cycle(texts) if texts.is_empty() => ok.reply(""),
        Behavior::Cycle(texts) => ok.reply(&texts[(plan.rule_calls % texts.len() as u64) as usize]),
        Behavior::Huge { bytes } => return huge(shared, bytes),
        other => {
            return misbehave(
                Plan {
                    behavior: other,
                    ..plan
                },
                headers,
                ok,
            )
            .await;
        }
    };
    if let Some(metadata) = ok.stored() {
        let mut kept = body.clone();
        kept["metadata"] = metadata.clone();
        keep(shared, kept);
    }
    let bytes = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    match lost {
        Lost::Not => {}
        Lost::Held => {
            let mut gate = shared.gate.subscribe();
            // The sender lives in `shared`, as long as this request.
            let _ = gate.wait_for(|open| *open).await;
        }
        Lost::Silently => return std::future::pending().await,
        Lost::AfterId => {
            // The bytes through the answer's id, then nothing more.
            let (name, id) = ["id", "responseId"]
                .iter()
                .find_map(|name| Some((*name, body[*name].as_str()?)))
                .unwrap_or(("id", ""));
            let member = format!("\"{name}\":\"{id}\"");
            let end = String::from_utf8_lossy(&bytes)
                .find(&member)
                .map_or(0, |at| at + member.len());
            let head = bytes.slice(..end);
            let chunks = futures_util::StreamExt::chain(
                futures_util::stream::iter([Ok::<Bytes, std::io::Error>(head)]),
                futures_util::stream::pending(),
            );
            let mut response = Response::new(Body::from_stream(chunks));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            return response;
        }
    }
    if let Some(key) = key {
        lock(&shared.log)
            .answered
            .entry(key)
            .or_insert_with(|| bytes.clone());
    }
    ([(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// A 200 whose body is `bytes` long, made 64 KiB at a time as it is read.
fn huge(shared: &Shared, bytes: u64) -> Response {
    const CHUNK: u64 = 64 * 1024;
    let streamed = shared.streamed.clone();
    let chunks = futures_util::stream::unfold(0u64, move |sent| {
        let streamed = streamed.clone();
        async move {
            if sent >= bytes {
                return None;
            }
            let n = CHUNK.min(bytes - sent);
            streamed.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            let chunk = Bytes::from(vec![b' '; usize::try_from(n).unwrap_or(0)]);
            Some((Ok::<Bytes, std::io::Error>(chunk), sent + n))
        }
    });
    let mut response = Response::new(Body::from_stream(chunks));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Every answer that is not a normal one.
async fn misbehave(plan: Plan, headers: &HeaderMap, ok: &impl Answers) -> Response {
    match plan.behavior {
        Behavior::Reply(_)
        | Behavior::Refuse(_)
        | Behavior::Cycle(_)
        | Behavior::Sequence(_)
        | Behavior::Gated(_)
        | Behavior::Finish { .. }
        | Behavior::Thought { .. }
        | Behavior::Lost(_)
        | Behavior::LostAfterId(_)
        | Behavior::Held(_)
        | Behavior::Huge { .. } => bad_request("the fake's plan is a normal answer"),
        Behavior::Drip { every_ms } => {
            let every = Duration::from_millis(every_ms.max(1));
            let drips = futures_util::stream::unfold((), move |()| async move {
                tokio::time::sleep(every).await;
                Some((Ok::<Bytes, std::io::Error>(Bytes::from_static(b" ")), ()))
            });
            let mut response = Response::new(Body::from_stream(drips));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            response
        }
        Behavior::Status {
            status,
            body,
            retry_after,
        } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (status, axum::Json(body)).into_response();
            if let Some(value) = retry_after.and_then(|v| v.parse().ok()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
        Behavior::Hang => std::future::pending().await,
        Behavior::ResetAfter { bytes } => {
            let full = serde_json::to_vec(&ok.reply("{\"answer\": \"this body is cut short\"}"))
                .unwrap_or_default();
            let head = Bytes::copy_from_slice(&full[..bytes.min(full.len().saturating_sub(1))]);
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(head),
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "scripted reset",
                )),
            ];
            let mut response = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            headers.insert(
                header::CONTENT_LENGTH,
                header::HeaderValue::from(full.len()),
            );
            response
        }
        Behavior::MalformedBody => {
            let body = format!(
                "{{\"id\": \"chatcmpl-fake-{}\", \"choices\": [{{\"message\": ",
                plan.call
            );
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Behavior::EchoCredentials => {
            let seen = ["authorization", "x-api-key", "x-goog-api-key"]
                .iter()
                .filter_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
                .collect::<Vec<_>>()
                .join(", ");
            let body = json!({"error": {"type": "authentication_error", "message": format!("invalid credentials: {seen}")}});
            (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
        }
    }
}

/// Parses a chat request, counts it and plans its answer; `None` when the
/// body is not JSON.
fn receive(
    shared: &Shared,
    format: WireFormat,
    headers: &HeaderMap,
    raw: &Bytes,
) -> Option<(Value, Plan)> {
    let body = serde_json::from_slice::<Value>(raw).ok()?;
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    let plan = plan(shared, format, headers, (&body, model), raw);
    Some((body, plan))
}

async fn openai_chat(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((body, plan)) = receive(&shared, WireFormat::OpenAi, &headers, &body) else {
        return bad_request("the request body is not JSON");
    };
    let answers = OpenAiAnswer {
        call: plan.call,
        model: plan.model.clone(),
        prompt_tokens: word_count(&prompt_text(&body)),
        offers_tools: offers_tools(&body),
        store: (body["store"] == json!(true)).then(|| body["metadata"].clone()),
    };
    if answers.store.is_none() {
        return answer(&shared, plan, &headers, &answers).await;
    }
    // A provider that stores its answers does the work whether or not the
    // client stays to hear it: a dropped connection does not stop it.
    let worker = shared.clone();
    tokio::spawn(async move { answer(&worker, plan, &headers, &answers).await })
        .await
        .unwrap_or_else(|_| bad_request("the fake's answer task failed"))
}

/// Whether a request offers tools (`tools`, in every wire format).
fn offers_tools(body: &Value) -> bool {
    body["tools"].as_array().is_some_and(|t| !t.is_empty())
}

/// The tool calls a reply names, when it is a tool-call contract's
/// canonical answer (`{"tool", "arguments"}`, or `{"calls": [...]}`): to a
/// request that offers tools, the fake answers with these calls in its
/// wire format; anything else is answered as text.
fn tool_calls_in(text: &str) -> Option<Vec<(String, Value)>> {
    let answer: Value = serde_json::from_str(text).ok()?;
    let one = |call: &Value| -> Option<(String, Value)> {
        let object = call.as_object()?;
        (object.len() == 2).then_some(())?;
        Some((
            call["tool"].as_str()?.to_owned(),
            call.get("arguments")?.clone(),
        ))
    };
    match answer.get("calls").and_then(Value::as_array) {
        Some(calls) => calls.iter().map(one).collect(),
        None => one(&answer).map(|c| vec![c]),
    }
}

/// A chat completion.
struct OpenAiAnswer {
    call: u64,
    model: String,
    prompt_tokens: u64,
    offers_tools: bool,
    /// The metadata the request asked its answer to be stored with.
    store: Option<Value>,
}

impl OpenAiAnswer {
    fn completion(&self, content: Option<&str>, refusal: Option<&str>) -> Value {
        self.ending(content, refusal, "stop")
    }

    fn ending(&self, content: Option<&str>, refusal: Option<&str>, reason: &str) -> Value {
        let completion_tokens = word_count(content.or(refusal).unwrap_or_default());
        json!({
            "id": format!("chatcmpl-fake-{}", self.call),
            "object": "chat.completion",
            "created": 1_767_225_600,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal},
                "logprobs": null,
                "finish_reason": reason,
            }],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens,
            },
        })
    }
}

impl OpenAiAnswer {
    /// The answer that calls `calls` (arguments as JSON text, as OpenAI sends them).
    fn calling(&self, calls: &[(String, Value)], text: &str) -> Value {
        let mut body = self.ending(None, None, "tool_calls");
        let message = &mut body["choices"][0]["message"];
        message["tool_calls"] = calls
            .iter()
            .enumerate()
            .map(|(i, (name, arguments))| {
                json!({
                    "id": format!("call_fake_{}_{i}", self.call),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments.to_string()},
                })
            })
            .collect();
        body["usage"]["completion_tokens"] = json!(word_count(text));
        body
    }
}

impl Answers for OpenAiAnswer {
    fn reply(&self, text: &str) -> Value {
        match tool_calls_in(text).filter(|_| self.offers_tools) {
            Some(calls) => self.calling(&calls, text),
            None => self.completion(Some(text), None),
        }
    }

    fn refusal(&self, words: &str) -> Value {
        self.completion(None, Some(words))
    }

    fn finish(&self, text: &str, reason: &str) -> Value {
        self.ending(Some(text), None, reason)
    }

    fn thought(&self, thought: &str, text: &str) -> Value {
        let mut body = self.completion(Some(text), None);
        body["choices"][0]["message"]["reasoning_content"] = json!(thought);
        body
    }

    fn stored(&self) -> Option<&Value> {
        self.store.as_ref()
    }
}

/// Stores an answer, in place of one stored with its id before (a
/// background response's queued record), unless that one was cancelled.
fn keep(shared: &Shared, kept: Value) {
    let mut log = lock(&shared.log);
    match log.stored.iter().position(|c| c["id"] == kept["id"]) {
        Some(at) if log.stored[at]["status"] == json!("cancelled") => {}
        Some(at) => log.stored[at] = kept,
        None => log.stored.push(kept),
    }
}

/// `GET /v1/chat/completions/{id}`: a stored completion, or OpenAI's 404.
async fn stored_one(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let mut log = lock(&shared.log);
    log.lookups += 1;
    match log.stored.iter().find(|c| c["id"] == json!(id)) {
        Some(completion) => axum::Json(completion.clone()).into_response(),
        None => {
            let body = json!({"error": {
                "message": format!("No chat completion found with id '{id}'."),
                "type": "invalid_request_error", "param": null, "code": "not_found",
            }});
            (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
        }
    }
}

/// `GET /v1/chat/completions?metadata[k]=v&limit=n`: the stored
/// completions whose metadata has every pair asked, oldest first.
async fn stored_list(
    State(shared): State<Arc<Shared>>,
    axum::extract::Query(query): axum::extract::Query<Vec<(String, String)>>,
) -> Response {
    let wanted: Vec<(String, String)> = query
        .iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((key.to_owned(), v.clone()))
        })
        .collect();
    let limit = query
        .iter()
        .find(|(k, _)| k == "limit")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(20);
    let mut log = lock(&shared.log);
    log.lookups += 1;
    let matching: Vec<&Value> = log
        .stored
        .iter()
        .filter(|c| wanted.iter().all(|(k, v)| c["metadata"][k] == json!(v)))
        .collect();
    let data: Vec<Value> = matching.iter().take(limit).map(|c| (*c).clone()).collect();
    axum::Json(json!({
        "object": "list",
        "first_id": data.first().map(|c| c["id"].clone()),
        "last_id": data.last().map(|c| c["id"].clone()),
        "has_more": matching.len() > data.len(),
        "data": data,
    }))
    .into_response()
}

async fn anthropic_messages(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((body, plan)) = receive(&shared, WireFormat::Anthropic, &headers, &body) else {
        return bad_request("the request body is not JSON");
    };
    // A prompt cache as Anthropic keeps one: the prefix up to the last
    // breakpoint is written on its first request and read on the next.
    // The tools are part of the prompt, before the system prompt.
    let tools: u64 = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| word_count(&t.to_string()))
        .sum();
    let prompt_tokens = tools + word_count(&prompt_text(&body));
    let cache = cached_prefix(&body).map_or(CacheUse::default(), |prefix| {
        let tokens = word_count(&prefix).min(prompt_tokens);
        match lock(&shared.log).cached.insert(prefix) {
            true => CacheUse {
                read: 0,
                written: tokens,
            },
            false => CacheUse {
                read: tokens,
                written: 0,
            },
        }
    });
    let answers = AnthropicAnswer {
        call: plan.call,
        model: plan.model.clone(),
        prompt_tokens,
        cache,
        offers_tools: offers_tools(&body),
        forced_tool: body["tool_choice"]["name"].as_str().map(str::to_owned),
        prefilled: body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .filter(|m| m["role"] == "assistant")
            .and_then(|m| m["content"].as_str())
            .map(str::to_owned),
    };
    answer(&shared, plan, &headers, &answers).await
}

/// What a request's prompt read from the fake's cache and wrote to it.
#[derive(Debug, Clone, Copy, Default)]
struct CacheUse {
    read: u64,
    written: u64,
}

/// A Messages response.
struct AnthropicAnswer {
    call: u64,
    model: String,
    prompt_tokens: u64,
    cache: CacheUse,
    offers_tools: bool,
    forced_tool: Option<String>,
    prefilled: Option<String>,
}

impl AnthropicAnswer {
    fn message(&self, content: Value, stop_reason: &str, text: &str) -> Value {
        json!({
            "id": format!("msg_fake_{}", self.call),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": {
                "input_tokens": self.prompt_tokens - self.cache.read - self.cache.written,
                "output_tokens": word_count(text),
                "cache_creation_input_tokens": self.cache.written,
                "cache_read_input_tokens": self.cache.read,
            },
        })
    }
}

impl AnthropicAnswer {
    /// The answer's content blocks and its normal stop reason: the forced
    /// tool called with `text` as its input, or `text` (a prefilled turn
    /// continued, not repeated).
    fn blocks(&self, text: &str) -> (Vec<Value>, &'static str, String) {
        // A tool-call contract's answer: its calls, as `tool_use` blocks.
        let calls = tool_calls_in(text)
            .filter(|_| self.offers_tools && self.forced_tool.as_deref() != Some("answer"));
        if let Some(calls) = calls {
            let blocks = calls
                .into_iter()
                .enumerate()
                .map(|(i, (name, input))| {
                    json!({"type": "tool_use", "id": format!("toolu_fake_{}_{i}", self.call), "name": name, "input": input})
                })
                .collect();
            return (blocks, "tool_use", text.to_owned());
        }
        match (&self.forced_tool, serde_json::from_str::<Value>(text)) {
            (Some(name), Ok(input)) => (
                vec![
                    json!({"type": "tool_use", "id": format!("toolu_fake_{}", self.call), "name": name, "input": input}),
                ],
                "tool_use",
                text.to_owned(),
            ),
            _ => {
                let text = self
                    .prefilled
                    .as_deref()
                    .and_then(|p| text.strip_prefix(p))
                    .unwrap_or(text);
                (
                    vec![json!({"type": "text", "text": text})],
                    "end_turn",
                    text.to_owned(),
                )
            }
        }
    }
}

impl Answers for AnthropicAnswer {
    fn reply(&self, text: &str) -> Value {
        let (blocks, stop, text) = self.blocks(text);
        self.message(Value::Array(blocks), stop, &text)
    }

    fn finish(&self, text: &str, reason: &str) -> Value {
        let (blocks, _, text) = self.blocks(text);
        self.message(Value::Array(blocks), reason, &text)
    }

    fn thought(&self, thought: &str, text: &str) -> Value {
        let (mut blocks, stop, text) = self.blocks(text);
        blocks.insert(
            0,
            json!({"type": "thinking", "thinking": thought, "signature": "fake-signature"}),
        );
        self.message(Value::Array(blocks), stop, &text)
    }

    fn refusal(&self, words: &str) -> Value {
        self.message(json!([{"type": "text", "text": words}]), "refusal", words)
    }
}

async fn gemini_generate(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(call): axum::extract::Path<String>,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let Some(model) = call.strip_suffix(":generateContent") else {
        return bad_request("only :generateContent is served");
    };
    let Ok(body) = serde_json::from_slice::<Value>(&raw) else {
        return bad_request("the request body is not JSON");
    };
    let plan = plan(
        &shared,
        WireFormat::Gemini,
        &headers,
        (&body, model.to_owned()),
        &raw,
    );
    let answers = GeminiAnswer {
        call: plan.call,
        model: plan.model.clone(),
        prompt_tokens: word_count(&prompt_text(&body)),
        offers_tools: offers_tools(&body),
    };
    answer(&shared, plan, &headers, &answers).await
}

/// A generateContent response.
struct GeminiAnswer {
    call: u64,
    model: String,
    prompt_tokens: u64,
    offers_tools: bool,
}

impl GeminiAnswer {
    fn response(&self, candidate: Value, completion_tokens: u64) -> Value {
        json!({
            "candidates": [candidate],
            "usageMetadata": {
                "promptTokenCount": self.prompt_tokens,
                "candidatesTokenCount": completion_tokens,
                "totalTokenCount": self.prompt_tokens + completion_tokens,
            },
            "modelVersion": self.model,
            "responseId": format!("fake-{}", self.call),
        })
    }
}

impl Answers for GeminiAnswer {
    fn reply(&self, text: &str) -> Value {
        self.finish(text, "STOP")
    }

    fn finish(&self, text: &str, reason: &str) -> Value {
        // A tool-call contract's answer: its calls, as `functionCall` parts.
        let parts = match tool_calls_in(text).filter(|_| self.offers_tools) {
            Some(calls) => calls
                .into_iter()
                .map(|(name, args)| json!({"functionCall": {"name": name, "args": args}}))
                .collect(),
            None => vec![json!({"text": text})],
        };
        let candidate = json!({
            "content": {"role": "model", "parts": parts},
            "finishReason": reason,
            "index": 0,
        });
        self.response(candidate, word_count(text))
    }

    fn thought(&self, thought: &str, text: &str) -> Value {
        let candidate = json!({
            "content": {"role": "model", "parts": [{"text": thought, "thought": true}, {"text": text}]},
            "finishReason": "STOP",
            "index": 0,
        });
        self.response(candidate, word_count(thought) + word_count(text))
    }

    fn refusal(&self, words: &str) -> Value {
        let candidate = json!({"finishReason": "SAFETY", "finishMessage": words, "index": 0});
        self.response(candidate, 0)
    }
}

fn bad_request(message: &str) -> Response {
    let body = json!({"error": {"type": "invalid_request_error", "message": message}});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// A stand-in token count: the fake has no tokenizer and says so by name.
fn word_count(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// `POST /v1/responses`: a response, or with `background` a queued one at
/// once, its work done on a task of its own (stored, to be polled).
async fn responses_create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((body, plan)) = receive(&shared, WireFormat::Responses, &headers, &body) else {
        return bad_request("the request body is not JSON");
    };
    let answers = ResponsesAnswer {
        call: plan.call,
        model: plan.model.clone(),
        prompt_tokens: word_count(&prompt_text(&body)),
        offers_tools: offers_tools(&body),
        store: (body["store"] == json!(true)).then(|| body["metadata"].clone()),
        echo: json!({
            "tools": body.get("tools").cloned().unwrap_or_else(|| json!([])),
            "tool_choice": body.get("tool_choice").cloned().unwrap_or_else(|| json!("auto")),
            "parallel_tool_calls": body.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
        }),
    };
    if body["background"] != json!(true) {
        return answer(&shared, plan, &headers, &answers).await;
    }
    if answers.store.is_none() {
        return bad_request("background responses must be stored (`store: true`)");
    }
    // The create's own answer may be lost; the work goes on regardless.
    let (work, lost) = match plan.behavior.clone() {
        Behavior::Lost(inner) => (*inner, Lost::Silently),
        Behavior::LostAfterId(inner) => (*inner, Lost::AfterId),
        other => (other, Lost::Not),
    };
    let queued = answers.response(Vec::new(), "queued", None, "");
    let mut record = queued.clone();
    record["metadata"] = answers.store.clone().unwrap_or_default();
    keep(&shared, record);
    let id = answers.id();
    let worker = shared.clone();
    tokio::spawn(async move {
        let done = answer(
            &worker,
            Plan {
                behavior: work,
                ..plan
            },
            &HeaderMap::new(),
            &answers,
        )
        .await;
        if !done.status().is_success() {
            let mut log = lock(&worker.log);
            if let Some(stored) = log.stored.iter_mut().find(|c| c["id"] == json!(id))
                && stored["status"] != json!("cancelled")
            {
                stored["status"] = json!("failed");
                stored["error"] = json!({"code": "server_error", "message": format!("the work failed with HTTP {}", done.status().as_u16())});
            }
        }
    });
    let bytes = Bytes::from(serde_json::to_vec(&queued).unwrap_or_default());
    match lost {
        Lost::Silently => std::future::pending().await,
        Lost::AfterId => {
            let member = format!("\"id\":\"{}\"", queued["id"].as_str().unwrap_or_default());
            let end = String::from_utf8_lossy(&bytes)
                .find(&member)
                .map_or(0, |at| at + member.len());
            let chunks = futures_util::StreamExt::chain(
                futures_util::stream::iter([Ok::<Bytes, std::io::Error>(bytes.slice(..end))]),
                futures_util::stream::pending(),
            );
            let mut response = Response::new(Body::from_stream(chunks));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            response
        }
        Lost::Not | Lost::Held => {
            ([(header::CONTENT_TYPE, "application/json")], bytes).into_response()
        }
    }
}

/// OpenAI's 404 for a response it does not have.
fn no_response(id: &str) -> Response {
    let body = json!({"error": {
        "message": format!("Response with id '{id}' not found."),
        "type": "invalid_request_error", "param": null, "code": null,
    }});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// `GET /v1/responses/{id}`: a stored response as it is now; the first
/// `hang_polls` polls never answer.
async fn response_get(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let hang_polls = read(&shared.script).hang_polls;
    let found = {
        let mut log = lock(&shared.log);
        log.lookups += 1;
        log.polls += 1;
        if log.polls <= hang_polls {
            None
        } else {
            Some(log.stored.iter().find(|c| c["id"] == json!(id)).cloned())
        }
    };
    match found {
        None => std::future::pending().await,
        Some(Some(response)) => axum::Json(response).into_response(),
        Some(None) => no_response(&id),
    }
}

/// `POST /v1/responses/{id}/cancel`: a background response still running
/// is cancelled (and its work, when it ends, is not kept).
async fn response_cancel(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let mut log = lock(&shared.log);
    log.cancels += 1;
    let Some(stored) = log.stored.iter_mut().find(|c| c["id"] == json!(id)) else {
        drop(log);
        return no_response(&id);
    };
    if matches!(stored["status"].as_str(), Some("queued" | "in_progress")) {
        stored["status"] = json!("cancelled");
    }
    axum::Json(stored.clone()).into_response()
}

/// A response of the Responses API.
struct ResponsesAnswer {
    call: u64,
    model: String,
    prompt_tokens: u64,
    offers_tools: bool,
    /// The metadata the request asked its response to be stored with.
    store: Option<Value>,
    /// What a response echoes of its request (its tools and their choice).
    echo: Value,
}

impl ResponsesAnswer {
    fn id(&self) -> String {
        format!("resp_fake_{}", self.call)
    }

    fn response(
        &self,
        output: Vec<Value>,
        status: &str,
        incomplete: Option<&str>,
        text: &str,
    ) -> Value {
        let output_tokens = word_count(text);
        let mut response = json!({
            "id": self.id(),
            "object": "response",
            "created_at": 1_767_225_600,
            "status": status,
            "model": self.model,
            "output": output,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "error": null,
            "usage": {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + output_tokens,
            },
        });
        for (key, value) in self.echo.as_object().into_iter().flatten() {
            response[key] = value.clone();
        }
        response
    }

    fn message(&self, part: Value) -> Value {
        json!({
            "type": "message",
            "id": format!("msg_fake_{}", self.call),
            "status": "completed",
            "role": "assistant",
            "content": [part],
        })
    }

    fn text(&self, text: &str) -> Value {
        self.message(json!({"type": "output_text", "text": text, "annotations": []}))
    }
}

impl Answers for ResponsesAnswer {
    fn reply(&self, text: &str) -> Value {
        match tool_calls_in(text).filter(|_| self.offers_tools) {
            Some(calls) => {
                let items = calls
                    .iter()
                    .enumerate()
                    .map(|(i, (name, arguments))| {
                        json!({
                            "type": "function_call",
                            "id": format!("fc_fake_{}_{i}", self.call),
                            "call_id": format!("call_fake_{}_{i}", self.call),
                            "name": name,
                            "arguments": arguments.to_string(),
                            "status": "completed",
                        })
                    })
                    .collect();
                self.response(items, "completed", None, text)
            }
            None => self.response(vec![self.text(text)], "completed", None, text),
        }
    }

    fn refusal(&self, words: &str) -> Value {
        let part = json!({"type": "refusal", "refusal": words});
        self.response(vec![self.message(part)], "completed", None, words)
    }

    fn finish(&self, text: &str, reason: &str) -> Value {
        match reason {
            "completed" => self.response(vec![self.text(text)], "completed", None, text),
            other => self.response(vec![self.text(text)], "incomplete", Some(other), text),
        }
    }

    fn thought(&self, thought: &str, text: &str) -> Value {
        let reasoning = json!({
            "type": "reasoning",
            "id": format!("rs_fake_{}", self.call),
            "summary": [{"type": "summary_text", "text": thought}],
        });
        self.response(vec![reasoning, self.text(text)], "completed", None, text)
    }

    fn stored(&self) -> Option<&Value> {
        self.store.as_ref()
    }
}
