//! The scenarios of the store suite, engine-neutral.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use surety_core::{
    AttemptEvent, AttemptState, IdempotencyKey, JobEvent, JobState, KeyError, TransitionError,
};
use surety_store::{
    AttemptHandle, Created, Finish, Job, JobId, NewJob, Outcome, OwnerId, Slot, StartAttempt,
    Store, StoreError,
};
use surety_tests::{Engine, TestDb};

const LEASE: Duration = Duration::from_secs(60);

fn owner(name: &str) -> OwnerId {
    OwnerId(name.to_owned())
}

fn new_job(owner_name: &str, key: &str, input: Value) -> NewJob {
    NewJob {
        owner: owner(owner_name),
        key: IdempotencyKey::parse(key).unwrap(),
        route: "triage".to_owned(),
        contract: "support-triage".to_owned(),
        contract_digest: "sha256:0000".to_owned(),
        input,
        hedgeable: false,
        kind: surety_store::JobKind::Native,
        messages: None,
        request: None,
        fingerprint: None,
    }
}

fn hedgeable_job(owner_name: &str, key: &str, input: Value) -> NewJob {
    NewJob {
        route: "detect".to_owned(),
        contract: "language-detect".to_owned(),
        hedgeable: true,
        kind: surety_store::JobKind::Native,
        messages: None,
        request: None,
        ..new_job(owner_name, key, input)
    }
}

fn start(provider: &str, slot: Slot) -> StartAttempt {
    StartAttempt {
        provider: provider.to_owned(),
        slot,
        lease: LEASE,
        trust: None,
        charges: Vec::new(),
    }
}

async fn create_new(store: &Store, new: &NewJob) -> Job {
    match store.create_or_replay(new).await.unwrap() {
        Created::New(job) => job,
        other => panic!("expected a new job, got {other:?}"),
    }
}

async fn attempt_state(store: &Store, handle: &AttemptHandle, owner_name: &str) -> AttemptState {
    let attempts = store
        .attempts(&owner(owner_name), &handle.job_id)
        .await
        .unwrap();
    attempts
        .iter()
        .find(|a| a.ordinal == handle.ordinal)
        .unwrap()
        .state
}

/// A refused job transition, from `from` on `event`.
#[track_caller]
fn check_job_refused(error: &StoreError, from: JobState, event: JobEvent) {
    assert!(
        matches!(error, StoreError::Transition(TransitionError::Job { from: f, event: e }) if *f == from && *e == event),
        "expected the job's refusal from {from:?} on {event:?}: {error}"
    );
}

/// A refused attempt transition, from `from` (on `event`, when given).
#[track_caller]
fn check_attempt_refused(error: &StoreError, from: AttemptState, event: Option<AttemptEvent>) {
    assert!(
        matches!(error, StoreError::Transition(TransitionError::Attempt { from: f, event: e })
            if *f == from && event.is_none_or(|event| *e == event)),
        "expected the attempt's refusal from {from:?} on {event:?}: {error}"
    );
}

pub async fn double_click_makes_one_job_and_one_attempt(db: &TestDb) {
    let store = db.store().await;
    let new = new_job(
        "acme",
        "checkout-42",
        json!({"ticket": "My card was charged twice", "n": 1}),
    );
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let mut clicks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let (store, barrier) = (store.clone(), barrier.clone());
        let mut new = new.clone();
        // The same intent, spelled differently by each client.
        new.input = if i % 2 == 0 {
            new.input.clone()
        } else {
            json!({"n": 1.0, "ticket": "My card was charged twice"})
        };
        clicks.spawn(async move {
            barrier.wait().await;
            let created = store.create_or_replay(&new).await.unwrap();
            let job = match &created {
                Created::New(job) | Created::Replayed(job) => job.clone(),
                Created::Conflict => panic!("a replay of the same intent conflicted"),
            };
            // Every click tries to start the work; the database lets one through.
            let started = store
                .start_attempt(&new.owner, &job.id, &start("openai", Slot::Primary))
                .await;
            (matches!(created, Created::New(_)), job.id, started)
        });
    }
    let answers = clicks.join_all().await;
    let ids: BTreeSet<_> = answers.iter().map(|(_, id, _)| id.clone()).collect();
    assert_eq!(ids.len(), 1, "every answer names the same job");
    assert_eq!(
        answers.iter().filter(|(new, _, _)| *new).count(),
        1,
        "one click created the job"
    );
    let started: Vec<_> = answers
        .iter()
        .filter_map(|(_, _, s)| s.as_ref().ok())
        .collect();
    assert_eq!(started.len(), 1, "one attempt started");
    for (_, _, s) in &answers {
        if let Err(e) = s {
            assert!(
                matches!(
                    e,
                    StoreError::AttemptOpen {
                        ordinal: 1,
                        state: AttemptState::Started,
                        ..
                    }
                ),
                "{e}"
            );
        }
    }
    assert_eq!(db.count("SELECT COUNT(*) FROM jobs").await, 1);
    assert_eq!(db.count("SELECT COUNT(*) FROM attempts").await, 1);
}

pub async fn same_key_different_input_conflicts(db: &TestDb) {
    let store = db.store().await;
    let first = create_new(&store, &new_job("acme", "k-1", json!({"amount": 100}))).await;
    let before = db.snapshot().await;

    let created = store
        .create_or_replay(&new_job("acme", "k-1", json!({"amount": 1000})))
        .await
        .unwrap();
    assert!(matches!(created, Created::Conflict), "{created:?}");
    // A different route with the same input is a different intent too.
    let other_route = NewJob {
        route: "refunds".to_owned(),
        ..new_job("acme", "k-1", json!({"amount": 100}))
    };
    assert!(matches!(
        store.create_or_replay(&other_route).await.unwrap(),
        Created::Conflict
    ));

    assert_eq!(db.snapshot().await, before, "the stored job is untouched");
    assert_eq!(store.job(&owner("acme"), &first.id).await.unwrap(), first);
    // The same intent is still a replay, with the same id.
    match store
        .create_or_replay(&new_job("acme", "\"k-1\"", json!({"amount": 100.0})))
        .await
        .unwrap()
    {
        Created::Replayed(job) => assert_eq!(job, first),
        other => panic!("expected a replay, got {other:?}"),
    }
}

