//! The documentation's tables, read against the registry they describe.

use surety_providers::kinds::KINDS;

/// docs/certification.md lists every kind's finish reasons and what each
/// is read as: exactly the registry's, in its order.
#[test]
fn the_finish_reason_table_is_the_registrys() {
    let page = include_str!("../../docs/certification.md");
    let start = page
        .find("<!-- finish-reasons")
        .expect("the table's start marker");
    let end = page
        .find("<!-- /finish-reasons -->")
        .expect("its end marker");
    let documented: Vec<String> = page[start..end]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| kind"))
        .map(|l| l.replace('`', ""))
        .collect();
    let registry: Vec<String> = KINDS
        .iter()
        .flat_map(|k| {
            k.finish_reasons.iter().map(move |(reason, finish)| {
                format!(
                    "| {} | {} | {reason} | {} |",
                    k.name,
                    k.finish_field,
                    finish.as_str()
                )
            })
        })
        .collect();
    assert_eq!(documented, registry);
}

/// docs/components.md's table of kinds names each kind's reconciliation,
/// as the registry has it.
#[test]
fn the_kinds_table_names_each_kinds_reconciliation() {
    let page = include_str!("../../docs/components.md");
    for kind in KINDS {
        let row = page
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("| `{}` |", kind.name)))
            .unwrap_or_else(|| panic!("no row for kind {}", kind.name));
        let last = row
            .trim()
            .trim_end_matches('|')
            .rsplit('|')
            .next()
            .unwrap_or_default();
        assert!(
            last.contains(&format!("`{}`", kind.reconciliation.as_str())),
            "kind {}: the row's reconciliation is `{last}`, the registry's `{}`",
            kind.name,
            kind.reconciliation.as_str()
        );
    }
}
