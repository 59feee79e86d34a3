//! The official OpenAI Python SDK, unchanged, as a client of the router's
//! `/v1/chat/completions` and `/v1/models` (installed by `cargo xtask test`
//! into the cache and named by `SURETY_OPENAI_SDK_PYTHON`).

use serde_json::{Value, json};
use surety_fake_provider::FakeProvider;
use surety_tests::TestDb;

use crate::harness::{ACME, Router, contract, language_script};

const CLIENT: &str = r#"
import json, os
import openai
from openai import OpenAI

base = os.environ["BASE_URL"] + "/v1"
# The SDK's own retry policy, as users run it.
client = OpenAI(base_url=base, api_key=os.environ["API_KEY"], max_retries=2)
# The contract's own prompt, rendered: the facade sends only certified prompts.
def prompt(user):
    return [
        {"role": "system", "content": os.environ["SYSTEM_PROMPT"]},
        {"role": "user", "content": user},
    ]
french, german = prompt(os.environ["USER_FRENCH"]), prompt(os.environ["USER_GERMAN"])
key = lambda k: {"Idempotency-Key": k}
seen = {}

first = client.chat.completions.create(model="language", messages=french, extra_headers=key("sdk-order-1"))
again = client.chat.completions.with_raw_response.create(model="language", messages=french, extra_headers=key("sdk-order-1"))
second = again.parse()
seen["first_id"], seen["second_id"] = first.id, second.id
seen["content"] = first.choices[0].message.content
seen["finish_reason"] = first.choices[0].finish_reason
seen["usage"] = first.usage.model_dump()
seen["model"] = first.model
seen["replayed"] = again.headers.get("idempotent-replayed")
seen["prompt_certified"] = again.headers.get("surety-prompt-certified")

def streamed(k):
    chunks = list(client.chat.completions.create(
        model="language", messages=german, stream=True,
        stream_options={"include_usage": True}, extra_headers=key(k)))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage.model_dump() for c in chunks if c.usage]
    return {"chunks": len(chunks), "text": text, "finish": finish, "usage": usage}
seen["stream"] = streamed("sdk-stream-1")
seen["stream_again"] = streamed("sdk-stream-1")

seen["models"] = [m.id for m in client.models.list()]

def error(call):
    try:
        call()
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "message": e.message, "param": getattr(e, "param", None)}
    return None
seen["no_key"] = error(lambda: client.chat.completions.create(model="language", messages=french))
seen["conflict"] = error(lambda: client.chat.completions.create(model="language", messages=german, extra_headers=key("sdk-order-1")))
bad = OpenAI(base_url=base, api_key="not-a-key", max_retries=2)
seen["bad_key"] = error(lambda: bad.chat.completions.create(model="language", messages=french, extra_headers=key("sdk-order-9")))
tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
seen["tools"] = error(lambda: client.chat.completions.create(model="language", messages=french, tools=[tool], extra_headers=key("sdk-order-2")))
print(json.dumps(seen))
"#;

/// The SDK's Python, or `None` (loudly) outside CI when it is not installed.
pub fn sdk_python() -> Option<String> {
    surety_tests::require("SURETY_OPENAI_SDK_PYTHON", "the OpenAI SDK")
}

/// Runs a client `script` under the SDK's Python with `env`; what it
/// printed, as JSON. A script that fails fails the test with its stderr.
pub async fn run_client(python: &str, script: &str, env: &[(&str, &str)]) -> Value {
    let output = tokio::process::Command::new(python)
        .args(["-c", script])
        .envs(env.iter().copied())
        .output()
        .await;
    serde_json::from_str(&surety_tests::printed(output, "the client script")).unwrap()
}

