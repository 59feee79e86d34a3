//! `[[budgets]]`: what an owner, or one of its keys, may spend per period,
//! in a currency its providers are priced in or in tokens; read strictly,
//! every error naming its TOML path.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use surety_config::{ConfigError, Route};
use surety_providers::ProviderConfig;

use super::ApiKey;

/// Who a budget is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payer {
    /// Every job of the owner, whichever key asked.
    Owner(String),
    /// The jobs asked for with the key of this `name` (counted inside its
    /// owner's budgets too).
    Key(String),
    /// The router's own checks of this route (shadow calls, re-checks):
    /// an operator's budget, never an owner's.
    Checks(String),
}

/// What a budget counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetUnit {
    /// Money, in millionths of this currency (ISO 4217).
    Money(String),
    Tokens,
}

/// When a budget's spend counts afresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// A UTC day.
    Day,
    /// A UTC calendar month.
    Month,
    /// The window before now, counted in sixtieths of it.
    Rolling(Duration),
    /// Never: a total.
    Total,
}

/// What a job past the limit gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtLimit {
    /// Refused before any call: 429, naming the budget.
    Refuse,
    /// Served, and counted (a budget that watches, not one that stops).
    Record,
}

/// One `[[budgets]]` entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub name: String,
    pub payer: Payer,
    pub unit: BudgetUnit,
    /// In the unit's amounts: millionths of the currency, or tokens.
    pub limit: i64,
    pub period: Period,
    pub at_limit: AtLimit,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    name: String,
    owner: Option<String>,
    key: Option<String>,
    route: Option<String>,
    limit: f64,
    unit: String,
    period: String,
    window_ms: Option<u64>,
    at_limit: Option<String>,
}

/// The keys `[[budgets]]` takes.
pub(super) fn raw_fields() -> &'static [&'static str] {
    surety_config::keys::fields_of::<RawBudget>()
}

/// The most a limit may be, in millionths or tokens: far past any spend,
/// well within the database's 64-bit sums.
const MOST: f64 = 1e15;

/// `[[budgets]]` as written, checked against the keys (a key budget names
/// a key's `name`; an owner budget an owner some key has), the routes (a
/// checks budget names a route with live checks) and the providers (a
/// money budget's currency is every provider's price's).
pub(super) fn read(
    raw: Vec<toml::Table>,
    keys: &BTreeMap<String, ApiKey>,
    routes: &BTreeMap<String, Route>,
    providers: &BTreeMap<String, ProviderConfig>,
) -> Result<Vec<Budget>, ConfigError> {
    let mut budgets: Vec<Budget> = Vec::new();
    for (i, table) in raw.into_iter().enumerate() {
        let at = |field: &str| format!("budgets[{i}].{field}");
        let raw = RawBudget::deserialize(toml::Value::Table(table))
            .map_err(|e| ConfigError::at(format!("budgets[{i}]"), e.to_string().trim_end()))?;
        if raw.name.is_empty()
            || raw.name.len() > 128
            || !raw
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            return Err(ConfigError::at(
                at("name"),
                "must be 1 to 128 letters, digits, `-`, `_`, `.` or `:`",
            ));
        }
        if budgets.iter().any(|b| b.name == raw.name) {
            return Err(ConfigError::at(at("name"), "two budgets have this name"));
        }
        let payer = match (raw.owner, raw.key, raw.route) {
            (Some(owner), None, None) if keys.values().any(|k| k.owner == owner) => {
                Payer::Owner(owner)
            }
            (Some(owner), None, None) => {
                return Err(ConfigError::at(
                    at("owner"),
                    format!("no API key has owner `{owner}`"),
                ));
            }
            (None, Some(key), None) if keys.values().any(|k| k.name.as_deref() == Some(&key)) => {
                Payer::Key(key)
            }
            (None, Some(key), None) => {
                return Err(ConfigError::at(
                    at("key"),
                    format!("no API key has `name = \"{key}\"`"),
                ));
            }
            (None, None, Some(route)) => match routes.get(&route) {
                Some(r) if r.shadow.is_some() => Payer::Checks(route),
                Some(_) => {
                    return Err(ConfigError::at(
                        at("route"),
                        format!(
                            "route `{route}` has no live checks to pay for (no `[routes.{route}.shadow]`)"
                        ),
                    ));
                }
                None => {
                    return Err(ConfigError::at(at("route"), format!("no route `{route}`")));
                }
            },
            _ => {
                return Err(ConfigError::at(
                    format!("budgets[{i}]"),
                    "give `owner` (every job of the owner), `key` (an API key's `name`) or `route` (a route's live checks), one of the three",
                ));
            }
        };
        let unit = match raw.unit.as_str() {
            "tokens" => BudgetUnit::Tokens,
            currency => {
                if let Some((id, _)) = providers
                    .iter()
                    .find(|(_, p)| p.price.as_ref().map(|p| p.currency.as_str()) != Some(currency))
                {
                    return Err(ConfigError::at(
                        at("unit"),
                        format!(
                            "a budget in `{currency}` needs every provider priced in it, and `providers.{id}.price` is not; price it (`[providers.{id}.price] currency = \"{currency}\"`) or count `tokens`"
                        ),
                    ));
                }
                BudgetUnit::Money(currency.to_owned())
            }
        };
        let scale = match unit {
            BudgetUnit::Money(_) => 1e6,
            BudgetUnit::Tokens => 1.0,
        };
        let limit = raw.limit * scale;
        if !limit.is_finite() || !(0.0..=MOST).contains(&limit) {
            return Err(ConfigError::at(
                at("limit"),
                "must be at least 0 and at most 10^9 (money) or 10^15 (tokens)",
            ));
        }
        let period = match (raw.period.as_str(), raw.window_ms) {
            ("day", None) => Period::Day,
            ("month", None) => Period::Month,
            ("total", None) => Period::Total,
            ("rolling", Some(ms)) if ms >= 60 => Period::Rolling(Duration::from_millis(ms)),
            ("rolling", _) => {
                return Err(ConfigError::at(
                    at("window_ms"),
                    "a rolling budget needs its window, at least 60 ms",
                ));
            }
            ("day" | "month" | "total", Some(_)) => {
                return Err(ConfigError::at(
                    at("window_ms"),
                    "only a `rolling` budget has a window",
                ));
            }
            (other, _) => {
                return Err(ConfigError::at(
                    at("period"),
                    format!("`{other}` is not `day`, `month`, `rolling` or `total`"),
                ));
            }
        };
        let at_limit = match raw.at_limit.as_deref() {
            None | Some("refuse") => AtLimit::Refuse,
            Some("record") => AtLimit::Record,
            Some(other) => {
                return Err(ConfigError::at(
                    at("at_limit"),
                    format!("`{other}` is not `refuse` or `record`"),
                ));
            }
        };
        budgets.push(Budget {
            name: raw.name,
            payer,
            unit,
            limit: limit.ceil() as i64,
            period,
            at_limit,
        });
    }
    Ok(budgets)
}
