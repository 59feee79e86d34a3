//! Prometheus metrics.

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Shadow calls and re-checks by provider, contract, source and outcome.
    pub live_checks: IntCounterVec,
    /// Tokens the live checks spent, by provider and contract.
    pub live_tokens: IntCounterVec,
    /// Live checks not made because the route's hourly budget was spent, or
    /// its checks budget had no room for the check's worst case.
    pub live_budget_exhausted: IntCounterVec,
    /// The share of each route's hourly budget each provider spent this
    /// hour, on this replica (set as `/metrics` is read).
    pub live_budget_share: GaugeVec,
    /// Demotions this router decided, by provider and contract.
    pub demotions: IntCounterVec,
    /// Jobs created, by route and kind (`native`, `chat`, `responses`).
    pub jobs_created: IntCounterVec,
    pub replays: IntCounter,
    pub conflicts: IntCounter,
    pub rate_limited: IntCounter,
    pub attempts: IntCounterVec,
    pub model_drift: IntCounterVec,
    pub tokens: IntCounterVec,
    /// Of those prompt tokens, the ones the provider read from its cache
    /// and wrote to it, by provider.
    pub cache_read_tokens: IntCounterVec,
    pub cache_write_tokens: IntCounterVec,
    /// The reconciler's questions about unknown attempts, by provider and
    /// what it said (`answered`, `ended`, `running`, `not_found`, `error`).
    pub reconciliations: IntCounterVec,
    /// Jobs and attempts refused for a budget, by budget and owner.
    pub budget_refusals: IntCounterVec,
    /// Each budget's spend and what its attempts hold (and, of that, what
    /// unknown attempts hold) this period, in its unit, by budget and owner
    /// (read from the database at scrape time).
    pub budget_spent: IntGaugeVec,
    pub budget_reserved: IntGaugeVec,
    pub budget_held_by_unknown: IntGaugeVec,
    pub lost_races: IntCounter,
    pub late_results_discarded: IntCounter,
    pub results_held: IntGauge,
    pub pruned_jobs: IntCounter,
    pub unknown_attempts_open: IntGauge,
    pub provider_latency: HistogramVec,
    pub manifest_entries: IntGauge,
    pub manifest_age_seconds: IntGauge,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let c = IntCounter::new(name, help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let attempts = counters(
            "surety_attempts_total",
            "Attempts by provider and outcome",
            &["provider", "outcome"],
        )?;
        let model_drift = counters(
            "surety_model_drift_total",
            "Answers from a model id the provider's certificate did not see, by provider and model",
            &["provider", "model"],
        )?;
        let tokens = counters(
            "surety_tokens_total",
            "Tokens of every answered provider call, as the provider counted them, by provider and kind (prompt, completion)",
            &["provider", "kind"],
        )?;
        let cache_read_tokens = counters(
            "surety_cache_read_tokens_total",
            "Prompt tokens of answered provider calls that the provider read from its prompt cache, by provider",
            &["provider"],
        )?;
        let cache_write_tokens = counters(
            "surety_cache_write_tokens_total",
            "Prompt tokens of answered provider calls that the provider wrote to its prompt cache, by provider",
            &["provider"],
        )?;
        let reconciliations = counters(
            "surety_reconciliations_total",
            "Questions the reconciler asked a provider about an unknown attempt (did it do the work?), by provider and outcome (answered, ended, running, not_found, error)",
            &["provider", "outcome"],
        )?;
        let gauges = |name: &str, help: &str| {
            let g = IntGaugeVec::new(Opts::new(name, help), &["budget", "owner", "unit"])?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let budget_spent = gauges(
            "surety_budget_spent",
            "What each budget spent this period, in its unit (micros of its currency, or tokens), by budget, owner and unit (read from the database at scrape time)",
        )?;
        let budget_reserved = gauges(
            "surety_budget_reserved",
            "What each budget's attempts hold now (their worst cases, until each is settled), in its unit, by budget, owner and unit",
        )?;
        let budget_held_by_unknown = gauges(
            "surety_budget_held_by_unknown",
            "Of what each budget holds, what unknown attempts hold (they may have been billed), in its unit, by budget, owner and unit",
        )?;
        let live_checks = counters(
            "surety_live_checks_total",
            "The router's own checks (shadow calls and scheduled re-checks) by provider, contract, source and outcome (kept, broke, disagreed, failed)",
            &["provider", "contract", "source", "outcome"],
        )?;
        let live_tokens = counters(
            "surety_live_tokens_total",
            "Tokens the router's own checks spent, by provider and contract",
            &["provider", "contract"],
        )?;
        let live_budget_exhausted = counters(
            "surety_live_budget_exhausted_total",
            "Live checks not made because the route's hourly budget was spent or its checks budget had no room, by route",
            &["route"],
        )?;
        let live_budget_share = GaugeVec::new(
            Opts::new(
                "surety_live_budget_share",
                "The share of the route's hourly budget of live checks each provider spent this hour, on this replica, by route and provider",
            ),
            &["route", "provider"],
        )?;
        registry.register(Box::new(live_budget_share.clone()))?;
        let demotions = counters(
            "surety_demotions_total",
            "Providers demoted for a contract by this router's live checks",
            &["provider", "contract"],
        )?;
        let provider_latency = HistogramVec::new(
            HistogramOpts::new("surety_provider_latency_seconds", "Provider call latency")
                .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
            &["provider"],
        )?;
        registry.register(Box::new(provider_latency.clone()))?;
        Ok(Metrics {
            budget_refusals: counters(
                "surety_budget_refusals_total",
                "Jobs and attempts refused before any call because a budget had no room for their worst case, by budget and owner",
                &["budget", "owner"],
            )?,
            budget_spent,
            budget_reserved,
            budget_held_by_unknown,
            cache_read_tokens,
            cache_write_tokens,
            reconciliations,
            live_checks,
            live_tokens,
            live_budget_exhausted,
            live_budget_share,
            demotions,
            jobs_created: counters(
                "surety_jobs_created_total",
                "Jobs created, by route and by how they were asked for (native, chat, responses)",
                &["route", "kind"],
            )?,
            replays: counter(
                "surety_job_replays_total",
                "Requests answered with an existing job",
            )?,
            conflicts: counter(
                "surety_idempotency_conflicts_total",
                "Same key, different intent",
            )?,
            rate_limited: counter(
                "surety_rate_limited_total",
                "Requests refused for their owner's rate or concurrency limit",
            )?,
            attempts,
            model_drift,
            tokens,
            lost_races: counter(
                "surety_lost_races_total",
                "Attempts whose result lost the compare-and-swap",
            )?,
            late_results_discarded: counter(
                "surety_late_results_discarded_total",
                "Results that arrived after the job was settled",
            )?,
            results_held: gauge(
                "surety_results_held",
                "Provider answers held in memory because the database could not take them yet",
            )?,
            pruned_jobs: counter(
                "surety_pruned_jobs_total",
                "Settled jobs deleted past retention",
            )?,
            unknown_attempts_open: gauge(
                "surety_unknown_attempts_open",
                "Attempts unknown now, across every router (read from the database at scrape time)",
            )?,
            provider_latency,
            manifest_entries: gauge(
                "surety_manifest_entries",
                "Entries of the manifest in force",
            )?,
            manifest_age_seconds: gauge(
                "surety_manifest_age_seconds",
                "Age of the manifest in force",
            )?,
            registry,
        })
    }

    /// The sum of `counter`'s series whose labels include each of `wanted`.
    pub fn sum_where(counter: &IntCounterVec, wanted: &[(&str, &str)]) -> u64 {
        series(counter)
            .iter()
            .filter(|(labels, _)| {
                wanted
                    .iter()
                    .all(|(name, value)| labels.iter().any(|(n, v)| n == name && v == value))
            })
            .map(|(_, count)| count)
            .sum()
    }

    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buffer);
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// Each series of `counter`: its labels (name, value) and its count.
pub fn series(counter: &IntCounterVec) -> Vec<(Vec<(String, String)>, u64)> {
    prometheus::core::Collector::collect(counter)
        .iter()
        .flat_map(|family| family.get_metric())
        .map(|metric| {
            let labels = metric
                .get_label()
                .iter()
                .map(|l| (l.name().to_owned(), l.value().to_owned()))
                .collect();
            (labels, metric.get_counter().get_value() as u64)
        })
        .collect()
}