pub async fn concurrent_conflicts_are_found_on_the_unique_violation_path(db: &TestDb) {
    let store = db.store().await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(40));
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..40 {
        let (store, barrier) = (store.clone(), barrier.clone());
        let new = new_job("acme", "race-key", json!({"amount": i % 2}));
        clients.spawn(async move {
            barrier.wait().await;
            (i % 2, store.create_or_replay(&new).await.unwrap())
        });
    }
    let answers = clients.join_all().await;
    let winners: Vec<_> = answers
        .iter()
        .filter_map(|(v, c)| matches!(c, Created::New(_)).then_some(*v))
        .collect();
    assert_eq!(winners.len(), 1);
    let winner = winners[0];
    for (v, created) in &answers {
        match created {
            Created::New(_) => {}
            Created::Replayed(job) => {
                assert_eq!(*v, winner);
                assert_eq!(job.input, json!({"amount": winner}));
            }
            Created::Conflict => assert_ne!(*v, winner),
        }
    }
    assert_eq!(
        answers
            .iter()
            .filter(|(_, c)| matches!(c, Created::Conflict))
            .count(),
        20
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM jobs").await, 1);
}

pub async fn timeout_is_unknown_and_blocks_new_attempts_until_a_late_result(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "t-1", json!({"q": "slow"}))).await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store
        .mark_unknown(&a, "no answer within 30 s")
        .await
        .unwrap();

    let job_now = store.job(&acme, &job.id).await.unwrap();
    assert_eq!(
        job_now.state,
        JobState::Unknown,
        "a timeout is unknown, never failed"
    );
    assert_eq!(
        attempt_state(&store, &a, "acme").await,
        AttemptState::Unknown
    );

    let refused = store
        .start_attempt(&acme, &job.id, &start("anthropic", Slot::Primary))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::AttemptOpen {
                ordinal: 1,
                state: AttemptState::Unknown,
                ..
            }
        ),
        "{refused}"
    );
    assert!(refused.to_string().contains("still unknown"), "{refused}");

    // The late result resolves it, and wins.
    let finish = store
        .finish_attempt(&a, Outcome::Succeeded(json!({"answer": 42}).into()))
        .await
        .unwrap();
    let Finish::Won(won) = finish else {
        panic!("expected the late result to win, got {finish:?}")
    };
    assert_eq!(won.state, JobState::Succeeded);
    assert_eq!(won.result, Some(json!({"answer": 42})));
    assert_eq!(won.completed_by, Some(1));
    assert_eq!(won.version, job.version + 1);
    assert_eq!(
        attempt_state(&store, &a, "acme").await,
        AttemptState::Succeeded
    );
    // A succeeded job takes no more attempts.
    let refused = store
        .start_attempt(&acme, &job.id, &start("anthropic", Slot::Primary))
        .await
        .unwrap_err();
    check_job_refused(&refused, JobState::Succeeded, JobEvent::AttemptStarted);
}

pub async fn cancel_resolves_unknown_and_the_late_result_loses(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "t-2", json!({"q": "slow"}))).await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store.mark_unknown(&a, "timed out").await.unwrap();
    assert!(
        store
            .start_attempt(&acme, &job.id, &start("anthropic", Slot::Primary))
            .await
            .is_err()
    );

    store
        .cancel_attempt(
            &acme,
            &job.id,
            a.ordinal,
            "admin: provider confirmed no charge",
        )
        .await
        .unwrap();
    let after_cancel = store.job(&acme, &job.id).await.unwrap();
    assert_eq!(after_cancel.state, JobState::Queued);
    assert_eq!(
        after_cancel.version, job.version,
        "cancelling one attempt does not move the version"
    );

    let b = store
        .start_attempt(&acme, &job.id, &start("anthropic", Slot::Primary))
        .await
        .unwrap();
    assert_eq!(b.ordinal, 2);

    // A's late result arrives: it loses, and stays cancelled.
    let late = store
        .finish_attempt(&a, Outcome::Succeeded(json!({"from": "a"}).into()))
        .await
        .unwrap();
    assert_eq!(late, Finish::Lost { winner: None });
    assert_eq!(
        attempt_state(&store, &a, "acme").await,
        AttemptState::Cancelled
    );
    assert_eq!(
        store.job(&acme, &job.id).await.unwrap().state,
        JobState::Running
    );

    let Finish::Won(won) = store
        .finish_attempt(&b, Outcome::Succeeded(json!({"from": "b"}).into()))
        .await
        .unwrap()
    else {
        panic!("b should win")
    };
    assert_eq!(won.result, Some(json!({"from": "b"})));
    let races = store.races(&acme, &job.id).await.unwrap();
    assert_eq!(races.len(), 1);
    assert_eq!(races[0].loser_ordinal, 1);
    assert!(races[0].reason.contains("cancelled"), "{}", races[0].reason);
    // Cancelling again is a typed refusal.
    let again = store
        .cancel_attempt(&acme, &job.id, a.ordinal, "twice")
        .await
        .unwrap_err();
    check_attempt_refused(
        &again,
        AttemptState::Cancelled,
        Some(AttemptEvent::Cancelled),
    );
}

pub async fn cancelling_one_attempt_leaves_the_other_open_attempt_alone(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(
        &store,
        &hedgeable_job("acme", "h-1", json!({"text": "bonjour"})),
    )
    .await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    let h = store
        .start_attempt(&acme, &job.id, &start("anthropic", Slot::Hedge))
        .await
        .unwrap();
    store.mark_unknown(&a, "timed out").await.unwrap();
    assert_eq!(
        store.job(&acme, &job.id).await.unwrap().state,
        JobState::Running,
        "the hedge still runs"
    );

    store
        .cancel_attempt(&acme, &job.id, a.ordinal, "admin")
        .await
        .unwrap();
    assert_eq!(
        attempt_state(&store, &h, "acme").await,
        AttemptState::Started
    );
    assert_eq!(
        store.job(&acme, &job.id).await.unwrap().state,
        JobState::Running
    );
    let Finish::Won(won) = store
        .finish_attempt(&h, Outcome::Succeeded(json!({"lang": "fr"}).into()))
        .await
        .unwrap()
    else {
        panic!("the hedge should win")
    };
    assert_eq!(won.completed_by, Some(h.ordinal));
}

