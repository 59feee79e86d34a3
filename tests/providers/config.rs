//! Provider configuration: strict parsing, and validation errors that name
//! the TOML path.

use surety_providers::{ProvidersConfig, StructuredMode, TokenizerConfig};

const GOOD: &str = r#"
[providers.local-gemma]
kind = "openai"
base_url = "http://127.0.0.1:8077/v1/"
model = "gemma-3-270m"
structured_output = ["json_object_schema", "json_object"]
tokenize_endpoint = true
tokenizer = "server"
context_window = 2048
seed = true

[providers.claude]
kind = "anthropic"
base_url = "https://api.anthropic.com"
model = "claude-sonnet-4-5"
api_key_env = "ANTHROPIC_API_KEY"
context_window = 200000
timeouts = { connect_ms = 2000, request_ms = 30000 }
"#;

#[test]
fn a_good_file_validates_into_typed_config() {
    let config = ProvidersConfig::from_toml(GOOD).unwrap();
    let gemma = &config.providers["local-gemma"];
    assert_eq!(gemma.base_url, "http://127.0.0.1:8077/v1");
    assert_eq!(
        gemma.capabilities.structured_output,
        [StructuredMode::JsonObjectSchema, StructuredMode::JsonObject]
    );
    assert_eq!(gemma.tokenizer, TokenizerConfig::Server);
    assert_eq!(
        gemma.capabilities.idempotency_header.as_deref(),
        Some("Idempotency-Key")
    );
    let claude = &config.providers["claude"];
    assert_eq!(
        claude.capabilities.structured_output,
        [StructuredMode::Tool]
    );
    assert!(!claude.capabilities.seed);
    assert_eq!(claude.request_timeout.as_millis(), 30000);
}

#[track_caller]
fn check_error(toml: &str, expect: &str) {
    let error = ProvidersConfig::from_toml(toml).unwrap_err().to_string();
    assert!(error.contains(expect), "expected `{expect}` in:\n{error}");
}

#[test]
fn bad_files_get_errors_naming_the_toml_path() {
    let base = "[providers.p]\nkind = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\ncontext_window = 10\n";
    let added = |line: &str| format!("{base}{line}");
    let replaced = |from: &str, to: &str| base.replace(from, to);
    for (file, error) in [
        (added("colour = \"blue\"\n"), "unknown field `colour`"),
        (
            replaced("http://x/v1", "ftp://x"),
            "`providers.p.base_url`: must start with http",
        ),
        (
            replaced("http://x/v1", "https://user:pw@x/v1"),
            "`providers.p.base_url`: must not carry credentials",
        ),
        (
            replaced("model = \"m\"", "model = \" \""),
            "`providers.p.model`: must not be empty",
        ),
        (
            replaced("context_window = 10", "context_window = 0"),
            "`providers.p.context_window`",
        ),
        (
            added("structured_output = [\"tool\"]\n"),
            "`providers.p.structured_output`: `tool` is not a mode",
        ),
        (
            added("structured_output = []\n"),
            "`providers.p.structured_output`: must list at least one mode",
        ),
        (
            added("tokenizer = \"server\"\n"),
            "`providers.p.tokenizer`: `server` needs",
        ),
        (
            added("tokenizer = \"sentencepiece\"\n"),
            "`providers.p.tokenizer`",
        ),
        (
            added("api_key_env = \"sk-live-123\"\n"),
            "`providers.p.api_key_env`",
        ),
        (
            added("[providers.p.timeouts]\nrequest_ms = 0\n"),
            "`providers.p.timeouts.request_ms`",
        ),
        (
            replaced("kind = \"openai\"", "kind = \"palm\""),
            "unknown variant `palm`",
        ),
    ] {
        check_error(&file, error);
    }
}

/// A capability a kind lacks cannot be declared: the registry says which,
/// and the error names the TOML path.
#[test]
fn a_capability_the_kind_lacks_is_refused_with_its_path() {
    use surety_providers::kinds::{KINDS, Support};
    let mut refused = 0;
    for kind in KINDS {
        let base = format!(
            "[providers.p]\nkind = \"{}\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\ncontext_window = 10\n",
            kind.name
        );
        for (field, support) in [
            ("seed", kind.seed),
            ("tokenize_endpoint", kind.tokenize_endpoint),
            ("models_endpoint", kind.models_endpoint),
            ("store", kind.store),
        ] {
            let declared = format!("{base}{field} = true\n");
            match support {
                Support::No => {
                    check_error(&declared, &format!("`providers.p.{field}`"));
                    refused += 1;
                }
                Support::Yes { .. } => {
                    ProvidersConfig::from_toml(&declared).unwrap();
                }
            }
        }
    }
    assert!(
        refused >= 5,
        "anthropic lacks seed, tokenize and models endpoints and storage; gemini storage"
    );
}

/// A kind that can be asked about an earlier call can only where its
/// configuration allows it: stored completions need `store = true`.
#[test]
fn reconciliation_is_the_kinds_where_the_configuration_allows_it() {
    use surety_providers::kinds::{KINDS, Reconciliation, Support};
    for kind in KINDS {
        let base = format!(
            "[providers.p]\nkind = \"{}\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\ncontext_window = 10\n",
            kind.name
        );
        let plain = ProvidersConfig::from_toml(&base).unwrap().providers["p"].clone();
        match (kind.reconciliation, kind.store) {
            (
                Reconciliation::StoredCompletions | Reconciliation::Responses,
                Support::Yes { default: false },
            ) => {
                assert_eq!(
                    plain.reconciliation(),
                    Reconciliation::None,
                    "{}: off unless stored",
                    kind.name
                );
                let stored = ProvidersConfig::from_toml(&format!("{base}store = true\n"))
                    .unwrap()
                    .providers["p"]
                    .clone();
                assert_eq!(
                    stored.reconciliation(),
                    kind.reconciliation,
                    "{}",
                    kind.name
                );
                assert_eq!(
                    stored.behaviour()["store"],
                    true,
                    "{}: the certificate binds storage",
                    kind.name
                );
                assert!(
                    plain.behaviour().get("store").is_none(),
                    "{}: a certificate made before storage keeps its hash",
                    kind.name
                );
            }
            (way, _) => assert_eq!(plain.reconciliation(), way, "{}", kind.name),
        }
    }
}
