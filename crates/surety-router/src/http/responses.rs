//! The answers many operations share, documented once (`IntoResponses`)
//! and named in each operation's `responses(…)`: what every authenticated
//! request may meet before its handler runs, and what a request that reads
//! or writes the database may meet when the database is away or full
//! (`error.rs`, `StoreError::outage`). Nothing here is constructed: these
//! types exist for the document.

use utoipa::IntoResponses;

use super::views::{OpenAiErrorView, ProblemView};

/// Before any handler of an authenticated operation.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
pub enum AuthErrors {
    #[response(
        status = 401,
        description = "No or an unknown API key",
        content_type = "application/problem+json"
    )]
    Unauthorized(ProblemView),
    #[response(
        status = 429,
        description = "This owner's rate or concurrency limit, or too many failed authentications from this address (Retry-After says when)",
        content_type = "application/problem+json"
    )]
    Limited(ProblemView),
}

/// An operation that reads the database.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
pub enum ReadErrors {
    #[response(
        status = 503,
        description = "The database is unavailable: nothing was recorded; send the same request again after Retry-After",
        content_type = "application/problem+json"
    )]
    Unavailable(ProblemView),
}

/// An operation that records something.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
pub enum WriteErrors {
    #[response(
        status = 503,
        description = "The database is unavailable: nothing was recorded; send the same request again after Retry-After",
        content_type = "application/problem+json"
    )]
    Unavailable(ProblemView),
    #[response(
        status = 507,
        description = "The database is full: nothing was recorded; send the same request again after Retry-After",
        content_type = "application/problem+json"
    )]
    Full(ProblemView),
}

/// An operation that records a new attempt, which needs a certified provider.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
pub enum AttemptErrors {
    #[response(
        status = 503,
        description = "No provider of the route is certified for its contract now; or the database is unavailable: nothing was recorded; send the same request again after Retry-After",
        content_type = "application/problem+json"
    )]
    Unavailable(ProblemView),
    #[response(
        status = 507,
        description = "The database is full: nothing was recorded; send the same request again after Retry-After",
        content_type = "application/problem+json"
    )]
    Full(ProblemView),
}

/// [`AuthErrors`], in OpenAI's format.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
pub enum OpenAiAuthErrors {
    #[response(status = 401, description = "No or an unknown API key")]
    Unauthorized(OpenAiErrorView),
    #[response(
        status = 429,
        description = "This owner's rate or concurrency limit, or too many failed authentications from this address (Retry-After says when)"
    )]
    Limited(OpenAiErrorView),
}

/// [`AttemptErrors`], in OpenAI's format.
#[derive(IntoResponses)]
#[expect(dead_code, reason = "documentation only: read by utoipa's derive")]
pub enum OpenAiAttemptErrors {
    #[response(
        status = 503,
        description = "No provider of the route is certified now; or the database is unavailable: nothing was recorded; send the same request again after Retry-After"
    )]
    Unavailable(OpenAiErrorView),
    #[response(
        status = 507,
        description = "The database is full: nothing was recorded; send the same request again after Retry-After"
    )]
    Full(OpenAiErrorView),
}
