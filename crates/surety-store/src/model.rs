//! The store's records and the arguments of its operations.

use std::fmt;
use std::time::Duration;

use serde_json::Value;
use surety_core::{AttemptState, Fingerprint, IdempotencyKey, JobState};

/// A job's id: a UUIDv7, so ids sort by creation time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub String);

/// Who a job belongs to: the account behind an API key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub String);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a client asks for. The fingerprint is computed from `route` and
/// `input` (see [`surety_core::Intent`]) unless the caller gives its own,
/// e.g. over a whole request body.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub owner: OwnerId,
    pub key: IdempotencyKey,
    pub route: String,
    pub contract: String,
    pub contract_digest: String,
    pub input: Value,
    /// How the job was asked for.
    pub kind: JobKind,
    /// What its attempts send when it is not the contract's rendering of
    /// `input`: the client's own messages (a chat job on an output-only
    /// route), as `[{"role": ..., "content": ...}]`.
    pub messages: Option<Value>,
    /// The request the job was created from, when its dialect needs it
    /// back later (a Responses job's body): kept as sent, never changed.
    pub request: Option<Value>,
    /// The contract declares `side_effects = "none"`, so a hedging attempt is allowed.
    pub hedgeable: bool,
    pub fingerprint: Option<Fingerprint>,
}

/// The answer to create-or-replay.
#[derive(Debug, Clone)]
pub enum Created {
    /// A new job was recorded.
    New(Job),
    /// The same owner sent the same key with the same intent: this is the
    /// job recorded the first time.
    Replayed(Job),
    /// The same owner sent the same key with a different intent. The stored
    /// job is not shown and not touched.
    Conflict,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: JobId,
    pub owner: OwnerId,
    pub key: String,
    pub route: String,
    pub contract: String,
    pub contract_digest: String,
    pub input: Value,
    pub fingerprint: Fingerprint,
    pub hedgeable: bool,
    pub state: JobState,
    pub version: i64,
    pub result: Option<Value>,
    pub completed_by: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// How the winning attempt's provider answered (usage, finish reason),
    /// when it said.
    pub completion: Option<Value>,
    pub kind: JobKind,
    /// See [`NewJob::messages`].
    pub messages: Option<Value>,
    /// See [`NewJob::request`].
    pub request: Option<Value>,
    /// When its owner deleted the response this job is: it is no longer
    /// found as a response, while the job stays.
    pub deleted_at_ms: Option<i64>,
}

/// How a job was asked for: recorded with it, never guessed from its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// `POST /v1/jobs`: the input is the contract's.
    Native,
    /// `POST /v1/chat/completions`: the input is the contract's, read back
    /// from the client's messages, or (output-only) the whole request, with
    /// its messages kept in `messages`.
    Chat,
    /// `POST /v1/responses`: as a chat job, with the whole conversation
    /// (earlier responses' items, then its own input) in `messages` on an
    /// output-only route, and its body in `request`.
    Responses,
    /// `POST /v1/messages`: as a chat job, answered in Anthropic's shape.
    Messages,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Native => "native",
            JobKind::Chat => "chat",
            JobKind::Responses => "responses",
            JobKind::Messages => "messages",
        }
    }

    pub fn parse(text: &str) -> Option<JobKind> {
        match text {
            "native" => Some(JobKind::Native),
            "chat" => Some(JobKind::Chat),
            "responses" => Some(JobKind::Responses),
            "messages" => Some(JobKind::Messages),
            _ => None,
        }
    }
}

/// Which slot an attempt takes: the job's one regular slot, or the single
/// extra hedging slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    Primary,
    Hedge,
}

impl Slot {
    pub(crate) fn as_i64(self) -> i64 {
        match self {
            Slot::Primary => 0,
            Slot::Hedge => 1,
        }
    }

    pub(crate) fn from_i64(n: i64) -> Option<Slot> {
        match n {
            0 => Some(Slot::Primary),
            1 => Some(Slot::Hedge),
            _ => None,
        }
    }
}

/// How to start an attempt.
#[derive(Debug, Clone)]
pub struct StartAttempt {
    pub provider: String,
    pub slot: Slot,
    /// How long the attempt is held without a heartbeat before the reaper
    /// turns it unknown.
    pub lease: Duration,
    /// The certification the provider's trust rests on: with it, the
    /// attempt's own insert refuses a provider with an open demotion on
    /// that contract at or after the certification
    /// ([`StoreError::Demoted`](crate::StoreError::Demoted)).
    pub trust: Option<Trust>,
    /// What the attempt reserves of each budget it counts in, in the same
    /// transaction that writes it; over any budget's limit, nothing is
    /// written ([`StoreError::OverBudget`](crate::StoreError::OverBudget)).
    /// Empty: no budget counts it.
    pub charges: Vec<Charge>,
}

