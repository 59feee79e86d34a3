//! What certification tells people: a terminal summary table, a Markdown
//! report, and JUnit XML for CI.

use std::fmt::Write;

use crate::{ContractResult, Outcome};

/// One line per contract.
pub fn summary_table(provider: &str, results: &[ContractResult]) -> String {
    let mut out = String::new();
    out.push_str("provider       contract               cases stable flaky  fail  status\n");
    for r in results {
        let c = r.counts();
        let status = if r.certified { "CERTIFIED" } else { "FAILED" };
        let _ = writeln!(
            out,
            "{provider:<14} {:<22} {:>5} {:>6} {:>5} {:>5}  {status}",
            r.contract, c.cases, c.stable_pass, c.flaky, c.stable_fail
        );
    }
    out
}

/// The Markdown report: the table, lint warnings, and every failure with its case, sample and check.
pub fn markdown(provider: &str, results: &[ContractResult]) -> String {
    let mut out = format!("# Certification of `{provider}`\n\n");
    out.push_str("| contract | digest | mode | tokenizer | cases | stable-pass | flaky | stable-fail | status |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let c = r.counts();
        let status = if r.certified {
            "**certified**"
        } else {
            "**failed**"
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {status} |",
            r.contract,
            short(&r.digest),
            r.structured_mode,
            r.tokenizer,
            c.cases,
            c.stable_pass,
            c.flaky,
            c.stable_fail
        );
    }
    for r in results {
        let _ = writeln!(out, "\n## {}\n", r.contract);
        if !r.lint.is_empty() {
            out.push_str("Schema capability lint (the answer is validated regardless):\n\n");
            for warning in &r.lint {
                let _ = writeln!(out, "- {warning}");
            }
            out.push('\n');
        }
        out.push_str("| case | outcome | samples passed | failed checks |\n|---|---|---|---|\n");
        for case in &r.cases {
            let passed = case.samples.iter().filter(|s| s.passed()).count();
            let mut failed: Vec<&str> = case
                .checks
                .iter()
                .filter(|c| c.failed())
                .map(|c| c.name)
                .collect();
            for s in &case.samples {
                failed.extend(s.checks.iter().filter(|c| c.failed()).map(|c| c.name));
            }
            failed.sort_unstable();
            failed.dedup();
            let _ = writeln!(
                out,
                "| {} | {} | {passed}/{} | {} |",
                case.name,
                outcome(case.outcome),
                case.samples.len(),
                failed.join(", ")
            );
        }
        let failures = r.failures();
        if !failures.is_empty() {
            out.push_str("\nFailures:\n\n");
            for f in failures {
                let sample = f
                    .sample
                    .map(|s| format!(", sample {s}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "- `{}`{sample}, **{}**: {}",
                    f.case,
                    f.check,
                    f.message.replace('\n', " ")
                );
            }
        }
    }
    out
}

/// JUnit XML: a suite per contract, a test case per contract case.
pub fn junit(provider: &str, results: &[ContractResult]) -> String {
    let mut out = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"surety certify\">\n",
    );
    for r in results {
        let failed = r.cases.iter().filter(|c| !c.passed).count();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" errors=\"0\">",
            xml(&format!("{provider}/{}", r.contract)),
            r.cases.len()
        );
        for case in &r.cases {
            let _ = write!(
                out,
                "    <testcase classname=\"{}\" name=\"{}\"",
                xml(&format!("{provider}.{}", r.contract)),
                xml(&case.name)
            );
            if case.passed {
                out.push_str("/>\n");
                continue;
            }
            out.push_str(">\n");
            let mut messages = Vec::new();
            for c in case.checks.iter().filter(|c| c.failed()) {
                messages.push(format!("{}: {}", c.name, c.message));
            }
            for (i, s) in case.samples.iter().enumerate() {
                for c in s.checks.iter().filter(|c| c.failed()) {
                    messages.push(format!("sample {}: {}: {}", i + 1, c.name, c.message));
                }
            }
            let first = messages
                .first()
                .cloned()
                .unwrap_or_else(|| outcome(case.outcome).to_owned());
            let _ = writeln!(
                out,
                "      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>",
                xml(&first),
                outcome(case.outcome),
                xml(&messages.join("\n"))
            );
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

fn outcome(o: Outcome) -> &'static str {
    match o {
        Outcome::StablePass => "stable-pass",
        Outcome::Flaky => "flaky",
        Outcome::StableFail => "stable-fail",
    }
}

fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}

fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}
