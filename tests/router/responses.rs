//! The official OpenAI Python SDK's `client.responses`, unchanged, as a
//! client of the router's `/v1/responses`: plain and item input,
//! structured output, a certified function call, both streams, replay by
//! key, a conflict, a refused parameter; and a conversation by
//! `previous_response_id` that survives a failover to another kind.

use reqwest::StatusCode;
use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider};
use surety_tests::TestDb;

use crate::harness::{ACME, GLOBEX, Router, contract, language_script};
use crate::sdk::{run_client, sdk_python};

const CLIENT: &str = r#"
import json, os
import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=2)
system = os.environ["SYSTEM_PROMPT"]
key = lambda k: {"Idempotency-Key": k}
seen = {}

first = client.responses.create(model="language", instructions=system, input=os.environ["USER_FRENCH"], extra_headers=key("resp-1"))
again = client.responses.with_raw_response.create(model="language", instructions=system, input=os.environ["USER_FRENCH"], extra_headers=key("resp-1"))
second = again.parse()
seen["first"] = {"id": first.id, "status": first.status, "text": first.output_text, "model": first.model,
                 "object": first.object, "usage": first.usage.model_dump(), "type": first.output[0].type}
seen["second_id"] = second.id
seen["replayed"] = again.headers.get("idempotent-replayed")

items = [{"role": "user", "content": [{"type": "input_text", "text": os.environ["USER_GERMAN"]}]}]
seen["items"] = client.responses.create(model="language", instructions=system, input=items, extra_headers=key("resp-2")).output_text

schema = json.loads(os.environ["SCHEMA"])
structured = client.responses.create(model="language", instructions=system, input=os.environ["USER_FRENCH"],
    text={"format": {"type": "json_schema", "name": "language", "schema": schema, "strict": True}}, extra_headers=key("resp-3"))
seen["structured"] = structured.output_text

events = list(client.responses.create(model="language", instructions=system, input=os.environ["USER_GERMAN"], stream=True, extra_headers=key("resp-4")))
seen["raw_stream"] = {
    "types": [e.type for e in events],
    "sequence": [e.sequence_number for e in events],
    "text": "".join(e.delta for e in events if e.type == "response.output_text.delta"),
    "final": events[-1].response.output_text,
    "id": events[-1].response.id,
}

with client.responses.stream(model="language", instructions=system, input=os.environ["USER_FRENCH"], extra_headers=key("resp-5")) as stream:
    deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    final = stream.get_final_response()
seen["helper_stream"] = {"deltas": len(deltas), "text": "".join(deltas), "final": final.output_text, "status": final.status}

def error(call):
    try:
        call()
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "message": e.message, "param": getattr(e, "param", None), "code": getattr(e, "code", None)}
    return None
seen["conflict"] = error(lambda: client.responses.create(model="language", instructions=system, input=os.environ["USER_GERMAN"], extra_headers=key("resp-1")))
seen["refused"] = error(lambda: client.responses.create(model="language", instructions=system, input=os.environ["USER_FRENCH"], reasoning={"effort": "low"}, extra_headers=key("resp-6")))
seen["other_schema"] = error(lambda: client.responses.create(model="language", instructions=system, input=os.environ["USER_FRENCH"],
    text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}, extra_headers=key("resp-7")))
seen["not_pinned"] = error(lambda: client.responses.create(model="language", instructions="Say anything.", input=os.environ["USER_FRENCH"], extra_headers=key("resp-8")))
print(json.dumps(seen))
"#;

