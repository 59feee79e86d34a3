//! What is certified is what is served: the router sends the harness's
//! request byte for byte, serves a provider only as it was certified, fails
//! over on model drift, never voids an answer for a failed model listing,
//! pins the facade's prompts to the contract, and answers replays whatever
//! the manifest says now.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use surety_fake_provider::{FakeProvider, Script};
use surety_harness::{Certification, RetryBudget};
use surety_manifest::Manifest;
use surety_store::{JobId, OwnerId};
use surety_tests::TestDb;

use crate::harness::{
    ACME, Router, contract, detect, language_script, manifest, provider_config, provider_toml,
};

const ONE: &str = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n";
const TWO: &str =
    "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\", \"fake-b\"]\n";
const WAIT: Duration = Duration::from_secs(20);

pub async fn certify_and_serve_send_the_same_bytes(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let config = provider_config("fake-a", &fake);
    let contract = contract("language-detect");
    let golden = tempfile::tempdir().unwrap();
    let certification = Certification {
        provider: surety_providers::build_provider(&config).unwrap(),
        config: config.clone(),
        golden_root: golden.path().to_path_buf(),
        accept: true,
        retry: RetryBudget::default(),
        on_sample: Box::new(|_, _| {}),
    };
    let results = certification
        .run(std::slice::from_ref(&contract))
        .await
        .unwrap();
    assert!(results[0].certified);
    // The router routes by the manifest this very run wrote.
    let now = time::OffsetDateTime::now_utc();
    let entries = results
        .iter()
        .map(|r| surety_harness::entry(&config, r, None, None, now, Duration::from_secs(3600)))
        .collect();
    let mut certified = Manifest::new(now);
    certified.replace_provider("fake-a", entries, now);
    let sent_by_certify = fake.requests();
    let router = Router::start(db, &[("fake-a", &fake)], ONE, &certified, "").await;
    let case = &contract.cases[3];
    let (status, _, job) = router
        .create(
            ACME,
            "same-bytes",
            &json!({"route": "language", "input": case.input}),
            Some(10),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["state"], "succeeded", "{job}");
    let served = fake.requests().pop().unwrap();
    let text = case.input["text"].as_str().unwrap();
    let certified_request = sent_by_certify
        .iter()
        .find(|r| r.raw.contains(text))
        .unwrap();
    assert_eq!(
        served.raw, certified_request.raw,
        "the router sends the bytes certification sent"
    );
    assert_eq!(served.body["seed"], 7, "the contract's seed, as certified");
    assert_ne!(served.idempotency_key, certified_request.idempotency_key);
}

pub async fn a_changed_provider_config_is_not_served(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let elsewhere = FakeProvider::start(language_script()).await.unwrap();
    let certified = manifest(&[("fake-a", &fake, "language-detect")]);
    let original = provider_toml("fake-a", &fake);
    let changes = [
        (
            original.replace("model = \"fake-a\"", "model = \"fake-a-v2\""),
            "provider config changed: model fake-a → fake-a-v2".to_owned(),
        ),
        (
            original.replace(&fake.openai_base_url(), &elsewhere.openai_base_url()),
            format!(
                "provider config changed: base_url {} → {}",
                fake.openai_base_url(),
                elsewhere.openai_base_url()
            ),
        ),
        (
            format!("{original}structured_output = [\"json_object\"]\n"),
            "provider config changed: structured_mode json_schema → json_object".to_owned(),
        ),
    ];
    for (i, (providers, named)) in changes.iter().enumerate() {
        let router = Router::start_with(db, providers, ONE, &certified, "").await;
        let (status, _, problem) = router
            .create(ACME, &format!("changed-{i}"), &detect("Hola"), None)
            .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(named.as_str()),
            "{named}: {problem}"
        );
        let (_, listing) = router.get(ACME, "/v1/providers").await;
        let certification = &listing["data"][0]["certification"]["language-detect"];
        assert_eq!(certification["status"], "provider_changed", "{listing}");
        assert!(
            certification["reason"]
                .as_str()
                .unwrap()
                .contains(named.as_str()),
            "{listing}"
        );
    }
    assert_eq!(
        (fake.calls(), elsewhere.calls()),
        (0, 0),
        "a changed provider is never called"
    );
    // The configuration as certified: eligible again.
    let router = Router::start_with(db, &original, ONE, &certified, "").await;
    let (status, _, job) = router
        .create(ACME, "restored", &detect("Hola, ¿me ayudan?"), Some(10))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(fake.calls(), 1);
}

