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