pub async fn the_official_sdks_responses_get_their_answer_once(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let mut env = language_env(&router);
    env.push(("SCHEMA", contract("language-detect").schema.to_string()));
    let seen = run_language_client(&python, CLIENT, &env).await;
    let parsed = |v: &Value| serde_json::from_str::<Value>(v.as_str().unwrap()).unwrap();
    let first = &seen["first"];
    assert!(first["id"].as_str().unwrap().starts_with("resp_"), "{seen}");
    assert_eq!(
        seen["second_id"], first["id"],
        "a replay is the same response"
    );
    assert_eq!(seen["replayed"], "true");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["object"], "response");
    assert_eq!(first["model"], "language");
    assert_eq!(first["type"], "message");
    assert_eq!(parsed(&first["text"]), json!({"language": "french"}));
    let usage = &first["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap(),
        "{seen}"
    );
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{seen}");
    assert_eq!(parsed(&seen["items"]), json!({"language": "german"}));
    assert_eq!(parsed(&seen["structured"]), json!({"language": "french"}));
    // The raw stream: every documented event, numbered from 0 in order.
    let raw = &seen["raw_stream"];
    let types: Vec<&str> = raw["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let deltas = types
        .iter()
        .filter(|t| **t == "response.output_text.delta")
        .count();
    assert!(deltas >= 1, "{seen}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(types, expected, "{seen}");
    let sequence: Vec<u64> = raw["sequence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(sequence, (0..types.len() as u64).collect::<Vec<_>>());
    assert_eq!(parsed(&raw["text"]), json!({"language": "german"}));
    assert_eq!(raw["final"], raw["text"]);
    // The SDK's stream helper accumulates the same.
    let helper = &seen["helper_stream"];
    assert_eq!(parsed(&helper["text"]), json!({"language": "french"}));
    assert_eq!(helper["final"], helper["text"], "{seen}");
    assert_eq!(helper["status"], "completed");
    // What is refused says why, and names the parameter.
    let conflict = &seen["conflict"];
    assert_eq!(conflict["status"], 409, "{seen}");
    assert_eq!(conflict["class"], "ConflictError", "{seen}");
    let refused = &seen["refused"];
    assert_eq!(refused["class"], "BadRequestError", "{seen}");
    assert_eq!(refused["param"], "reasoning", "{seen}");
    assert_eq!(
        seen["other_schema"]["param"], "text.format.schema",
        "{seen}"
    );
    assert_eq!(seen["not_pinned"]["code"], "prompt_not_certified", "{seen}");
    // resp-1 to resp-5: five intents, five provider calls; the refusals made none.
    assert_eq!(fake.calls(), 5, "one provider call per intent: {seen}");
}

const TOOL_CLIENT: &str = r#"
import json, os
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=2)
messages = json.loads(os.environ["MESSAGES"])
# The Responses API's flat function tools: the contract's certified ones.
tools = [{"type": "function", "strict": False, **t["function"]} for t in json.loads(os.environ["TOOLS"])]
key = lambda k: {"Idempotency-Key": k}
ask = lambda **kw: client.responses.create(model="support", instructions=messages[0]["content"], input=messages[1]["content"], tools=tools, **kw)
seen = {}
called = ask(extra_headers=key("refund-resp-1"))
call = called.output[0]
seen["call"] = {"type": call.type, "name": call.name, "arguments": json.loads(call.arguments), "call_id": call.call_id, "items": len(called.output)}
seen["replay_call_id"] = ask(extra_headers=key("refund-resp-1")).output[0].call_id
events = list(ask(stream=True, extra_headers=key("refund-resp-2")))
seen["stream"] = {
    "types": sorted(set(e.type for e in events)),
    "arguments": json.loads("".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")),
    "done": json.loads([e.arguments for e in events if e.type == "response.function_call_arguments.done"][0]),
    "name": [e.item.name for e in events if e.type == "response.output_item.done"][0],
}
print(json.dumps(seen))
"#;

pub async fn the_official_sdks_responses_get_a_certified_function_call_once(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    let router = crate::tools::support_router(db, &[("gpt", "openai", &fake)]).await;
    let seen = crate::tools::run_teapot_client(&python, TOOL_CLIENT, &router.base).await;
    let refund = crate::tools::teapot_refund();
    let call = &seen["call"];
    assert_eq!(call["type"], "function_call", "{seen}");
    assert_eq!(call["name"], "refund", "{seen}");
    assert_eq!(call["arguments"], refund, "{seen}");
    assert_eq!(call["items"], 1, "{seen}");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(
        seen["replay_call_id"], call["call_id"],
        "a replay names the same call"
    );
    let stream = &seen["stream"];
    assert_eq!(stream["arguments"], refund, "{seen}");
    assert_eq!(stream["done"], refund, "{seen}");
    assert_eq!(stream["name"], "refund", "{seen}");
    assert!(
        stream["types"]
            .as_array()
            .unwrap()
            .contains(&json!("response.function_call_arguments.delta")),
        "{seen}"
    );
    assert_eq!(fake.calls(), 2, "one provider call per intent: {seen}");
}

/// One turn of a conversation: `input`, continuing `PREVIOUS` when set.
const TURN: &str = r#"
import json, os
import openai
from openai import OpenAI

client = OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=0)
previous = os.environ.get("PREVIOUS") or None
store = os.environ.get("STORE") != "false"
try:
    raw = client.responses.with_raw_response.create(model="agent", instructions="Detect the language. Answer with JSON.",
        input=os.environ["INPUT"], previous_response_id=previous, store=store, extra_headers={"Idempotency-Key": os.environ["KEY"]})
    r = raw.parse()
    print(json.dumps({"id": r.id, "text": r.output_text, "previous": r.previous_response_id, "job": raw.headers.get("surety-job-id")}))
except openai.APIStatusError as e:
    print(json.dumps({"status": e.status_code, "code": getattr(e, "code", None), "param": getattr(e, "param", None), "message": e.message}))
"#;

pub async fn a_conversation_by_previous_response_id_survives_a_failover_to_another_kind(
    db: &TestDb,
) {
    let Some(python) = sdk_python() else { return };
    let gpt = FakeProvider::start(language_script()).await.unwrap();
    let claude = FakeProvider::start(language_script()).await.unwrap();
    let routes = "[routes.agent]\ncontract = \"language-detect\"\nproviders = [\"gpt\", \"claude\"]\nfacade = \"output-only\"\n";
    let router = crate::tools::certified_router(
        db,
        &[("gpt", "openai", &gpt), ("claude", "anthropic", &claude)],
        "language-detect",
        routes,
    )
    .await;
    let turn_storing =
        async |key: &str, api_key: &str, input: &str, previous: &str, store: &str| {
            let env = [
                ("BASE_URL", router.base.as_str()),
                ("API_KEY", api_key),
                ("KEY", key),
                ("INPUT", input),
                ("PREVIOUS", previous),
                ("STORE", store),
            ];
            run_client(&python, TURN, &env).await
        };
    let turn = async |key: &str, api_key: &str, input: &str, previous: &str| {
        turn_storing(key, api_key, input, previous, "true").await
    };
    let first_input = "Bonjour, je n'arrive pas à télécharger ma facture en PDF.";
    let one = turn("chat-turn-1", ACME, first_input, "").await;
    assert_eq!(
        serde_json::from_str::<Value>(one["text"].as_str().unwrap()).unwrap(),
        json!({"language": "french"}),
        "{one}"
    );
    assert_eq!((gpt.calls(), claude.calls()), (1, 0));
    // The primary fails before turn 2: the certified fallback, of another
    // kind, is sent the whole conversation surety kept.
    gpt.set_script(surety_fake_provider::Script::always(Behavior::Status {
        status: 500,
        body: json!({"error": {"message": "the primary is down"}}),
        retry_after: None,
    }));
    let second_input = "Guten Tag, meine Rechnung wurde zweimal abgebucht. Bitte um Erstattung.";
    let id_one = one["id"].as_str().unwrap();
    let two = turn("chat-turn-2", ACME, second_input, id_one).await;
    assert_eq!(two["previous"], one["id"], "{two}");
    assert_eq!(
        claude.calls(),
        1,
        "turn 2 was served by the fallback: {two}"
    );
    let sent = claude.requests()[0].body.clone();
    let turns = sent["messages"].as_array().unwrap();
    assert_eq!(
        turns.len(),
        3,
        "turn 1's input and output, then turn 2's: {sent}"
    );
    let said = |i: usize| turns[i].to_string();
    assert_eq!(turns[0]["role"], "user");
    assert!(said(0).contains("Bonjour, je n'arrive pas"), "{sent}");
    assert_eq!(turns[1]["role"], "assistant");
    assert!(said(1).contains(r#"{\"language\":\"french\"}"#), "{sent}");
    assert!(said(2).contains("Guten Tag"), "{sent}");
    assert!(sent.to_string().contains("Detect the language"), "{sent}");
    // Turn 3 continues turn 2, whose conversation holds turn 1 too.
    let id_two = two["id"].as_str().unwrap();
    let three = turn("chat-turn-3", ACME, "And in one word?", id_two).await;
    assert_eq!(three["previous"], two["id"], "{three}");
    let sent = claude.requests()[1].body.clone();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 5, "{sent}");
    // The chain is on record: each turn's job names the one it continues,
    // on the native API and as a link on the operator's job page.
    let job = |turn: &Value| turn["job"].as_str().unwrap().to_owned();
    let (status, on_record) = router.get(ACME, &format!("/v1/jobs/{}", job(&three))).await;
    assert_eq!(status, StatusCode::OK, "{on_record}");
    assert_eq!(on_record["kind"], "responses", "{on_record}");
    assert_eq!(on_record["response_id"], three["id"], "{on_record}");
    assert_eq!(on_record["continues"], job(&two).as_str(), "{on_record}");
    let (_, first) = router.get(ACME, &format!("/v1/jobs/{}", job(&one))).await;
    assert_eq!(
        first.get("continues"),
        None,
        "turn 1 continues nothing: {first}"
    );
    let session = crate::operator::admin_session(&router).await;
    let (_, page) =
        crate::operator::page(&router, &session, &format!("/ui/jobs/{}", job(&three))).await;
    assert!(
        page.contains(&format!(
            r#"<a id="continues" href="/ui/jobs/{}">"#,
            job(&two)
        )),
        "the job page links the turn it continues: {page}"
    );
    assert!(page.contains(three["id"].as_str().unwrap()), "{page}");
    let metrics = router.metrics().await;
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("surety_jobs_created_total{"))
        .filter(|l| l.contains(r#"kind="responses""#) && l.contains(r#"route="agent""#))
        .collect();
    assert_eq!(
        counted
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap())
            .collect::<Vec<_>>(),
        ["3"],
        "three Responses jobs counted on their route: {metrics}"
    );
    // Another owner's response is not found, and nothing is sent.
    let theirs = turn("globex-turn", GLOBEX, "Hallo", id_two).await;
    assert_eq!(theirs["status"], 404, "{theirs}");
    assert_eq!(theirs["param"], "previous_response_id", "{theirs}");
    let made_up = turn("made-up-turn", ACME, "Hallo", "resp_0000").await;
    assert_eq!(made_up["status"], 404, "{made_up}");
    assert_eq!(claude.calls(), 2);
    // A response created with `store: false` is answered, and cannot be continued.
    let unstored = turn_storing("unstored-turn", ACME, "Hallo", "", "false").await;
    let unstored_id = unstored["id"].as_str().unwrap();
    let after = turn("after-unstored", ACME, "Und?", unstored_id).await;
    assert_eq!(after["status"], 400, "{after}");
    assert_eq!(after["code"], "previous_response_not_stored", "{after}");
    assert_eq!(claude.calls(), 3, "the refused turn called nobody");
}

/// The Agents SDK, unchanged but for its client's base URL and key and
/// the run's Idempotency-Key: an agent whose tools are the contract's.
const AGENT: &str = r#"
import asyncio, json, os
from openai import AsyncOpenAI
from agents import Agent, FunctionTool, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

set_tracing_disabled(True)  # no network here to send traces to
messages = json.loads(os.environ["MESSAGES"])
ran = []

def certified(tool):
    async def invoke(ctx, arguments):
        ran.append({"name": tool["name"], "arguments": json.loads(arguments)})
        return "refund queued"
    return FunctionTool(name=tool["name"], description=tool["description"],
                        params_json_schema=tool["parameters"], on_invoke_tool=invoke, strict_json_schema=False)

client = AsyncOpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=2)
agent = Agent(
    name="support",
    instructions=messages[0]["content"],
    model=OpenAIResponsesModel(model="support", openai_client=client),
    model_settings=ModelSettings(extra_headers={"Idempotency-Key": "agent-refund-1042"}),
    tools=[certified(t["function"]) for t in json.loads(os.environ["TOOLS"])],
    tool_use_behavior="stop_on_first_tool",
)
result = asyncio.run(Runner.run(agent, messages[1]["content"]))
print(json.dumps({"final": result.final_output, "ran": ran}))
"#;

pub async fn an_agents_sdk_agent_runs_a_certified_tool_once_through_a_dropped_answer(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(crate::tools::support_script())
        .await
        .unwrap();
    let router = crate::tools::support_router(db, &[("gpt", "openai", &fake)]).await;
    // The model's first answer is dropped on the way back: the SDK retries.
    let proxy = crate::sdk::DroppingProxy::start(&router.base, 1).await;
    let seen = crate::tools::run_teapot_client(&python, AGENT, &proxy.url).await;
    let refund = crate::tools::teapot_refund();
    assert_eq!(
        seen["ran"],
        json!([{"name": "refund", "arguments": refund}]),
        "the tool ran once, with the certified arguments: {seen}"
    );
    assert_eq!(seen["final"], "refund queued", "the agent finished: {seen}");
    let keys = proxy.keys.lock().unwrap().clone();
    assert_eq!(
        keys,
        ["agent-refund-1042", "agent-refund-1042"],
        "the dropped answer was asked for again, under the same key"
    );
    assert_eq!(fake.calls(), 1, "one provider call for the one intent");
}

const BACKGROUND: &str = r#"
import json, os, urllib.request
import openai
from openai import OpenAI

base = os.environ["BASE_URL"]
client = OpenAI(base_url=base + "/v1", api_key=os.environ["API_KEY"], max_retries=0)
system = os.environ["SYSTEM_PROMPT"]
key = lambda k: {"Idempotency-Key": k}
ask = lambda text, k, **kw: client.responses.create(model="language", instructions=system, input=text, background=True, extra_headers=key(k), **kw)
seq = lambda events: [[e.type, e.sequence_number] for e in events]
def error(call):
    try:
        call()
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "code": getattr(e, "code", None), "message": e.message}
    return None
