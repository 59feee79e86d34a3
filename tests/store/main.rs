//! One store test suite, run unchanged against SQLite and PostgreSQL.
//!
//! Each scenario is an `async fn(&TestDb)`; `store_suite!` runs every one of
//! them once per engine, each on a database of its own.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod model;
mod scenarios;

surety_tests::both_engines!(scenarios:
    double_click_makes_one_job_and_one_attempt,
    same_key_different_input_conflicts,
    concurrent_conflicts_are_found_on_the_unique_violation_path,
    timeout_is_unknown_and_blocks_new_attempts_until_a_late_result,
    cancel_resolves_unknown_and_the_late_result_loses,
    cancelling_one_attempt_leaves_the_other_open_attempt_alone,
    reverse_order_finish_first_finisher_wins,
    the_schema_refuses_a_second_open_attempt_and_an_unallowed_hedge,
    two_owners_same_key_get_two_private_jobs,
    reaper_turns_expired_leases_unknown_and_late_heartbeats_change_nothing,
    two_reapers_move_each_attempt_once,
    bad_input_gets_typed_errors_and_changes_nothing,
    a_failure_moves_on_or_gives_up,
    create_and_start_commits_the_job_and_its_first_attempt_together,
    a_refused_write_undoes_only_itself,
    a_cancel_committed_while_the_result_waits_makes_it_lose,
);