/// What an attempt reserves of one budget before its provider is called:
/// its worst case, held until the attempt ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The budget's name (its account).
    pub budget: String,
    pub unit: Unit,
    /// The worst case, in `unit`.
    pub amount: i64,
    /// The most the budget's period may hold, spent and held together;
    /// `None`: recorded, never refused.
    pub limit: Option<i64>,
    /// Spend recorded in buckets from this one on counts against `limit`.
    pub counts_from_ms: i64,
    /// The bucket (the start of the period, or of the window's slice) the
    /// attempt's spend is recorded in.
    pub bucket_ms: i64,
}

/// What a budget counts: millionths of its currency, or tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Micros,
    Tokens,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Micros => "micros",
            Unit::Tokens => "tokens",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Unit> {
        match text {
            "micros" => Some(Unit::Micros),
            "tokens" => Some(Unit::Tokens),
            _ => None,
        }
    }
}

/// What an attempt cost at its provider, in each unit a budget may count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    pub micros: i64,
    pub tokens: i64,
}

impl Cost {
    pub fn of(self, unit: Unit) -> i64 {
        match unit {
            Unit::Micros => self.micros,
            Unit::Tokens => self.tokens,
        }
    }
}

/// A budget as the database holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetStatus {
    pub budget: String,
    /// Spent in the buckets that count (from `counts_from_ms` on).
    pub spent: i64,
    /// Held by open reservations (every attempt not yet ended).
    pub held: i64,
    /// Of `held`, what unknown attempts hold.
    pub held_by_unknown: i64,
    /// The oldest bucket that counts and holds spend, if any.
    pub oldest_bucket_ms: Option<i64>,
}

/// What one attempt reserved of one budget, and what it cost once it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub ordinal: i64,
    pub budget: String,
    pub unit: Unit,
    pub amount: i64,
    pub reserved_at_ms: i64,
    /// `None` while held.
    pub spent: Option<i64>,
    pub settled_at_ms: Option<i64>,
}

/// A provider's certification for a contract, as an attempt rests on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    pub contract: String,
    /// When the certification was made (ms since the epoch); a demotion at
    /// or after it stands, an older one was lifted by it.
    pub certified_at_ms: i64,
}

/// What the process running an attempt holds: enough to heartbeat it and to
/// finish it with compare-and-swap on the version it started from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptHandle {
    pub job_id: JobId,
    pub ordinal: i64,
    pub slot: Slot,
    pub provider: String,
    pub base_version: i64,
    /// The attempt may hold reservations: ending it settles them. False
    /// only where the store knows it reserved nothing.
    pub charged: bool,
}

/// An unknown attempt the reconciler may ask its provider about.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownAttempt {
    pub owner: OwnerId,
    pub attempt: Attempt,
}

/// One question the reconciler asked a provider about an unknown attempt,
/// and what the provider said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub ordinal: i64,
    /// Its number among the attempt's questions (1, 2, …).
    pub n: i64,
    pub provider: String,
    pub asked_at_ms: i64,
    /// `id` (the provider's id for the answer) or `metadata` (the
    /// attempt's name in the stored answer's metadata).
    pub asked_by: String,
    /// `answered`, `ended`, `running`, `not_found` or `error`.
    pub outcome: String,
    /// What it said, in words.
    pub detail: String,
}

/// An attempt named by its job and ordinal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptRef {
    pub owner: OwnerId,
    pub job_id: JobId,
    pub ordinal: i64,
}

/// An attempt as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub job_id: JobId,
    pub ordinal: i64,
    pub slot: Slot,
    pub provider: String,
    pub state: AttemptState,
    pub base_version: i64,
    pub started_at_ms: i64,
    pub lease_expires_at_ms: i64,
    pub unknown_since_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub error: Option<String>,
    /// The provider's id for this attempt's answer, as soon as it was read.
    pub provider_response_id: Option<String>,
    /// When the reconciler last asked the provider about it.
    pub asked_at_ms: Option<i64>,
}

