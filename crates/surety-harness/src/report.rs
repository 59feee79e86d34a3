//! What certification tells people: a terminal summary table, a Markdown
//! report, an HTML report that opens as a file (`report.html`, rendered by
//! minijinja with every value escaped), and JUnit XML for CI.

use std::collections::BTreeSet;
use std::fmt::Write;

use surety_providers::ProviderConfig;

use crate::{CaseResult, ContractResult, Outcome, RetryBudget};

/// What the report says of the run beside the results.
#[derive(Debug, Clone, Copy)]
pub struct About<'a> {
    pub provider: &'a ProviderConfig,
    /// The server's model listing, when it has one.
    pub served: Option<&'a [String]>,
    pub retry: &'a RetryBudget,
}

/// The Markdown report with the provider's configuration, the models that
/// answered and the retry policy at the top.
pub fn markdown_about(about: &About<'_>, results: &[ContractResult]) -> String {
    let p = about.provider;
    let mut head = format!(
        "Provider `{}`: {} at {}, configured model `{}`, structured output `{}`, tokenizer `{}`.\n\n",
        p.id,
        p.kind,
        p.base_url,
        p.model,
        p.structured_mode().as_str(),
        p.tokenizer
    );
    let answered: BTreeSet<&str> = results.iter().flat_map(models_of).collect();
    let _ = writeln!(
        head,
        "Models that answered: {}. The server's model listing: {}.\n",
        listed(answered.iter().copied()),
        about
            .served
            .map_or("(no models endpoint)".to_owned(), |s| listed(
                s.iter().map(String::as_str)
            ))
    );
    let _ = writeln!(head, "Transient refusals: {}.\n", about.retry);
    let body = markdown(&p.id, results);
    match body.split_once("\n\n") {
        Some((title, rest)) => format!("{title}\n\n{head}{rest}"),
        None => format!("{body}{head}"),
    }
}

fn models_of(result: &ContractResult) -> impl Iterator<Item = &str> {
    result
        .cases
        .iter()
        .flat_map(|c| &c.samples)
        .filter_map(|s| s.response_model.as_deref())
}

/// The models that answered a contract's samples, listed once each.
fn answered_by(r: &ContractResult) -> String {
    let answered: BTreeSet<&str> = models_of(r).collect();
    listed(answered.into_iter())
}

/// How many transient refusals a contract's samples retried.
fn retried(r: &ContractResult) -> usize {
    r.cases
        .iter()
        .flat_map(|c| &c.samples)
        .map(|s| s.retries.len())
        .sum()
}

fn listed<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.map(|i| format!("`{i}`")).collect();
    match items.is_empty() {
        true => "(none)".to_owned(),
        false => items.join(", "),
    }
}

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

/// The names of the checks that failed in a case, once each.
fn failed_checks(case: &CaseResult) -> Vec<&'static str> {
    let mut failed: Vec<&str> = case
        .checks
        .iter()
        .chain(case.samples.iter().flat_map(|s| &s.checks))
        .filter(|c| c.failed())
        .map(|c| c.name)
        .collect();
    failed.sort_unstable();
    failed.dedup();
    failed
}

/// The HTML report: the summary matrix, then per contract and case every
/// check with what it found, the golden diff, and every sample's checks
/// and answer. Every value is escaped (model output included); no script.
pub fn html(about: &About<'_>, results: &[ContractResult]) -> Result<String, minijinja::Error> {
    let p = about.provider;
    let answered: BTreeSet<&str> = results.iter().flat_map(models_of).collect();
    let contracts: Vec<serde_json::Value> = results.iter().map(contract_view).collect();
    let context = serde_json::json!({
        "provider": {
            "id": p.id, "kind": p.kind.to_string(), "base_url": p.base_url, "model": p.model,
            "mode": p.structured_mode().as_str(), "tokenizer": p.tokenizer.to_string(),
        },
        "certified": !results.is_empty() && results.iter().all(|r| r.certified),
        "answered": listed(answered.iter().copied()).replace('`', ""),
        "served": about.served.map_or("(no models endpoint)".to_owned(), |s| {
            listed(s.iter().map(String::as_str)).replace('`', "")
        }),
        "retry": about.retry.to_string(),
        "contracts": contracts,
    });
    let mut env = minijinja::Environment::new();
    // `.html`: minijinja escapes every value it prints.
    env.add_template("report.html", include_str!("report.html"))?;
    env.get_template("report.html")?.render(context)
}