pub async fn the_official_openai_sdk_gets_its_answer_once(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let language = contract("language-detect");
    let render = |text: &str| language.render(&json!({"text": text})).unwrap();
    let french = render("Bonjour, je n'arrive pas à télécharger ma facture en PDF.");
    let german = render("Guten Tag, meine Rechnung wurde zweimal abgebucht. Bitte um Erstattung.");
    let seen = run_client(
        &python,
        CLIENT,
        &[
            ("BASE_URL", &router.base),
            ("API_KEY", ACME),
            ("SYSTEM_PROMPT", &french.system),
            ("USER_FRENCH", &french.user),
            ("USER_GERMAN", &german.user),
        ],
    )
    .await;
    // A plain call, and its replay.
    assert_eq!(
        seen["first_id"], seen["second_id"],
        "the same Idempotency-Key gets the same completion: {seen}"
    );
    assert!(seen["first_id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(
        serde_json::from_str::<Value>(seen["content"].as_str().unwrap()).unwrap(),
        json!({"language": "french"})
    );
    assert_eq!(seen["model"], "language");
    assert_eq!(seen["replayed"], "true");
    assert_eq!(seen["prompt_certified"], "true");
    assert_eq!(seen["finish_reason"], "stop");
    let usage = &seen["usage"];
    assert!(
        usage["prompt_tokens"].as_u64().unwrap() > 0
            && usage["completion_tokens"].as_u64().unwrap() > 0
            && usage["total_tokens"].as_u64().unwrap()
                == usage["prompt_tokens"].as_u64().unwrap()
                    + usage["completion_tokens"].as_u64().unwrap(),
        "the provider's usage: {seen}"
    );
    // Streamed, then streamed again from the stored answer.
    let stream = &seen["stream"];
    assert_eq!(
        serde_json::from_str::<Value>(stream["text"].as_str().unwrap()).unwrap(),
        json!({"language": "german"}),
        "{seen}"
    );
    assert!(stream["chunks"].as_u64().unwrap() >= 3, "{seen}");
    assert_eq!(stream["finish"], json!(["stop"]));
    assert_eq!(stream["usage"].as_array().unwrap().len(), 1, "{seen}");
    assert_eq!(seen["stream_again"]["text"], stream["text"]);
    assert_eq!(
        fake.calls(),
        2,
        "one provider call per intent, replays included"
    );
    // The routes as models.
    assert_eq!(seen["models"], json!(["language"]));
    // Errors the SDK raises as its typed exceptions.
    let no_key = &seen["no_key"];
    assert_eq!(no_key["class"], "BadRequestError", "{seen}");
    assert!(
        no_key["message"]
            .as_str()
            .unwrap()
            .contains("no Idempotency-Key header: send one naming this intent"),
        "{seen}"
    );
    assert_eq!(seen["conflict"]["class"], "ConflictError", "{seen}");
    assert_eq!(
        router.metric("surety_idempotency_conflicts_total").await,
        1.0,
        "raised once: the SDK does not retry a conflict"
    );
    assert_eq!(seen["bad_key"]["class"], "AuthenticationError", "{seen}");
    assert_eq!(seen["tools"]["class"], "BadRequestError", "{seen}");
    assert_eq!(seen["tools"]["param"], "tools", "{seen}");
    assert_eq!(fake.calls(), 2, "no refused request reached the provider");
}

/// The SDK's own idempotency hook, set by the subclass docs/clients.md
/// shows: every call carries a fresh `Idempotency-Key`, and the SDK's own
/// retries reuse it.
const HOOKED: &str = r#"
import json, os
from openai import OpenAI

class SuretyOpenAI(OpenAI):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._idempotency_header = "Idempotency-Key"

client = SuretyOpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=2)
messages = [
    {"role": "system", "content": os.environ["SYSTEM_PROMPT"]},
    {"role": "user", "content": os.environ["USER_FRENCH"]},
]
seen = {}
# Two calls: two intents, as far as the SDK can tell.
seen["first"] = client.chat.completions.create(model="language", messages=messages).id
seen["second"] = client.chat.completions.create(model="language", messages=messages).id
# The next connection is dropped after the router answered it: the SDK retries on its own.
raw = client.chat.completions.with_raw_response.create(model="language", messages=messages)
seen["retried"] = raw.parse().id
seen["retries_taken"] = raw.retries_taken
seen["replayed"] = raw.headers.get("idempotent-replayed")
print(json.dumps(seen))
"#;