pub async fn reverse_order_finish_first_finisher_wins(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(
        &store,
        &hedgeable_job("acme", "r-1", json!({"text": "hola"})),
    )
    .await;
    let a = store
        .start_attempt(&acme, &job.id, &start("primary", Slot::Primary))
        .await
        .unwrap();
    let b = store
        .start_attempt(&acme, &job.id, &start("fallback", Slot::Hedge))
        .await
        .unwrap();
    assert_eq!((a.ordinal, b.ordinal), (1, 2));
    assert_eq!(
        a.base_version, b.base_version,
        "starting an attempt does not move the version"
    );

    let Finish::Won(won) = store
        .finish_attempt(&b, Outcome::Succeeded(json!({"lang": "es"}).into()))
        .await
        .unwrap()
    else {
        panic!("b finished first and should win")
    };
    assert_eq!(won.result, Some(json!({"lang": "es"})));

    let late = store
        .finish_attempt(&a, Outcome::Succeeded(json!({"lang": "pt"}).into()))
        .await
        .unwrap();
    assert_eq!(
        late,
        Finish::Lost {
            winner: Some(b.ordinal)
        }
    );
    assert_eq!(attempt_state(&store, &a, "acme").await, AttemptState::Lost);

    let job_now = store.job(&acme, &job.id).await.unwrap();
    assert_eq!(job_now.state, JobState::Succeeded);
    assert_eq!(job_now.result, Some(json!({"lang": "es"})));
    assert_eq!(job_now.completed_by, Some(b.ordinal));
    assert_eq!(
        db.count("SELECT COUNT(*) FROM jobs WHERE result LIKE '%pt%'")
            .await,
        0,
        "the loser's payload is dropped"
    );
    let races = store.races(&acme, &job.id).await.unwrap();
    assert_eq!(races.len(), 1);
    assert_eq!(
        (races[0].loser_ordinal, races[0].winner_ordinal),
        (a.ordinal, Some(b.ordinal))
    );
    // The finished loser cannot finish again.
    let again = store
        .finish_attempt(&a, Outcome::Succeeded(json!({}).into()))
        .await
        .unwrap_err();
    check_attempt_refused(&again, AttemptState::Lost, None);
}

/// What the router answers a waiting request with, without reading the
/// job again: the job and its attempts as the winning commit left them,
/// where the engine reads them in that write (SQLite) — exactly what a
/// read returns afterwards; with a hedge still open, that open attempt too.
pub async fn the_winning_commits_view_is_what_a_read_returns(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let (job, a, b) = primary_and_hedge(&store, "view-1").await;
    let (won, attempts) = store
        .finish_attempt_settled(&b, Outcome::Succeeded(json!({"lang": "es"}).into()))
        .await
        .unwrap();
    let Finish::Won(won) = won else {
        panic!("the hedge should win")
    };
    let (read, read_attempts) = store.job_and_attempts(&acme, &job.id).await.unwrap();
    assert_eq!(*won, read, "the winning commit's job is the job as read");
    // SQLite reads them in the winning write; PostgreSQL returns them from
    // the compare-and-swap statement (nothing changed the job meanwhile).
    let attempts = attempts.expect("the winning write's view of the attempts");
    assert_eq!(attempts, read_attempts);
    let states: Vec<_> = attempts.iter().map(|x| (x.ordinal, x.state)).collect();
    assert_eq!(
        states,
        [
            (a.ordinal, AttemptState::Started),
            (b.ordinal, AttemptState::Succeeded)
        ],
        "the primary is still open: the view says so"
    );
}

/// A new hedgeable job of acme's under `key`, with its primary attempt and
/// a hedge both open.
async fn primary_and_hedge(store: &Store, key: &str) -> (Job, AttemptHandle, AttemptHandle) {
    let hedged = hedgeable_job("acme", key, json!({"text": "hola"}));
    let (Created::New(job), Some(a)) = store
        .create_and_start(&hedged, &start("primary", Slot::Primary))
        .await
        .unwrap()
    else {
        panic!("expected a new job with its first attempt")
    };
    let b = store
        .start_attempt(&owner("acme"), &job.id, &start("fallback", Slot::Hedge))
        .await
        .unwrap();
    (job, a, b)
}

/// Another writer changes the job's attempts and commits while the
/// winning result waits for the job's lock: the view the win returns, if
/// any, is the job as read after it, never the attempts as they were
/// before that writer (on PostgreSQL the statement's snapshot predates the
/// commit it waited for).
pub async fn a_win_that_waited_on_another_writer_returns_no_stale_view(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let (job, a, b) = primary_and_hedge(&store, "view-2").await;
    // The primary fails meanwhile, by hand, held open: the job's row
    // written first, as every writer of the store does.
    let mut other = db.raw.begin().await.unwrap();
    sqlx::query("UPDATE jobs SET version = version")
        .execute(&mut *other)
        .await
        .unwrap();
    let fail = format!(
        "UPDATE attempts SET state = 'failed', error = 'boom', finished_at_ms = 0 WHERE ordinal = {}",
        a.ordinal
    );
    sqlx::query(&fail).execute(&mut *other).await.unwrap();
    let finishing = tokio::spawn({
        let (store, b) = (store.clone(), b.clone());
        async move {
            store
                .finish_attempt_settled(&b, Outcome::Succeeded(json!({"lang": "es"}).into()))
                .await
        }
    });
    if db.engine == surety_tests::Engine::Postgres {
        // Commit only once the result waits on the job's lock.
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *other)
            .await
            .unwrap();
        db.wait_until_blocked_by(pid).await;
    }
    other.commit().await.unwrap();
    let (won, attempts) = finishing.await.unwrap().unwrap();
    let Finish::Won(won) = won else {
        panic!("the hedge should win")
    };
    let (read, read_attempts) = store.job_and_attempts(&acme, &job.id).await.unwrap();
    assert_eq!(*won, read);
    let states: Vec<_> = read_attempts.iter().map(|x| (x.ordinal, x.state)).collect();
    assert_eq!(
        states,
        [
            (a.ordinal, AttemptState::Failed),
            (b.ordinal, AttemptState::Succeeded)
        ]
    );
    if let Some(attempts) = attempts {
        assert_eq!(attempts, read_attempts, "a stale view of the attempts");
    }
}

