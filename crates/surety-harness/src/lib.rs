//! surety's certification harness.
//!
//! For each contract a provider is routed for, each case, each sample:
//! render → tokenizer → call at low temperature → parse → JSON Schema →
//! business rules → expected facts; then per case: golden snapshot and
//! determinism across the samples. Each case ends stable-pass, stable-fail
//! or flaky; a contract is certified when every case passes. The results
//! become manifest entries and reports (`report`).

pub mod config;
pub mod golden;
pub mod lint;
pub mod progress;
mod reach;
pub mod report;
pub mod tokenizer;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use surety_contracts::{Case, Contract};
use surety_manifest::{Counts, Entry, Failure, Latency, ServedModel, Status, Tokens, now_rfc3339};
use surety_providers::{
    CallContext, ChatRequest, ChatResponse, FailureKind, Provider, ProviderConfig, ProviderError,
};
use time::OffsetDateTime;

use crate::golden::Golden;
use crate::tokenizer::{TokenCheck, Tokenizer};

/// The harness's version, recorded in every manifest entry.
pub const HARNESS_VERSION: &str = concat!("surety-harness ", env!("CARGO_PKG_VERSION"));

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Pass,
    Fail,
    /// Could not be checked, and said so (no tokenizer known).
    Unverified,
}

/// One named check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: CheckStatus,
    pub message: String,
}

impl Check {
    pub fn new(name: &'static str, status: CheckStatus, message: String) -> Check {
        Check {
            name,
            status,
            message,
        }
    }

    fn pass(name: &'static str) -> Check {
        Check::new(name, CheckStatus::Pass, String::new())
    }

    fn fail(name: &'static str, message: String) -> Check {
        Check::new(name, CheckStatus::Fail, message)
    }

    pub fn failed(&self) -> bool {
        self.status == CheckStatus::Fail
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub checks: Vec<Check>,
    pub output: Option<Value>,
    /// The raw text, when it did not parse.
    pub raw: Option<String>,
    pub latency_ms: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub response_model: Option<String>,
    /// Transient refusals retried before the answer (or the last failure).
    pub retries: Vec<String>,
}

impl Sample {
    pub fn passed(&self) -> bool {
        !self.checks.iter().any(Check::failed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    StablePass,
    Flaky,
    StableFail,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub name: String,
    /// Checks run once per case: render, tokenizer, golden, determinism.
    pub checks: Vec<Check>,
    pub samples: Vec<Sample>,
    pub outcome: Outcome,
    pub passed: bool,
    pub prompt_tokens: Option<u64>,
    /// Where the golden check failed: the accepted snapshot against this
    /// run's, as a unified diff.
    pub golden_diff: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ContractResult {
    pub contract: String,
    pub digest: String,
    pub prompt_digest: String,
    pub system_prompt_digest: Option<String>,
    pub structured_mode: String,
    pub tokenizer: String,
    pub lint: Vec<String>,
    pub cases: Vec<CaseResult>,
    pub certified: bool,
}

impl ContractResult {
    /// Every failed check, with its case and sample.
    pub fn failures(&self) -> Vec<Failure> {
        let mut out = Vec::new();
        for case in &self.cases {
            for check in case.checks.iter().filter(|c| c.failed()) {
                out.push(Failure {
                    case: case.name.clone(),
                    sample: None,
                    check: check.name.to_owned(),
                    message: check.message.clone(),
                });
            }
            for (i, sample) in case.samples.iter().enumerate() {
                for check in sample.checks.iter().filter(|c| c.failed()) {
                    out.push(Failure {
                        case: case.name.clone(),
                        sample: Some(i as u32 + 1),
                        check: check.name.to_owned(),
                        message: check.message.clone(),
                    });
                }
            }
        }
        out
    }

    pub fn counts(&self) -> Counts {
        let mut counts = Counts {
            cases: self.cases.len() as u32,
            ..Counts::default()
        };
        for case in &self.cases {
            match case.outcome {
                Outcome::StablePass => counts.stable_pass += 1,
                Outcome::Flaky => counts.flaky += 1,
                Outcome::StableFail => counts.stable_fail += 1,
            }
            counts.samples += case.samples.len() as u32;
            counts.samples_passed += case.samples.iter().filter(|s| s.passed()).count() as u32;
        }
        counts
    }
}

/// Called with the contract and case after each sample.
pub type OnSample = Box<dyn Fn(&str, &str) + Send + Sync>;

/// How transient refusals are retried within a certification run: an HTTP
/// 429, 503 or 529 (Anthropic's `overloaded_error`) is waited out as long
/// as the provider asks (`Retry-After`, `retry-after-ms`, Google's
/// `RetryInfo`), or, where it gives no hint, with exponential backoff from
/// `first_backoff` and jitter; up to `per_call` times per call, never
/// longer than `longest_wait` at once, and `per_run` in all. Beyond that
/// the refusal fails the call, naming its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudget {
    pub per_call: u32,
    pub longest_wait: Duration,
    pub per_run: Duration,
    /// The first wait when the provider gives no hint; each retry doubles it.
    pub first_backoff: Duration,
}

impl Default for RetryBudget {
    fn default() -> RetryBudget {
        RetryBudget {
            per_call: 3,
            longest_wait: Duration::from_secs(30),
            per_run: Duration::from_secs(300),
            first_backoff: Duration::from_secs(1),
        }
    }
}

impl RetryBudget {
    /// The wait before retry `n` (0-based) of a refusal that named none:
    /// `first_backoff × 2ⁿ`, at most `longest_wait`, less up to half of it
    /// at random so that many calls refused together do not return together.
    pub fn backoff(&self, n: u32) -> Duration {
        let full = self
            .first_backoff
            .saturating_mul(1u32 << n.min(16))
            .min(self.longest_wait);
        full.mul_f64(1.0 - rand::random::<f64>() / 2.0)
    }
}

impl std::fmt::Display for RetryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "429, 503 and 529 are retried up to {} times per call, waiting as long as the provider asks (Retry-After, retry-after-ms, RetryInfo) or else backing off from {} s with jitter, at most {} s at once and {} s per run",
            self.per_call,
            self.first_backoff.as_secs_f64(),
            self.longest_wait.as_secs(),
            self.per_run.as_secs()
        )
    }
}

