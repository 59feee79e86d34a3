//! `cargo xtask demo`: surety end to end on one machine.
//!
//! Certifies three providers for the `language-detect` contract — the real
//! Gemma 3 270M on llama-cpp-python's server (its URL in
//! `SURETY_LOCAL_PROVIDER_URL`), a well-behaved fake, and a fake that will
//! start failing — writes the manifest, starts the router on SQLite, and
//! walks through a double-click, a mismatched retry and a failover,
//! printing each answer. Everything it writes goes to `target/demo/`.

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

    step("1. Three providers for the language-detect contract");
    let contract = surety_contracts::Contract::load(&repo.join("contracts/language-detect"))?;
    let answers: Value = serde_json::from_str(&std::fs::read_to_string(
        repo.join("tests/data/fake-answers.json"),
    )?)?;
    let mut right = Script::default();
    for case in &contract.cases {
        let text = case.input["text"].as_str().unwrap_or_default().to_owned();
        right = right.rule(
            When::PromptContains(text),
            Behavior::Reply(answers["language-detect"][&case.name].to_string()),
        );
    }
    right = right.rule(
        When::PromptContains("Message:".into()),
        Behavior::Reply(json!({"language": "french"}).to_string()),
    );
    let steady = FakeProvider::start(right.clone()).await?;
    let fading = FakeProvider::start(right).await?;
    println!("  local-gemma  {local}  (Gemma 3 270M, llama-cpp-python)");
    println!(
        "  fading       {}  (a fake that answers well today)",
        fading.openai_base_url()
    );
    println!(
        "  steady       {}  (a fake that answers well)",
        steady.openai_base_url()
    );
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ndatabase = \"sqlite:{db}\"\nmanifest = \"{manifest}\"\ncontracts = \"{contracts}\"\n\
         [[api_keys]]\nowner = \"acme\"\nsha256 = \"{key}\"\n\
         [providers.local-gemma]\nkind = \"openai\"\nbase_url = \"{local}\"\nmodel = \"gemma-3-270m\"\nstructured_output = [\"json_object_schema\"]\n\
         tokenize_endpoint = true\ntokenizer = \"server\"\ncontext_window = 4096\n\
         [providers.fading]\nkind = \"openai\"\nbase_url = \"{fading}\"\nmodel = \"fading\"\ntokenizer = \"tiktoken:o200k_base\"\ncontext_window = 16000\n\
         [providers.steady]\nkind = \"openai\"\nbase_url = \"{steady}\"\nmodel = \"steady\"\ntokenizer = \"tiktoken:o200k_base\"\ncontext_window = 16000\n\
         [routes.language]\ncontract = \"language-detect\"\nproviders = [\"local-gemma\", \"fading\", \"steady\"]\n",
        db = dir.join("surety.db").display(),
        manifest = dir.join("manifest.json").display(),
        contracts = repo.join("contracts").display(),
        key = hex::encode(Sha256::digest(KEY.as_bytes())),
        fading = fading.openai_base_url(),
        steady = steady.openai_base_url(),
    );
    std::fs::write(dir.join("surety.toml"), &config)?;
    let config = RouterConfig::from_toml(&config)?;

    step("2. Certify each of them (cargo xtask certify does the same, with reports)");
    let now = time::OffsetDateTime::now_utc();
    let mut manifest = Manifest::new(now);
    for id in ["local-gemma", "fading", "steady"] {
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
        let results = certification.run(std::slice::from_ref(&contract)).await?;
        let served = provider.served_models().await.ok();
        for r in &results {
            let c = r.counts();
            let verdict = if r.certified { "CERTIFIED" } else { "FAILED" };
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
    let post = |key: &'static str, text: &'static str| {
        let client = client.clone();
        let base = base.clone();
        async move {
            let response = client
                .post(format!("{base}/v1/jobs"))
                .bearer_auth(KEY)
                .header("Idempotency-Key", key)
                .header("Prefer", "wait=20")
                .json(&json!({"route": "language", "input": {"text": text}}))
                .send()
                .await?;
            let replayed = response.headers().get("idempotent-replayed").is_some();
            let status = response.status().as_u16();
            Ok::<_, anyhow::Error>((status, replayed, response.json::<Value>().await?))
        }
    };

    step("4. A double-click: the same request twice, at once");
    let text = "Bonjour, je n'arrive pas à télécharger ma facture en PDF.";
    let before = fading.calls() + steady.calls();
    let (a, b) = tokio::join!(post("order-1042", text), post("order-1042", text));
    for (status, replayed, job) in [a?, b?] {
        println!(
            "  HTTP {status}{}  job {}  {}  result {}",
            if replayed {
                " (Idempotent-Replayed)"
            } else {
                ""
            },
            job["id"],
            job["state"],
            job["result"]
        );
    }
    println!(
        "  provider calls for the two clicks: {}",
        fading.calls() + steady.calls() - before
    );

    step("5. The same key with a different input");
    let (status, _, problem) = post("order-1042", "Guten Tag!").await?;
    println!(
        "  HTTP {status}  {}",
        serde_json::to_string_pretty(&problem)?
    );

    step("6. Failover: `fading` starts refusing every request");
    fading.set_script(Script::always(Behavior::Status {
        status: 503,
        body: json!({"error": {"message": "overloaded"}}),
        retry_after: None,
    }));
    let (status, _, job) = post(
        "order-1043",
        "Olá, a minha fatura está com o valor errado, podem verificar?",
    )
    .await?;
    println!(
        "  HTTP {status}  job {}  {}  result {}",
        job["id"], job["state"], job["result"]
    );
    for attempt in job["attempts"].as_array().into_iter().flatten() {
        println!(
            "    attempt {} at {:<8} {:<9} {}",
            attempt["ordinal"],
            attempt["provider"].as_str().unwrap_or(""),
            attempt["state"].as_str().unwrap_or(""),
            attempt["error"].as_str().map(truncate).unwrap_or_default()
        );
    }
    step("7. What the router routes by (GET /v1/providers)");
    let listing: Value = client
        .get(format!("{base}/v1/providers"))
        .bearer_auth(KEY)
        .send()
        .await?
        .json()
        .await?;
    for provider in listing["data"].as_array().into_iter().flatten() {
        let certification = &provider["certification"]["language-detect"];
        println!(
            "  {:<12} {:<18} {}",
            provider["id"].as_str().unwrap_or(""),
            certification["status"].as_str().unwrap_or(""),
            certification["reason"].as_str().unwrap_or("")
        );
    }
    println!("\nEverything is under {}.", dir.display());
    Ok(())
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
