//! The HTTP surface of the API: the native job routes, the
//! OpenAI-compatible facade, the operational endpoints, their problem
//! details and OpenAI errors, the extractors that check a request before
//! its body is read, the accept loop and the edge's limits, the typed views
//! and the OpenAPI document derived from the handlers.

mod api;
pub mod document;
mod edge;
pub mod error;
pub mod extract;
mod facade;
mod jobs;
pub mod listen;
mod ops;
mod responses;
pub mod views;

pub use api::app;
pub use edge::{MAX_HEADER_BYTES, MAX_REQUEST_ID, REQUEST_ID};
pub use facade::{DEDUPLICATION, PROMPT_CERTIFIED};
pub use ops::provider_list;
