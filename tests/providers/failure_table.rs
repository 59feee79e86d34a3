//! One test per row of the failure table (`surety_providers::failure`),
//! against the fake provider.

use std::time::Duration;

use serde_json::json;
use surety_fake_provider::{Behavior, FakeProvider, Script, When};
use surety_providers::{FailureClass, FailureKind, ProviderError};

use surety_providers::kinds::Support;

use crate::support::{call, json_request, kinds, provider_at, provider_for, row, spec};

const WAIT: Duration = Duration::from_secs(10);

/// Sends one JSON request to a fake that does `behavior`, through the given
/// wire format, and returns the error.
async fn fail_with(kind: &str, behavior: Behavior, extra: &str) -> (ProviderError, FakeProvider) {
    let fake = FakeProvider::start(Script::always(behavior)).await.unwrap();
    let provider = provider_for(&fake, kind, extra);
    let error = provider.chat(&json_request(), &call(1)).await.unwrap_err();
    (error, fake)
}

#[track_caller]
fn check(error: &ProviderError, kind: FailureKind, class: FailureClass, status: Option<u16>) {
    assert_eq!(
        (error.kind, error.class(), error.status),
        (kind, class, status),
        "{error}"
    );
}

fn error_body(kind: &str, message: &str) -> serde_json::Value {
    json!({"error": {"type": kind, "message": message}})
}

#[tokio::test]
async fn refused_before_sending_connection_refused() {
    // A port that was free a moment ago and has nobody listening now.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let provider = provider_at(&format!("http://127.0.0.1:{port}/v1"), "openai", "");
    let error = provider.chat(&json_request(), &call(1)).await.unwrap_err();
    check(&error, FailureKind::NotSent, FailureClass::Definite, None);
}

#[tokio::test]
async fn refused_before_sending_missing_capability() {
    for kind in kinds() {
        let fake = FakeProvider::start(Script::default()).await.unwrap();
        let provider = provider_for(&fake, kind, "");
        // No kind serves a tokenizer unless it is declared.
        let error = provider.tokenize("hello").await.unwrap_err();
        check(&error, FailureKind::NotSent, FailureClass::Definite, None);
        assert!(
            error.message.contains("no tokenize endpoint"),
            "{kind}: {error}"
        );
        if spec(kind).models_endpoint == Support::No {
            let error = provider.served_models().await.unwrap_err();
            check(&error, FailureKind::NotSent, FailureClass::Definite, None);
        }
        assert_eq!(fake.calls(), 0);
    }
}

