//! Business rules: what an answer must satisfy that JSON Schema cannot say.
//! A small declarative set, so a contract states its rules as data.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Violation;

/// A test on the value at a JSON pointer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    pub pointer: String,
    pub equals: Option<Value>,
    pub one_of: Option<Vec<Value>>,
}

impl Condition {
    fn holds(&self, answer: &Value) -> bool {
        let Some(value) = answer.pointer(&self.pointer) else {
            return false;
        };
        self.equals.as_ref().is_none_or(|e| same(value, e))
            && self
                .one_of
                .as_ref()
                .is_none_or(|set| set.iter().any(|e| same(value, e)))
    }

    fn describe(&self) -> String {
        match (&self.equals, &self.one_of) {
            (Some(e), _) => format!("{} is {e}", self.pointer),
            (None, Some(set)) => {
                format!("{} is one of {}", self.pointer, Value::Array(set.clone()))
            }
            (None, None) => format!("{} is present", self.pointer),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Rule {
    /// When `if` holds, `then` must hold (an enum-dependent field).
    Implies {
        name: String,
        #[serde(rename = "if")]
        when: Condition,
        then: Condition,
    },
    /// The `field` of every element of the array at `items` adds up to the number at `equals`.
    Sum {
        name: String,
        items: String,
        field: String,
        equals: String,
        tolerance: f64,
    },
    /// The numbers at `terms` add up to the number at `equals`.
    Add {
        name: String,
        terms: Vec<String>,
        equals: String,
        tolerance: f64,
    },
    /// The answer has no top-level key but these (by default, the schema's `properties`).
    OnlyKeys {
        name: String,
        allowed: Option<Vec<String>>,
    },
    /// The string at `pointer` matches `regex` (required wording).
    Matches {
        name: String,
        pointer: String,
        regex: String,
    },
    /// The string at `pointer` is an active ISO 4217 currency code.
    Currency { name: String, pointer: String },
    /// The number at `pointer` is at most the number at `input` in the
    /// job's input (a refund within the order's total), which may be
    /// written as text (`"30.00"`: a prompt's variables are text). Holds
    /// where the answer has nothing at `pointer` (another tool was called).
    AtMostInput {
        name: String,
        pointer: String,
        input: String,
    },
    /// The value at `pointer` is the value at `input` in the job's input
    /// (the order's currency). Holds where the answer has nothing at
    /// `pointer`.
    SameAsInput {
        name: String,
        pointer: String,
        input: String,
    },
}

impl Rule {
    pub fn name(&self) -> &str {
        match self {
            Rule::Implies { name, .. }
            | Rule::Sum { name, .. }
            | Rule::Add { name, .. }
            | Rule::OnlyKeys { name, .. }
            | Rule::Matches { name, .. }
            | Rule::Currency { name, .. }
            | Rule::AtMostInput { name, .. }
            | Rule::SameAsInput { name, .. } => name,
        }
    }

    /// Whether the rule reads the job's input, not only the answer.
    pub fn reads_input(&self) -> bool {
        matches!(self, Rule::AtMostInput { .. } | Rule::SameAsInput { .. })
    }

    /// Checks the rule itself when the contract loads.
    pub(crate) fn validate(&self) -> Result<(), String> {
        match self {
            Rule::Matches { regex, .. } => regex::Regex::new(regex)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Rule::Sum { tolerance, .. } | Rule::Add { tolerance, .. }
                if tolerance.is_nan() || *tolerance < 0.0 =>
            {
                Err("`tolerance` must be zero or more".into())
            }
            Rule::Implies { when, then, .. }
                if [when, then]
                    .iter()
                    .any(|c| c.equals.is_none() && c.one_of.is_none()) =>
            {
                Err("each condition needs `equals` or `one_of`".into())
            }
            _ => Ok(()),
        }
    }

    /// What the answer breaks of this rule, given the contract's schema and
    /// the job's input.
    pub fn check(&self, answer: &Value, schema: &Value, input: &Value) -> Vec<Violation> {
        let broken = |pointer: &str, message: String| Violation {
            check: format!("rule: {}", self.name()),
            pointer: pointer.to_owned(),
            message,
        };
        match self {
            Rule::Implies { when, then, .. } => {
                if when.holds(answer) && !then.holds(answer) {
                    let found = answer
                        .pointer(&then.pointer)
                        .map_or("nothing".to_owned(), Value::to_string);
                    return vec![broken(
                        &then.pointer,
                        format!(
                            "when {}, {} (found {found})",
                            when.describe(),
                            then.describe()
                        ),
                    )];
                }
                Vec::new()
            }
            Rule::Sum {
                items,
                field,
                equals,
                tolerance,
                ..
            } => {
                let Some(list) = answer.pointer(items).and_then(Value::as_array) else {
                    return vec![broken(items, "is not an array".into())];
                };
                let mut sum = 0.0;
                for (i, item) in list.iter().enumerate() {
                    match item.get(field).and_then(Value::as_f64) {
                        Some(n) => sum += n,
                        None => {
                            return vec![broken(
                                &format!("{items}/{i}/{field}"),
                                "is not a number".into(),
                            )];
                        }
                    }
                }
                match answer.pointer(equals).and_then(Value::as_f64) {
                    Some(total) if (total - sum).abs() <= *tolerance => Vec::new(),
                    Some(total) => vec![broken(
                        equals,
                        format!("is {total}, but the {field} of {items} add up to {sum}"),
                    )],
                    None => vec![broken(equals, "is not a number".into())],
                }
            }
            Rule::Add {
                terms,
                equals,
                tolerance,
                ..
            } => {
                let mut sum = 0.0;
                for term in terms {
                    match answer.pointer(term).and_then(Value::as_f64) {
                        Some(n) => sum += n,
                        None => return vec![broken(term, "is not a number".into())],
                    }
                }
                match answer.pointer(equals).and_then(Value::as_f64) {
                    Some(total) if (total - sum).abs() <= *tolerance => Vec::new(),
                    Some(total) => vec![broken(
                        equals,
                        format!("is {total}, but {} add up to {sum}", terms.join(" + ")),
                    )],
                    None => vec![broken(equals, "is not a number".into())],
                }
            }
            Rule::OnlyKeys { allowed, .. } => {
                let Some(object) = answer.as_object() else {
                    return vec![broken("", "is not an object".into())];
                };
                let from_schema: Vec<String> = schema["properties"]
                    .as_object()
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default();
                let allowed = allowed.as_ref().unwrap_or(&from_schema);
                object
                    .keys()
                    .filter(|k| !allowed.contains(k))
                    .map(|k| {
                        broken(
                            &format!("/{k}"),
                            format!("`{k}` is an invented top-level key"),
                        )
                    })
                    .collect()
            }
            Rule::Matches { pointer, regex, .. } => {
                let Ok(re) = regex::Regex::new(regex) else {
                    return vec![broken(pointer, "the rule's regex is invalid".into())];
                };
                match answer.pointer(pointer).and_then(Value::as_str) {
                    Some(text) if re.is_match(text) => Vec::new(),
                    Some(text) => vec![broken(pointer, format!("{text:?} does not match {regex}"))],
                    None => vec![broken(pointer, "is not a string".into())],
                }
            }
            Rule::Currency { pointer, .. } => match answer.pointer(pointer).and_then(Value::as_str)
            {
                Some(code) if iso_currency::Currency::from_code(code).is_some() => Vec::new(),
                Some(code) => vec![broken(
                    pointer,
                    format!("{code:?} is not an ISO 4217 currency code"),
                )],
                None => vec![broken(pointer, "is not a string".into())],
            },
            Rule::AtMostInput {
                pointer,
                input: limit,
                ..
            } => {
                let Some(value) = answer.pointer(pointer) else {
                    return Vec::new();
                };
                let Some(n) = value.as_f64() else {
                    return vec![broken(pointer, format!("{value} is not a number"))];
                };
                let most = input.pointer(limit).and_then(|v| match v {
                    Value::String(text) => text.trim().parse::<f64>().ok(),
                    other => other.as_f64(),
                });
                match most {
                    Some(most) if n <= most => Vec::new(),
                    Some(most) => vec![broken(
                        pointer,
                        format!("is {n}, more than the input's {limit} ({most})"),
                    )],
                    None => vec![broken(
                        pointer,
                        format!("the input has no number at {limit}"),
                    )],
                }
            }
            Rule::SameAsInput {
                pointer,
                input: expected,
                ..
            } => {
                let Some(value) = answer.pointer(pointer) else {
                    return Vec::new();
                };
                match input.pointer(expected) {
                    Some(wanted) if same(value, wanted) => Vec::new(),
                    Some(wanted) => vec![broken(
                        pointer,
                        format!("is {value}, but the input's {expected} is {wanted}"),
                    )],
                    None => vec![broken(
                        pointer,
                        format!("the input has nothing at {expected}"),
                    )],
                }
            }
        }
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`).
pub(crate) fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names(found: Vec<Violation>) -> Vec<String> {
        found
            .into_iter()
            .map(|v| format!("{} {}", v.pointer, v.message))
            .collect()
    }

    #[test]
    fn invoice_arithmetic() {
        let sum = Rule::Sum {
            name: "s".into(),
            items: "/items".into(),
            field: "amount".into(),
            equals: "/subtotal".into(),
            tolerance: 0.005,
        };
        let add = Rule::Add {
            name: "a".into(),
            terms: vec!["/subtotal".into(), "/tax".into()],
            equals: "/total".into(),
            tolerance: 0.005,
        };
        let good = json!({"items": [{"amount": 10.5}, {"amount": 4.5}], "subtotal": 15, "tax": 1.5, "total": 16.5});
        assert!(sum.check(&good, &json!({}), &Value::Null).is_empty());
        assert!(add.check(&good, &json!({}), &Value::Null).is_empty());
        let bad = json!({"items": [{"amount": 10.5}, {"amount": 4.5}], "subtotal": 16, "tax": 1.5, "total": 16.5});
        assert_eq!(
            names(sum.check(&bad, &json!({}), &Value::Null)),
            ["/subtotal is 16, but the amount of /items add up to 15"]
        );
        assert_eq!(
            names(add.check(&bad, &json!({}), &Value::Null)),
            ["/total is 16.5, but /subtotal + /tax add up to 17.5"]
        );
    }

    #[test]
    fn rules_on_the_input_hold_where_the_answer_has_nothing_there() {
        let within = Rule::AtMostInput {
            name: "refund within the order".into(),
            pointer: "/arguments/amount".into(),
            input: "/order/total".into(),
        };
        let same = Rule::SameAsInput {
            name: "the order's currency".into(),
            pointer: "/arguments/currency".into(),
            input: "/order/currency".into(),
        };
        let input = json!({"order": {"total": "30.00", "currency": "EUR"}});
        let refund = json!({"tool": "refund", "arguments": {"amount": 30, "currency": "EUR"}});
        assert!(within.check(&refund, &json!({}), &input).is_empty());
        assert!(same.check(&refund, &json!({}), &input).is_empty());
        let too_much = json!({"tool": "refund", "arguments": {"amount": 45.5, "currency": "USD"}});
        assert_eq!(
            names(within.check(&too_much, &json!({}), &input)),
            ["/arguments/amount is 45.5, more than the input's /order/total (30)"]
        );
        assert_eq!(
            names(same.check(&too_much, &json!({}), &input)),
            ["/arguments/currency is \"USD\", but the input's /order/currency is \"EUR\""]
        );
        let text_amount = json!({"tool": "refund", "arguments": {"amount": "30"}});
        assert_eq!(within.check(&text_amount, &json!({}), &input).len(), 1);
        let escalate = json!({"tool": "escalate", "arguments": {"queue": "billing"}});
        assert!(within.check(&escalate, &json!({}), &input).is_empty());
        assert!(same.check(&escalate, &json!({}), &input).is_empty());
        assert_eq!(
            within.check(&refund, &json!({}), &Value::Null).len(),
            1,
            "no input, no refund"
        );
    }

    #[test]
    fn implies_only_keys_matches_currency() {
        let implies = Rule::Implies {
            name: "urgent".into(),
            when: Condition {
                pointer: "/priority".into(),
                equals: Some(json!("urgent")),
                one_of: None,
            },
            then: Condition {
                pointer: "/needs_human".into(),
                equals: Some(json!(true)),
                one_of: None,
            },
        };
        assert!(
            implies
                .check(
                    &json!({"priority": "low", "needs_human": false}),
                    &json!({}),
                    &Value::Null
                )
                .is_empty()
        );
        assert_eq!(
            names(implies.check(
                &json!({"priority": "urgent", "needs_human": false}),
                &json!({}),
                &Value::Null
            )),
            ["/needs_human when /priority is \"urgent\", /needs_human is true (found false)"]
        );
        let only = Rule::OnlyKeys {
            name: "k".into(),
            allowed: None,
        };
        let schema = json!({"properties": {"a": {}, "b": {}}});
        assert_eq!(
            names(only.check(&json!({"a": 1, "confidence": 0.9}), &schema, &Value::Null)),
            ["/confidence `confidence` is an invented top-level key"]
        );
        let currency = Rule::Currency {
            name: "c".into(),
            pointer: "/currency".into(),
        };
        assert!(
            currency
                .check(&json!({"currency": "EUR"}), &json!({}), &Value::Null)
                .is_empty()
        );
        assert_eq!(
            currency
                .check(&json!({"currency": "EURO"}), &json!({}), &Value::Null)
                .len(),
            1
        );
        let wording = Rule::Matches {
            name: "w".into(),
            pointer: "/summary".into(),
            regex: "^[A-Z].*\\.$".into(),
        };
        assert!(
            wording
                .check(
                    &json!({"summary": "Card charged twice."}),
                    &json!({}),
                    &Value::Null
                )
                .is_empty()
        );
        assert_eq!(
            wording
                .check(
                    &json!({"summary": "card charged twice"}),
                    &json!({}),
                    &Value::Null
                )
                .len(),
            1
        );
    }
}