fn contract_view(r: &ContractResult) -> serde_json::Value {
    let c = r.counts();
    let cases: Vec<serde_json::Value> = r
        .cases
        .iter()
        .map(|case| {
            let samples: Vec<serde_json::Value> = case
                .samples
                .iter()
                .map(|s| {
                    let answer = match (&s.output, &s.raw) {
                        (Some(output), _) => {
                            serde_json::to_string_pretty(output).unwrap_or_default()
                        }
                        (None, Some(raw)) => raw.clone(),
                        (None, None) => "(no answer)".to_owned(),
                    };
                    serde_json::json!({
                        "passed": s.passed(),
                        "failed": s.checks.iter().filter(|c| c.failed()).collect::<Vec<_>>(),
                        "latency_ms": s.latency_ms,
                        "prompt_tokens": s.prompt_tokens,
                        "completion_tokens": s.completion_tokens,
                        "model": s.response_model,
                        "retries": s.retries,
                        "answer": answer,
                    })
                })
                .collect();
            let diff: Option<Vec<serde_json::Value>> = case.golden_diff.as_ref().map(|d| {
                d.lines()
                    .map(|line| {
                        let kind = match line.as_bytes().first() {
                            Some(b'+') if !line.starts_with("+++") => "add",
                            Some(b'-') if !line.starts_with("---") => "del",
                            Some(b'@') => "hunk",
                            _ => "same",
                        };
                        serde_json::json!({"kind": kind, "text": line})
                    })
                    .collect()
            });
            serde_json::json!({
                "name": case.name,
                "outcome": outcome(case.outcome),
                "passed": case.passed,
                "passed_samples": case.samples.iter().filter(|s| s.passed()).count(),
                "samples": samples,
                "checks": case.checks,
                "failed_checks": failed_checks(case),
                "golden_diff": diff,
            })
        })
        .collect();
    serde_json::json!({
        "id": r.contract,
        "digest": short(&r.digest),
        "mode": r.structured_mode,
        "tokenizer": r.tokenizer,
        "certified": r.certified,
        "answered": answered_by(r).replace('`', ""),
        "retried": retried(r),
        "lint": r.lint,
        "counts": {"cases": c.cases, "stable_pass": c.stable_pass, "flaky": c.flaky, "stable_fail": c.stable_fail},
        "cases": cases,
    })
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
        let _ = writeln!(
            out,
            "Answered by {}; {} transient refusals retried.\n",
            answered_by(r),
            retried(r)
        );
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
            let failed = failed_checks(case);
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

/// JUnit XML (through `quick-junit`): a suite per contract, a test case per
/// contract case; a case that did not pass is a failure whose type is its
/// outcome, whose message is the first check that failed (in the order the
/// checks run), and whose text is every failed check.
pub fn junit(provider: &str, results: &[ContractResult]) -> String {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("surety certify");
    for r in results {
        let mut suite = TestSuite::new(format!("{provider}/{}", r.contract));
        for case in &r.cases {
            let status = match case.passed {
                true => TestCaseStatus::success(),
                false => {
                    let messages = failures_in_order(case);
                    let first = messages
                        .first()
                        .map(|m| match m.split_once(": ") {
                            Some((check, text)) => format!("{check} failed: {text}"),
                            None => m.clone(),
                        })
                        .unwrap_or_else(|| outcome(case.outcome).to_owned());
                    let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                    status
                        .set_message(first)
                        .set_type(outcome(case.outcome))
                        .set_description(messages.join("\n"));
                    status
                }
            };
            let mut test = TestCase::new(case.name.clone(), status);
            test.set_classname(format!("{provider}.{}", r.contract));
            suite.add_test_case(test);
        }
        report.add_test_suite(suite);
    }
    // Writing to memory fails only on a bug in the writer.
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- the JUnit report could not be written: {e} -->\n"))
}

/// A case's failed checks as `check (sample N): message`, in the order the
/// checks run: render and tokenizer, then each sample's, then golden and
/// determinism.
fn failures_in_order(case: &CaseResult) -> Vec<String> {
    let before = |name: &str| matches!(name, "render" | "tokenizer");
    let mut messages: Vec<String> = case
        .checks
        .iter()
        .filter(|c| c.failed() && before(c.name))
        .map(|c| format!("{}: {}", c.name, c.message))
        .collect();
    for (i, s) in case.samples.iter().enumerate() {
        for c in s.checks.iter().filter(|c| c.failed()) {
            messages.push(format!("{} (sample {}): {}", c.name, i + 1, c.message));
        }
    }
    messages.extend(
        case.checks
            .iter()
            .filter(|c| c.failed() && !before(c.name))
            .map(|c| format!("{}: {}", c.name, c.message)),
    );
    messages
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
