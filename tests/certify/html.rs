//! The HTML certification report, read as text and looked at in Debian's
//! Chromium (headless, from the file, with no server).

use std::path::{Path, PathBuf};

use serde_json::json;
use surety_harness::{RetryBudget, report};

use crate::{fake_config, misbehave, reply};

/// Chromium, as `cargo xtask test` installs it (`SURETY_CHROMIUM`); `None`
/// skips the browser half outside CI.
fn chromium() -> Option<PathBuf> {
    surety_tests::require("SURETY_CHROMIUM", "chromium (the browser half)").map(PathBuf::from)
}

/// Runs headless Chromium on `page` with `args`; its standard output.
fn headless(chromium: &Path, page: &Path, args: &[&str]) -> String {
    // A profile of its own, thrown away: nothing is written to $HOME.
    let profile = tempfile::tempdir().expect("a profile directory");
    let output = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output();
    surety_tests::printed(output, "chromium")
}

/// A failing certification's report shows the failing check and the golden
/// diff of the failing case, and an answer carrying `<script>` is shown as
/// text: in the browser nothing of it runs.
#[tokio::test]
async fn the_html_report_shows_the_failing_check_and_the_golden_diff_and_runs_no_answer() {
    let injected =
        "<script>document.body.setAttribute('data-pwned', 'yes')</script> VAT on every invoice";
    let (result, _, fake) = misbehave("support-triage", "", |case, mut a| {
        if case == "vat-question" {
            a["summary"] = json!(injected);
        }
        reply(&a)
    })
    .await;
    assert!(!result.certified);
    let config = fake_config(&fake, "");
    let retry = RetryBudget::default();
    let about = report::About {
        provider: &config,
        served: None,
        retry: &retry,
    };
    let html = report::html(&about, std::slice::from_ref(&result)).unwrap();
    assert!(
        html.contains("the answers changed from the accepted snapshot"),
        "{html}"
    );
    assert!(!html.contains("<script>"), "an answer's markup is escaped");
    assert!(html.contains("&lt;script&gt;document.body.setAttribute("));
    assert!(
        html.lines()
            .any(|l| l.contains("class=\"add\"") && l.contains("VAT on every invoice")),
        "the diff shows this run's answer as added"
    );
    assert!(
        html.contains("class=\"del\""),
        "and the accepted one as removed"
    );

    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/certify-report");
    std::fs::create_dir_all(&out).unwrap();
    let page = out.join("report.html");
    std::fs::write(&page, &html).unwrap();
    let Some(chromium) = chromium() else {
        return;
    };
    let dom = headless(&chromium, &page, &["--dump-dom"]);
    assert!(dom.contains("Certification of"), "{dom}");
    assert!(
        dom.contains("vat-question — stable-fail"),
        "the failing case is open: {dom}"
    );
    assert!(dom.contains("golden"), "{dom}");
    assert!(
        !dom.contains("data-pwned=\"yes\""),
        "the answer's script ran"
    );
    let shot = out.join("report.png");
    let _ = std::fs::remove_file(&shot);
    headless(
        &chromium,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1280,2000",
        ],
    );
    let png = std::fs::metadata(&shot).expect("a screenshot was written");
    assert!(
        png.len() > 10_000,
        "the screenshot shows a page: {} bytes",
        png.len()
    );
}
