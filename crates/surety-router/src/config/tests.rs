//! The configuration's parsing, defaults and refusals, each naming its TOML path.

use super::*;

const GOOD: &str = r#"
[server]
listen = "127.0.0.1:0"
database = "sqlite:surety.db"
manifest = "certification/manifest.json"

[[api_keys]]
owner = "acme"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

[providers.fake]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
model = "fake"
context_window = 16000

[routes.language]
contract = "language-detect"
providers = ["fake"]
"#;

fn error_with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    RouterConfig::from_toml(&GOOD.replace(from, to))
        .unwrap_err()
        .to_string()
}

#[test]
fn a_provider_timeout_longer_than_the_attempts_is_refused_naming_both() {
    let with = |request_ms: u64, attempt: &str| {
        let text = GOOD
            .replace("[server]", &format!("[server]\n{attempt}"))
            .replace(
                "[providers.fake]",
                &format!("[providers.fake]\ntimeouts = {{ request_ms = {request_ms} }}"),
            );
        RouterConfig::from_toml(&text)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let refused = with(120_000, "").unwrap_err();
    assert!(
        refused.contains("providers.fake.timeouts.request_ms")
            && refused.contains("server.attempt_timeout_ms (60000 ms)"),
        "{refused}"
    );
    assert_eq!(with(120_000, "attempt_timeout_ms = 120000"), Ok(()));
    assert_eq!(with(30_000, ""), Ok(()));
}

#[test]
fn a_hedge_due_after_the_attempts_timeout_is_refused_naming_both() {
    let with = |hedge_ms: u64| {
        let text = GOOD.replace(
            "[routes.language]",
            &format!("[routes.language]\nhedge_after_ms = {hedge_ms}"),
        );
        RouterConfig::from_toml(&text)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let refused = with(60_000).unwrap_err();
    assert!(
        refused.contains("routes.language.hedge_after_ms")
            && refused.contains("server.attempt_timeout_ms (60000 ms)"),
        "{refused}"
    );
    assert_eq!(with(59_999), Ok(()));
}

#[test]
fn a_good_file_parses_with_its_defaults() {
    let config = RouterConfig::from_toml(GOOD).unwrap();
    assert_eq!(config.database_connections, defaults::DATABASE_CONNECTIONS);
    assert_eq!(config.contracts, PathBuf::from("contracts"));
    assert_eq!(config.api_keys.len(), 1);
    assert_eq!(config.routes["language"].providers, ["fake"]);
    assert_eq!(config.settings.retention, Duration::from_secs(24 * 60 * 60));
    assert_eq!(
        config.settings.listening.max_connections,
        defaults::MAX_CONNECTIONS
    );
    // Every owner has an in-flight limit: a quarter of the connections, at most 256.
    assert_eq!(config.owner_max_in_flight.get(), 256);
    let small = GOOD.replace("[server]", "[server]\nmax_connections = 16");
    let small = RouterConfig::from_toml(&small).unwrap();
    assert_eq!(small.owner_max_in_flight.get(), 4);
    assert_eq!(config.operator_session, Duration::from_secs(8 * 3600));
    assert!(!config.settings.secure_cookies);
    assert_eq!(
        config.settings.listening.request_read_timeout,
        Duration::from_secs(10)
    );
    assert_eq!(config.settings.database_timeout, Duration::from_secs(3));
    assert_eq!(config.sqlite_max_bytes, None);
}

#[test]
fn errors_name_the_toml_path() {
    let cases = [
        (
            "listen = \"127.0.0.1:0\"",
            "listen = \"here\"",
            "`server.listen`",
        ),
        (
            "manifest = ",
            "database_connections = 0\nmanifest = ",
            "`server.database_connections`",
        ),
        (
            "manifest = ",
            "lease_ms = 0\nmanifest = ",
            "`server.lease_ms`",
        ),
        ("sha256 = \"9f86", "sha256 = \"zz86", "`api_keys[0].sha256`"),
        (
            "manifest = ",
            "sqlite_synchronous = \"sometimes\"\nmanifest = ",
            "`server.sqlite_synchronous`",
        ),
        (
            "manifest = ",
            "sqlite_max_bytes = 4096\nmanifest = ",
            "`server.sqlite_max_bytes`",
        ),
        (
            "manifest = ",
            "max_connections = 0\nmanifest = ",
            "`server.max_connections`",
        ),
        (
            "manifest = ",
            "retention_ms = 0\nmanifest = ",
            "`server.retention_ms`",
        ),
        (
            "manifest = ",
            "request_read_timeout_ms = 0\nmanifest = ",
            "`server.request_read_timeout_ms`",
        ),
        ("owner = \"acme\"", "owner = \"\"", "`api_keys[0].owner`"),
        (
            "owner = \"acme\"",
            "owner = \"acme\"\nall_owners = true",
            "`api_keys[0].all_owners`",
        ),
        (
            "providers = [\"fake\"]",
            "providers = [\"nobody\"]",
            "routes.language",
        ),
    ];
    for (from, to, path) in cases {
        let error = error_with(from, to);
        assert!(error.contains(path), "{to}: {error}");
    }
    let unknown = error_with("manifest = ", "databse = \"x\"\nmanifest = ");
    assert!(unknown.contains("databse"), "{unknown}");
}

#[test]
fn the_listen_address_and_the_database_url_may_come_from_the_environment() {
    let from_env = GOOD
        .replace(
            "database = \"sqlite:surety.db\"",
            "database_env = \"SURETY_DB\"",
        )
        .replace("listen = \"127.0.0.1:0\"", "listen_env = \"SURETY_LISTEN\"");
    let env = |var: &str| match var {
        "SURETY_DB" => Some("postgres://app:s3cret@db:5432/surety".to_owned()),
        "SURETY_LISTEN" => Some("0.0.0.0:9000".to_owned()),
        _ => None,
    };
    let config = RouterConfig::from_toml_with(&from_env, &env).unwrap();
    assert_eq!(config.database, "postgres://app:s3cret@db:5432/surety");
    assert_eq!(config.listen.to_string(), "0.0.0.0:9000");
    let unset = RouterConfig::from_toml_with(&from_env, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        unset.contains("`server.listen_env`: the environment variable SURETY_LISTEN is not set"),
        "{unset}"
    );
    let both = error_with(
        "database = \"sqlite:surety.db\"",
        "database = \"sqlite:surety.db\"\ndatabase_env = \"SURETY_DB\"",
    );
    assert!(
        both.contains("`server.database`: give `database` or `database_env`, not both"),
        "{both}"
    );
    let neither = error_with("database = \"sqlite:surety.db\"", "");
    assert!(neither.contains("`server.database`: missing"), "{neither}");
}

#[test]
fn the_runtime_leaves_sqlites_writer_a_core_and_postgresql_none() {
    let sqlite = RouterConfig::from_toml(GOOD).unwrap();
    let postgres = RouterConfig::from_toml(&GOOD.replace(
        "sqlite:surety.db",
        "postgres://postgres@127.0.0.1:5432/test",
    ))
    .unwrap();
    let workers = |config: &RouterConfig| {
        [1, 2, 8]
            .map(|cores| config.runtime_workers(cores))
            .to_vec()
    };
    assert_eq!(workers(&sqlite), [1, 1, 7]);
    assert_eq!(workers(&postgres), [1, 2, 8]);
}

/// `GOOD` with `budgets` appended and `price` in the provider's table.
fn budgeted(budgets: &str, price: &str) -> Result<RouterConfig, String> {
    let text = GOOD.replace(
        "context_window = 16000",
        &format!("context_window = 16000\n{price}"),
    );
    RouterConfig::from_toml(&format!("{text}\n{budgets}")).map_err(|e| e.to_string())
}

#[test]
fn budgets_are_read_with_their_units_and_periods() {
    let config = budgeted(
        "[[budgets]]\nname = \"day\"\nowner = \"acme\"\nlimit = 2.5\nunit = \"USD\"\nperiod = \"day\"\n\
         [[budgets]]\nname = \"hour\"\nowner = \"acme\"\nlimit = 1000\nunit = \"tokens\"\nperiod = \"rolling\"\nwindow_ms = 3600000\nat_limit = \"record\"\n",
        "price = { currency = \"USD\", input_per_million = 0.15, output_per_million = 0.6 }",
    )
    .unwrap();
    assert_eq!(config.budgets[0].limit, 2_500_000);
    assert_eq!(config.budgets[0].unit, BudgetUnit::Money("USD".into()));
    assert_eq!(
        config.budgets[1].period,
        Period::Rolling(Duration::from_secs(3600))
    );
    assert_eq!(config.budgets[1].at_limit, AtLimit::Record);
    let price = config.providers["fake"].price.clone().unwrap();
    assert_eq!(
        (
            price.input_micros_per_million,
            price.cached_input_micros_per_million
        ),
        (150_000, 150_000)
    );
}

#[test]
fn a_routes_checks_budget_pays_for_its_live_checks() {
    let config = budgeted(
        "[routes.language.shadow]\nsampling = 0.5\nhourly_budget = 100\n\
         [[budgets]]\nname = \"checks\"\nroute = \"language\"\nlimit = 500\nunit = \"tokens\"\nperiod = \"day\"\n",
        "",
    )
    .unwrap();
    assert_eq!(config.budgets[0].payer, Payer::Checks("language".into()));
}

#[test]
fn a_budget_that_cannot_be_kept_is_refused_naming_its_path() {
    let price = "price = { currency = \"USD\", input_per_million = 1, output_per_million = 2 }";
    let cases = [
        // A currency some provider is not priced in.
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = 1\nunit = \"EUR\"\nperiod = \"day\"\n",
            price,
            "budgets[0].unit",
        ),
        // Money with a provider that has no price.
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = 1\nunit = \"USD\"\nperiod = \"day\"\n",
            "",
            "providers.fake.price",
        ),
        // An owner no key has.
        (
            "[[budgets]]\nname = \"b\"\nowner = \"nobody\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[0].owner",
        ),
        // A key no key is named.
        (
            "[[budgets]]\nname = \"b\"\nkey = \"nameless\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[0].key",
        ),
        // A route that does not exist, and one with no live checks to pay for.
        (
            "[[budgets]]\nname = \"b\"\nroute = \"nowhere\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[0].route",
        ),
        (
            "[[budgets]]\nname = \"b\"\nroute = \"language\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[0].route",
        ),
        (
            "[[budgets]]\nname = \"b\"\nroute = \"language\"\nowner = \"acme\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[0]",
        ),
        // Both an owner and a key, a rolling window without its length,
        // a window on a day, a negative limit, an unknown period, two of
        // one name.
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nkey = \"k\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[0]",
        ),
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"rolling\"\n",
            "",
            "budgets[0].window_ms",
        ),
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\nwindow_ms = 100\n",
            "",
            "budgets[0].window_ms",
        ),
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = -1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[0].limit",
        ),
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"week\"\n",
            "",
            "budgets[0].period",
        ),
        (
            "[[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n\
             [[budgets]]\nname = \"b\"\nowner = \"acme\"\nlimit = 1\nunit = \"tokens\"\nperiod = \"day\"\n",
            "",
            "budgets[1].name",
        ),
        // A price that is not one.
        (
            "",
            "price = { currency = \"usd\", input_per_million = 1, output_per_million = 2 }",
            "providers.fake.price.currency",
        ),
        (
            "",
            "price = { currency = \"USD\", input_per_million = -1, output_per_million = 2 }",
            "providers.fake.price.input_per_million",
        ),
    ];
    for (budgets, price, path) in cases {
        let refused = budgeted(budgets, price).unwrap_err();
        assert!(refused.contains(&format!("`{path}`")), "{path}: {refused}");
    }
}
