//! Budgets, per engine: each attempt's worst case is reserved in the
//! transaction that writes it, held while it is open (unknown too), and
//! settled to what it cost when it ends.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use surety_core::IdempotencyKey;
use surety_store::{
    Answer, AttemptHandle, Charge, Cost, Created, Finish, NewJob, Outcome, OwnerId, Slot, Spend,
    StartAttempt, Store, StoreError, Unit,
};
use surety_tests::{Engine, TestDb};

const LEASE: Duration = Duration::from_secs(60);

fn job(owner: &str, key: &str) -> NewJob {
    NewJob {
        owner: OwnerId(owner.to_owned()),
        key: IdempotencyKey::parse(key).unwrap(),
        route: "triage".to_owned(),
        contract: "support-triage".to_owned(),
        contract_digest: "sha256:0000".to_owned(),
        input: json!({"key": key}),
        hedgeable: false,
        kind: surety_store::JobKind::Native,
        messages: None,
        request: None,
        fingerprint: None,
    }
}

/// A charge of `amount` tokens of budget `budget`, limited to `limit`, its
/// spend counted from bucket 0 on and recorded in bucket 0.
fn charge(budget: &str, amount: i64, limit: i64) -> Charge {
    Charge {
        budget: budget.to_owned(),
        unit: Unit::Tokens,
        amount,
        limit: Some(limit),
        counts_from_ms: 0,
        bucket_ms: 0,
    }
}

fn start(charges: Vec<Charge>) -> StartAttempt {
    StartAttempt {
        provider: "openai".to_owned(),
        slot: Slot::Primary,
        lease: LEASE,
        trust: None,
        charges,
    }
}

/// A new job and its first attempt, or the store's refusal.
async fn admit(
    store: &Store,
    key: &str,
    charges: Vec<Charge>,
) -> Result<AttemptHandle, StoreError> {
    admit_as(store, "acme", key, charges).await
}

async fn admit_as(
    store: &Store,
    owner: &str,
    key: &str,
    charges: Vec<Charge>,
) -> Result<AttemptHandle, StoreError> {
    match store
        .create_and_start(&job(owner, key), &start(charges))
        .await?
    {
        (Created::New(_), Some(handle)) => Ok(handle),
        other => panic!("a new key made {other:?}"),
    }
}

fn answer(tokens: i64) -> Outcome {
    Outcome::Succeeded(Answer {
        cost: Some(Cost {
            micros: tokens * 2,
            tokens,
        }),
        ..Answer::from(json!({"ok": true}))
    })
}

#[track_caller]
fn over_budget(result: Result<AttemptHandle, StoreError>, budget: &str) -> (i64, i64) {
    match result {
        Err(StoreError::OverBudget {
            budget: b,
            spent,
            held,
            ..
        }) if b == budget => (spent, held),
        other => panic!("expected budget `{budget}` to refuse, got {other:?}"),
    }
}

/// 200 jobs at once, each of which may cost a tenth of the budget: exactly
/// ten are admitted, on one store or on two sharing the database (two
/// replicas: the database arbitrates, not a replica's memory).
pub async fn two_hundred_at_once_admit_exactly_ten(db: &TestDb) {
    let replicas = match db.engine {
        Engine::Sqlite => vec![db.store().await],
        Engine::Postgres => vec![db.store().await, db.store().await],
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(200));
    let mut storm = tokio::task::JoinSet::new();
    for n in 0..200 {
        let (store, barrier) = (replicas[n % replicas.len()].clone(), barrier.clone());
        storm.spawn(async move {
            barrier.wait().await;
            admit(
                &store,
                &format!("storm-{n}"),
                vec![charge("acme-day", 100, 1_000)],
            )
            .await
        });
    }
    let (mut admitted, mut refused) = (Vec::new(), 0);
    while let Some(result) = storm.join_next().await {
        match result.unwrap() {
            Ok(handle) => admitted.push(handle),
            Err(e) => {
                over_budget(Err(e), "acme-day");
                refused += 1;
            }
        }
    }
    assert_eq!((admitted.len(), refused), (10, 190));
    let store = &replicas[0];
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!((status.held, status.spent), (1_000, 0));
    // A refused job left nothing: only the admitted have rows.
    assert_eq!(db.count("SELECT COUNT(*) FROM jobs").await, 10);
    assert_eq!(db.count("SELECT COUNT(*) FROM reservations").await, 10);
    for handle in &admitted {
        store.finish_attempt(handle, answer(100)).await.unwrap();
    }
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!((status.held, status.spent), (0, 1_000));
    over_budget(
        admit(store, "after", vec![charge("acme-day", 1, 1_000)]).await,
        "acme-day",
    );
}

