//! The failure table: every way a provider call can fail, in one place,
//! classified as *definite* (the provider did not do the work; another
//! provider may be tried) or *unknown* (it may have done the work, and may
//! bill for it; the attempt becomes `unknown` and nothing is retried).
//!
//! | what happened                                   | kind          | class    |
//! |-------------------------------------------------|---------------|----------|
//! | refused before sending: no connection, a missing capability or key | `NotSent` | definite |
//! | HTTP 4xx other than 429 (400/401/403/404/422...) | `Rejected`    | definite |
//! | HTTP 429, with how long it asks to wait kept (below) | `RateLimited` | definite |
//! | HTTP 500, 501, 503, 505, 529: the server answered that it failed (a 503's or 529's wait kept) | `ServerError` | definite |
//! | a 2xx whose body does not fit the request       | `BadResponse` | definite |
//! | a 2xx longer than the provider's `max_response_bytes` (read no further) | `BadResponse` | definite |
//! | a 2xx whose body is an error object: the server answered that it failed | `ServerError` | definite |
//! | the model refused (OpenAI `refusal`, Anthropic `stop_reason: refusal`), with its words | `Refused` | definite |
//! | timeout after the request left                  | `Timeout`     | unknown  |
//! | connection reset or body cut short mid-response | `Reset`       | unknown  |
//! | HTTP 502, 504 and every other 5xx: a gateway lost the upstream's answer | `Gateway` | unknown |
//!
//! | HTTP 200 whose finish reason is a filter or a refusal (OpenAI `content_filter`, Gemini SAFETY...), named | `Refused` | definite |
//! | HTTP 200 whose answer was cut at the token limit (JSON or a tool's input), named | `BadResponse` | definite |
//! | HTTP 200 with a finish reason the adapter does not know, named: never taken for an answer | `BadResponse` | definite |
//!
//! Each kind's finish reasons are listed in its `KindSpec::finish_reasons`
//! (`kinds.rs`) as a [`Finish`]; one that is not listed is [`Finish::Unknown`].
//!
//! Statuses decide, whatever the wire format: Google's `error.status`
//! (RESOURCE_EXHAUSTED on 429, UNAVAILABLE on 503, INVALID_ARGUMENT on 400)
//! rides along in the message, as OpenAI's and Anthropic's `error.type` does.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The provider did not do the work: the router may move on.
    Definite,
    /// The provider may have done the work: the attempt is `unknown`.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    NotSent,
    Rejected,
    RateLimited,
    ServerError,
    BadResponse,
    Refused,
    Timeout,
    Reset,
    Gateway,
}

impl FailureKind {
    /// The one place that says which kinds are definite.
    pub fn class(self) -> FailureClass {
        match self {
            FailureKind::NotSent
            | FailureKind::Rejected
            | FailureKind::RateLimited
            | FailureKind::ServerError
            | FailureKind::BadResponse
            | FailureKind::Refused => FailureClass::Definite,
            FailureKind::Timeout | FailureKind::Reset | FailureKind::Gateway => {
                FailureClass::Unknown
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::NotSent => "not sent",
            FailureKind::Rejected => "rejected",
            FailureKind::RateLimited => "rate limited",
            FailureKind::ServerError => "server error",
            FailureKind::BadResponse => "bad response",
            FailureKind::Refused => "refused by the model",
            FailureKind::Timeout => "timed out after sending",
            FailureKind::Reset => "connection reset mid-response",
            FailureKind::Gateway => "gateway error",
        }
    }
}

/// What a finish reason says of the answer it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Finish {
    /// The model finished its answer.
    Complete,
    /// The answer was cut at the token limit.
    Truncated,
    /// A filter or the model refused: no answer to the request.
    Refused,
    /// Not a reason this adapter knows: never taken for an answer.
    Unknown,
}

impl Finish {
    /// What a kind's finish reason (`None`: the provider sent none) means,
    /// read from the kind's table.
    pub fn of(table: &[(&str, Finish)], reason: Option<&str>) -> Finish {
        match reason {
            None => Finish::Complete,
            Some(reason) => table
                .iter()
                .find(|(name, _)| *name == reason)
                .map_or(Finish::Unknown, |(_, finish)| *finish),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Complete => "complete",
            Finish::Truncated => "cut at the token limit",
            Finish::Refused => "refused (a filter or the model)",
            Finish::Unknown => "unknown",
        }
    }
}

/// The kind of failure an HTTP status means; `None` for success.
pub fn classify_status(status: u16) -> Option<FailureKind> {
    match status {
        200..=299 => None,
        429 => Some(FailureKind::RateLimited),
        400..=499 => Some(FailureKind::Rejected),
        500 | 501 | 503 | 505 | 529 => Some(FailureKind::ServerError),
        502 | 504 => Some(FailureKind::Gateway),
        500..=599 => Some(FailureKind::Gateway),
        // 1xx and 3xx are not answers to a chat request.
        _ => Some(FailureKind::BadResponse),
    }
}

