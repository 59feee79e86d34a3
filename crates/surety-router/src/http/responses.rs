//! The answers many operations share, documented once (`IntoResponses`)
//! and named in each operation's `responses(…)`: what every authenticated
//! request may meet before its handler runs, and what a request that reads
//! or writes the database may meet when the database is away or full
//! (`error.rs`, `StoreError::outage`). Nothing here is constructed: these
//! types exist for the document.

use utoipa::IntoResponses;

use super::views::{OpenAiErrorView, ProblemView};

/// One documented response: `$name` is the status `$status` with the body
/// `$body` (as `$content`), described as `$description`.
macro_rules! response {
    ($(#[$doc:meta])* $name:ident: $status:tt, $body:ty, $content:tt, $description:tt) => {
        $(#[$doc])*
        #[derive(IntoResponses)]
        #[response(status = $status, description = $description, content_type = $content)]
        #[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
        pub struct $name($body);
    };
}

response!(
    /// No or an unknown API key.
    Unauthorized: 401, ProblemView, "application/problem+json",
    "No or an unknown API key"
);
response!(
    /// Past the owner's limits, or too many failed authentications.
    Limited: 429, ProblemView, "application/problem+json",
    "This owner's rate or concurrency limit, or too many failed authentications from this address (Retry-After says when)"
);
response!(
    /// A job of this owner that is not there.
    NoSuchJob: 404, ProblemView, "application/problem+json",
    "No such job of this owner"
);
response!(
    /// The database is away: nothing was recorded.
    Unavailable: 503, ProblemView, "application/problem+json",
    "The database is unavailable: nothing was recorded; send the same request again after Retry-After"
);
response!(
    /// No certified provider for a new attempt, or the database is away.
    Uncertified: 503, ProblemView, "application/problem+json",
    "No provider of the route is certified for its contract now; or the database is unavailable: nothing was recorded; send the same request again after Retry-After"
);
response!(
    /// The database is full: nothing was recorded.
    Full: 507, ProblemView, "application/problem+json",
    "The database is full: nothing was recorded; send the same request again after Retry-After"
);
response!(
    /// [`Unauthorized`], in OpenAI's format.
    OpenAiUnauthorized: 401, OpenAiErrorView, "application/json",
    "No or an unknown API key"
);
response!(
    /// [`Limited`], in OpenAI's format.
    OpenAiLimited: 429, OpenAiErrorView, "application/json",
    "This owner's rate or concurrency limit, or too many failed authentications from this address (Retry-After says when)"
);
response!(
    /// [`Uncertified`], in OpenAI's format.
    OpenAiUncertified: 503, OpenAiErrorView, "application/json",
    "No provider of the route is certified now; or the database is unavailable: nothing was recorded; send the same request again after Retry-After"
);
response!(
    /// [`Full`], in OpenAI's format.
    OpenAiFull: 507, OpenAiErrorView, "application/json",
    "The database is full: nothing was recorded; send the same request again after Retry-After"
);
