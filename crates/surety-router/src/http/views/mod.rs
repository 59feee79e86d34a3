//! What the HTTP API answers, as typed views: each one serialized as it is
//! documented (`utoipa::ToSchema`), so `/openapi.json` is derived from the
//! same types the handlers return. Every value users read is a stable
//! snake_case word, never Rust's Debug output.

mod budgets;
mod messages;
mod responses;

pub use budgets::*;
pub use messages::*;
pub use responses::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use surety_store::{Attempt, Job, JobId, JobKind, Slot};
use utoipa::ToSchema;

/// `POST /v1/providers/{provider}/contracts/{contract}/reinstate`: why an
/// admin lifts a demotion (recorded with who and when).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reinstate {
    /// In words, for the record (at most 500 characters).
    pub reason: String,
}

/// `POST /v1/jobs`: what the owner wants done.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateJob {
    /// A configured route; it names the contract and the providers.
    pub route: String,
    /// The contract's template variables.
    #[schema(value_type = Object)]
    pub input: Value,
}

/// A job: one intent, however many attempts it took.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub id: String,
    /// Always `job`.
    pub object: String,
    #[schema(value_type = String, pattern = "^(queued|running|unknown|succeeded|failed|cancelled)$")]
    pub state: String,
    pub route: String,
    pub contract: String,
    pub contract_digest: String,
    /// How it was asked for: `native` (`POST /v1/jobs`), `chat` (`POST
    /// /v1/chat/completions`), `responses` (`POST /v1/responses`) or
    /// `messages` (`POST /v1/messages`); a
    /// replay answers in the same dialect.
    #[schema(value_type = String, pattern = "^(native|chat|responses|messages)$")]
    pub kind: String,
    /// A `responses` job: the response it is (`resp_…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_id: Option<String>,
    /// A `responses` job that continues an earlier response
    /// (`previous_response_id`): that response's job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continues: Option<String>,
    /// Moves when the job completes or is cancelled.
    pub version: i64,
    pub created_at_ms: i64,
    pub attempts: Vec<AttemptView>,
    /// The answer, when the job succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    /// The attempt whose answer won.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_by: Option<i64>,
    /// The winning provider call's tokens, as the provider counted them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
    /// Why the winning call stopped, in OpenAI's words (`stop`, `length`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// Tokens, as a provider counted them.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct UsageView {
    /// Every prompt token, cached or not.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of the prompt, the tokens the provider read from its cache.
    pub cache_read_tokens: u64,
    /// Of the prompt, the tokens the provider wrote to its cache.
    pub cache_write_tokens: u64,
}

/// One try at one provider.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptView {
    pub ordinal: i64,
    pub provider: String,
    #[schema(value_type = String, pattern = "^(started|succeeded|failed|unknown|lost|cancelled)$")]
    pub state: String,
    /// Started in the hedging slot.
    pub hedge: bool,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub error: Option<String>,
    /// The provider's id for the attempt's answer (`chatcmpl-…`, `msg_…`,
    /// Gemini's `responseId`), written as soon as it was read.
    pub provider_response_id: Option<String>,
    /// The questions the reconciler asked the provider about the attempt
    /// while it was unknown, oldest first (in the attempts list).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reconciliation: Vec<QuestionView>,
    /// What the attempt reserved of each of its job's budgets, and what it
    /// spent once it ended (in the attempts list).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<ReservationView>,
}

/// What one attempt reserved of one budget.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReservationView {
    pub budget: String,
    /// `micros` (millionths of the budget's currency) or `tokens`.
    #[schema(value_type = String, pattern = "^(micros|tokens)$")]
    pub unit: String,
    /// The attempt's worst case, held until it ended.
    pub reserved: i64,
    /// What it spent: none while held (the attempt open or unknown).
    pub spent: Option<i64>,
    pub reserved_at_ms: i64,
    pub settled_at_ms: Option<i64>,
}

/// One question the reconciler asked a provider about an unknown attempt.
#[derive(Debug, Serialize, ToSchema)]
pub struct QuestionView {
    pub asked_at_ms: i64,
    /// `id` (the provider's id for the answer) or `metadata` (the
    /// attempt's name in the stored answer's metadata).
    #[schema(value_type = String, pattern = "^(id|metadata)$")]
    pub asked_by: String,
    #[schema(value_type = String, pattern = "^(answered|ended|running|not_found|error)$")]
    pub outcome: String,
    /// What the provider said, in words.
    pub detail: String,
}

/// A job's attempts, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<AttemptView>,
}

