//! Budgets and prices as the API shows them: money in its currency's
//! units (a decimal), tokens as counts.

use serde::Serialize;
use utoipa::ToSchema;

/// `GET /v1/budget`: the caller's budgets (its owner's, and its key's).
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetList {
    pub budgets: Vec<BudgetView>,
}

/// One budget, as the database holds it now.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetView {
    pub name: String,
    /// `owner` (every job of the owner) or `key` (the jobs of one API key,
    /// counted inside its owner's budgets too).
    #[schema(value_type = String, pattern = "^(owner|key)$")]
    pub counts: &'static str,
    /// A currency code (`USD`), or `tokens`.
    pub unit: String,
    /// `day`, `month`, `rolling` or `total`.
    #[schema(value_type = String, pattern = "^(day|month|rolling|total)$")]
    pub period: &'static str,
    /// A rolling budget's window, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// `refuse` (a job past it is refused before any call) or `record`.
    #[schema(value_type = String, pattern = "^(refuse|record)$")]
    pub at_limit: &'static str,
    pub limit: f64,
    /// Spent this period: what answered attempts cost, and the worst case
    /// of attempts that ended without saying what they cost.
    pub spent: f64,
    /// Held now by attempts in flight or unknown (their worst cases).
    pub reserved: f64,
    /// Of `reserved`, what unknown attempts hold: they may have been billed.
    pub held_by_unknown: f64,
    /// What a new attempt may still reserve.
    pub left: f64,
    /// When the period ends (RFC 3339); none for a total.
    pub resets_at: Option<String>,
}

/// A provider's prices, per million tokens.
#[derive(Debug, Serialize, ToSchema)]
pub struct PriceView {
    pub currency: String,
    pub input_per_million: f64,
    pub output_per_million: f64,
    pub cached_input_per_million: f64,
}

impl PriceView {
    pub fn of(price: &surety_providers::Price) -> PriceView {
        let units = |micros: u64| micros as f64 / 1e6;
        PriceView {
            currency: price.currency.clone(),
            input_per_million: units(price.input_micros_per_million),
            output_per_million: units(price.output_micros_per_million),
            cached_input_per_million: units(price.cached_input_micros_per_million),
        }
    }
}