/// What to certify and how.
pub struct Certification {
    pub provider: Arc<dyn Provider>,
    pub config: ProviderConfig,
    /// Where `golden/` is; snapshots go to `<golden>/<provider>/<contract>/`.
    pub golden_root: PathBuf,
    pub accept: bool,
    pub retry: RetryBudget,
    /// Called after each sample, for progress display.
    pub on_sample: OnSample,
}

/// One run: its id (in every idempotency key it sends, so no provider can
/// answer it from an older run) and what is left of its retry budget.
struct Run {
    id: String,
    waited: std::sync::Mutex<Duration>,
    /// The provider, every call of this run counted (see [`reach`]).
    provider: Arc<dyn Provider>,
    reach: Arc<reach::Reach>,
}

impl std::fmt::Debug for Certification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certification")
            .field("provider", &self.config.id)
            .field("accept", &self.accept)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("the tokenizer of provider `{provider}` cannot be loaded: {message}")]
    Tokenizer { provider: String, message: String },
    #[error("golden snapshots: {0}")]
    Golden(#[from] std::io::Error),
    /// Calls were made and the provider answered none of them (every one
    /// refused, reset or timed out before a status came back): the run
    /// could not be made. Not a verdict on the provider's answers.
    #[error(
        "provider `{provider}` is unreachable: none of its {calls} calls got an answer (the first: {first_failure})"
    )]
    Unreachable {
        provider: String,
        calls: u64,
        first_failure: String,
    },
}

impl Certification {
    /// Certifies the provider for `contracts`.
    pub async fn run(&self, contracts: &[Contract]) -> Result<Vec<ContractResult>, HarnessError> {
        let reach = Arc::new(reach::Reach::default());
        let run = Run {
            id: format!("{:016x}", rand::random::<u64>()),
            waited: std::sync::Mutex::new(Duration::ZERO),
            provider: reach::Reaching::wrap(Arc::clone(&self.provider), Arc::clone(&reach)),
            reach,
        };
        let tokenizer = Tokenizer::for_provider(&self.config, Arc::clone(&run.provider)).map_err(
            |message| HarnessError::Tokenizer {
                provider: self.config.id.clone(),
                message,
            },
        )?;
        let mut results = Vec::new();
        for contract in contracts {
            results.push(self.contract(contract, &tokenizer, &run).await?);
        }
        if let Some((calls, first_failure)) = run.reach.unanswered() {
            return Err(HarnessError::Unreachable {
                provider: self.config.id.clone(),
                calls,
                first_failure,
            });
        }
        Ok(results)
    }

