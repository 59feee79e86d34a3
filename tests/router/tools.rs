//! A tool-call contract through the router (SPEC "Tool-call contracts"):
//! the facade answers with OpenAI's `tool_calls`; a definite failure fails
//! over to a certified provider of another kind that makes the same call;
//! a fallback that answers in text is never a success.

use reqwest::StatusCode;
use serde_json::{Value, json};
use surety_fake_provider::{Behavior, FakeProvider, Script};
use surety_tests::TestDb;

use crate::harness::{ACME, Router, contract, providers_tried};

/// A fake that answers every support-action case with its right call.
pub fn support_script() -> Script {
    let prose = Behavior::Reply("I will look into it.".to_owned());
    crate::harness::cases_script("support-action", "message", prose)
}

/// `[providers.<id>]` of `kind` at `fake`, and its configuration.
fn provider(
    id: &str,
    kind: &str,
    fake: &FakeProvider,
) -> (String, surety_providers::ProviderConfig) {
    let base_url = match kind {
        "openai" => fake.openai_base_url(),
        "anthropic" => fake.anthropic_base_url(),
        _ => fake.gemini_base_url(),
    };
    let toml = format!(
        "[providers.{id}]\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"{id}\"\ncontext_window = 16000\n"
    );
    let config = surety_providers::ProvidersConfig::from_toml(&toml)
        .unwrap()
        .providers[id]
        .clone();
    (toml, config)
}

/// A router with route `support` (support-action) to `providers` (id, kind,
/// fake), in order, each certified for it.
pub async fn support_router(db: &TestDb, providers: &[(&str, &str, &FakeProvider)]) -> Router {
    support_router_with(db, providers, "").await
}

/// As [`support_router`], with `extra` lines in the route's table.
pub async fn support_router_with(
    db: &TestDb,
    providers: &[(&str, &str, &FakeProvider)],
    extra: &str,
) -> Router {
    let ids: Vec<String> = providers
        .iter()
        .map(|(id, _, _)| format!("\"{id}\""))
        .collect();
    let routes = format!(
        "[routes.support]\ncontract = \"support-action\"\nproviders = [{}]\n{extra}",
        ids.join(", ")
    );
    certified_router(db, providers, "support-action", &routes).await
}

/// A router with `routes` and `providers` (id, kind, fake), each certified
/// for `contract`.
pub async fn certified_router(
    db: &TestDb,
    providers: &[(&str, &str, &FakeProvider)],
    contract_id: &str,
    routes: &str,
) -> Router {
    let now = time::OffsetDateTime::now_utc();
    let mut manifest = surety_manifest::Manifest::new(now);
    let mut tables = String::new();
    for (id, kind, fake) in providers {
        let (toml, config) = provider(id, kind, fake);
        tables.push_str(&toml);
        manifest.entries.push(surety_tests::certified_entry(
            &config,
            &contract(contract_id),
            now + time::Duration::days(1),
        ));
    }
    Router::start_with(db, &tables, routes, &manifest, "").await
}

/// The contract's rendered prompt for case `case`, as chat messages.
pub fn case_messages(case: &str) -> Value {
    let contract = contract("support-action");
    let case = contract.cases.iter().find(|c| c.name == case).unwrap();
    let rendered = contract.render(&case.input).unwrap();
    json!([
        {"role": "system", "content": rendered.system},
        {"role": "user", "content": rendered.user},
    ])
}

/// The certified tools, as OpenAI's `tools`.
pub fn openai_tools() -> Value {
    let contract = contract("support-action");
    let tools = contract.tool_calls.as_ref().unwrap();
    tools
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}})
        })
        .collect()
}

/// The refund the `damaged-teapot` case certifies.
pub fn teapot_refund() -> Value {
    json!({"order_id": "1042", "amount": 30.0, "currency": "EUR", "reason": "damaged"})
}

/// Runs an SDK client `script` of the `damaged-teapot` case against
/// `base`: its prompt as `MESSAGES`, the certified tools as `TOOLS`.
pub async fn run_teapot_client(python: &str, script: &str, base: &str) -> Value {
    let messages = case_messages("damaged-teapot").to_string();
    let tools = openai_tools().to_string();
    let env = [
        ("BASE_URL", base),
        ("API_KEY", ACME),
        ("MESSAGES", messages.as_str()),
        ("TOOLS", tools.as_str()),
    ];
    crate::sdk::run_client(python, script, &env).await
}

/// A provider that is down: every call a 500.
pub fn down() -> Behavior {
    Behavior::Status {
        status: 500,
        body: json!({"error": {"message": "the primary is down"}}),
        retry_after: None,
    }
}

async fn chat(router: &Router, key: &str, body: &Value) -> (StatusCode, Value) {
    let (status, _, answer) = router
        .send("/v1/chat/completions", ACME, key, body, None)
        .await;
    (status, answer)
}