/// How an attempt ended at its provider.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// An answer that keeps the contract.
    Succeeded(Answer),
    /// A definite failure. With `give_up` the job becomes `failed` (no other
    /// provider is left); otherwise it waits, `queued`, for the next attempt.
    ///
    /// `spend` is what its reservations become: [`Spend::Nothing`] where
    /// the provider said it did no work, the answer's usage where it
    /// answered and the answer failed its checks (the tokens were billed).
    Failed {
        error: String,
        give_up: bool,
        spend: Spend,
    },
}

/// What an ended attempt's (or a check's) reservations become spend of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// A definite failure before any answer: the provider did no work to
    /// bill.
    Nothing,
    /// What the provider reported it used.
    Cost(Cost),
    /// Not known (no usage said, or resolved by an operator): the worst
    /// case reserved, since it may have been billed.
    WorstCase,
}

/// An answer, and how the provider gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// What the job's result becomes.
    pub result: Value,
    /// The provider's own record of the call (usage, finish reason), kept
    /// with the job when this answer wins.
    pub completion: Option<Value>,
    /// The provider's id for the answer, written on the attempt where it
    /// was not yet.
    pub response_id: Option<String>,
    /// What the call cost, from the usage the provider reported: the
    /// attempt's reservations are settled to it. `None` (no usage said):
    /// settled at the worst case reserved.
    pub cost: Option<Cost>,
}

impl From<Value> for Answer {
    fn from(result: Value) -> Answer {
        Answer {
            result,
            completion: None,
            response_id: None,
            cost: None,
        }
    }
}

/// What finishing an attempt did.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// The attempt's result won the compare-and-swap and is the job's.
    Won(Box<Job>),
    /// The job was already completed by `winner`, or the attempt had been
    /// cancelled: the result was discarded and the race recorded.
    Lost { winner: Option<i64> },
    /// The failure was recorded.
    Failed,
}

/// A lost compare-and-swap, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Race {
    pub loser_ordinal: i64,
    pub winner_ordinal: Option<i64>,
    pub reason: String,
    pub at_ms: i64,
}

/// Where a live result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveSource {
    /// A succeeded job's certified request, sent to another provider.
    Shadow,
    /// A certification case, on the route's schedule.
    Recheck,
}

/// What a live check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveOutcome {
    /// The answer keeps the contract (and, for a shadow call, agrees).
    Kept,
    /// The answer breaks the contract (parse, schema, rules, or a case's facts).
    Broke,
    /// The answer keeps the contract but differs from the job's on an
    /// agreement pointer.
    Disagreed,
    /// The provider did not answer (an error or a timeout).
    Failed,
}

/// A live result as a demotion is judged: where it came from, what it
/// found, in words (none of its JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveVerdict {
    pub source: LiveSource,
    pub outcome: LiveOutcome,
    pub detail: String,
}

/// One live check of a provider on a contract, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveResult {
    pub provider: String,
    pub contract: String,
    pub route: String,
    pub source: LiveSource,
    pub outcome: LiveOutcome,
    /// What was found, in words.
    pub detail: String,
    /// The shadowed job (a shadow call).
    pub job_id: Option<JobId>,
    /// The certification case (a re-check).
    pub case_name: Option<String>,
    pub input: Value,
    /// What the answer should have said on the agreement pointers: the
    /// job's answer there (a shadow call), or the case's facts (a re-check).
    pub expected: Option<Value>,
    pub answer: Option<Value>,
    /// When it was recorded (the database's clock); ignored when recording.
    pub at_ms: i64,
}

/// A provider × contract the router no longer trusts, until lifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demotion {
    pub provider: String,
    pub contract: String,
    /// Why, in words.
    pub reason: String,
    pub demoted_at_ms: i64,
}

/// Who lifts a demotion, and on what grounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lift {
    /// A certification generated at `certified_at_ms`: it lifts only a
    /// demotion older than itself.
    Certification { certified_at_ms: i64 },
    /// An admin's explicit reinstate: `by` names them.
    Admin { by: String, why: String },
}

macro_rules! words {
    ($name:ident { $($variant:ident => $word:literal),* $(,)? }) => {
        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $word),* }
            }

            pub fn parse(word: &str) -> Option<$name> {
                match word { $($word => Some($name::$variant),)* _ => None }
            }
        }
    };
}

words!(LiveSource { Shadow => "shadow", Recheck => "recheck" });
words!(LiveOutcome { Kept => "kept", Broke => "broke", Disagreed => "disagreed", Failed => "failed" });
