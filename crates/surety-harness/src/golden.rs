//! Golden snapshots under `golden/<provider>/<contract>/<case>.snap`, in
//! insta's file format: read and compared with insta, so `cargo insta
//! review` can accept what certification left pending (`.snap.new`).

use std::path::{Path, PathBuf};

use insta::internals::{SnapshotContents, TextSnapshotContents};
use insta::{Snapshot, TextSnapshotKind};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Golden {
    /// The snapshot matches.
    Matches,
    /// The snapshot was written (`--accept`).
    Accepted,
    /// No snapshot yet: a pending one was written for review; `diff` is
    /// all of it, added.
    New { pending: PathBuf, diff: String },
    /// The snapshot differs: a pending one was written for review; `diff`
    /// is the accepted snapshot against this run's, unified.
    Changed { pending: PathBuf, diff: String },
}

/// `old` against `new`, line by line, as a unified diff.
fn unified(old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header("accepted", "this run")
        .to_string()
}

/// Compares `contents` with the snapshot `name` in `dir`.
pub fn check(
    dir: &Path,
    name: &str,
    expression: &str,
    contents: &str,
    accept: bool,
) -> std::io::Result<Golden> {
    let path = dir.join(format!("{name}.snap"));
    let pending = dir.join(format!("{name}.snap.new"));
    let new = TextSnapshotContents::new(contents.to_owned(), TextSnapshotKind::File);
    let existing = if path.is_file() {
        Snapshot::from_file(&path).ok()
    } else {
        None
    };
    let matches = existing.as_ref().is_some_and(|old| match old.contents() {
        SnapshotContents::Text(text) => new.matches_latest(text),
        _ => false,
    });
    if matches {
        remove_if_present(&pending)?;
        return Ok(Golden::Matches);
    }
    std::fs::create_dir_all(dir)?;
    let file = format!(
        "---\nsource: surety certify\nexpression: {expression}\n---\n{}\n",
        contents.trim_end()
    );
    if accept {
        std::fs::write(&path, file)?;
        remove_if_present(&pending)?;
        return Ok(Golden::Accepted);
    }
    std::fs::write(&pending, file)?;
    Ok(match existing {
        Some(old) => {
            let old = match old.contents() {
                SnapshotContents::Text(text) => text.to_string(),
                _ => String::new(),
            };
            let diff = unified(
                &format!("{}\n", old.trim_end()),
                &format!("{}\n", contents.trim_end()),
            );
            Golden::Changed { pending, diff }
        }
        None => Golden::New {
            pending,
            diff: unified("", &format!("{}\n", contents.trim_end())),
        },
    })
}

fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