    async fn contract(
        &self,
        contract: &Contract,
        tokenizer: &Tokenizer,
        run: &Run,
    ) -> Result<ContractResult, HarnessError> {
        let mode = self.config.structured_mode();
        let mut cases = Vec::new();
        for (index, case) in contract.cases.iter().enumerate() {
            cases.push(self.case(contract, case, index, tokenizer, run).await?);
        }
        let certified = !cases.is_empty() && cases.iter().all(|c| c.passed);
        Ok(ContractResult {
            contract: contract.id.clone(),
            digest: contract.digest.clone(),
            // Every case rendered above (or failed its render check, which
            // fails the contract); the digest is computed the way the router does.
            prompt_digest: surety_exchange::prompt_digest(contract)
                .unwrap_or_else(|e| format!("(does not render: {e})")),
            system_prompt_digest: surety_exchange::system_prompt_digest(contract),
            structured_mode: mode.as_str().to_owned(),
            tokenizer: tokenizer.describe(),
            lint: lint::lint_contract(contract, mode),
            cases,
            certified,
        })
    }

    async fn case(
        &self,
        contract: &Contract,
        case: &Case,
        index: usize,
        tokenizer: &Tokenizer,
        run: &Run,
    ) -> Result<CaseResult, HarnessError> {
        let mut checks = Vec::new();
        let stop = |checks: Vec<Check>| CaseResult {
            name: case.name.clone(),
            checks,
            samples: Vec::new(),
            outcome: Outcome::StableFail,
            passed: false,
            prompt_tokens: None,
            golden_diff: None,
        };
        let rendered = match contract.render(&case.input) {
            Ok(rendered) => rendered,
            Err(e) => return Ok(stop(vec![Check::fail("render", e.to_string())])),
        };
        checks.push(Check::pass("render"));
        let (token_check, prompt_tokens) = tokenizer
            .check(contract, self.config.context_window, &case.input, &rendered)
            .await;
        let overflow = token_check.failed();
        checks.push(token_check);
        if overflow {
            return Ok(CaseResult {
                prompt_tokens,
                ..stop(checks)
            });
        }
        // Exactly what the router sends for this input: one builder.
        let request = surety_exchange::request(
            contract,
            surety_exchange::messages(&rendered),
            self.provider.capabilities(),
        );
        let mut samples = Vec::new();
        for n in 0..contract.sampling.samples {
            // One key per sample and run: each is a distinct call, billed as
            // one, and no provider can answer it from an earlier run.
            let call = CallContext {
                idempotency_key: format!(
                    "certify-{}-{}-{}-{index}-{n}",
                    run.id, self.config.id, contract.id
                ),
                ids: surety_providers::ResponseIds::default(),
            };
            samples.push(self.sample(contract, case, &request, &call, run).await);
            (self.on_sample)(&contract.id, &case.name);
        }

        // Golden: the normalized set of answers, the rendered prompt and its size.
        let outputs: BTreeSet<String> = samples.iter().map(|s| normalized(contract, s)).collect();
        let snapshot = golden_text(
            &rendered.system,
            &rendered.user,
            prompt_tokens,
            &tokenizer.describe(),
            samples.len(),
            &outputs,
        );
        let dir = self.golden_root.join(&self.config.id).join(&contract.id);
        let expression = format!("{}/{}/{}", self.config.id, contract.id, case.name);
        let golden_diff = match golden::check(
            &dir,
            &case.name,
            &expression,
            &snapshot,
            self.accept,
        )? {
            Golden::Matches | Golden::Accepted => {
                checks.push(Check::pass("golden"));
                None
            }
            Golden::New { pending, diff } => {
                checks.push(Check::fail("golden", format!("new snapshot {} waits for review (accept with --accept or `cargo insta review`)", pending.display())));
                Some(diff)
            }
            Golden::Changed { pending, diff } => {
                checks.push(Check::fail("golden", format!("the answers changed from the accepted snapshot; see {} (accept with --accept or `cargo insta review`)", pending.display())));
                Some(diff)
            }
        };
        let golden_ok = golden_diff.is_none();
        let deterministic = outputs.len() <= 1;
        checks.push(match deterministic {
            true => Check::pass("determinism"),
            false => Check::fail(
                "determinism",
                format!(
                    "{} different answers across {} samples at temperature {}",
                    outputs.len(),
                    samples.len(),
                    contract.sampling.temperature
                ),
            ),
        });
        let passes = samples.iter().filter(|s| s.passed()).count() as u32;
        // Flaky is what it says, whatever k is: some samples passed and some
        // did not (or all passed with different answers). Whether a flaky
        // case passes is the contract's `flaky_passes`, and only with k passes.
        let outcome = if passes == contract.sampling.samples && deterministic {
            Outcome::StablePass
        } else if passes == 0 {
            Outcome::StableFail
        } else {
            Outcome::Flaky
        };
        let allowed = match outcome {
            Outcome::StablePass => true,
            Outcome::Flaky => contract.sampling.flaky_passes && passes >= contract.sampling.pass_k,
            Outcome::StableFail => false,
        };
        Ok(CaseResult {
            name: case.name.clone(),
            checks,
            samples,
            outcome,
            passed: allowed && golden_ok,
            prompt_tokens,
            golden_diff,
        })
    }