#[tokio::test]
async fn refused_before_sending_a_seed_the_provider_does_not_take() {
    let seeded = surety_providers::ChatRequest {
        seed: Some(7),
        ..json_request()
    };
    for kind in kinds() {
        let fake = FakeProvider::replying(r#"{"category": "bug", "urgent": true}"#)
            .await
            .unwrap();
        let provider = provider_for(&fake, kind, "");
        match spec(kind).seed {
            // A provider that declares seeds gets it on the wire.
            Support::Yes { default: true } => {
                provider.chat(&seeded, &call(1)).await.unwrap();
                let at = row(spec(kind).kind).seed_at;
                assert_eq!(
                    fake.requests()[0].body.pointer(at),
                    Some(&json!(7)),
                    "{kind}"
                );
            }
            Support::Yes { default: false } | Support::No => {
                let error = provider.chat(&seeded, &call(1)).await.unwrap_err();
                check(&error, FailureKind::NotSent, FailureClass::Definite, None);
                assert!(error.message.contains("seed"), "{kind}: {error}");
                assert_eq!(fake.calls(), 0, "{kind}: nothing was sent");
            }
        }
    }
}

#[tokio::test]
async fn client_errors_are_definite_and_keep_the_servers_message() {
    for status in [400, 401, 403, 404, 422] {
        for kind in kinds() {
            let message = format!("scripted {status} for {kind}");
            let behavior = Behavior::Status {
                status,
                body: error_body("invalid_request_error", &message),
                retry_after: None,
            };
            let (error, fake) = fail_with(kind, behavior, "").await;
            check(
                &error,
                FailureKind::Rejected,
                FailureClass::Definite,
                Some(status),
            );
            assert!(error.message.contains(&message), "{error}");
            assert_eq!(fake.calls(), 1);
        }
    }
}

/// 429, and 503 when it says when: definite, with the Retry-After kept.
#[tokio::test]
async fn rate_limits_and_unavailable_keep_their_retry_after() {
    let cases = [
        (429, "rate_limit_error", FailureKind::RateLimited, 7),
        (503, "overloaded", FailureKind::ServerError, 2),
    ];
    for (status, error_type, failure, seconds) in cases {
        let behavior = Behavior::Status {
            status,
            body: error_body(error_type, "slow down"),
            retry_after: Some(seconds.to_string()),
        };
        for kind in kinds() {
            let (error, _) = fail_with(kind, behavior.clone(), "").await;
            check(&error, failure, FailureClass::Definite, Some(status));
            assert_eq!(
                error.retry_after,
                Some(Duration::from_secs(seconds)),
                "{kind} {status}"
            );
        }
    }
}

/// Every retry signal a provider documents is kept with its refusal: a
/// Retry-After as an HTTP date, Google's `RetryInfo` in the error body, and
/// Anthropic's 529 `overloaded_error` (with or without a header); a 429
/// with no hint keeps none, so the harness backs off on its own.
#[tokio::test]
async fn every_documented_retry_signal_is_kept() {
    let in_a_minute =
        httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(60));
    let retry_info = json!({"error": {
        "code": 429, "status": "RESOURCE_EXHAUSTED", "message": "Please retry in 1s.",
        "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}
        ]
    }});
    // (the refusal, what it is, and the wait kept: within `low..=high` s).
    let refusal =
        |status: u16, body: serde_json::Value, retry_after: Option<String>| Behavior::Status {
            status,
            body,
            retry_after,
        };
    let cases = [
        (
            refusal(
                429,
                error_body("rate_limit_error", "slow down"),
                Some(in_a_minute),
            ),
            FailureKind::RateLimited,
            Some((55, 60)),
        ),
        (
            refusal(429, retry_info, None),
            FailureKind::RateLimited,
            Some((1, 2)),
        ),
        (
            refusal(
                529,
                error_body("overloaded_error", "Overloaded"),
                Some("3".into()),
            ),
            FailureKind::ServerError,
            Some((3, 3)),
        ),
        (
            refusal(429, error_body("rate_limit_error", "slow down"), None),
            FailureKind::RateLimited,
            None,
        ),
    ];
    for (behavior, failure, waited) in cases {
        let Behavior::Status {
            status,
            ref retry_after,
            ..
        } = behavior
        else {
            unreachable!()
        };
        for kind in kinds() {
            let (error, _) = fail_with(kind, behavior.clone(), "").await;
            check(&error, failure, FailureClass::Definite, Some(status));
            let got = error.retry_after.map(|d| d.as_secs_f64());
            match waited {
                Some((low, high)) => assert!(
                    got.is_some_and(|w| w >= low as f64 - 1.0 && w <= high as f64),
                    "{kind} {status} {retry_after:?}: {got:?}"
                ),
                None => assert_eq!(got, None, "{kind}: no hint, none kept"),
            }
        }
    }
}

