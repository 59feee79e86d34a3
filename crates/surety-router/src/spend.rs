//! Budgets as the router charges them: which budgets a job counts against
//! (its owner's, and its key's inside them), an attempt's worst case at its
//! provider (the prompt's tokens by the provider's tokenizer, the one its
//! certificates were judged by, plus the contract's `max_output_tokens`, at
//! the provider's price), what an answer cost, and a refusal in words. The
//! database holds and arbitrates the reservations
//! ([`surety_store::Charge`]); nothing here keeps a count.

use std::collections::BTreeMap;

use surety_providers::{Message, ProviderConfig, Usage};
use surety_store::{Charge, Cost, StoreError, Unit};
use time::OffsetDateTime;

use crate::certification::{ServedContract, ServedProvider};
use crate::config::{AtLimit, Budget, BudgetUnit, Payer, Period, RouterConfig};

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// Every configured budget, and each named key's owner.
#[derive(Debug, Default)]
pub struct Spending {
    pub budgets: Vec<Budget>,
    /// A key's name → its owner.
    owners: BTreeMap<String, String>,
}

/// A job or an attempt refused for a budget with no room: in words, and
/// when waiting helps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The budget, what is left of it, and when it resets.
    pub detail: String,
    /// Seconds until it resets; none for a total.
    pub retry_after: Option<u64>,
}

/// When a budget's period began and when it counts afresh (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Spend in buckets from this one on counts.
    pub counts_from_ms: i64,
    /// The bucket spend now goes in.
    pub bucket_ms: i64,
    /// When the period ends (a total never does).
    pub resets_at_ms: Option<i64>,
}

impl Budget {
    /// The budget's window at `now_ms`: a UTC day or month, the rolling
    /// window in sixtieths of it (a slice part-way out still counts, so a
    /// window never counts less than it holds), or everything.
    pub fn window(&self, now_ms: i64) -> Window {
        match self.period {
            Period::Day => {
                let day = now_ms - now_ms.rem_euclid(DAY_MS);
                Window {
                    counts_from_ms: day,
                    bucket_ms: day,
                    resets_at_ms: Some(day + DAY_MS),
                }
            }
            Period::Month => {
                let (start, next) = month(now_ms);
                Window {
                    counts_from_ms: start,
                    bucket_ms: start,
                    resets_at_ms: Some(next),
                }
            }
            Period::Rolling(window) => {
                let window = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
                let slice = (window / 60).max(1);
                let bucket = now_ms - now_ms.rem_euclid(slice);
                let from = now_ms - window;
                let from = from - from.rem_euclid(slice);
                Window {
                    counts_from_ms: from,
                    bucket_ms: bucket,
                    // The oldest slice's spend leaves the window as the
                    // next slice begins.
                    resets_at_ms: Some(from + window + slice),
                }
            }
            Period::Total => Window {
                counts_from_ms: 0,
                bucket_ms: 0,
                resets_at_ms: None,
            },
        }
    }

    pub fn store_unit(&self) -> Unit {
        match self.unit {
            BudgetUnit::Money(_) => Unit::Micros,
            BudgetUnit::Tokens => Unit::Tokens,
        }
    }

    /// `amount` of this budget's unit, in words (`0.42 USD`, `1200 tokens`).
    pub fn say(&self, amount: i64) -> String {
        match &self.unit {
            BudgetUnit::Money(currency) => {
                let units = format!("{:.6}", amount as f64 / 1e6);
                let (whole, part) = units.split_once('.').unwrap_or((&units, ""));
                let part = part.trim_end_matches('0');
                format!("{whole}.{part:0<2} {currency}")
            }
            BudgetUnit::Tokens => format!("{amount} tokens"),
        }
    }

    /// The owner whose jobs the budget counts.
    pub fn owner<'a>(&'a self, spending: &'a Spending) -> &'a str {
        match &self.payer {
            Payer::Owner(owner) => owner,
            Payer::Key(key) => spending.owners.get(key).map_or("", String::as_str),
            // The operator's, which no owner's scope holds.
            Payer::Checks(_) => "",
        }
    }