seen = {}

if os.environ["PART"] == "complete":
    created = ask(os.environ["USER_FRENCH"], "bg-1")
    seen["created"] = {"id": created.id, "status": created.status, "background": created.background}
    # A stream of the response ends as its job does: the wait, without polling.
    list(client.responses.retrieve(created.id, stream=True))
    done = client.responses.retrieve(created.id)
    seen["done"] = {"id": done.id, "status": done.status, "text": done.output_text, "background": done.background}
    # A background stream broken after three events, resumed after the last one seen.
    stream = ask(os.environ["USER_GERMAN"], "bg-2", stream=True)
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 3:
            break
    stream.close()
    resumed = list(client.responses.retrieve(first[0].response.id, stream=True, starting_after=first[-1].sequence_number))
    whole = list(client.responses.retrieve(first[0].response.id, stream=True))
    seen["resume"] = {
        "first": seq(first), "rest": seq(resumed), "whole": seq(whole),
        "text": "".join(e.delta for e in first + resumed if e.type == "response.output_text.delta"),
        "final": resumed[-1].response.output_text,
    }
    items = client.responses.input_items.list(created.id)
    seen["items"] = [i.model_dump() for i in items.data]
    seen["items_after_unknown"] = error(lambda: client.responses.input_items.list(created.id, after="msg_none"))
    # Without `stream`, `starting_after` changes nothing: the whole response.
    seen["whole_after"] = client.responses.retrieve(created.id, starting_after=2).output_text
    seen["cancel_completed"] = error(lambda: client.responses.cancel(created.id))
    seen["bad_query"] = error(lambda: client.responses.retrieve(created.id, extra_query={"verbose": "1"}))
    client.responses.delete(created.id)
    seen["after_delete"] = error(lambda: client.responses.retrieve(created.id))
    seen["delete_again"] = error(lambda: client.responses.delete(created.id))
    seen["replay_after_delete"] = ask(os.environ["USER_FRENCH"], "bg-1").id
