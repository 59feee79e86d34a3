//! One store test suite, run unchanged against SQLite and PostgreSQL.
//!
//! Each scenario is an `async fn(&TestDb)`; `store_suite!` runs every one of
//! them once per engine, each on a database of its own.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails on what it did not expect"
)]

mod budgets;
mod model;
mod scenarios;
mod trust;

surety_tests::both_engines!(scenarios:
    double_click_makes_one_job_and_one_attempt,
    same_key_different_input_conflicts,
    concurrent_conflicts_are_found_on_the_unique_violation_path,
    timeout_is_unknown_and_blocks_new_attempts_until_a_late_result,
    cancel_resolves_unknown_and_the_late_result_loses,
    cancelling_one_attempt_leaves_the_other_open_attempt_alone,
    reverse_order_finish_first_finisher_wins,
    the_winning_commits_view_is_what_a_read_returns,
    a_win_that_waited_on_another_writer_returns_no_stale_view,
    the_schema_refuses_a_second_open_attempt_and_an_unallowed_hedge,
    two_owners_same_key_get_two_private_jobs,
    reaper_turns_expired_leases_unknown_and_late_heartbeats_change_nothing,
    two_reapers_move_each_attempt_once,
    bad_input_gets_typed_errors_and_changes_nothing,
    a_failure_moves_on_or_gives_up,
    create_and_start_commits_the_job_and_its_first_attempt_together,
    a_refused_write_undoes_only_itself,
    a_cancel_committed_while_the_result_waits_makes_it_lose,
    retention_prunes_settled_jobs_in_batches_and_never_an_open_one,
    the_attention_queue_lists_unknown_oldest_first_and_failed_newest_first,
    every_rule_on_a_row_is_the_schemas_own,
    a_job_is_cancelled_only_with_no_attempt_open,
    a_deleted_response_keeps_its_job_and_key,
);

/// Budgets reserved in each attempt's own transaction, per engine.
mod budgets_per_engine {
    surety_tests::both_engines!(budgets:
        two_hundred_at_once_admit_exactly_ten,
        a_crowd_that_fits_is_reserved_and_settled_once_each,
        a_new_budget_beside_one_in_use_is_held_with_it_or_neither,
        an_answer_settles_to_its_usage_and_frees_the_rest,
        an_unknown_attempt_holds_its_reservation_until_resolved,
        a_keys_budget_counts_inside_its_owners,
        a_failover_attempt_over_budget_is_not_started,
        spend_counts_in_its_period_and_outlives_pruning,
        an_answer_that_failed_its_checks_spends_its_usage,
        a_checks_hold_is_reserved_and_settled_like_an_attempts,
    );
}

/// PostgreSQL's turn on a budget's row lock (SQLite's one writer takes
/// every reservation in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_reservation_waits_its_turn_and_reads_what_it_committed() {
    if let Some(db) = surety_tests::TestDb::new(surety_tests::Engine::Postgres).await {
        budgets::a_reservation_waits_its_turn_and_reads_what_it_committed(&db).await;
    }
}

/// The router's own checks and the trust they take away, per engine.
mod trust_per_engine {
    surety_tests::both_engines!(trust:
        live_results_read_back_newest_first_per_provider,
        a_demotion_is_opened_once_and_lifted_only_as_its_lift_allows,
        an_attempt_at_a_provider_demoted_since_its_certification_is_refused,
    );
}

/// SQLite at the size the operator allows: new jobs are refused as `Full`
/// and change nothing, every acknowledged job reads back intact, and room
/// made by retention is used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_sqlite_refuses_new_jobs_loses_nothing_and_recovers_when_room_returns() {
    use serde_json::json;
    use surety_core::IdempotencyKey;
    use surety_store::{
        Created, NewJob, Outage, Outcome, OwnerId, Slot, StartAttempt, Store, StoreOptions,
    };

    let db = surety_tests::TestDb::new(surety_tests::Engine::Sqlite)
        .await
        .unwrap();
    let mut options = StoreOptions::new(&db.url);
    options.sqlite_max_bytes = Some(256 * 1024);
    let store = Store::open_with(&options).await.unwrap();
    let owner = OwnerId("acme".to_owned());
    let job = |n: usize| NewJob {
        owner: owner.clone(),
        key: IdempotencyKey::parse(&format!("full-{n}")).unwrap(),
        route: "triage".to_owned(),
        contract: "support-triage".to_owned(),
        contract_digest: "sha256:0000".to_owned(),
        input: json!({"n": n, "text": "x".repeat(2000)}),
        hedgeable: false,
        kind: surety_store::JobKind::Native,
        messages: None,
        request: None,
        fingerprint: None,
    };
    let start = StartAttempt {
        provider: "openai".to_owned(),
        slot: Slot::Primary,
        lease: std::time::Duration::from_secs(60),
        trust: None,
        charges: Vec::new(),
    };
    let mut acknowledged = Vec::new();
    let refused = loop {
        let n = acknowledged.len();
        assert!(n < 1000, "256 KiB never filled");
        match store.create_and_start(&job(n), &start).await {
            Ok((Created::New(created), Some(handle))) => acknowledged.push((created, handle)),
            Ok(other) => panic!("a new key made {other:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!(refused.outage(), Some(Outage::Full), "{refused}");
    let at_refusal = db.snapshot().await;
    assert!(
        store
            .create_and_start(&job(acknowledged.len()), &start)
            .await
            .is_err()
    );
    assert_eq!(
        db.snapshot().await,
        at_refusal,
        "a refused job changes nothing"
    );
    for (created, _) in &acknowledged {
        let stored = store.job(&owner, &created.id).await.unwrap();
        assert_eq!(stored.input, created.input);
    }
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&db.raw)
        .await
        .unwrap();
    assert_eq!(integrity, "ok");
    // Room returns: the oldest jobs settle and pass retention.
    for (_, handle) in acknowledged.iter().take(20) {
        store
            .finish_attempt(handle, Outcome::Succeeded(json!({"ok": true}).into()))
            .await
            .unwrap();
    }
    db.exec("UPDATE jobs SET updated_at_ms = updated_at_ms - 7200000 WHERE state = 'succeeded'")
        .await;
    let hour = std::time::Duration::from_secs(3600);
    assert_eq!(store.prune_settled(hour, 50).await.unwrap(), 20);
    let (created, _) = store
        .create_and_start(&job(acknowledged.len()), &start)
        .await
        .unwrap();
    assert!(matches!(created, Created::New(_)));
}
