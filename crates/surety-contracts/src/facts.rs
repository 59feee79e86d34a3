//! The facts a case expects of its answer.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Violation;
use crate::rules::same;

/// One expected fact: the value at `pointer` equals, is one of, or (for
/// text) contains what is given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    pub pointer: String,
    pub equals: Option<Value>,
    pub one_of: Option<Vec<Value>>,
    /// Case-insensitive substring of a string value.
    pub contains: Option<String>,
}

impl Expectation {
    pub(crate) fn check(&self, answer: &Value) -> Option<Violation> {
        let miss = |message: String| {
            Some(Violation {
                check: "fact".into(),
                pointer: self.pointer.clone(),
                message,
            })
        };
        let Some(value) = answer.pointer(&self.pointer) else {
            return miss("is missing".into());
        };
        if let Some(expected) = &self.equals
            && !same(value, expected)
        {
            return miss(format!("is {value}, expected {expected}"));
        }
        if let Some(set) = &self.one_of
            && !set.iter().any(|e| same(value, e))
        {
            return miss(format!(
                "is {value}, expected one of {}",
                Value::Array(set.clone())
            ));
        }
        if let Some(text) = &self.contains {
            let found = value
                .as_str()
                .is_some_and(|s| s.to_lowercase().contains(&text.to_lowercase()));
            if !found {
                return miss(format!("is {value}, expected it to mention {text:?}"));
            }
        }
        None
    }
}