/// An answer that used less than its worst case frees the rest at once: a
/// A budget no attempt reserved of yet, beside one in use: the attempt
/// holds both, or, where one has no room, neither.
pub async fn a_new_budget_beside_one_in_use_is_held_with_it_or_neither(db: &TestDb) {
    let store = db.store().await;
    admit(&store, "first", vec![charge("acme-day", 100, 1_000)])
        .await
        .unwrap();
    let both = vec![
        charge("acme-day", 100, 1_000),
        charge("acme-key", 50, 1_000),
    ];
    admit(&store, "second", both).await.unwrap();
    let day = store.budget("acme-day", 0).await.unwrap();
    let key = store.budget("acme-key", 0).await.unwrap();
    assert_eq!((day.held, key.held), (200, 50));
    // The new one without room: neither is held, and it is the one named.
    let refused = admit(
        &store,
        "third",
        vec![charge("acme-day", 100, 1_000), charge("acme-new", 50, 10)],
    )
    .await;
    over_budget(refused, "acme-new");
    assert_eq!(store.budget("acme-day", 0).await.unwrap().held, 200);
    assert_eq!(store.budget("acme-new", 0).await.unwrap().held, 0);
}

/// A crowd that fits, with keys sent twice at once: each new attempt
/// reserves of both its budgets once (PostgreSQL takes such a crowd in
/// batches, their reservations held together), a replay reserves nothing,
/// and their answers, settled together, spend what each cost and free the
/// rest.
pub async fn a_crowd_that_fits_is_reserved_and_settled_once_each(db: &TestDb) {
    let store = db.store().await;
    let charges = || {
        vec![
            charge("acme-day", 10, 100_000),
            charge("acme-hour", 5, 100_000),
        ]
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(96));
    let mut crowd = tokio::task::JoinSet::new();
    for n in 0..96 {
        let (store, barrier, charges) = (store.clone(), barrier.clone(), charges());
        crowd.spawn(async move {
            barrier.wait().await;
            store
                .create_and_start(&job("acme", &format!("crowd-{}", n % 80)), &start(charges))
                .await
        });
    }
    let mut admitted = Vec::new();
    while let Some(created) = crowd.join_next().await {
        if let (Created::New(_), Some(handle)) = created.unwrap().unwrap() {
            admitted.push(handle);
        }
    }
    assert_eq!(admitted.len(), 80, "one job per key");
    for (budget, each) in [("acme-day", 10), ("acme-hour", 5)] {
        let status = store.budget(budget, 0).await.unwrap();
        assert_eq!((status.held, status.spent), (80 * each, 0), "{budget}");
    }
    let mut answers = tokio::task::JoinSet::new();
    for handle in admitted {
        let store = store.clone();
        answers.spawn(async move { store.finish_attempt_settled(&handle, answer(3)).await });
    }
    while let Some(finished) = answers.join_next().await {
        assert!(matches!(finished.unwrap().unwrap().0, Finish::Won(_)));
    }
    for budget in ["acme-day", "acme-hour"] {
        let status = store.budget(budget, 0).await.unwrap();
        assert_eq!((status.held, status.spent), (0, 80 * 3), "{budget}");
    }
}

