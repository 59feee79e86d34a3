//! `cargo xtask demo`: surety end to end on one machine.
//!
//! Certifies the real Gemma 3 270M on llama-cpp-python's server (its URL
//! in `SURETY_LOCAL_PROVIDER_URL`) and four fakes — one that will start
//! failing, one right on its certification cases and wrong on real inputs,
//! a steady one, and one that makes support-action's tool calls — writes
//! the manifest, starts the router on SQLite, and walks through a
//! double-click, a mismatched retry, a demotion by live checks, a failover
//! that skips the demoted provider, and a certified tool call asked twice,
//! printing each answer and ending with what each step proved. Everything
//! it writes goes to `target/demo/`.

#![expect(
    clippy::print_stdout,
    reason = "a command-line program: its output is its interface"
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use surety_fake_provider::{Behavior, FakeProvider, Script, When};
use surety_harness::Certification;
use surety_manifest::Manifest;
use surety_providers::build_provider;
use surety_router::{AppState, RouterConfig};

const KEY: &str = "demo-key-acme";

#[tokio::main]
async fn main() -> Result<()> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()?;
    let dir = repo.join("target/demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let local = std::env::var("SURETY_LOCAL_PROVIDER_URL")
        .context("SURETY_LOCAL_PROVIDER_URL: run this through `cargo xtask demo`")?;

    step("1. Four providers for the language-detect contract, one for a tool-call contract");
    let contract = surety_contracts::Contract::load(&repo.join("contracts/language-detect"))?;
    let tools = surety_contracts::Contract::load(&repo.join("contracts/support-action"))?;
    let answers: Value = serde_json::from_str(&std::fs::read_to_string(
        repo.join("tests/data/fake-answers.json"),
    )?)?;
    // Every fake answers the certification cases right; what they say to
    // anything else is what tells them apart.
    let cases = |contract: &surety_contracts::Contract, field: &str, otherwise: Behavior| {
        let mut script = Script::always(otherwise);
        for case in &contract.cases {
            let text = case.input[field].as_str().unwrap_or_default().to_owned();
            script = script.rule(
                When::PromptContains(text),
                Behavior::Reply(answers[&contract.id][&case.name].to_string()),
            );
        }
        script
    };
    // The demo's real inputs, which no certification case holds, and the
    // right answers to them.
    const FRENCH: &str = "Bonjour, pouvez-vous m'envoyer une copie de ma dernière facture ?";
    const PORTUGUESE: &str = "Olá, gostaria de mudar o endereço de faturação da minha conta.";
    let right = |contract| {
        cases(
            contract,
            "text",
            Behavior::Reply(json!({"language": "english"}).to_string()),
        )
        .rule(
            When::PromptContains(FRENCH.into()),
            Behavior::Reply(json!({"language": "french"}).to_string()),
        )
        .rule(
            When::PromptContains(PORTUGUESE.into()),
            Behavior::Reply(json!({"language": "portuguese"}).to_string()),
        )
    };
    let steady = FakeProvider::start(right(&contract)).await?;
    let fading = FakeProvider::start(right(&contract)).await?;
    // Right on every case it is certified with, wrong on real inputs.
    let sly = FakeProvider::start(cases(
        &contract,
        "text",
        Behavior::Reply(json!({"language": "Französisch"}).to_string()),
    ))
    .await?;
    let mug = json!({"order_id": "5120", "amount": 12.0, "currency": "EUR", "reason": "damaged"});
    let helpdesk = FakeProvider::start(
        cases(
            &tools,
            "message",
            Behavior::Reply("I will look into it.".into()),
        )
        .rule(
            When::PromptContains("order 5120".into()),
            Behavior::Reply(json!({"tool": "refund", "arguments": mug}).to_string()),
        ),
    )
    .await?;
    println!("  local-gemma  {local}  (Gemma 3 270M, llama-cpp-python)");
    for (id, fake, what) in [
        ("fading", &fading, "a fake that answers well today"),
        (
            "sly",
            &sly,
            "a fake right on its certification cases, wrong on real inputs",
        ),
        ("steady", &steady, "a fake that answers well"),
        (
            "helpdesk",
            &helpdesk,
            "a fake that makes support-action's tool calls",
        ),
    ] {
        println!("  {id:<12} {}  ({what})", fake.openai_base_url());
    }
    let fake_toml = |id: &str, fake: &FakeProvider| {
        format!(
            "[providers.{id}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{id}\"\ntokenizer = \"tiktoken:o200k_base\"\ncontext_window = 16000\n",
            fake.openai_base_url()
        )
    };
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndatabase = \"sqlite:{db}\"\nmanifest = \"{manifest}\"\ncontracts = \"{contracts}\"\n\
         [[api_keys]]\nowner = \"acme\"\nsha256 = \"{key}\"\n\
         [providers.local-gemma]\nkind = \"openai\"\nbase_url = \"{local}\"\nmodel = \"gemma-3-270m\"\nstructured_output = [\"json_object_schema\"]\n\
         tokenize_endpoint = true\ntokenizer = \"server\"\ncontext_window = 4096\n\
         {fading}{sly}{steady}{helpdesk}\
         [routes.language]\ncontract = \"language-detect\"\nproviders = [\"fading\", \"sly\", \"steady\"]\n\
         [routes.language.shadow]\nsampling = 1.0\nhourly_budget = 100\n\
         [routes.local]\ncontract = \"language-detect\"\nproviders = [\"local-gemma\"]\n\
         [routes.support]\ncontract = \"support-action\"\nproviders = [\"helpdesk\"]\n",
        db = dir.join("surety.db").display(),
        manifest = dir.join("manifest.json").display(),
        contracts = repo.join("contracts").display(),
        key = hex::encode(Sha256::digest(KEY.as_bytes())),
        fading = fake_toml("fading", &fading),
        sly = fake_toml("sly", &sly),
        steady = fake_toml("steady", &steady),
        helpdesk = fake_toml("helpdesk", &helpdesk),
    );
    std::fs::write(dir.join("surety.toml"), &config)?;
    let config = RouterConfig::from_toml(&config)?;
    let mut proved = Proof::default();

    step("2. Certify each of them (cargo xtask certify does the same, with reports)");
    let now = time::OffsetDateTime::now_utc();
    let mut manifest = Manifest::new(now);
    let mut certified = std::collections::BTreeMap::new();
    for (id, contract) in [
        ("local-gemma", &contract),
        ("fading", &contract),
        ("sly", &contract),
        ("steady", &contract),
        ("helpdesk", &tools),
    ] {
        let provider_config = config.providers[id].clone();
        let provider = build_provider(&provider_config)?;
        let certification = Certification {
            provider: Arc::clone(&provider),
            config: provider_config.clone(),
            golden_root: dir.join("golden"),
            accept: true,
            retry: surety_harness::RetryBudget::default(),
            on_sample: Box::new(|_, _| {}),
        };
        let results = certification.run(std::slice::from_ref(contract)).await?;
        let served = provider.served_models().await.ok();
        for r in &results {
            let c = r.counts();
            let verdict = if r.certified { "CERTIFIED" } else { "FAILED" };
            certified.insert(id, r.certified);
            println!(
                "  {id:<12} {}: {verdict} ({} of {} cases stable, {} samples passed)",
                r.contract, c.stable_pass, c.cases, c.samples_passed
            );
            // What the model itself said, first case answered.
            if let Some((case, answer)) = r.cases.iter().find_map(|c| {
                c.samples
                    .iter()
                    .find_map(|s| s.output.as_ref())
                    .map(|answer| (&c.name, answer))
            }) {
                println!("      answered {case}: {}", truncate(&answer.to_string()));
            }
            for f in r.failures().iter().take(2) {
                println!(
                    "      e.g. {} sample {}: {}: {}",
                    f.case,
                    f.sample.map_or("-".to_owned(), |s| s.to_string()),
                    f.check,
                    truncate(&f.message)
                );
            }
        }
        let entries = results
            .iter()
            .map(|r| {
                surety_harness::entry(
                    &provider_config,
                    r,
                    served.clone(),
                    None,
                    now,
                    Duration::from_secs(86400),
                )
            })
            .collect();
        manifest.replace_provider(id, entries, now);
    }
    manifest.write(&dir.join("manifest.json"))?;
    println!("  manifest: {}", dir.join("manifest.json").display());
    proved.certify = ["fading", "sly", "steady", "helpdesk"]
        .iter()
        .all(|id| certified.get(id) == Some(&true));

    step("3. The router, on SQLite");
    let state = AppState::from_config(&config).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    #[expect(
        clippy::disallowed_methods,
        reason = "the router under the demo runs until the demo ends"
    )]
    tokio::spawn(surety_router::serve(
        listener,
        state,
        std::future::pending(),
    ));
    println!("  surety serve: {base}");
    let client = reqwest::Client::new();
    let post = |route: &'static str, key: &'static str, text: &'static str| {
        let client = client.clone();
        let base = base.clone();
        async move {
            let response = client
                .post(format!("{base}/v1/jobs"))
                .bearer_auth(KEY)
                .header("Idempotency-Key", key)
                .header("Prefer", "wait=20")
                .json(&json!({"route": route, "input": {"text": text}}))
                .send()
                .await?;
            let replayed = response.headers().get("idempotent-replayed").is_some();
            let status = response.status().as_u16();
            Ok::<_, anyhow::Error>((status, replayed, response.json::<Value>().await?))
        }
    };
    // What certification asked of them; what follows is the router's.
    let (sly_certified, steady_certified) = (sly.calls(), steady.calls());

    step("4. A double-click: the same request twice, at once");
    let text = FRENCH;
    let fading_before = fading.calls();
    let (a, b) = tokio::join!(
        post("language", "order-1042", text),
        post("language", "order-1042", text)
    );
    let (a, b) = (a?, b?);
    for (status, replayed, job) in [&a, &b] {
        println!(
            "  HTTP {status}{}  job {}  {}  result {}",
            if *replayed {
                " (Idempotent-Replayed)"
            } else {
                ""
            },
            job["id"],
            job["state"],
            job["result"]
        );
    }
    // The job's answer is then checked live (step 6) by the other two:
    // the job's own calls are fading's.
    let job_calls = fading.calls() - fading_before;
    println!("  provider calls for the two clicks: {job_calls}");
    proved.double_click = a.2["id"] == b.2["id"] && job_calls == 1;

    step("5. The same key with a different input");
    let (status, _, problem) = post("language", "order-1042", "Guten Tag!").await?;
    println!(
        "  HTTP {status}  {}",
        serde_json::to_string_pretty(&problem)?
    );
    proved.conflict = status == 409;

    step("6. Live checks: the answer was re-asked of the route's other providers");
    let demoted = wait_for_demotion(&client, &base, "sly").await?;
    println!(
        "  off the request path, the job's certified request went to sly ({} call) and steady ({} call)",
        sly.calls() - sly_certified,
        steady.calls() - steady_certified
    );
    match &demoted {
        Some(reason) => println!("  sly is demoted for language-detect: {reason}"),
        None => println!("  sly was not demoted within 30 s"),
    }
    proved.demoted = demoted.is_some();

    step("7. Failover: `fading` starts refusing every request");
    fading.set_script(Script::always(Behavior::Status {
        status: 503,
        body: json!({"error": {"message": "overloaded"}}),
        retry_after: None,
    }));
    let sly_before = sly.calls();
    let (status, _, job) = post("language", "order-1043", PORTUGUESE).await?;
    println!(
        "  HTTP {status}  job {}  {}  result {}",
        job["id"], job["state"], job["result"]
    );
    let mut tried = Vec::new();
    for attempt in job["attempts"].as_array().into_iter().flatten() {
        tried.push(attempt["provider"].as_str().unwrap_or("").to_owned());
        println!(
            "    attempt {} at {:<8} {:<9} {}",
            attempt["ordinal"],
            attempt["provider"].as_str().unwrap_or(""),
            attempt["state"].as_str().unwrap_or(""),
            attempt["error"].as_str().map(truncate).unwrap_or_default()
        );
    }
    println!(
        "  sly, certified but demoted, was not tried ({} calls to it for this job)",
        sly.calls() - sly_before
    );
    proved.failover =
        job["state"] == "succeeded" && tried == ["fading", "steady"] && sly.calls() == sly_before;

    step("8. A certified tool call, asked twice with one key");
    let mug_input = json!({"message": "The mug from order 5120 has a crack. I'd like my 12 euros back.",
        "order_id": "5120", "items": "Stoneware mug", "total": "12.00", "currency": "EUR",
        "status": "delivered", "customer": "Lea"});
    let rendered = tools.render(&mug_input)?;
    let offered: Vec<Value> = tools
        .tool_calls
        .as_ref()
        .map(|t| {
            t.tools
                .iter()
                .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
                .collect()
        })
        .unwrap_or_default();
    let body = json!({"model": "support", "tool_choice": "required", "tools": offered, "messages": [
        {"role": "system", "content": rendered.system}, {"role": "user", "content": rendered.user}]});
    let mut ids = Vec::new();
    let helpdesk_certified = helpdesk.calls();
    for click in 1..=2 {
        let response = client
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(KEY)
            .header("Idempotency-Key", "refund-5120")
            .json(&body)
            .send()
            .await?;
        let replayed = response.headers().get("idempotent-replayed").is_some();
        let status = response.status().as_u16();
        let answer: Value = response.json().await?;
        let call = &answer["choices"][0]["message"]["tool_calls"][0];
        println!(
            "  HTTP {status}{}  {}  {}({})",
            if replayed {
                " (Idempotent-Replayed)"
            } else {
                ""
            },
            call["id"].as_str().unwrap_or("no call"),
            call["function"]["name"].as_str().unwrap_or(""),
            call["function"]["arguments"].as_str().unwrap_or("")
        );
        ids.push((
            click,
            replayed,
            call["id"].clone(),
            call["function"]["arguments"].clone(),
        ));
    }
    let refunds = helpdesk.calls() - helpdesk_certified;
    println!("  calls to helpdesk for the two requests: {refunds} (the refund is made once)");
    let arguments: Option<Value> = ids[0].3.as_str().and_then(|a| serde_json::from_str(a).ok());
    proved.tool_call =
        refunds == 1 && ids[1].1 && ids[0].2 == ids[1].2 && arguments.as_ref() == Some(&mug);

    step("9. The real model through the router (route `local`)");
    let (status, _, job) =
        post("local", "local-1", "Hej! Jag vill avboka min beställning.").await?;
    match status {
        200 | 201 => println!("  HTTP {status}  Gemma answered {}", job["result"]),
        _ => println!(
            "  HTTP {status}  the router sends the real model nothing it did not certify: {}",
            job["detail"].as_str().unwrap_or_default()
        ),
    }

    step("10. What the router routes by (GET /v1/providers)");
    let listing = providers(&client, &base).await?;
    for provider in listing["data"].as_array().into_iter().flatten() {
        for (contract, certification) in provider["certification"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, c)| c["status"] != "missing")
        {
            println!(
                "  {:<12} {:<16} {:<18} {}",
                provider["id"].as_str().unwrap_or(""),
                contract,
                certification["status"].as_str().unwrap_or(""),
                certification["reason"]
                    .as_str()
                    .map(truncate)
                    .unwrap_or_default()
            );
        }
    }

    step("What each step proved");
    let all = proved.rows();
    for (step, what, held) in &all {
        println!(
            "  {:<4} {:<6} {what}",
            step,
            if *held { "yes" } else { "NO" }
        );
    }
    println!("\nEverything is under {}.", dir.display());
    if all.iter().any(|(_, _, held)| !held) {
        anyhow::bail!("a step did not show what it should");
    }
    Ok(())
}