impl JobView {
    pub fn of(job: &Job, attempts: &[Attempt]) -> JobView {
        JobView {
            id: job.id.0.clone(),
            object: "job".to_owned(),
            state: job.state.as_str().to_owned(),
            route: job.route.clone(),
            contract: job.contract.clone(),
            contract_digest: job.contract_digest.clone(),
            kind: job.kind.as_str().to_owned(),
            response_id: (job.kind == JobKind::Responses).then(|| response_id(job)),
            continues: continues(job).map(|id| id.0),
            version: job.version,
            created_at_ms: job.created_at_ms,
            attempts: attempts.iter().map(AttemptView::of).collect(),
            result: job.result.clone(),
            completed_by: job.result.as_ref().and(job.completed_by),
            usage: UsageView::of(job),
            finish_reason: finish_reason(job),
        }
    }
}

impl UsageView {
    /// The winning call's tokens, as the job recorded them.
    pub fn of(job: &Job) -> Option<UsageView> {
        let usage = &job.completion.as_ref()?["usage"];
        Some(UsageView {
            prompt_tokens: usage["prompt_tokens"].as_u64()?,
            completion_tokens: usage["completion_tokens"].as_u64()?,
            // A job recorded before caching was counted read nothing.
            cache_read_tokens: usage["cache_read_tokens"].as_u64().unwrap_or(0),
            cache_write_tokens: usage["cache_write_tokens"].as_u64().unwrap_or(0),
        })
    }
}

/// The job of the response a Responses job continues, as its request
/// named it (`previous_response_id`).
pub fn continues(job: &Job) -> Option<JobId> {
    let request = job.request.as_ref()?;
    response_job(request["previous_response_id"].as_str()?)
}

/// Why the winning call stopped, in OpenAI's words, as the job recorded it.
pub fn finish_reason(job: &Job) -> Option<String> {
    job.completion.as_ref()?["finish_reason"]
        .as_str()
        .map(str::to_owned)
}

impl AttemptView {
    pub fn of(a: &Attempt) -> AttemptView {
        AttemptView {
            ordinal: a.ordinal,
            provider: a.provider.clone(),
            state: a.state.as_str().to_owned(),
            hedge: a.slot == Slot::Hedge,
            started_at_ms: a.started_at_ms,
            finished_at_ms: a.finished_at_ms,
            error: a.error.clone(),
            provider_response_id: a.provider_response_id.clone(),
            reconciliation: Vec::new(),
            reservations: Vec::new(),
        }
    }
}

impl AttemptList {
    /// The attempts, each with the questions asked about it and what it
    /// reserved.
    pub fn of(
        attempts: &[Attempt],
        questions: &[surety_store::Question],
        reservations: &[surety_store::Reservation],
    ) -> AttemptList {
        AttemptList {
            object: "list".to_owned(),
            data: attempts
                .iter()
                .map(|a| AttemptView {
                    reconciliation: questions
                        .iter()
                        .filter(|q| q.ordinal == a.ordinal)
                        .map(|q| QuestionView {
                            asked_at_ms: q.asked_at_ms,
                            asked_by: q.asked_by.clone(),
                            outcome: q.outcome.clone(),
                            detail: q.detail.clone(),
                        })
                        .collect(),
                    reservations: reservations
                        .iter()
                        .filter(|r| r.ordinal == a.ordinal)
                        .map(|r| ReservationView {
                            budget: r.budget.clone(),
                            unit: r.unit.as_str().to_owned(),
                            reserved: r.amount,
                            spent: r.spent,
                            reserved_at_ms: r.reserved_at_ms,
                            settled_at_ms: r.settled_at_ms,
                        })
                        .collect(),
                    ..AttemptView::of(a)
                })
                .collect(),
        }
    }
}

/// An error: RFC 9457 problem details, one stable `type` per error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProblemView {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
}

/// `/readyz`: whether a manifest is in force.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// A manifest is in force and the database answers.
    pub ready: bool,
    /// `up`, or `down` when it did not answer a round trip in time.
    pub database: String,
    /// Why the database is down, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_error: Option<String>,
    pub manifest_entries: Option<usize>,
    pub manifest_generated_at: Option<String>,
    /// Why the last reload of the manifest was refused, if it was.
    pub last_reload_refused: Option<String>,
}

/// `/v1/providers`: each provider's certification per contract, and the routes.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProviderList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ProviderView>,
    pub routes: Vec<RouteView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProviderView {
    pub id: String,
    pub kind: String,
    pub model: String,
    pub base_url: String,
    /// By contract id.
    pub certification: std::collections::BTreeMap<String, CertificationView>,
    /// The last answer from a model id its certificate did not see.
    pub drift: Option<DriftView>,
    /// Whether its unknown attempts can be resolved by asking it, and how.
    pub reconciliation: ReconciliationView,
    /// What its tokens cost, where its configuration says (what budgets
    /// charge it at).
    pub price: Option<PriceView>,
}