/// job refused before the settlement is admitted after it.
pub async fn an_answer_settles_to_its_usage_and_frees_the_rest(db: &TestDb) {
    let store = db.store().await;
    let a = admit(&store, "a", vec![charge("acme-day", 600, 1_000)])
        .await
        .unwrap();
    let before = db.snapshot().await;
    let (spent, held) = over_budget(
        admit(&store, "b", vec![charge("acme-day", 600, 1_000)]).await,
        "acme-day",
    );
    assert_eq!((spent, held), (0, 600));
    assert_eq!(db.snapshot().await, before, "a refused job changes nothing");
    store.finish_attempt(&a, answer(250)).await.unwrap();
    admit(&store, "b", vec![charge("acme-day", 600, 1_000)])
        .await
        .unwrap();
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!((status.spent, status.held), (250, 600));
    let reserved = store
        .reservations(&OwnerId("acme".to_owned()), &a.job_id)
        .await
        .unwrap();
    assert_eq!(reserved.len(), 1);
    assert_eq!((reserved[0].amount, reserved[0].spent), (600, Some(250)));
}

/// An unknown attempt keeps its reservation; its late answer settles it to
/// its real usage; a definite failure frees all of it; an operator's cancel
/// of an unknown one spends its worst case (it may have been billed).
pub async fn an_unknown_attempt_holds_its_reservation_until_resolved(db: &TestDb) {
    let store = db.store().await;
    let budget = || vec![charge("acme-day", 600, 1_000)];
    let a = admit(&store, "a", budget()).await.unwrap();
    store.mark_unknown(&a, "timed out").await.unwrap();
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!((status.held, status.held_by_unknown), (600, 600));
    over_budget(admit(&store, "b", budget()).await, "acme-day");
    // The late answer: 300 used.
    store.finish_attempt(&a, answer(300)).await.unwrap();
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!(
        (status.spent, status.held, status.held_by_unknown),
        (300, 0, 0)
    );
    // A definite failure frees all it held.
    let b = admit(&store, "b", budget()).await.unwrap();
    store
        .finish_attempt(
            &b,
            Outcome::Failed {
                spend: Spend::Nothing,
                error: "refused".to_owned(),
                give_up: true,
            },
        )
        .await
        .unwrap();
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!((status.spent, status.held), (300, 0));
    // Cancelled while unknown: the worst case is spent.
    let c = admit(&store, "c", vec![charge("acme-day", 700, 1_000)])
        .await
        .unwrap();
    store.mark_unknown(&c, "timed out").await.unwrap();
    store
        .cancel_attempt(
            &OwnerId("acme".to_owned()),
            &c.job_id,
            c.ordinal,
            "operator",
        )
        .await
        .unwrap();
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!((status.spent, status.held), (1_000, 0));
    // Its late answer now loses and settles nothing twice.
    store.finish_attempt(&c, answer(10)).await.unwrap();
    assert_eq!(store.budget("acme-day", 0).await.unwrap().spent, 1_000);
}

/// A key's budget counts inside its owner's: exhausting the key's refuses
/// that key's jobs (naming the key's budget) and leaves the owner's other
/// keys served; a refused job holds nothing of the owner's.
pub async fn a_keys_budget_counts_inside_its_owners(db: &TestDb) {
    let store = db.store().await;
    let key_a = |amount| {
        vec![
            charge("acme", amount, 1_000),
            charge("acme/key-a", amount, 300),
        ]
    };
    let key_b = |amount| vec![charge("acme", amount, 1_000)];
    admit(&store, "a1", key_a(200)).await.unwrap();
    over_budget(admit(&store, "a2", key_a(200)).await, "acme/key-a");
    assert_eq!(store.budget("acme", 0).await.unwrap().held, 200);
    admit(&store, "b1", key_b(500)).await.unwrap();
    admit(&store, "b2", key_b(300)).await.unwrap();
    over_budget(admit(&store, "b3", key_b(1)).await, "acme");
    // Another owner's budget is its own.
    admit_as(&store, "globex", "g1", vec![charge("globex", 900, 1_000)])
        .await
        .unwrap();
}