/// What the demo's steps showed, each true only if it held.
#[derive(Default)]
struct Proof {
    certify: bool,
    double_click: bool,
    conflict: bool,
    demoted: bool,
    failover: bool,
    tool_call: bool,
}

impl Proof {
    fn rows(&self) -> [(&'static str, &'static str, bool); 6] {
        [
            (
                "2",
                "fading, sly, steady and helpdesk pass every certification case",
                self.certify,
            ),
            (
                "4",
                "two clicks at once: one job, one provider call",
                self.double_click,
            ),
            (
                "5",
                "the same key with another input: 409, nothing run",
                self.conflict,
            ),
            (
                "6",
                "sly, right on its cases, broke the contract on a real input and was demoted",
                self.demoted,
            ),
            (
                "7",
                "fading failed over to steady; demoted sly was never called",
                self.failover,
            ),
            (
                "8",
                "a certified tool call asked twice: one call, the same id and arguments",
                self.tool_call,
            ),
        ]
    }
}

/// `GET /v1/providers`, as the demo's key sees it.
async fn providers(client: &reqwest::Client, base: &str) -> Result<Value> {
    Ok(client
        .get(format!("{base}/v1/providers"))
        .bearer_auth(KEY)
        .send()
        .await?
        .json()
        .await?)
}

/// Waits (up to 30 s) until `provider` says `demoted` for language-detect
/// in `GET /v1/providers`, and returns its reason.
async fn wait_for_demotion(
    client: &reqwest::Client,
    base: &str,
    provider: &str,
) -> Result<Option<String>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        let listing = providers(client, base).await?;
        let certification = listing["data"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["id"] == provider)
            .map(|p| p["certification"]["language-detect"].clone())
            .unwrap_or_default();
        if certification["status"] == "demoted" {
            return Ok(Some(
                certification["reason"].as_str().unwrap_or("").to_owned(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(None)
}

fn step(title: &str) {
    println!("\n== {title}");
}

fn truncate(text: &str) -> String {
    let text = text.replace('\n', " ");
    match text.char_indices().nth(140) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text,
    }
}