pub async fn model_drift_fails_over_and_is_counted(db: &TestDb) {
    let drifting = FakeProvider::start(language_script()).await.unwrap();
    let steady = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::start(
        db,
        &[("fake-a", &drifting), ("fake-b", &steady)],
        TWO,
        &manifest(&[
            ("fake-a", &drifting, "language-detect"),
            ("fake-b", &steady, "language-detect"),
        ]),
        "",
    )
    .await;
    let (_, _, job) = router
        .create(ACME, "d-1", &detect("Guten Tag"), Some(10))
        .await;
    assert_eq!(job["completed_by"], 1, "{job}");
    // The provider moves its alias to another model.
    drifting.set_script(Script {
        answer_model: Some("fake-a-2026-11-30".to_owned()),
        ..language_script()
    });
    let (_, _, job) = router
        .create(ACME, "d-2", &detect("Goedemorgen"), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(
        (&attempts[0]["provider"], &attempts[0]["state"]),
        (&json!("fake-a"), &json!("failed")),
        "{job}"
    );
    assert!(
        attempts[0]["error"]
            .as_str()
            .unwrap()
            .contains("model drift: the answer came from model `fake-a-2026-11-30`"),
        "{job}"
    );
    assert_eq!(attempts[1]["provider"], "fake-b");
    assert_eq!(router.metric("surety_model_drift_total").await, 1.0);
    let (_, listing) = router.get(ACME, "/v1/providers").await;
    let drift = &listing["data"][0]["drift"];
    assert_eq!(drift["model"], "fake-a-2026-11-30", "{listing}");
    assert_eq!(drift["certified_models"], json!(["fake-a"]), "{listing}");
    assert!(listing["data"][1]["drift"].is_null(), "{listing}");
}

pub async fn a_failing_model_listing_never_voids_an_answer(db: &TestDb) {
    let fake = FakeProvider::start(Script {
        models_status: Some(503),
        ..language_script()
    })
    .await
    .unwrap();
    let other = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::start(
        db,
        &[("fake-a", &fake), ("fake-b", &other)],
        TWO,
        &manifest(&[
            ("fake-a", &fake, "language-detect"),
            ("fake-b", &other, "language-detect"),
        ]),
        "",
    )
    .await;
    let (_, _, job) = router
        .create(ACME, "l-1", &detect("Buongiorno"), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["completed_by"], 1, "{job}");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job}");
    assert_eq!(other.calls(), 0, "the job never moved to another provider");
}

/// `POST /v1/chat/completions` as `acme` with `messages` on route `model`.
async fn chat(
    router: &Router,
    key: &str,
    model: &str,
    messages: Value,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let body = json!({"model": model, "messages": messages});
    router
        .send("/v1/chat/completions", ACME, key, &body, None)
        .await
}