/// A failover attempt reserves as the first did: over the budget it is not
/// started, and its job stays queued for a later try.
pub async fn a_failover_attempt_over_budget_is_not_started(db: &TestDb) {
    let store = db.store().await;
    let owner = OwnerId("acme".to_owned());
    let a = admit(&store, "a", vec![charge("acme-day", 400, 1_000)])
        .await
        .unwrap();
    store
        .finish_attempt(
            &a,
            Outcome::Failed {
                spend: Spend::Nothing,
                error: "5xx".to_owned(),
                give_up: false,
            },
        )
        .await
        .unwrap();
    admit(&store, "other", vec![charge("acme-day", 800, 1_000)])
        .await
        .unwrap();
    let next = StartAttempt {
        provider: "anthropic".to_owned(),
        ..start(vec![charge("acme-day", 400, 1_000)])
    };
    let refused = store.start_attempt(&owner, &a.job_id, &next).await;
    assert!(
        matches!(refused, Err(StoreError::OverBudget { .. })),
        "{refused:?}"
    );
    let job = store.job(&owner, &a.job_id).await.unwrap();
    assert_eq!(job.state, surety_core::JobState::Queued);
    assert_eq!(store.attempts(&owner, &a.job_id).await.unwrap().len(), 1);
}

/// Spend counts only from the bucket the budget's period begins at: what
/// the day before spent is not today's; what is held counts whatever its
/// bucket. Pruning a settled job keeps what it spent.
pub async fn spend_counts_in_its_period_and_outlives_pruning(db: &TestDb) {
    let store = db.store().await;
    let yesterday = admit(&store, "y", vec![charge("acme-day", 900, 1_000)])
        .await
        .unwrap();
    store.finish_attempt(&yesterday, answer(900)).await.unwrap();
    let today = |amount| Charge {
        counts_from_ms: 86_400_000,
        bucket_ms: 86_400_000,
        ..charge("acme-day", amount, 1_000)
    };
    let held = admit(&store, "t1", vec![today(800)]).await.unwrap();
    over_budget(admit(&store, "t2", vec![today(300)]).await, "acme-day");
    store.finish_attempt(&held, answer(100)).await.unwrap();
    assert_eq!(
        store.budget("acme-day", 86_400_000).await.unwrap().spent,
        100
    );
    assert_eq!(store.budget("acme-day", 0).await.unwrap().spent, 1_000);
    db.exec("UPDATE jobs SET updated_at_ms = updated_at_ms - 7200000")
        .await;
    assert_eq!(
        store
            .prune_settled(Duration::from_secs(3600), 50)
            .await
            .unwrap(),
        2
    );
    assert_eq!(store.budget("acme-day", 0).await.unwrap().spent, 1_000);
}

/// An answer that failed its checks was still billed: its reservation
/// becomes the usage it reported, not nothing.
pub async fn an_answer_that_failed_its_checks_spends_its_usage(db: &TestDb) {
    let store = db.store().await;
    let a = admit(&store, "a", vec![charge("acme-day", 600, 1_000)])
        .await
        .unwrap();
    store
        .finish_attempt(
            &a,
            Outcome::Failed {
                error: "the answer breaks the contract".to_owned(),
                give_up: true,
                spend: Spend::Cost(Cost {
                    micros: 0,
                    tokens: 250,
                }),
            },
        )
        .await
        .unwrap();
    let status = store.budget("acme-day", 0).await.unwrap();
    assert_eq!((status.spent, status.held), (250, 0));
}