pub async fn the_schema_refuses_a_second_open_attempt_and_an_unallowed_hedge(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let plain = create_new(&store, &new_job("acme", "s-1", json!({}))).await;
    let hedgeable = create_new(&store, &hedgeable_job("acme", "s-2", json!({}))).await;
    store
        .start_attempt(&acme, &plain.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store
        .start_attempt(&acme, &hedgeable.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store
        .start_attempt(&acme, &hedgeable.id, &start("anthropic", Slot::Hedge))
        .await
        .unwrap();

    // Through the store: typed refusals.
    let refused = store
        .start_attempt(&acme, &plain.id, &start("anthropic", Slot::Hedge))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, StoreError::HedgeRefused { .. }),
        "{refused}"
    );
    let refused = store
        .start_attempt(&acme, &hedgeable.id, &start("gemini", Slot::Hedge))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, StoreError::AttemptOpen { ordinal: 2, .. }),
        "{refused}"
    );

    // Around the store, straight in SQL: the schema itself refuses.
    let before = db.snapshot().await;
    let insert = |job: &JobId, ordinal: i64, slot: i64, hedgeable: i64| {
        format!(
            "INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, base_version, \
             started_at_ms, lease_expires_at_ms) VALUES ('{}', {ordinal}, {slot}, {hedgeable}, 'x', 'started', 0, 0, 0)",
            job.0
        )
    };
    let second_open = db.exec_err(&insert(&plain.id, 9, 0, 0)).await;
    assert!(
        second_open
            .as_database_error()
            .unwrap()
            .is_unique_violation(),
        "{second_open}"
    );
    let hedge_on_plain = db.exec_err(&insert(&plain.id, 9, 1, 0)).await;
    assert!(
        hedge_on_plain.as_database_error().is_some(),
        "{hedge_on_plain}"
    );
    let lying_flag = db.exec_err(&insert(&plain.id, 9, 1, 1)).await;
    assert!(lying_flag.as_database_error().is_some(), "{lying_flag}");
    let third_open = db.exec_err(&insert(&hedgeable.id, 9, 1, 1)).await;
    assert!(
        third_open
            .as_database_error()
            .unwrap()
            .is_unique_violation(),
        "{third_open}"
    );
    let duplicate_key = db.exec_err(
        "INSERT INTO jobs (id, owner_id, idempotency_key, route, contract, contract_digest, input, fingerprint, \
         hedgeable, state, created_at_ms, updated_at_ms) VALUES ('x', 'acme', 's-1', 'r', 'c', 'd', '{}', 'f', 0, 'queued', 0, 0)"
    )
    .await;
    assert!(
        duplicate_key
            .as_database_error()
            .unwrap()
            .is_unique_violation(),
        "{duplicate_key}"
    );
    assert_eq!(db.snapshot().await, before);
}

pub async fn two_owners_same_key_get_two_private_jobs(db: &TestDb) {
    let store = db.store().await;
    let (acme, globex) = (owner("acme"), owner("globex"));
    let a = create_new(&store, &new_job("acme", "shared-key", json!({"x": 1}))).await;
    let g = create_new(&store, &new_job("globex", "shared-key", json!({"x": 1}))).await;
    assert_ne!(a.id, g.id);
    assert_eq!(store.job(&acme, &a.id).await.unwrap().owner, acme);
    assert_eq!(store.job(&globex, &g.id).await.unwrap().owner, globex);

    let before = db.snapshot().await;
    assert!(matches!(
        store.job(&acme, &g.id).await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.job(&globex, &a.id).await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.attempts(&globex, &a.id).await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.races(&globex, &a.id).await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store
            .start_attempt(&globex, &a.id, &start("openai", Slot::Primary))
            .await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.cancel_attempt(&globex, &a.id, 1, "x").await,
        Err(StoreError::JobNotFound(_))
    ));
    assert_eq!(db.snapshot().await, before);
}

pub async fn reaper_turns_expired_leases_unknown_and_late_heartbeats_change_nothing(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "crash-1", json!({}))).await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store.heartbeat(&a, LEASE).await.unwrap();
    assert!(
        store.reap_expired().await.unwrap().is_empty(),
        "a live lease is not reaped"
    );

    // The router died: its lease ran out an hour ago.
    let rewound = db.exec(&format!(
        "UPDATE attempts SET lease_expires_at_ms = lease_expires_at_ms - 3600000 WHERE job_id = '{}'",
        job.id.0
    ))
    .await;
    assert_eq!(rewound, 1);
    let late = store.heartbeat(&a, LEASE).await.unwrap_err();
    assert!(
        matches!(late, StoreError::LeaseExpired { .. }),
        "an expired lease is not renewed: {late}"
    );

    let reaped = store.reap_expired().await.unwrap();
    assert_eq!(reaped.len(), 1);
    assert_eq!(
        (&reaped[0].job_id, reaped[0].ordinal, &reaped[0].owner),
        (&job.id, 1, &acme)
    );
    assert_eq!(
        attempt_state(&store, &a, "acme").await,
        AttemptState::Unknown
    );
    assert_eq!(
        store.job(&acme, &job.id).await.unwrap().state,
        JobState::Unknown,
        "unknown, not failed, not re-run"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM attempts").await, 1);

    let before = db.snapshot().await;
    let late = store.heartbeat(&a, LEASE).await.unwrap_err();
    check_attempt_refused(&late, AttemptState::Unknown, Some(AttemptEvent::Heartbeat));
    assert!(
        store.reap_expired().await.unwrap().is_empty(),
        "reaping twice moves nothing"
    );
    assert_eq!(db.snapshot().await, before);
}

pub async fn two_reapers_move_each_attempt_once(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let mut expected = BTreeSet::new();
    for i in 0..40 {
        let job = create_new(
            &store,
            &new_job("acme", &format!("crash-{i}"), json!({"i": i})),
        )
        .await;
        store
            .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
            .await
            .unwrap();
        expected.insert((job.id, 1));
    }
    db.exec("UPDATE attempts SET lease_expires_at_ms = lease_expires_at_ms - 3600000")
        .await;
    // Two routers, each with its own connections, reap at the same moment.
    let other = db.store().await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let reapers = [store.clone(), other].map(|s| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            barrier.wait().await;
            s.reap_expired().await.unwrap()
        })
    });
    let mut moved = Vec::new();
    for reaper in reapers {
        moved.extend(
            reaper
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.job_id, r.ordinal)),
        );
    }
    let distinct: BTreeSet<_> = moved.iter().cloned().collect();
    assert_eq!(moved.len(), distinct.len(), "an attempt was moved twice");
    assert_eq!(distinct, expected);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM attempts WHERE state = 'unknown'")
            .await,
        40
    );
    assert_eq!(
        db.count("SELECT COUNT(*) FROM jobs WHERE state = 'unknown'")
            .await,
        40
    );
}

