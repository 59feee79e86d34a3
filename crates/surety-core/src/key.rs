//! The Idempotency-Key header syntax.
//!
//! A key is 1 to 255 printable ASCII characters (0x20..=0x7E). Stripe's
//! clients send the bare token (`Idempotency-Key: abc`); the IETF draft
//! (draft-ietf-httpapi-idempotency-key-header) makes the value a structured
//! field string (`Idempotency-Key: "abc"`). Both spellings name the same key.

use std::fmt;

/// The longest key accepted, in bytes (every accepted byte is one character).
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key, without the quotes of the IETF form.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

/// Why a header value is not an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("idempotency key is empty")]
    Empty,
    #[error("idempotency key is {len} characters long; the limit is {MAX_KEY_LEN}")]
    TooLong { len: usize },
    #[error("idempotency key has a character that is not printable ASCII at byte {at}")]
    NotPrintableAscii { at: usize },
    #[error("idempotency key opens a quoted string that is not closed properly")]
    BadQuoting,
}

impl IdempotencyKey {
    /// Parses a header value in either the bare or the quoted form.
    ///
    /// In the quoted form, `\"` and `\\` are the only escapes (RFC 8941
    /// sf-string); the key is the unescaped content.
    pub fn parse(raw: &str) -> Result<IdempotencyKey, KeyError> {
        if let Some(at) = raw.bytes().position(|b| !is_printable(b)) {
            return Err(KeyError::NotPrintableAscii { at });
        }
        let key = match raw.strip_prefix('"') {
            Some(rest) => unquote(rest)?,
            None => raw.to_owned(),
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: key.len() });
        }
        Ok(IdempotencyKey(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdempotencyKey::parse(s)
    }
}

fn is_printable(b: u8) -> bool {
    (0x20..=0x7e).contains(&b)
}

/// Unescapes the body of an sf-string; `rest` is what follows the opening quote.
fn unquote(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(KeyError::BadQuoting),
            },
            '"' if chars.as_str().is_empty() => return Ok(out),
            '"' => return Err(KeyError::BadQuoting),
            other => out.push(other),
        }
    }
    Err(KeyError::BadQuoting)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(raw: &str, expect: Result<&str, KeyError>) {
        let got = IdempotencyKey::parse(raw);
        assert_eq!(
            got.as_ref().map(IdempotencyKey::as_str),
            expect.as_ref().map(|s| *s)
        );
    }

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        check(
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
            Ok("8e03978e-40d5-43e8-bc93-6894a57f9324"),
        );
        check("\"8e03978e-40d5\"", Ok("8e03978e-40d5"));
        check("\"a\\\"b\\\\c\"", Ok("a\"b\\c"));
        check("with space", Ok("with space"));
        check("~", Ok("~"));
    }

    #[test]
    fn bad_keys_get_typed_errors() {
        check("", Err(KeyError::Empty));
        check("\"\"", Err(KeyError::Empty));
        check("caf\u{e9}", Err(KeyError::NotPrintableAscii { at: 3 }));
        check("tab\there", Err(KeyError::NotPrintableAscii { at: 3 }));
        check("\"open", Err(KeyError::BadQuoting));
        check("\"a\"b\"", Err(KeyError::BadQuoting));
        check("\"bad\\escape\"", Err(KeyError::BadQuoting));
        let long = "k".repeat(256);
        check(&long, Err(KeyError::TooLong { len: 256 }));
        let max = "k".repeat(255);
        check(&max, Ok(max.as_str()));
    }
}
