//! Anthropic's official Python SDK (`anthropic`), unchanged but for its
//! base URL and key, as a client of the router's `/v1/messages`: a pinned
//! prompt, both streams, replay by key, a conflict, refused parameters,
//! the SDK's typed errors, and a certified tool use.

use serde_json::{Value, json};
use surety_fake_provider::{FakeProvider, Script};
use surety_tests::TestDb;

use surety_harness::tokenizer::{TokenCheck, Tokenizer};
use surety_providers::ProvidersConfig;

use crate::harness::{
    ACME, GLOBEX, Router, contract, language_script, manifest_of, provider_toml, providers_tried,
};
use crate::sdk::{run_client, sdk_python};

const CLIENT: &str = r#"
import json, os, urllib.request
import anthropic

base = os.environ["BASE_URL"]
client = anthropic.Anthropic(base_url=base, api_key=os.environ["API_KEY"], max_retries=2)
system = os.environ["SYSTEM_PROMPT"]
key = lambda k: {"Idempotency-Key": k}
ask = lambda text, k, **kw: client.messages.create(model="language", max_tokens=int(os.environ["MAX_TOKENS"]), system=system,
    messages=[{"role": "user", "content": text}], extra_headers=key(k), **kw)
seen = {}

first = ask(os.environ["USER_FRENCH"], "msg-1")
raw = client.messages.with_raw_response.create(model="language", max_tokens=int(os.environ["MAX_TOKENS"]), system=system,
    messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}], extra_headers=key("msg-1"))
again = raw.parse()
seen["first"] = first.model_dump()
seen["models"] = [m.model_dump(mode="json") for m in client.models.list().data]
seen["again"] = {"id": again.id, "replayed": raw.headers.get("idempotent-replayed"), "request_id": again._request_id}
# System as text blocks, content as blocks: the same prompt.
blocks = client.messages.create(model="language", max_tokens=int(os.environ["MAX_TOKENS"]), system=[{"type": "text", "text": system}],
    messages=[{"role": "user", "content": [{"type": "text", "text": os.environ["USER_GERMAN"]}]}], extra_headers=key("msg-2"))
seen["blocks"] = blocks.content[0].text
counted = client.messages.with_raw_response.count_tokens(model="language", system=system,
    messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}])
seen["count"] = {"input_tokens": counted.parse().input_tokens, "tokenizer": counted.headers.get("surety-tokenizer"),
    "provider": counted.headers.get("surety-provider")}

events = list(ask(os.environ["USER_GERMAN"], "msg-3", stream=True))
seen["raw_stream"] = {
    "types": [e.type for e in events],
    "text": "".join(e.delta.text for e in events if e.type == "content_block_delta"),
    "stop": [e.delta.stop_reason for e in events if e.type == "message_delta"],
    "id": events[0].message.id,
}
with client.messages.stream(model="language", max_tokens=int(os.environ["MAX_TOKENS"]), system=system,
        messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}], extra_headers=key("msg-4")) as stream:
    pieces = list(stream.text_stream)
    final = stream.get_final_message()
seen["helper_stream"] = {"pieces": len(pieces), "text": "".join(pieces), "final": final.content[0].text, "stop": final.stop_reason}

def error(call):
    try:
        call()
    except anthropic.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "type": e.body.get("error", {}).get("type"),
                "message": e.body.get("error", {}).get("message"), "request_id": e.response.headers.get("request-id")}
    return None
seen["conflict"] = error(lambda: ask(os.environ["USER_GERMAN"], "msg-1"))
seen["count_untokenized"] = error(lambda: client.messages.count_tokens(model="untokenized", system=system,
    messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}]))
seen["count_refused"] = error(lambda: client.messages.count_tokens(model="language", system=system,
    messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}], extra_body={"max_tokens": 5}))
seen["refused"] = error(lambda: ask(os.environ["USER_FRENCH"], "msg-5", extra_body={"top_k": 5}))
seen["too_few_tokens"] = error(lambda: client.messages.create(model="language", max_tokens=1, system=system,
    messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}], extra_headers=key("msg-6")))
seen["not_pinned"] = error(lambda: client.messages.create(model="language", max_tokens=int(os.environ["MAX_TOKENS"]), system="Say anything.",
    messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}], extra_headers=key("msg-7")))
seen["unknown_model"] = error(lambda: client.messages.create(model="no-such-route", max_tokens=16,
    messages=[{"role": "user", "content": "hi"}], extra_headers=key("msg-8")))
stranger = anthropic.Anthropic(base_url=base, api_key="not-a-key", max_retries=0)
seen["unauthorized"] = error(lambda: stranger.messages.create(model="language", max_tokens=16, messages=[{"role": "user", "content": "hi"}]))
# Without anthropic-version, as the SDK never sends it.
bare = urllib.request.Request(base + "/v1/messages", method="POST", data=b"{}",
    headers={"x-api-key": os.environ["API_KEY"], "content-type": "application/json", "Idempotency-Key": "msg-9"})
try:
    urllib.request.urlopen(bare)
except urllib.error.HTTPError as e:
    seen["no_version"] = {"status": e.code, "body": json.loads(e.read())}

# A route no provider is certified for: nothing was recorded, the SDK's OverloadedError.
seen["overloaded"] = error(lambda: client.with_options(max_retries=0).messages.create(model="uncertified", max_tokens=int(os.environ["MAX_TOKENS"]),
    system=system, messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}], extra_headers=key("msg-10")))
# The owner's rate: the SDK's RateLimitError, once the burst is spent.
limited = None
for n in range(20):
    limited = error(lambda: client.with_options(max_retries=0).messages.create(model="no-such-route", max_tokens=16,
        messages=[{"role": "user", "content": "hi"}], extra_headers=key(f"msg-rate-{n}")))
    if limited and limited["status"] == 429:
        break
