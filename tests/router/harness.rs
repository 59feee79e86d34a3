//! A router on 127.0.0.1:0 over a test database, with fake providers.

use std::path::{Path, PathBuf};

use futures_util::FutureExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use surety_contracts::Contract;
use surety_fake_provider::{Behavior, FakeProvider, Script, When};
use surety_manifest::{Entry, Manifest};
use surety_providers::{ProviderConfig, ProvidersConfig};
use surety_router::{AppState, RouterConfig};
use surety_tests::TestDb;
use time::OffsetDateTime;

pub const ACME: &str = "key-acme";
pub const ACME_ADMIN: &str = "key-acme-admin";
pub const GLOBEX: &str = "key-globex";
/// An admin whose operator pages show every owner's jobs.
pub const OPS: &str = "key-ops";

pub fn contracts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../contracts")
}

pub fn contract(id: &str) -> Contract {
    Contract::load(&contracts_dir().join(id)).unwrap()
}

/// A fake that answers every language-detect case right.
pub fn language_script() -> Script {
    language_script_else(Behavior::Reply(json!({"language": "english"}).to_string()))
}

/// A fake that answers every language-detect case right, and anything
/// else as `otherwise` does.
pub fn language_script_else(otherwise: Behavior) -> Script {
    cases_script("language-detect", "text", otherwise)
}

/// A fake that answers every case of `contract` with its right answer (the
/// case found by its input's `field` in the prompt), and anything else as
/// `otherwise` does.
pub fn cases_script(contract_id: &str, field: &str, otherwise: Behavior) -> Script {
    let answers: Value = serde_json::from_str(include_str!("../data/fake-answers.json")).unwrap();
    let contract = contract(contract_id);
    let mut script = Script::always(otherwise);
    for case in &contract.cases {
        let text = case.input[field].as_str().unwrap().to_owned();
        script = script.rule(
            When::PromptContains(text),
            Behavior::Reply(answers[contract_id][&case.name].to_string()),
        );
    }
    script
}

/// A fake that answers `{"language": language}` to everything, after `ms`.
pub async fn answering_after(language: &str, ms: u64) -> FakeProvider {
    let reply = Behavior::Reply(json!({ "language": language }).to_string());
    FakeProvider::start(Script::always(reply.clone()).rule_with_latency(
        When::Always,
        reply,
        surety_fake_provider::Latency::FixedMs(ms),
    ))
    .await
    .unwrap()
}

/// `[providers.<id>]` for a fake, as the test routers configure it.
pub fn provider_toml(id: &str, fake: &FakeProvider) -> String {
    format!(
        "[providers.{id}]\nkind = \"openai\"\nbase_url = \"{}\"\nmodel = \"{id}\"\ncontext_window = 16000\n",
        fake.openai_base_url()
    )
}

/// The configuration of provider `id` at `fake`, as the test routers have it.
pub fn provider_config(id: &str, fake: &FakeProvider) -> ProviderConfig {
    ProvidersConfig::from_toml(&provider_toml(id, fake))
        .unwrap()
        .providers[id]
        .clone()
}

/// A manifest certifying each `(provider at fake, contract)` for a day, bound
/// to the provider's configuration as the test routers have it.
pub fn manifest(certified: &[(&str, &FakeProvider, &str)]) -> Manifest {
    let configs: Vec<ProviderConfig> = certified
        .iter()
        .map(|(p, fake, _)| provider_config(p, fake))
        .collect();
    let pairs: Vec<(&ProviderConfig, &str)> = configs
        .iter()
        .zip(certified)
        .map(|(config, (_, _, c))| (config, *c))
        .collect();
    manifest_of(&pairs)
}

/// A manifest certifying each `(provider configuration, contract)` for a day.
pub fn manifest_of(certified: &[(&ProviderConfig, &str)]) -> Manifest {
    let now = OffsetDateTime::now_utc();
    let entries: Vec<Entry> = certified
        .iter()
        .map(|(config, c)| {
            surety_tests::certified_entry(config, &contract(c), now + time::Duration::days(1))
        })
        .collect();
    let mut manifest = Manifest::new(now);
    manifest.entries = entries;
    manifest
}