pub async fn a_tool_call_fails_over_to_another_kind_that_makes_the_same_call(db: &TestDb) {
    let primary = FakeProvider::start(Script::always(down())).await.unwrap();
    let prose = FakeProvider::start(Script::always(Behavior::Reply(
        "I have refunded your 30 euros.".to_owned(),
    )))
    .await
    .unwrap();
    let anthropic = FakeProvider::start(support_script()).await.unwrap();
    let router = support_router(
        db,
        &[
            ("primary", "openai", &primary),
            ("prose", "gemini", &prose),
            ("claude", "anthropic", &anthropic),
        ],
    )
    .await;
    let body = json!({
        "model": "support",
        "messages": case_messages("damaged-teapot"),
        "tools": openai_tools(),
        "tool_choice": "required",
    });
    let (status, answer) = chat(&router, "refund-1042", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert!(choice["message"]["content"].is_null(), "{answer}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "refund");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, teapot_refund());
    // The job: the primary failed, the fallback that answered in text
    // failed (never a success), the other kind's same call won.
    let id = answer["id"]
        .as_str()
        .unwrap()
        .trim_start_matches("chatcmpl-");
    let (_, job) = router.get(ACME, &format!("/v1/jobs/{id}")).await;
    assert_eq!(
        providers_tried(&job),
        ["primary", "prose", "claude"],
        "{job}"
    );
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts[1]["state"], "failed");
    assert!(
        attempts[1]["error"]
            .as_str()
            .unwrap()
            .contains("answered in text, not a tool call: I have refunded"),
        "{job}"
    );
    assert_eq!(
        job["result"],
        json!({"tool": "refund", "arguments": arguments}),
        "the native API's canonical answer"
    );
    // Replayed: the same call, the same id, no provider called again.
    let calls = anthropic.calls();
    let (status, again) = chat(&router, "refund-1042", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        again["choices"][0]["message"]["tool_calls"][0]["id"],
        call["id"]
    );
    assert_eq!(anthropic.calls(), calls);
    // With only providers that answer in text, the job fails: never a success.
    let in_text = support_router(
        db,
        &[("primary", "openai", &primary), ("prose", "gemini", &prose)],
    )
    .await;
    let (status, failed) = chat(
        &in_text,
        "refund-prose",
        &json!({"model": "support", "messages": case_messages("charged-twice")}),
    )
    .await;
    assert_eq!(failed["error"]["code"], "provider_error", "{failed}");
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    // Tools that are not the certified ones are refused, naming the tool.
    let mut tools = openai_tools();
    tools[0]["function"]["parameters"]["properties"]["amount"]["type"] = json!("string");
    let (status, refused) = chat(
        &router,
        "refund-other-tools",
        &json!({"model": "support", "messages": case_messages("damaged-teapot"), "tools": tools}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["error"]["param"], "tools[0]", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the tool `refund` differs"),
        "{refused}"
    );
}

pub async fn an_agent_loops_tool_history_passes_through_an_output_only_route(db: &TestDb) {
    let openai = FakeProvider::start(Script::always(down())).await.unwrap();
    let anthropic = FakeProvider::start(Script::always(down())).await.unwrap();
    let gemini = FakeProvider::start(crate::harness::language_script())
        .await
        .unwrap();
    let routes = "[routes.agent]\ncontract = \"language-detect\"\nproviders = [\"gpt\", \"claude\", \"gem\"]\nfacade = \"output-only\"\n";
    let providers = [
        ("gpt", "openai", &openai),
        ("claude", "anthropic", &anthropic),
        ("gem", "gemini", &gemini),
    ];
    let router = certified_router(db, &providers, "language-detect", routes).await;
    // An agent loop: the model looked the customer up, the tool answered,
    // and the agent asks for the message's language.
    let messages = json!([
        {"role": "system", "content": "You detect the language of customer messages. Answer with JSON."},
        {"role": "user", "content": "Which language is the message of customer 7 in?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup_customer", "arguments": "{\"id\":7}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"message\": \"Hello, where is my parcel?\"}"},
    ]);
    let body = json!({"model": "agent", "messages": messages});
    let (status, answer) = chat(&router, "agent-loop-1", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    // The answer is still checked against the contract.
    let content: Value =
        serde_json::from_str(answer["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"language": "english"}));
    // Each kind was sent the history in its own words.
    let sent = openai.requests()[0].body.clone();
    assert_eq!(
        sent["messages"][2]["tool_calls"][0]["function"]["name"], "lookup_customer",
        "{sent}"
    );
    assert_eq!(sent["messages"][3]["role"], "tool");
    assert_eq!(sent["messages"][3]["tool_call_id"], "call_1");
    let sent = anthropic.requests()[0].body.clone();
    assert_eq!(
        sent["messages"][1]["content"][0],
        json!({"type": "tool_use", "id": "call_1", "name": "lookup_customer", "input": {"id": 7}}),
        "{sent}"
    );
    assert_eq!(sent["messages"][2]["content"][0]["type"], "tool_result");
    assert_eq!(sent["messages"][2]["content"][0]["tool_use_id"], "call_1");
    let sent = gemini.requests()[0].body.clone();
    assert_eq!(
        sent["contents"][1]["parts"][0],
        json!({"functionCall": {"name": "lookup_customer", "args": {"id": 7}}}),
        "{sent}"
    );
    assert_eq!(
        sent["contents"][2]["parts"][0]["functionResponse"],
        json!({"name": "lookup_customer", "response": {"message": "Hello, where is my parcel?"}})
    );
    // A tool result that answers no call is refused, naming it.
    let orphan = json!([
        {"role": "user", "content": "Hello"},
        {"role": "tool", "tool_call_id": "call_9", "content": "sent"},
    ]);
    let (status, refused) = chat(
        &router,
        "agent-loop-2",
        &json!({"model": "agent", "messages": orphan}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(
        refused["error"]["param"], "messages[1].tool_call_id",
        "{refused}"
    );
}

/// A route that serves a contract with rules on the job's input
/// output-only would fail every answer: it does not start, and says why.
#[tokio::test]
async fn an_output_only_route_of_a_contract_with_input_rules_is_refused() {
    let db = TestDb::new(surety_tests::Engine::Sqlite).await.unwrap();
    let fake = FakeProvider::replying("{}").await.unwrap();
    let route = "[routes.support]\ncontract = \"support-action\"\nproviders = [\"fake-a\"]\nfacade = \"output-only\"\n";
    let why = Router::refused(&db, &[("fake-a", &fake)], route).await;
    assert!(
        why.contains("routes.support.facade")
            && why.contains("a refund never exceeds the order's total"),
        "{why}"
    );
}