pub async fn bad_input_gets_typed_errors_and_changes_nothing(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "ok-key", json!({}))).await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    assert!(matches!(
        store
            .finish_attempt(&a, Outcome::Succeeded(json!({"done": true}).into()))
            .await
            .unwrap(),
        Finish::Won(_)
    ));
    let before = db.snapshot().await;

    // Keys: refused before they can reach the store.
    assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Empty));
    assert_eq!(
        IdempotencyKey::parse(&"k".repeat(256)),
        Err(KeyError::TooLong { len: 256 })
    );
    assert_eq!(
        IdempotencyKey::parse("clé"),
        Err(KeyError::NotPrintableAscii { at: 2 })
    );

    // Unknown job, unknown attempt.
    let nobody = JobId(uuid::Uuid::now_v7().to_string());
    assert!(matches!(
        store.job(&acme, &nobody).await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.attempts(&acme, &nobody).await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store
            .start_attempt(&acme, &nobody, &start("openai", Slot::Primary))
            .await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.cancel_attempt(&acme, &nobody, 1, "x").await,
        Err(StoreError::JobNotFound(_))
    ));
    let ghost = AttemptHandle {
        job_id: nobody,
        ..a.clone()
    };
    assert!(matches!(
        store
            .finish_attempt(&ghost, Outcome::Succeeded(json!({}).into()))
            .await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.mark_unknown(&ghost, "x").await,
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.heartbeat(&ghost, LEASE).await,
        Err(StoreError::AttemptNotFound { .. })
    ));
    let no_attempt = AttemptHandle {
        ordinal: 7,
        ..a.clone()
    };
    for result in [
        store
            .finish_attempt(&no_attempt, Outcome::Succeeded(json!({}).into()))
            .await
            .map(|_| ()),
        store
            .finish_attempt(
                &no_attempt,
                Outcome::Failed {
                    spend: surety_store::Spend::Nothing,
                    error: "x".into(),
                    give_up: false,
                },
            )
            .await
            .map(|_| ()),
        store.mark_unknown(&no_attempt, "x").await,
        store.heartbeat(&no_attempt, LEASE).await,
        store.cancel_attempt(&acme, &job.id, 7, "x").await,
    ] {
        assert!(
            matches!(result, Err(StoreError::AttemptNotFound { ordinal: 7, .. })),
            "{result:?}"
        );
    }

    // Transitions out of terminal states.
    let from_succeeded = [
        (
            store
                .finish_attempt(&a, Outcome::Succeeded(json!({}).into()))
                .await
                .map(|_| ()),
            AttemptEvent::Won,
        ),
        (
            store
                .finish_attempt(
                    &a,
                    Outcome::Failed {
                        spend: surety_store::Spend::Nothing,
                        error: "x".into(),
                        give_up: true,
                    },
                )
                .await
                .map(|_| ()),
            AttemptEvent::Failed,
        ),
        (store.mark_unknown(&a, "x").await, AttemptEvent::TimedOut),
        (store.heartbeat(&a, LEASE).await, AttemptEvent::Heartbeat),
        (
            store.cancel_attempt(&acme, &job.id, a.ordinal, "x").await,
            AttemptEvent::Cancelled,
        ),
    ];
    for (result, event) in from_succeeded {
        let Err(StoreError::Transition(TransitionError::Attempt {
            from,
            event: refused,
        })) = result
        else {
            panic!("expected a refused transition, got {result:?}")
        };
        assert_eq!((from, refused), (AttemptState::Succeeded, event));
    }
    assert!(matches!(
        store
            .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
            .await,
        Err(StoreError::Transition(TransitionError::Job {
            from: JobState::Succeeded,
            ..
        }))
    ));

    // Malformed arguments.
    let invalid = [
        store
            .start_attempt(&acme, &job.id, &start("", Slot::Primary))
            .await
            .map(|_| ()),
        store
            .start_attempt(
                &acme,
                &job.id,
                &StartAttempt {
                    lease: Duration::ZERO,
                    trust: None,
                    charges: Vec::new(),
                    ..start("openai", Slot::Primary)
                },
            )
            .await
            .map(|_| ()),
        store
            .start_attempt(&acme, &job.id, &start(&"p".repeat(300), Slot::Primary))
            .await
            .map(|_| ()),
        store.heartbeat(&a, Duration::ZERO).await,
        store
            .create_or_replay(&NewJob {
                owner: owner(""),
                ..new_job("acme", "other", json!({}))
            })
            .await
            .map(|_| ()),
        store
            .create_or_replay(&NewJob {
                route: "bad\nroute".into(),
                ..new_job("acme", "other", json!({}))
            })
            .await
            .map(|_| ()),
    ];
    for result in invalid {
        assert!(
            matches!(result, Err(StoreError::Invalid { .. })),
            "{result:?}"
        );
    }
    assert_eq!(
        db.snapshot().await,
        before,
        "refused operations changed the database"
    );
    assert!(
        matches!(Store::open("mysql://localhost/x").await, Err(StoreError::UnsupportedUrl(scheme)) if scheme == "mysql")
    );
}

pub async fn a_failure_moves_on_or_gives_up(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "f-1", json!({}))).await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    let failed = Outcome::Failed {
        spend: surety_store::Spend::Nothing,
        error: "HTTP 400: schema rejected".into(),
        give_up: false,
    };
    assert_eq!(
        store.finish_attempt(&a, failed).await.unwrap(),
        Finish::Failed
    );
    assert_eq!(
        store.job(&acme, &job.id).await.unwrap().state,
        JobState::Queued,
        "waiting for the next provider"
    );
    let b = store
        .start_attempt(&acme, &job.id, &start("anthropic", Slot::Primary))
        .await
        .unwrap();
    let gave_up = Outcome::Failed {
        spend: surety_store::Spend::Nothing,
        error: "HTTP 429".into(),
        give_up: true,
    };
    assert_eq!(
        store.finish_attempt(&b, gave_up).await.unwrap(),
        Finish::Failed
    );
    let job_now = store.job(&acme, &job.id).await.unwrap();
    assert_eq!(job_now.state, JobState::Failed);
    assert_eq!(
        job_now.version, job.version,
        "a failure is not a completion"
    );
    let attempts = store.attempts(&acme, &job.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.state).collect::<Vec<_>>(),
        [AttemptState::Failed, AttemptState::Failed]
    );
    assert_eq!(attempts[1].error.as_deref(), Some("HTTP 429"));
    // A retry of a failed job starts a new attempt.
    let c = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    assert_eq!(c.ordinal, 3);
}

pub async fn create_and_start_commits_the_job_and_its_first_attempt_together(db: &TestDb) {
    let store = db.store().await;
    let new = new_job("acme", "click-7", json!({"ticket": "refund please"}));
    let mut clicks = tokio::task::JoinSet::new();
    for _ in 0..30 {
        let (store, new) = (store.clone(), new.clone());
        clicks.spawn(async move {
            store
                .create_and_start(&new, &start("openai", Slot::Primary))
                .await
                .unwrap()
        });
    }
    let answers = clicks.join_all().await;
    let started: Vec<_> = answers
        .iter()
        .filter_map(|(created, handle)| match created {
            Created::New(job) => Some((job, handle.clone().expect("a new job's attempt"))),
            Created::Replayed(_) => {
                assert!(handle.is_none(), "a replay starts nothing");
                None
            }
            Created::Conflict => panic!("the same intent conflicted"),
        })
        .collect();
    assert_eq!(started.len(), 1, "one click created and started the job");
    let (job, handle) = &started[0];
    assert_eq!(job.state, JobState::Running);
    assert_eq!((handle.ordinal, handle.base_version), (1, job.version));
    assert_eq!(db.count("SELECT COUNT(*) FROM attempts").await, 1);
    // The attempt is an ordinary one: it finishes through compare-and-swap.
    let won = store
        .finish_attempt(handle, Outcome::Succeeded(json!({"ok": true}).into()))
        .await
        .unwrap();
    assert!(matches!(won, Finish::Won(_)), "{won:?}");

    // A different intent under the key conflicts and starts nothing; bad
    // input is refused before anything is written.
    let before = db.snapshot().await;
    let other = new_job("acme", "click-7", json!({"ticket": "something else"}));
    let (created, handle) = store
        .create_and_start(&other, &start("openai", Slot::Primary))
        .await
        .unwrap();
    assert!(matches!(created, Created::Conflict) && handle.is_none());
    let fresh = new_job("acme", "click-8", json!({}));
    let refused = store
        .create_and_start(&fresh, &start("", Slot::Primary))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::Invalid {
                field: "provider",
                ..
            }
        ),
        "{refused}"
    );
    let hedge_first = store
        .create_and_start(&fresh, &start("openai", Slot::Hedge))
        .await
        .unwrap_err();
    assert!(
        matches!(hedge_first, StoreError::Invalid { field: "slot", .. }),
        "{hedge_first}"
    );
    assert_eq!(db.snapshot().await, before);
}