pub struct Router {
    pub base: String,
    pub state: AppState,
    /// The configuration it was started with.
    pub config: RouterConfig,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
    background: tokio::task::JoinHandle<()>,
}

impl Drop for Router {
    fn drop(&mut self) {
        self.server.abort();
        self.background.abort();
    }
}

fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

impl Router {
    /// `providers` are `(id, fake)`; `routes` is TOML for `[routes.*]`.
    pub async fn start(
        db: &TestDb,
        providers: &[(&str, &FakeProvider)],
        routes: &str,
        manifest: &Manifest,
        server: &str,
    ) -> Router {
        let providers: String = providers
            .iter()
            .map(|(id, fake)| provider_toml(id, fake))
            .collect();
        Router::start_with(db, &providers, routes, manifest, server).await
    }

    /// The configuration file of a test router: its database, its
    /// `manifest` file, the contracts, the test keys, `providers`, `routes`
    /// and `server` (more `[server]` lines).
    pub fn config_toml(
        db: &TestDb,
        providers: &str,
        routes: &str,
        manifest: &Path,
        server: &str,
    ) -> String {
        let mut toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndatabase = \"{}\"\nmanifest = \"{}\"\ncontracts = \"{}\"\n{server}\n\
             [[api_keys]]\nowner = \"acme\"\nname = \"acme-app\"\nsha256 = \"{}\"\n\
             [[api_keys]]\nowner = \"acme\"\nname = \"acme-admin\"\nsha256 = \"{}\"\nadmin = true\n\
             [[api_keys]]\nowner = \"globex\"\nsha256 = \"{}\"\n\
             [[api_keys]]\nowner = \"ops\"\nsha256 = \"{}\"\nadmin = true\nall_owners = true\n",
            db.url,
            manifest.display(),
            contracts_dir().display(),
            hash(ACME),
            hash(ACME_ADMIN),
            hash(GLOBEX),
            hash(OPS)
        );
        toml.push_str(providers);
        toml.push_str(routes);
        toml
    }

    /// Why a router with `providers` and `routes` does not start.
    pub async fn refused(db: &TestDb, providers: &[(&str, &FakeProvider)], routes: &str) -> String {
        let providers: String = providers
            .iter()
            .map(|(id, fake)| provider_toml(id, fake))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let toml = Router::config_toml(db, &providers, routes, &dir.path().join("m.json"), "");
        let config = RouterConfig::from_toml(&toml).unwrap();
        match AppState::from_config(&config).await {
            Ok(_) => panic!("the router started"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// As [`Router::start`], with the providers' TOML as given.
    pub async fn start_with(
        db: &TestDb,
        providers: &str,
        routes: &str,
        manifest: &Manifest,
        server: &str,
    ) -> Router {
        let dir = tempfile::tempdir().unwrap();
        let manifest_path = dir.path().join("manifest.json");
        manifest.write(&manifest_path).unwrap();
        let toml = Router::config_toml(db, providers, routes, &manifest_path, server);
        let config = RouterConfig::from_toml(&toml).unwrap();
        let state = AppState::from_config(&config).await.unwrap();
        let background = state.spawn_background();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(
            surety_router::serve(listener, state.clone(), std::future::pending()).map(|_| ()),
        );
        Router {
            base,
            state,
            config,
            client: reqwest::Client::new(),
            dir,
            server,
            background,
        }
    }

    /// A router with `routes`, its `providers` each certified for
    /// language-detect.
    pub async fn certifying(
        db: &TestDb,
        providers: &[(&str, &FakeProvider)],
        routes: &str,
    ) -> Router {
        let certified: Vec<(&str, &FakeProvider, &str)> = providers
            .iter()
            .map(|(id, fake)| (*id, *fake, "language-detect"))
            .collect();
        Router::start(db, providers, routes, &manifest(&certified), "").await
    }

    /// A router with one route, `language`, to `fake`, certified for it.
    pub async fn one_route(db: &TestDb, fake: &FakeProvider, server: &str) -> Router {
        let route = "[routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake-a\"]\n";
        Router::start(
            db,
            &[("fake-a", fake)],
            route,
            &manifest(&[("fake-a", fake, "language-detect")]),
            server,
        )
        .await
    }

    /// A provider that answers every request `{"language": "english"}`,
    /// and a router with one route to it, with `server` settings.
    pub async fn answering_english(db: &TestDb, server: &str) -> (FakeProvider, Router) {
        let english = Behavior::Reply(json!({"language": "english"}).to_string());
        Router::behaving(db, english, server).await
    }

    /// A provider that does `behavior` to every request, and a router with
    /// one route to it, with `server` settings.
    pub async fn behaving(db: &TestDb, behavior: Behavior, server: &str) -> (FakeProvider, Router) {
        let fake = FakeProvider::start(Script::always(behavior)).await.unwrap();
        let router = Router::one_route(db, &fake, server).await;
        (fake, router)
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.dir.path().join("manifest.json")
    }

    /// `POST /v1/jobs` as `api_key`, with an optional `Prefer: wait`.
    pub async fn create(
        &self,
        api_key: &str,
        idempotency_key: &str,
        body: &Value,
        wait: Option<u64>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        self.send("/v1/jobs", api_key, idempotency_key, body, wait)
            .await
    }

    /// `POST <path>` with a JSON body as `api_key`, with an Idempotency-Key
    /// and an optional `Prefer: wait`.
    pub async fn send(
        &self,
        path: &str,
        api_key: &str,
        idempotency_key: &str,
        body: &Value,
        wait: Option<u64>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(api_key)
            .header("Idempotency-Key", idempotency_key)
            .json(body);
        if let Some(seconds) = wait {
            request = request.header("Prefer", format!("wait={seconds}"));
        }
        let response = request.send().await.unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        (
            status,
            headers,
            response.json().await.unwrap_or(Value::Null),
        )
    }

    pub async fn get(&self, api_key: &str, path: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(api_key)
            .send()
            .await
            .unwrap();
        (
            response.status(),
            response.json().await.unwrap_or(Value::Null),
        )
    }

    pub async fn post(
        &self,
        api_key: &str,
        path: &str,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        self.post_json(api_key, path, None).await
    }

    /// `POST path` with `body` as JSON, if any.
    pub async fn post_json(
        &self,
        api_key: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(api_key);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        (
            status,
            headers,
            response.json().await.unwrap_or(Value::Null),
        )
    }

    /// Retries the job `id` (`POST /v1/jobs/{id}/retry`, which must be
    /// accepted), waits until it settles again, and returns it.
    pub async fn retry_until_settled(&self, api_key: &str, id: &str) -> Value {
        let mut settled = self.state.inner.settled.subscribe();
        let (status, _, retried) = self.post(api_key, &format!("/v1/jobs/{id}/retry")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{retried}");
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while settled.recv().await.unwrap().0 != id {}
        })
        .await
        .unwrap();
        self.get(api_key, &format!("/v1/jobs/{id}")).await.1
    }

    pub async fn metric(&self, name: &str) -> f64 {
        surety_tests::metric_value(&self.metrics().await, name)
    }

    /// `/metrics`, as Prometheus reads it.
    pub async fn metrics(&self) -> String {
        let response = self.client.get(format!("{}/metrics", self.base)).send();
        response.await.unwrap().text().await.unwrap()
    }
}

/// The providers a job's attempts went to, in order.
pub fn providers_tried(job: &Value) -> Vec<&str> {
    job["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["provider"].as_str().unwrap())
        .collect()
}

pub fn detect(text: &str) -> Value {
    json!({"route": "language", "input": {"text": text}})
}

/// Waits (yielding) until `ready` says so; false when 20 s pass first.
pub async fn until(mut ready: impl AsyncFnMut() -> bool) -> bool {
    tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while !ready().await {
            tokio::task::yield_now().await;
        }
    })
    .await
    .is_ok()
}