/// Between the SDK and the router: passes every request through and
/// records its `Idempotency-Key`, except that the answer to the `drop`-th
/// request is read and thrown away, and the client's connection closed: the
/// router did the work, and the client sees its connection drop with no
/// answer.
pub struct DroppingProxy {
    pub url: String,
    pub keys: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DroppingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DroppingProxy {
    pub async fn start(upstream: &str, drop: usize) -> DroppingProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let keys = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = keys.clone();
        let task = tokio::spawn(async move {
            loop {
                let (mut client, _) = listener.accept().await.unwrap();
                let mut server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let seen = seen.clone();
                tokio::spawn(async move {
                    // One request at a time: read it whole, note its key, pass it on.
                    loop {
                        let Some(request) = read_message(&mut client).await else {
                            return;
                        };
                        let nth = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(header(&request, "idempotency-key").unwrap_or_default());
                            seen.len()
                        };
                        server.write_all(&request).await.unwrap();
                        let Some(answer) = read_message(&mut server).await else {
                            return;
                        };
                        if nth == drop {
                            // The router answered; the client never hears it.
                            return;
                        }
                        client.write_all(&answer).await.unwrap();
                    }
                });
            }
        });
        return DroppingProxy { url, keys, task };

        /// One HTTP/1.1 message with a Content-Length body (what the SDK
        /// sends and the router answers to a completion).
        async fn read_message(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
            let mut message = Vec::new();
            let mut chunk = [0u8; 8192];
            loop {
                if let Some(end) = message.windows(4).position(|w| w == b"\r\n\r\n") {
                    let length: usize = header(&message[..end], "content-length")
                        .and_then(|l| l.parse().ok())
                        .unwrap_or(0);
                    if message.len() >= end + 4 + length {
                        return Some(message);
                    }
                }
                let n = stream.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                message.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

fn header(message: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(message);
    let head = text.split("\r\n\r\n").next()?;
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// With the SDK's idempotency hook set as docs/clients.md shows, two calls
/// are two jobs, and a call the SDK retries after a dropped connection is
/// one job: the retry carries the same key and gets the stored answer.
pub async fn the_sdks_idempotency_hook_makes_its_own_retries_one_job(db: &TestDb) {
    hooked_retries_are_one_job(db, HOOKED).await;
}

/// A client `script` whose SDK sends its own key (its idempotency hook
/// switched on) against the router's `language` route, through a proxy
/// that drops the answer to the third request: two calls are two jobs, and
/// the call whose connection dropped is one job, its retry answered from
/// the store, with one provider call.
pub async fn hooked_retries_are_one_job(db: &TestDb, script: &str) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    // The third request's answer is the one dropped.
    let proxy = DroppingProxy::start(&router.base, 3).await;
    let language = contract("language-detect");
    let french = language
        .render(&json!({"text": "Bonjour, je n'arrive pas à télécharger ma facture en PDF."}))
        .unwrap();
    let max_tokens = language.limits.max_output_tokens.to_string();
    let seen = run_client(
        &python,
        script,
        &[
            ("BASE_URL", &proxy.url),
            ("API_KEY", ACME),
            ("SYSTEM_PROMPT", &french.system),
            ("USER_FRENCH", &french.user),
            ("MAX_TOKENS", &max_tokens),
        ],
    )
    .await;
    let keys = proxy.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 4, "two calls, one call sent twice: {keys:?}");
    assert!(
        keys.iter()
            .all(|k| k.starts_with("stainless-python-retry-")),
        "the SDK's own keys: {keys:?}"
    );
    assert_ne!(keys[0], keys[1], "two calls, two keys");
    assert_ne!(seen["first"], seen["second"], "two calls, two jobs: {seen}");
    assert_ne!(keys[1], keys[2]);
    assert_eq!(keys[2], keys[3], "the SDK's retry reuses its key");
    assert_eq!(seen["retries_taken"], 1, "{seen}");
    assert_eq!(
        seen["replayed"], "true",
        "the retry got the stored job: {seen}"
    );
    assert_eq!(fake.calls(), 3, "three jobs, one provider call each");
}

const TOOL_CLIENT: &str = r#"
import json, os
import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=0)
messages = json.loads(os.environ["MESSAGES"])
tools = json.loads(os.environ["TOOLS"])
key = lambda k: {"Idempotency-Key": k}
seen = {}

def call(k, **more):
    return client.chat.completions.create(model="support", messages=messages, tools=tools,
                                          tool_choice="required", extra_headers=key(k), **more)

first = call("sdk-refund-1042")
message = first.choices[0].message
seen["finish_reason"] = first.choices[0].finish_reason
seen["content"] = message.content
seen["calls"] = [{"id": c.id, "type": c.type, "name": c.function.name,
                  "arguments": json.loads(c.function.arguments)} for c in message.tool_calls]
seen["replay_id"] = call("sdk-refund-1042").choices[0].message.tool_calls[0].id

chunks = list(call("sdk-refund-stream", stream=True))
pieces = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
seen["stream"] = {
    "chunks": len(chunks),
    "pieces": len(pieces),
    "id": next(p.id for p in pieces if p.id),
    "name": next(p.function.name for p in pieces if p.function and p.function.name),
    "arguments": json.loads("".join(p.function.arguments or "" for p in pieces if p.function)),
    "finish": [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason],
}
seen["stream_replay_id"] = next(p.id for c in call("sdk-refund-stream", stream=True)
                                for p in ((c.choices[0].delta.tool_calls or []) if c.choices else []) if p.id)

other = json.loads(json.dumps(tools))
other[0]["function"]["parameters"]["properties"]["amount"]["type"] = "string"
try:
    client.chat.completions.create(model="support", messages=messages, tools=other,
                                   extra_headers=key("sdk-refund-other"))
    seen["other_tools"] = None
except openai.BadRequestError as e:
    seen["other_tools"] = {"class": type(e).__name__, "message": e.message, "param": e.param}
print(json.dumps(seen))
"#;

pub async fn the_official_openai_sdk_gets_a_certified_tool_call_once(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    let router = crate::tools::support_router(db, &[("claude", "anthropic", &fake)]).await;
    let seen = crate::tools::run_teapot_client(&python, TOOL_CLIENT, &router.base).await;
    let refund = crate::tools::teapot_refund();
    assert_eq!(seen["finish_reason"], "tool_calls", "{seen}");
    assert!(seen["content"].is_null(), "{seen}");
    let call = &seen["calls"][0];
    assert_eq!(seen["calls"].as_array().unwrap().len(), 1, "{seen}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["name"], "refund", "{seen}");
    assert_eq!(call["arguments"], refund);
    assert_eq!(
        seen["replay_id"], call["id"],
        "a replay has the same call id"
    );
    let stream = &seen["stream"];
    assert_eq!(stream["name"], "refund", "{seen}");
    assert_eq!(stream["arguments"], refund, "{seen}");
    assert!(stream["pieces"].as_u64().unwrap() >= 3, "in chunks: {seen}");
    assert_eq!(stream["finish"], json!(["tool_calls"]));
    assert_eq!(seen["stream_replay_id"], stream["id"], "{seen}");
    assert_ne!(stream["id"], call["id"], "another job, another id");
    assert_eq!(fake.calls(), 2, "one provider call per intent: {seen}");
    let other = &seen["other_tools"];
    assert_eq!(other["class"], "BadRequestError", "{seen}");
    assert_eq!(other["param"], "tools[0]", "{seen}");
    assert!(
        other["message"]
            .as_str()
            .unwrap()
            .contains("the tool `refund` differs from the one contract `support-action` certifies"),
        "{seen}"
    );
}