/// Many writes at once, half of them refused after they wrote something:
/// each refused write is undone alone, whatever it was committed with.
pub async fn a_refused_write_undoes_only_itself(db: &TestDb) {
    let store = db.store().await;
    let mut jobs = Vec::new();
    for i in 0..24 {
        let new = new_job("acme", &format!("batch-{i}"), json!({"i": i}));
        jobs.push(create_new(&store, &new).await);
    }
    let mut writes = tokio::task::JoinSet::new();
    for (i, job) in jobs.iter().enumerate() {
        // The hedge claims the job (marks it running) and is then refused:
        // the contract has side effects. The claim must be undone.
        let (s, id) = (store.clone(), job.id.clone());
        writes.spawn(async move {
            let refused = s
                .start_attempt(&owner("acme"), &id, &start("b", Slot::Hedge))
                .await;
            (i, "hedge", refused.is_ok())
        });
        if i % 2 == 0 {
            let (s, id) = (store.clone(), job.id.clone());
            writes.spawn(async move {
                let started = s
                    .start_attempt(&owner("acme"), &id, &start("a", Slot::Primary))
                    .await;
                (i, "primary", started.is_ok())
            });
        }
    }
    for (i, kind, ok) in writes.join_all().await {
        assert_eq!(ok, kind == "primary", "job {i}: the {kind} start");
    }
    for (i, job) in jobs.iter().enumerate() {
        let attempts = store.attempts(&owner("acme"), &job.id).await.unwrap();
        let state = store.job(&owner("acme"), &job.id).await.unwrap().state;
        match i % 2 {
            0 => {
                assert_eq!(state, JobState::Running, "job {i}");
                assert_eq!(attempts.len(), 1, "job {i}");
                assert_eq!(attempts[0].provider, "a");
            }
            _ => {
                assert_eq!(
                    state,
                    JobState::Queued,
                    "job {i}: the refused claim was undone"
                );
                assert!(attempts.is_empty(), "job {i}");
            }
        }
    }
}

/// An out-of-band cancel commits while the attempt's result waits for the
/// job's lock: the result must see the cancel and lose, on every engine's
/// path (PostgreSQL's one-statement compare-and-swap included).
pub async fn a_cancel_committed_while_the_result_waits_makes_it_lose(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "race-1", json!({"q": 1}))).await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    // The admin's cancel, by hand, held open: job locked first, as the store does.
    let mut admin = db.raw.begin().await.unwrap();
    let lock = match db.engine {
        surety_tests::Engine::Sqlite => "UPDATE jobs SET version = version",
        surety_tests::Engine::Postgres => "SELECT id FROM jobs FOR UPDATE",
    };
    sqlx::query(lock).execute(&mut *admin).await.unwrap();
    sqlx::query("UPDATE attempts SET state = 'cancelled', finished_at_ms = 0 WHERE ordinal = 1")
        .execute(&mut *admin)
        .await
        .unwrap();
    let finishing = tokio::spawn({
        let (store, a) = (store.clone(), a.clone());
        async move {
            store
                .finish_attempt(&a, Outcome::Succeeded(json!({"late": true}).into()))
                .await
        }
    });
    if db.engine == surety_tests::Engine::Postgres {
        // Commit only once the result waits on the job's lock.
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *admin)
            .await
            .unwrap();
        db.wait_until_blocked_by(pid).await;
    }
    admin.commit().await.unwrap();
    let finish = finishing.await.unwrap().unwrap();
    assert_eq!(finish, Finish::Lost { winner: None });
    let job = store.job(&acme, &job.id).await.unwrap();
    assert_eq!(
        (job.result, job.completed_by),
        (None, None),
        "the cancelled attempt's result was kept"
    );
    assert_eq!(
        attempt_state(&store, &a, "acme").await,
        AttemptState::Cancelled
    );
}

/// Makes the jobs and attempts look `ms` older, as time passing would.
async fn age_everything(db: &TestDb, ms: i64) {
    db.exec(&format!(
        "UPDATE jobs SET updated_at_ms = updated_at_ms - {ms}, created_at_ms = created_at_ms - {ms}"
    ))
    .await;
}