    pub fn for_whom(&self) -> String {
        match &self.payer {
            Payer::Owner(owner) => format!("owner `{owner}`"),
            Payer::Key(key) => format!("key `{key}`"),
            Payer::Checks(route) => format!("route `{route}`'s live checks"),
        }
    }
}

/// The UTC month `now_ms` falls in: its first and the next month's first
/// millisecond.
fn month(now_ms: i64) -> (i64, i64) {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(now_ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let first = |year: i32, month: time::Month| {
        time::Date::from_calendar_date(year, month, 1)
            .map(|d| d.midnight().assume_utc().unix_timestamp() * 1000)
            .unwrap_or(0)
    };
    let start = first(at.year(), at.month());
    let next = match at.month() {
        time::Month::December => first(at.year() + 1, time::Month::January),
        m => first(at.year(), m.next()),
    };
    (start, next)
}

impl Spending {
    pub fn new(config: &RouterConfig) -> Spending {
        Spending {
            budgets: config.budgets.clone(),
            owners: config
                .api_keys
                .values()
                .filter_map(|k| Some((k.name.clone()?, k.owner.clone())))
                .collect(),
        }
    }

    /// The budgets a job of `owner`, asked for with the key named `key`,
    /// counts against: the owner's, and the key's.
    pub fn of<'a>(
        &'a self,
        owner: &'a str,
        key: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Budget> {
        self.budgets.iter().filter(move |b| match &b.payer {
            Payer::Owner(o) => o == owner,
            Payer::Key(k) => {
                Some(k.as_str()) == key && self.owners.get(k).map(String::as_str) == Some(owner)
            }
            Payer::Checks(_) => false,
        })
    }

    /// The budgets the router's own checks of `route` count against.
    pub fn of_checks<'a>(&'a self, route: &'a str) -> impl Iterator<Item = &'a Budget> {
        self.budgets
            .iter()
            .filter(move |b| matches!(&b.payer, Payer::Checks(r) if r == route))
    }

    /// What an attempt reserved of a budget and what it spent, in words
    /// (`reserved 0.00066 USD of acme-daily, spent 0.000204 USD`).
    pub fn say(&self, r: &surety_store::Reservation) -> String {
        let amount = |n: i64| match self.budgets.iter().find(|b| b.name == r.budget) {
            Some(budget) => budget.say(n),
            None => format!("{n} {}", r.unit.as_str()),
        };
        match r.spent {
            Some(spent) => format!(
                "reserved {} of {}, spent {}",
                amount(r.amount),
                r.budget,
                amount(spent)
            ),
            None => format!("holds {} of {}", amount(r.amount), r.budget),
        }
    }

    /// The key a job's budgets name, from the budgets its attempts
    /// reserved of (what a later attempt, started where the asking key is
    /// not known, charges again).
    pub fn key_of<'a>(&'a self, reserved: impl IntoIterator<Item = &'a str>) -> Option<String> {
        let names: Vec<&str> = reserved.into_iter().collect();
        self.budgets.iter().find_map(|b| match &b.payer {
            Payer::Key(k) if names.contains(&b.name.as_str()) => Some(k.clone()),
            _ => None,
        })
    }

    /// What an attempt of worst case `worst` reserves of each of the job's
    /// budgets at `now_ms`.
    pub fn charges(&self, owner: &str, key: Option<&str>, worst: Cost, now_ms: i64) -> Vec<Charge> {
        charges(self.of(owner, key), worst, now_ms)
    }

    /// What one of the router's checks of `route`, of worst case `worst`,
    /// reserves of each of the route's checks budgets at `now_ms`.
    pub fn check_charges(&self, route: &str, worst: Cost, now_ms: i64) -> Vec<Charge> {
        charges(self.of_checks(route), worst, now_ms)
    }

    /// A refusal for being over a budget, in words: the budget, what is
    /// left, and when it resets (`Retry-After`).
    pub fn refusal(&self, error: &StoreError, now_ms: i64) -> Refusal {
        let StoreError::OverBudget {
            budget,
            limit,
            spent,
            held,
            asked,
            oldest_bucket_ms,
        } = error
        else {
            return Refusal {
                detail: error.to_string(),
                retry_after: None,
            };
        };
        let (limit, spent, held, asked) = (*limit, *spent, *held, *asked);
        let Some(config) = self.budgets.iter().find(|b| &b.name == budget) else {
            return Refusal {
                detail: error.to_string(),
                retry_after: None,
            };
        };
        let resets = resets(config, config.window(now_ms), *oldest_bucket_ms);
        let left = (limit - spent - held).max(0);
        let when = resets.map_or_else(
            || "; it is a total and does not reset".to_owned(),
            |ms| format!("; it resets at {}", rfc3339(ms)),
        );
        Refusal {
            detail: format!(
                "budget `{budget}` of {} has {} left of {} ({} spent, {} held by attempts in flight or unknown), and this job's attempt may cost up to {}{when}",
                config.for_whom(),
                config.say(left),
                config.say(limit),
                config.say(spent),
                config.say(held),
                config.say(asked),
            ),
            retry_after: resets
                .map(|ms| u64::try_from((ms - now_ms).max(1000) / 1000).unwrap_or(1)),
        }
    }
}

