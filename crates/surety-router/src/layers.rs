//! The layer rule, read from the sources: a module imports only from a
//! lower layer, so there is no import cycle and a change's place can be
//! read off the layout. The crate's top-level modules are layers; inside
//! `http` and `ui`, whose parts depend on each other, the parts are
//! layered too.

use std::path::{Path, PathBuf};

/// Each module's layer, lowest first. A module's layer is that of the
/// longest entry its path starts with (`http::facade::reply` is
/// `http::facade`'s).
///
/// - 0: what everything stands on: the settings, the metrics, who is
///   asking (sessions, failed authentications, constant-time tokens), and
///   the notices of a job settling;
/// - 1: certification: what may be served, from the manifest and the
///   configuration as they are now; 2: budgets: what an attempt may cost
///   at a provider, and a refusal in words;
/// - 3: the shared state; 4: the router's own checks (shadow calls,
///   re-checks, demotions; their budgets sit at 0, for the state to hold);
///   5: driving a job's attempts; 6: jobs (intake, wait, retry, cancel),
///   with their own errors;
/// - 7–13: HTTP: views; problem details and the shared response sets of
///   the document; the accept loop, the edge's limits and the OpenAPI
///   document's edits; the extractors; the API's handlers and the facade;
///   the routes, then the layer's front;
/// - 14–17: the operator's pages: their typed contexts, sign-in and
///   sessions, then the pages that read and act, then their routes;
/// - 18: the whole router.
const LAYERS: [(&str, u8); 30] = [
    ("config", 0),
    ("metrics", 0),
    ("auth", 0),
    ("settled", 0),
    ("live::budget", 0),
    ("certification", 1),
    ("spend", 2),
    ("state", 3),
    ("live", 4),
    ("dispatch", 5),
    ("jobs", 6),
    ("http::views", 7),
    ("http::error", 8),
    ("http::responses", 8),
    ("http::listen", 9),
    ("http::edge", 9),
    ("http::document", 9),
    ("http::extract", 10),
    ("http::facade", 11),
    ("http::jobs", 11),
    ("http::ops", 11),
    ("http::api", 12),
    ("http", 13),
    ("ui::views", 14),
    ("ui::session", 15),
    ("ui::pages", 16),
    ("ui::actions", 16),
    ("ui", 17),
    ("app", 18),
    ("layers", 19),
];

/// The entry of `module` (a path such as `http::facade::reply`).
fn layer(module: &str) -> Option<(&'static str, u8)> {
    LAYERS
        .iter()
        .filter(|(m, _)| module == *m || module.starts_with(&format!("{m}::")))
        .max_by_key(|(m, _)| m.len())
        .copied()
}

/// Every `.rs` file under `dir`, with its module path (`http/facade/mod.rs`
/// is `http::facade`).
fn modules(src: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with("bin") {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["lib"] {
                continue;
            }
            found.push((parts.join("::"), path));
        }
    }
    found
}

/// The modules `text` names with `crate::…` paths, longest first, as far
/// as they are modules (lowercase segments).
fn imports(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + 7..];
        let path: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_' || *c == ':')
            .collect();
        let path = path.trim_end_matches(':');
        if !path.is_empty() {
            found.push(path.to_owned());
        }
    }
    found
}

/// The offences against the rule in the tree at `src`.
fn offences(src: &Path) -> (usize, Vec<String>) {
    let mut offences = Vec::new();
    let found = modules(src);
    for (module, path) in &found {
        let Some((own, level)) = layer(module) else {
            offences.push(format!("{module} has no layer in LAYERS"));
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap();
        for import in imports(&text) {
            match layer(&import) {
                Some((theirs, _)) if theirs == own => {}
                Some((theirs, their_level)) if their_level >= level => offences.push(format!(
                    "{module} (layer {level}) imports {import} ({theirs}, layer {their_level})"
                )),
                _ => {}
            }
        }
    }
    (found.len(), offences)
}

#[test]
fn every_module_imports_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (seen, offences) = offences(&src);
    assert!(
        seen > 20,
        "only {seen} modules found under {}",
        src.display()
    );
    assert!(offences.is_empty(), "{offences:#?}");
}

#[test]
fn an_import_against_the_rule_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("http")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod http;\n").unwrap();
    std::fs::write(src.join("jobs.rs"), "use crate::state::AppState;\n").unwrap();
    std::fs::write(src.join("http/mod.rs"), "use crate::jobs::retry;\n").unwrap();
    // The jobs layer reaching up into the HTTP layer's errors.
    std::fs::write(
        src.join("dispatch.rs"),
        "use crate::http::error::ApiError;\n",
    )
    .unwrap();
    std::fs::write(src.join("unplaced.rs"), "").unwrap();
    let (seen, mut offences) = offences(src);
    offences.sort();
    assert_eq!(seen, 4);
    assert_eq!(
        offences,
        [
            "dispatch (layer 5) imports http::error (http::error, layer 8)",
            "unplaced has no layer in LAYERS",
        ],
    );
}

#[test]
fn a_module_is_placed_by_its_longest_entry() {
    assert_eq!(layer("http::facade::reply"), Some(("http::facade", 11)));
    assert_eq!(layer("http"), Some(("http", 13)));
    assert_eq!(layer("httpx"), None);
}