/// How a provider's unknown attempts are resolved.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReconciliationView {
    /// `stored-completions` (OpenAI chat completions, with `store = true`),
    /// `responses` (the Responses API, with `store = true`) or `none`.
    #[schema(value_type = String, pattern = "^(stored-completions|responses|none)$")]
    pub way: String,
    /// Whether an unknown attempt here can be resolved by asking.
    pub can_ask: bool,
    /// How, in words.
    pub how: String,
}

impl ReconciliationView {
    pub fn of(way: surety_providers::kinds::Reconciliation) -> ReconciliationView {
        use surety_providers::kinds::Reconciliation;
        let how = match way {
            Reconciliation::StoredCompletions => {
                "asked afterwards: its stored completion is read back by the id the answer began with, else found by the attempt's metadata"
            }
            Reconciliation::Responses => {
                "asked afterwards: its stored response is read back by the id the create call answered with (a background one is polled on, and cancelled there with its attempt)"
            }
            Reconciliation::None => {
                "cannot be asked: the provider keeps nothing to read back, so an unknown attempt waits for a late answer or an operator"
            }
        };
        ReconciliationView {
            way: way.as_str().to_owned(),
            can_ask: way != Reconciliation::None,
            how: how.to_owned(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CertificationView {
    #[schema(
        value_type = String,
        pattern = "^(certified|missing|failed|stale|prompt_changed|provider_changed|expired)$"
    )]
    pub status: String,
    /// Why, in words.
    pub reason: String,
    pub expires_at: Option<String>,
    /// The model ids its certificate saw answer.
    pub certified_models: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DriftView {
    pub contract: String,
    pub model: String,
    pub certified_models: Vec<String>,
    pub at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RouteView {
    pub id: String,
    pub contract: String,
    pub providers: Vec<String>,
    #[schema(value_type = String, pattern = "^(pinned|output-only)$")]
    pub facade: String,
    /// Whether `/v1/chat/completions` sends only certified prompts on it.
    pub prompt_certified: bool,
    /// Why a pinned route's user template cannot be read back, if it cannot.
    pub pinning_unavailable: Option<String>,
}

/// An error in OpenAI's format (`/v1/chat/completions`, `/v1/models`).
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorView {
    pub error: OpenAiErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: String,
}

/// `POST /v1/chat/completions`, as far as surety reads it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatRequestDoc {
    /// A route's id.
    pub model: String,
    /// On a pinned route: the contract's rendered system prompt, then a
    /// user message its user template renders.
    pub messages: Vec<ChatMessageDoc>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptionsDoc>,
    pub n: Option<u32>,
    pub user: Option<String>,
    /// Only the contract's own.
    pub temperature: Option<f64>,
    /// Only the contract's own.
    pub max_tokens: Option<u32>,
    /// Only the contract's own.
    pub max_completion_tokens: Option<u32>,
    /// Only the contract's own.
    pub seed: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatMessageDoc {
    #[schema(value_type = String, pattern = "^(system|developer|user|assistant)$")]
    pub role: String,
    pub content: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StreamOptionsDoc {
    pub include_usage: Option<bool>,
}

/// A chat completion (`stream` off); with `stream` on, the same as
/// server-sent `chat.completion.chunk` events, then `data: [DONE]`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: UsageTotals,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Choice {
    pub index: u32,
    pub message: AnswerMessage,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    pub finish_reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AnswerMessage {
    pub role: String,
    /// The contract's JSON answer, as text; none for a tool-call contract.
    #[schema(required = true)]
    pub content: Option<String>,
    pub refusal: Option<String>,
    /// A tool-call contract's answer: its call (or calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallView>>,
}

/// One tool call of an answer, in OpenAI's words.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallView {
    /// Derived from the job (and the call's place): a replay has the same.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCallView,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionCallView {
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

/// A piece of a streamed tool call: its place, then (first) its id, type
/// and name, then pieces of its arguments.
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionDelta,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UsageTotals {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// Of the prompt's tokens, the ones the provider read from its cache.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u64,
}

/// One `chat.completion.chunk` of a streamed answer (the `data` of an event).
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: i64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// On the last chunk, when `stream_options.include_usage` asked for it.
    pub usage: Option<UsageTotals>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    #[schema(value_type = Option<Object>)]
    pub logprobs: Option<Value>,
    pub finish_reason: Option<String>,
}

/// What a chunk adds: the role first, then pieces of the content.
#[derive(Debug, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// `/v1/models`: the routes.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelView {
    pub id: String,
    pub object: String,
    pub created: i64,
    pub owned_by: String,
}

/// One server-sent event of a streamed completion: `data` is a
/// `chat.completion.chunk` as JSON text, and the last event's is `[DONE]`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChunkEventDoc {
    pub data: String,
    pub event: Option<String>,
    pub id: Option<String>,
}