pub async fn retention_prunes_settled_jobs_in_batches_and_never_an_open_one(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let hour = Duration::from_secs(3600);
    // Settled: a success with a lost race, and a failure given up on.
    let raced = create_new(&store, &hedgeable_job("acme", "p-won", json!({"n": 1}))).await;
    let a = store
        .start_attempt(&acme, &raced.id, &start("primary", Slot::Primary))
        .await
        .unwrap();
    let b = store
        .start_attempt(&acme, &raced.id, &start("fallback", Slot::Hedge))
        .await
        .unwrap();
    let won = json!({"lang": "es"});
    store
        .finish_attempt(&a, Outcome::Succeeded(won.clone().into()))
        .await
        .unwrap();
    store
        .finish_attempt(&b, Outcome::Succeeded(json!({"lang": "pt"}).into()))
        .await
        .unwrap();
    let failed = create_new(&store, &new_job("acme", "p-failed", json!({"n": 2}))).await;
    let f = store
        .start_attempt(&acme, &failed.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    let give_up = Outcome::Failed {
        spend: surety_store::Spend::Nothing,
        error: "HTTP 400".into(),
        give_up: true,
    };
    store.finish_attempt(&f, give_up).await.unwrap();
    let cancelled = create_new(&store, &new_job("acme", "p-cancelled", json!({"n": 3}))).await;
    let c = store
        .start_attempt(&acme, &cancelled.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store.mark_unknown(&c, "no answer").await.unwrap();
    store
        .cancel_attempt(&acme, &cancelled.id, c.ordinal, "resolved by hand")
        .await
        .unwrap();
    // Never pruned: a job that may still get an answer, and ones that wait
    // (a cancelled attempt leaves its job queued for the next).
    let unknown = create_new(&store, &new_job("acme", "p-unknown", json!({"n": 4}))).await;
    let u = store
        .start_attempt(&acme, &unknown.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store.mark_unknown(&u, "no answer").await.unwrap();
    let queued = create_new(&store, &new_job("acme", "p-queued", json!({"n": 5}))).await;
    // A success whose hedge may still answer is not over either.
    let hedged = create_new(&store, &hedgeable_job("acme", "p-hedged", json!({"n": 6}))).await;
    let h1 = store
        .start_attempt(&acme, &hedged.id, &start("primary", Slot::Primary))
        .await
        .unwrap();
    store
        .start_attempt(&acme, &hedged.id, &start("fallback", Slot::Hedge))
        .await
        .unwrap();
    store
        .finish_attempt(&h1, Outcome::Succeeded(won.clone().into()))
        .await
        .unwrap();

    assert_eq!(
        store.prune_settled(hour, 10).await.unwrap(),
        0,
        "all recent"
    );
    age_everything(db, 2 * 3600 * 1000).await;
    let recent = create_new(&store, &new_job("acme", "p-recent", json!({"n": 7}))).await;
    let r = store
        .start_attempt(&acme, &recent.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store
        .finish_attempt(&r, Outcome::Succeeded(won.clone().into()))
        .await
        .unwrap();

    // Small batches, oldest first, until nothing past retention is left.
    assert_eq!(store.prune_settled(hour, 1).await.unwrap(), 1);
    assert_eq!(store.prune_settled(hour, 1).await.unwrap(), 1);
    assert_eq!(store.prune_settled(hour, 1).await.unwrap(), 0);
    for gone in [&raced, &failed] {
        assert!(matches!(
            store.job(&acme, &gone.id).await,
            Err(StoreError::JobNotFound(_))
        ));
        assert_eq!(
            db.count(&format!(
                "SELECT COUNT(*) FROM attempts WHERE job_id = '{}'",
                gone.id.0
            ))
            .await,
            0
        );
    }
    assert_eq!(db.count("SELECT COUNT(*) FROM races").await, 0);
    for kept in [&cancelled, &unknown, &queued, &hedged, &recent] {
        assert_eq!(store.job(&acme, &kept.id).await.unwrap().id, kept.id);
    }
    assert_eq!(db.count("SELECT COUNT(*) FROM attempts").await, 5);
    // After retention the key is free again: the same intent is a new job.
    let again = create_new(&store, &hedgeable_job("acme", "p-won", json!({"n": 1}))).await;
    assert_ne!(again.id, raced.id);
    assert_eq!(again.state, JobState::Queued);
}

pub async fn the_attention_queue_lists_unknown_oldest_first_and_failed_newest_first(db: &TestDb) {
    let store = db.store().await;
    let mut made = Vec::new();
    for (owner_name, key) in [("acme", "q-1"), ("acme", "q-2"), ("globex", "q-3")] {
        let job = create_new(&store, &new_job(owner_name, key, json!({"k": key}))).await;
        let a = store
            .start_attempt(&owner(owner_name), &job.id, &start("openai", Slot::Primary))
            .await
            .unwrap();
        made.push((owner_name, job, a));
    }
    // q-1 and q-3 time out; q-2 fails for good.
    store.mark_unknown(&made[0].2, "no answer").await.unwrap();
    store.mark_unknown(&made[2].2, "no answer").await.unwrap();
    let gave_up = Outcome::Failed {
        spend: surety_store::Spend::Nothing,
        error: "HTTP 400".into(),
        give_up: true,
    };
    store.finish_attempt(&made[1].2, gave_up).await.unwrap();
    // q-3 has waited longest.
    db.exec(&format!(
        "UPDATE jobs SET updated_at_ms = updated_at_ms - 60000 WHERE id = '{}'",
        made[2].1.id.0
    ))
    .await;
    let ids = |jobs: &[Job]| jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>();
    let (unknown, failed) = store.attention(None, 10).await.unwrap();
    assert_eq!(ids(&unknown), [made[2].1.id.clone(), made[0].1.id.clone()]);
    assert_eq!(ids(&failed), [made[1].1.id.clone()]);
    let (unknown, failed) = store.attention(Some(&owner("acme")), 10).await.unwrap();
    assert_eq!(
        ids(&unknown),
        [made[0].1.id.clone()],
        "another owner's job is not listed"
    );
    assert_eq!(ids(&failed), [made[1].1.id.clone()]);
    let (unknown, _) = store.attention(None, 1).await.unwrap();
    assert_eq!(ids(&unknown), [made[2].1.id.clone()]);
}

/// Every rule on a row's values holds in the schema itself, whoever
/// writes: straight SQL that breaks one is refused as a check violation
/// and changes nothing. On PostgreSQL the rules on one column are domains
/// (parsed once per connection) and only the rules that tie a row's
/// columns together are table CHECKs, which the server parses again for
/// every row it writes.
pub async fn every_rule_on_a_row_is_the_schemas_own(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "r-1", json!({}))).await;
    store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    let before = db.snapshot().await;
    let long = "k".repeat(256);
    let insert_job = |owner: &str, key: &str, hedgeable: &str, state: &str, result: &str| {
        format!(
            "INSERT INTO jobs (id, owner_id, idempotency_key, route, contract, contract_digest, input, \
             fingerprint, hedgeable, state, result, completed_by, created_at_ms, updated_at_ms) \
             VALUES ('bad', '{owner}', '{key}', 'r', 'c', 'd', '{{}}', 'f', {hedgeable}, '{state}', \
             {result}, NULL, 0, 0)"
        )
    };
    let insert_attempt = |ordinal: &str, slot: &str, provider: &str, state: &str| {
        format!(
            "INSERT INTO attempts (job_id, ordinal, slot, hedgeable, provider, state, base_version, \
             started_at_ms, lease_expires_at_ms) \
             VALUES ('{}', {ordinal}, {slot}, 0, '{provider}', '{state}', 0, 0, 0)",
            job.id.0
        )
    };
    let broken = [
        ("an empty owner", insert_job("", "k", "0", "queued", "NULL")),
        (
            "a long owner",
            insert_job(&long, "k", "0", "queued", "NULL"),
        ),
        (
            "an empty key",
            insert_job("acme", "", "0", "queued", "NULL"),
        ),
        (
            "a long key",
            insert_job("acme", &long, "0", "queued", "NULL"),
        ),
        (
            "a hedgeable of 2",
            insert_job("acme", "k", "2", "queued", "NULL"),
        ),
        (
            "a job state of none",
            insert_job("acme", "k", "0", "done", "NULL"),
        ),
        (
            "a result while queued",
            insert_job("acme", "k", "0", "queued", "'x'"),
        ),
        (
            "a win without a winner",
            insert_job("acme", "k", "0", "succeeded", "'x'"),
        ),
        (
            "an ordinal of 0",
            insert_attempt("0", "0", "openai", "failed"),
        ),
        ("a slot of 2", insert_attempt("7", "2", "openai", "failed")),
        (
            "a hedge on a plain job",
            insert_attempt("7", "1", "openai", "failed"),
        ),
        ("an empty provider", insert_attempt("7", "0", "", "failed")),
        (
            "an attempt state of none",
            insert_attempt("7", "0", "openai", "done"),
        ),
        (
            "a job's state changed to none",
            format!("UPDATE jobs SET state = 'done' WHERE id = '{}'", job.id.0),
        ),
        (
            "an attempt's provider emptied",
            format!(
                "UPDATE attempts SET provider = '' WHERE job_id = '{}'",
                job.id.0
            ),
        ),
    ];
    for (what, sql) in &broken {
        let error = db.exec_err(sql).await;
        let kind = error.as_database_error().map(|e| e.kind());
        assert!(
            matches!(kind, Some(sqlx::error::ErrorKind::CheckViolation)),
            "{what}: {error}"
        );
    }
    assert_eq!(db.snapshot().await, before);
    if db.engine == Engine::Postgres {
        let one_column_checks = db
            .count(
                "SELECT COUNT(*) FROM pg_constraint \
                 WHERE contype = 'c' AND conrelid IN ('jobs'::regclass, 'attempts'::regclass) \
                 AND cardinality(conkey) = 1",
            )
            .await;
        assert_eq!(
            one_column_checks, 0,
            "a rule on one column is a domain's, parsed once per connection, not for every row"
        );
    }
}

/// A job is cancelled only when nothing of it may still run: never while
/// an attempt is started or unknown, always once it is queued or failed
/// with none open; cancelled it stays so, runs nothing more and is never
/// cancelled for another owner.
pub async fn a_job_is_cancelled_only_with_no_attempt_open(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let job = create_new(&store, &new_job("acme", "c-1", json!({"q": "slow"}))).await;
    let a = store
        .start_attempt(&acme, &job.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    let open = |e: &StoreError, want: AttemptState| {
        assert!(
            matches!(e, StoreError::AttemptOpen { ordinal: 1, state, .. } if *state == want),
            "refused for the open attempt ({want:?}): {e}"
        );
    };
    open(
        &store.cancel_job(&acme, &job.id).await.unwrap_err(),
        AttemptState::Started,
    );
    store.mark_unknown(&a, "timed out").await.unwrap();
    open(
        &store.cancel_job(&acme, &job.id).await.unwrap_err(),
        AttemptState::Unknown,
    );
    assert_eq!(
        store.job(&acme, &job.id).await.unwrap().state,
        JobState::Unknown,
        "a refused cancel changes nothing"
    );
    // Another owner cannot see it, let alone cancel it.
    assert!(matches!(
        store.cancel_job(&owner("globex"), &job.id).await,
        Err(StoreError::JobNotFound(_))
    ));
    store
        .cancel_attempt(&acme, &job.id, a.ordinal, "admin: no charge")
        .await
        .unwrap();
    store.cancel_job(&acme, &job.id).await.unwrap();
    store.cancel_job(&acme, &job.id).await.unwrap();
    assert_eq!(
        store.job(&acme, &job.id).await.unwrap().state,
        JobState::Cancelled,
        "cancelled, and cancelling again answers the same"
    );
    assert!(
        store
            .start_attempt(&acme, &job.id, &start("anthropic", Slot::Primary))
            .await
            .is_err(),
        "a cancelled job starts no attempt"
    );

    // A failed job with no attempt open is cancelled; a succeeded one is not.
    let failed = create_new(&store, &new_job("acme", "c-2", json!({}))).await;
    let f = store
        .start_attempt(&acme, &failed.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    let gave_up = Outcome::Failed {
        spend: surety_store::Spend::Nothing,
        error: "HTTP 429".into(),
        give_up: true,
    };
    store.finish_attempt(&f, gave_up).await.unwrap();
    store.cancel_job(&acme, &failed.id).await.unwrap();
    assert_eq!(
        store.job(&acme, &failed.id).await.unwrap().state,
        JobState::Cancelled
    );
    let done = create_new(&store, &new_job("acme", "c-3", json!({}))).await;
    let d = store
        .start_attempt(&acme, &done.id, &start("openai", Slot::Primary))
        .await
        .unwrap();
    store
        .finish_attempt(&d, Outcome::Succeeded(json!({"ok": true}).into()))
        .await
        .unwrap();
    check_job_refused(
        &store.cancel_job(&acme, &done.id).await.unwrap_err(),
        JobState::Succeeded,
        JobEvent::Cancelled,
    );
    assert_eq!(
        store.job(&acme, &done.id).await.unwrap().state,
        JobState::Succeeded
    );
}

/// Deleting a response marks only the owner's Responses job, once; the
/// job and its key stay, so the same intent is replayed, never run again.
pub async fn a_deleted_response_keeps_its_job_and_key(db: &TestDb) {
    let store = db.store().await;
    let acme = owner("acme");
    let responses = NewJob {
        kind: surety_store::JobKind::Responses,
        request: Some(json!({"model": "triage", "input": "hello"})),
        ..new_job("acme", "r-1", json!({"q": "hello"}))
    };
    let job = create_new(&store, &responses).await;
    assert_eq!(job.deleted_at_ms, None);
    let native = create_new(&store, &new_job("acme", "n-1", json!({}))).await;
    assert!(
        !store.delete_response(&acme, &native.id).await.unwrap(),
        "a native job is not a response"
    );
    assert!(
        !store
            .delete_response(&owner("globex"), &job.id)
            .await
            .unwrap(),
        "nor is another owner's"
    );
    assert!(store.delete_response(&acme, &job.id).await.unwrap());
    assert!(
        !store.delete_response(&acme, &job.id).await.unwrap(),
        "deleted once"
    );
    let kept = store.job(&acme, &job.id).await.unwrap();
    assert!(kept.deleted_at_ms.is_some(), "marked deleted: {kept:?}");
    assert_eq!(kept.state, job.state, "nothing else of it moved");
    assert_eq!(
        store.job(&acme, &native.id).await.unwrap().deleted_at_ms,
        None
    );
    match store.create_or_replay(&responses).await.unwrap() {
        Created::Replayed(again) => assert_eq!(again.id, job.id),
        other => panic!("the key still names the job: {other:?}"),
    }
}
