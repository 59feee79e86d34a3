//! What each page renders, as typed contexts: the templates read these
//! fields and no others, and every value is a plain word or number
//! (minijinja escapes each as it renders it).

use serde::Serialize;

/// The signed-in operator, on every page.
#[derive(Debug, Serialize)]
pub(super) struct OperatorView {
    pub(super) owner: String,
    /// Whose jobs the pages show: an owner, or "every owner".
    pub(super) scope: String,
    /// The session's CSRF token, for the forms that change something.
    pub(super) csrf: String,
}

#[derive(Debug, Serialize)]
pub(super) struct SignInPage<'a> {
    pub(super) error: Option<&'a str>,
    /// The form's token, also set in a cookie for the sign-in path.
    pub(super) csrf: &'a str,
}

/// A job in the attention queue, with what is known of its last attempt.
#[derive(Debug, Serialize)]
pub(super) struct QueueRow {
    pub(super) id: String,
    pub(super) age: String,
    pub(super) route: String,
    pub(super) provider: String,
    pub(super) known: String,
}

#[derive(Debug, Serialize)]
pub(super) struct Figure {
    pub(super) name: &'static str,
    pub(super) value: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct StateCount {
    pub(super) state: String,
    pub(super) count: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct AttemptCount {
    pub(super) provider: String,
    pub(super) outcome: String,
    pub(super) count: u64,
}

#[derive(Debug, Serialize)]
pub(super) struct QueuePage {
    pub(super) operator: OperatorView,
    pub(super) unknown: Vec<QueueRow>,
    pub(super) failed: Vec<QueueRow>,
    pub(super) figures: Vec<Figure>,
    pub(super) by_state: Vec<StateCount>,
    pub(super) attempts: Vec<AttemptCount>,
    pub(super) budgets: Vec<BudgetRow>,
}

/// One budget of the owners the operator sees, in its unit's words.
#[derive(Debug, Serialize)]
pub(super) struct BudgetRow {
    pub(super) name: String,
    pub(super) whom: String,
    pub(super) limit: String,
    pub(super) spent: String,
    pub(super) reserved: String,
    pub(super) held_by_unknown: String,
    pub(super) resets: String,
}

#[derive(Debug, Serialize)]
pub(super) struct AttemptRow {
    pub(super) ordinal: i64,
    pub(super) hedge: bool,
    pub(super) provider: String,
    pub(super) state: &'static str,
    pub(super) started: String,
    pub(super) ended: String,
    pub(super) took: String,
    pub(super) error: String,
    pub(super) open: bool,
    /// The provider's id for the attempt's answer.
    pub(super) response_id: String,
    /// For an unknown attempt: whether, and how, its provider can be asked.
    pub(super) asking: String,
    /// The reconciler's questions about it, in words.
    pub(super) questions: Vec<String>,
    /// What it reserved of each budget and what it spent, in words.
    pub(super) budget: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct RaceRow {
    pub(super) loser: i64,
    pub(super) winner: String,
    pub(super) reason: String,
    pub(super) at: String,
}

#[derive(Debug, Serialize)]
pub(super) struct JobSummary {
    pub(super) id: String,
    pub(super) state: &'static str,
    pub(super) retryable: bool,
    pub(super) route: String,
    pub(super) contract: String,
    pub(super) key: String,
    pub(super) created: String,
    /// How it was asked for (`native`, `chat`, `responses`).
    pub(super) kind: &'static str,
    /// A Responses job: its response id, and the job of the response it
    /// continues.
    pub(super) response_id: Option<String>,
    pub(super) continues: Option<String>,
    /// The input and the answer, as pretty JSON text.
    pub(super) input: String,
    pub(super) result: Option<String>,
    /// A tool-call contract's answer: each call's tool and its arguments
    /// (as pretty JSON text).
    pub(super) tool_calls: Vec<ToolCallRow>,
}

#[derive(Debug, Serialize)]
pub(super) struct ToolCallRow {
    pub(super) tool: String,
    pub(super) arguments: String,
}

#[derive(Debug, Serialize)]
pub(super) struct JobPage {
    pub(super) operator: OperatorView,
    pub(super) job: JobSummary,
    pub(super) attempts: Vec<AttemptRow>,
    pub(super) races: Vec<RaceRow>,
}

/// One route × provider of the certification matrix.
#[derive(Debug, Serialize)]
pub(super) struct CertificationRow {
    pub(super) route: String,
    pub(super) contract: String,
    pub(super) provider: String,
    pub(super) status: String,
    pub(super) reason: String,
    pub(super) expires: String,
    pub(super) drift: Option<String>,
    /// The window of live results, in a sentence.
    pub(super) live: String,
    /// What its live checks cost, on a route with them.
    pub(super) cost: Option<String>,
    /// Its live results' page.
    pub(super) page: String,
    pub(super) demoted: bool,
    /// The provider's prompt-cache tokens read and written, on this
    /// replica since it started (`surety_cache_read_tokens_total`).
    pub(super) cache: String,
}

/// One live result: a shadow call on a job's input, or a re-check of a case.
#[derive(Debug, Serialize)]
pub(super) struct LiveRow {
    pub(super) at: String,
    pub(super) source: &'static str,
    pub(super) outcome: &'static str,
    pub(super) detail: String,
    /// The shadowed job.
    pub(super) job: Option<String>,
    /// The certification case re-checked.
    pub(super) case: String,
}

/// One provider × contract: its certification, demotion and live results.
#[derive(Debug, Serialize)]
pub(super) struct LivePage {
    pub(super) operator: OperatorView,
    pub(super) provider: String,
    pub(super) contract: String,
    pub(super) status: String,
    pub(super) reason: String,
    pub(super) demoted: bool,
    pub(super) summary: String,
    /// What its live checks cost, per route with them.
    pub(super) costs: Vec<String>,
    pub(super) results: Vec<LiveRow>,
}

#[derive(Debug, Serialize)]
pub(super) struct CertificationPage {
    pub(super) operator: OperatorView,
    pub(super) rows: Vec<CertificationRow>,
    /// The manifest in force, in a sentence.
    pub(super) manifest: String,
}

/// The question before an act, and the form that answers it.
#[derive(Debug, Serialize)]
pub(super) struct ConfirmPage<'a> {
    pub(super) operator: OperatorView,
    pub(super) title: &'a str,
    pub(super) explain: &'a str,
    pub(super) confirm: &'a str,
    /// Built from the parsed job id, or the configured provider and
    /// contract, never from the raw path.
    pub(super) action: &'a str,
    /// The page the act was asked from.
    pub(super) back: &'a str,
    /// Whether the form asks why (a reinstate's reason).
    pub(super) asks_reason: bool,
    pub(super) error: Option<String>,
}
