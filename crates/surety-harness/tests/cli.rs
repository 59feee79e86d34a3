//! `surety-certify` as a user meets it: exit 0 when certified, 1 when
//! certification failed, 2 when the harness could not run; and the
//! manifest's verify and keygen.

#![expect(clippy::unwrap_used, reason = "a test fails on what it did not expect")]

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

    /// `verify --manifest <this workspace's> --require-current`, then `extra`.
    fn verify_args(&self, extra: &[&str]) -> Vec<String> {
        let manifest = self.path("manifest.json").display().to_string();
        let mut args: Vec<String> = ["verify", "--manifest", &manifest, "--require-current"]
            .map(str::to_owned)
            .to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// The same, against this workspace's configuration.
    fn verify_config_args(&self) -> Vec<String> {
        let config = self.path("surety.toml").display().to_string();
        self.verify_args(&["--config", &config])
    }

    /// `certify fake` against `url` (`--override-base-url`).
    async fn certify_at(&self, url: &str) -> Output {
        self.run(&[
            "certify",
            "fake",
            "--override-base-url",
            &format!("fake={url}"),
        ])
        .await
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
    // JUnit names the first check that failed, in the order the checks run
    // (the invented key breaks the schema before the golden snapshot differs).
    let junit = std::fs::read_to_string(ws_bad.path("out/fake/junit.xml")).unwrap();
    assert!(
        junit.contains("<failure message=\"schema (sample 1) failed: schema at ``:"),
        "{junit}"
    );
    assert!(!junit.contains("<failure message=\"golden"), "{junit}");

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
    let verify = ws.verify_args(&["--public-key", public.to_str().unwrap()]);
    let verify: Vec<&str> = verify.iter().map(String::as_str).collect();
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

/// `verify --require-current --config`: an entry whose provider's model,
/// base URL or structured-output mode changed since certification is not
/// current, and the output names the field; restoring the configuration
/// restores it. A run pointed elsewhere with `--override-base-url` is bound
/// to that URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_with_the_config_catches_a_changed_provider() {
    let good = language_fake(false).await;
    let url = good.openai_base_url();
    let ws = Workspace::new(&url, "");
    let out = ws.run(&["certify", "fake", "--accept"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let original = std::fs::read_to_string(ws.path("surety.toml")).unwrap();
    let config = ws.path("surety.toml");
    let verify = ws.verify_config_args();
    let verify: Vec<&str> = verify.iter().map(String::as_str).collect();
    let out = ws.run(&verify).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let changes = [
        (
            "model = \"fake-model\"",
            "model = \"fake-model-v2\"",
            "provider config changed: model fake-model → fake-model-v2",
        ),
        (
            url.as_str(),
            "http://127.0.0.1:9/v1",
            "provider config changed: base_url",
        ),
        (
            "context_window = 16000",
            "context_window = 16000\nstructured_output = [\"json_object\"]",
            "provider config changed: structured_mode json_schema → json_object",
        ),
    ];
    for (from, to, named) in changes {
        std::fs::write(&config, original.replace(from, to)).unwrap();
        let out = ws.run(&verify).await;
        assert_eq!(out.status.code(), Some(1), "{to}: {}", text(&out));
        assert!(text(&out).contains(named), "{named}: {}", text(&out));
    }
    std::fs::write(&config, &original).unwrap();
    let out = ws.run(&verify).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Certified against the fake while the configuration names another URL.
    let elsewhere = Workspace::new("http://127.0.0.1:9/v1", "");
    std::fs::rename(ws.path("golden"), elsewhere.path("golden")).unwrap();
    let out = elsewhere.certify_at(&url).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let entry: Value =
        serde_json::from_str(&std::fs::read_to_string(elsewhere.path("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        entry["entries"][0]["base_url_override"],
        "http://127.0.0.1:9/v1"
    );
    assert_eq!(entry["entries"][0]["provider_config"]["base_url"], url);
    let verify = elsewhere.verify_config_args();
    let verify: Vec<&str> = verify.iter().map(String::as_str).collect();
    let out = elsewhere.run(&verify).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("certified with --override-base-url"),
        "{}",
        text(&out)
    );
}

/// A server that answers `GET /v1/models` and closes every other request
/// unanswered, as llama.cpp's server does when it dies on its first
/// completion.
async fn dies_on_every_completion() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let n = stream.read(&mut head).await.unwrap_or(0);
                if head[..n].starts_with(b"GET /v1/models") {
                    let body = r#"{"object": "list", "data": [{"id": "fake-model"}]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
                // Anything else: closed with no answer.
            });
        }
    });
    url
}

/// A provider that answers no call (a port that refuses every connection,
/// a server that dies on every completion) could not be certified: exit 2
/// naming it unreachable, and the manifest is left exactly as it was (its
/// certified entry is not overwritten by a `failed` one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_provider_exits_2_and_leaves_the_manifest_unchanged() {
    let good = language_fake(false).await;
    let ws = Workspace::new(&good.openai_base_url(), "");
    let out = ws.run(&["certify", "fake", "--accept"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let before = std::fs::read(ws.path("manifest.json")).unwrap();

    let refusing = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1", listener.local_addr().unwrap())
    };
    let dying = dies_on_every_completion().await;
    for url in [refusing, dying] {
        let out = ws.certify_at(&url).await;
        assert_eq!(out.status.code(), Some(2), "{url}: {}", text(&out));
        assert!(text(&out).contains("UNREACHABLE"), "{url}: {}", text(&out));
        assert!(
            text(&out).contains("error: unreachable: fake"),
            "{url}: {}",
            text(&out)
        );
        assert!(!text(&out).contains("FAILED"), "{url}: {}", text(&out));
        assert_eq!(
            std::fs::read(ws.path("manifest.json")).unwrap(),
            before,
            "{url}: the manifest is unchanged"
        );
    }
}
