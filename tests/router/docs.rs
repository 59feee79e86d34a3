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

/// What a page says under its `# ` title, before anything else: its
/// opening paragraph, which must be one sentence (a capital first, one
/// full stop, at its end) saying what the page is for.
fn opening_sentence(page: &str) -> Result<String, String> {
    let mut lines = page.lines();
    if !lines.next().is_some_and(|title| title.starts_with("# ")) {
        return Err("its first line is not a `# ` title".to_owned());
    }
    let paragraph: Vec<&str> = lines
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let text = paragraph.join(" ");
    match text.chars().next() {
        None => return Err("nothing stands under its title".to_owned()),
        Some(c) if !c.is_uppercase() => {
            return Err(format!("it opens with `{text}`, not a sentence"));
        }
        Some(_) => {}
    }
    if !text.ends_with('.') || text.contains(". ") {
        return Err(format!(
            "its opening paragraph is not one sentence: `{text}`"
        ));
    }
    Ok(text)
}

#[test]
fn an_opening_that_is_a_list_a_table_or_two_sentences_is_refused() {
    for page in [
        "# T\n\n- **a**: a list.\n",
        "# T\n\n| a | b |\n",
        "# T\n\n## Section\n",
        "# T\n\nOne sentence. And another.\n",
        "# T\n\nA sentence with no stop\n",
        "T\n\nA title missing.\n",
    ] {
        assert!(opening_sentence(page).is_err(), "{page:?} was taken");
    }
    assert_eq!(
        opening_sentence("# T\n\nThis page says\nwhat it is for.\n\nMore.\n").unwrap(),
        "This page says what it is for."
    );
}

/// Every page of docs/ opens, under its title, with one sentence saying
/// what it is for.
#[test]
fn every_docs_page_opens_with_one_sentence_saying_what_it_is_for() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(why) = opening_sentence(&text) {
                panic!("{}: {why}", path.display());
            }
            pages.push(path);
        }
    }
    assert!(pages.len() >= 8, "docs/ holds {pages:?}");
}

/// docs/overview.md draws a job's path with where certification and live
/// checks enter, and the README links it.
#[test]
fn the_overview_draws_a_jobs_path_and_the_readme_links_it() {
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains("(docs/overview.md)"),
        "README does not link docs/overview.md"
    );
    let page = include_str!("../../docs/overview.md");
    let diagram: String = page
        .split("```mermaid")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/overview.md has a mermaid diagram")
        .to_owned();
    let mut at = 0;
    for step in [
        "intake",
        "durable job",
        "attempt",
        "provider call",
        "check",
        "compare-and-swap",
        "answer",
    ] {
        let found = diagram[at..]
            .find(step)
            .unwrap_or_else(|| panic!("the diagram has no `{step}` after the steps before it"));
        at += found;
    }
    for enters in ["certification manifest", "live checks", "unknown"] {
        assert!(
            diagram.contains(enters),
            "the diagram does not show `{enters}`"
        );
    }
}