    async fn sample(
        &self,
        contract: &Contract,
        case: &Case,
        request: &ChatRequest,
        call: &CallContext,
        run: &Run,
    ) -> Sample {
        let mut sample = Sample {
            checks: Vec::new(),
            output: None,
            raw: None,
            latency_ms: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            response_model: None,
            retries: Vec::new(),
        };
        // Timed here, so calls that fail (a truncated answer, a timeout) count too.
        let started = std::time::Instant::now();
        let answered = self.call(request, call, run, &mut sample.retries).await;
        sample.latency_ms = started.elapsed().as_millis() as u64;
        let response = match answered {
            Ok(response) => response,
            Err(e) if e.kind == FailureKind::BadResponse => {
                sample.checks.push(Check::pass("call"));
                sample.checks.push(Check::fail("parse", e.message));
                return sample;
            }
            Err(e) => {
                let retried = match sample.retries.len() {
                    0 => String::new(),
                    n => format!(" (after {n} retries)"),
                };
                sample
                    .checks
                    .push(Check::fail("call", format!("{e}{retried}")));
                return sample;
            }
        };
        sample.prompt_tokens = response.usage.prompt_tokens;
        sample.completion_tokens = response.usage.completion_tokens;
        sample.response_model = Some(response.model.clone());
        sample.checks.push(Check::pass("call"));
        sample.checks.push(match self.config.serves(&response.model) {
            true => Check::pass("model"),
            false => Check::fail(
                "model",
                format!(
                    "answered by model `{}`, but the provider is configured for `{}` (a dated snapshot `{}-<date>` or an id listed in `served_models` would match)",
                    response.model, self.config.model, self.config.model
                ),
            ),
        });
        // The router's own check: parse → schema → rules.
        let checked = surety_exchange::check(contract, &case.input, &response);
        for step in &checked.steps {
            sample.checks.push(verdict(step.name, &step.violations));
        }
        let Some(answer) = checked.answer else {
            sample.raw = Some(response.text);
            return sample;
        };
        sample
            .checks
            .push(verdict("facts", &contract.check_facts(case, &answer)));
        sample.output = Some(answer);
        sample
    }

    /// One call, with transient refusals waited out within the run's budget.
    async fn call(
        &self,
        request: &ChatRequest,
        call: &CallContext,
        run: &Run,
        retries: &mut Vec<String>,
    ) -> Result<ChatResponse, ProviderError> {
        loop {
            let error = match run.provider.chat(request, call).await {
                Ok(response) => return Ok(response),
                Err(error) => error,
            };
            // Refusals that say "later": rate limits, an unavailable or
            // overloaded server (Anthropic's 529). Nothing else is retried.
            if !matches!(error.status, Some(429 | 503 | 529)) {
                return Err(error);
            }
            let n = retries.len() as u32;
            if n >= self.retry.per_call {
                return Err(error);
            }
            let (wait, why) = match error.retry_after {
                Some(asked) => (asked, format!("asked to wait {} s", asked.as_secs_f64())),
                None => {
                    let wait = self.retry.backoff(n);
                    (
                        wait,
                        format!("no hint, backed off {:.2} s", wait.as_secs_f64()),
                    )
                }
            };
            if wait > self.retry.longest_wait {
                return Err(error);
            }
            {
                let mut waited = run
                    .waited
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if *waited + wait > self.retry.per_run {
                    return Err(error);
                }
                *waited += wait;
            }
            retries.push(format!("HTTP {}, {why}", error.status.unwrap_or_default()));
            tokio::time::sleep(wait).await;
        }
    }
}

