//! The answers many operations share, documented once (`IntoResponses`)
//! and named in each operation's `responses(…)`: what every authenticated
//! request may meet before its handler runs, and what a request that reads
//! or writes the database may meet when the database is away or full
//! (`error.rs`, `StoreError::outage`). Nothing here is constructed: these
//! types exist for the document.

use utoipa::IntoResponses;

use super::views::{OpenAiErrorView, ProblemView};

/// Documented responses: each line is `$name` (problem details) and, after
/// `/`, its twin in OpenAI's format (`$openai`), both the status `$status`
/// described as `$description`.
macro_rules! responses {
    ($($name:ident $(/ $openai:ident)?: $status:tt, $description:tt;)*) => {$(
        #[doc = $description]
        #[derive(IntoResponses)]
        #[response(status = $status, description = $description, content_type = "application/problem+json")]
        #[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
        pub struct $name(ProblemView);
        $(
            #[doc = $description]
            #[derive(IntoResponses)]
            #[response(status = $status, description = $description, content_type = "application/json")]
            #[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
            pub struct $openai(OpenAiErrorView);
        )?
    )*};
}

responses! {
    Unauthorized / OpenAiUnauthorized: 401, "No or an unknown API key";
    Limited / OpenAiLimited: 429, "This owner's rate or concurrency limit, or too many failed authentications from this address (Retry-After says when)";
    NoSuchJob: 404, "No such job of this owner";
    Unavailable: 503, "The database is unavailable: nothing was recorded; send the same request again after Retry-After";
    Uncertified / OpenAiUncertified: 503, "No provider of the route is certified for its contract now; or the database is unavailable: nothing was recorded; send the same request again after Retry-After";
    Full / OpenAiFull: 507, "The database is full: nothing was recorded; send the same request again after Retry-After";
    TooLarge: 413, "The body is too large";
    NotJson: 415, "The body is not application/json";
    HeadersTooLarge: 431, "The headers are too large";
}
