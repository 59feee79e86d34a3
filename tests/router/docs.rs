//! The documentation's examples, read by the code they describe.

use std::time::Duration;

use surety_router::RouterConfig;

/// The fenced `toml` blocks of a Markdown page.
fn toml_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```toml" {
            let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            blocks.push(block.join("\n"));
        }
    }
    blocks
}

/// docs/configuration.md shows the whole file with every key: the router's
/// own reader takes it (unknown keys are refused, so a renamed or removed
/// setting fails here), and what it says is what is read.
#[test]
fn the_configuration_page_is_a_file_the_router_reads() {
    let page = include_str!("../../docs/configuration.md");
    let blocks = toml_blocks(page);
    assert_eq!(blocks.len(), 1, "one complete file on the page");
    let config = RouterConfig::from_toml_with(&blocks[0], &|_| None)
        .unwrap_or_else(|e| panic!("docs/configuration.md: {e}"));
    assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.database, "sqlite:surety.db");
    assert_eq!(
        config.routes["language"].hedge_after,
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        config.providers["local-gemma"].base_url,
        "http://127.0.0.1:8077/v1"
    );
    assert_eq!(config.providers.len(), 4);
    let responses = &config.providers["gpt-responses"].capabilities;
    assert!(responses.store && responses.background, "{responses:?}");
    let key = &config.api_keys["2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"];
    assert_eq!(key.owner, "acme");
    assert_eq!(key.name.as_deref(), Some("acme-app"));
    let budgets: Vec<&str> = config.budgets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        budgets,
        ["acme-daily", "acme-app-hourly", "language-checks"]
    );
    assert_eq!(
        format!("{:?}", config.budgets[2].payer),
        r#"Checks("language")"#
    );
    assert_eq!(config.budgets[0].limit, 50_000_000, "50 USD, in millionths");
    let price = config.providers["claude-haiku"].price.as_ref().unwrap();
    assert_eq!(
        (
            price.input_micros_per_million,
            price.cached_input_micros_per_million
        ),
        (1_000_000, 100_000)
    );
}