seen["rate_limited"] = limited
print(json.dumps(seen))
"#;

pub async fn the_anthropic_sdk_gets_its_message_once(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let routes = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n\
                  [routes.uncertified]\ncontract = \"language-detect\"\nproviders = [\"fake-b\"]\n\
                  [routes.untokenized]\ncontract = \"language-detect\"\nproviders = [\"fake-c\"]\n";
    // fake-a counts tokens with o200k_base, fake-c names no tokenizer.
    let tokenized = format!(
        "{}tokenizer = \"tiktoken:o200k_base\"\n",
        provider_toml("fake-a", &fake)
    );
    let providers = [
        tokenized,
        provider_toml("fake-b", &fake),
        provider_toml("fake-c", &fake),
    ]
    .concat();
    let configs = ProvidersConfig::from_toml(&providers).unwrap().providers;
    let router = Router::start_with(
        db,
        &providers,
        routes,
        &manifest_of(&[
            (&configs["fake-a"], "language-detect"),
            (&configs["fake-c"], "language-detect"),
        ]),
        "owner_requests_per_second = 1\nowner_burst = 30\n",
    )
    .await;
    let language = contract("language-detect");
    let render = |text: &str| language.render(&json!({"text": text})).unwrap();
    let french = render("Bonjour, je n'arrive pas à télécharger ma facture en PDF.");
    let german = render("Guten Tag, meine Rechnung wurde zweimal abgebucht. Bitte um Erstattung.");
    let max_tokens = language.limits.max_output_tokens.to_string();
    let env = [
        ("BASE_URL", router.base.as_str()),
        ("API_KEY", ACME),
        ("SYSTEM_PROMPT", french.system.as_str()),
        ("USER_FRENCH", french.user.as_str()),
        ("USER_GERMAN", german.user.as_str()),
        ("MAX_TOKENS", max_tokens.as_str()),
    ];
    let seen = run_client(&python, CLIENT, &env).await;
    let parsed = |v: &Value| serde_json::from_str::<Value>(v.as_str().unwrap()).unwrap();
    let first = &seen["first"];
    let id = first["id"].as_str().unwrap();
    assert!(id.starts_with("msg_"), "{seen}");
    assert_eq!(first["type"], "message");
    assert_eq!(first["role"], "assistant");
    assert_eq!(first["model"], "language");
    assert_eq!(first["stop_reason"], "end_turn");
    assert_eq!(first["content"][0]["type"], "text");
    assert_eq!(
        parsed(&first["content"][0]["text"]),
        json!({"language": "french"})
    );
    assert!(
        first["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{seen}"
    );
    assert_eq!(first["usage"]["cache_read_input_tokens"], 0, "{seen}");
    assert_eq!(seen["again"]["id"], id, "a replay is the same message");
    let models = seen["models"].as_array().unwrap();
    assert_eq!(models.len(), 3, "the routes, in Anthropic's shape: {seen}");
    assert_eq!(models[0]["type"], "model", "{seen}");
    assert!(models.iter().any(|m| m["id"] == "language"), "{seen}");
    assert_eq!(seen["again"]["replayed"], "true");
    assert!(
        seen["again"]["request_id"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "every answer carries request-id: {seen}"
    );
    assert_eq!(parsed(&seen["blocks"]), json!({"language": "german"}));
    // count_tokens counts as certification does, with the provider's tokenizer.
    let tokenizer = Tokenizer::for_provider(
        &configs["fake-a"],
        surety_providers::build_provider(&configs["fake-a"]).unwrap(),
    )
    .unwrap();
    let input = json!({"text": "Bonjour, je n'arrive pas à télécharger ma facture en PDF."});
    let (check, certified_count) = tokenizer.check(&language, 16000, &input, &french).await;
    assert!(!check.failed(), "{check:?}");
    assert_eq!(
        seen["count"],
        json!({"input_tokens": certified_count.unwrap(), "tokenizer": "tiktoken:o200k_base", "provider": "fake-a"}),
        "{seen}"
    );

    let raw = &seen["raw_stream"];
    let types: Vec<&str> = raw["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let deltas = types
        .iter()
        .filter(|t| **t == "content_block_delta")
        .count();
    assert!(deltas >= 1, "{seen}");
    // The SDK passes every event but `ping` on.
    let mut expected = vec!["message_start", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(types, expected, "{seen}");
    assert_eq!(parsed(&raw["text"]), json!({"language": "german"}));
    // On the wire (another owner: acme's rate is spent below), that
    // stream: each event named, a `ping` second.
    let body = json!({"model": "language", "max_tokens": language.limits.max_output_tokens, "system": german.system,
        "messages": [{"role": "user", "content": german.user}], "stream": true});
    let wire = reqwest::Client::new()
        .post(format!("{}/v1/messages", router.base))
        .header("x-api-key", GLOBEX)
        .header("anthropic-version", "2023-06-01")
        .header("Idempotency-Key", "msg-3")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(wire.status(), 200);
    assert_eq!(wire.headers()["content-type"], "text/event-stream");
    let text = wire.text().await.unwrap();
    let named: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(&named[..2], ["message_start", "ping"], "{text}");
    assert_eq!(named.last(), Some(&"message_stop"), "{text}");
    // A `system` sent as null is neither text nor blocks: refused by name,
    // as the document says (omitted, it is no system prompt).
    let null_system = reqwest::Client::new()
        .post(format!("{}/v1/messages/count_tokens", router.base))
        .header("x-api-key", GLOBEX)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "language", "system": null, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(null_system.status(), 400);
    let refused: Value = null_system.json().await.unwrap();
    assert_eq!(
        refused["error"]["type"], "invalid_request_error",
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("system"),
        "{refused}"
    );
    assert_eq!(raw["stop"], json!(["end_turn"]));
    let helper = &seen["helper_stream"];
    assert_eq!(parsed(&helper["text"]), json!({"language": "french"}));
    assert_eq!(helper["final"], helper["text"]);
    assert_eq!(helper["stop"], "end_turn");

    let error = |name: &str, class: &str, status: u64, kind: &str| {
        let e = &seen[name];
        assert_eq!(e["class"], class, "{name}: {seen}");
        assert_eq!(e["status"], status, "{name}: {seen}");
        assert_eq!(e["type"], kind, "{name}: {seen}");
        e["message"].as_str().unwrap().to_owned()
    };
    error("conflict", "ConflictError", 409, "invalid_request_error");
    let untokenized = error(
        "count_untokenized",
        "BadRequestError",
        400,
        "invalid_request_error",
    );
    assert!(
        untokenized.contains("`fake-c`") && untokenized.contains("no tokenizer"),
        "{untokenized}"
    );
    let uncounted = error(
        "count_refused",
        "BadRequestError",
        400,
        "invalid_request_error",
    );
    assert!(uncounted.starts_with("max_tokens: "), "{uncounted}");
    let refused = error("refused", "BadRequestError", 400, "invalid_request_error");
    assert!(refused.starts_with("top_k: "), "named first: {refused}");
    let few = error(
        "too_few_tokens",
        "BadRequestError",
        400,
        "invalid_request_error",
    );
    assert!(few.starts_with("max_tokens: "), "{few}");
    let unpinned = error(
        "not_pinned",
        "BadRequestError",
        400,
        "invalid_request_error",
    );
    assert!(unpinned.starts_with("messages: "), "{unpinned}");
    error("unknown_model", "NotFoundError", 404, "not_found_error");
    error(
        "unauthorized",
        "AuthenticationError",
        401,
        "authentication_error",
    );
    error("overloaded", "OverloadedError", 529, "overloaded_error");
    error("rate_limited", "RateLimitError", 429, "rate_limit_error");
    assert!(
        seen["conflict"]["request_id"].as_str().is_some(),
        "an error carries request-id too: {seen}"
    );
    assert_eq!(seen["no_version"]["status"], 400, "{seen}");
    assert_eq!(
        seen["no_version"]["body"]["error"]["message"], "anthropic-version: header is required",
        "{seen}"
    );
    // msg-1 (once, then replayed), msg-2, msg-3, msg-4, globex's msg-3:
    // the refusals called nobody.
    assert_eq!(fake.calls(), 5, "one provider call per intent: {seen}");
    // The owner's rate is spent: the store says what the job is.
    let job = router
        .state
        .inner
        .store
        .job(
            &surety_store::OwnerId("acme".to_owned()),
            &surety_store::JobId(job_of(id)),
        )
        .await
        .unwrap();
    assert_eq!(job.kind, surety_store::JobKind::Messages, "{job:?}");
}

/// The job a `msg_` id names.
fn job_of(message_id: &str) -> String {
    let hex = message_id.strip_prefix("msg_").unwrap();
    uuid::Uuid::try_parse(hex).unwrap().hyphenated().to_string()
}

const TOOL_CLIENT: &str = r#"
import json, os
import anthropic

client = anthropic.Anthropic(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=2)
messages = json.loads(os.environ["MESSAGES"])
# Anthropic's tools: the contract's certified ones, in Anthropic's words.
tools = [{"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
         for t in json.loads(os.environ["TOOLS"])]
key = lambda k: {"Idempotency-Key": k}
ask = lambda **kw: client.messages.create(model="support", max_tokens=int(os.environ["MAX_TOKENS"]), system=messages[0]["content"],
    messages=[{"role": "user", "content": messages[1]["content"]}], tools=tools, tool_choice={"type": "any"}, **kw)
seen = {}
used = ask(extra_headers=key("refund-msg-1"))
block = used.content[0]
seen["use"] = {"type": block.type, "name": block.name, "input": block.input, "id": block.id, "blocks": len(used.content), "stop": used.stop_reason}
seen["replay_id"] = ask(extra_headers=key("refund-msg-1")).content[0].id
with client.messages.stream(model="support", max_tokens=int(os.environ["MAX_TOKENS"]), system=messages[0]["content"],
        messages=[{"role": "user", "content": messages[1]["content"]}], tools=tools, extra_headers=key("refund-msg-2")) as stream:
    partial = "".join(e.delta.partial_json for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    final = stream.get_final_message()
seen["stream"] = {"partial": json.loads(partial), "input": final.content[0].input, "name": final.content[0].name}
try:
    client.messages.create(model="support", max_tokens=int(os.environ["MAX_TOKENS"]), system=messages[0]["content"],
        messages=[{"role": "user", "content": messages[1]["content"]}], tools=[dict(tools[0], description="Refund anything.")] + tools[1:],
        extra_headers=key("refund-msg-3"))
except anthropic.BadRequestError as e:
    seen["other_tool"] = e.body["error"]["message"]
print(json.dumps(seen))
"#;

pub async fn the_anthropic_sdk_gets_a_certified_tool_use_once(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    let router = crate::tools::support_router(db, &[("claude", "anthropic", &fake)]).await;
    let max_tokens = contract("support-action")
        .limits
        .max_output_tokens
        .to_string();
    let messages = crate::tools::case_messages("damaged-teapot").to_string();
    let tools = crate::tools::openai_tools().to_string();
    let env = [
        ("BASE_URL", router.base.as_str()),
        ("API_KEY", ACME),
        ("MESSAGES", messages.as_str()),
        ("TOOLS", tools.as_str()),
        ("MAX_TOKENS", max_tokens.as_str()),
    ];
    let seen = run_client(&python, TOOL_CLIENT, &env).await;
    let refund = crate::tools::teapot_refund();
    let used = &seen["use"];
    assert_eq!(used["type"], "tool_use", "{seen}");
    assert_eq!(used["name"], "refund", "{seen}");
    assert_eq!(used["input"], refund, "{seen}");
    assert_eq!(used["blocks"], 1, "{seen}");
    assert_eq!(used["stop"], "tool_use", "{seen}");
    assert!(used["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(
        seen["replay_id"], used["id"],
        "a replay names the same call"
    );
    assert_eq!(seen["stream"]["partial"], refund, "{seen}");
    assert_eq!(seen["stream"]["input"], refund, "{seen}");
    assert_eq!(seen["stream"]["name"], "refund", "{seen}");
    let other = seen["other_tool"].as_str().unwrap();
    assert!(other.starts_with("tools[0]: "), "{other}");
    assert_eq!(fake.calls(), 2, "one provider call per intent: {seen}");
}

/// `POST /v1/messages` as Anthropic's SDKs send it: `x-api-key`,
/// `anthropic-version`, the key, and `extra` headers.
async fn message(
    router: &Router,
    key: &str,
    body: &Value,
    extra: &[(&str, &str)],
) -> (reqwest::StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/messages", router.base))
        .header("x-api-key", ACME)
        .header("anthropic-version", "2023-06-01")
        .header("Idempotency-Key", key)
        .json(body);
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, response.json().await.unwrap())
}

/// The certified tools, as Anthropic's `tools`.
fn anthropic_tools() -> Value {
    crate::tools::openai_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({"name": f["name"], "description": f["description"], "input_schema": f["parameters"]})
        })
        .collect()
}

pub async fn a_message_whose_anthropic_primary_fails_is_answered_by_a_certified_openai_kind(
    db: &TestDb,
) {
    let claude = FakeProvider::start(Script::always(crate::tools::down()))
        .await
        .unwrap();
    let gpt = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    let router = crate::tools::support_router(
        db,
        &[("claude", "anthropic", &claude), ("gpt", "openai", &gpt)],
    )
    .await;
    let prompt = crate::tools::case_messages("damaged-teapot");
    let body = json!({
        "model": "support",
        "max_tokens": contract("support-action").limits.max_output_tokens,
        "system": prompt[0]["content"],
        "messages": [{"role": "user", "content": prompt[1]["content"]}],
        "tools": anthropic_tools(),
        "tool_choice": {"type": "any"},
    });
    let (status, _, answer) = message(&router, "teapot-across-kinds", &body, &[]).await;
    assert_eq!(status, 200, "{answer}");
    // In Anthropic's shape, whoever answered.
    assert_eq!(answer["type"], "message", "{answer}");
    assert_eq!(answer["stop_reason"], "tool_use", "{answer}");
    let used = &answer["content"][0];
    assert_eq!(used["type"], "tool_use", "{answer}");
    assert_eq!(used["name"], "refund", "{answer}");
    assert_eq!(used["input"], crate::tools::teapot_refund(), "{answer}");
    assert_eq!(answer["content"].as_array().unwrap().len(), 1, "{answer}");
    let id = job_of(answer["id"].as_str().unwrap());
    let (_, job) = router.get(ACME, &format!("/v1/jobs/{id}")).await;
    assert_eq!(providers_tried(&job), ["claude", "gpt"], "{job}");
    assert_eq!(job["attempts"][0]["state"], "failed", "{job}");
    assert_eq!(job["kind"], "messages", "{job}");
    // Each kind was asked for the certified call in its own words.
    let asked = claude.requests()[0].body.clone();
    assert_eq!(asked["tools"][0]["name"], "refund", "{asked}");
    assert_eq!(asked["tool_choice"]["type"], "any", "{asked}");
    let asked = gpt.requests()[0].body.clone();
    assert_eq!(asked["tools"][0]["function"]["name"], "refund", "{asked}");
    assert_eq!(asked["tool_choice"], "required", "{asked}");
    // Replayed: the same message, nobody called again.
    let calls = (claude.calls(), gpt.calls());
    let (status, headers, again) = message(&router, "teapot-across-kinds", &body, &[]).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again, answer);
    assert_eq!((claude.calls(), gpt.calls()), calls);
}

pub async fn an_agent_loops_three_turns_reach_the_serving_kind_in_its_own_words(db: &TestDb) {
    let claude = FakeProvider::start(Script::always(crate::tools::down()))
        .await
        .unwrap();
    let gpt = FakeProvider::start(language_script()).await.unwrap();
    let routes = "[routes.agent]\ncontract = \"language-detect\"\nproviders = [\"claude\", \"gpt\"]\nfacade = \"output-only\"\n";
    let router = crate::tools::certified_router(
        db,
        &[("claude", "anthropic", &claude), ("gpt", "openai", &gpt)],
        "language-detect",
        routes,
    )
    .await;
    let system = "You detect the language of customer messages. Answer with JSON.";
    let ask = "Which language is the message of customer 7 in?";
    let looked_up =
        json!({"type": "tool_use", "id": "toolu_1", "name": "lookup_customer", "input": {"id": 7}});
    let result = json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "{\"message\": \"Hello, where is my parcel?\"}"}]});
    let then = "And customer 8?";
    let looked_up_8 =
        json!({"type": "tool_use", "id": "toolu_2", "name": "lookup_customer", "input": {"id": 8}});
    let result_8 = json!({"type": "tool_result", "tool_use_id": "toolu_2", "content": "{\"message\": \"Hallo, wo ist mein Paket?\"}"});
    // Each turn's history, as the SDK sends it back, and as OpenAI's kind
    // must be sent it.
    let mut history = vec![json!({"role": "user", "content": ask})];
    let mut expected = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": ask}),
    ];
    for turn in 0..3 {
        match turn {
            0 => {}
            1 => {
                history.push(json!({"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should look the customer up.", "signature": "c2ln"},
                    looked_up,
                ]}));
                history.push(json!({"role": "user", "content": [result]}));
                expected.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "lookup_customer", "arguments": "{\"id\":7}"}},
                ]}));
                expected.push(json!({"role": "tool", "tool_call_id": "toolu_1", "content": "{\"message\": \"Hello, where is my parcel?\"}"}));
            }
            _ => {
                history.push(json!({"role": "assistant", "content": [
                    {"type": "text", "text": "{\"language\":\"english\"}"},
                ]}));
                history.push(json!({"role": "user", "content": then}));
                history.push(json!({"role": "assistant", "content": [looked_up_8]}));
                history.push(json!({"role": "user", "content": [result_8]}));
                expected
                    .push(json!({"role": "assistant", "content": "{\"language\":\"english\"}"}));
                expected.push(json!({"role": "user", "content": then}));
                expected.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "toolu_2", "type": "function", "function": {"name": "lookup_customer", "arguments": "{\"id\":8}"}},
                ]}));
                expected.push(json!({"role": "tool", "tool_call_id": "toolu_2", "content": "{\"message\": \"Hallo, wo ist mein Paket?\"}"}));
            }
        }
        let body = json!({"model": "agent", "max_tokens": contract("language-detect").limits.max_output_tokens,
            "system": system, "messages": history});
        let (status, _, answer) = message(&router, &format!("agent-turn-{turn}"), &body, &[]).await;
        assert_eq!(status, 200, "turn {turn}: {answer}");
        // Still checked against the contract, answered in Anthropic's shape.
        assert_eq!(answer["stop_reason"], "end_turn", "turn {turn}: {answer}");
        let text: Value =
            serde_json::from_str(answer["content"][0]["text"].as_str().unwrap()).unwrap();
        assert!(text["language"].is_string(), "turn {turn}: {answer}");
        // The serving kind got this turn's whole history in its own words.
        let sent = gpt.requests().last().unwrap().body.clone();
        assert_eq!(
            sent["messages"],
            Value::Array(expected.clone()),
            "turn {turn}: {sent}"
        );
        // The primary got it in Anthropic's, the turns unchanged but the
        // earlier turn's thinking, which is not context.
        let sent = claude.requests().last().unwrap().body.clone();
        assert_eq!(sent["system"], system, "turn {turn}: {sent}");
        let turns = sent["messages"].as_array().unwrap();
        assert_eq!(turns[0]["content"], ask, "turn {turn}: {sent}");
        if turn >= 1 {
            assert_eq!(
                turns[1]["content"],
                json!([looked_up]),
                "turn {turn}: {sent}"
            );
            assert_eq!(
                turns[2]["content"][0]["tool_use_id"], "toolu_1",
                "turn {turn}: {sent}"
            );
        }
        if turn == 2 {
            assert_eq!(
                turns.last().unwrap()["content"][0]["tool_use_id"],
                "toolu_2",
                "{sent}"
            );
        }
    }
    assert_eq!(gpt.calls(), 3, "one call per turn");
}