/// What each finish reason of a kind's table means, through its adapter,
/// and one it does not know: a complete answer is the answer; one cut at
/// the limit is a bad response naming the cut; a filter or refusal
/// (OpenAI's `content_filter` with a complete JSON answer included) is a
/// definite refusal naming the reason; an unknown reason is a definite
/// failure naming it, never an answer.
#[tokio::test]
async fn finish_reasons_are_read_for_what_they_say() {
    use surety_providers::Finish;
    let answer = r#"{"category": "billing", "urgent": false}"#;
    for kind in kinds() {
        let spec = spec(kind);
        let unknown = [("a_reason_from_next_year", Finish::Unknown)];
        for (reason, finish) in spec.finish_reasons.iter().chain(unknown.iter()) {
            let fake = FakeProvider::start(Script::always(Behavior::Finish {
                text: answer.into(),
                reason: (*reason).into(),
            }))
            .await
            .unwrap();
            let provider = provider_for(&fake, kind, "");
            let got = provider.chat(&json_request(), &call(1)).await;
            let what = format!("{kind} {} {reason}", spec.finish_field);
            match (finish, got) {
                (Finish::Complete, Ok(response)) => {
                    assert_eq!(
                        response.json,
                        Some(serde_json::from_str(answer).unwrap()),
                        "{what}"
                    );
                    assert_eq!(response.finish_reason.as_deref(), Some(*reason), "{what}");
                }
                (Finish::Truncated, Err(e)) => {
                    check(&e, FailureKind::BadResponse, FailureClass::Definite, None);
                    assert!(e.message.contains("cut at"), "{what}: {e}");
                }
                (Finish::Refused, Err(e)) => {
                    check(&e, FailureKind::Refused, FailureClass::Definite, None);
                    // Anthropic's `refusal` is named in the model's words.
                    assert!(
                        e.message.contains(reason) || *reason == "refusal",
                        "{what}: {e}"
                    );
                }
                (Finish::Unknown, Err(e)) => {
                    check(&e, FailureKind::BadResponse, FailureClass::Definite, None);
                    assert!(
                        e.message
                            .contains(&format!("{} `{reason}`", spec.finish_field)),
                        "{what}: {e}"
                    );
                }
                (finish, got) => panic!("{what}: {finish:?} answered {got:?}"),
            }
        }
    }
}

/// Anthropic's forced tool, its input cut at `max_tokens`: the cut is
/// named even where what arrived still fits the schema.
#[tokio::test]
async fn a_tool_input_cut_at_max_tokens_is_named() {
    let fake = FakeProvider::start(Script::always(Behavior::Finish {
        text: r#"{"category": "billing", "urgent": false}"#.into(),
        reason: "max_tokens".into(),
    }))
    .await
    .unwrap();
    let provider = provider_for(&fake, "anthropic", "structured_output = [\"tool\"]");
    let error = provider.chat(&json_request(), &call(1)).await.unwrap_err();
    check(
        &error,
        FailureKind::BadResponse,
        FailureClass::Definite,
        None,
    );
    assert!(
        error
            .message
            .contains("the tool input was cut at max_tokens (64"),
        "{error}"
    );
}

/// A thinking model's reasoning is not its answer: the answer is read alone.
#[tokio::test]
async fn a_thinking_models_thoughts_are_not_its_answer() {
    let answer = r#"{"category": "billing", "urgent": false}"#;
    for kind in kinds() {
        let fake = FakeProvider::start(Script::always(Behavior::Thought {
            thought: "The user was charged twice, so: billing. {not json".into(),
            text: answer.into(),
        }))
        .await
        .unwrap();
        let provider = provider_for(&fake, kind, "");
        let response = provider
            .chat(&json_request(), &call(1))
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(
            response.json,
            Some(serde_json::from_str(answer).unwrap()),
            "{kind}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&response.text).unwrap(),
            serde_json::from_str::<serde_json::Value>(answer).unwrap(),
            "{kind}: the text is the answer's alone"
        );
    }
}

/// `behavior`, at every kind, fails as `failure` (of `class`, with
/// `status`), in words that contain `words`.
async fn fails_at_every_kind(
    behavior: Behavior,
    failure: FailureKind,
    class: FailureClass,
    status: Option<u16>,
    words: &str,
) {
    for kind in kinds() {
        let (error, _) = fail_with(kind, behavior.clone(), "").await;
        check(&error, failure, class, status);
        assert!(error.message.contains(words), "{kind}: {error}");
    }
}