/// What an attempt (or a check) of worst case `worst` reserves of each of
/// `budgets` at `now_ms`.
fn charges<'a>(budgets: impl Iterator<Item = &'a Budget>, worst: Cost, now_ms: i64) -> Vec<Charge> {
    budgets
        .map(|budget| {
            let window = budget.window(now_ms);
            Charge {
                budget: budget.name.clone(),
                unit: budget.store_unit(),
                amount: worst.of(budget.store_unit()),
                limit: match budget.at_limit {
                    AtLimit::Refuse => Some(budget.limit),
                    AtLimit::Record => None,
                },
                counts_from_ms: window.counts_from_ms,
                bucket_ms: window.bucket_ms,
            }
        })
        .collect()
}

/// What every text of a request to `provider` holds, for counting: each
/// message (and its tool calls' arguments), and what it asks the answer to
/// be (the contract's schema, or its tools).
fn texts(served: &ServedContract, messages: &[Message]) -> Vec<String> {
    let contract = &served.contract;
    let mut texts: Vec<String> = messages
        .iter()
        .map(|m| {
            let mut text = m.content.clone();
            for call in &m.tool_calls {
                text.push_str(&call.name);
                text.push_str(&call.arguments);
            }
            text
        })
        .collect();
    texts.push(contract.schema.to_string());
    if let Some(tools) = &contract.tool_calls {
        for tool in &tools.tools {
            texts.push(format!(
                "{}{}{}",
                tool.name, tool.description, tool.parameters
            ));
        }
    }
    texts
}

