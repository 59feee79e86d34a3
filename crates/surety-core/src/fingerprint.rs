//! The intent fingerprint: sha256 over the RFC 8785 (JCS) canonical form of
//! the fields that define what the owner asked for, so that key order,
//! whitespace and number spelling (`1`, `1.0`, `1e0`) do not change it.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// A sha256 digest, shown as 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

#[derive(Debug, thiserror::Error)]
#[error("cannot put the intent in canonical form: {0}")]
pub struct FingerprintError(#[from] serde_json::Error);

/// The fields of a job that define the intent behind it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Intent<'a> {
    pub route: &'a str,
    pub input: &'a serde_json::Value,
}

impl Intent<'_> {
    pub fn fingerprint(&self) -> Result<Fingerprint, FingerprintError> {
        Fingerprint::of(self)
    }
}

impl Fingerprint {
    /// The fingerprint of any serializable value, e.g. a whole request body.
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Fingerprint, FingerprintError> {
        let canonical = serde_jcs::to_vec(value)?;
        Ok(Fingerprint(hex::encode(Sha256::digest(&canonical))))
    }

    /// A fingerprint read back from storage. It is opaque: only equality
    /// with a freshly computed one matters.
    pub fn from_stored(hex: String) -> Fingerprint {
        Fingerprint(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::*;

    fn fp(text: &str) -> Fingerprint {
        let value: Value = serde_json::from_str(text).unwrap();
        Fingerprint::of(&value).unwrap()
    }

    #[test]
    fn number_spelling_does_not_matter() {
        assert_eq!(fp("1"), fp("1.0"));
        assert_eq!(fp("1"), fp("1e0"));
        assert_eq!(fp("[0.5]"), fp("[5e-1]"));
        assert_eq!(fp("{\"n\": 100}"), fp("{\"n\": 1E2}"));
        assert_ne!(fp("1"), fp("2"));
        assert_ne!(fp("1"), fp("\"1\""));
    }

    #[test]
    fn the_digest_is_sha256_of_jcs() {
        // RFC 8785 sorts keys and drops whitespace: {"a":1,"b":[true,null]}.
        let expect = hex::encode(Sha256::digest(br#"{"a":1,"b":[true,null]}"#));
        assert_eq!(fp(r#"{ "b": [true, null], "a": 1.0 }"#).as_str(), expect);
    }

    /// JSON values whose numbers survive a round trip through f64, as JCS
    /// (and every JavaScript client) reads them.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-1_000_000i64..1_000_000).prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[a-z \u{e9}\"\\\\]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,4}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
            ]
        })
    }

    /// Writes `value` as JSON with object keys in reverse order, padded with
    /// whitespace, and integers spelled as decimals with an exponent.
    fn respell(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                out.push_str("{ ");
                for (i, (k, v)) in map.iter().rev().enumerate() {
                    if i > 0 {
                        out.push_str(" ,\n ");
                    }
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push_str(" :\t");
                    respell(v, out);
                }
                out.push_str(" }");
            }
            Value::Array(items) => {
                out.push_str("[ ");
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" , ");
                    }
                    respell(v, out);
                }
                out.push_str(" ]");
            }
            Value::Number(n) if n.is_i64() => out.push_str(&format!("{}.0e0", n)),
            other => out.push_str(&other.to_string()),
        }
    }

    fn count_leaves(value: &Value) -> usize {
        match value {
            Value::Object(map) => map.values().map(count_leaves).sum(),
            Value::Array(items) => items.iter().map(count_leaves).sum(),
            _ => 1,
        }
    }

    /// Changes one leaf of `value`, chosen by `pick`; false when it has none.
    fn mutate(value: &mut Value, pick: &mut usize) -> bool {
        match value {
            Value::Object(map) => map.values_mut().any(|v| mutate(v, pick)),
            Value::Array(items) => items.iter_mut().any(|v| mutate(v, pick)),
            leaf => {
                if *pick > 0 {
                    *pick -= 1;
                    return false;
                }
                *leaf = match leaf {
                    Value::Null => json!(false),
                    Value::Bool(b) => json!(!*b),
                    Value::Number(n) => json!(n.as_f64().unwrap() + 1.0),
                    Value::String(s) => json!(format!("{s}x")),
                    _ => unreachable!(),
                };
                true
            }
        }
    }

    proptest! {
        #[test]
        fn unchanged_by_key_order_whitespace_and_number_spelling(value in json_value()) {
            let mut text = String::new();
            respell(&value, &mut text);
            let reparsed: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(Fingerprint::of(&value).unwrap(), Fingerprint::of(&reparsed).unwrap());
        }

        #[test]
        fn changed_by_any_change_of_value(value in json_value(), pick in 0usize..16) {
            let mut changed = value.clone();
            let leaves = count_leaves(&value);
            if leaves == 0 {
                // Only empty containers: adding an element is the change.
                changed = json!([changed]);
            } else {
                let mut n = pick % leaves;
                prop_assert!(mutate(&mut changed, &mut n));
            }
            prop_assert_ne!(Fingerprint::of(&value).unwrap(), Fingerprint::of(&changed).unwrap());
        }

        #[test]
        fn an_added_key_changes_it(value in json_value(), key in "[A-Z]{1,3}") {
            let wrapped = json!({ "v": value });
            let mut widened = wrapped.clone();
            widened.as_object_mut().unwrap().insert(key, Value::Null);
            prop_assert_ne!(Fingerprint::of(&wrapped).unwrap(), Fingerprint::of(&widened).unwrap());
        }
    }
}
