//! No secret reaches a log, an error or Debug output, even when a careless
//! server echoes the credentials back in its error message.

use std::io::Write;
use std::sync::{Arc, Mutex};

use surety_fake_provider::{Behavior, FakeProvider, Script};
use surety_providers::{ProvidersConfig, build_provider, build_provider_with};

use crate::support::{call, json_request, kinds, row, spec};

const SECRET: &str = "sk-test-4f1e2d3c-DO-NOT-LEAK-9a8b7c6d";

/// A log sink the test can read back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_api_key_never_reaches_logs_errors_or_debug_output() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let fake = FakeProvider::start(Script::always(Behavior::EchoCredentials))
        .await
        .unwrap();
    let mut seen = String::new();
    // Twice: a callsite another test's thread was registering while this
    // subscriber was set caches "never" (its interest was asked of the
    // dispatchers that existed when it began); once every callsite is
    // registered, asking them all again sees this one.
    for (pass, kind) in [0, 1]
        .into_iter()
        .flat_map(|p| kinds().map(move |k| (p, k)))
    {
        if pass == 1 && kind == kinds().next().unwrap_or_default() {
            tracing::callsite::rebuild_interest_cache();
        }
        let base_url = (row(spec(kind).kind).base_url)(&fake);
        let toml = format!(
            "[providers.p]\nkind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\ncontext_window = 1000\napi_key_env = \"SURETY_TEST_SECRET_KEY\"\n"
        );
        let config = ProvidersConfig::from_toml(&toml).unwrap();
        let environment = |var: &str| (var == "SURETY_TEST_SECRET_KEY").then(|| SECRET.to_owned());
        let provider = build_provider_with(&config.providers["p"], &environment).unwrap();
        let error = provider.chat(&json_request(), &call(1)).await.unwrap_err();
        seen.push_str(&format!("{config:?}\n{provider:?}\n{error:?}\n{error}\n"));
        seen.push_str(&serde_json::to_string(&config.providers["p"]).unwrap());
        // The server did see the key: the test would notice a leak.
        assert!(error.message.contains("[redacted]"), "{error}");
    }
    let echoed = fake.requests();
    assert_eq!(
        echoed.len(),
        2 * kinds().count(),
        "every kind was called, twice"
    );
    seen.push_str(&String::from_utf8(captured.0.lock().unwrap().clone()).unwrap());
    assert!(
        seen.contains("provider call failed"),
        "the logs were captured:\n{seen}"
    );
    assert!(!seen.contains(SECRET), "the secret leaked:\n{seen}");
    assert!(
        !seen.contains("DO-NOT-LEAK"),
        "part of the secret leaked:\n{seen}"
    );
}

#[test]
fn a_missing_key_names_its_variable() {
    let toml = "[providers.openai]\nkind = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nmodel = \"gpt-4o-mini\"\n\
                context_window = 128000\napi_key_env = \"SURETY_TEST_UNSET_KEY\"\n";
    let config = ProvidersConfig::from_toml(toml).unwrap();
    let error = build_provider(&config.providers["openai"]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "`providers.openai.api_key_env`: the environment variable SURETY_TEST_UNSET_KEY is not set; \
         it must hold the API key of provider `openai`"
    );
}