#[tokio::test]
async fn a_server_that_answers_it_failed_is_definite() {
    for status in [500, 503, 529] {
        let behavior = Behavior::Status {
            status,
            body: error_body("internal_server_error", "boom"),
            retry_after: None,
        };
        let (failure, class) = (FailureKind::ServerError, FailureClass::Definite);
        fails_at_every_kind(
            behavior,
            failure,
            class,
            Some(status),
            "internal_server_error: boom",
        )
        .await;
    }
}

#[tokio::test]
async fn an_error_object_in_a_200_is_definite_in_the_servers_words() {
    let behavior = Behavior::Status {
        status: 200,
        body: error_body("server_error", "The engine is currently overloaded"),
        retry_after: None,
    };
    let words = "HTTP 200 carrying an error: server_error: The engine is currently overloaded";
    let (failure, class) = (FailureKind::ServerError, FailureClass::Definite);
    fails_at_every_kind(behavior, failure, class, Some(200), words).await;
}

/// Read straight into the format's type: JSON that is no answer (no
/// object at all) is a bad response that says what it should have been,
/// not "not JSON".
#[tokio::test]
async fn a_200_of_json_that_is_no_answer_says_what_it_should_have_been() {
    for body in [json!([1, 2]), json!("fine")] {
        let behavior = Behavior::Status {
            status: 200,
            body: body.clone(),
            retry_after: None,
        };
        for kind in kinds() {
            let (error, _) = fail_with(kind, behavior.clone(), "").await;
            check(
                &error,
                FailureKind::BadResponse,
                FailureClass::Definite,
                None,
            );
            assert!(
                error.message.starts_with("not a ") && !error.message.contains("not JSON"),
                "{kind} {body}: {error}"
            );
        }
    }
}

#[tokio::test]
async fn a_refusal_is_definite_in_the_models_words() {
    let behavior = Behavior::Refuse("I can't assist with that request.".into());
    let words = "the model refused: I can't assist with that request.";
    let (failure, class) = (FailureKind::Refused, FailureClass::Definite);
    fails_at_every_kind(behavior, failure, class, None, words).await;
}

#[tokio::test]
async fn a_response_that_does_not_fit_the_request_is_definite() {
    for kind in kinds() {
        let (error, _) = fail_with(kind, Behavior::MalformedBody, "").await;
        check(
            &error,
            FailureKind::BadResponse,
            FailureClass::Definite,
            Some(200),
        );
        // JSON was asked for; prose came back.
        let prose = Behavior::Reply("Sure! The category is billing.".into());
        let unconstrained = row(spec(kind).kind).unconstrained;
        let (error, _) = fail_with(kind, prose, unconstrained).await;
        check(
            &error,
            FailureKind::BadResponse,
            FailureClass::Definite,
            None,
        );
        assert!(error.message.contains("not JSON"), "{kind}: {error}");
    }
}

#[tokio::test]
async fn a_timeout_after_the_request_left_is_unknown() {
    for kind in kinds() {
        let fake = FakeProvider::start(Script::always(Behavior::Hang))
            .await
            .unwrap();
        let provider = provider_for(&fake, kind, "[providers.fake.timeouts]\nrequest_ms = 300");
        let error = provider.chat(&json_request(), &call(1)).await.unwrap_err();
        check(&error, FailureKind::Timeout, FailureClass::Unknown, None);
        assert!(
            fake.wait_for_calls(1, WAIT).await,
            "{kind}: the request reached the provider"
        );
    }
}

#[tokio::test]
async fn a_reset_mid_body_is_unknown() {
    for kind in kinds() {
        let (error, fake) = fail_with(kind, Behavior::ResetAfter { bytes: 24 }, "").await;
        check(&error, FailureKind::Reset, FailureClass::Unknown, None);
        assert_eq!(fake.calls(), 1);
    }
}

#[tokio::test]
async fn gateway_errors_are_unknown() {
    for status in [502, 504] {
        let behavior = Behavior::Status {
            status,
            body: json!("<html>bad gateway</html>"),
            retry_after: None,
        };
        for kind in kinds() {
            let (error, _) = fail_with(kind, behavior.clone(), "").await;
            check(
                &error,
                FailureKind::Gateway,
                FailureClass::Unknown,
                Some(status),
            );
        }
    }
}

