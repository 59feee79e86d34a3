//! The router end to end over HTTP, against fake providers, on SQLite and
//! on PostgreSQL.

#![expect(clippy::unwrap_used, reason = "a test fails on what it did not expect")]

mod binding;
mod budgets;
mod docs;
mod edge;
mod faults;
mod harness;
mod live;
mod messages;
mod operator;
mod reconcile;
mod responses;
mod scenarios;
mod sdk;
mod snapshots;
mod tools;

surety_tests::both_engines!(scenarios:
    double_click_gets_one_job_and_one_provider_call,
    same_key_different_input_is_a_conflict,
    timeout_is_unknown_and_retry_waits_for_an_out_of_band_cancel,
    reverse_order_the_hedge_wins_and_the_late_primary_is_discarded,
    failover_skips_uncertified_stale_and_expired_providers,
    a_broken_manifest_is_refused_and_routing_continues,
    owners_and_keys,
    bad_requests_get_problem_details,
    clients_that_go_away_never_strand_a_job,
    the_http_edge_answers_in_problem_details,
    the_openapi_document_is_the_router,
    an_owner_flooding_is_held_to_its_limits,
    a_filtered_answer_or_an_unknown_finish_reason_fails_over,
    a_certificate_that_lapses_mid_job_is_not_failed_over_to,
    a_native_job_that_looks_like_a_chat_request_is_retried_as_native,
);

mod reconciliation {
    surety_tests::both_engines!(reconcile:
        a_stored_completion_lost_on_the_wire_is_found_by_its_metadata,
        a_lost_answer_whose_id_arrived_is_found_by_its_id_and_its_late_result_settles_once,
        a_stored_answer_that_is_none_fails_over_and_a_miss_stays_unknown,
        an_unknown_at_a_provider_that_cannot_be_asked_stays_unknown_and_says_so,
        a_background_response_outlives_a_poll_that_times_out_and_a_cancel_there_fails_over,
    );
}

mod budgets_per_engine {
    surety_tests::both_engines!(budgets:
        two_hundred_jobs_at_once_admit_ten_and_call_ten,
        a_settled_answer_frees_the_rest_for_the_next_job,
        an_unknown_attempt_holds_its_reservation_until_its_late_result,
        a_keys_budget_spent_leaves_its_owners_other_keys_served,
        the_sdks_read_an_over_budget_job_in_their_own_dialects,
        a_routes_live_checks_spend_its_own_budget_never_an_owners,
    );
}

mod the_edge {
    surety_tests::both_engines!(edge: ids_that_cannot_be_ids_are_not_found);
}

mod certified_is_served {
    surety_tests::both_engines!(binding:
        certify_and_serve_send_the_same_bytes,
        a_changed_provider_config_is_not_served,
        model_drift_fails_over_and_is_counted,
        a_failing_model_listing_never_voids_an_answer,
        the_facade_serves_only_pinned_prompts,
        a_replay_never_depends_on_the_manifest,
        a_gemini_provider_is_routed_to_and_failed_over_from,
    );
}

mod operator_pages {
    surety_tests::both_engines!(operator:
        only_admins_sign_in_and_a_session_not_the_key_is_in_a_strict_http_only_cookie,
        sessions_expire_and_tokens_belong_to_their_session,
        the_queue_lists_this_owners_unknown_jobs_and_shows_input_as_text,
        an_unknown_job_is_cancelled_with_confirmation_then_retried_to_success,
        the_certification_matrix_says_why_a_provider_is_not_eligible,
        an_operator_of_every_owner_sees_and_acts_on_every_owners_jobs,
        a_demoted_provider_shows_its_live_results_and_is_reinstated_behind_a_confirmation,
        a_tool_call_jobs_page_shows_the_tool_and_its_arguments,
    );
}

mod openai_sdk {
    surety_tests::both_engines!(sdk:
        the_official_openai_sdk_gets_its_answer_once,
        the_sdks_idempotency_hook_makes_its_own_retries_one_job,
        the_official_openai_sdk_gets_a_certified_tool_call_once,
    );
}

mod anthropic_messages {
    surety_tests::both_engines!(messages:
        the_anthropic_sdk_gets_its_message_once,
        the_anthropic_sdk_gets_a_certified_tool_use_once,
        a_message_whose_anthropic_primary_fails_is_answered_by_a_certified_openai_kind,
        an_agent_loops_three_turns_reach_the_serving_kind_in_its_own_words,
        a_cacheable_contracts_breakpoints_reach_anthropic_and_its_cache_usage_every_facade,
        an_output_only_routes_client_caching_reaches_anthropic_as_sent_and_is_named_where_not,
        the_anthropic_typescript_sdk_gets_its_message_once,
        the_anthropic_sdks_idempotency_hook_makes_its_own_retries_one_job,
    );
}

mod openai_responses {
    surety_tests::both_engines!(responses:
        the_official_sdks_responses_get_their_answer_once,
        the_official_sdks_responses_get_a_certified_function_call_once,
        a_conversation_by_previous_response_id_survives_a_failover_to_another_kind,
        an_agents_sdk_agent_runs_a_certified_tool_once_through_a_dropped_answer,
        a_background_response_is_read_back_resumed_and_deleted_with_one_call,
        an_unknown_background_response_stays_in_progress_until_resolved_then_cancels,
    );
}

/// The router's own checks, per engine.
mod live_per_engine {
    surety_tests::both_engines!(live:
        a_fallback_that_breaks_the_contract_on_real_inputs_is_demoted_and_not_failed_over_to,
        a_demotion_decided_while_a_job_runs_stops_its_failover,
        a_demotion_made_elsewhere_counts_for_the_next_job_at_once,
        an_admin_reinstates_a_demoted_provider_and_only_an_admin,
        a_provider_that_regresses_on_its_cases_is_demoted_by_a_recheck_before_a_job_reaches_it,
        shadow_checks_never_change_a_job,
    );
}

/// Tool-call contracts, per engine.
mod tool_calls {
    surety_tests::both_engines!(tools:
        a_tool_call_fails_over_to_another_kind_that_makes_the_same_call,
        an_agent_loops_tool_history_passes_through_an_output_only_route,
    );
}