pub async fn a_cacheable_contracts_breakpoints_reach_anthropic_and_its_cache_usage_every_facade(
    db: &TestDb,
) {
    let claude = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    let router = crate::tools::support_router(db, &[("claude", "anthropic", &claude)]).await;
    let tools = crate::tools::openai_tools();
    let ephemeral = json!({"type": "ephemeral"});
    // Chat: the first request writes the cache (the system prompt and the
    // tools before it), as the provider said.
    let prompt = crate::tools::case_messages("damaged-teapot");
    let (status, _, chat) = router
        .send(
            "/v1/chat/completions",
            ACME,
            "cache-chat",
            &json!({"model": "support", "messages": prompt, "tools": tools, "tool_choice": "required"}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{chat}");
    let sent = claude.requests()[0].body.clone();
    assert_eq!(sent["system"][0]["cache_control"], ephemeral, "{sent}");
    assert_eq!(sent["system"][0]["text"], prompt[0]["content"], "{sent}");
    assert_eq!(
        sent["tools"].as_array().unwrap().last().unwrap()["cache_control"],
        ephemeral,
        "{sent}"
    );
    assert_eq!(
        chat["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{chat}"
    );
    let written = router
        .metric("surety_cache_write_tokens_total{provider=\"claude\"}")
        .await;
    assert!(written > 0.0, "{}", router.metrics().await);
    let id = chat["id"].as_str().unwrap().trim_start_matches("chatcmpl-");
    let (_, job) = router.get(ACME, &format!("/v1/jobs/{id}")).await;
    assert_eq!(
        job["usage"]["cache_write_tokens"].as_f64(),
        Some(written),
        "{job}"
    );
    assert_eq!(job["usage"]["cache_read_tokens"], 0, "{job}");
    // Messages: another case, the same prefix: read from the cache.
    let prompt = crate::tools::case_messages("charged-twice");
    let body = json!({
        "model": "support",
        "max_tokens": contract("support-action").limits.max_output_tokens,
        "system": [{"type": "text", "text": prompt[0]["content"], "cache_control": ephemeral}],
        "messages": [{"role": "user", "content": prompt[1]["content"]}],
        "tools": anthropic_tools(),
    });
    let (status, _, answer) = message(&router, "cache-message", &body, &[]).await;
    assert_eq!(status, 200, "{answer}");
    let usage = &answer["usage"];
    let read = usage["cache_read_input_tokens"].as_f64().unwrap();
    assert_eq!(
        read, written,
        "the prefix written is the prefix read: {answer}"
    );
    assert_eq!(usage["cache_creation_input_tokens"], 0, "{answer}");
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{answer}");
    assert_eq!(
        claude.requests()[1].body["system"],
        sent["system"],
        "the same prefix"
    );
    // Responses: read again, as `input_tokens_details.cached_tokens`.
    let prompt = crate::tools::case_messages("parcel-lost");
    let flat: Vec<Value> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            json!({"type": "function", "name": f["name"], "description": f["description"], "parameters": f["parameters"]})
        })
        .collect();
    let (status, _, response) = router
        .send(
            "/v1/responses",
            ACME,
            "cache-response",
            &json!({"model": "support", "instructions": prompt[0]["content"], "input": prompt[1]["content"], "tools": flat}),
            None,
        )
        .await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(
        response["usage"]["input_tokens_details"]["cached_tokens"].as_f64(),
        Some(written),
        "{response}"
    );
    assert_eq!(
        router
            .metric("surety_cache_read_tokens_total{provider=\"claude\"}")
            .await,
        2.0 * written,
        "{}",
        router.metrics().await
    );
    // The certification matrix shows the provider's cache use.
    let session = crate::operator::admin_session(&router).await;
    let (_, matrix) = crate::operator::page(&router, &session, "/ui/certification").await;
    let row = crate::operator::matrix_row(&matrix, "claude");
    assert!(
        row.contains(&format!("{} read, {written} written", 2.0 * written)),
        "{row}"
    );
    // A pinned route sends its contract's request: a client's breakpoint
    // elsewhere, or a beta, is refused by name, and nothing is called.
    let calls = claude.calls();
    let mut elsewhere = body.clone();
    elsewhere["messages"][0]["content"] =
        json!([{"type": "text", "text": prompt[1]["content"], "cache_control": ephemeral}]);
    let (status, _, refused) = message(&router, "cache-elsewhere", &elsewhere, &[]).await;
    assert_eq!(status, 400, "{refused}");
    let why = refused["error"]["message"].as_str().unwrap();
    assert!(
        why.starts_with("messages.cache_control: ")
            && why.contains("`[prompt] cache = [system, tools]`"),
        "{why}"
    );
    let (status, _, refused) = message(
        &router,
        "cache-beta",
        &body,
        &[("anthropic-beta", "extended-cache-ttl-2025-04-11")],
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("anthropic-beta: "),
        "{refused}"
    );
    assert_eq!(claude.calls(), calls);
}

pub async fn an_output_only_routes_client_caching_reaches_anthropic_as_sent_and_is_named_where_not(
    db: &TestDb,
) {
    let claude = FakeProvider::start(language_script()).await.unwrap();
    let gpt = FakeProvider::start(language_script()).await.unwrap();
    let routes = "[routes.agent]\ncontract = \"language-detect\"\nproviders = [\"claude\", \"gpt\"]\nfacade = \"output-only\"\n\
                  [routes.agent-gpt]\ncontract = \"language-detect\"\nproviders = [\"gpt\"]\nfacade = \"output-only\"\n";
    let router = crate::tools::certified_router(
        db,
        &[("claude", "anthropic", &claude), ("gpt", "openai", &gpt)],
        "language-detect",
        routes,
    )
    .await;
    let hour = json!({"type": "ephemeral", "ttl": "1h"});
    let ephemeral = json!({"type": "ephemeral"});
    let beta = "extended-cache-ttl-2025-04-11, token-efficient-tools-2025-02-19";
    let body = |route: &str| {
        json!({
            "model": route,
            "max_tokens": contract("language-detect").limits.max_output_tokens,
            "system": [{"type": "text", "text": "You detect the language of customer messages. Answer with JSON.", "cache_control": hour}],
            "messages": [
                {"role": "user", "content": "Which language is the message of customer 7 in?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup_customer", "input": {"id": 7}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "{\"message\": \"Hello, where is my parcel?\"}", "cache_control": ephemeral},
                    {"type": "text", "text": "Answer now.", "cache_control": ephemeral},
                ]},
            ],
        })
    };
    let (status, headers, answer) = message(
        &router,
        "client-cache-1",
        &body("agent"),
        &[("anthropic-beta", beta)],
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert!(headers.get("surety-not-sent").is_none(), "{headers:?}");
    // The Anthropic kind got the client's breakpoints where it put them,
    // and its betas as it sent them.
    let sent = &claude.requests()[0];
    assert_eq!(sent.headers["anthropic-beta"], beta, "{:?}", sent.headers);
    assert_eq!(
        sent.body["system"][0]["cache_control"], hour,
        "{}",
        sent.body
    );
    let turns = sent.body["messages"].as_array().unwrap();
    assert_eq!(
        turns[2]["content"][0]["type"], "tool_result",
        "{}",
        sent.body
    );
    assert_eq!(
        turns[2]["content"][0]["cache_control"], ephemeral,
        "{}",
        sent.body
    );
    assert_eq!(
        turns[3]["content"][0]["text"], "Answer now.",
        "{}",
        sent.body
    );
    assert_eq!(
        turns[3]["content"][0]["cache_control"], ephemeral,
        "{}",
        sent.body
    );
    assert!(
        sent.raw
            .contains(r#""cache_control":{"ttl":"1h","type":"ephemeral"}"#)
            && sent
                .raw
                .matches(r#""cache_control":{"type":"ephemeral"}"#)
                .count()
                == 2,
        "{}",
        sent.raw
    );
    // The fake's cache wrote the prefix up to the last breakpoint.
    assert!(
        answer["usage"]["cache_creation_input_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{answer}"
    );
    // Another kind is sent neither, and the answer names what was not sent
    // (on its replay too).
    for key in ["client-cache-2", "client-cache-2"] {
        let (status, headers, answer) = message(
            &router,
            key,
            &body("agent-gpt"),
            &[("anthropic-beta", beta)],
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            headers["surety-not-sent"], "cache_control, anthropic-beta",
            "{headers:?}"
        );
    }
    let sent = &gpt.requests()[0];
    assert!(!sent.raw.contains("cache_control"), "{}", sent.raw);
    assert!(
        !sent.headers.contains_key("anthropic-beta"),
        "{:?}",
        sent.headers
    );
    assert_eq!(gpt.calls(), 1, "the replay called nobody");
    // A breakpoint mid-turn cannot be kept where it stands: refused by name.
    let mut mid = body("agent");
    mid["messages"][0]["content"] = json!([
        {"type": "text", "text": "Which language", "cache_control": ephemeral},
        {"type": "text", "text": " is the message of customer 7 in?"},
    ]);
    let (status, _, refused) = message(&router, "client-cache-3", &mid, &[]).await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages[0].content[0].cache_control: "),
        "{refused}"
    );
}

/// Anthropic's TypeScript SDK, as node runs it: the SDK from the suite's
/// `node_modules` (`cargo xtask test` installs it), and the script's
/// printed JSON.
async fn run_node(script: &str, env: &[(&str, &str)]) -> Option<Value> {
    let node = surety_tests::require("SURETY_NODE", "node")?;
    let modules = surety_tests::require("SURETY_NODE_CLIENTS", "the suite's node clients")?;
    let output = tokio::process::Command::new(node)
        .args(["-e", script])
        .env("NODE_PATH", modules)
        .envs(env.iter().copied())
        .output()
        .await;
    Some(serde_json::from_str(&surety_tests::printed(output, "the node client")).unwrap())
}

const NODE_CLIENT: &str = r#"
const { Anthropic, ConflictError, NotFoundError, OverloadedError } = require('@anthropic-ai/sdk');
const client = new Anthropic({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY, maxRetries: 2 });
const key = (k) => ({ headers: { 'Idempotency-Key': k } });
const maxTokens = Number(process.env.MAX_TOKENS);
const language = (text) => ({ model: 'language', max_tokens: maxTokens, system: process.env.SYSTEM_PROMPT,
  messages: [{ role: 'user', content: text }] });
const messages = JSON.parse(process.env.MESSAGES);
const tools = JSON.parse(process.env.TOOLS);
const support = { model: 'support', max_tokens: Number(process.env.SUPPORT_MAX_TOKENS), system: messages[0].content,
  messages: [{ role: 'user', content: messages[1].content }], tools, tool_choice: { type: 'any' } };
const caught = async (call) => {
  try { await call(); } catch (e) {
    return { class: e.constructor.name, conflict: e instanceof ConflictError, notFound: e instanceof NotFoundError,
      overloaded: e instanceof OverloadedError, status: e.status, type: e.error?.error?.type, requestID: e.requestID };
  }
  return null;
};
(async () => {
  const seen = {};
  const first = await client.messages.create(language(process.env.USER_FRENCH), key('ts-1'));
  const { data: again, response } = await client.messages.create(language(process.env.USER_FRENCH), key('ts-1')).withResponse();
  seen.first = first;
  seen.again = { id: again.id, replayed: response.headers.get('idempotent-replayed'), requestID: again._request_id };
  const stream = client.messages.stream(language(process.env.USER_GERMAN), key('ts-2'));
  const pieces = [];
  stream.on('text', (delta) => pieces.push(delta));
  const final = await stream.finalMessage();
  seen.stream = { pieces: pieces.length, text: pieces.join(''), final: final.content[0].text, stop: final.stop_reason, id: final.id };
  const used = await client.messages.create(support, key('ts-refund-1'));
  seen.tool = { type: used.content[0].type, name: used.content[0].name, input: used.content[0].input, id: used.content[0].id, stop: used.stop_reason };
  seen.toolReplay = (await client.messages.create(support, key('ts-refund-1'))).content[0].id;
  const partial = [];
  const toolStream = client.messages.stream(support, key('ts-refund-2'));
  toolStream.on('inputJson', (delta) => partial.push(delta));
  const toolFinal = await toolStream.finalMessage();
  seen.toolStream = { partial: JSON.parse(partial.join('')), input: toolFinal.content[0].input, name: toolFinal.content[0].name };
  seen.count = (await client.messages.countTokens({ model: 'language', system: process.env.SYSTEM_PROMPT,
    messages: [{ role: 'user', content: process.env.USER_FRENCH }] })).input_tokens;
  seen.models = [];
  for await (const model of client.models.list()) seen.models.push(model.id);
  seen.conflict = await caught(() => client.messages.create(language(process.env.USER_GERMAN), key('ts-1')));
  seen.notFound = await caught(() => client.messages.create({ ...language('hi'), model: 'no-such-route' }, key('ts-3')));
  seen.overloaded = await caught(() => client.messages.create({ ...language(process.env.USER_FRENCH), model: 'uncertified' },
    { ...key('ts-4'), maxRetries: 0 }));
  console.log(JSON.stringify(seen));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

pub async fn the_anthropic_typescript_sdk_gets_its_message_once(db: &TestDb) {
    let language = FakeProvider::start(language_script()).await.unwrap();
    let claude = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    // language-detect at fake-a (and uncertified at fake-b), support-action at claude.
    let tokenized = format!(
        "{}tokenizer = \"tiktoken:o200k_base\"\n",
        provider_toml("fake-a", &language)
    );
    let claude_toml = format!(
        "[providers.claude]\nkind = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"claude\"\ncontext_window = 16000\n",
        claude.anthropic_base_url()
    );
    let providers = [tokenized, provider_toml("fake-b", &language), claude_toml].concat();
    let configs = ProvidersConfig::from_toml(&providers).unwrap().providers;
    let routes = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n\
                  [routes.uncertified]\ncontract = \"language-detect\"\nproviders = [\"fake-b\"]\n\
                  [routes.support]\ncontract = \"support-action\"\nproviders = [\"claude\"]\n";
    let router = Router::start_with(
        db,
        &providers,
        routes,
        &manifest_of(&[
            (&configs["fake-a"], "language-detect"),
            (&configs["claude"], "support-action"),
        ]),
        "",
    )
    .await;
    let detect = contract("language-detect");
    let render = |text: &str| detect.render(&json!({"text": text})).unwrap();
    let french = render("Bonjour, je n'arrive pas à télécharger ma facture en PDF.");
    let german = render("Guten Tag, meine Rechnung wurde zweimal abgebucht. Bitte um Erstattung.");
    let max_tokens = detect.limits.max_output_tokens.to_string();
    let support_max = contract("support-action")
        .limits
        .max_output_tokens
        .to_string();
    let messages = crate::tools::case_messages("damaged-teapot").to_string();
    let tools = anthropic_tools().to_string();
    let env = [
        ("BASE_URL", router.base.as_str()),
        ("API_KEY", ACME),
        ("SYSTEM_PROMPT", french.system.as_str()),
        ("USER_FRENCH", french.user.as_str()),
        ("USER_GERMAN", german.user.as_str()),
        ("MAX_TOKENS", max_tokens.as_str()),
        ("SUPPORT_MAX_TOKENS", support_max.as_str()),
        ("MESSAGES", messages.as_str()),
        ("TOOLS", tools.as_str()),
    ];
    let Some(seen) = run_node(NODE_CLIENT, &env).await else {
        return;
    };
    let parsed = |v: &Value| serde_json::from_str::<Value>(v.as_str().unwrap()).unwrap();
    let first = &seen["first"];
    let id = first["id"].as_str().unwrap();
    assert!(id.starts_with("msg_"), "{seen}");
    assert_eq!(first["type"], "message", "{seen}");
    assert_eq!(first["stop_reason"], "end_turn", "{seen}");
    assert_eq!(
        parsed(&first["content"][0]["text"]),
        json!({"language": "french"})
    );
    assert_eq!(
        seen["again"]["id"], id,
        "a replay is the same message: {seen}"
    );
    assert_eq!(seen["again"]["replayed"], "true", "{seen}");
    assert!(
        seen["again"]["requestID"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{seen}"
    );
    let stream = &seen["stream"];
    assert!(stream["pieces"].as_u64().unwrap() >= 1, "{seen}");
    assert_eq!(
        parsed(&stream["text"]),
        json!({"language": "german"}),
        "{seen}"
    );
    assert_eq!(stream["final"], stream["text"], "{seen}");
    assert_eq!(stream["stop"], "end_turn", "{seen}");
    // The certified refund, as JavaScript prints its numbers (`30`, not `30.0`).
    let mut refund = crate::tools::teapot_refund();
    refund["amount"] = json!(30);
    let tool = &seen["tool"];
    assert_eq!(tool["type"], "tool_use", "{seen}");
    assert_eq!(tool["name"], "refund", "{seen}");
    assert_eq!(tool["input"], refund, "{seen}");
    assert_eq!(tool["stop"], "tool_use", "{seen}");
    assert_eq!(
        seen["toolReplay"], tool["id"],
        "a replay names the same call: {seen}"
    );
    assert_eq!(seen["toolStream"]["partial"], refund, "{seen}");
    assert_eq!(seen["toolStream"]["input"], refund, "{seen}");
    assert!(seen["count"].as_u64().unwrap() > 0, "{seen}");
    assert_eq!(
        seen["models"],
        json!(["language", "support", "uncertified"]),
        "{seen}"
    );
    let error = |name: &str, class: &str, status: u64, kind: &str| {
        let e = &seen[name];
        assert_eq!(e["class"], class, "{name}: {seen}");
        assert_eq!(e["status"], status, "{name}: {seen}");
        assert_eq!(e["type"], kind, "{name}: {seen}");
        assert!(e["requestID"].as_str().is_some(), "{name}: {seen}");
    };
    error("conflict", "ConflictError", 409, "invalid_request_error");
    error("notFound", "NotFoundError", 404, "not_found_error");
    error("overloaded", "OverloadedError", 529, "overloaded_error");
    assert_eq!(seen["overloaded"]["overloaded"], true, "{seen}");
    // ts-1 (once, then replayed), ts-2; the refusals called nobody.
    assert_eq!(language.calls(), 2, "one provider call per intent: {seen}");
    // ts-refund-1 (once, then replayed), ts-refund-2.
    assert_eq!(claude.calls(), 2, "one provider call per intent: {seen}");
}

/// Anthropic's Python SDK with its idempotency hook switched on, as
/// docs/clients.md shows it.
const HOOKED: &str = r#"
import json, os
import anthropic

class SuretyAnthropic(anthropic.Anthropic):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._idempotency_header = "Idempotency-Key"

client = SuretyAnthropic(base_url=os.environ["BASE_URL"], api_key=os.environ["API_KEY"], max_retries=2)
ask = dict(model="language", max_tokens=int(os.environ["MAX_TOKENS"]), system=os.environ["SYSTEM_PROMPT"],
           messages=[{"role": "user", "content": os.environ["USER_FRENCH"]}])
seen = {}
# Two calls: two intents, as far as the SDK can tell.
seen["first"] = client.messages.create(**ask).id
seen["second"] = client.messages.create(**ask).id
# The next connection is dropped after the router answered it: the SDK retries on its own.
raw = client.messages.with_raw_response.create(**ask)
seen["retried"] = raw.parse().id
seen["retries_taken"] = raw.retries_taken
seen["replayed"] = raw.headers.get("idempotent-replayed")
print(json.dumps(seen))
"#;

pub async fn the_anthropic_sdks_idempotency_hook_makes_its_own_retries_one_job(db: &TestDb) {
    crate::sdk::hooked_retries_are_one_job(db, HOOKED).await;
}
