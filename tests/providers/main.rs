//! The provider adapters against the fake provider, OpenAI's published
//! schemas, and a real model on a real third-party server.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod config;
mod conformance;
mod docs;
mod failure_table;
mod fake;
mod local_gemma;
mod secrets;
mod support;