/// A check that passes when nothing was found, else fails listing what was.
fn verdict(name: &'static str, found: &[surety_contracts::Violation]) -> Check {
    match found.is_empty() {
        true => Check::pass(name),
        false => Check::fail(name, surety_exchange::describe_all(found)),
    }
}

/// A sample's answer in canonical form, volatile fields redacted.
fn normalized(contract: &Contract, sample: &Sample) -> String {
    match &sample.output {
        Some(answer) => {
            let mut answer = answer.clone();
            for pointer in &contract.golden_redact {
                if let Some(v) = answer.pointer_mut(pointer) {
                    *v = Value::String("[redacted]".into());
                }
            }
            serde_jcs::to_string(&answer).unwrap_or_else(|_| answer.to_string())
        }
        None => match (&sample.raw, sample.checks.iter().find(|c| c.failed())) {
            (Some(raw), _) => format!("(not JSON) {raw}"),
            (None, Some(check)) => format!("({} failed) {}", check.name, check.message),
            (None, None) => "(no answer)".to_owned(),
        },
    }
}

fn golden_text(
    system: &str,
    user: &str,
    tokens: Option<u64>,
    tokenizer: &str,
    samples: usize,
    outputs: &BTreeSet<String>,
) -> String {
    let tokens = tokens.map_or("unverified".to_owned(), |t| t.to_string());
    let mut text = format!(
        "prompt tokens: {tokens} ({tokenizer})\n--- system ---\n{system}\n--- user ---\n{user}\n"
    );
    text.push_str(&format!(
        "--- answers: {} distinct across {samples} samples ---\n",
        outputs.len()
    ));
    for output in outputs {
        text.push_str(output);
        text.push('\n');
    }
    text
}

/// The manifest entry for one contract's result. `config` is the
/// configuration the run used; `overridden_from` the configured base URL
/// when the run was pointed at another one.
pub fn entry(
    config: &ProviderConfig,
    result: &ContractResult,
    served: Option<Vec<String>>,
    overridden_from: Option<&str>,
    now: OffsetDateTime,
    validity: Duration,
) -> Entry {
    let samples: Vec<&Sample> = result.cases.iter().flat_map(|c| &c.samples).collect();
    let mut latencies: Vec<u64> = samples
        .iter()
        .filter(|s| s.latency_ms > 0)
        .map(|s| s.latency_ms)
        .collect();
    latencies.sort_unstable();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    let behaviour = config.behaviour();
    let response_models: BTreeSet<String> = samples
        .iter()
        .filter_map(|s| s.response_model.clone())
        .collect();
    let expires = now + time::Duration::try_from(validity).unwrap_or(time::Duration::days(30));
    Entry {
        provider: config.id.clone(),
        contract: result.contract.clone(),
        status: if result.certified {
            Status::Certified
        } else {
            Status::Failed
        },
        contract_digest: result.digest.clone(),
        prompt_digest: result.prompt_digest.clone(),
        system_prompt_digest: result.system_prompt_digest.clone(),
        provider_fingerprint: surety_manifest::fingerprint(&behaviour),
        provider_config: behaviour,
        base_url_override: overridden_from.map(str::to_owned),
        price: config
            .price
            .as_ref()
            .and_then(|price| serde_json::to_value(price).ok()),
        served_model: ServedModel {
            response_models: response_models.into_iter().collect(),
            models_endpoint: served,
        },
        tokenizer: result.tokenizer.clone(),
        structured_mode: result.structured_mode.clone(),
        lint: result.lint.clone(),
        counts: result.counts(),
        failures: result.failures(),
        tokens: Tokens {
            prompt_max: samples.iter().map(|s| s.prompt_tokens).max().unwrap_or(0),
            completion_max: samples
                .iter()
                .map(|s| s.completion_tokens)
                .max()
                .unwrap_or(0),
            prompt_total: samples.iter().map(|s| s.prompt_tokens).sum(),
            completion_total: samples.iter().map(|s| s.completion_tokens).sum(),
        },
        latency_ms: Latency {
            p50: pick(0.5),
            p95: pick(0.95),
            max: latencies.last().copied().unwrap_or(0),
        },
        generated_at: now_rfc3339(now),
        expires_at: now_rfc3339(expires),
        harness_version: HARNESS_VERSION.to_owned(),
    }
}