else:
    created = ask(os.environ["USER_FRENCH"], "bg-hang")
    seen["created"] = created.status
    list(client.responses.retrieve(created.id, stream=True))
    now = client.responses.retrieve(created.id)
    seen["unknown"] = {"status": now.status, "reason": now.status_reason, "job_id": now.job_id}
    seen["cancel_in_flight"] = error(lambda: client.responses.cancel(created.id))
    # An admin resolves the unknown attempt: the job has none open, and waits.
    resolve = urllib.request.Request(f"{base}/v1/jobs/{now.job_id}/attempts/1/cancel", method="POST", headers={"Authorization": "Bearer " + os.environ["ADMIN_KEY"]})
    with urllib.request.urlopen(resolve) as resolved:
        seen["resolved"] = resolved.status
    queued = client.responses.retrieve(created.id)
    seen["queued"] = {"status": queued.status, "reason": queued.status_reason}
    seen["cancelled"] = client.responses.cancel(created.id).status
    seen["cancelled_again"] = client.responses.cancel(created.id).status
    seen["after"] = client.responses.retrieve(created.id).status
print(json.dumps(seen))
"#;

/// The environment of a client of the `language` route.
fn language_env(router: &Router) -> Vec<(&'static str, String)> {
    let language = contract("language-detect");
    let render = |text: &str| language.render(&json!({"text": text})).unwrap();
    let french = render("Bonjour, je n'arrive pas à télécharger ma facture en PDF.");
    let german = render("Guten Tag, meine Rechnung wurde zweimal abgebucht. Bitte um Erstattung.");
    vec![
        ("BASE_URL", router.base.clone()),
        ("API_KEY", ACME.to_owned()),
        ("ADMIN_KEY", crate::harness::ACME_ADMIN.to_owned()),
        ("SYSTEM_PROMPT", french.system),
        ("USER_FRENCH", french.user),
        ("USER_GERMAN", german.user),
    ]
}

