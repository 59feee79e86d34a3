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

/// The rows of the first Markdown table in `section` whose header's first
/// cell is `first`, each as its cells (trimmed), the header and its rule
/// left out.
fn table_rows(section: &str, first: &str) -> Option<Vec<Vec<String>>> {
    let cells = |line: &str| -> Vec<String> {
        let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split(" | ").map(|c| c.trim().to_owned()).collect()
    };
    let lines: Vec<&str> = section.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with('|') && cells(l)[0] == first)?;
    Some(
        lines[start + 2..]
            .iter()
            .take_while(|l| l.trim_start().starts_with('|'))
            .map(|l| cells(l))
            .collect(),
    )
}

/// The names a row's first cell gives in backticks (`` `tools`, `tool_choice` ``).
fn backticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Holds docs/router.md to the OpenAPI document, both ways: a `### `
/// section per operation (`` ### `GET /v1/jobs/{id}` ``) and none besides;
/// in each, an auth table saying `none` exactly where the document asks
/// for no key, a row for every path, query and header parameter the
/// document declares (in the place it declares it), a status table with
/// exactly the document's statuses, and an example in a fenced block.
fn reference_matches(page: &str, document: &serde_json::Value) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let mut sections = std::collections::BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in page.lines() {
        if line.starts_with("## ") || line.starts_with("### ") {
            current = None;
        }
        if let Some(title) = line.strip_prefix("### `").and_then(|t| t.strip_suffix('`')) {
            let (method, path) = title.split_once(' ').unwrap_or((title, ""));
            let key = (method.to_lowercase(), path.to_owned());
            if sections.insert(key.clone(), String::new()).is_some() {
                problems.push(format!("`{title}` has two sections"));
            }
            current = Some(key);
            continue;
        }
        if let Some(key) = &current {
            let text: &mut String = sections.get_mut(key).unwrap();
            text.push_str(line);
            text.push('\n');
        }
    }
    let paths = document["paths"].as_object().unwrap();
    for (path, operations) in paths {
        for (method, operation) in operations.as_object().unwrap() {
            let name = format!("{} {path}", method.to_uppercase());
            let Some(section) = sections.remove(&(method.clone(), path.clone())) else {
                problems.push(format!("`{name}` has no section"));
                continue;
            };
            let open = operation["security"] == serde_json::json!([{}]);
            match table_rows(&section, "auth").as_deref() {
                Some([row, ..]) if (row[0] == "none") == open => {}
                Some(_) => problems.push(format!(
                    "`{name}`: its auth says {}, the document {}",
                    if open { "a key" } else { "none" },
                    if open { "none" } else { "a key" }
                )),
                None => problems.push(format!("`{name}` has no auth table")),
            }
            let rows = table_rows(&section, "parameter").unwrap_or_default();
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                let (wanted, place) = (
                    parameter["name"].as_str().unwrap_or_default(),
                    parameter["in"].as_str().unwrap_or_default(),
                );
                let found = rows.iter().any(|row| {
                    backticked(&row[0]).contains(&wanted)
                        && row.get(1).map(String::as_str) == Some(place)
                });
                if !found {
                    problems.push(format!(
                        "`{name}`: no row for its {place} parameter `{wanted}`"
                    ));
                }
            }
            let mut documented: Vec<String> = operation["responses"]
                .as_object()
                .map(|r| r.keys().cloned().collect())
                .unwrap_or_default();
            documented.sort();
            let mut listed: Vec<String> = table_rows(&section, "status")
                .unwrap_or_default()
                .into_iter()
                .map(|row| row[0].clone())
                .collect();
            listed.sort();
            if listed != documented {
                problems.push(format!(
                    "`{name}`: its statuses are {listed:?}, the document's {documented:?}"
                ));
            }
            if !section.contains("\n```") {
                problems.push(format!("`{name}` has no example"));
            }
        }
    }
    for (method, path) in sections.keys() {
        problems.push(format!(
            "`{} {path}` has a section but no operation in /openapi.json",
            method.to_uppercase()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// `/openapi.json` as the router serves it (the snapshot `snapshots.rs`
/// holds equal to the served document).
fn served_document() -> serde_json::Value {
    let snapshot = include_str!("snapshots/openapi.json.snap");
    let body = snapshot.splitn(3, "---\n").nth(2).unwrap();
    serde_json::from_str(body).unwrap()
}

/// Every operation of `/openapi.json` has its table in docs/router.md, with
/// its parameters and exactly its statuses, and the page documents nothing
/// the router does not serve.
#[test]
fn every_endpoint_in_the_openapi_document_has_its_reference_in_router_md() {
    let page = include_str!("../../docs/router.md");
    if let Err(problems) = reference_matches(page, &served_document()) {
        panic!(
            "docs/router.md against /openapi.json:\n{}",
            problems.join("\n")
        );
    }
}

#[test]
fn a_missing_endpoint_parameter_or_status_or_an_extra_section_is_found() {
    let page = include_str!("../../docs/router.md");
    let document = served_document();
    let problems = |page: &str| reference_matches(page, &document).unwrap_err().join("\n");
    let without_budget = page.replace("### `GET /v1/budget`", "### the budget");
    assert!(problems(&without_budget).contains("`GET /v1/budget` has no section"));
    let extra = format!("{page}\n### `GET /v1/nothing`\n");
    assert!(problems(&extra).contains("`GET /v1/nothing` has a section but no operation"));
    let no_prefer = page.replace("| `Prefer` | header |", "| `Prefers` | header |");
    assert!(
        problems(&no_prefer).contains("`POST /v1/jobs`: no row for its header parameter `Prefer`")
    );
    let no_507 = page.replacen("| 507 | the database is full |\n", "", 1);
    assert!(problems(&no_507).contains("`POST /v1/jobs`: its statuses are"));
    let open_jobs = page.replacen("| an API key | `{\"route\"", "| none | `{\"route\"", 1);
    assert!(problems(&open_jobs).contains("`POST /v1/jobs`: its auth says"));
}

/// docs/operations.md's performance section is the figures that stand
/// now: at most two screens (60 lines), the command that makes them, the
/// benchmark's charts (committed beside it), and a link to the notes that
/// keep the history.
#[test]
fn the_performance_section_fits_two_screens_and_shows_the_charts() {
    let page = include_str!("../../docs/operations.md");
    let section: Vec<&str> = page
        .lines()
        .skip_while(|l| *l != "## Performance")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect();
    assert!(
        !section.is_empty(),
        "docs/operations.md has no `## Performance`"
    );
    assert!(
        section.len() <= 60,
        "the performance section is {} lines, more than two screens",
        section.len()
    );
    let text = section.join("\n");
    assert!(text.contains("cargo xtask bench router"), "no command");
    assert!(
        text.contains("(performance-notes.md)"),
        "no link to the notes"
    );
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    for chart in ["router-throughput.svg", "router-latency.svg"] {
        assert!(
            text.contains(&format!("](figures/{chart})")),
            "the section does not show {chart}"
        );
        let svg = std::fs::read_to_string(docs.join("figures").join(chart))
            .unwrap_or_else(|e| panic!("docs/figures/{chart}: {e}"));
        assert!(
            svg.starts_with("<svg"),
            "docs/figures/{chart} is not an SVG"
        );
    }
    let notes = include_str!("../../docs/performance-notes.md");
    assert!(
        notes.lines().count() > section.len(),
        "the history is in the notes"
    );
}

/// Each `### ` section of docs/configuration.md's key tables against the
/// keys its type takes (`RouterConfig::sections`): a row per key, and no
/// row for a key the type does not take.
fn configuration_matches(
    page: &str,
    sections: &[(&'static str, &'static [&'static str])],
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let mut documented = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    let mut text = String::new();
    for line in page.lines().chain(std::iter::once("## end")) {
        if line.starts_with("## ") || line.starts_with("### ") {
            if let Some(name) = current.take() {
                documented.insert(name, std::mem::take(&mut text));
            }
            current = line
                .strip_prefix("### `")
                .and_then(|t| t.strip_suffix('`'))
                .map(str::to_owned);
            continue;
        }
        if current.is_some() {
            text.push_str(line);
            text.push('\n');
        }
    }
    for (section, keys) in sections {
        let Some(text) = documented.remove(*section) else {
            problems.push(format!("`{section}` has no table"));
            continue;
        };
        let rows: Vec<String> = table_rows(&text, "key")
            .unwrap_or_default()
            .iter()
            .flat_map(|row| {
                backticked(&row[0])
                    .into_iter()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        for key in *keys {
            if !rows.iter().any(|r| r == key) {
                problems.push(format!("`{section}`: no row for `{key}`"));
            }
        }
        for row in &rows {
            if !keys.contains(&row.as_str()) {
                problems.push(format!("`{section}`: `{row}` is not a key it takes"));
            }
        }
    }
    for section in documented.keys() {
        problems.push(format!("`{section}` is not a section of surety.toml"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// docs/configuration.md has one table per section of `surety.toml`, a row
/// for each key the router's types read, and none besides.
#[test]
fn every_setting_has_its_row_in_configuration_md_and_every_row_is_a_setting() {
    let page = include_str!("../../docs/configuration.md");
    let sections = RouterConfig::sections();
    assert!(sections.len() >= 8, "{sections:?}");
    if let Err(problems) = configuration_matches(page, &sections) {
        panic!(
            "docs/configuration.md against the settings:\n{}",
            problems.join("\n")
        );
    }
}

#[test]
fn a_missing_or_unknown_setting_or_section_is_found() {
    let page = include_str!("../../docs/configuration.md");
    let sections = RouterConfig::sections();
    let problems = |page: &str| {
        configuration_matches(page, &sections)
            .unwrap_err()
            .join("\n")
    };
    let without = page.replace("| `lease_ms` |", "| lease |");
    assert!(problems(&without).contains("`[server]`: no row for `lease_ms`"));
    let unknown = page.replace("| `lease_ms` |", "| `lease_seconds` |");
    assert!(problems(&unknown).contains("`[server]`: `lease_seconds` is not a key it takes"));
    let extra = format!("{page}\n### `[metrics]`\n");
    assert!(problems(&extra).contains("`[metrics]` is not a section of surety.toml"));
    let gone = page.replace("### `[[budgets]]`", "### Budgets");
    assert!(problems(&gone).contains("`[[budgets]]` has no table"));
}
