//! Asking a provider afterwards, per kind as the registry says: the id an
//! answer begins with is told before the rest arrives (every kind), and a
//! kind that keeps its answers (`stored-completions`, with `store = true`)
//! gives a lost one back by that id or by the attempt's metadata, while a
//! miss is said to be one and a kind that keeps nothing refuses to be asked.

use surety_fake_provider::{Behavior, FakeProvider, Script};
use surety_providers::kinds::{KINDS, Reconciliation};
use surety_providers::{Found, Lookup, ResponseIds};

use crate::support::{call, json_request, provider_for};

const TICKET: &str = r#"{"category": "billing", "urgent": false}"#;

/// Each kind's adapter tells the id its answer begins with while the rest
/// is still on its way (here, never comes).
#[tokio::test]
async fn every_kind_tells_the_answers_id_before_the_rest_arrives() {
    for kind in KINDS {
        let fake = FakeProvider::start(Script::always(Behavior::LostAfterId(Box::new(
            Behavior::Reply(TICKET.to_owned()),
        ))))
        .await
        .unwrap();
        let provider = provider_for(&fake, kind.name, "");
        let (ids, mut seen) = ResponseIds::channel();
        let request = json_request();
        let call = call(1).telling(ids);
        let chat = provider.chat(&request, &call);
        tokio::pin!(chat);
        let told = tokio::select! {
            told = seen.wait_for(Option::is_some) => told.unwrap().clone(),
            answer = &mut chat => panic!("{}: the answer was lost, yet came: {answer:?}", kind.name),
        };
        let told = told.unwrap();
        assert!(!told.is_empty(), "{}", kind.name);
        // The fake's ids name its call: chatcmpl-fake-1, msg_fake_1, …
        assert!(told.contains('1'), "{}: {told}", kind.name);
    }
}

#[tokio::test]
async fn a_stored_answer_is_found_by_id_and_by_metadata_and_a_miss_is_said() {
    for kind in KINDS {
        let fake = FakeProvider::start(Script::always(Behavior::Reply(TICKET.to_owned())))
            .await
            .unwrap();
        let request = json_request();
        let attempt = call(7).idempotency_key;
        let lookup = |response_id| Lookup {
            request: &request,
            response_id,
            attempt: &attempt,
        };
        if kind.reconciliation == Reconciliation::None {
            let provider = provider_for(&fake, kind.name, "");
            let refused = provider.look_up(lookup(None)).await.unwrap_err();
            assert!(
                refused.message.contains("reconciliation: none"),
                "{}: {refused}",
                kind.name
            );
            assert_eq!(fake.lookups(), 0, "{}: nothing was asked", kind.name);
            continue;
        }
        // Without `store` the kind keeps nothing, and is not asked.
        let plain = provider_for(&fake, kind.name, "");
        assert!(plain.look_up(lookup(None)).await.is_err(), "{}", kind.name);
        plain.chat(&request, &call(7)).await.unwrap();
        assert!(
            fake.stored().is_empty(),
            "{}: nothing stored unless asked",
            kind.name
        );

        let provider = provider_for(&fake, kind.name, "store = true");
        let answered = provider.chat(&request, &call(7)).await.unwrap();
        let stored = fake.stored();
        assert_eq!(stored.len(), 1, "{}", kind.name);
        assert_eq!(
            stored[0]["metadata"]["surety_attempt"], attempt,
            "{}: the attempt's name rides with the stored answer",
            kind.name
        );
        let id = stored[0]["id"].as_str().unwrap().to_owned();
        // The Responses API has no list: without its id a response is not
        // found.
        let by_metadata = kind.reconciliation == Reconciliation::StoredCompletions;
        for by in [Some(id.as_str()), None] {
            match provider.look_up(lookup(by)).await.unwrap() {
                Found::Answered {
                    response,
                    id: found,
                } => {
                    assert!(by.is_some() || by_metadata, "{}", kind.name);
                    assert_eq!(response.json, answered.json, "{}", kind.name);
                    assert_eq!(found.as_deref(), Some(id.as_str()), "{}", kind.name);
                }
                Found::NotFound if by.is_none() && !by_metadata => {}
                other => panic!("{}: by {by:?}: {other:?}", kind.name),
            }
        }
        let other = call(8).idempotency_key;
        let missed = Lookup {
            request: &request,
            response_id: None,
            attempt: &other,
        };
        assert!(
            matches!(provider.look_up(missed).await.unwrap(), Found::NotFound),
            "{}",
            kind.name
        );
        let gone = provider
            .look_up(lookup(Some("chatcmpl-nobody")))
            .await
            .unwrap();
        assert!(matches!(gone, Found::NotFound), "{}: {gone:?}", kind.name);
        assert!(
            fake.lookups() >= 2,
            "{}: asked by id, found and missed",
            kind.name
        );
    }
}