#[tokio::test]
async fn every_call_sends_the_attempts_idempotency_key() {
    for kind in kinds() {
        let fake = FakeProvider::replying(r#"{"category": "billing", "urgent": false}"#)
            .await
            .unwrap();
        let provider = provider_for(&fake, kind, "");
        provider.chat(&json_request(), &call(1)).await.unwrap();
        provider.chat(&json_request(), &call(1)).await.unwrap();
        provider.chat(&json_request(), &call(2)).await.unwrap();
        match spec(kind).idempotency_header {
            Some(_) => {
                assert_eq!(
                    fake.calls_with_key(&call(1).idempotency_key),
                    2,
                    "{kind}: a retry of one attempt reuses its key"
                );
                assert_eq!(fake.calls_with_key(&call(2).idempotency_key), 1, "{kind}");
            }
            // A kind that takes none by default is sent none.
            None => assert!(
                fake.requests().iter().all(|r| r.idempotency_key.is_none()),
                "{kind}"
            ),
        }
    }
}

#[tokio::test]
async fn scripted_answers_come_back_parsed() {
    let script = Script::default().rule(
        When::Model("fake-model".into()),
        Behavior::Reply(r#"{"category": "bug", "urgent": true}"#.into()),
    );
    let fake = FakeProvider::start(script).await.unwrap();
    for kind in kinds() {
        let provider = provider_for(&fake, kind, "");
        let response = provider.chat(&json_request(), &call(1)).await.unwrap();
        assert_eq!(
            response.json,
            Some(json!({"category": "bug", "urgent": true})),
            "{kind}"
        );
        assert_eq!(response.model, "fake-model");
    }
    // Anthropic's forced tool carried the schema.
    let sent = fake
        .requests()
        .into_iter()
        .find(|r| r.format == surety_fake_provider::WireFormat::Anthropic)
        .unwrap()
        .body;
    assert_eq!(
        sent["tool_choice"],
        json!({"type": "tool", "name": "answer"})
    );
    assert_eq!(
        sent["tools"][0]["input_schema"],
        crate::support::ticket_schema()
    );
    assert_eq!(
        sent["system"],
        "Classify the support ticket. Answer with JSON only."
    );
    // Gemini's generation config carried it, and the system prompt went to systemInstruction.
    let sent = fake
        .requests()
        .into_iter()
        .find(|r| r.format == surety_fake_provider::WireFormat::Gemini)
        .unwrap()
        .body;
    assert_eq!(
        sent["generationConfig"]["responseMimeType"],
        "application/json"
    );
    assert_eq!(
        sent["generationConfig"]["responseJsonSchema"],
        crate::support::ticket_schema()
    );
    assert_eq!(
        sent["systemInstruction"]["parts"][0]["text"],
        "Classify the support ticket. Answer with JSON only."
    );
}

#[tokio::test]
async fn a_response_past_its_size_cap_fails_and_is_not_read_on() {
    // 300 MiB of answer, made as it is read.
    let huge = 300 * 1024 * 1024;
    for kind in kinds() {
        let fake = FakeProvider::start(Script::always(Behavior::Huge { bytes: huge }))
            .await
            .unwrap();
        let provider = provider_for(&fake, kind, "max_response_bytes = 1048576");
        let error = provider.chat(&json_request(), &call(1)).await.unwrap_err();
        check(
            &error,
            FailureKind::BadResponse,
            FailureClass::Definite,
            Some(200),
        );
        assert!(
            error
                .message
                .contains("longer than max_response_bytes (1048576 bytes)"),
            "{kind}: {error}"
        );
        // The router stopped reading: what was made is the cap plus buffers, not the body.
        assert!(
            fake.bytes_streamed() < 16 * 1024 * 1024,
            "{kind}: {} bytes were read of {huge}",
            fake.bytes_streamed()
        );
    }
}