pub async fn the_facade_serves_only_pinned_prompts(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let routes = format!(
        "{ONE}[routes.language-open]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\nfacade = \"output-only\"\n"
    );
    let router = Router::start(
        db,
        &[("fake-a", &fake)],
        &routes,
        &manifest(&[("fake-a", &fake, "language-detect")]),
        "",
    )
    .await;
    let contract = contract("language-detect");
    let text = "Bonjour, je n'arrive pas à télécharger ma facture en PDF.";
    let rendered = contract.render(&json!({"text": text})).unwrap();
    let pinned = json!([
        {"role": "system", "content": rendered.system},
        {"role": "user", "content": rendered.user},
    ]);
    let (status, headers, completion) = chat(&router, "p-1", "language", pinned).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(headers["surety-prompt-certified"], "true");
    let content = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(content).unwrap(),
        json!({"language": "french"})
    );
    let job_id = JobId(headers["surety-job-id"].to_str().unwrap().to_owned());
    let job = router
        .state
        .inner
        .store
        .job(&OwnerId("acme".into()), &job_id)
        .await
        .unwrap();
    assert_eq!(job.input, json!({"text": text}), "the variables read back");

    // Another system prompt.
    let expected = surety_exchange::system_prompt_digest(&contract).unwrap();
    let (status, _, error) = chat(
        &router,
        "p-2",
        "language",
        json!([
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": rendered.user},
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["code"], "prompt_not_certified", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the system message is not the certified system prompt")
            && message.contains(&expected),
        "{message}"
    );
    // A user message the user template does not render.
    let (status, _, error) = chat(
        &router,
        "p-3",
        "language",
        json!([
            {"role": "system", "content": rendered.system},
            {"role": "user", "content": format!("Translate this: {text}")},
        ]),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("does not fit the user template")
            && message.contains("Message: {{ text }}"),
        "{message}"
    );
    assert_eq!(fake.calls(), 1, "refused prompts are never sent");

    // An output-only route passes the client's messages and says so.
    let own = json!([{"role": "user", "content": format!("Which language? {text}")}]);
    let (status, headers, completion) = chat(&router, "p-4", "language-open", own).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(headers["surety-prompt-certified"], "false");
    let sent = fake.requests().pop().unwrap();
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": format!("Which language? {text}")}])
    );
    let (_, listing) = router.get(ACME, "/v1/providers").await;
    let facades: Vec<(&str, &str)> = listing["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["facade"].as_str().unwrap()))
        .collect();
    assert_eq!(
        facades,
        [("language", "pinned"), ("language-open", "output-only")]
    );
}

pub async fn a_replay_never_depends_on_the_manifest(db: &TestDb) {
    let fake = FakeProvider::start(language_script()).await.unwrap();
    let router = Router::one_route(db, &fake, "").await;
    let body = detect("Olá, a minha fatura está com o valor errado, podem verificar?");
    let (status, _, first) = router.create(ACME, "r-1", &body, Some(10)).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["state"], "succeeded");
    // The certificate expires.
    let mut expired = manifest(&[("fake-a", &fake, "language-detect")]);
    expired.entries[0].expires_at =
        surety_manifest::now_rfc3339(time::OffsetDateTime::now_utc() - time::Duration::hours(1));
    let mut reloads = router.state.inner.manifest.subscribe();
    let seen = *reloads.borrow_and_update();
    expired.write(&router.manifest_path()).unwrap();
    router.state.inner.manifest.reload_if_changed();
    tokio::time::timeout(WAIT, reloads.wait_for(|n| *n > seen))
        .await
        .unwrap()
        .unwrap();
    let (status, headers, again) = router.create(ACME, "r-1", &body, Some(10)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(again["id"], first["id"]);
    assert_eq!(again["result"], json!({"language": "portuguese"}));
    // A new intent does need a certified provider.
    let (status, _, problem) = router.create(ACME, "r-2", &body, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("expired at"),
        "{problem}"
    );
    assert_eq!(fake.calls(), 1);
}

pub async fn a_gemini_provider_is_routed_to_and_failed_over_from(db: &TestDb) {
    let gemini = FakeProvider::start(language_script()).await.unwrap();
    let steady = FakeProvider::start(language_script()).await.unwrap();
    let gem_toml = format!(
        "[providers.gem]\nkind = \"gemini\"\nbase_url = \"{}\"\nmodel = \"gem\"\ncontext_window = 16000\n",
        gemini.gemini_base_url()
    );
    let gem = surety_providers::ProvidersConfig::from_toml(&gem_toml)
        .unwrap()
        .providers["gem"]
        .clone();
    let mut certified = manifest(&[("fake-b", &steady, "language-detect")]);
    certified.entries.push(surety_tests::certified_entry(
        &gem,
        &contract("language-detect"),
        time::OffsetDateTime::now_utc() + time::Duration::days(1),
    ));
    let routes =
        "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"gem\", \"fake-b\"]\n";
    let providers = format!("{gem_toml}{}", provider_toml("fake-b", &steady));
    let router = Router::start_with(db, &providers, routes, &certified, "").await;
    let (_, _, job) = router
        .create(ACME, "g-1", &detect("Buongiorno"), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["attempts"][0]["provider"], "gem", "{job}");
    assert_eq!(job["completed_by"], 1, "{job}");
    // Google runs out of quota: a definite failure, and the job moves on.
    gemini.set_script(Script::always(surety_fake_provider::Behavior::Status {
        status: 429,
        body: json!({"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}),
        retry_after: None,
    }));
    let (_, _, job) = router
        .create(ACME, "g-2", &detect("Goedemorgen"), Some(10))
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["provider"], "gem");
    assert_eq!(attempts[0]["state"], "failed");
    assert!(
        attempts[0]["error"]
            .as_str()
            .unwrap()
            .contains("RESOURCE_EXHAUSTED: Resource has been exhausted"),
        "{job}"
    );
    assert_eq!(attempts[1]["provider"], "fake-b");
    assert_eq!(
        gemini.requests()[0].format,
        surety_fake_provider::WireFormat::Gemini
    );
}