/// The most an attempt at `provider` can cost: the request's tokens by
/// the provider's tokenizer (each byte a token where it has none, or it
/// fails: no tokenizer makes fewer tokens than bytes), plus the contract's
/// `max_output_tokens`; in money at the provider's price, where it has one.
pub async fn worst_case(
    provider: &ServedProvider,
    served: &ServedContract,
    messages: &[Message],
) -> Cost {
    let texts = texts(served, messages);
    let parts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let by_bytes = || -> u64 {
        parts
            .iter()
            .map(|t| t.len() as u64 + surety_providers::tokenizer::TOKENS_PER_MESSAGE)
            .sum()
    };
    let prompt = match provider.count(&parts).await {
        Ok(Some(n)) => n,
        Ok(None) => by_bytes(),
        Err(e) => {
            tracing::warn!(provider = %provider.config.id, error = %e, "the tokenizer failed: the worst case counts a token per byte");
            by_bytes()
        }
    };
    let most_out = u64::from(served.contract.limits.max_output_tokens);
    Cost {
        micros: provider
            .config
            .price
            .as_ref()
            .map_or(0, |p| clamp(p.worst_case(prompt, most_out))),
        tokens: clamp(prompt.saturating_add(most_out)),
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// What a call that used `usage` cost at `config`'s price; `None` when
/// the provider said no usage (then the worst case reserved is spent).
pub fn cost(config: &ProviderConfig, usage: &Usage) -> Option<Cost> {
    if usage.prompt_tokens == 0 && usage.completion_tokens == 0 {
        return None;
    }
    Some(Cost {
        micros: config.price.as_ref().map_or(0, |p| clamp(p.cost(usage))),
        tokens: clamp(usage.prompt_tokens.saturating_add(usage.completion_tokens)),
    })
}

impl Spending {
    /// Every budget as the database holds it now, in its period; a budget
    /// that cannot be read is left out (and logged).
    pub async fn statuses(
        &self,
        store: &surety_store::Store,
    ) -> Vec<(&Budget, surety_store::BudgetStatus)> {
        self.rows(store, None)
            .await
            .into_iter()
            .map(|(budget, status, _)| (budget, status))
            .collect()
    }

    /// The budgets of `owner` (every owner's when `None`) as the database
    /// holds them now, each with when it next frees room.
    pub async fn rows(
        &self,
        store: &surety_store::Store,
        owner: Option<&str>,
    ) -> Vec<(&Budget, surety_store::BudgetStatus, Option<i64>)> {
        let now = now_ms();
        let mut out = Vec::new();
        for budget in &self.budgets {
            if owner.is_some_and(|o| budget.owner(self) != o) {
                continue;
            }
            let window = budget.window(now);
            match store.budget(&budget.name, window.counts_from_ms).await {
                Ok(status) => {
                    let resets = resets(budget, window, status.oldest_bucket_ms);
                    out.push((budget, status, resets));
                }
                Err(e) => {
                    tracing::warn!(budget = %budget.name, error = %e, "cannot read the budget")
                }
            }
        }
        out
    }
}

/// `ms` since the epoch, as RFC 3339.
pub fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// When `budget` next has room freed: its period's end, or, in a rolling
/// window, when its oldest spend leaves it.
pub fn resets(budget: &Budget, window: Window, oldest_bucket_ms: Option<i64>) -> Option<i64> {
    match (budget.period, oldest_bucket_ms) {
        (Period::Rolling(w), Some(oldest)) => {
            let w = i64::try_from(w.as_millis()).unwrap_or(i64::MAX);
            Some(oldest + w + (w / 60).max(1))
        }
        _ => window.resets_at_ms,
    }
}

/// Now, in ms since the epoch, as budgets count it.
pub fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
    )
    .unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(period: Period) -> Budget {
        Budget {
            name: "b".into(),
            payer: Payer::Owner("o".into()),
            unit: BudgetUnit::Money("USD".into()),
            limit: 5_000_000,
            period,
            at_limit: AtLimit::Refuse,
        }
    }

    #[test]
    fn a_day_and_a_month_are_utc_calendar_periods() {
        // 2026-12-06T13:00:00Z
        let now = 1_796_562_000_000;
        let day = budget(Period::Day).window(now);
        assert_eq!(day.counts_from_ms, 1_796_515_200_000);
        assert_eq!(day.resets_at_ms, Some(1_796_515_200_000 + DAY_MS));
        let month = budget(Period::Month).window(now);
        // 2026-12-01 and 2027-01-01
        assert_eq!(month.counts_from_ms, 1_796_083_200_000);
        assert_eq!(month.resets_at_ms, Some(1_798_761_600_000));
    }

    #[test]
    fn a_rolling_window_counts_at_least_its_window() {
        let hour = std::time::Duration::from_secs(3600);
        let now = 1_796_562_123_456;
        let w = budget(Period::Rolling(hour)).window(now);
        assert!(w.counts_from_ms <= now - 3_600_000);
        assert!(w.counts_from_ms > now - 3_600_000 - 60_000);
        assert!(w.bucket_ms <= now && w.bucket_ms > now - 60_000);
        assert_eq!(budget(Period::Total).window(now).counts_from_ms, 0);
    }

    #[test]
    fn money_is_said_in_its_currency() {
        let b = budget(Period::Day);
        assert_eq!(b.say(5_000_000), "5.00 USD");
        assert_eq!(b.say(420_000), "0.42 USD");
        assert_eq!(b.say(1_234_567), "1.234567 USD");
    }
}