/// The kind of failure a transport error means.
pub fn classify_transport(error: &reqwest::Error) -> FailureKind {
    if error.is_builder() || error.is_connect() {
        // No connection was made: the request never left.
        return FailureKind::NotSent;
    }
    if error.is_timeout() {
        return FailureKind::Timeout;
    }
    // A body or protocol error after the request left.
    FailureKind::Reset
}

/// A failed provider call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct ProviderError {
    pub provider: String,
    pub kind: FailureKind,
    /// The HTTP status, when the server answered.
    pub status: Option<u16>,
    /// How long the provider asked us to wait, with a 429, 503 or 529: its
    /// `retry-after-ms`, its `Retry-After` (seconds or an HTTP date), or
    /// the `retryDelay` of a `google.rpc.RetryInfo` in the error body.
    pub retry_after: Option<Duration>,
    /// What went wrong, with the server's own message where it gave one.
    pub message: String,
}

impl ProviderError {
    pub fn new(provider: &str, kind: FailureKind, message: impl Into<String>) -> ProviderError {
        ProviderError {
            provider: provider.to_owned(),
            kind,
            status: None,
            retry_after: None,
            message: message.into(),
        }
    }

    pub fn class(&self) -> FailureClass {
        self.kind.class()
    }

    /// Whether the provider answered at all: it sent an HTTP status, or
    /// a body that could be judged. `false` for a call refused before
    /// sending, a connection refused, or one reset or timed out before the
    /// response's status arrived.
    pub fn answered(&self) -> bool {
        self.status.is_some()
            || !matches!(
                self.kind,
                FailureKind::NotSent | FailureKind::Timeout | FailureKind::Reset
            )
    }

    /// The failure a finish reason other than [`Finish::Complete`] and
    /// [`Finish::Truncated`] means: a refusal naming the reason, or a
    /// reason the adapter does not know, named. `None` for those two,
    /// which the adapter judges against what it asked for.
    pub fn from_finish(
        provider: &str,
        field: &str,
        finish: Finish,
        reason: Option<&str>,
        words: Option<&str>,
    ) -> Option<ProviderError> {
        let reason = reason.unwrap_or_default();
        let words = words.filter(|w| !w.trim().is_empty());
        match finish {
            Finish::Complete | Finish::Truncated => None,
            Finish::Refused => Some(ProviderError::new(
                provider,
                FailureKind::Refused,
                match words {
                    Some(words) => format!("the model refused: {words} ({field} {reason})"),
                    None => format!(
                        "the answer was withheld ({field} {reason}): a filter or the model stopped it, so it is not an answer to the request"
                    ),
                },
            )),
            Finish::Unknown => Some(ProviderError::new(
                provider,
                FailureKind::BadResponse,
                format!(
                    "the answer ended with {field} `{reason}`, which this adapter does not know; it is not taken for an answer"
                ),
            )),
        }
    }

    /// A definite failure raised before anything was sent.
    pub fn not_sent(provider: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(provider, FailureKind::NotSent, message)
    }

    fn describe(&self) -> String {
        let class = match self.class() {
            FailureClass::Definite => "definite",
            FailureClass::Unknown => "unknown",
        };
        let status = self
            .status
            .map(|s| format!(" (HTTP {s})"))
            .unwrap_or_default();
        let retry = self
            .retry_after
            .map(|d| format!("; retry after {} s", d.as_secs_f64()))
            .unwrap_or_default();
        format!(
            "provider `{}`: {}{status}, {class} failure: {}{retry}",
            self.provider,
            self.kind.as_str(),
            self.message
        )
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureClass::Definite => "definite",
            FailureClass::Unknown => "unknown",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_table() {
        let table = [
            (200, None),
            (400, Some((FailureKind::Rejected, FailureClass::Definite))),
            (401, Some((FailureKind::Rejected, FailureClass::Definite))),
            (403, Some((FailureKind::Rejected, FailureClass::Definite))),
            (404, Some((FailureKind::Rejected, FailureClass::Definite))),
            (422, Some((FailureKind::Rejected, FailureClass::Definite))),
            (
                429,
                Some((FailureKind::RateLimited, FailureClass::Definite)),
            ),
            (
                500,
                Some((FailureKind::ServerError, FailureClass::Definite)),
            ),
            (
                503,
                Some((FailureKind::ServerError, FailureClass::Definite)),
            ),
            (
                529,
                Some((FailureKind::ServerError, FailureClass::Definite)),
            ),
            (502, Some((FailureKind::Gateway, FailureClass::Unknown))),
            (504, Some((FailureKind::Gateway, FailureClass::Unknown))),
            (524, Some((FailureKind::Gateway, FailureClass::Unknown))),
        ];
        for (status, expect) in table {
            let got = classify_status(status).map(|k| (k, k.class()));
            assert_eq!(got, expect, "HTTP {status}");
        }
    }
}