/// The router's own checks reserve of their budget by the attempts' rule:
/// over the limit nothing is held; a hold counts against every other
/// reservation; settling is once; a hold whose router is gone is settled
/// to its worst case, and only once it is old.
pub async fn a_checks_hold_is_reserved_and_settled_like_an_attempts(db: &TestDb) {
    let store = db.store().await;
    let budget = |amount| vec![charge("triage-checks", amount, 1_000)];
    store
        .hold_for_check("shadow-1", &budget(600))
        .await
        .unwrap();
    let refused = store.hold_for_check("shadow-2", &budget(600)).await;
    assert!(
        matches!(&refused, Err(StoreError::OverBudget { budget, held: 600, .. }) if budget == "triage-checks"),
        "{refused:?}"
    );
    // An attempt charged to the same budget sees the check's hold.
    over_budget(admit(&store, "a", budget(500)).await, "triage-checks");
    store
        .settle_check(
            "shadow-1",
            Spend::Cost(Cost {
                micros: 0,
                tokens: 100,
            }),
        )
        .await
        .unwrap();
    store
        .settle_check("shadow-1", Spend::WorstCase)
        .await
        .unwrap();
    let status = store.budget("triage-checks", 0).await.unwrap();
    assert_eq!((status.spent, status.held), (100, 0));
    // A hold left behind: not settled while young, its worst case once old.
    store
        .hold_for_check("shadow-3", &budget(300))
        .await
        .unwrap();
    let young = store
        .settle_stale_checks(Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert_eq!(young, 0);
    db.exec("UPDATE check_holds SET reserved_at_ms = reserved_at_ms - 7200000")
        .await;
    let old = store
        .settle_stale_checks(Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert_eq!(old, 1);
    let status = store.budget("triage-checks", 0).await.unwrap();
    assert_eq!((status.spent, status.held), (400, 0));
    // Settlers racing on one hold (its check's own, and other replicas'
    // stale sweeps) release it once: a release per settler that read it
    // open would free what others hold.
    let store = Arc::new(store);
    store
        .hold_for_check("shadow-4", &budget(300))
        .await
        .unwrap();
    store
        .hold_for_check("shadow-5", &budget(200))
        .await
        .unwrap();
    db.exec(
        "UPDATE check_holds SET reserved_at_ms = reserved_at_ms - 7200000 WHERE id = 'shadow-4'",
    )
    .await;
    let settlers: Vec<_> = (0..16)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                if i % 2 == 0 {
                    store.settle_check("shadow-4", Spend::WorstCase).await
                } else {
                    store
                        .settle_stale_checks(Duration::from_secs(3600), 10)
                        .await
                        .map(|_| ())
                }
            })
        })
        .collect();
    for settler in settlers {
        settler.await.unwrap().unwrap();
    }
    let status = store.budget("triage-checks", 0).await.unwrap();
    assert_eq!(
        (status.spent, status.held),
        (700, 200),
        "shadow-5 still holds"
    );
    store
        .settle_check("shadow-5", Spend::Nothing)
        .await
        .unwrap();
    // Bad input changes nothing.
    assert!(store.hold_for_check("", &budget(1)).await.is_err());
    assert_eq!(store.budget("triage-checks", 0).await.unwrap().held, 0);
}

/// PostgreSQL: a reservation takes its turn on the budget's row lock and
/// then reads what the turn before it committed. A session holds the lock
/// while it grows an admitted job's hold to the whole limit; the next
/// job's reservation waits for it, and once it commits is refused with
/// the budget full. (Without the lock, the reservation would read the
/// hold as it was committed before, 100, and be admitted.)
pub async fn a_reservation_waits_its_turn_and_reads_what_it_committed(db: &TestDb) {
    let store = db.store().await;
    let first = admit(&store, "turn-1", vec![charge("acme-day", 100, 1_000)])
        .await
        .unwrap();
    let mut other = db.raw.begin().await.unwrap();
    sqlx::query("SELECT account FROM budget_accounts WHERE account = 'acme-day' FOR NO KEY UPDATE")
        .execute(&mut *other)
        .await
        .unwrap();
    let grown = sqlx::query("UPDATE reservations SET amount = 1000 WHERE job_id = $1")
        .bind(&first.job_id.0)
        .execute(&mut *other)
        .await
        .unwrap();
    assert_eq!(grown.rows_affected(), 1);
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *other)
        .await
        .unwrap();
    let next = tokio::spawn({
        let store = store.clone();
        async move { admit(&store, "turn-2", vec![charge("acme-day", 100, 1_000)]).await }
    });
    db.wait_until_blocked_by(pid).await;
    other.commit().await.unwrap();
    let (spent, held) = over_budget(next.await.unwrap(), "acme-day");
    assert_eq!((spent, held), (0, 1_000));
    assert_eq!(db.count("SELECT COUNT(*) FROM jobs").await, 1);
}
