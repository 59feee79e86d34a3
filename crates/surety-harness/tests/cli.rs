//! `surety-certify` as a user meets it: exit 0 when certified, 1 when
//! certification failed, 2 when the harness could not run; and the
//! manifest's verify and keygen.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use surety_fake_provider::{Behavior, FakeProvider, Script, When};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fake that answers every language-detect case right (or `wrong`ly).
async fn language_fake(wrong: bool) -> FakeProvider {
    let answers: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/data/fake-answers.json")).unwrap(),
    )
    .unwrap();
    let cases: toml::Table = toml::from_str(
        &std::fs::read_to_string(repo().join("contracts/language-detect/cases.toml")).unwrap(),
    )
    .unwrap();
    let mut script = Script::default();
    for case in cases["case"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let text = case["input"]["text"].as_str().unwrap();
        let answer = if wrong {
            serde_json::json!({"language": "english", "confidence": 1})
        } else {
            answers["language-detect"][name].clone()
        };
        script = script.rule(
            When::PromptContains(text.to_owned()),
            Behavior::Reply(answer.to_string()),
        );
    }
    FakeProvider::start(script).await.unwrap()
}

struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new(base_url: &str, extra: &str) -> Workspace {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "[providers.fake]\nkind = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"fake-model\"\n\
             tokenizer = \"tiktoken:o200k_base\"\ncontext_window = 16000\n{extra}\n\
             [routes.language]\ncontract = \"language-detect\"\nproviders = [\"fake\"]\n"
        );
        std::fs::write(dir.path().join("surety.toml"), config).unwrap();
        Workspace { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn run(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_surety-certify"));
        command.args(args);
        for (flag, name) in [
            ("--config", "surety.toml"),
            ("--golden", "golden"),
            ("--manifest", "manifest.json"),
            ("--out", "out"),
        ] {
            if args.first() == Some(&"certify") {
                command.arg(flag).arg(self.path(name));
            }
        }
        if args.first() != Some(&"keygen") {
            command.arg("--contracts").arg(repo().join("contracts"));
        }
        command
            .env_remove("SURETY_TEST_MISSING_KEY")
            .output()
            .await
            .unwrap()
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_say_certified_failed_or_could_not_run() {
    let good = language_fake(false).await;
    let ws = Workspace::new(&good.openai_base_url(), "");
    let out = ws.run(&["certify", "fake", "--accept"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("CERTIFIED"), "{}", text(&out));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(ws.path("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["entries"][0]["status"], "certified");
    assert!(ws.path("out/fake/report.md").is_file() && ws.path("out/fake/junit.xml").is_file());

    // The same provider now answers wrong: certification fails, exit 1, and the report says why.
    let bad = language_fake(true).await;
    let ws_bad = Workspace::new(&bad.openai_base_url(), "");
    std::fs::rename(ws.path("golden"), ws_bad.path("golden")).unwrap();
    let out = ws_bad.run(&["certify", "fake"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = std::fs::read_to_string(ws_bad.path("out/fake/report.md")).unwrap();
    assert!(
        report.contains("rule: no invented top-level keys") && report.contains("**facts**"),
        "{report}"
    );

    // No API key: exit 2, naming the variable.
    let ws_key = Workspace::new(
        &good.openai_base_url(),
        "api_key_env = \"SURETY_TEST_MISSING_KEY\"",
    );
    let out = ws_key.run(&["certify", "fake"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("the environment variable SURETY_TEST_MISSING_KEY is not set"),
        "{}",
        text(&out)
    );
    assert!(
        !ws_key.path("manifest.json").exists(),
        "nothing is written when the harness cannot run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_manifest_verifies_and_a_tampered_one_does_not() {
    let good = language_fake(false).await;
    let ws = Workspace::new(&good.openai_base_url(), "");
    let keygen = ws
        .run(&["keygen", "--out", ws.path("signing").to_str().unwrap()])
        .await;
    assert_eq!(keygen.status.code(), Some(0), "{}", text(&keygen));
    let key = ws.path("signing.key");
    let out = ws
        .run(&[
            "certify",
            "fake",
            "--accept",
            "--signing-key",
            key.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let manifest = ws.path("manifest.json");
    let public = ws.path("signing.pub");
    let verify = [
        "verify",
        "--manifest",
        manifest.to_str().unwrap(),
        "--public-key",
        public.to_str().unwrap(),
        "--require-current",
    ];
    let out = ws.run(&verify).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("signature: valid"));

    let original = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        original.replace("\"stable_fail\": 0", "\"stable_fail\": 1"),
    )
    .unwrap();
    let out = ws.run(&verify).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("REFUSED: the manifest's signature does not verify"),
        "{}",
        text(&out)
    );
}