async fn run_language_client(python: &str, script: &str, env: &[(&str, String)]) -> Value {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run_client(python, script, &env).await
}

async fn run_background(python: &str, router: &Router, part: &str) -> Value {
    let mut env = language_env(router);
    env.push(("PART", part.to_owned()));
    run_language_client(python, BACKGROUND, &env).await
}

pub async fn a_background_response_is_read_back_resumed_and_deleted_with_one_call(db: &TestDb) {
    let Some(python) = sdk_python() else { return };
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let seen = run_background(&python, &router, "complete").await;
    let created = &seen["created"];
    assert!(
        ["queued", "in_progress"].contains(&created["status"].as_str().unwrap()),
        "a background create answers at once: {seen}"
    );
    assert_eq!(created["background"], true);
    let done = &seen["done"];
    assert_eq!(done["id"], created["id"]);
    assert_eq!(done["status"], "completed", "{seen}");
    assert_eq!(done["background"], true);
    assert_eq!(
        serde_json::from_str::<Value>(done["text"].as_str().unwrap()).unwrap(),
        json!({"language": "french"})
    );
    // The resumed stream has exactly the events the broken one missed.
    let resume = &seen["resume"];
    let mut joined = resume["first"].as_array().unwrap().clone();
    assert_eq!(joined.len(), 3, "{seen}");
    joined.extend(resume["rest"].as_array().unwrap().iter().cloned());
    assert_eq!(Value::Array(joined), resume["whole"], "{seen}");
    assert_eq!(
        resume["whole"].as_array().unwrap().last().unwrap()[0],
        "response.completed"
    );
    assert_eq!(
        serde_json::from_str::<Value>(resume["text"].as_str().unwrap()).unwrap(),
        json!({"language": "german"})
    );
    assert_eq!(resume["final"], resume["text"]);
    // The input as sent: the one user message.
    assert_eq!(seen["items_after_unknown"]["status"], 404, "{seen}");
    assert_eq!(
        seen["items_after_unknown"]["code"], "input_item_not_found",
        "{seen}"
    );
    assert_eq!(seen["whole_after"], seen["done"]["text"], "{seen}");
    let items = seen["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{seen}");
    assert_eq!(items[0]["type"], "message");
    assert_eq!(items[0]["role"], "user");
    assert_eq!(items[0]["content"][0]["type"], "input_text");
    assert!(items[0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(seen["cancel_completed"]["status"], 409, "{seen}");
    assert_eq!(seen["bad_query"]["status"], 400, "{seen}");
    // Deleted: not found any more, while its key still names the job.
    assert_eq!(seen["after_delete"]["status"], 404, "{seen}");
    assert_eq!(seen["delete_again"]["status"], 404, "{seen}");
    assert_eq!(seen["replay_after_delete"], created["id"]);
    // Two intents, two provider calls, however often they were read.
    assert_eq!(fake.calls(), 2, "{seen}");
}

pub async fn an_unknown_background_response_stays_in_progress_until_resolved_then_cancels(
    db: &TestDb,
) {
    let Some(python) = sdk_python() else { return };
    let (fake, router) = Router::behaving(db, Behavior::Hang, "attempt_timeout_ms = 300\n").await;
    let seen = run_background(&python, &router, "hang").await;
    assert_eq!(seen["created"], "in_progress", "{seen}");
    // Unknown: neither failed nor completed, and the reason in words.
    let unknown = &seen["unknown"];
    assert_eq!(unknown["status"], "in_progress", "{seen}");
    let reason = unknown["reason"].as_str().unwrap();
    assert!(
        reason.contains("unknown") && reason.contains("may have done the work"),
        "{seen}"
    );
    // Never cancelled while the provider may be doing the work.
    let in_flight = &seen["cancel_in_flight"];
    assert_eq!(in_flight["status"], 409, "{seen}");
    assert_eq!(in_flight["code"], "response_in_flight", "{seen}");
    assert_eq!(seen["resolved"], 200, "{seen}");
    assert_eq!(seen["queued"]["status"], "queued", "{seen}");
    assert_eq!(seen["cancelled"], "cancelled", "{seen}");
    assert_eq!(seen["cancelled_again"], "cancelled");
    assert_eq!(seen["after"], "cancelled");
    // A cancelled job is over: a retry starts nothing.
    let job_id = unknown["job_id"].as_str().unwrap();
    let retried = router
        .client
        .post(format!("{}/v1/jobs/{job_id}/retry", router.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    assert!(retried.status().is_client_error(), "{}", retried.status());
    let (_, job) = router.get(ACME, &format!("/v1/jobs/{job_id}")).await;
    assert_eq!(job["state"], "cancelled", "{job}");
    assert_eq!(fake.calls(), 1, "{seen}");
}
